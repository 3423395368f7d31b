//! Who is calling. Every credential is `Authorization: Bearer <token>`; the token's kind
//! decides the principal: an operator internal key, a user API key, or a session JWT.
//!
//! Extractors say in a handler's signature who may call it:
//! [`Internal`] (machine-to-machine), [`Caller`] (a user's API key or session, then
//! [`Caller::member`] / [`Caller::owner`] for an organization), [`MemberOf`] and
//! [`OwnerOf`] (organization from the query or `X-Org-Id`), [`ApiKeyCaller`] and
//! [`AnyPrincipal`].

pub mod routes;

use actix_web::body::MessageBody;
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::http::header;
use actix_web::middleware::Next;
use actix_web::{web, FromRequest, HttpMessage, HttpRequest};
use futures_util::future::LocalBoxFuture;
use serde_json::json;

use crate::error::{ApiError, ApiResult, Code};
use crate::http::extract::{check_supplied_orgs, id_issue, ApiKeyOrg};
use crate::http::extract::{ValidJson, ValidQuery};
use crate::state::AppState;
use keel_core::domain::{ApiKeyId, OrgId, UserId};

pub use keel_core::auth::Role;
use keel_core::auth::{keys, session};

/// A verified user credential.
#[derive(Debug, Clone)]
pub enum UserPrincipal {
    ApiKey { key_id: ApiKeyId, org_id: OrgId },
    Session { user_id: UserId },
}

/// Any verified credential.
#[derive(Debug, Clone)]
pub enum Principal {
    Internal,
    User(UserPrincipal),
    /// A valid API key whose scopes do not hold `api`: every route that needs a principal
    /// refuses it (403 `scope_not_allowed`).
    OutOfScope,
}

/// The organization a user call acts in, and with what right.
#[derive(Debug, Clone)]
pub struct OrgAccess {
    pub org_id: OrgId,
    pub role: Role,
    /// The session's user; `None` for an API key.
    pub user_id: Option<UserId>,
}

fn bearer(req: &HttpRequest) -> Option<&str> {
    let value = req.headers().get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

fn state_of(req: &HttpRequest) -> ApiResult<web::Data<AppState>> {
    req.app_data::<web::Data<AppState>>()
        .cloned()
        .ok_or_else(|| ApiError::Unexpected(anyhow::anyhow!("application state is missing")))
}

fn unauthenticated() -> ApiError {
    ApiError::Unauthorized("missing or invalid credentials".into())
}

/// Resolves a bearer token to a principal; `Ok(None)` when it is unknown.
pub async fn resolve(state: &AppState, token: &str) -> ApiResult<Option<Principal>> {
    if state.internal_keys.matches(token) {
        return Ok(Some(Principal::Internal));
    }
    if keys::looks_like_api_key(token) {
        let hash = keys::hash_api_key(token);
        return Ok(keel_core::auth::service::api_key_by_hash(&state.db, &hash)
            .await?
            .map(|key| {
                if !keel_core::keys::KeySettings::of(&key).scopes.api {
                    return Principal::OutOfScope;
                }
                Principal::User(UserPrincipal::ApiKey {
                    key_id: key.id,
                    org_id: key.org_id,
                })
            }));
    }
    if session::looks_like_jwt(token) {
        let Some(keys) = &state.session_keys else {
            return Ok(None);
        };
        if let Some(user_id) = keys.verify(token) {
            if keel_core::auth::service::user_exists(&state.db, &user_id).await? {
                return Ok(Some(Principal::User(UserPrincipal::Session { user_id })));
            }
        }
    }
    Ok(None)
}

/// A request's credential as [`authenticate`] resolved it; `None` when unknown.
#[derive(Clone)]
struct Resolved(Option<Principal>);

/// Middleware: resolves the bearer credential before any extractor runs, so every
/// extractor that decides who may call answers at once, before a body or query is read: a
/// caller without the right gets its 401 or 403, never a 422 that shows the route's schema.
/// The proxy (`/v1`) authenticates on its own hot path and is left alone.
pub async fn authenticate(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    if !req.path().starts_with("/v1/") {
        if let Some(token) = bearer(req.request()).map(str::to_owned) {
            let state = state_of(req.request())?;
            let principal = resolve(&state, &token).await?;
            if let Some(Principal::User(UserPrincipal::ApiKey { key_id, org_id })) = &principal {
                req.extensions_mut().insert(ApiKeyOrg(org_id.clone()));
                crate::telemetry::note_api_key(req.request(), key_id.as_str(), org_id.as_str());
            }
            req.extensions_mut().insert(Resolved(principal));
        }
    }
    next.call(req).await
}

async fn principal_of(req: &HttpRequest) -> ApiResult<(web::Data<AppState>, Principal)> {
    let state = state_of(req)?;
    let resolved = req.extensions().get::<Resolved>().cloned();
    let principal = match resolved {
        Some(Resolved(principal)) => principal,
        None => {
            let token = bearer(req).ok_or_else(unauthenticated)?;
            resolve(&state, token).await?
        }
    }
    .ok_or_else(unauthenticated)?;
    if let Principal::OutOfScope = principal {
        return Err(ApiError::Coded(
            Code::ScopeNotAllowed,
            "this API key's scopes do not include api (it may only call the proxy and the relay)".into(),
        ));
    }
    if let Principal::User(UserPrincipal::ApiKey { org_id, .. }) = &principal {
        let query = form_urlencoded::parse(req.query_string().as_bytes())
            .filter(|(name, _)| name == "orgId" || name == "org_id")
            .map(|(_, value)| value.into_owned());
        let header = req
            .headers()
            .get_all("x-org-id")
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
        check_supplied_orgs(query.chain(header), org_id)?;
    }
    Ok((state, principal))
}

/// Any valid credential (used by `GET /api/auth/verify`).
pub struct AnyPrincipal {
    pub principal: Principal,
    pub state: web::Data<AppState>,
}

impl FromRequest for AnyPrincipal {
    type Error = ApiError;
    type Future = LocalBoxFuture<'static, Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let req = req.clone();
        Box::pin(async move {
            let (state, principal) = principal_of(&req).await?;
            Ok(Self { principal, state })
        })
    }
}

/// The operator internal key: machine-to-machine routes.
pub struct Internal;

impl FromRequest for Internal {
    type Error = ApiError;
    type Future = LocalBoxFuture<'static, Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let req = req.clone();
        Box::pin(async move {
            match principal_of(&req).await?.1 {
                Principal::Internal => Ok(Internal),
                Principal::User(_) | Principal::OutOfScope => Err(ApiError::Coded(
                    Code::InternalKeyRequired,
                    "this route needs the internal key".into(),
                )),
            }
        })
    }
}

/// The operator internal key, named: `internal:` and the first 12 hex digits of the key's
/// SHA-256 (what a change made with it records as its maker; never the key).
pub struct InternalCaller {
    pub label: String,
}

impl FromRequest for InternalCaller {
    type Error = ApiError;
    type Future = LocalBoxFuture<'static, Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let req = req.clone();
        let internal = Internal::from_request(&req, payload);
        Box::pin(async move {
            internal.await?;
            let token = bearer(&req).unwrap_or_default();
            let digest = <sha2::Sha256 as sha2::Digest>::digest(token.as_bytes());
            Ok(Self {
                label: format!("internal:{}", &hex::encode(digest)[..12]),
            })
        })
    }
}

/// A user: an API key (acting as a member of its organization) or a session.
pub struct Caller {
    pub principal: UserPrincipal,
    state: web::Data<AppState>,
    query_org: Option<OrgId>,
    header_org: Option<OrgId>,
}

impl FromRequest for Caller {
    type Error = ApiError;
    type Future = LocalBoxFuture<'static, Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let req = req.clone();
        Box::pin(async move {
            let (state, principal) = principal_of(&req).await?;
            let principal = match principal {
                Principal::User(user) => user,
                Principal::Internal | Principal::OutOfScope => {
                    return Err(ApiError::Forbidden(
                        "the internal key cannot act as a user".into(),
                    ))
                }
            };
            // An empty orgId is none; one of whitespace alone (it would name no
            // organization) or holding NUL is refused, as the schema's pattern says.
            let query_org = form_urlencoded::parse(req.query_string().as_bytes())
                .find(|(k, _)| k == "orgId")
                .map_or(Ok(None), |(_, v)| OrgId::parse_optional(&v))
                .map_err(|err| {
                    ApiError::Validation(vec![id_issue(vec![json!("query"), json!("orgId")], err)])
                })?;
            Ok(Self {
                principal,
                state,
                query_org,
                header_org: req
                    .headers()
                    .get("x-org-id")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| OrgId::parse_optional(v).ok().flatten()),
            })
        })
    }
}

impl Caller {
    /// A caller already verified elsewhere (the console's session), naming no organization.
    pub fn verified(principal: UserPrincipal, state: web::Data<AppState>) -> Self {
        Self {
            principal,
            state,
            query_org: None,
            header_org: None,
        }
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// The organization of this call, as a member. `body_org` is the body's `orgId`, if any.
    pub async fn member(&self, body_org: Option<&OrgId>) -> ApiResult<OrgAccess> {
        match &self.principal {
            UserPrincipal::ApiKey { org_id, .. } => {
                let supplied = [body_org, self.query_org.as_ref(), self.header_org.as_ref()];
                check_supplied_orgs(supplied.into_iter().flatten(), org_id)?;
                Ok(OrgAccess {
                    org_id: org_id.clone(),
                    role: Role::Member,
                    user_id: None,
                })
            }
            UserPrincipal::Session { user_id } => {
                let wanted = body_org.or(self.query_org.as_ref()).or(self.header_org.as_ref());
                let (org_id, role) = match wanted {
                    Some(org) => {
                        let role = keel_core::auth::service::role_in(&self.state.db, user_id, org)
                            .await?
                            .ok_or_else(|| {
                                ApiError::Coded(Code::NotAMember, "not a member of this organization".into())
                            })?;
                        (org.clone(), role)
                    }
                    None => {
                        let mut orgs =
                            keel_core::auth::service::memberships_of(&self.state.db, user_id).await?;
                        if orgs.len() != 1 {
                            return Err(ApiError::validation(
                                vec![json!("query"), json!("orgId")],
                                "missing",
                                "Field required: name the organization with orgId or the X-Org-Id header",
                            ));
                        }
                        orgs.remove(0)
                    }
                };
                Ok(OrgAccess {
                    org_id,
                    role,
                    user_id: Some(user_id.clone()),
                })
            }
        }
    }

    /// As [`Caller::member`], but the caller must be an owner's session.
    pub async fn owner(&self, body_org: Option<&OrgId>) -> ApiResult<OrgAccess> {
        if matches!(self.principal, UserPrincipal::ApiKey { .. }) {
            return Err(ApiError::Coded(
                Code::OwnerRequired,
                "this operation needs an owner's session".into(),
            ));
        }
        let access = self.member(body_org).await?;
        if access.role != Role::Owner {
            return Err(ApiError::Coded(
                Code::OwnerRequired,
                "this operation is reserved to organization owners".into(),
            ));
        }
        Ok(access)
    }

    /// Every organization the caller may read: the key's one, or all of the session user's.
    pub async fn organizations(&self) -> ApiResult<Vec<OrgId>> {
        match &self.principal {
            UserPrincipal::ApiKey { org_id, .. } => Ok(vec![org_id.clone()]),
            UserPrincipal::Session { user_id } => {
                Ok(keel_core::auth::service::memberships_of(&self.state.db, user_id)
                    .await?
                    .into_iter()
                    .map(|(org, _)| org)
                    .collect())
            }
        }
    }

    /// The organizations a list or read may touch: the one the call names (query or header,
    /// the caller's membership checked), else every one it may read.
    pub async fn named_or_all_orgs(&self) -> ApiResult<Vec<OrgId>> {
        match self.named_org() {
            true => Ok(vec![self.member(None).await?.org_id]),
            false => self.organizations().await,
        }
    }

    /// Whether the caller named an organization explicitly (query or header).
    pub fn named_org(&self) -> bool {
        self.query_org.is_some() || self.header_org.is_some()
    }
}

/// Input that names the organization a call acts on (a body's or query's `orgId`).
pub trait OrgScoped {
    fn org_id(&self) -> Option<&OrgId>;
}

/// `OrgScoped` for inputs whose `org_id` field names the organization (required or not).
#[macro_export]
macro_rules! org_scoped {
    // Inputs that name no organization: the caller's query, header or key decides.
    (unnamed: $($input:ty),+ $(,)?) => {$(
        impl $crate::auth::OrgScoped for $input {
            fn org_id(&self) -> Option<&::keel_core::domain::OrgId> {
                None
            }
        }
    )+};
    ($($input:ty),+ $(,)?) => {$(
        impl $crate::auth::OrgScoped for $input {
            fn org_id(&self) -> Option<&::keel_core::domain::OrgId> {
                $crate::auth::AsOrg::as_org(&self.org_id)
            }
        }
    )+};
}

/// A required or optional `org_id` field, as [`OrgScoped`] reads it.
pub trait AsOrg {
    fn as_org(&self) -> Option<&OrgId>;
}

impl AsOrg for OrgId {
    fn as_org(&self) -> Option<&OrgId> {
        Some(self)
    }
}

impl AsOrg for Option<OrgId> {
    fn as_org(&self) -> Option<&OrgId> {
        self.as_ref()
    }
}

impl<T: OrgScoped> OrgScoped for ValidJson<T> {
    fn org_id(&self) -> Option<&OrgId> {
        self.0.org_id()
    }
}

impl<T: OrgScoped> OrgScoped for ValidQuery<T> {
    fn org_id(&self) -> Option<&OrgId> {
        self.0.org_id()
    }
}

/// The caller acting on the organization `T` names (else the one of the query, header or
/// key), with `T` extracted and validated first: the signature says who may call. Use it as
/// [`Member`] or [`Owner`].
pub struct Scoped<T, const OWNER: bool> {
    pub access: OrgAccess,
    pub input: T,
    pub state: web::Data<AppState>,
}

/// A member of the organization `T` names.
pub type Member<T> = Scoped<T, false>;

/// An owner's session for the organization `T` names.
pub type Owner<T> = Scoped<T, true>;

/// The caller, then `T` (its 422), then the membership or ownership (403/404).
impl<T, const OWNER: bool> FromRequest for Scoped<T, OWNER>
where
    T: FromRequest + OrgScoped + 'static,
    T::Error: Into<ApiError>,
{
    type Error = ApiError;
    type Future = LocalBoxFuture<'static, Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let caller = Caller::from_request(req, payload);
        let input = T::from_request(req, payload);
        let req = req.clone();
        Box::pin(async move {
            let caller = caller.await?;
            let input = input.await.map_err(Into::into)?;
            let access = match OWNER {
                true => caller.owner(input.org_id()).await?,
                false => caller.member(input.org_id()).await?,
            };
            crate::telemetry::note_org(&req, access.org_id.as_str());
            Ok(Self {
                access,
                input,
                state: caller.state.clone(),
            })
        })
    }
}

/// A member of the organization named by query `orgId` or header `X-Org-Id`.
pub struct MemberOf(pub OrgAccess);

impl FromRequest for MemberOf {
    type Error = ApiError;
    type Future = LocalBoxFuture<'static, Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let caller = Caller::from_request(req, payload);
        let req = req.clone();
        Box::pin(async move {
            let access = caller.await?.member(None).await?;
            crate::telemetry::note_org(&req, access.org_id.as_str());
            Ok(Self(access))
        })
    }
}

/// An owner's session for the organization named by query `orgId` or header `X-Org-Id`.
pub struct OwnerOf(pub OrgAccess);

impl FromRequest for OwnerOf {
    type Error = ApiError;
    type Future = LocalBoxFuture<'static, Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let caller = Caller::from_request(req, payload);
        let req = req.clone();
        Box::pin(async move {
            let access = caller.await?.owner(None).await?;
            crate::telemetry::note_org(&req, access.org_id.as_str());
            Ok(Self(access))
        })
    }
}

/// A user API key only (routes the spec ties to the submitting user's key).
pub struct ApiKeyCaller {
    pub key_id: ApiKeyId,
    pub org_id: OrgId,
}

impl FromRequest for ApiKeyCaller {
    type Error = ApiError;
    type Future = LocalBoxFuture<'static, Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let req = req.clone();
        Box::pin(async move {
            match principal_of(&req).await?.1 {
                Principal::User(UserPrincipal::ApiKey { key_id, org_id }) => Ok(Self { key_id, org_id }),
                _ => Err(ApiError::Forbidden("this route needs a user API key".into())),
            }
        })
    }
}
