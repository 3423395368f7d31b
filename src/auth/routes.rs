//! `GET /api/auth/verify`.

use std::collections::BTreeMap;

use actix_web::HttpResponse;
use serde::Serialize;

use super::{AnyPrincipal, Principal, Role, UserPrincipal};
use crate::error::{ApiResult, ErrorBody};

#[derive(utoipa::OpenApi)]
#[openapi(paths(verify))]
pub struct Doc;

/// What a credential is worth. `orgs` maps each organization to the role held there.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct VerifyResponse {
    pub valid: bool,
    /// `api_key`, `session` or `internal`.
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub org_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub api_key_id: Option<String>,
    #[schema(value_type = BTreeMap<String, crate::schemas::Role>)]
    pub orgs: BTreeMap<String, Role>,
}

/// Check a credential
///
/// Answers which kind of credential the bearer token is (`internal`, `api_key` or `session`)
/// and the organizations and roles it reaches. Without a valid credential it is 401.
#[utoipa::path(
    get,
    path = "/api/auth/verify",
    tag = "auth",
    security(("internalKey" = []), ("apiKey" = []), ("session" = [])),
    responses(
        (status = 200, description = "The credential is valid", body = VerifyResponse),
        (status = 401, description = "Missing, unknown, revoked or expired credential", body = ErrorBody),
    )
)]
pub async fn verify(caller: AnyPrincipal) -> ApiResult<HttpResponse> {
    let response = match caller.principal {
        Principal::Internal => VerifyResponse {
            valid: true,
            kind: "internal",
            org_id: None,
            user_id: None,
            api_key_id: None,
            orgs: BTreeMap::new(),
        },
        Principal::User(UserPrincipal::ApiKey { key_id, org_id }) => VerifyResponse {
            valid: true,
            kind: "api_key",
            orgs: BTreeMap::from([(org_id.to_string(), Role::Member)]),
            org_id: Some(org_id.into_string()),
            user_id: None,
            api_key_id: Some(key_id.into_string()),
        },
        // Refused before it gets here (403 scope_not_allowed).
        Principal::OutOfScope => {
            return Err(crate::error::ApiError::Coded(
                crate::error::Code::ScopeNotAllowed,
                "this API key's scopes do not include api".into(),
            ))
        }
        Principal::User(UserPrincipal::Session { user_id }) => {
            let orgs: BTreeMap<String, Role> =
                keel_core::auth::service::memberships_of(&caller.state.db, &user_id)
                    .await?
                    .into_iter()
                    .map(|(org, role)| (org.into_string(), role))
                    .collect();
            VerifyResponse {
                valid: true,
                kind: "session",
                // A session acting in exactly one organization names it.
                org_id: (orgs.len() == 1).then(|| orgs.keys().next().cloned()).flatten(),
                user_id: Some(user_id.into_string()),
                api_key_id: None,
                orgs,
            }
        }
    };
    Ok(HttpResponse::Ok().json(response))
}
