//! Operator routes (internal key): organizations, members, API keys, adapters.

pub mod adapters;
pub mod api_keys;
pub mod repo;
pub mod service;

use std::sync::LazyLock;

use actix_web::{web, HttpResponse};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::auth::{Internal, Role};
use crate::cluster::Event;
use crate::domain::OrgId;
use crate::error::{ApiError, ApiResult, ErrorBody, ValidationErrorBody};
use crate::http::extract::{path_org, path_str, ValidJson};
use crate::http::validate::{Checks, Validate};
use crate::state::AppState;

/// Organization and project slugs: the parts of `<org-slug>/<project-slug>/<name>`.
pub static SLUG_RE: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new(r"^[a-z0-9][a-z0-9._-]*$").unwrap_or_else(|_| unreachable!()));

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateOrgBody {
    /// Not only whitespace.
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\u0000]*[^\\u0000\\t-\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000][^\\u0000]*$"
    )]
    pub name: String,
    /// Derived from the name when absent.
    #[schema(min_length = 1, max_length = 100, pattern = r"^[a-z0-9][a-z0-9._-]*$")]
    pub slug: Option<String>,
    #[schema(min_length = 1, max_length = 200)]
    pub owner_user_id: String,
    #[schema(min_length = 1, max_length = 320)]
    pub owner_email: Option<String>,
}

impl Validate for CreateOrgBody {
    fn validate(&self, c: &mut Checks) {
        c.display_name("name", &self.name, 200);
        if let Some(slug) = &self.slug {
            c.str_len("slug", slug, 1, 100);
            c.pattern("slug", slug, &SLUG_RE);
        }
        c.str_len("ownerUserId", &self.owner_user_id, 1, 200);
        c.opt_str_len("ownerEmail", self.owner_email.as_deref(), 1, 320);
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreatedOrgResponse {
    pub org_id: String,
    pub slug: String,
}

/// Create an organization
///
/// Internal key (operators): creates an organization with its owner. The slug is derived from
/// the name unless given.
#[utoipa::path(post, path = "/api/internal/orgs", tag = "operator", security(("internalKey" = [])),
    request_body = CreateOrgBody,
    responses(
        (status = 201, body = CreatedOrgResponse),
        (status = 409, description = "Slug taken", body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn create_org(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<CreateOrgBody>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    let created = repo::create_org(
        &state.db,
        &body.name,
        body.slug.as_deref(),
        &body.owner_user_id,
        body.owner_email.as_deref(),
    )
    .await?;
    Ok(HttpResponse::Created().json(CreatedOrgResponse {
        org_id: created.org_id,
        slug: created.slug,
    }))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Deleted {
    pub deleted: bool,
}

/// Delete an organization
///
/// Internal key: deletes the organization and everything of it.
#[utoipa::path(delete, path = "/api/internal/orgs/{org_id}", tag = "operator", security(("internalKey" = [])),
    params(("org_id" = String, Path, format = Uuid)),
    responses((status = 200, body = Deleted), (status = 404, body = ErrorBody)))]
pub async fn delete_org(
    _: Internal,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> ApiResult<HttpResponse> {
    let org_id = path_org("org_id", &path)?;
    if !repo::delete_org(&state.db, &org_id).await? {
        return Err(ApiError::not_found("organization"));
    }
    state.cluster.publish(Event::OrgChanged(org_id.to_string())).await;
    Ok(HttpResponse::Ok().json(Deleted { deleted: true }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MemberBody {
    pub role: Role,
    #[schema(min_length = 1, max_length = 320)]
    pub email: Option<String>,
}

impl Validate for MemberBody {
    fn validate(&self, c: &mut Checks) {
        c.opt_str_len("email", self.email.as_deref(), 1, 320);
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct OkResponse {
    pub ok: bool,
}

/// Set a member's role
///
/// Internal key: adds the user to the organization or changes their role (`owner` or `member`).
#[utoipa::path(put, path = "/api/internal/orgs/{org_id}/members/{user_id}", tag = "operator",
    security(("internalKey" = [])),
    params(("org_id" = String, Path, format = Uuid), ("user_id" = String, Path, min_length = 1, max_length = 200)),
    request_body = MemberBody,
    responses((status = 200, body = OkResponse), (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
pub async fn put_member(
    _: Internal,
    state: web::Data<AppState>,
    path: web::Path<(String, String)>,
    body: ValidJson<MemberBody>,
) -> ApiResult<HttpResponse> {
    let (org_id, user_id) = path.into_inner();
    let org_id = path_org("org_id", &org_id)?;
    let user_id = path_str("user_id", &user_id, 1, 200)?;
    if !repo::org_exists(&state.db, &org_id).await? {
        return Err(ApiError::not_found("organization"));
    }
    repo::upsert_user(&state.db, &user_id, body.0.email.as_deref()).await?;
    repo::set_role(&state.db, &org_id, &user_id, body.0.role).await?;
    state.cluster.publish(Event::OrgChanged(org_id.to_string())).await;
    Ok(HttpResponse::Ok().json(OkResponse { ok: true }))
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyBody {
    #[schema(min_length = 1, max_length = 200)]
    pub name: Option<String>,
}

impl Validate for ApiKeyBody {
    fn validate(&self, c: &mut Checks) {
        c.opt_str_len("name", self.name.as_deref(), 1, 200);
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreatedKeyResponse {
    pub api_key_id: String,
    /// The secret, shown this once; only its hash is stored.
    pub key: String,
}

/// Create an API key for an organization
///
/// Internal key: creates an API key for the organization; the key is shown once.
#[utoipa::path(post, path = "/api/internal/orgs/{org_id}/api-keys", tag = "operator", security(("internalKey" = [])),
    params(("org_id" = String, Path, format = Uuid)),
    request_body(content = Option<ApiKeyBody>, description = "Optional; an empty body is allowed"),
    responses((status = 201, body = CreatedKeyResponse), (status = 404, body = ErrorBody)))]
pub async fn create_api_key(
    _: Internal,
    state: web::Data<AppState>,
    path: web::Path<String>,
    body: ValidJson<ApiKeyBody>,
) -> ApiResult<HttpResponse> {
    let org_id = path_org("org_id", &path)?;
    if !repo::org_exists(&state.db, &org_id).await? {
        return Err(ApiError::not_found("organization"));
    }
    let created = repo::create_api_key(&state.db, &org_id, body.0.name.as_deref()).await?;
    Ok(HttpResponse::Created().json(CreatedKeyResponse {
        api_key_id: created.api_key_id,
        key: created.secret,
    }))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Revoked {
    pub revoked: bool,
}

/// Revoke any API key
///
/// Internal key: revokes an API key of any organization.
#[utoipa::path(delete, path = "/api/internal/api-keys/{api_key_id}", tag = "operator", security(("internalKey" = [])),
    params(("api_key_id" = String, Path)),
    responses((status = 200, body = Revoked), (status = 404, body = ErrorBody)))]
pub async fn revoke_api_key(
    _: Internal,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> ApiResult<HttpResponse> {
    if !repo::revoke_api_key(&state.db, &path).await? {
        return Err(ApiError::not_found("API key"));
    }
    state.cluster.publish(Event::KeyRevoked(path.to_string())).await;
    Ok(HttpResponse::Ok().json(Revoked { revoked: true }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AdapterBody {
    #[schema(value_type = String, format = Uuid)]
    pub org_id: OrgId,
    #[schema(min_length = 1, max_length = 512)]
    pub base_model: String,
    /// Kept as stored when absent (false for a new adapter).
    pub live: Option<bool>,
}

impl Validate for AdapterBody {
    fn validate(&self, c: &mut Checks) {
        c.uuid("orgId", &self.org_id);
        c.str_len("baseModel", &self.base_model, 1, 512);
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdapterView {
    pub adapter_id: String,
    pub org_id: String,
    pub base_model: String,
    pub live: bool,
}

/// Register an adapter
///
/// Internal key: records which organization owns a served adapter, its base model and whether
/// it is live.
#[utoipa::path(put, path = "/api/internal/adapters/{adapter_id}", tag = "operator", security(("internalKey" = [])),
    params(("adapter_id" = String, Path, min_length = 1, max_length = 512)),
    request_body = AdapterBody,
    responses((status = 200, body = AdapterView), (status = 404, description = "Unknown organization", body = ErrorBody),
        (status = 422, body = ValidationErrorBody)))]
pub async fn put_adapter(
    _: Internal,
    state: web::Data<AppState>,
    path: web::Path<String>,
    body: ValidJson<AdapterBody>,
) -> ApiResult<HttpResponse> {
    let adapter_id = path_str("adapter_id", &path, 1, 512)?;
    let body = body.0;
    let org_id = body.org_id;
    if !repo::org_exists(&state.db, &org_id).await? {
        return Err(ApiError::not_found("organization"));
    }
    let adapter = repo::upsert_adapter(&state.db, &adapter_id, &org_id, &body.base_model, body.live).await?;
    state
        .cluster
        .publish(Event::AdapterChanged(adapter_id.clone()))
        .await;
    Ok(HttpResponse::Ok().json(AdapterView {
        adapter_id: adapter.id,
        org_id: adapter.org_id,
        base_model: adapter.base_model,
        live: adapter.live,
    }))
}

/// Remove an adapter
///
/// Internal key: forgets a served adapter; serving authorization for it ends.
#[utoipa::path(delete, path = "/api/internal/adapters/{adapter_id}", tag = "operator", security(("internalKey" = [])),
    params(("adapter_id" = String, Path)),
    responses((status = 200, body = Deleted), (status = 404, body = ErrorBody)))]
pub async fn delete_adapter(
    _: Internal,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> ApiResult<HttpResponse> {
    if !repo::delete_adapter(&state.db, &path).await? {
        return Err(ApiError::not_found("adapter"));
    }
    state
        .cluster
        .publish(Event::AdapterChanged(path.to_string()))
        .await;
    Ok(HttpResponse::Ok().json(Deleted { deleted: true }))
}
