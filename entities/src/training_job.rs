use keel_domain::{DatasetId, JobAction, JobId, JobStatus, OrgId, ProjectId, ScheduleId};
use sea_orm::entity::prelude::*;

/// A training-agent job: `queued` → `running` → a terminal state (see docs/DECISIONS.md).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "training_jobs")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: JobId,
    pub org_id: OrgId,
    pub project_id: ProjectId,
    pub training_task_id: Option<String>,
    pub action: JobAction,
    pub status: JobStatus,
    /// JSON object: the action's fields and `input`.
    pub payload: String,
    pub worker_id: Option<String>,
    pub attempts: i32,
    pub stop_requested: bool,
    pub live_status: Option<String>,
    pub result: Option<String>,
    pub error: Option<String>,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
    pub claimed_at: Option<DateTimeUtc>,
    pub heartbeat_at: Option<DateTimeUtc>,
    pub finished_at: Option<DateTimeUtc>,
    /// 0 (most urgent) to 9; an organization's queued jobs are claimed in this order, then
    /// oldest first.
    pub priority: i32,
    /// When a `scheduled` job becomes `queued`.
    pub scheduled_at: Option<DateTimeUtc>,
    /// When the job last became claimable (created, due, requeued or retried): the start of
    /// its wait.
    pub queued_at: Option<DateTimeUtc>,
    /// While the job is not terminal, no other job of its organization has this key.
    pub unique_key: Option<String>,
    /// The `Idempotency-Key` it was created with, unique per organization.
    pub idempotency_key: Option<String>,
    /// SHA-256 (hex) of the create body sent with `idempotency_key`.
    pub request_hash: Option<String>,
    /// Blocked at its claim because the organization could not pay the run fee: queued
    /// again at the organization's next credit.
    pub blocked_for_funds: bool,
    /// Claims refused for want of funds (each gave its attempt back).
    pub refusals: i32,
    /// Why the user stopped it (the worker's own report text stays in `error`).
    pub stop_reason: Option<String>,
    /// The dataset it trains on, pinned at create (its version's view in `dataset`, JSON
    /// `{datasetId, version, counts, sha256}`).
    pub dataset_id: Option<DatasetId>,
    pub dataset: Option<String>,
    /// The cron schedule that enqueued it, and the tick it was enqueued for (none for a
    /// schedule's "run now").
    pub schedule_id: Option<ScheduleId>,
    pub schedule_tick: Option<DateTimeUtc>,
    /// Other jobs wait for it (`training_job_dependencies`): its end settles them.
    pub has_dependents: bool,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
