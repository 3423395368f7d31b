//! Flash: the control plane's internal endpoints. It mirrors environments (published to the
//! hub), managed runs and their checkpoints into keel, records product events, and asks
//! keel to provision hub repositories for environments still waiting for one.

pub mod hub;
pub mod repo;

use actix_web::{web, HttpResponse};
use chrono::{DateTime, Utc};
use entities::flash_environment;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::sync::LazyLock;
use utoipa::ToSchema;

use crate::auth::Internal;
use crate::domain::{OrgId, ProjectId};
use crate::error::{ApiError, ApiResult, ErrorBody, ValidationErrorBody};
use crate::http::extract::{parse_checked_body, parse_json_body, RawBody, ValidJson, ValidQuery};
use crate::http::validate::{Checks, Validate};
use crate::queue::routes::check_env_slug;
use crate::state::AppState;

/// Organization ids are UUIDs; longer strings cannot name one (bounded so they answer 404,
/// not a database error).
const ORG_ID_MAX: usize = 100;

static SHA256_RE: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new(r"^[0-9a-f]{64}$").unwrap_or_else(|_| unreachable!()));

fn check_org_project(c: &mut Checks, org_id: &str, project_id: &str) {
    c.str_len("orgId", org_id, 1, ORG_ID_MAX);
    c.uuid("projectId", project_id);
}

/// The project, active within the organization; 404 otherwise.
async fn active_project(
    state: &AppState,
    org_id: &OrgId,
    project_id: &ProjectId,
) -> ApiResult<entities::project::Model> {
    crate::projects::repo::find_in_org(&state.db, org_id, project_id)
        .await?
        .filter(|p| p.active)
        .ok_or_else(|| ApiError::NotFound("project not found or not active in this organization".into()))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlashProjectValidateBody {
    #[schema(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
    #[schema(value_type = String, format = Uuid)]
    pub project_id: ProjectId,
}

impl Validate for FlashProjectValidateBody {
    fn validate(&self, c: &mut Checks) {
        check_org_project(c, &self.org_id, &self.project_id);
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProjectValid {
    pub valid: bool,
    pub project_id: String,
    pub org_id: String,
    pub slug: String,
}

/// Check a project is active
///
/// Internal key: answers the project's id and slug when it is active in the organization; 404
/// otherwise.
#[utoipa::path(post, path = "/api/flash/projects/validate/internal", tag = "flash", security(("internalKey" = [])),
    request_body = FlashProjectValidateBody,
    responses(
        (status = 200, body = ProjectValid),
        (status = 404, description = "No such active project in the organization", body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn validate_project(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<FlashProjectValidateBody>,
) -> ApiResult<HttpResponse> {
    let project = active_project(&state, &body.0.org_id, &body.0.project_id).await?;
    Ok(HttpResponse::Ok().json(ProjectValid {
        valid: true,
        project_id: project.id,
        org_id: project.org_id,
        slug: project.slug,
    }))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct ProvisionQuery {
    /// Environments attempted at most in this pass: 1..100, default 25.
    #[param(minimum = 1, maximum = 100)]
    pub limit: Option<i64>,
    /// Only this organization's environments (its backoff alone advances).
    #[param(value_type = Option<String>, format = Uuid)]
    pub org_id: Option<OrgId>,
}

impl Validate for ProvisionQuery {
    fn validate(&self, c: &mut Checks) {
        c.opt_int_range("limit", self.limit, 1, 100);
        if let Some(org) = &self.org_id {
            c.uuid("orgId", org);
        }
    }
}

/// Run a hub provisioning pass
///
/// Internal key: one bounded pass (`limit`, default 25) over environments waiting for their hub
/// repository, optionally for one organization (`orgId`) so its backoff alone advances. With no
/// hub configured nothing is called: the environments the pass would have tried are counted as
/// `skipped`.
#[utoipa::path(post, path = "/api/flash/environments/hub/provision/internal", tag = "flash",
    security(("internalKey" = [])),
    params(ProvisionQuery),
    responses(
        (status = 200, body = hub::PassReport),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn provision_hub(
    _: Internal,
    state: web::Data<AppState>,
    query: ValidQuery<ProvisionQuery>,
) -> ApiResult<HttpResponse> {
    let limit = query.0.limit.unwrap_or(25) as u64;
    let report = hub::run_pass(&state, limit, query.0.org_id.as_deref()).await?;
    Ok(HttpResponse::Ok().json(report))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlashEnvironmentPublishBody {
    #[schema(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
    #[schema(value_type = String, format = Uuid)]
    pub project_id: ProjectId,
    #[schema(
        min_length = 3,
        max_length = 512,
        pattern = r"^[a-z0-9][a-z0-9._-]*/[a-z0-9][a-z0-9._-]*/[a-z0-9][a-z0-9._-]*$"
    )]
    pub slug: String,
    #[schema(min_length = 1, max_length = 120)]
    pub name: String,
    /// Default: `hub.default_repo` from config.
    #[schema(min_length = 1, max_length = 512)]
    pub hub_repo: Option<String>,
    /// Default `main`.
    #[schema(min_length = 1, max_length = 512)]
    pub hub_ref: Option<String>,
    #[schema(min_length = 1, max_length = 4096)]
    pub hub_path: String,
    #[schema(pattern = r"^[0-9a-f]{64}$")]
    pub package_sha256: Option<String>,
    #[schema(max_length = 200)]
    pub published_by_user_id: Option<String>,
    #[schema(max_length = 200)]
    pub api_key_id: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Map<String, Value>>,
}

impl Validate for FlashEnvironmentPublishBody {
    fn validate(&self, c: &mut Checks) {
        check_org_project(c, &self.org_id, &self.project_id);
        check_env_slug(c, "slug", &self.slug);
        c.str_len("name", &self.name, 1, 120);
        c.opt_str_len("hubRepo", self.hub_repo.as_deref(), 1, 512);
        c.opt_str_len("hubRef", self.hub_ref.as_deref(), 1, 512);
        c.str_len("hubPath", &self.hub_path, 1, 4096);
        if let Some(sha) = &self.package_sha256 {
            c.pattern("packageSha256", sha, &SHA256_RE);
        }
        c.opt_str_len("publishedByUserId", self.published_by_user_id.as_deref(), 0, 200);
        c.opt_str_len("apiKeyId", self.api_key_id.as_deref(), 0, 200);
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvironmentView {
    pub id: String,
    pub org_id: String,
    pub project_id: String,
    pub slug: String,
    pub name: String,
    pub hub_repo: String,
    pub hub_ref: String,
    pub hub_path: String,
    pub package_sha256: Option<String>,
    pub published_by_user_id: Option<String>,
    pub api_key_id: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    /// `pending` (waiting for its hub repository) or `provisioned`.
    pub hub_status: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<flash_environment::Model> for EnvironmentView {
    fn from(e: flash_environment::Model) -> Self {
        Self {
            metadata: e.metadata.as_deref().and_then(|m| serde_json::from_str(m).ok()),
            id: e.id,
            org_id: e.org_id,
            project_id: e.project_id,
            slug: e.slug,
            name: e.name,
            hub_repo: e.hub_repo,
            hub_ref: e.hub_ref,
            hub_path: e.hub_path,
            package_sha256: e.package_sha256,
            published_by_user_id: e.published_by_user_id,
            api_key_id: e.api_key_id,
            hub_status: e.hub_status,
            created_at: e.created_at,
            updated_at: e.updated_at,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EnvironmentPublished {
    /// Whether this call created the mirror row (false: it replaced it).
    pub created: bool,
    #[serde(flatten)]
    pub environment: EnvironmentView,
}

/// Publish an environment
///
/// Internal key: creates or updates the mirror of an environment by its slug
/// `<org>/<project>/<name>`; a new one waits for hub provisioning.
#[utoipa::path(post, path = "/api/flash/environments/internal", tag = "flash", security(("internalKey" = [])),
    request_body = FlashEnvironmentPublishBody,
    responses(
        (status = 200, body = EnvironmentPublished),
        (status = 404, description = "No such active project in the organization", body = ErrorBody),
        (status = 409, description = "The slug is another organization's environment", body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn publish_environment(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<FlashEnvironmentPublishBody>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    let project = active_project(&state, &body.org_id, &body.project_id).await?;
    let (env, created) =
        repo::publish_environment(&state.db, &project, &body, &state.settings.hub.default_repo).await?;
    Ok(HttpResponse::Ok().json(EnvironmentPublished {
        created,
        environment: env.into(),
    }))
}

/// Body of environment delete and validate.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlashEnvironmentRefBody {
    #[schema(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
    #[schema(value_type = String, format = Uuid)]
    pub project_id: ProjectId,
    #[schema(
        min_length = 3,
        max_length = 512,
        pattern = r"^[a-z0-9][a-z0-9._-]*/[a-z0-9][a-z0-9._-]*/[a-z0-9][a-z0-9._-]*$"
    )]
    pub slug: String,
}

impl Validate for FlashEnvironmentRefBody {
    fn validate(&self, c: &mut Checks) {
        check_org_project(c, &self.org_id, &self.project_id);
        check_env_slug(c, "slug", &self.slug);
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EnvironmentDeleted {
    /// False when there was no such mirror row (deleting twice is harmless).
    pub deleted: bool,
    pub slug: String,
}

/// Delete an environment's mirror
///
/// Internal key: drops the mirror row after the control plane removed the environment from hub
/// storage; never calls the control plane back.
#[utoipa::path(delete, path = "/api/flash/environments/internal", tag = "flash", security(("internalKey" = [])),
    request_body = FlashEnvironmentRefBody,
    responses((status = 200, body = EnvironmentDeleted), (status = 422, body = ValidationErrorBody)))]
pub async fn delete_environment(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<FlashEnvironmentRefBody>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    let deleted = repo::delete_environment(&state.db, &body.org_id, &body.project_id, &body.slug).await?;
    Ok(HttpResponse::Ok().json(EnvironmentDeleted {
        deleted,
        slug: body.slug,
    }))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Valid {
    pub valid: bool,
}

/// Check an environment belongs to a project
///
/// Internal key: `{valid: true}` when the slug is that project's environment; 404 otherwise.
/// Changes nothing.
#[utoipa::path(post, path = "/api/flash/environments/validate/internal", tag = "flash",
    security(("internalKey" = [])),
    request_body = FlashEnvironmentRefBody,
    responses(
        (status = 200, body = Valid),
        (status = 404, description = "The slug is not an environment of that project", body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn validate_environment(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<FlashEnvironmentRefBody>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    let org_id = body.org_id.clone();
    match repo::find_environment(&state.db, &body.slug).await? {
        Some(env) if env.org_id == org_id && env.project_id == body.project_id => {
            Ok(HttpResponse::Ok().json(Valid { valid: true }))
        }
        _ => Err(ApiError::NotFound("environment not found in this project".into())),
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlashEnvironmentUseBody {
    #[schema(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
    #[schema(value_type = String, format = Uuid)]
    pub project_id: ProjectId,
    #[schema(
        min_length = 3,
        max_length = 512,
        pattern = r"^[a-z0-9][a-z0-9._-]*/[a-z0-9][a-z0-9._-]*/[a-z0-9][a-z0-9._-]*$"
    )]
    pub slug: String,
    #[schema(min_length = 1, max_length = 128)]
    pub run_id: Option<String>,
}

impl Validate for FlashEnvironmentUseBody {
    fn validate(&self, c: &mut Checks) {
        check_org_project(c, &self.org_id, &self.project_id);
        check_env_slug(c, "slug", &self.slug);
        c.opt_str_len("runId", self.run_id.as_deref(), 1, 128);
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Recorded {
    pub recorded: bool,
}

/// Record an environment's use
///
/// Internal key: records that a run referenced the environment slug.
#[utoipa::path(post, path = "/api/flash/environments/use/internal", tag = "flash", security(("internalKey" = [])),
    request_body = FlashEnvironmentUseBody,
    responses(
        (status = 200, body = Recorded),
        (status = 404, description = "No such active project in the organization", body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn use_environment(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<FlashEnvironmentUseBody>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    let project = active_project(&state, &body.org_id, &body.project_id).await?;
    repo::record_use(&state.db, &project, &body.slug, body.run_id.as_deref()).await?;
    Ok(HttpResponse::Ok().json(Recorded { recorded: true }))
}

/// Reads a body twice: typed (types and bounds, 422 on failure) and as the object it is,
/// so an upsert can tell an absent field (keep) from a `null` one (clear).
fn typed_and_raw<T: DeserializeOwned + Validate + ToSchema>(
    bytes: &[u8],
) -> ApiResult<(T, Map<String, Value>)> {
    let typed: T = parse_checked_body(bytes)?;
    let raw: Map<String, Value> = parse_json_body(bytes)?;
    Ok((typed, raw))
}

/// The optional fields of a run upsert, kept as they were sent.
const RUN_FIELDS: &[&str] = &[
    "userId",
    "apiKeyId",
    "environmentSlug",
    "model",
    "algorithm",
    "phase",
    "gpuType",
    "adapterRef",
    "artifactsDir",
    "error",
    "costUsd",
    "realizedCostUsd",
    "spec",
    "deployment",
    "lastHeartbeat",
    "gpuStatus",
    "metadata",
    "createdAt",
    "updatedAt",
];

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlashRunUpsertBody {
    #[schema(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
    #[schema(value_type = String, format = Uuid)]
    pub project_id: ProjectId,
    #[schema(min_length = 1, max_length = 128)]
    pub run_id: String,
    #[schema(min_length = 1, max_length = 64)]
    pub status: String,
    pub user_id: Option<String>,
    pub api_key_id: Option<String>,
    pub environment_slug: Option<String>,
    pub model: Option<String>,
    pub algorithm: Option<String>,
    pub phase: Option<String>,
    pub gpu_type: Option<String>,
    pub adapter_ref: Option<String>,
    pub artifacts_dir: Option<String>,
    pub error: Option<String>,
    pub cost_usd: Option<f64>,
    pub realized_cost_usd: Option<f64>,
    #[schema(value_type = Option<Object>)]
    pub spec: Option<Map<String, Value>>,
    #[schema(value_type = Option<Object>)]
    pub deployment: Option<Map<String, Value>>,
    #[schema(value_type = Option<Object>)]
    pub last_heartbeat: Option<Map<String, Value>>,
    #[schema(value_type = Option<Object>)]
    pub gpu_status: Option<Map<String, Value>>,
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Map<String, Value>>,
    pub created_at: Option<String>,
    /// When the control plane changed the run; an upsert older than the stored one is ignored.
    pub updated_at: Option<String>,
}

impl Validate for FlashRunUpsertBody {
    fn validate(&self, c: &mut Checks) {
        check_org_project(c, &self.org_id, &self.project_id);
        c.str_len("runId", &self.run_id, 1, 128);
        c.str_len("status", &self.status, 1, 64);
        c.opt_str_len("updatedAt", self.updated_at.as_deref(), 0, 64);
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MirrorUpserted {
    pub org_id: String,
    pub project_id: String,
    pub run_id: String,
    /// The run's status (run upserts) after this call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint_id: Option<String>,
    /// `created`, `updated`, or `stale` (older than what is stored; nothing changed).
    pub result: String,
}

/// Mirror a managed run
///
/// Internal key: stores the latest status and fields of a managed (flash) run; an update older
/// than the stored one is ignored (`stale`). A run of another project is 409.
#[utoipa::path(post, path = "/api/flash/runs/internal", tag = "flash", security(("internalKey" = [])),
    request_body = FlashRunUpsertBody,
    responses(
        (status = 200, body = MirrorUpserted),
        (status = 404, description = "No such active project in the organization", body = ErrorBody),
        (status = 409, description = "The run belongs to another project", body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn upsert_run(_: Internal, state: web::Data<AppState>, body: RawBody) -> ApiResult<HttpResponse> {
    let (body, raw) = typed_and_raw::<FlashRunUpsertBody>(&body.0)?;
    let project = active_project(&state, &body.org_id, &body.project_id).await?;
    let patch = pick(raw, RUN_FIELDS);
    let (status, result) = repo::upsert_run(&state.db, &project, &body.run_id, &body.status, patch).await?;
    Ok(HttpResponse::Ok().json(MirrorUpserted {
        org_id: project.org_id,
        project_id: project.id,
        run_id: body.run_id,
        status: Some(status),
        checkpoint_id: None,
        result: result.as_str().to_owned(),
    }))
}

const CHECKPOINT_FIELDS: &[&str] = &[
    "seed",
    "phase",
    "adapterRef",
    "artifactPath",
    "createdAt",
    "updatedAt",
    "metrics",
    "metadata",
];

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlashCheckpointUpsertBody {
    #[schema(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
    #[schema(value_type = String, format = Uuid)]
    pub project_id: ProjectId,
    #[schema(min_length = 1, max_length = 128)]
    pub run_id: String,
    #[schema(min_length = 1, max_length = 256)]
    pub checkpoint_id: String,
    pub seed: Option<i64>,
    pub phase: Option<String>,
    pub adapter_ref: Option<String>,
    pub artifact_path: Option<String>,
    pub created_at: Option<String>,
    pub updated_at: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub metrics: Option<Map<String, Value>>,
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Map<String, Value>>,
}

impl Validate for FlashCheckpointUpsertBody {
    fn validate(&self, c: &mut Checks) {
        check_org_project(c, &self.org_id, &self.project_id);
        c.str_len("runId", &self.run_id, 1, 128);
        c.str_len("checkpointId", &self.checkpoint_id, 1, 256);
        c.opt_str_len("updatedAt", self.updated_at.as_deref(), 0, 64);
    }
}

/// Mirror a run's checkpoint
///
/// Internal key: stores a checkpoint or artifact snapshot of a managed run.
#[utoipa::path(post, path = "/api/flash/runs/checkpoints/internal", tag = "flash", security(("internalKey" = [])),
    request_body = FlashCheckpointUpsertBody,
    responses(
        (status = 200, body = MirrorUpserted),
        (status = 404, description = "No such active project in the organization", body = ErrorBody),
        (status = 409, description = "The checkpoint belongs to another project", body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn upsert_checkpoint(
    _: Internal,
    state: web::Data<AppState>,
    body: RawBody,
) -> ApiResult<HttpResponse> {
    let (body, raw) = typed_and_raw::<FlashCheckpointUpsertBody>(&body.0)?;
    let project = active_project(&state, &body.org_id, &body.project_id).await?;
    let patch = pick(raw, CHECKPOINT_FIELDS);
    let result =
        repo::upsert_checkpoint(&state.db, &project, &body.run_id, &body.checkpoint_id, patch).await?;
    Ok(HttpResponse::Ok().json(MirrorUpserted {
        org_id: project.org_id,
        project_id: project.id,
        run_id: body.run_id,
        status: None,
        checkpoint_id: Some(body.checkpoint_id),
        result: result.as_str().to_owned(),
    }))
}

/// The named fields of a body, as sent (including `null`s).
fn pick(mut raw: Map<String, Value>, fields: &[&str]) -> Map<String, Value> {
    raw.retain(|k, _| fields.contains(&k.as_str()));
    raw
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlashProductEventBody {
    #[schema(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
    /// On the allowlist (`flash.event_allowlist`).
    #[schema(min_length = 1, max_length = 64)]
    pub event: String,
    #[schema(max_length = 200)]
    pub user_id: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub properties: Option<Map<String, Value>>,
}

impl Validate for FlashProductEventBody {
    fn validate(&self, c: &mut Checks) {
        c.str_len("orgId", &self.org_id, 1, ORG_ID_MAX);
        c.str_len("event", &self.event, 1, 64);
        c.opt_str_len("userId", self.user_id.as_deref(), 0, 200);
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Accepted {
    pub accepted: bool,
}

/// Record a product event
///
/// Internal key: stores a product-analytics event whose name is on the allowlist; any other
/// name is 422.
#[utoipa::path(post, path = "/api/flash/events/internal", tag = "flash", security(("internalKey" = [])),
    request_body = FlashProductEventBody,
    responses(
        (status = 200, body = Accepted),
        (status = 404, description = "Unknown organization", body = ErrorBody),
        (status = 422, description = "Invalid body or an event outside the allowlist", body = ValidationErrorBody),
    ))]
pub async fn record_event(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<FlashProductEventBody>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    let allowlist = &state.settings.flash.event_allowlist;
    if !allowlist.iter().any(|e| e == &body.event) {
        let allowed: Vec<&str> = allowlist.iter().map(String::as_str).collect();
        let mut checks = Checks::new("body");
        checks.one_of("event", &body.event, &allowed);
        return Err(ApiError::Validation(checks.into_issues()));
    }
    let org_id = body.org_id.clone();
    if !crate::orgs::repo::org_exists(&state.db, &org_id).await? {
        return Err(ApiError::not_found("organization"));
    }
    let properties = body.properties.map(|p| json!(p).to_string());
    repo::record_event(
        &state.db,
        &org_id,
        &body.event,
        body.user_id.as_deref(),
        properties,
    )
    .await?;
    Ok(HttpResponse::Ok().json(Accepted { accepted: true }))
}
