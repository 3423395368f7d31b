//! Runs of projects: create, update, link to the experiment tracker; checkpoints (internal);
//! and `GET /api/tracker`, which reads linked runs from the tracker.

pub mod repo;
pub mod tracker;

use actix_web::{web, HttpResponse};
use chrono::{DateTime, Utc};
use entities::run;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::auth::{Caller, Internal};
use crate::domain::{OrgId, ProjectId};
use crate::error::{ApiError, ApiResult, ErrorBody, ValidationErrorBody};
use crate::http::extract::{path_str, present, ValidJson, ValidQuery};
use crate::http::validate::{Checks, Validate};
use crate::queue::routes::check_env_slug;
use crate::state::AppState;

/// Most checkpoints one `POST /api/runs/internal/checkpoints` may carry.
pub const MAX_CHECKPOINTS_PER_BODY: usize = 1000;

/// The status of a run nobody has updated yet.
pub const INITIAL_STATUS: &str = "created";

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunCreateRequest {
    #[schema(value_type = String, format = Uuid)]
    pub project_id: ProjectId,
    #[schema(min_length = 1, max_length = 200)]
    pub name: Option<String>,
    #[schema(min_length = 1, max_length = 200)]
    pub model: Option<String>,
    #[schema(
        min_length = 3,
        max_length = 512,
        pattern = r"^[a-z0-9][a-z0-9._-]*/[a-z0-9][a-z0-9._-]*/[a-z0-9][a-z0-9._-]*$"
    )]
    pub environment_slug: Option<String>,
    /// Free-form run configuration.
    #[schema(value_type = Option<Object>)]
    pub config: Option<Map<String, Value>>,
}

impl Validate for RunCreateRequest {
    fn validate(&self, c: &mut Checks) {
        c.uuid("projectId", &self.project_id);
        c.opt_str_len("name", self.name.as_deref(), 1, 200);
        c.opt_str_len("model", self.model.as_deref(), 1, 200);
        if let Some(slug) = &self.environment_slug {
            check_env_slug(c, "environmentSlug", slug);
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunCreateResponse {
    pub run_id: String,
    pub project_id: String,
    pub status: String,
}

/// Create a run
///
/// Creates a training run in a project of the caller's organization.
#[utoipa::path(post, path = "/api/runs", tag = "runs", security(("apiKey" = []), ("session" = [])),
    request_body = RunCreateRequest,
    responses(
        (status = 200, body = RunCreateResponse),
        (status = 404, description = "Project not in the caller's organizations", body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn create_run(caller: Caller, body: ValidJson<RunCreateRequest>) -> ApiResult<HttpResponse> {
    let body = body.0;
    let orgs = caller.organizations().await?;
    let db = &caller.state().db;
    let project = crate::projects::repo::find_in_orgs(db, &body.project_id, &orgs)
        .await?
        .ok_or_else(|| ApiError::not_found("project"))?;
    let run = repo::insert_run(db, &project, &body).await?;
    Ok(HttpResponse::Ok().json(RunCreateResponse {
        run_id: run.id,
        project_id: run.project_id,
        status: run.status,
    }))
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct RunUpdateRequest {
    #[schema(min_length = 1, max_length = 64)]
    pub status: Option<String>,
    /// A text or an object; `null` clears it.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<Object>)]
    pub summary: Option<Option<Value>>,
    /// Free-form metrics; `null` clears them.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<Object>)]
    pub metrics: Option<Option<Map<String, Value>>>,
    /// `null` clears it.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>, max_length = 10000)]
    pub error: Option<Option<String>>,
}

impl Validate for RunUpdateRequest {
    fn validate(&self, c: &mut Checks) {
        c.opt_str_len("status", self.status.as_deref(), 1, 64);
        match &self.summary {
            Some(Some(Value::String(text))) => c.str_len("summary", text, 0, 10_000),
            Some(Some(Value::Object(_)) | None) | None => {}
            Some(Some(_)) => c.fail(
                "summary",
                "dict_type",
                "Input should be a valid dictionary or string",
            ),
        }
        if let Some(Some(error)) = &self.error {
            c.str_len("error", error, 0, 10_000);
        }
    }
}

/// A run as its owner sees it (the answer to an update).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunView {
    pub run_id: String,
    pub project_id: String,
    pub name: Option<String>,
    pub model: Option<String>,
    pub environment_slug: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub config: Option<Value>,
    pub status: String,
    #[schema(value_type = Option<Object>)]
    pub summary: Option<Value>,
    #[schema(value_type = Option<Object>)]
    pub metrics: Option<Value>,
    pub error: Option<String>,
    pub tracker: Option<TrackerLink>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

fn parse_json(text: Option<&str>) -> Option<Value> {
    text.and_then(|t| serde_json::from_str(t).ok())
}

impl From<run::Model> for RunView {
    fn from(r: run::Model) -> Self {
        let tracker = TrackerLink::of(&r);
        Self {
            config: parse_json(r.config.as_deref()),
            summary: parse_json(r.summary.as_deref()),
            metrics: parse_json(r.metrics.as_deref()),
            run_id: r.id,
            project_id: r.project_id,
            name: r.name,
            model: r.model,
            environment_slug: r.environment_slug,
            status: r.status,
            error: r.error,
            tracker,
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

async fn own_run(caller: &Caller, raw_id: &str) -> ApiResult<run::Model> {
    let run_id = path_str("run_id", raw_id, 1, 128)?;
    let orgs = caller.organizations().await?;
    repo::find_run(&caller.state().db, &run_id, &orgs)
        .await?
        .ok_or_else(|| ApiError::not_found("run"))
}

/// Update a run
///
/// Changes a run's status, summary, metrics or error; `null` clears a field.
#[utoipa::path(patch, path = "/api/runs/{run_id}", tag = "runs", security(("apiKey" = []), ("session" = [])),
    params(("run_id" = String, Path, min_length = 1, max_length = 128)),
    request_body = RunUpdateRequest,
    responses(
        (status = 200, description = "RunUpdateResponse: the run after the update", body = RunView),
        (status = 404, description = "No such run in the caller's organizations", body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn update_run(
    caller: Caller,
    path: web::Path<String>,
    body: ValidJson<RunUpdateRequest>,
) -> ApiResult<HttpResponse> {
    let run = own_run(&caller, &path).await?;
    let run = repo::update_run(&caller.state().db, run, body.0).await?;
    Ok(HttpResponse::Ok().json(RunView::from(run)))
}

#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrackerLink {
    /// The tracker's entity (team or user).
    #[schema(min_length = 1, max_length = 200)]
    pub entity: String,
    /// The tracker's project.
    #[schema(min_length = 1, max_length = 200)]
    pub project: String,
    #[schema(min_length = 1, max_length = 200)]
    pub tracker_run_id: String,
    /// A link to the run in the tracker's UI (http or https).
    #[schema(
        min_length = 1,
        max_length = 2048,
        pattern = r"^https?://[A-Za-z0-9][A-Za-z0-9.-]*(:[0-9]{1,5})?([/?#][!-~]*)?$"
    )]
    pub url: Option<String>,
}

impl TrackerLink {
    fn of(r: &run::Model) -> Option<Self> {
        Some(Self {
            entity: r.tracker_entity.clone()?,
            project: r.tracker_project.clone()?,
            tracker_run_id: r.tracker_run_id.clone()?,
            url: r.tracker_url.clone(),
        })
    }
}

/// A tracker link: http(s), a host, an optional port, then printable ASCII (the same pattern
/// as the schema's).
static TRACKER_URL_RE: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
    regex::Regex::new(r"^https?://[A-Za-z0-9][A-Za-z0-9.-]*(:[0-9]{1,5})?([/?#][!-~]*)?$")
        .unwrap_or_else(|_| unreachable!())
});

impl Validate for TrackerLink {
    fn validate(&self, c: &mut Checks) {
        c.str_len("entity", &self.entity, 1, 200);
        c.str_len("project", &self.project, 1, 200);
        c.str_len("trackerRunId", &self.tracker_run_id, 1, 200);
        if let Some(url) = &self.url {
            c.str_len("url", url, 1, 2048);
            if !TRACKER_URL_RE.is_match(url) {
                c.fail("url", "url_parsing", "Input should be a valid http or https URL");
            }
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrackerLinked {
    pub run_id: String,
    pub entity: String,
    pub project: String,
    pub tracker_run_id: String,
    pub url: Option<String>,
}

/// Link a run to a tracker
///
/// Records the experiment tracker (entity, project, run id) of a run.
#[utoipa::path(post, path = "/api/runs/{run_id}/tracker", tag = "runs", security(("apiKey" = []), ("session" = [])),
    params(("run_id" = String, Path, min_length = 1, max_length = 128)),
    request_body = TrackerLink,
    responses(
        (status = 200, body = TrackerLinked),
        (status = 404, body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn link_tracker(
    caller: Caller,
    path: web::Path<String>,
    body: ValidJson<TrackerLink>,
) -> ApiResult<HttpResponse> {
    let run = own_run(&caller, &path).await?;
    let link = body.0;
    repo::link_tracker(&caller.state().db, &run.id, &link).await?;
    Ok(HttpResponse::Ok().json(TrackerLinked {
        run_id: run.id,
        entity: link.entity,
        project: link.project,
        tracker_run_id: link.tracker_run_id,
        url: link.url,
    }))
}

#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct CheckpointItem {
    #[schema(minimum = 0)]
    pub step: i64,
    #[schema(min_length = 1, max_length = 300)]
    pub subfolder: String,
}

impl Validate for CheckpointItem {
    fn validate(&self, c: &mut Checks) {
        c.int_range("step", self.step, 0, i64::MAX);
        c.str_len("subfolder", &self.subfolder, 1, 300);
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunCheckpointsBody {
    #[schema(min_length = 1, max_length = 300)]
    pub run_id: String,
    #[schema(value_type = String, min_length = 1, max_length = 300)]
    pub org_id: OrgId,
    #[schema(value_type = String, format = Uuid)]
    pub project_id: ProjectId,
    #[schema(max_items = 1000)]
    pub checkpoints: Vec<CheckpointItem>,
}

impl Validate for RunCheckpointsBody {
    fn validate(&self, c: &mut Checks) {
        c.str_len("runId", &self.run_id, 1, 300);
        c.str_len("orgId", &self.org_id, 1, 300);
        c.uuid("projectId", &self.project_id);
        c.max_items("checkpoints", self.checkpoints.len(), MAX_CHECKPOINTS_PER_BODY);
        for (i, item) in self.checkpoints.iter().enumerate() {
            c.nested("checkpoints", Some(i), item);
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointsUpserted {
    pub run_id: String,
    /// Distinct steps written by this call.
    pub upserted: usize,
    /// Checkpoints the run has now.
    pub total: u64,
}

/// The project must be `org_id`'s; answers the canonical ids.
async fn project_of_org(
    state: &AppState,
    org_id: &OrgId,
    project_id: &ProjectId,
) -> ApiResult<(String, String)> {
    let project = crate::projects::repo::find_in_org(&state.db, org_id, project_id)
        .await?
        .ok_or_else(|| ApiError::not_found("project"))?;
    Ok((project.org_id, project.id))
}

/// Record a run's checkpoints
///
/// Internal key: upserts checkpoints of a run by step.
#[utoipa::path(post, path = "/api/runs/internal/checkpoints", tag = "runs", security(("internalKey" = [])),
    request_body = RunCheckpointsBody,
    responses(
        (status = 200, body = CheckpointsUpserted),
        (status = 404, description = "The project is not that organization's", body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn upsert_checkpoints(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<RunCheckpointsBody>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    let (org_id, project_id) = project_of_org(&state, &body.org_id, &body.project_id).await?;
    let upserted =
        repo::upsert_checkpoints(&state.db, &org_id, &project_id, &body.run_id, &body.checkpoints).await?;
    let total = repo::count_checkpoints(&state.db, &org_id, &project_id, &body.run_id).await?;
    Ok(HttpResponse::Ok().json(CheckpointsUpserted {
        run_id: body.run_id,
        upserted,
        total,
    }))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct CheckpointsQuery {
    #[param(min_length = 1, max_length = 300)]
    pub run_id: String,
    #[param(value_type = String, min_length = 1, max_length = 300)]
    pub org_id: OrgId,
    #[param(value_type = String, format = Uuid)]
    pub project_id: ProjectId,
}

impl Validate for CheckpointsQuery {
    fn validate(&self, c: &mut Checks) {
        c.str_len("runId", &self.run_id, 1, 300);
        c.str_len("orgId", &self.org_id, 1, 300);
        c.uuid("projectId", &self.project_id);
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunCheckpoints {
    pub run_id: String,
    /// Ordered by step.
    pub checkpoints: Vec<CheckpointItem>,
}

/// Read a run's checkpoints
///
/// Internal key: the checkpoints of a run, by step.
#[utoipa::path(get, path = "/api/runs/internal/checkpoints", tag = "runs", security(("internalKey" = [])),
    params(CheckpointsQuery),
    responses(
        (status = 200, body = RunCheckpoints),
        (status = 404, description = "The project is not that organization's", body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn list_checkpoints(
    _: Internal,
    state: web::Data<AppState>,
    query: ValidQuery<CheckpointsQuery>,
) -> ApiResult<HttpResponse> {
    let query = query.0;
    let (org_id, project_id) = project_of_org(&state, &query.org_id, &query.project_id).await?;
    let checkpoints = repo::list_checkpoints(&state.db, &org_id, &project_id, &query.run_id).await?;
    Ok(HttpResponse::Ok().json(RunCheckpoints {
        run_id: query.run_id,
        checkpoints,
    }))
}
