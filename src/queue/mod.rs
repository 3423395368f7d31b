//! The training-job queue: user routes, worker routes, the queue actor, secrets and
//! agent logs.

pub mod agent;
pub mod internal;
pub mod routes;
pub mod schedules;

use chrono::{DateTime, Utc};
use entities::{training_job, training_job_attempt};
use keel_core::queue::events::parse_stored;
use keel_core::queue::service;
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
    /// The user's reason for stopping it, on every stop path (the worker's report text is
    /// in `error`).
    pub stop_reason: Option<String>,
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
    /// The dataset version it trains on, as pinned at create.
    #[schema(value_type = Option<crate::datasets::dto::PinnedDataset>)]
    pub dataset: Option<Value>,
    /// The cron schedule that enqueued it (`/api/training/schedules`).
    pub schedule_id: Option<String>,
    /// The schedule's tick it was enqueued for (none for a schedule's "run now").
    pub schedule_tick: Option<DateTime<Utc>>,
    /// Every ended attempt, oldest first (the one a worker holds now is not in it yet).
    pub history: Vec<AttemptView>,
    /// The jobs it waits for (`dependsOn`), with their states: on the own read (`GET
    /// /api/training/jobs/{id}`) of a job of a pipeline (one with dependencies or dependents),
    /// and the create that gave them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub depends_on: Option<Vec<LinkedJob>>,
    /// The jobs that wait for it, with their states (the first 100, oldest first; the
    /// pipeline's list, `GET /api/training/jobs?pipeline=`, has them all): as `dependsOn`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dependents: Option<Vec<LinkedJob>>,
    /// How many jobs wait for it: as `dependsOn`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dependents_count: Option<u64>,
}

/// A job of a pipeline, as another job's view names it.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LinkedJob {
    pub job_id: String,
    pub action: String,
    /// Its state now.
    pub status: String,
}

impl From<&keel_core::queue::Linked> for LinkedJob {
    fn from(job: &keel_core::queue::Linked) -> Self {
        Self {
            job_id: job.id.to_string(),
            action: job.action.to_string(),
            status: job.status.to_string(),
        }
    }
}

/// One ended attempt at a job.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AttemptView {
    /// 1 for the first attempt handed to a worker (a claim refused for funds, outcome
    /// `blocked`, has the number it would have had and gives it back).
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
    let ids: Vec<keel_core::domain::JobId> = models.iter().map(|job| job.id.clone()).collect();
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

/// One job's view, with its history, the jobs it depends on and the jobs that depend on it.
pub async fn pipeline_view(
    jobs: &keel_core::queue::Jobs,
    job: &training_job::Model,
) -> crate::error::ApiResult<JobView> {
    let mut view = view(jobs, job).await?;
    let pipeline = service::pipeline_view(jobs, &job.id).await?;
    // A job of no pipeline reads as it always did.
    if pipeline.depends_on.is_empty() && pipeline.dependents_count == 0 {
        return Ok(view);
    }
    view.depends_on = Some(pipeline.depends_on.iter().map(LinkedJob::from).collect());
    view.dependents = Some(pipeline.dependents.iter().map(LinkedJob::from).collect());
    view.dependents_count = Some(pipeline.dependents_count);
    Ok(view)
}

/// A job id as a caller sent it: text that is no id keel gave out names no job (404, as
/// an unknown id does).
pub fn known_job(raw: &str) -> crate::error::ApiResult<keel_core::domain::JobId> {
    keel_core::domain::JobId::parse(raw).map_err(|_| crate::error::ApiError::not_found("job"))
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
            stop_reason: job.stop_reason.clone(),
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
            dataset: parse_stored(job.dataset.as_deref()),
            schedule_id: job.schedule_id.as_ref().map(|id| id.to_string()),
            schedule_tick: job.schedule_tick,
            history: Vec::new(),
            depends_on: None,
            dependents: None,
            dependents_count: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use chrono::{TimeZone, Utc};
    use entities::{training_job, training_job_attempt};
    use keel_core::domain::{AttemptOutcome, JobAction, JobId, JobStatus, OrgId, ProjectId};

    use super::{AttemptView, JobView};

    /// A job event's `data` is the job's view: the core builds it without the web layer's
    /// types, so the two are held equal here, field for field.
    #[test]
    fn a_job_events_data_is_the_job_view() {
        let at = |s: u32| Utc.with_ymd_and_hms(2026, 11, 26, 12, 0, s).unwrap();
        let job = training_job::Model {
            id: JobId::parse("0b6f5f0e-4c1a-4a44-9d5c-2f1c3e0a7b11").unwrap(),
            org_id: OrgId::parse("1b6f5f0e-4c1a-4a44-9d5c-2f1c3e0a7b11").unwrap(),
            project_id: ProjectId::parse("2b6f5f0e-4c1a-4a44-9d5c-2f1c3e0a7b11").unwrap(),
            training_task_id: Some("task-1".into()),
            action: JobAction::Training,
            status: JobStatus::Failed,
            payload: "{}".into(),
            worker_id: Some("w1".into()),
            attempts: 2,
            stop_requested: false,
            live_status: Some(r#"{"step":3}"#.into()),
            result: Some("not json".into()),
            error: Some("boom".into()),
            created_at: at(0),
            updated_at: at(5),
            claimed_at: Some(at(1)),
            heartbeat_at: None,
            finished_at: Some(at(5)),
            priority: 3,
            scheduled_at: None,
            queued_at: Some(at(0)),
            unique_key: None,
            idempotency_key: None,
            request_hash: None,
            blocked_for_funds: false,
            refusals: 0,
            stop_reason: None,
            dataset_id: None,
            dataset: Some(r#"{"datasetId":"x","version":1}"#.into()),
            schedule_id: Some(
                keel_core::domain::ScheduleId::parse("3b6f5f0e-4c1a-4a44-9d5c-2f1c3e0a7b11").unwrap(),
            ),
            schedule_tick: Some(at(0)),
            has_dependents: false,
        };
        let attempt = training_job_attempt::Model {
            job_id: job.id.clone(),
            ordinal: 1,
            attempt: 1,
            worker_id: Some("w1".into()),
            claimed_at: Some(at(1)),
            ended_at: at(2),
            outcome: AttemptOutcome::Retried,
            error: Some("transient".into()),
        };
        let mut view = JobView::from(&job);
        view.history = vec![AttemptView::from(&attempt)];
        assert_eq!(
            serde_json::to_value(&view).unwrap(),
            keel_core::queue::events::job_data(&job, &[attempt])
        );
    }
}
