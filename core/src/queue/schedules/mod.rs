//! Cron schedules (issue 61): a job body enqueued at each tick of a cron expression in a
//! time zone. Every instance looks for due ticks ([`service::run`]); a tick's job is written
//! in one transaction with the tick's row (unique per schedule and tick) and the schedule's
//! next tick (moved on only from the value it was read with), so a tick makes one job across
//! instances, restarts and kill -9. A tick missed while no instance ran follows the
//! schedule's `catchUp`.

pub mod cadence;
pub(crate) mod repo;
pub mod service;

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{JobDataset, JobError, Jobs, NewJob};
use crate::domain::{DatasetId, JobAction, OrgId, ProjectId, ScheduleId};
pub use cadence::{Cadence, CadenceError};

/// Schedules an organization may have.
pub const MAX_SCHEDULES_PER_ORG: u64 = 100;

/// Tick rows kept per schedule (the older ones can no longer come due).
const TICKS_KEPT: u64 = 100;

/// Ticks one pass enqueues for a schedule at most (a per-second schedule far behind).
const MAX_TICKS_A_PASS: usize = 100;

/// What a tick missed while no instance ran makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CatchUp {
    /// Nothing: the schedule goes on from its next tick.
    #[default]
    None,
    /// One job, for the latest missed tick.
    Latest,
}

impl CatchUp {
    pub const NAMES: [&'static str; 2] = ["none", "latest"];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Latest => "latest",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "none" => Some(Self::None),
            "latest" => Some(Self::Latest),
            _ => None,
        }
    }
}

/// The job a tick enqueues: a checked create body without its organization (the
/// schedule's), its run time (the tick's) or an idempotency key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct JobTemplate {
    pub project_id: ProjectId,
    pub training_task_id: Option<String>,
    pub action: JobAction,
    pub payload: serde_json::Value,
    pub priority: i32,
    pub unique_key: Option<String>,
    /// The dataset and version named (`None`: the latest at each tick).
    pub dataset: Option<(DatasetId, Option<i32>)>,
}

impl JobTemplate {
    /// The job of one tick (`None`: a "run now").
    pub fn new_job(
        &self,
        org_id: &OrgId,
        schedule_id: &ScheduleId,
        tick: Option<chrono::DateTime<chrono::Utc>>,
    ) -> NewJob {
        NewJob {
            org_id: org_id.clone(),
            project_id: self.project_id.clone(),
            training_task_id: self.training_task_id.clone(),
            action: self.action,
            payload: self.payload.clone(),
            priority: self.priority,
            run_at: None,
            unique_key: self.unique_key.clone(),
            idempotency: None,
            dataset: self.dataset.as_ref().map(|(id, version)| JobDataset {
                id: id.clone(),
                version: *version,
                pinned: None,
            }),
            schedule: Some((schedule_id.clone(), tick)),
            depends_on: Vec::new(),
        }
    }
}

/// A schedule to create (its fields checked at the edge; the cadence here).
pub struct NewSchedule {
    pub org_id: OrgId,
    pub name: String,
    pub cron: String,
    pub timezone: String,
    /// The job's create body as given, and what each tick makes of it.
    pub job_body: serde_json::Value,
    pub template: JobTemplate,
    pub enabled: bool,
    pub catch_up: CatchUp,
}

/// A schedule's change: each field given replaces the one it has.
#[derive(Default)]
pub struct ScheduleChange {
    pub name: Option<String>,
    pub cron: Option<String>,
    pub timezone: Option<String>,
    /// A new job body as given, the organization it names (if any: it must be the
    /// schedule's), and what each tick makes of it.
    pub job: Option<(serde_json::Value, Option<OrgId>, JobTemplate)>,
    pub enabled: Option<bool>,
    pub catch_up: Option<CatchUp>,
}

/// A schedule, with its next ticks and its latest jobs.
pub struct Schedule {
    pub row: entities::training_schedule::Model,
    /// The next ticks (none while disabled), at most 5.
    pub upcoming: Vec<chrono::DateTime<chrono::Utc>>,
    /// The jobs it enqueued, newest first, at most 5.
    pub recent_jobs: Vec<entities::training_job::Model>,
}

/// Why a schedule flow did not happen.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    #[error("schedule not found")]
    NotFound,
    /// The cron expression or the zone (the field at fault in it).
    #[error("{0}")]
    Cadence(#[from] CadenceError),
    #[error("the organization has {MAX_SCHEDULES_PER_ORG} schedules, as many as it may have")]
    LimitReached,
    /// A new job body names another organization than the schedule's.
    #[error("the job's orgId must be the schedule's organization")]
    JobOrgMismatch,
    /// The job's project or dataset is not the organization's, or its idempotency key
    /// misuse, and the queue's own failures.
    #[error(transparent)]
    Job(#[from] JobError),
    #[error(transparent)]
    Database(#[from] sea_orm::DbErr),
}

/// What the schedule flows and the tick loop need.
#[derive(Clone)]
pub struct Schedules {
    pub jobs: Jobs,
    /// A tick enqueued at most this late is on time.
    pub grace: chrono::Duration,
    /// The tick loop's longest sleep.
    pub poll: std::time::Duration,
    /// Wakes this instance's tick loop (a schedule was created or changed).
    pub(crate) wake: Arc<tokio::sync::Notify>,
}

impl Schedules {
    pub fn new(jobs: Jobs, grace: chrono::Duration, poll: std::time::Duration) -> Self {
        Self {
            jobs,
            grace,
            poll,
            wake: Arc::default(),
        }
    }
}
