//! Worker routes (internal key): claim, read, report, heartbeat, live status, requeue.

use std::collections::BTreeMap;
use std::time::Duration;

use actix_web::{web, HttpRequest, HttpResponse};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use super::{known_job, JobView};
use crate::auth::Internal;
use crate::error::{ApiError, ApiResult, Code, ErrorBody, ValidationErrorBody};
use crate::http::extract::{path_org, ValidJson};
use crate::http::validate::{Checks, Validate};
use crate::state::AppState;
use keel_core::domain::{JobAction, JobStatus};
use keel_core::queue::events::parse_stored;
use keel_core::queue::{service, Held, Report, ReportOutcome};

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InternalClaimJobsRequest {
    #[schema(min_length = 1, max_length = 200)]
    pub worker_id: String,
    /// `draft`, `tracer`, `optimize` or `training`.
    #[schema(value_type = crate::schemas::JobAction)]
    pub action: String,
    #[schema(minimum = 1, maximum = 100)]
    pub limit: i64,
}

impl Validate for InternalClaimJobsRequest {
    fn validate(&self, c: &mut Checks) {
        c.one_of("action", &self.action, &JobAction::NAMES);
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ClaimedJob {
    pub job_id: String,
    pub org_id: String,
    pub project_id: String,
    pub action: String,
    #[schema(value_type = Object)]
    pub payload: Value,
    pub attempt: i32,
    /// 0 (most urgent) to 9.
    pub priority: i32,
    /// The dataset version it trains on (read its lines at
    /// `GET /api/training/internal/jobs/{job_id}/dataset`).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<crate::datasets::dto::PinnedDataset>)]
    pub dataset: Option<Value>,
}

/// The `wait` preference of a `Prefer` header (RFC 7240: comma-separated preferences, each
/// perhaps with `;` parameters), in seconds; anything unreadable is ignored, as the RFC asks.
fn preferred_wait(request: &HttpRequest) -> Option<u64> {
    request
        .headers()
        .get_all("prefer")
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .find_map(|preference| {
            let preference = preference.split(';').next()?.trim();
            let (name, value) = preference.split_once('=')?;
            name.trim()
                .eq_ignore_ascii_case("wait")
                .then(|| value.trim().trim_matches('"').parse().ok())
                .flatten()
        })
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ClaimedJobs {
    pub jobs: Vec<ClaimedJob>,
}

/// Claim jobs
///
/// Internal key (a worker): claims up to `limit` queued jobs of one `action` for `worker_id`,
/// oldest first, each for one worker only, with the payload and the organization's secrets. A
/// job's run fee is charged at its claim; a job whose organization cannot pay is blocked
/// instead. With `Prefer: wait=N` (RFC 7240), a claim that finds no job waits up to N seconds
/// (at most `queue.max_claim_wait_secs`) for one to be queued, then answers as usual.
#[utoipa::path(post, path = "/api/training/internal/jobs/claim", tag = "training-internal", security(("internalKey" = [])),
    params(("Prefer" = Option<String>, Header, description = "`wait=N`: wait up to N seconds for a job when none is queued")),
    request_body = InternalClaimJobsRequest,
    responses((status = 200, body = ClaimedJobs), (status = 422, body = ValidationErrorBody)))]
pub async fn claim_jobs(
    _: Internal,
    state: web::Data<AppState>,
    request: HttpRequest,
    body: ValidJson<InternalClaimJobsRequest>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    let action = JobAction::parse(&body.action)
        .ok_or_else(|| ApiError::Unexpected(anyhow::anyhow!("a validated action did not parse")))?;
    let wait = preferred_wait(&request)
        .map(|secs| Duration::from_secs(secs.min(state.settings.queue.max_claim_wait_secs)))
        .filter(|wait| !wait.is_zero());
    let client = crate::http::client::ClientPresence::of(&request);
    let wanted: keel_core::queue::StillWanted = std::sync::Arc::new(move || !client.gone());
    let jobs = keel_core::queue::service::claim(
        &state.jobs,
        body.worker_id,
        action,
        body.limit as u32,
        wait,
        wanted,
    )
    .await?;
    let jobs = jobs
        .into_iter()
        .map(|job| ClaimedJob {
            payload: parse_stored(Some(&job.payload)).unwrap_or_default(),
            job_id: job.id.into(),
            org_id: job.org_id.into(),
            project_id: job.project_id.into(),
            action: job.action.to_string(),
            attempt: job.attempts,
            priority: job.priority,
            dataset: parse_stored(job.dataset.as_deref()),
        })
        .collect();
    Ok(HttpResponse::Ok().json(ClaimedJobs { jobs }))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct WorkerJobView {
    #[serde(flatten)]
    pub job: JobView,
    #[schema(value_type = Object)]
    pub payload: Value,
    /// The organization's secrets, decrypted, for the worker only.
    pub secrets: BTreeMap<String, String>,
}

/// Read a job (worker)
///
/// Internal key: the job with its payload, as a worker sees it.
#[utoipa::path(get, path = "/api/training/internal/jobs/{job_id}", tag = "training-internal", security(("internalKey" = [])),
    params(("job_id" = String, Path)),
    responses((status = 200, body = WorkerJobView), (status = 404, body = ErrorBody)))]
pub async fn get_job_for_worker(
    _: Internal,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> ApiResult<HttpResponse> {
    let job = service::job_for_worker(&state.jobs, &known_job(&path)?).await?;
    let secrets = service::worker_secrets(&state.jobs, &job.org_id).await?;
    Ok(HttpResponse::Ok().json(WorkerJobView {
        payload: parse_stored(Some(&job.payload)).unwrap_or_default(),
        job: super::view(&state.jobs, &job).await?,
        secrets,
    }))
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct SucceededRequest {
    #[schema(min_length = 1, max_length = 64)]
    pub job_id: String,
    #[schema(min_length = 1, max_length = 200)]
    pub worker_id: String,
    #[schema(value_type = Option<Object>)]
    pub result: Option<Value>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct BlockedRequest {
    #[schema(min_length = 1, max_length = 64)]
    pub job_id: String,
    #[schema(min_length = 1, max_length = 200)]
    pub worker_id: String,
    #[schema(min_length = 1, max_length = 10000)]
    pub reason: String,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct UserStoppedRequest {
    #[schema(min_length = 1, max_length = 64)]
    pub job_id: String,
    #[schema(min_length = 1, max_length = 200)]
    pub worker_id: String,
    #[schema(max_length = 10000)]
    pub reason: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct FailedRequest {
    #[schema(min_length = 1, max_length = 64)]
    pub job_id: String,
    #[schema(min_length = 1, max_length = 200)]
    pub worker_id: String,
    #[schema(min_length = 1, max_length = 10000)]
    pub error: String,
    /// The failure is worth another attempt: with attempts left (`attempts <
    /// queue.max_attempts`) the job is `scheduled` again after a backoff instead of failing.
    pub retryable: Option<bool>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct JobIdRequest {
    #[schema(min_length = 1, max_length = 64)]
    pub job_id: String,
    #[schema(min_length = 1, max_length = 200)]
    pub worker_id: String,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct LiveStatusRequest {
    #[schema(min_length = 1, max_length = 64)]
    pub job_id: String,
    #[schema(min_length = 1, max_length = 200)]
    pub worker_id: String,
    pub live_status: Map<String, Value>,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct WorkerIdRequest {
    #[schema(min_length = 1, max_length = 200)]
    pub worker_id: String,
}

impl Validate for SucceededRequest {}

impl Validate for BlockedRequest {}

impl Validate for UserStoppedRequest {}

impl Validate for FailedRequest {}

impl Validate for JobIdRequest {}

impl Validate for LiveStatusRequest {}

impl Validate for WorkerIdRequest {
    fn validate(&self, _c: &mut Checks) {}
}

#[derive(Debug, Serialize, ToSchema)]
pub struct OkBody {
    pub ok: bool,
}

async fn report(state: &AppState, report: Report) -> ApiResult<HttpResponse> {
    let outcome = keel_core::queue::service::report(&state.jobs, report).await?;
    match outcome {
        ReportOutcome::Applied | ReportOutcome::Repeated => Ok(HttpResponse::Ok().json(OkBody { ok: true })),
        ReportOutcome::NotHeld => Err(ApiError::Coded(
            Code::JobNotHeld,
            "this worker does not hold the job (or it already ended differently)".into(),
        )),
        ReportOutcome::NotFound => Err(ApiError::not_found("job")),
    }
}

/// Report a job succeeded
///
/// Internal key: the claiming worker ends the job as succeeded, with an optional result.
#[utoipa::path(post, path = "/api/training/internal/jobs/succeeded", tag = "training-internal", security(("internalKey" = [])),
    request_body = SucceededRequest,
    responses((status = 200, body = OkBody), (status = 404, body = ErrorBody),
        (status = 409, description = "The worker does not hold the job", body = ErrorBody)))]
pub async fn report_succeeded(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<SucceededRequest>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    report(
        &state,
        Report {
            job_id: known_job(&body.job_id)?,
            worker_id: body.worker_id,
            status: JobStatus::Succeeded,
            result: body.result.map(|r| r.to_string()),
            error: None,
            retryable: false,
        },
    )
    .await
}

/// Report a job blocked
///
/// Internal key: the claiming worker ends the job as blocked, with the reason.
#[utoipa::path(post, path = "/api/training/internal/jobs/blocked", tag = "training-internal", security(("internalKey" = [])),
    request_body = BlockedRequest,
    responses((status = 200, body = OkBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn report_blocked(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<BlockedRequest>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    report(
        &state,
        Report {
            job_id: known_job(&body.job_id)?,
            worker_id: body.worker_id,
            status: JobStatus::Blocked,
            result: None,
            error: Some(body.reason),
            retryable: false,
        },
    )
    .await
}

/// Report a job stopped by its user
///
/// Internal key: the claiming worker confirms a stop the user asked for.
#[utoipa::path(post, path = "/api/training/internal/jobs/user-stopped", tag = "training-internal", security(("internalKey" = [])),
    request_body = UserStoppedRequest,
    responses((status = 200, body = OkBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn report_user_stopped(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<UserStoppedRequest>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    report(
        &state,
        Report {
            job_id: known_job(&body.job_id)?,
            worker_id: body.worker_id,
            status: JobStatus::UserStopped,
            result: None,
            error: body.reason,
            retryable: false,
        },
    )
    .await
}

/// Report a job failed
///
/// Internal key: the claiming worker ends the job as failed, with the error.
#[utoipa::path(post, path = "/api/training/internal/jobs/failed", tag = "training-internal", security(("internalKey" = [])),
    request_body = FailedRequest,
    responses((status = 200, body = OkBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn report_failed(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<FailedRequest>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    report(
        &state,
        Report {
            job_id: known_job(&body.job_id)?,
            worker_id: body.worker_id,
            status: JobStatus::Failed,
            result: None,
            error: Some(body.error),
            retryable: body.retryable.unwrap_or(false),
        },
    )
    .await
}

#[derive(Debug, Serialize, ToSchema)]
pub struct HeartbeatAnswer {
    pub ok: bool,
    /// The user asked to stop: wind down and report `user-stopped`.
    pub stop_requested: bool,
}

fn held_error(held: Held) -> ApiError {
    match held {
        Held::NotFound => ApiError::not_found("job"),
        _ => ApiError::Coded(Code::JobNotHeld, "this worker does not hold the job".into()),
    }
}

/// Heartbeat a job
///
/// Internal key: the claiming worker says it is still working on the job; a job without
/// heartbeats is requeued as stale. `stop_requested` tells the worker its user asked to stop.
#[utoipa::path(post, path = "/api/training/internal/jobs/heartbeat", tag = "training-internal", security(("internalKey" = [])),
    request_body = JobIdRequest,
    responses((status = 200, body = HeartbeatAnswer), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn heartbeat(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<JobIdRequest>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    let held =
        keel_core::queue::service::heartbeat(&state.jobs, known_job(&body.job_id)?, body.worker_id).await?;
    match held {
        Held::Yes { stop_requested } => Ok(HttpResponse::Ok().json(HeartbeatAnswer {
            ok: true,
            stop_requested,
        })),
        other => Err(held_error(other)),
    }
}

/// At most this many reports, or held jobs heartbeaten, in one request.
pub const MAX_BATCHED: usize = 1000;

/// One report of many, chosen by `outcome`: exactly the body of its single route
/// (`succeeded`: `result?`; `failed`: `error`, `retryable?`; `blocked`: `reason`;
/// `user_stopped`: `reason?`).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ReportItem {
    Succeeded(SucceededRequest),
    Failed(FailedRequest),
    Blocked(BlockedRequest),
    UserStopped(UserStoppedRequest),
}

impl ReportItem {
    fn ids(&self) -> (&str, &str) {
        match self {
            Self::Succeeded(r) => (&r.job_id, &r.worker_id),
            Self::Failed(r) => (&r.job_id, &r.worker_id),
            Self::Blocked(r) => (&r.job_id, &r.worker_id),
            Self::UserStopped(r) => (&r.job_id, &r.worker_id),
        }
    }
}

impl Validate for ReportItem {
    fn validate(&self, c: &mut Checks) {
        let (job_id, worker_id) = self.ids();
        c.str_len("job_id", job_id, 1, 64);
        c.str_len("worker_id", worker_id, 1, 200);
        match self {
            Self::Succeeded(r) => {
                if r.result.as_ref().is_some_and(|v| !v.is_object() && !v.is_null()) {
                    c.fail("result", "dict_type", "Input should be a valid dictionary");
                }
            }
            Self::Failed(r) => c.str_len("error", &r.error, 1, 10_000),
            Self::Blocked(r) => c.str_len("reason", &r.reason, 1, 10_000),
            Self::UserStopped(r) => {
                if let Some(reason) = &r.reason {
                    c.str_len("reason", reason, 0, 10_000);
                }
            }
        }
    }
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct ReportsRequest {
    #[schema(min_items = 1, max_items = 1000)]
    pub reports: Vec<ReportItem>,
}

impl Validate for ReportsRequest {
    fn validate(&self, c: &mut Checks) {
        for (index, item) in self.reports.iter().enumerate() {
            c.nested("reports", Some(index), item);
        }
    }
}

/// One report's answer: `ok`, or the code its single route would have answered with
/// (`job_not_held`, `job_not_found`).
#[derive(Debug, Serialize, ToSchema)]
pub struct ReportResult {
    pub job_id: String,
    pub ok: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ReportResults {
    /// One per report, in order.
    pub results: Vec<ReportResult>,
}

/// Report many jobs
///
/// Internal key: several terminal reports at once (a worker whose jobs ended together), each
/// item with exactly the rules and the effect of its single route, applied together. Answers
/// each item's result in order; an item its single route would refuse with 404 or 409 is
/// `ok: false` with that code, and the others are applied all the same.
#[utoipa::path(post, path = "/api/training/internal/jobs/reports", tag = "training-internal", security(("internalKey" = [])),
    request_body = ReportsRequest,
    responses((status = 200, body = ReportResults), (status = 422, body = ValidationErrorBody)))]
pub async fn report_many(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<ReportsRequest>,
) -> ApiResult<HttpResponse> {
    let items = body.0.reports;
    let mut results: Vec<ReportResult> = Vec::with_capacity(items.len());
    let mut reports = Vec::new();
    let mut placed = Vec::new();
    for item in items {
        let job_text = item.ids().0.to_owned();
        let Ok(job_id) = known_job(&job_text) else {
            results.push(ReportResult {
                job_id: job_text,
                ok: false,
                error: Some(Code::JobNotFound.as_str().to_owned()),
            });
            continue;
        };
        let (worker_id, status, result, error, retryable) = match item {
            ReportItem::Succeeded(r) => (
                r.worker_id,
                JobStatus::Succeeded,
                r.result.map(|v| v.to_string()),
                None,
                false,
            ),
            ReportItem::Failed(r) => (
                r.worker_id,
                JobStatus::Failed,
                None,
                Some(r.error),
                r.retryable.unwrap_or(false),
            ),
            ReportItem::Blocked(r) => (r.worker_id, JobStatus::Blocked, None, Some(r.reason), false),
            ReportItem::UserStopped(r) => (r.worker_id, JobStatus::UserStopped, None, r.reason, false),
        };
        placed.push(results.len());
        results.push(ReportResult {
            job_id: job_text,
            ok: true,
            error: None,
        });
        reports.push(Report {
            job_id,
            worker_id,
            status,
            result,
            error,
            retryable,
        });
    }
    let outcomes = service::reports(&state.jobs, reports).await?;
    for (index, outcome) in placed.into_iter().zip(outcomes) {
        let code = match outcome {
            ReportOutcome::Applied | ReportOutcome::Repeated => None,
            ReportOutcome::NotHeld => Some(Code::JobNotHeld),
            ReportOutcome::NotFound => Some(Code::JobNotFound),
        };
        results[index].ok = code.is_none();
        results[index].error = code.map(|c| c.as_str().to_owned());
    }
    Ok(HttpResponse::Ok().json(ReportResults { results }))
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct HeartbeatsRequest {
    #[schema(min_length = 1, max_length = 200)]
    pub worker_id: String,
    #[schema(min_items = 1, max_items = 1000)]
    pub job_ids: Vec<String>,
}

impl Validate for HeartbeatsRequest {}

/// One held job's heartbeat answer: `ok: false` when this worker no longer holds it (or no
/// such job exists): it should stop working on it.
#[derive(Debug, Serialize, ToSchema)]
pub struct JobHeartbeat {
    pub job_id: String,
    pub ok: bool,
    /// The user asked to stop: wind down and report `user_stopped`.
    pub stop_requested: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct HeartbeatsAnswer {
    /// One per job id, in order.
    pub jobs: Vec<JobHeartbeat>,
}

/// Heartbeat many jobs
///
/// Internal key: the worker says it still works on every job it names (one statement for
/// all); each answers whether the worker holds it and whether its user asked to stop.
#[utoipa::path(post, path = "/api/training/internal/jobs/heartbeats", tag = "training-internal", security(("internalKey" = [])),
    request_body = HeartbeatsRequest,
    responses((status = 200, body = HeartbeatsAnswer), (status = 422, body = ValidationErrorBody)))]
pub async fn heartbeat_many(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<HeartbeatsRequest>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    let parsed: Vec<Option<keel_core::domain::JobId>> =
        body.job_ids.iter().map(|id| known_job(id).ok()).collect();
    let known: Vec<keel_core::domain::JobId> = parsed.iter().flatten().cloned().collect();
    let mut held = service::heartbeats(&state.jobs, &known, &body.worker_id)
        .await?
        .into_iter();
    let jobs = body
        .job_ids
        .into_iter()
        .zip(parsed)
        .map(|(job_id, parsed)| {
            let held = parsed.and_then(|_| held.next()).unwrap_or(Held::NotFound);
            let (ok, stop_requested) = match held {
                Held::Yes { stop_requested } => (true, stop_requested),
                Held::NotHeld | Held::NotFound => (false, false),
            };
            JobHeartbeat {
                job_id,
                ok,
                stop_requested,
            }
        })
        .collect();
    Ok(HttpResponse::Ok().json(HeartbeatsAnswer { jobs }))
}

/// Report a job's live status
///
/// Internal key: the claiming worker publishes free-form progress that the job's readers see.
#[utoipa::path(post, path = "/api/training/internal/jobs/live-status", tag = "training-internal", security(("internalKey" = [])),
    request_body = LiveStatusRequest,
    responses((status = 200, body = OkBody), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn live_status(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<LiveStatusRequest>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    match service::set_live_status(
        &state.jobs,
        &known_job(&body.job_id)?,
        &body.worker_id,
        &Value::Object(body.live_status),
    )
    .await?
    {
        Held::Yes { .. } => Ok(HttpResponse::Ok().json(OkBody { ok: true })),
        other => Err(held_error(other)),
    }
}

/// Requeue stale jobs
///
/// Internal key: puts back in the queue every claimed job whose heartbeat is too old.
#[utoipa::path(post, path = "/api/training/internal/jobs/requeue-stale", tag = "training-internal", security(("internalKey" = [])),
    responses((status = 200, body = crate::schemas::SweepCounts)))]
pub async fn requeue_stale(_: Internal, state: web::Data<AppState>) -> ApiResult<HttpResponse> {
    Ok(HttpResponse::Ok().json(service::requeue_stale(&state.jobs).await?))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Requeued {
    pub requeued: u64,
}

/// Requeue a worker's jobs
///
/// Internal key: a restarting worker hands back the jobs it had claimed.
#[utoipa::path(post, path = "/api/training/internal/jobs/requeue-interrupted", tag = "training-internal", security(("internalKey" = [])),
    request_body = WorkerIdRequest,
    responses((status = 200, body = Requeued)))]
pub async fn requeue_interrupted(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<WorkerIdRequest>,
) -> ApiResult<HttpResponse> {
    let requeued = keel_core::queue::service::requeue_interrupted(&state.jobs, &body.0.worker_id).await?;
    Ok(HttpResponse::Ok().json(Requeued { requeued }))
}

/// An action named in a path: one of the four, else a 422 naming the parameter.
fn path_action(raw: &str) -> ApiResult<JobAction> {
    JobAction::parse(raw).ok_or_else(|| {
        let mut c = Checks::new("path");
        c.one_of("action", raw, &JobAction::NAMES);
        ApiError::Validation(c.into_issues())
    })
}

/// One action's queue, as operators read it.
#[derive(Debug, Serialize, ToSchema)]
pub struct ActionQueueView {
    pub action: String,
    pub paused: bool,
    /// Every status with its count (0 included).
    pub counts: BTreeMap<String, i64>,
}

impl From<service::ActionQueue> for ActionQueueView {
    fn from(queue: service::ActionQueue) -> Self {
        Self {
            action: queue.action.to_string(),
            paused: queue.paused,
            counts: queue
                .counts
                .into_iter()
                .map(|(s, n)| (s.to_string(), n))
                .collect(),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct QueueState {
    pub actions: Vec<ActionQueueView>,
}

/// Read the queue
///
/// Internal key: every action's queue, whether it is paused, and its jobs by status.
#[utoipa::path(get, path = "/api/internal/queue", tag = "operator", security(("internalKey" = [])),
    responses((status = 200, body = QueueState)))]
pub async fn queue_state(_: Internal, state: web::Data<AppState>) -> ApiResult<HttpResponse> {
    let actions = service::action_queues(&state.jobs)
        .await?
        .into_iter()
        .map(ActionQueueView::from)
        .collect();
    Ok(HttpResponse::Ok().json(QueueState { actions }))
}

/// Pause an action's queue
///
/// Internal key: claims of the action hand out nothing (long-poll claims keep waiting) until
/// it is resumed, on every instance at once. Pausing a paused action changes nothing.
#[utoipa::path(post, path = "/api/internal/queue/{action}/pause", tag = "operator", security(("internalKey" = [])),
    params(("action" = crate::schemas::JobAction, Path)),
    responses((status = 200, body = ActionQueueView)))]
pub async fn pause_action(
    _: Internal,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> ApiResult<HttpResponse> {
    let queue = service::pause(&state.jobs, path_action(&path)?).await?;
    Ok(HttpResponse::Ok().json(ActionQueueView::from(queue)))
}

/// Resume an action's queue
///
/// Internal key: the action's jobs are claimed again; claims waiting on it look at once.
#[utoipa::path(post, path = "/api/internal/queue/{action}/resume", tag = "operator", security(("internalKey" = [])),
    params(("action" = crate::schemas::JobAction, Path)),
    responses((status = 200, body = ActionQueueView)))]
pub async fn resume_action(
    _: Internal,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> ApiResult<HttpResponse> {
    let queue = service::resume(&state.jobs, path_action(&path)?).await?;
    Ok(HttpResponse::Ok().json(ActionQueueView::from(queue)))
}

/// An organization's share of the queue, as operators set and read it.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OrgQueueView {
    pub org_id: String,
    /// 1..100: across organizations with queued jobs, claims hand out jobs in proportion.
    pub weight: i32,
    /// The operator's cap on running jobs (null: `queue.max_running_per_org`; 0: none).
    pub max_running: Option<i32>,
    /// The cap that applies (0: none).
    pub effective_max_running: i64,
    /// Its running and stopping jobs, of every action.
    pub running: i64,
}

impl From<service::OrgQueue> for OrgQueueView {
    fn from(q: service::OrgQueue) -> Self {
        Self {
            org_id: q.org_id.into(),
            weight: q.weight,
            max_running: q.max_running,
            effective_max_running: q.effective_max_running,
            running: q.running,
        }
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OrgQueueBody {
    /// 1..100, default 1.
    #[schema(minimum = 1, maximum = 100)]
    pub weight: Option<i32>,
    /// Running jobs it may hold at once (0: no cap); absent or null: `queue.max_running_per_org`.
    #[schema(minimum = 0, maximum = 100000)]
    pub max_running: Option<i32>,
}

impl Validate for OrgQueueBody {}

/// Read an organization's queue share
///
/// Internal key: its weight, its cap on running jobs and how many it runs now.
#[utoipa::path(get, path = "/api/internal/orgs/{org_id}/queue", tag = "operator", security(("internalKey" = [])),
    params(("org_id" = String, Path, format = Uuid)),
    responses((status = 200, body = OrgQueueView), (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
pub async fn get_org_queue(
    _: Internal,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> ApiResult<HttpResponse> {
    let org_id = path_org("org_id", &path)?;
    Ok(HttpResponse::Ok().json(OrgQueueView::from(
        service::org_queue(&state.jobs, &org_id).await?,
    )))
}

/// Set an organization's queue share
///
/// Internal key: its weight (1..100, default 1) among organizations with queued jobs, and its
/// cap on running jobs (absent: `queue.max_running_per_org`). Claims on every instance use
/// them from their next turn.
#[utoipa::path(put, path = "/api/internal/orgs/{org_id}/queue", tag = "operator", security(("internalKey" = [])),
    params(("org_id" = String, Path, format = Uuid)),
    request_body = OrgQueueBody,
    responses((status = 200, body = OrgQueueView), (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
pub async fn put_org_queue(
    _: Internal,
    state: web::Data<AppState>,
    path: web::Path<String>,
    body: ValidJson<OrgQueueBody>,
) -> ApiResult<HttpResponse> {
    let org_id = path_org("org_id", &path)?;
    let body = body.0;
    let queue =
        service::set_org_queue(&state.jobs, &org_id, body.weight.unwrap_or(1), body.max_running).await?;
    Ok(HttpResponse::Ok().json(OrgQueueView::from(queue)))
}
