//! The training-job queue: the queue actor, claims and reports, secrets and agent logs.

pub(crate) mod actor;
pub mod agent;
mod batcher;
pub mod bulk;
mod claims;
pub mod events;
mod history;
mod logged;
pub(crate) mod repo;
pub mod schedules;
pub mod service;
pub mod shares;

pub use actor::QueueError;

/// Asked before a claim hands jobs out: `false` once the claimant has gone.
pub type StillWanted = std::sync::Arc<dyn Fn() -> bool + Send + Sync>;
pub use repo::{
    Dependency, FailedFilter, Held, JobDataset, JobFilter, JobSort, Linked, NewJob, PipelineView, Report,
    ReportOutcome, RetryPolicy, SweepCounts, DEFAULT_PRIORITY, DEPENDENTS_SHOWN,
};

use sea_orm::DatabaseConnection;

/// Installs the queue's PostgreSQL functions (the claim), written from this build's
/// transition table; nothing on SQLite. Run after the migrations ([`crate::Core::prepare`]).
pub async fn install(db: &DatabaseConnection) -> Result<(), sea_orm::DbErr> {
    repo::install(db).await
}

use crate::cluster::Cluster;
use crate::metrics::Metrics;

/// What the queue's flows need: the database, the queue actor, the secrets' box (none when
/// no key is configured), the cluster (wake-ups) and the metrics.
#[derive(Clone)]
pub struct Jobs {
    pub db: DatabaseConnection,
    pub(crate) actor: actix::Addr<actor::QueueActor>,
    pub secret_box: Option<crate::secrets::SecretBox>,
    pub cluster: Cluster,
    pub metrics: Metrics,
    /// A held job without a sign of life for this long is stale.
    pub stale_after: chrono::Duration,
    /// Running jobs an organization may hold unless an operator set its own cap; 0: none.
    pub max_running_per_org: u32,
    /// Charges each claimed job's run fee.
    pub(crate) ledger: crate::billing::actor::Ledger,
    pub(crate) run_fee: crate::domain::Cents,
    /// Jobs blocked for want of funds are queued again at the organization's next credit.
    pub(crate) requeue_blocked_on_credit: bool,
    /// How retryable failures wait.
    pub(crate) retry_policy: RetryPolicy,
    /// Claims of each action that arrive together, claimed by one statement (on SQLite,
    /// whose claim reads before its transaction, one statement at a time).
    pub(crate) claims: std::sync::Arc<batcher::PerAction<ClaimGroup>>,
    /// Single reports arriving together, applied together.
    pub(crate) reports: std::sync::Arc<batcher::GroupCommit<Report, Result<ReportOutcome, JobError>>>,
}

/// The claims of one action waiting for a claim statement, with where each one's jobs go.
pub(crate) type ClaimGroup =
    batcher::GroupCommit<repo::Claimant, Result<Vec<entities::training_job::Model>, JobError>>;

/// A claim group per action, each with up to `in_flight` statements at once.
pub(crate) fn claim_groups(in_flight: usize) -> std::sync::Arc<batcher::PerAction<ClaimGroup>> {
    std::sync::Arc::new(batcher::PerAction::new(|| batcher::GroupCommit::new(in_flight)))
}

/// Why a queue flow did not happen.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error("job not found")]
    NotFound,
    /// The job's status when it was asked to stop.
    #[error("the job already ended ({0})")]
    AlreadyEnded(crate::domain::JobStatus),
    /// The job's status when it was asked to be retried.
    #[error("only a failed, blocked or user-stopped job can be retried; this one is {0}")]
    NotRetryable(crate::domain::JobStatus),
    /// The project is not one of the organization's (`index`: the batch item that named it).
    #[error("project not found{}", .index.map(|i| format!(" (the project of jobs[{i}])")).unwrap_or_default())]
    ProjectNotFound { index: Option<usize> },
    #[error("organization not found")]
    OrgNotFound,
    /// The dataset (or its version) is not one of the organization's (`index`: the batch
    /// item that named it).
    #[error("dataset not found{}", .index.map(|i| format!(" (the dataset of jobs[{i}])")).unwrap_or_default())]
    DatasetNotFound { index: Option<usize> },
    /// A job named in `dependsOn` is not one of the organization's (`index`: the batch item
    /// that named it).
    #[error("no job {job_id} in the organization to depend on{}", .index.map(|i| format!(" (dependsOn of jobs[{i}])")).unwrap_or_default())]
    DependencyNotFound {
        index: Option<usize>,
        job_id: crate::domain::JobId,
    },
    /// A retry of a job (cancelled, or stopped while it waited) one of whose dependencies
    /// ended without success: that one is to be retried.
    #[error("job {dependency}, which this job depends on, is {status}: retry that job, and this one waits for it again")]
    DependencyBroken {
        dependency: crate::domain::JobId,
        status: crate::domain::JobStatus,
    },
    /// A retry of a job whose unique key another open job of the organization holds (one
    /// created with it after this one ended).
    #[error(
        "job {holder}, which is not done, holds this job's uniqueKey: retry this one once that one is done"
    )]
    UniqueKeyTaken { holder: crate::domain::JobId },
    #[error("this Idempotency-Key was used with another body")]
    IdempotencyKeyReused,
    #[error("secrets need secrets.encryption_key or KEEL_SESSION_SECRET to be configured")]
    SecretsUnconfigured,
    #[error("sealing a secret failed")]
    Sealing(#[source] anyhow::Error),
    /// This instance is shutting down: a worker's claim belongs elsewhere, after a pause.
    #[error("this instance is shutting down; claim again after a pause (another instance may answer)")]
    Draining,
    /// Claims of this action waited past the database's lock timeout (far more claimants at
    /// once than claims a second): claim again after a pause.
    #[error("the queue is busy with other claims; claim again after a pause")]
    Busy,
    #[error(transparent)]
    Queue(#[from] actor::QueueError),
    #[error(transparent)]
    Database(#[from] sea_orm::DbErr),
}
