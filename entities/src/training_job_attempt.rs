use keel_domain::{AttemptOutcome, JobId};
use sea_orm::entity::prelude::*;

/// One ended attempt at a training job: who held it, from when to when, and how it ended.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "training_job_attempts")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub job_id: JobId,
    /// 1 for the first claim; the job's `attempts` when this one ended.
    #[sea_orm(primary_key, auto_increment = false)]
    pub attempt: i32,
    pub worker_id: Option<String>,
    pub claimed_at: Option<DateTimeUtc>,
    pub ended_at: DateTimeUtc,
    pub outcome: AttemptOutcome,
    pub error: Option<String>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
