//! User routes: enqueue, list, read and stop jobs; set organization secrets.

use std::collections::BTreeMap;

use actix_web::{web, HttpResponse};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use utoipa::ToSchema;

use super::{known_job, pipeline_view, view, views, JobView};
use crate::auth::{Caller, Member};
use crate::error::ValidationIssue;
use crate::error::{ApiError, ApiResult, ErrorBody, ValidationErrorBody};
use crate::http::extract::{
    check_parsed, parse_checked_body, parse_json_body, IdempotencyKeyHeader, RawBody, ValidJson, ValidQuery,
};
use crate::http::validate::{Checks, Validate};
use keel_core::domain::{JobAction, JobId, OrgId, ProjectId};
use keel_core::evals::parse_datetime;
use keel_core::queue::service::{self, Created};
use keel_core::queue::{Dependency, JobFilter, NewJob, DEFAULT_PRIORITY};

/// Environment slugs: `<org-slug>/<project-slug>/<name>`, 3..512 characters.
pub static ENV_SLUG_RE: lazy_regex::Lazy<regex::Regex> =
    lazy_regex::lazy_regex!(r"^[a-z0-9][a-z0-9._-]*/[a-z0-9][a-z0-9._-]*/[a-z0-9][a-z0-9._-]*$");

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TracerJob {
    #[schema(value_type = String, format = Uuid)]
    pub project_id: ProjectId,
    #[schema(value_type = Option<String>, min_length = 1, max_length = 100)]
    #[serde(default, deserialize_with = "OrgId::optional")]
    pub org_id: Option<OrgId>,
    #[schema(min_length = 1, max_length = 100)]
    pub training_task_id: Option<String>,
    pub input: Option<Map<String, Value>>,
    /// 0 (most urgent) to 9; default 5.
    #[schema(minimum = 0, maximum = 9)]
    pub priority: Option<i32>,
    /// RFC 3339: a time in the future makes the job `scheduled` until then.
    #[schema(format = DateTime)]
    pub run_at: Option<String>,
    /// While a job of the organization with this key is not terminal, a create with it
    /// answers that job (200) instead of making another.
    #[schema(min_length = 1, max_length = 200)]
    pub unique_key: Option<String>,
    /// The dataset it trains on (its version pinned now; the latest when none is named).
    /// Another organization's dataset is 404.
    pub dataset: Option<JobDatasetBody>,
    /// Jobs of the organization (1..100) this one waits for: it is `waiting` until every one
    /// has succeeded, then queued (or scheduled, its `runAt` ahead); `cancelled` if one ends
    /// without success. In a batch, `ref:<name>` names another item by its `ref`.
    #[schema(min_items = 1, max_items = 100)]
    pub depends_on: Option<Vec<String>>,
    /// Names this item within its batch, for the `dependsOn` of others (`ref:<name>`); a
    /// single create has no other item to name it.
    #[schema(min_length = 1, max_length = 100)]
    pub r#ref: Option<String>,
    #[schema(
        min_length = 3,
        max_length = 512,
        pattern = r"^[a-z0-9][a-z0-9._-]*/[a-z0-9][a-z0-9._-]*/[a-z0-9][a-z0-9._-]*$"
    )]
    pub environment_slug: Option<String>,
    #[schema(min_length = 1, max_length = 200)]
    pub model: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DraftJob {
    #[schema(value_type = String, format = Uuid)]
    pub project_id: ProjectId,
    #[schema(value_type = Option<String>, min_length = 1, max_length = 100)]
    #[serde(default, deserialize_with = "OrgId::optional")]
    pub org_id: Option<OrgId>,
    #[schema(min_length = 1, max_length = 100)]
    pub training_task_id: Option<String>,
    pub input: Option<Map<String, Value>>,
    /// 0 (most urgent) to 9; default 5.
    #[schema(minimum = 0, maximum = 9)]
    pub priority: Option<i32>,
    /// RFC 3339: a time in the future makes the job `scheduled` until then.
    #[schema(format = DateTime)]
    pub run_at: Option<String>,
    /// While a job of the organization with this key is not terminal, a create with it
    /// answers that job (200) instead of making another.
    #[schema(min_length = 1, max_length = 200)]
    pub unique_key: Option<String>,
    /// The dataset it trains on (its version pinned now; the latest when none is named).
    /// Another organization's dataset is 404.
    pub dataset: Option<JobDatasetBody>,
    /// Jobs of the organization (1..100) this one waits for: it is `waiting` until every one
    /// has succeeded, then queued (or scheduled, its `runAt` ahead); `cancelled` if one ends
    /// without success. In a batch, `ref:<name>` names another item by its `ref`.
    #[schema(min_items = 1, max_items = 100)]
    pub depends_on: Option<Vec<String>>,
    /// Names this item within its batch, for the `dependsOn` of others (`ref:<name>`); a
    /// single create has no other item to name it.
    #[schema(min_length = 1, max_length = 100)]
    pub r#ref: Option<String>,
    #[schema(min_length = 1, max_length = 50000)]
    pub prompt: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OptimizeJob {
    #[schema(value_type = String, format = Uuid)]
    pub project_id: ProjectId,
    #[schema(value_type = Option<String>, min_length = 1, max_length = 100)]
    #[serde(default, deserialize_with = "OrgId::optional")]
    pub org_id: Option<OrgId>,
    #[schema(min_length = 1, max_length = 100)]
    pub training_task_id: Option<String>,
    pub input: Option<Map<String, Value>>,
    /// 0 (most urgent) to 9; default 5.
    #[schema(minimum = 0, maximum = 9)]
    pub priority: Option<i32>,
    /// RFC 3339: a time in the future makes the job `scheduled` until then.
    #[schema(format = DateTime)]
    pub run_at: Option<String>,
    /// While a job of the organization with this key is not terminal, a create with it
    /// answers that job (200) instead of making another.
    #[schema(min_length = 1, max_length = 200)]
    pub unique_key: Option<String>,
    /// The dataset it trains on (its version pinned now; the latest when none is named).
    /// Another organization's dataset is 404.
    pub dataset: Option<JobDatasetBody>,
    /// Jobs of the organization (1..100) this one waits for: it is `waiting` until every one
    /// has succeeded, then queued (or scheduled, its `runAt` ahead); `cancelled` if one ends
    /// without success. In a batch, `ref:<name>` names another item by its `ref`.
    #[schema(min_items = 1, max_items = 100)]
    pub depends_on: Option<Vec<String>>,
    /// Names this item within its batch, for the `dependsOn` of others (`ref:<name>`); a
    /// single create has no other item to name it.
    #[schema(min_length = 1, max_length = 100)]
    pub r#ref: Option<String>,
    #[schema(min_length = 1, max_length = 200)]
    pub base_model: Option<String>,
    #[schema(min_length = 1, max_length = 2000)]
    pub objective: Option<String>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TrainingJob {
    #[schema(value_type = String, format = Uuid)]
    pub project_id: ProjectId,
    #[schema(value_type = Option<String>, min_length = 1, max_length = 100)]
    #[serde(default, deserialize_with = "OrgId::optional")]
    pub org_id: Option<OrgId>,
    #[schema(min_length = 1, max_length = 100)]
    pub training_task_id: Option<String>,
    pub input: Option<Map<String, Value>>,
    /// 0 (most urgent) to 9; default 5.
    #[schema(minimum = 0, maximum = 9)]
    pub priority: Option<i32>,
    /// RFC 3339: a time in the future makes the job `scheduled` until then.
    #[schema(format = DateTime)]
    pub run_at: Option<String>,
    /// While a job of the organization with this key is not terminal, a create with it
    /// answers that job (200) instead of making another.
    #[schema(min_length = 1, max_length = 200)]
    pub unique_key: Option<String>,
    /// The dataset it trains on (its version pinned now; the latest when none is named).
    /// Another organization's dataset is 404.
    pub dataset: Option<JobDatasetBody>,
    /// Jobs of the organization (1..100) this one waits for: it is `waiting` until every one
    /// has succeeded, then queued (or scheduled, its `runAt` ahead); `cancelled` if one ends
    /// without success. In a batch, `ref:<name>` names another item by its `ref`.
    #[schema(min_items = 1, max_items = 100)]
    pub depends_on: Option<Vec<String>>,
    /// Names this item within its batch, for the `dependsOn` of others (`ref:<name>`); a
    /// single create has no other item to name it.
    #[schema(min_length = 1, max_length = 100)]
    pub r#ref: Option<String>,
    #[schema(min_length = 1, max_length = 200)]
    pub model: String,
    #[schema(
        min_length = 3,
        max_length = 512,
        pattern = r"^[a-z0-9][a-z0-9._-]*/[a-z0-9][a-z0-9._-]*/[a-z0-9][a-z0-9._-]*$"
    )]
    pub environment_slug: String,
    #[schema(min_length = 1, max_length = 100)]
    pub algorithm: Option<String>,
    #[schema(min_length = 1, max_length = 100)]
    pub gpu_type: Option<String>,
}

/// A job's dataset: `{datasetId, version?}`.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JobDatasetBody {
    #[schema(value_type = String, format = Uuid)]
    pub dataset_id: keel_core::domain::DatasetId,
    /// A version of it (1 or more); the latest when absent.
    #[schema(minimum = 1, maximum = 2147483647)]
    pub version: Option<i32>,
}

/// One of four bodies, chosen by `action`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(tag = "action", rename_all = "lowercase")]
pub enum JobCreateBody {
    Tracer(TracerJob),
    Draft(DraftJob),
    Optimize(OptimizeJob),
    Training(TrainingJob),
}

impl Validate for JobCreateBody {
    fn validate(&self, c: &mut Checks) {
        if let Some(run_at) = &self.common().run_at {
            if parse_datetime(run_at).is_none() {
                c.fail(
                    "runAt",
                    "datetime_from_date_parsing",
                    "Input should be a valid datetime",
                );
            }
        }
    }
}

/// What every action's body shares.
struct Common<'a> {
    priority: Option<i32>,
    run_at: &'a Option<String>,
    unique_key: &'a Option<String>,
    dataset: &'a Option<JobDatasetBody>,
    depends_on: &'a Option<Vec<String>>,
    reference: &'a Option<String>,
}

/// A create body's parts, as the queue takes them.
struct Parts {
    project_id: ProjectId,
    org_id: Option<OrgId>,
    training_task_id: Option<String>,
    action: JobAction,
    payload: Value,
    priority: i32,
    run_at: Option<chrono::DateTime<chrono::Utc>>,
    unique_key: Option<String>,
    dataset: Option<JobDatasetBody>,
    /// `dependsOn` as given (job ids and `ref:` names), each once.
    depends_on: Vec<String>,
    /// The item's `ref`.
    reference: Option<String>,
}

/// What a `dependsOn` entry names.
enum Named {
    Job(JobId),
    Ref(String),
}

/// A `dependsOn` entry: `ref:<name>` or a job id (the schema's pattern held it to one).
fn named(entry: &str) -> Named {
    match entry.strip_prefix(REF_PREFIX) {
        Some(name) => Named::Ref(name.to_owned()),
        None => JobId::parse(entry).map_or_else(|_| Named::Ref(entry.to_owned()), Named::Job),
    }
}

/// How a `dependsOn` entry names another item of its batch.
const REF_PREFIX: &str = "ref:";

/// An item's `ref`: 1..100 letters, digits, `_`, `.` and `-`, starting with a letter or digit.
pub const REF_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$";

/// A `dependsOn` entry: `ref:` and a ref, or a job id (any spelling of a UUID).
pub fn depends_on_pattern() -> String {
    // The ref's own pattern after `ref:`.
    format!(
        "^{REF_PREFIX}{}|{}",
        REF_PATTERN.trim_start_matches('^'),
        crate::http::schemas::UUID
    )
}

impl JobCreateBody {
    fn common(&self) -> Common<'_> {
        match self {
            Self::Tracer(b) => Common {
                priority: b.priority,
                run_at: &b.run_at,
                unique_key: &b.unique_key,
                dataset: &b.dataset,
                depends_on: &b.depends_on,
                reference: &b.r#ref,
            },
            Self::Draft(b) => Common {
                priority: b.priority,
                run_at: &b.run_at,
                unique_key: &b.unique_key,
                dataset: &b.dataset,
                depends_on: &b.depends_on,
                reference: &b.r#ref,
            },
            Self::Optimize(b) => Common {
                priority: b.priority,
                run_at: &b.run_at,
                unique_key: &b.unique_key,
                dataset: &b.dataset,
                depends_on: &b.depends_on,
                reference: &b.r#ref,
            },
            Self::Training(b) => Common {
                priority: b.priority,
                run_at: &b.run_at,
                unique_key: &b.unique_key,
                dataset: &b.dataset,
                depends_on: &b.depends_on,
                reference: &b.r#ref,
            },
        }
    }

    fn into_parts(self) -> Parts {
        let input = |i: Option<Map<String, Value>>| Value::Object(i.unwrap_or_default());
        let common = self.common();
        let (priority, run_at, unique_key, dataset) = (
            common.priority.unwrap_or(DEFAULT_PRIORITY),
            common.run_at.as_deref().and_then(parse_datetime),
            common.unique_key.clone(),
            common.dataset.clone(),
        );
        let mut depends_on: Vec<String> = Vec::new();
        for entry in common.depends_on.iter().flatten() {
            if !depends_on.contains(entry) {
                depends_on.push(entry.clone());
            }
        }
        let reference = common.reference.clone();
        let (project_id, org_id, training_task_id, action, payload) = match self {
            Self::Tracer(b) => (
                b.project_id,
                b.org_id,
                b.training_task_id,
                JobAction::Tracer,
                json!({"input": input(b.input), "environmentSlug": b.environment_slug, "model": b.model}),
            ),
            Self::Draft(b) => (
                b.project_id,
                b.org_id,
                b.training_task_id,
                JobAction::Draft,
                json!({"input": input(b.input), "prompt": b.prompt}),
            ),
            Self::Optimize(b) => (
                b.project_id,
                b.org_id,
                b.training_task_id,
                JobAction::Optimize,
                json!({"input": input(b.input), "baseModel": b.base_model, "objective": b.objective}),
            ),
            Self::Training(b) => (
                b.project_id,
                b.org_id,
                b.training_task_id,
                JobAction::Training,
                json!({"input": input(b.input), "model": b.model, "environmentSlug": b.environment_slug,
                       "algorithm": b.algorithm, "gpuType": b.gpu_type}),
            ),
        };
        Parts {
            project_id,
            org_id,
            training_task_id,
            action,
            payload,
            priority,
            run_at,
            unique_key,
            dataset,
            depends_on,
            reference,
        }
    }
}

impl Parts {
    /// The dependencies of a single create: job ids only (a `ref:` names a batch's item).
    fn single_dependencies(&self) -> ApiResult<Vec<Dependency>> {
        let mut issues = Vec::new();
        let mut found = Vec::new();
        for (k, entry) in self.depends_on.iter().enumerate() {
            match named(entry) {
                Named::Job(id) => found.push(Dependency::Job(id)),
                Named::Ref(_) => issues.push(ValidationIssue::new(
                    vec![json!("body"), json!("dependsOn"), json!(k)],
                    "value_error",
                    "Value error, a ref names another item of the same batch (POST /api/training/jobs/batch); \
                     a single create depends on job ids",
                )),
            }
        }
        match issues.is_empty() {
            true => Ok(found),
            false => Err(ApiError::Validation(issues)),
        }
    }

    fn into_new_job(
        self,
        org_id: OrgId,
        idempotency: Option<(String, String)>,
        depends_on: Vec<Dependency>,
    ) -> NewJob {
        NewJob {
            org_id,
            project_id: self.project_id,
            training_task_id: self.training_task_id,
            action: self.action,
            payload: self.payload,
            priority: self.priority,
            run_at: self.run_at,
            unique_key: self.unique_key,
            idempotency,
            dataset: self.dataset.map(|d| keel_core::queue::JobDataset {
                id: d.dataset_id,
                version: d.version,
                pinned: None,
            }),
            schedule: None,
            depends_on,
        }
    }
}

/// A schedule's `job`, read as `POST /api/training/jobs` reads its body (the same checks),
/// its issues placed under `job`: its own `orgId`, if any, and what each tick enqueues. A
/// `runAt` is refused: each of the schedule's jobs runs at its tick.
pub(crate) fn schedule_job(
    value: &Value,
) -> ApiResult<(Option<OrgId>, keel_core::queue::schedules::JobTemplate)> {
    let bytes = serde_json::to_vec(value).map_err(anyhow::Error::from)?;
    let parts = match parse_job_body(&bytes) {
        Ok(body) => body.into_parts(),
        Err(ApiError::Validation(mut issues)) => {
            for issue in &mut issues {
                issue.loc.insert(1, json!("job"));
            }
            return Err(ApiError::Validation(issues));
        }
        Err(other) => return Err(other),
    };
    if parts.run_at.is_some() {
        return Err(ApiError::validation(
            vec![json!("body"), json!("job"), json!("runAt")],
            "value_error",
            "Value error, a schedule's jobs run at its ticks: a job body of a schedule takes no runAt",
        ));
    }
    if !parts.depends_on.is_empty() {
        return Err(ApiError::validation(
            vec![json!("body"), json!("job"), json!("dependsOn")],
            "value_error",
            "Value error, a schedule's jobs start at its ticks: a job body of a schedule takes no dependsOn",
        ));
    }
    let template = keel_core::queue::schedules::JobTemplate {
        project_id: parts.project_id,
        training_task_id: parts.training_task_id,
        action: parts.action,
        payload: parts.payload,
        priority: parts.priority,
        unique_key: parts.unique_key,
        dataset: parts.dataset.map(|d| (d.dataset_id, d.version)),
    };
    Ok((parts.org_id, template))
}

/// Reads a job body: `action` first (so its errors point at it), then the action's body.
fn parse_job_body(bytes: &[u8]) -> ApiResult<JobCreateBody> {
    let value: Value = parse_json_body(bytes)?;
    let action = value.get("action");
    let action = match action.and_then(Value::as_str).and_then(JobAction::parse) {
        Some(action) => action,
        None => return Err(action_issue(action)),
    };
    match parse_checked_body(bytes) {
        // Inside the union serde names no field (`["body"]`): the action's own body, read
        // alone, says which.
        Err(ApiError::Validation(issues)) if issues.iter().any(|i| i.loc == [json!("body")]) => {
            let mut variant = value;
            if let Some(object) = variant.as_object_mut() {
                object.remove("action");
            }
            let variant_bytes = serde_json::to_vec(&variant).map_err(anyhow::Error::from)?;
            let alone = match action {
                JobAction::Tracer => parse_json_body::<TracerJob>(&variant_bytes).map(JobCreateBody::Tracer),
                JobAction::Draft => parse_json_body::<DraftJob>(&variant_bytes).map(JobCreateBody::Draft),
                JobAction::Optimize => {
                    parse_json_body::<OptimizeJob>(&variant_bytes).map(JobCreateBody::Optimize)
                }
                JobAction::Training => {
                    parse_json_body::<TrainingJob>(&variant_bytes).map(JobCreateBody::Training)
                }
            };
            let issues = match alone {
                // Read alone it is fine (an integer written `4.0`, which JSON Schema counts as
                // one and serde reads only where it knows the field): the body's own rules
                // and bounds decide.
                Ok(body) => return check_parsed(body, bytes),
                Err(ApiError::Validation(placed)) => {
                    let mut all: Vec<_> = issues.into_iter().filter(|i| i.loc != [json!("body")]).collect();
                    for issue in placed {
                        if !all.iter().any(|known| known.loc == issue.loc) {
                            all.push(issue);
                        }
                    }
                    all
                }
                _ => issues,
            };
            Err(ApiError::Validation(issues))
        }
        other => other,
    }
}

/// The 422 of a body whose `action` is missing or not one of the four.
fn action_issue(action: Option<&Value>) -> ApiError {
    match action {
        Some(action) => {
            let mut c = Checks::new("body");
            c.one_of("action", action.as_str().unwrap_or(""), &JobAction::NAMES);
            ApiError::Validation(c.into_issues())
        }
        None => ApiError::validation(vec![json!("body"), json!("action")], "missing", "Field required"),
    }
}

/// Enqueue a job
///
/// Queues a job for a project of the caller's organization. The body is one of four shapes
/// chosen by `action`: `tracer`, `draft`, `optimize` or `training`. With an
/// `Idempotency-Key`, a repeat with the same body answers the job the first made (202); the
/// same key with another body is 409. With `uniqueKey`, while a job of the organization with
/// that key is not terminal, the create answers it (200) instead of making another. With
/// `dependsOn`, the job is `waiting` until every job it names has succeeded.
#[utoipa::path(post, path = "/api/training/jobs", tag = "training", security(("apiKey" = []), ("session" = [])),
    request_body = JobCreateBody,
    params(("Idempotency-Key" = Option<String>, Header, min_length = 1, max_length = 200, pattern = "^[!-~]+$",
        description = "Makes a retried create one job: a repeat with the same body answers the first one's job")),
    responses((status = 202, body = JobView), (status = 200, description = "An open job with the same uniqueKey", body = JobView),
        (status = 404, description = "Project (or a job dependsOn names) not in the organization", body = ErrorBody),
        (status = 409, description = "The Idempotency-Key was used with another body", body = ErrorBody),
        (status = 422, body = ValidationErrorBody)))]
pub async fn create_job(caller: Caller, key: IdempotencyKeyHeader, body: RawBody) -> ApiResult<HttpResponse> {
    let parts = parse_job_body(&body.0)?.into_parts();
    let depends_on = parts.single_dependencies()?;
    let access = caller.member(parts.org_id.as_ref()).await?;
    let idempotency = key.0.map(|key| (key, body_hash(&body.0)));
    let jobs = &caller.state().jobs;
    let waits = !depends_on.is_empty();
    Ok(
        match service::create_job(jobs, parts.into_new_job(access.org_id, idempotency, depends_on)).await? {
            // A new job has no history yet.
            Created::New(job) if waits => HttpResponse::Accepted().json(pipeline_view(jobs, &job).await?),
            Created::New(job) => HttpResponse::Accepted().json(JobView::from(&job)),
            Created::Replayed(job) => HttpResponse::Accepted().json(view(jobs, &job).await?),
            Created::Existing(job) => HttpResponse::Ok().json(view(jobs, &job).await?),
        },
    )
}

/// SHA-256 (hex) of a JSON body as parsed, so a repeat that differs only in spacing is the
/// same body.
fn body_hash(bytes: &[u8]) -> String {
    use sha2::Digest;
    let canonical = serde_json::from_slice::<Value>(bytes)
        .map(|value| value.to_string().into_bytes())
        .unwrap_or_else(|_| bytes.to_vec());
    hex::encode(sha2::Sha256::digest(canonical))
}

/// Jobs a batch holds at most.
pub const MAX_BATCH_JOBS: usize = 1000;

/// A batch of create bodies, each as `POST /api/training/jobs` takes it.
#[derive(Debug, Deserialize, ToSchema)]
pub struct BatchBody {
    #[schema(min_items = 1, max_items = 1000)]
    pub jobs: Vec<JobCreateBody>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct BatchView {
    /// The jobs, in the batch's order (an item whose uniqueKey an open job holds: that job).
    pub jobs: Vec<JobView>,
}

/// Reads a batch: 1 to [`MAX_BATCH_JOBS`] items, each read as a create body; every bad
/// item's issues are answered at once, located under its index.
fn parse_batch(bytes: &[u8]) -> ApiResult<Vec<Parts>> {
    let mut value: Value = parse_json_body(bytes)?;
    let Some(items) = value.get_mut("jobs").and_then(Value::as_array_mut) else {
        return Err(ApiError::validation(
            vec![json!("body"), json!("jobs")],
            "list_type",
            "Input should be a valid list",
        ));
    };
    if items.is_empty() || items.len() > MAX_BATCH_JOBS {
        let (kind, message) = match items.is_empty() {
            true => ("too_short", "List should have at least 1 item".to_owned()),
            false => (
                "too_long",
                format!("List should have at most {MAX_BATCH_JOBS} items"),
            ),
        };
        return Err(ApiError::validation(
            vec![json!("body"), json!("jobs")],
            kind,
            message,
        ));
    }
    let mut parts = Vec::with_capacity(items.len());
    let mut issues = Vec::new();
    for (index, item) in items.iter_mut().enumerate() {
        let item_bytes = serde_json::to_vec(&item.take()).map_err(anyhow::Error::from)?;
        match parse_job_body(&item_bytes) {
            Ok(body) => parts.push(body.into_parts()),
            Err(ApiError::Validation(found)) => issues.extend(found.into_iter().map(|mut issue| {
                let rest = issue.loc.split_off(1.min(issue.loc.len()));
                issue.loc = [json!("body"), json!("jobs"), json!(index)]
                    .into_iter()
                    .chain(rest)
                    .collect();
                issue
            })),
            Err(other) => return Err(other),
        }
    }
    match issues.is_empty() {
        true => Ok(parts),
        false => Err(ApiError::Validation(issues)),
    }
}

/// Each item's dependencies, its `ref:` entries resolved to the items they name: an unknown
/// ref, a ref two items give, or a cycle is a 422 naming the item (and the entry).
fn batch_dependencies(parts: &[Parts]) -> ApiResult<Vec<Vec<Dependency>>> {
    let item = |i: usize, rest: &[Value]| -> Vec<Value> {
        [json!("body"), json!("jobs"), json!(i)]
            .into_iter()
            .chain(rest.iter().cloned())
            .collect()
    };
    let mut issues = Vec::new();
    let mut refs: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (i, part) in parts.iter().enumerate() {
        if let Some(name) = part.reference.as_deref() {
            if let Some(first) = refs.insert(name, i) {
                refs.insert(name, first);
                issues.push(ValidationIssue::new(
                    item(i, &[json!("ref")]),
                    "value_error",
                    format!("Value error, jobs[{first}] has this ref already: each item's ref is its own"),
                ));
            }
        }
    }
    let mut resolved = Vec::with_capacity(parts.len());
    for (i, part) in parts.iter().enumerate() {
        let mut dependencies = Vec::with_capacity(part.depends_on.len());
        for (k, entry) in part.depends_on.iter().enumerate() {
            match named(entry) {
                Named::Job(id) => dependencies.push(Dependency::Job(id)),
                Named::Ref(name) => match refs.get(name.as_str()) {
                    Some(&j) if !dependencies.contains(&Dependency::Item(j)) => {
                        dependencies.push(Dependency::Item(j))
                    }
                    Some(_) => {}
                    None => issues.push(ValidationIssue::new(
                        item(i, &[json!("dependsOn"), json!(k)]),
                        "value_error",
                        format!("Value error, no item of this batch has the ref {name:?}"),
                    )),
                },
            }
        }
        resolved.push(dependencies);
    }
    if issues.is_empty() {
        if let Some(cycle) = find_cycle(&resolved) {
            let names: Vec<String> = cycle
                .iter()
                .map(|&i| match parts[i].reference.as_deref() {
                    Some(name) => format!("jobs[{i}] ({name})"),
                    None => format!("jobs[{i}]"),
                })
                .collect();
            issues.push(ValidationIssue::new(
                item(cycle[0], &[json!("dependsOn")]),
                "value_error",
                format!(
                    "Value error, the batch's dependencies run in a circle: {} → {}",
                    names.join(" → "),
                    names[0]
                ),
            ));
        }
    }
    match issues.is_empty() {
        true => Ok(resolved),
        false => Err(ApiError::Validation(issues)),
    }
}

/// A cycle among the items' dependencies on each other, if any: its items in order, each
/// depending on the next (the last on the first).
fn find_cycle(dependencies: &[Vec<Dependency>]) -> Option<Vec<usize>> {
    // Depth first, without recursion (a thousand items in a chain): 0 unseen, 1 on the
    // path, 2 done.
    let mut state = vec![0u8; dependencies.len()];
    for start in 0..dependencies.len() {
        if state[start] != 0 {
            continue;
        }
        let mut path: Vec<(usize, usize)> = vec![(start, 0)];
        state[start] = 1;
        while let Some((node, next)) = path.last_mut() {
            let node = *node;
            let edges = &dependencies[node];
            if *next == edges.len() {
                state[node] = 2;
                path.pop();
                continue;
            }
            let edge = &edges[*next];
            *next += 1;
            let Dependency::Item(to) = *edge else {
                continue;
            };
            match state[to] {
                0 => {
                    state[to] = 1;
                    path.push((to, 0));
                }
                1 => {
                    let from = path.iter().position(|(n, _)| *n == to).unwrap_or(0);
                    return Some(path[from..].iter().map(|(n, _)| *n).collect());
                }
                _ => {}
            }
        }
    }
    None
}

/// Enqueue jobs in bulk
///
/// Queues 1 to 1,000 jobs at once, all or nothing: one bad item is a 422 naming its index and
/// nothing is queued (an item whose project is not the organization's: 404, naming it). Each
/// item is a create body and keeps its priority, runAt, uniqueKey and dependsOn; a whole
/// pipeline is one batch, its items naming each other by `ref` (`"dependsOn": ["ref:tracer"]`;
/// an unknown ref, a ref two items give, or a cycle is 422 naming the item).
#[utoipa::path(post, path = "/api/training/jobs/batch", tag = "training", security(("apiKey" = []), ("session" = [])),
    request_body = BatchBody,
    responses((status = 202, body = BatchView),
        (status = 404, description = "An item's project, or a job its dependsOn names, is not in the organization (the message names the item)", body = ErrorBody),
        (status = 422, description = "A bad item (its index in `loc`)", body = ValidationErrorBody)))]
pub async fn create_batch(caller: Caller, body: RawBody) -> ApiResult<HttpResponse> {
    let parts = parse_batch(&body.0)?;
    let mut dependencies = batch_dependencies(&parts)?.into_iter();
    // Each item's organization as the caller may name it (another's is 403, as everywhere).
    let mut orgs: Vec<(Option<OrgId>, OrgId)> = Vec::new();
    let mut batch = Vec::with_capacity(parts.len());
    for part in parts {
        let org_id = match orgs.iter().find(|(named, _)| *named == part.org_id) {
            Some((_, org_id)) => org_id.clone(),
            None => {
                let org_id = caller.member(part.org_id.as_ref()).await?.org_id;
                orgs.push((part.org_id.clone(), org_id.clone()));
                org_id
            }
        };
        batch.push(part.into_new_job(org_id, None, dependencies.next().unwrap_or_default()));
    }
    // A pipeline is one organization's: an item depends only on items of its organization.
    let mut issues = Vec::new();
    for (i, job) in batch.iter().enumerate() {
        for dependency in &job.depends_on {
            if let Dependency::Item(j) = dependency {
                if batch[*j].org_id != job.org_id {
                    issues.push(ValidationIssue::new(
                        vec![json!("body"), json!("jobs"), json!(i), json!("dependsOn")],
                        "value_error",
                        format!("Value error, jobs[{j}] is another organization's: a job depends only on jobs of its own"),
                    ));
                }
            }
        }
    }
    if !issues.is_empty() {
        return Err(ApiError::Validation(issues));
    }
    let jobs = &caller.state().jobs;
    let created = service::create_batch(jobs, batch).await?;
    // New jobs have no history; only the open jobs some items' unique keys named are read.
    let known: Vec<entities::training_job::Model> = created
        .iter()
        .filter_map(|c| match c {
            Created::New(_) => None,
            Created::Existing(job) | Created::Replayed(job) => Some(job.clone()),
        })
        .collect();
    let mut known_views = views(jobs, &known).await?.into_iter();
    let jobs = created
        .iter()
        .map(|c| match c {
            Created::New(job) => JobView::from(job),
            Created::Existing(job) | Created::Replayed(job) => {
                known_views.next().unwrap_or_else(|| JobView::from(job))
            }
        })
        .collect();
    Ok(HttpResponse::Accepted().json(BatchView { jobs }))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// 1..200, default 50.
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<i64>,
    #[param(value_type = Option<String>, min_length = 1, max_length = 100)]
    #[serde(default, deserialize_with = "OrgId::optional")]
    pub org_id: Option<OrgId>,
    #[param(min_length = 1, max_length = 100)]
    pub project_id: Option<String>,
    #[param(min_length = 1, max_length = 100)]
    pub training_task_id: Option<String>,
    /// Jobs in any of these states (repeat it: `status=failed&status=blocked`).
    #[param(value_type = Option<Vec<crate::schemas::JobStatus>>, style = Form, explode)]
    #[serde(default)]
    pub status: Vec<String>,
    #[param(value_type = Option<crate::schemas::JobAction>)]
    pub action: Option<String>,
    /// Only the jobs of this cron schedule (`/api/training/schedules`): its ticks and its runs
    /// now.
    #[param(min_length = 1, max_length = 100)]
    pub schedule_id: Option<String>,
    /// Only the jobs of the pipeline this job is in: every job linked to it by `dependsOn`,
    /// either way (itself included).
    #[param(min_length = 1, max_length = 100)]
    pub pipeline: Option<String>,
    /// The last page's `nextCursor`.
    #[param(pattern = "^[0-9]{1,12}-[0-9]{9}-[0-9a-f]{32}$")]
    pub cursor: Option<String>,
}

impl Validate for ListQuery {
    fn validate(&self, c: &mut Checks) {
        let statuses = keel_core::domain::JobStatus::ALL.map(|s| s.as_str());
        for (i, status) in self.status.iter().enumerate() {
            if !statuses.contains(&status.as_str()) {
                c.fail_item(
                    "status",
                    i,
                    "enum",
                    format!("Input should be one of: {}", statuses.join(", ")),
                );
            }
        }
        if let Some(action) = &self.action {
            c.one_of("action", action, &JobAction::NAMES);
        }
        if self
            .cursor
            .as_deref()
            .is_some_and(|cursor| keel_core::paging::Keyset::decode(cursor).is_none())
        {
            c.fail(
                "cursor",
                "value_error",
                "Input should be a nextCursor this list gave",
            );
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct JobList {
    pub jobs: Vec<JobView>,
    pub count: usize,
    /// The next (older) page's cursor; none on the last page.
    pub next_cursor: Option<String>,
}

/// List jobs
///
/// The caller's jobs, newest first, optionally narrowed to an organization, project, training
/// task, states (`status`, repeatable), action, cron schedule (`scheduleId`) or pipeline
/// (`pipeline`: any job of it); `limit` at a time, the next page from `cursor` (the last
/// page's `nextCursor`).
#[utoipa::path(get, path = "/api/training/jobs", tag = "training", security(("apiKey" = []), ("session" = [])),
    params(ListQuery),
    responses((status = 200, body = JobList), (status = 422, body = ValidationErrorBody)))]
pub async fn list_jobs(caller: Caller, query: ValidQuery<ListQuery>) -> ApiResult<HttpResponse> {
    let query = query.0;
    let orgs = match &query.org_id {
        Some(org) => vec![caller.member(Some(org)).await?.org_id],
        None if caller.named_org() => vec![caller.member(None).await?.org_id],
        None => caller.organizations().await?,
    };
    let mut status = Vec::new();
    for name in &query.status {
        if let Some(parsed) = keel_core::domain::JobStatus::parse(name).filter(|s| !status.contains(s)) {
            status.push(parsed);
        }
    }
    let filter = JobFilter {
        // A project id in any UUID spelling; other text matches no job.
        project_id: query
            .project_id
            .map(|p| ProjectId::parse(&p).map_or(p, ProjectId::into_string)),
        training_task_id: query.training_task_id,
        status,
        action: query.action.as_deref().and_then(JobAction::parse),
        // A schedule id in any UUID spelling; other text matches no job.
        schedule_id: query.schedule_id.map(|s| {
            keel_core::domain::ScheduleId::parse(&s).map_or(s, keel_core::domain::ScheduleId::into_string)
        }),
        // A job id in any UUID spelling; other text matches no job.
        pipeline: query
            .pipeline
            .map(|p| JobId::parse(&p).map_or(p, JobId::into_string)),
        before: query
            .cursor
            .as_deref()
            .and_then(keel_core::paging::Keyset::decode)
            .and_then(|k| keel_core::domain::JobId::parse(&k.id).ok().map(|id| (k.at, id))),
    };
    let limit = query.limit.unwrap_or(50) as u64;
    let (found, next) = service::jobs_page(&caller.state().jobs, &orgs, &filter, limit).await?;
    let jobs = views(&caller.state().jobs, &found).await?;
    Ok(HttpResponse::Ok().json(JobList {
        count: jobs.len(),
        jobs,
        next_cursor: next.map(|k| k.encode()),
    }))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct GetQuery {
    #[param(value_type = Option<String>, min_length = 1, max_length = 100)]
    #[serde(default, deserialize_with = "OrgId::optional")]
    pub org_id: Option<OrgId>,
    /// Must match the job's project when given (empty: any).
    #[param(max_length = 100)]
    pub project_id: Option<String>,
    /// Must match the job's training task when given (empty: any).
    #[param(max_length = 100)]
    pub training_task_id: Option<String>,
}

impl Validate for GetQuery {}

/// The job if the caller may see it (another organization's job is "not found").
async fn visible_job(
    caller: &Caller,
    job_id: &str,
    org_id: Option<&OrgId>,
) -> ApiResult<entities::training_job::Model> {
    let orgs = match org_id {
        Some(org) => vec![caller.member(Some(org)).await?.org_id],
        None => caller.organizations().await?,
    };
    // Not an id keel gave out: no such job (after the caller's rights, as for any job).
    let job_id = known_job(job_id)?;
    Ok(service::job_of_orgs(&caller.state().jobs, &orgs, &job_id).await?)
}

/// Read a job
///
/// One job of the caller's organizations; another organization's job is 404.
#[utoipa::path(get, path = "/api/training/jobs/{job_id}", tag = "training", security(("apiKey" = []), ("session" = [])),
    params(("job_id" = String, Path), GetQuery),
    responses((status = 200, body = JobView), (status = 404, body = ErrorBody)))]
pub async fn get_job(
    caller: Caller,
    path: web::Path<String>,
    query: ValidQuery<GetQuery>,
) -> ApiResult<HttpResponse> {
    let query = query.0;
    let job = visible_job(&caller, &path, query.org_id.as_ref()).await?;
    let project_matches = query
        .project_id
        .as_ref()
        .filter(|p| !p.is_empty())
        .is_none_or(|p| ProjectId::parse(p).is_ok_and(|p| p == job.project_id));
    let task_matches = query
        .training_task_id
        .as_deref()
        .filter(|t| !t.is_empty())
        .is_none_or(|t| job.training_task_id.as_deref() == Some(t));
    if !(project_matches && task_matches) {
        return Err(ApiError::not_found("job"));
    }
    Ok(HttpResponse::Ok().json(pipeline_view(&caller.state().jobs, &job).await?))
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StopBody {
    #[schema(value_type = Option<String>, min_length = 1, max_length = 100)]
    #[serde(default, deserialize_with = "OrgId::optional")]
    pub org_id: Option<OrgId>,
    #[schema(max_length = 2000)]
    pub reason: Option<String>,
}

impl Validate for StopBody {
    fn validate(&self, _c: &mut Checks) {}
}

/// Stop a job
///
/// Asks for a job to stop: a queued job stops at once, a running one is told at its worker's
/// next heartbeat.
#[utoipa::path(post, path = "/api/training/jobs/{job_id}/stop", tag = "training", security(("apiKey" = []), ("session" = [])),
    params(("job_id" = String, Path)),
    request_body(content = StopBody, description = "Optional"),
    responses((status = 200, body = JobView), (status = 404, body = ErrorBody),
        (status = 409, description = "The job already finished", body = ErrorBody)))]
pub async fn stop_job(
    caller: Caller,
    path: web::Path<String>,
    body: ValidJson<StopBody>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    let job = visible_job(&caller, &path, body.org_id.as_ref()).await?;
    let stopped = service::stop_job(&caller.state().jobs, &job, body.reason.as_deref()).await?;
    Ok(HttpResponse::Ok().json(view(&caller.state().jobs, &stopped).await?))
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RetryBody {
    #[schema(value_type = Option<String>, min_length = 1, max_length = 100)]
    #[serde(default, deserialize_with = "OrgId::optional")]
    pub org_id: Option<OrgId>,
}

impl Validate for RetryBody {}

/// Retry a job
///
/// Puts a failed, blocked or user-stopped job back in the queue (its attempts keep
/// counting); a job in any other state is 409.
#[utoipa::path(post, path = "/api/training/jobs/{job_id}/retry", tag = "training", security(("apiKey" = []), ("session" = [])),
    params(("job_id" = String, Path)),
    request_body(content = RetryBody, description = "Optional"),
    responses((status = 200, body = JobView), (status = 404, body = ErrorBody),
        (status = 409, description = "The job is not failed, blocked or user-stopped", body = ErrorBody)))]
pub async fn retry_job(
    caller: Caller,
    path: web::Path<String>,
    body: ValidJson<RetryBody>,
) -> ApiResult<HttpResponse> {
    let job = visible_job(&caller, &path, body.0.org_id.as_ref()).await?;
    let retried = service::retry_job(&caller.state().jobs, &job).await?;
    Ok(HttpResponse::Ok().json(view(&caller.state().jobs, &retried).await?))
}

const MAX_SECRETS: usize = 100;
const MAX_SECRET_CHARS: usize = 20_000;

/// A secret's name: letters, digits and `_`, not starting with a digit, 1..128 characters.
static SECRET_NAME_RE: lazy_regex::Lazy<regex::Regex> =
    lazy_regex::lazy_regex!(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$");

/// The `secrets` map as validation reads it: at most [`MAX_SECRETS`] names matching
/// [`SECRET_NAME_RE`], values of at most [`MAX_SECRET_CHARS`] characters.
fn secrets_schema() -> utoipa::openapi::Object {
    use utoipa::openapi::{ObjectBuilder, Type};
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .max_properties(Some(MAX_SECRETS))
        .property_names(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some(SECRET_NAME_RE.as_str())),
        ))
        .additional_properties(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .max_length(Some(MAX_SECRET_CHARS)),
        ))
        .description(Some(
            "NAME → value; an empty value deletes the secret. At most 100 at once.",
        ))
        .build()
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SecretsBody {
    #[schema(value_type = Option<String>, min_length = 1, max_length = 100)]
    #[serde(default, deserialize_with = "OrgId::optional")]
    pub org_id: Option<OrgId>,
    /// NAME → value; an empty value deletes the secret. At most 100 at once.
    #[schema(schema_with = secrets_schema)]
    pub secrets: BTreeMap<String, String>,
}

impl Validate for SecretsBody {
    fn validate(&self, c: &mut Checks) {
        if self.secrets.len() > MAX_SECRETS {
            c.fail("secrets", "too_long", "At most 100 secrets at once");
        }
        for (name, value) in &self.secrets {
            if !SECRET_NAME_RE.is_match(name) {
                c.fail(
                    "secrets",
                    "value_error",
                    format!("invalid secret name {name:?}: letters, digits and _ (1..128), not starting with a digit"),
                );
            }
            if value.chars().count() > MAX_SECRET_CHARS {
                c.fail(
                    "secrets",
                    "string_too_long",
                    format!("the value of {name} is over 20000 characters"),
                );
            }
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SecretNames {
    /// Every secret name the organization now has; values are never returned.
    pub names: Vec<String>,
}

crate::org_scoped!(SecretsBody);

/// Set training secrets
///
/// Stores the organization's secrets for training workers, encrypted: each named secret is set,
/// or deleted when its value is empty, at most 100 at once. All change or none do. Values are
/// never answered back.
#[utoipa::path(post, path = "/api/training/secrets", tag = "training", security(("apiKey" = []), ("session" = [])),
    request_body = SecretsBody,
    responses((status = 200, body = SecretNames), (status = 503, description = "No encryption key configured", body = ErrorBody)))]
pub async fn set_secrets(member: Member<ValidJson<SecretsBody>>) -> ApiResult<HttpResponse> {
    let names =
        service::set_secrets(&member.state.jobs, &member.access.org_id, member.input.0.secrets).await?;
    Ok(HttpResponse::Ok().json(SecretNames { names }))
}
