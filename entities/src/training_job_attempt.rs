use keel_domain::{AttemptOutcome, JobId};
use sea_orm::entity::prelude::*;

/// One ended attempt at a training job: who held it, from when to when, and how it ended.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "training_job_attempts")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub job_id: JobId,
    /// The row's place in the job's history (1 for the first): the job's `attempts` plus
    /// its `refusals` when the row was written.
    #[sea_orm(primary_key, auto_increment = false)]
    pub ordinal: i32,
    pub worker_id: Option<String>,
    pub claimed_at: Option<DateTimeUtc>,
    pub ended_at: DateTimeUtc,
    pub outcome: AttemptOutcome,
    pub error: Option<String>,
    /// 1 for the first claim handed to a worker; a claim refused for funds has the number
    /// it would have had.
    pub attempt: i32,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
