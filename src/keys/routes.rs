//! An organization's API keys, for its members: list (any member), create, change and revoke
//! (an owner's session).

use actix_web::{web, HttpResponse};
use chrono::Utc;
use keel_core::keys::service;

use super::dto::{ApiKeyList, ApiKeyView, CreateKeyBody, PatchKeyBody};
use crate::auth::{MemberOf, Owner, OwnerOf};
use crate::error::{ApiResult, ErrorBody, ValidationErrorBody};
use crate::http::extract::ValidJson;
use crate::orgs::dto::{CreatedKeyResponse, Revoked};
use crate::state::AppState;
use keel_core::domain::ApiKeyId;

fn key_id(path: &str) -> Result<ApiKeyId, keel_core::keys::KeyError> {
    ApiKeyId::parse(path).map_err(|_| keel_core::keys::KeyError::NotFound)
}

/// List API keys
///
/// The organization's API keys (never their secrets): id, name, prefix, creation and revocation
/// times, settings (limits, scopes, models, expiry), last use and what each used today (UTC).
#[utoipa::path(get, path = "/api/api-keys", tag = "api-keys", security(("apiKey" = []), ("session" = [])),
    params(("orgId" = Option<String>, Query)),
    responses((status = 200, body = ApiKeyList), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn list_keys(member: MemberOf, state: web::Data<AppState>) -> ApiResult<HttpResponse> {
    let keys = service::list(&state.db, &member.0.org_id, Utc::now())
        .await?
        .into_iter()
        .map(ApiKeyView::from)
        .collect();
    Ok(HttpResponse::Ok().json(ApiKeyList { keys }))
}

/// Create an API key
///
/// Owner's session: creates an API key for the organization, with optional limits, scopes,
/// models and expiry (none: it can do everything its organization can). The key is shown once,
/// in this answer; keel keeps only its hash. An `expiresAt` in the past is 422.
#[utoipa::path(post, path = "/api/api-keys", tag = "api-keys", security(("session" = [])),
    params(("orgId" = Option<String>, Query)),
    request_body(content = Option<CreateKeyBody>, description = "Optional; an empty body is allowed"),
    responses((status = 201, body = CreatedKeyResponse), (status = 403, description = "Not an owner's session", body = ErrorBody),
        (status = 422, body = ValidationErrorBody)))]
pub async fn create_key(owner: Owner<ValidJson<CreateKeyBody>>) -> ApiResult<HttpResponse> {
    let body = &owner.input.0;
    let created = service::create(
        &owner.state.db,
        &owner.access.org_id,
        body.name.as_deref(),
        &body.settings(),
        Utc::now(),
    )
    .await?;
    Ok(HttpResponse::Created().json(CreatedKeyResponse {
        api_key_id: created.api_key_id.into(),
        key: created.secret,
    }))
}

/// Change an API key
///
/// Owner's session: changes a key's name, limits, scopes, models or expiry; only the fields
/// given change, `null` clears one. Every instance applies it at once. A revoked key, or another
/// organization's, is 404; an `expiresAt` in the past is 422.
#[utoipa::path(patch, path = "/api/api-keys/{api_key_id}", tag = "api-keys", security(("session" = [])),
    params(("api_key_id" = String, Path), ("orgId" = Option<String>, Query)),
    request_body = PatchKeyBody,
    responses((status = 200, body = ApiKeyView), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 422, body = ValidationErrorBody)))]
pub async fn patch_key(
    owner: Owner<ValidJson<PatchKeyBody>>,
    path: web::Path<String>,
) -> ApiResult<HttpResponse> {
    let key = service::update(
        &owner.state.db,
        &owner.state.cluster,
        &owner.access.org_id,
        &key_id(&path)?,
        &owner.input.0.change(),
        Utc::now(),
    )
    .await?;
    Ok(HttpResponse::Ok().json(ApiKeyView::from(key)))
}

/// Revoke an API key
///
/// Owner's session: revokes one of the organization's keys; it stops working at once. Another
/// organization's key is 404.
#[utoipa::path(delete, path = "/api/api-keys/{api_key_id}", tag = "api-keys", security(("session" = [])),
    params(("api_key_id" = String, Path), ("orgId" = Option<String>, Query)),
    responses((status = 200, body = Revoked), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn revoke_key(
    owner: OwnerOf,
    state: web::Data<AppState>,
    path: web::Path<String>,
) -> ApiResult<HttpResponse> {
    service::revoke(&state.db, &state.cluster, &owner.0.org_id, &key_id(&path)?).await?;
    Ok(HttpResponse::Ok().json(Revoked { revoked: true }))
}
