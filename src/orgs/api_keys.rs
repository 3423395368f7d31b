//! Self-service API keys: members list their organization's keys (never the secrets);
//! owners create and revoke them with their session.

use actix_web::{web, HttpResponse};
use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

use super::{repo, ApiKeyBody, CreatedKeyResponse, Revoked};
use crate::auth::{MemberOf, Owner, OwnerOf};
use crate::error::{ApiResult, ErrorBody, ValidationErrorBody};
use crate::http::extract::ValidJson;
use crate::state::AppState;

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApiKeyView {
    pub api_key_id: String,
    pub org_id: String,
    pub name: Option<String>,
    /// The first characters of the key, for recognizing it.
    pub prefix: String,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ApiKeyList {
    pub keys: Vec<ApiKeyView>,
}

/// List API keys
///
/// The organization's API keys (never their secrets): id, name, prefix, creation and revocation
/// times.
#[utoipa::path(get, path = "/api/api-keys", tag = "api-keys", security(("apiKey" = []), ("session" = [])),
    params(("orgId" = Option<String>, Query)),
    responses((status = 200, body = ApiKeyList), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn list_keys(member: MemberOf, state: web::Data<AppState>) -> ApiResult<HttpResponse> {
    let keys = repo::api_keys_of(&state.db, &member.0.org_id)
        .await?
        .into_iter()
        .map(|k| ApiKeyView {
            api_key_id: k.id,
            org_id: k.org_id,
            name: k.name,
            prefix: k.prefix,
            created_at: k.created_at,
            revoked_at: k.revoked_at,
        })
        .collect();
    Ok(HttpResponse::Ok().json(ApiKeyList { keys }))
}

crate::org_scoped!(unnamed: ApiKeyBody);

/// Create an API key
///
/// Owner's session: creates an API key for the organization. The key is shown once, in this
/// answer; keel keeps only its hash.
#[utoipa::path(post, path = "/api/api-keys", tag = "api-keys", security(("session" = [])),
    params(("orgId" = Option<String>, Query)),
    request_body(content = Option<ApiKeyBody>, description = "Optional; an empty body is allowed"),
    responses((status = 201, body = CreatedKeyResponse), (status = 403, description = "Not an owner's session", body = ErrorBody),
        (status = 422, body = ValidationErrorBody)))]
pub async fn create_key(owner: Owner<ValidJson<ApiKeyBody>>) -> ApiResult<HttpResponse> {
    let name = owner.input.0.name.as_deref();
    let created = repo::create_api_key(&owner.state.db, &owner.access.org_id, name).await?;
    Ok(HttpResponse::Created().json(CreatedKeyResponse {
        api_key_id: created.api_key_id,
        key: created.secret,
    }))
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
    super::service::revoke_key(&state, &owner.0.org_id, &path).await?;
    Ok(HttpResponse::Ok().json(Revoked { revoked: true }))
}
