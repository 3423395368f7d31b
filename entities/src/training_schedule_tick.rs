use keel_domain::{JobId, ScheduleId};
use sea_orm::entity::prelude::*;

/// A schedule's tick, enqueued: one row per (schedule, tick), written with the tick's job.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "training_schedule_ticks")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub schedule_id: ScheduleId,
    #[sea_orm(primary_key, auto_increment = false)]
    pub tick_at: DateTimeUtc,
    /// The job it made, or the open job that held its unique key.
    pub job_id: Option<JobId>,
    pub created_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
