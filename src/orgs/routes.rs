//! Organization routes: the operator's (internal key: organizations, members, any API key,
//! adapters) and the self-service API keys of an organization's members.

use actix_web::{web, HttpResponse};
use keel_core::orgs::service;

use super::dto::*;
use crate::auth::Internal;
use crate::error::{ApiResult, ErrorBody, ValidationErrorBody};
use crate::http::extract::{path_id, path_org, path_str, ValidJson};
use crate::state::AppState;
use keel_core::domain::{ApiKeyId, UserId};

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
    let created = service::create_org(
        &state.db,
        &body.name,
        body.slug.as_deref(),
        &body.owner_user_id,
        body.owner_email.as_deref(),
    )
    .await?;
    Ok(HttpResponse::Created().json(CreatedOrgResponse {
        org_id: created.org_id.into(),
        slug: created.slug,
    }))
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
    service::delete_org(&state.db, &state.cluster, &org_id).await?;
    Ok(HttpResponse::Ok().json(Deleted { deleted: true }))
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
    let user_id = path_id("user_id", &user_id, UserId::parse)?;
    let body = body.0;
    service::set_member(
        &state.db,
        &state.cluster,
        &org_id,
        &user_id,
        body.email.as_deref(),
        body.role,
    )
    .await?;
    Ok(HttpResponse::Ok().json(OkResponse { ok: true }))
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
    let created = keel_core::keys::service::create(
        &state.db,
        &org_id,
        body.0.name.as_deref(),
        &keel_core::keys::KeySettings::default(),
        chrono::Utc::now(),
    )
    .await?;
    Ok(HttpResponse::Created().json(CreatedKeyResponse {
        api_key_id: created.api_key_id.into(),
        key: created.secret,
    }))
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
    // Not an id keel gave out: no such key.
    let key_id = ApiKeyId::parse(&path).map_err(|_| keel_core::keys::KeyError::NotFound)?;
    keel_core::keys::service::revoke_any(&state.db, &state.cluster, &key_id).await?;
    Ok(HttpResponse::Ok().json(Revoked { revoked: true }))
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
    let adapter = service::put_adapter(
        &state.db,
        &state.cluster,
        &adapter_id,
        &org_id,
        &body.base_model,
        body.live,
    )
    .await?;
    Ok(HttpResponse::Ok().json(AdapterView {
        adapter_id: adapter.id,
        org_id: adapter.org_id.into(),
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
    service::delete_adapter(&state.db, &state.cluster, &path).await?;
    Ok(HttpResponse::Ok().json(Deleted { deleted: true }))
}
