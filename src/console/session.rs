//! Console sign-in: one signed, expiring cookie that names what the user signed in with (an
//! API key's id, a session's user and organization, or the operator) and never the
//! credential itself. Every request checks again that it still stands.

use actix_web::cookie::{Cookie, SameSite};
use actix_web::dev::Payload;
use actix_web::{web, FromRequest, HttpRequest};
use futures_util::future::LocalBoxFuture;
use rand::RngCore;
use sha2::Sha256;

use super::ConsoleError;
use crate::auth::{self, Caller, OrgAccess, Principal, Role, UserPrincipal};
use crate::error::ApiError;
use crate::state::AppState;
pub use keel_core::auth::cookies::{CookieKeys, Standing};
use keel_core::config::SecureCookies;
use keel_core::domain::{OrgId, UserId};

/// The console's cookie.
pub const COOKIE: &str = "keel_console";
/// Whether a sign-in POST came from the console's own page: a browser says where a form was
/// sent from (`Sec-Fetch-Site`, `Origin`), and a form of another site (or another port of
/// this host) signs nobody in, so no page elsewhere can sign a visitor's browser into the
/// attacker's organization (login CSRF). A client that is no browser sends neither header.
pub fn from_the_console(req: &HttpRequest) -> bool {
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    if let Some(site) = header("sec-fetch-site") {
        if !matches!(site, "same-origin" | "none") {
            return false;
        }
    }
    match header("origin") {
        None => true,
        // The host and port the browser sent the form from must be keel's own. The scheme is
        // not compared: behind a proxy that ends TLS keel may see plain http.
        Some(origin) => url::Url::parse(origin).is_ok_and(|origin| {
            let authority = match origin.port() {
                Some(port) => format!("{}:{port}", origin.host_str().unwrap_or_default()),
                None => origin.host_str().unwrap_or_default().to_owned(),
            };
            authority.eq_ignore_ascii_case(req.connection_info().host())
        }),
    }
}

/// Verifies a credential typed into the sign-in form; `None` when it is not accepted.
pub async fn sign_in(state: &AppState, credential: &str) -> Result<Option<Standing>, ApiError> {
    let credential = credential.trim();
    if credential.is_empty() {
        return Ok(None);
    }
    Ok(match auth::resolve(state, credential).await? {
        // A key without the `api` scope cannot use the console either.
        None | Some(Principal::OutOfScope) => None,
        Some(Principal::Internal) => {
            let digest: [u8; 32] = <Sha256 as sha2::Digest>::digest(credential.as_bytes()).into();
            Some(Standing::Operator {
                fingerprint: state.console_keys.fingerprint(&digest),
            })
        }
        Some(Principal::User(UserPrincipal::ApiKey { key_id, org_id })) => {
            Some(Standing::Key { key_id, org_id })
        }
        Some(Principal::User(UserPrincipal::Session { user_id })) => {
            let orgs = keel_core::auth::service::memberships_of(&state.db, &user_id).await?;
            if orgs.is_empty() {
                // Nothing to show: the same answer as an unknown credential.
                return Ok(None);
            }
            let org_id = (orgs.len() == 1).then(|| orgs[0].0.clone());
            Some(Standing::User { user_id, org_id })
        }
    })
}

/// How long a session token typed into the form still has: the console session ends with it.
pub fn credential_expiry(state: &AppState, credential: &str) -> i64 {
    let far = i64::MAX / 2;
    if keel_core::auth::keys::looks_like_api_key(credential)
        || !keel_core::auth::session::looks_like_jwt(credential)
    {
        return far;
    }
    state
        .session_keys
        .as_ref()
        .and_then(|k| k.expiry(credential.trim()))
        .unwrap_or(far)
}

/// Starts a console session: its row, then its cookie (and CSRF token).
pub async fn start_session(
    state: &AppState,
    req: &HttpRequest,
    standing: Standing,
    expires: i64,
) -> Result<Cookie<'static>, ApiError> {
    let now = chrono::Utc::now();
    let ends = expires.min(now.timestamp() + state.console_keys.ttl_secs);
    let mut sid = [0u8; 16];
    rand::rng().fill_bytes(&mut sid);
    let sid = hex::encode(sid);
    let (kind, key_id, user_id) = match &standing {
        Standing::Key { key_id, .. } => ("key", Some(key_id.clone()), None),
        Standing::User { user_id, .. } => ("user", None, Some(user_id.clone())),
        Standing::Operator { .. } => ("operator", None, None),
    };
    keel_core::console::service::start_session(
        &state.db,
        entities::console_session::Model {
            id: sid.clone(),
            kind: kind.into(),
            key_id,
            user_id,
            created_at: now,
            expires_at: chrono::DateTime::from_timestamp(ends, 0).unwrap_or(now),
        },
    )
    .await?;
    Ok(session_cookie(state, req, standing, sid, expires, None)?.0)
}

/// Ends a console session on the server: its cookie is refused from now on, on every
/// instance.
pub async fn end_session(state: &AppState, sid: &str) -> Result<(), ApiError> {
    Ok(keel_core::console::service::end_session(&state.db, sid).await?)
}

/// The cookie for a console session, and its CSRF token (a new one unless `csrf` keeps the
/// session's own, when the same session moves to another organization).
pub fn session_cookie(
    state: &AppState,
    req: &HttpRequest,
    standing: Standing,
    sid: String,
    expires: i64,
    csrf: Option<String>,
) -> Result<(Cookie<'static>, String), ApiError> {
    let (token, csrf) = state
        .console_keys
        .sign(standing, sid, expires, csrf)
        .map_err(anyhow::Error::from)?;
    let mut cookie = base_cookie(state, req, token);
    cookie.set_max_age(actix_web::cookie::time::Duration::seconds(
        state.console_keys.ttl_secs,
    ));
    Ok((cookie, csrf))
}

/// A cookie that ends the console session.
pub fn cleared_cookie(state: &AppState, req: &HttpRequest) -> Cookie<'static> {
    let mut cookie = base_cookie(state, req, String::new());
    cookie.make_removal();
    cookie
}

fn base_cookie(state: &AppState, req: &HttpRequest, value: String) -> Cookie<'static> {
    let secure = match state.settings.console.secure_cookies {
        SecureCookies::Always => true,
        SecureCookies::Never => false,
        SecureCookies::Auto => req.connection_info().scheme() == "https",
    };
    Cookie::build(COOKIE, value)
        .path("/console")
        .http_only(true)
        // Lax: a link from another site (a chat, an e-mail, a ticket) opens the console
        // signed in; every state-changing request is a POST, which the cookie does not
        // accompany across sites, and which also needs the session's CSRF token.
        .same_site(SameSite::Lax)
        .secure(secure)
        .finish()
}

/// A signed-in console user whose standing was checked again for this request.
pub struct Viewer {
    pub standing: Standing,
    /// The session's row.
    pub sid: String,
    pub csrf: String,
    /// When the session ends (Unix seconds).
    pub expires: i64,
    pub state: web::Data<AppState>,
    /// The organization's role for an API key or a user (`None` for the operator).
    pub role: Option<Role>,
}

impl FromRequest for Viewer {
    type Error = ConsoleError;
    type Future = LocalBoxFuture<'static, Result<Self, ConsoleError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let req = req.clone();
        Box::pin(async move {
            let state = req.app_data::<web::Data<AppState>>().cloned().ok_or_else(|| {
                ConsoleError::from(ApiError::Unexpected(anyhow::anyhow!(
                    "application state is missing"
                )))
            })?;
            // Where to come back to after signing in (a page, not a form's target).
            let next = (req.method() == actix_web::http::Method::GET).then(|| match req.query_string() {
                "" => req.path().to_owned(),
                query => format!("{}?{query}", req.path()),
            });
            let Some(cookie) = req.cookie(COOKIE) else {
                return Err(ConsoleError::SignedOut { clear: false, next });
            };
            let signed_out = || ConsoleError::SignedOut {
                clear: true,
                next: next.clone(),
            };
            let claims = state.console_keys.verify(cookie.value()).ok_or_else(signed_out)?;
            if !keel_core::console::service::session_alive(&state.db, &claims.sid, chrono::Utc::now()).await?
            {
                return Err(signed_out());
            }
            let role = match still_stands(&state, &claims.standing).await {
                Err(ConsoleError::SignedOut { .. }) => return Err(signed_out()),
                other => other?,
            };
            Ok(Self {
                sid: claims.sid,
                standing: claims.standing,
                csrf: claims.csrf,
                expires: claims.exp,
                state,
                role,
            })
        })
    }
}

/// `next` if it is a console page of this site (a local path only), for the redirect after
/// signing in.
pub fn local_next(next: &str) -> Option<&str> {
    let safe = (next == "/console" || next.starts_with("/console/"))
        && !next.contains("//")
        && !next.contains("/..")
        && !next.contains('\\')
        && next.len() <= 2000
        && !next.chars().any(char::is_control);
    safe.then_some(next)
}

/// Whether what the session stands for still holds: the key is not revoked, the user is
/// still a member of the organization, the internal key is still configured.
async fn still_stands(
    state: &web::Data<AppState>,
    standing: &Standing,
) -> Result<Option<Role>, ConsoleError> {
    match standing {
        Standing::Operator { fingerprint } => {
            let known = state
                .internal_keys
                .digests()
                .iter()
                .any(|d| state.console_keys.fingerprint(d) == *fingerprint);
            known.then_some(None).ok_or(ConsoleError::signed_out())
        }
        Standing::Key { key_id, org_id } => {
            let key = keel_core::auth::service::api_key_by_id(&state.db, key_id).await?;
            match key {
                // A key whose scopes lost `api` can no longer use the console.
                Some(key) if key.org_id == *org_id && keel_core::keys::KeySettings::of(&key).scopes.api => {
                    Ok(Some(Role::Member))
                }
                _ => Err(ConsoleError::signed_out()),
            }
        }
        Standing::User { user_id, org_id } => {
            if !keel_core::auth::service::user_exists(&state.db, user_id).await? {
                return Err(ConsoleError::signed_out());
            }
            match org_id {
                None => Ok(None),
                Some(org) => match user_caller(state, user_id).member(Some(org)).await {
                    Ok(access) => Ok(Some(access.role)),
                    Err(err) if err.code().status() == actix_web::http::StatusCode::FORBIDDEN => {
                        Err(ConsoleError::signed_out())
                    }
                    Err(other) => Err(other.into()),
                },
            }
        }
    }
}

fn user_caller(state: &web::Data<AppState>, user_id: &UserId) -> Caller {
    let principal = UserPrincipal::Session {
        user_id: user_id.clone(),
    };
    Caller::verified(principal, state.clone())
}

/// The API's caller a member's standing is (`None`: the operator, who is no member).
fn caller_of(state: &web::Data<AppState>, standing: &Standing) -> Option<Caller> {
    match standing {
        Standing::Key { key_id, org_id } => Some(Caller::verified(
            UserPrincipal::ApiKey {
                key_id: key_id.clone(),
                org_id: org_id.clone(),
            },
            state.clone(),
        )),
        Standing::User { user_id, .. } => Some(user_caller(state, user_id)),
        Standing::Operator { .. } => None,
    }
}

/// What the viewer may do in one organization.
pub struct OrgView {
    pub org_id: OrgId,
    /// `None`: the operator, reading.
    pub access: Option<OrgAccess>,
}

impl OrgView {
    /// May change things (a member: an API key or a user session).
    pub fn can_act(&self) -> bool {
        self.access.is_some()
    }

    /// An owner's session (what the API asks of owner-only routes).
    pub fn is_owner(&self) -> bool {
        self.access
            .as_ref()
            .is_some_and(|a| a.role == Role::Owner && a.user_id.is_some())
    }
}

impl Viewer {
    /// What a change made in an operator's session records as its maker: `console:` and the
    /// start of the session's key fingerprint (never the key).
    pub fn operator_label(&self) -> String {
        match &self.standing {
            Standing::Operator { fingerprint } => {
                format!("console:{}", fingerprint.chars().take(12).collect::<String>())
            }
            _ => "console".into(),
        }
    }

    pub fn is_operator(&self) -> bool {
        matches!(self.standing, Standing::Operator { .. })
    }

    /// The organization the session works in, if it has one.
    pub fn home_org(&self) -> Option<&OrgId> {
        match &self.standing {
            Standing::Key { org_id, .. } => Some(org_id),
            Standing::User { org_id, .. } => org_id.as_ref(),
            Standing::Operator { .. } => None,
        }
    }

    /// The organization of a page: the session's own (as the API decides: the same caller
    /// and membership checks), or any for the operator, read-only. Another one is 404.
    pub async fn org(&self, raw: &str) -> Result<OrgView, ConsoleError> {
        let org_id = OrgId::parse(raw).map_err(|_| ConsoleError::NotFound)?;
        if self.is_operator() {
            return match keel_core::orgs::service::exists(&self.state.db, &org_id).await? {
                true => Ok(OrgView { org_id, access: None }),
                false => Err(ConsoleError::NotFound),
            };
        }
        if self.home_org() != Some(&org_id) {
            return Err(ConsoleError::NotFound);
        }
        let caller = caller_of(&self.state, &self.standing).ok_or(ConsoleError::NotFound)?;
        match caller.member(Some(&org_id)).await {
            Ok(access) => Ok(OrgView {
                org_id,
                access: Some(access),
            }),
            Err(err) if err.code().status() == actix_web::http::StatusCode::FORBIDDEN => {
                Err(ConsoleError::NotFound)
            }
            Err(other) => Err(other.into()),
        }
    }

    /// The organization for a form that changes something: as [`Viewer::org`], then the
    /// form's CSRF token, then the right to act (`owner`: an owner's session).
    pub async fn act_in(&self, raw: &str, csrf: &str, owner: bool) -> Result<OrgView, ConsoleError> {
        self.check_csrf(csrf)?;
        let org = self.org(raw).await?;
        let allowed = match owner {
            true => org.is_owner(),
            false => org.can_act(),
        };
        if !allowed {
            return Err(ConsoleError::Forbidden(match owner {
                true => "only an organization owner's session may do this",
                false => "the operator's view is read-only",
            }));
        }
        Ok(org)
    }

    /// 403 unless `csrf` is this session's token.
    pub fn check_csrf(&self, csrf: &str) -> Result<(), ConsoleError> {
        use subtle::ConstantTimeEq;
        match bool::from(csrf.as_bytes().ct_eq(self.csrf.as_bytes())) && !csrf.is_empty() {
            true => Ok(()),
            false => Err(ConsoleError::Forbidden(
                "the form has expired or did not come from this console; reload the page and try again",
            )),
        }
    }

    /// The user's organizations (a user session only).
    pub async fn user_orgs(&self) -> Result<Vec<(OrgId, Role)>, ConsoleError> {
        match &self.standing {
            Standing::User { user_id, .. } => {
                Ok(keel_core::auth::service::memberships_of(&self.state.db, user_id).await?)
            }
            _ => Ok(Vec::new()),
        }
    }
}
