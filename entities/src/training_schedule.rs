use keel_domain::{OrgId, ProjectId, ScheduleId};
use sea_orm::entity::prelude::*;

/// A job body enqueued at each tick of a cron expression in a time zone.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "training_schedules")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: ScheduleId,
    pub org_id: OrgId,
    /// The job's project (the schedule goes with its organization; a tick of a deleted
    /// project's schedule enqueues nothing).
    pub project_id: ProjectId,
    pub name: String,
    pub cron: String,
    /// An IANA zone name: the cron's fields are read on its wall clock.
    pub timezone: String,
    /// The job's create body as given (JSON).
    pub job: String,
    /// What each tick enqueues (JSON: the checked job without its organization).
    pub template: String,
    pub enabled: bool,
    /// `none` or `latest`: what a tick missed while no instance ran makes.
    pub catch_up: String,
    /// The next tick not enqueued yet (none while disabled).
    pub next_run_at: Option<DateTimeUtc>,
    /// The last tick enqueued (or skipped as missed).
    pub last_tick_at: Option<DateTimeUtc>,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
