//! The training-job queue: user routes, worker routes, the queue actor, secrets and
//! agent logs.

pub mod agent;
pub mod internal;
pub mod routes;
pub use keel_core::queue::{actor, repo, secrets, service};

use chrono::{DateTime, Utc};
use entities::{training_job, training_job_attempt};
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

/// A job as users and workers see it (TrainingAgentQueuedResponse).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobView {
    pub job_id: String,
    pub org_id: String,
    pub project_id: String,
    pub training_task_id: Option<String>,
    pub action: String,
    pub status: String,
    pub worker_id: Option<String>,
    pub attempts: i32,
    pub stop_requested: bool,
    #[schema(value_type = Option<Object>)]
    pub live_status: Option<Value>,
    #[schema(value_type = Option<Object>)]
    pub result: Option<Value>,
    pub error: Option<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub claimed_at: Option<DateTime<Utc>>,
    pub heartbeat_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// 0 (most urgent) to 9.
    pub priority: i32,
    /// When a `scheduled` job becomes `queued`.
    pub scheduled_at: Option<DateTime<Utc>>,
    /// Every ended attempt, oldest first (the one a worker holds now is not in it yet).
    pub history: Vec<AttemptView>,
}

/// One ended attempt at a job.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttemptView {
    /// 1 for the first claim.
    pub attempt: i32,
    pub worker_id: Option<String>,
    pub claimed_at: Option<DateTime<Utc>>,
    pub ended_at: DateTime<Utc>,
    /// succeeded, failed, retried, stale, interrupted, blocked or user_stopped.
    pub outcome: String,
    pub error: Option<String>,
}

impl From<&training_job_attempt::Model> for AttemptView {
    fn from(a: &training_job_attempt::Model) -> Self {
        Self {
            attempt: a.attempt,
            worker_id: a.worker_id.clone(),
            claimed_at: a.claimed_at,
            ended_at: a.ended_at,
            outcome: a.outcome.to_string(),
            error: a.error.clone(),
        }
    }
}

/// The jobs' views, each with its history.
pub async fn views(
    jobs: &keel_core::queue::Jobs,
    models: &[training_job::Model],
) -> crate::error::ApiResult<Vec<JobView>> {
    let ids: Vec<crate::domain::JobId> = models.iter().map(|job| job.id.clone()).collect();
    let mut histories = service::histories(jobs, &ids).await?;
    Ok(models
        .iter()
        .map(|job| {
            let mut view = JobView::from(job);
            if let Some(history) = histories.remove(&job.id) {
                view.history = history.iter().map(AttemptView::from).collect();
            }
            view
        })
        .collect())
}

/// One job's view, with its history.
pub async fn view(
    jobs: &keel_core::queue::Jobs,
    job: &training_job::Model,
) -> crate::error::ApiResult<JobView> {
    let mut views = views(jobs, std::slice::from_ref(job)).await?;
    Ok(views.pop().unwrap_or_else(|| JobView::from(job)))
}

/// A job id as a caller sent it: text that is no id keel gave out names no job (404, as
/// an unknown id does).
pub fn known_job(raw: &str) -> crate::error::ApiResult<crate::domain::JobId> {
    crate::domain::JobId::parse(raw).map_err(|_| crate::error::ApiError::not_found("job"))
}

pub fn parse_stored(text: Option<&str>) -> Option<Value> {
    text.map(|t| serde_json::from_str(t).unwrap_or_else(|_| Value::String(t.to_owned())))
}

impl From<&training_job::Model> for JobView {
    fn from(job: &training_job::Model) -> Self {
        Self {
            job_id: job.id.to_string(),
            org_id: job.org_id.to_string(),
            project_id: job.project_id.to_string(),
            training_task_id: job.training_task_id.clone(),
            action: job.action.to_string(),
            status: job.status.to_string(),
            worker_id: job.worker_id.clone(),
            attempts: job.attempts,
            stop_requested: job.stop_requested,
            live_status: parse_stored(job.live_status.as_deref()),
            result: parse_stored(job.result.as_deref()),
            error: job.error.clone(),
            created_at: job.created_at,
            updated_at: job.updated_at,
            claimed_at: job.claimed_at,
            heartbeat_at: job.heartbeat_at,
            finished_at: job.finished_at,
            priority: job.priority,
            scheduled_at: job.scheduled_at,
            history: Vec::new(),
        }
    }
}
