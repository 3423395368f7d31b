//! Signing in and out, and choosing the organization to work in.

use std::collections::HashMap;

use actix_web::http::StatusCode;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;

use super::pages::{Layout, LoginPage, OrgRow, OrgsPage};
use super::session::{self, Standing, Viewer};
use super::{format, html, page, redirect, ConsoleError, Flash};
use crate::state::AppState;
use keel_core::domain::OrgId;

/// `/console`: where the session works, or the sign-in form.
pub async fn home(req: HttpRequest) -> HttpResponse {
    let viewer = match <Viewer as actix_web::FromRequest>::extract(&req).await {
        Ok(viewer) => viewer,
        Err(err) => return actix_web::ResponseError::error_response(&err),
    };
    let to = match (&viewer.standing, viewer.home_org()) {
        (_, Some(org)) => format!("/console/o/{org}"),
        _ => "/console/orgs".to_owned(),
    };
    redirect(&to).finish()
}

#[derive(Deserialize)]
pub struct NextQuery {
    next: Option<String>,
}

pub async fn login_form(query: web::Query<NextQuery>) -> HttpResponse {
    html(
        StatusCode::OK,
        &LoginPage {
            l: Layout::bare("Sign in"),
            error: None,
            next: query
                .next
                .as_deref()
                .and_then(session::local_next)
                .unwrap_or_default()
                .to_owned(),
        },
    )
}

#[derive(Deserialize)]
pub struct LoginForm {
    #[serde(default)]
    credential: String,
    /// The page asked for before signing in (a local console path, else ignored).
    #[serde(default)]
    next: String,
}

/// Verifies the credential; a wrong one gets the form again (401) and nothing else. A form
/// posted from another site is refused (403), and an address past its sign-in attempts waits
/// (429), both without a session and before the credential is looked at.
pub async fn login(
    req: HttpRequest,
    state: web::Data<AppState>,
    form: web::Form<LoginForm>,
) -> Result<HttpResponse, ConsoleError> {
    let next = session::local_next(&form.next).map(str::to_owned);
    let refused = |status: StatusCode, error: &str| {
        html(
            status,
            &LoginPage {
                l: Layout::bare("Sign in"),
                error: Some(error.to_owned()),
                next: next.clone().unwrap_or_default(),
            },
        )
    };
    if !session::from_the_console(&req) {
        return Ok(refused(
            StatusCode::FORBIDDEN,
            "This sign-in was sent from another site; sign in on keel's own page.",
        ));
    }
    let client = req.peer_addr().map(|a| a.ip());
    let throttled = |wait: u64| {
        let mut reply = refused(
            StatusCode::TOO_MANY_REQUESTS,
            &format!("Too many wrong credentials from this address; try again in {wait} s."),
        );
        if let Ok(value) = actix_web::http::header::HeaderValue::from_str(&wait.to_string()) {
            reply
                .headers_mut()
                .insert(actix_web::http::header::RETRY_AFTER, value);
        }
        reply
    };
    if let Some(wait) = client.and_then(|ip| state.sign_in_throttle.wait_of(ip)) {
        return Ok(throttled(wait));
    }
    let credential = form.credential.trim();
    let Some(standing) = session::sign_in(&state, credential).await? else {
        if let Some(wait) = client.and_then(|ip| state.sign_in_throttle.failed(ip)) {
            return Ok(throttled(wait));
        }
        return Ok(refused(
            StatusCode::UNAUTHORIZED,
            "Those credentials were not accepted.",
        ));
    };
    let expires = session::credential_expiry(&state, credential);
    let home = match &standing {
        Standing::Key { org_id, .. }
        | Standing::User {
            org_id: Some(org_id), ..
        } => format!("/console/o/{org_id}"),
        _ => "/console/orgs".to_owned(),
    };
    let cookie = session::start_session(&state, &req, standing, expires).await?;
    Ok(redirect(&next.unwrap_or(home)).cookie(cookie).finish())
}

#[derive(Deserialize)]
pub struct CsrfForm {
    #[serde(default)]
    csrf: String,
}

pub async fn logout(
    req: HttpRequest,
    viewer: Viewer,
    form: web::Form<CsrfForm>,
) -> Result<HttpResponse, ConsoleError> {
    viewer.check_csrf(&form.csrf)?;
    // Ended on the server: the cookie, wherever a copy of it is, opens nothing any more.
    session::end_session(&viewer.state, &viewer.sid).await?;
    Ok(redirect("/console/login")
        .cookie(session::cleared_cookie(&viewer.state, &req))
        .finish())
}

/// The operator's list of every organization, or a user's organizations to pick from.
pub async fn organizations(req: HttpRequest, viewer: Viewer) -> Result<HttpResponse, ConsoleError> {
    let flash = Flash::read(&req);
    // The operator's search: words of a name, a slug or an id, any case.
    let q: String = form_urlencoded::parse(req.query_string().as_bytes())
        .find(|(k, _)| k == "q")
        .map(|(_, v)| v.trim().chars().take(200).collect())
        .unwrap_or_default();
    let orgs: Vec<OrgRow> = if viewer.is_operator() {
        let needle = q.to_lowercase();
        operator_rows(&viewer.state)
            .await?
            .into_iter()
            .filter(|o| {
                needle.is_empty()
                    || o.name.to_lowercase().contains(&needle)
                    || o.slug.to_lowercase().contains(&needle)
                    || o.id.contains(&needle)
            })
            .collect()
    } else {
        let memberships = viewer.user_orgs().await?;
        if memberships.is_empty() {
            // An API key has one organization.
            if let Some(org) = viewer.home_org() {
                return Ok(redirect(&format!("/console/o/{org}")).finish());
            }
        }
        let names: HashMap<OrgId, (String, String)> = keel_core::orgs::service::all(&viewer.state.db)
            .await?
            .into_iter()
            .filter(|o| memberships.iter().any(|(id, _)| *id == o.id))
            .map(|o| (o.id, (o.name, o.slug)))
            .collect();
        memberships
            .into_iter()
            .map(|(id, role)| {
                let (name, slug) = names.get(&id).cloned().unwrap_or_default();
                OrgRow {
                    id: id.into(),
                    name,
                    slug,
                    role: role.as_str().to_owned(),
                    balance: String::new(),
                    queued: 0,
                    running: 0,
                    last_activity: String::new(),
                }
            })
            .collect()
    };
    Ok(page(
        &req,
        &OrgsPage {
            l: Layout::new("Organizations", &viewer, "orgs", flash),
            total: orgs.len(),
            orgs,
            q,
        },
    ))
}

/// Every organization with its balance, open jobs and last ledger activity.
async fn operator_rows(state: &AppState) -> Result<Vec<OrgRow>, ConsoleError> {
    Ok(keel_core::operator::organizations(&state.db)
        .await?
        .into_iter()
        .map(|o| OrgRow {
            balance: format::dollars(o.balance),
            last_activity: format::opt_time(o.last_activity),
            role: String::new(),
            queued: o.queued,
            running: o.running,
            id: o.org.id.into(),
            name: o.org.name,
            slug: o.org.slug,
        })
        .collect())
}

#[derive(Deserialize)]
pub struct PickForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    org: String,
}

/// A user session moves to another of the user's organizations.
pub async fn pick_org(
    req: HttpRequest,
    viewer: Viewer,
    form: web::Form<PickForm>,
) -> Result<HttpResponse, ConsoleError> {
    viewer.check_csrf(&form.csrf)?;
    let Standing::User { user_id, .. } = &viewer.standing else {
        return Err(ConsoleError::NotFound);
    };
    let Ok(org) = OrgId::parse(&form.org) else {
        return Err(ConsoleError::NotFound);
    };
    if !viewer.user_orgs().await?.iter().any(|(id, _)| *id == org) {
        return Err(ConsoleError::NotFound);
    }
    let standing = Standing::User {
        user_id: user_id.clone(),
        org_id: Some(org.clone()),
    };
    let (cookie, _) = session::session_cookie(
        &viewer.state,
        &req,
        standing,
        viewer.sid.clone(),
        viewer.expires,
        Some(viewer.csrf.clone()),
    )?;
    Ok(redirect(&format!("/console/o/{org}")).cookie(cookie).finish())
}
