//! The console: server-rendered pages under `/console` for organizations and operators.
//! Handlers read through the same services and repos as the JSON API and decide access with
//! the same caller and membership checks; templates are compiled in and autoescape.

mod assets;
mod chart;
mod format;
mod hooks;
mod operator;
mod org;
mod pages;
use keel_core::console_store as repo;
pub mod session;
mod signin;
mod words;
mod work;

use actix_web::cookie::Cookie;
use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::middleware::DefaultHeaders;
use actix_web::{web, HttpRequest, HttpResponse, ResponseError};
use askama::Template;

use crate::domain::OrgId;
use crate::error::ApiError;

/// The console's content security policy: nothing inline, nothing from elsewhere, no framing.
pub const CSP: &str = "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// Mounts the console. Every path of it is listed here.
pub fn configure(cfg: &mut web::ServiceConfig) {
    let headers = DefaultHeaders::new()
        .add((header::CONTENT_SECURITY_POLICY, CSP))
        .add((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .add((header::REFERRER_POLICY, "same-origin"))
        .add((header::X_FRAME_OPTIONS, "DENY"))
        .add((header::CACHE_CONTROL, "no-store"));
    cfg.service(
        web::scope("/console")
            .wrap(headers)
            // A query the page cannot read is a console page saying so, not actix's text.
            .app_data(web::QueryConfig::default().error_handler(|err, _| {
                let name = match &err {
                    actix_web::error::QueryPayloadError::Deserialize(e) => e
                        .to_string()
                        .split('`')
                        .nth(1)
                        .map_or_else(|| "value".to_owned(), |f| format!("\"{f}\"")),
                    _ => "value".to_owned(),
                };
                unreadable(&name).into()
            }))
            .route("", web::get().to(signin::home))
            .route("/", web::get().to(signin::home))
            .route("/login", web::get().to(signin::login_form))
            .route("/login", web::post().to(signin::login))
            .route("/logout", web::post().to(signin::logout))
            .route("/orgs", web::get().to(signin::organizations))
            .route("/orgs/pick", web::post().to(signin::pick_org))
            .route("/static/{name}", web::get().to(assets::serve))
            .route("/o/{org}", web::get().to(org::overview))
            .route("/o/{org}/card", web::post().to(org::save_card))
            .route("/o/{org}/card/remove", web::post().to(org::remove_card))
            .route("/o/{org}/auto-topup", web::post().to(org::auto_topup))
            .route("/o/{org}/topup", web::post().to(org::topup))
            .route("/o/{org}/promo", web::post().to(org::promo))
            .route("/o/{org}/starter-credit", web::post().to(org::starter_credit))
            .route("/o/{org}/ledger", web::get().to(org::ledger))
            .route("/o/{org}/ledger.csv", web::get().to(org::ledger_csv))
            .route("/o/{org}/keys", web::get().to(org::keys))
            .route("/o/{org}/keys", web::post().to(org::create_key))
            .route("/o/{org}/keys/{key}/revoke", web::post().to(org::revoke_key))
            .route("/o/{org}/keys/{key}/edit", web::post().to(org::edit_key))
            .route("/o/{org}/jobs", web::get().to(work::jobs))
            .route("/o/{org}/jobs/{job}", web::get().to(work::job))
            .route("/o/{org}/jobs/{job}/stop", web::post().to(work::stop_job))
            .route("/o/{org}/jobs/{job}/retry", web::post().to(work::retry_job))
            .route("/o/{org}/traces", web::get().to(work::trace_projects))
            .route("/o/{org}/projects/{project}/traces", web::get().to(work::traces))
            .route("/o/{org}/projects/{project}/export", web::post().to(work::export))
            .route("/o/{org}/traces/{trace}", web::get().to(work::trace))
            .route("/o/{org}/traces/{trace}/tags", web::post().to(work::trace_tags))
            .route("/o/{org}/traces/{trace}/scores", web::post().to(work::set_score))
            .route(
                "/o/{org}/traces/{trace}/scores/{name}/delete",
                web::post().to(work::delete_score),
            )
            .route(
                "/o/{org}/projects/{project}/tag",
                web::post().to(work::tag_traces),
            )
            .route(
                "/o/{org}/projects/{project}/retention",
                web::post().to(work::set_retention),
            )
            .route("/o/{org}/evals", web::get().to(work::evals))
            .route("/o/{org}/evals/{run}", web::get().to(work::eval_run))
            .route("/o/{org}/runs", web::get().to(work::runs))
            .route("/o/{org}/webhooks", web::get().to(hooks::webhooks))
            .route("/o/{org}/webhooks", web::post().to(hooks::create))
            .route(
                "/o/{org}/webhooks/deliveries/{delivery}/retry",
                web::post().to(hooks::retry),
            )
            .route("/o/{org}/webhooks/{endpoint}", web::get().to(hooks::log))
            .route(
                "/o/{org}/webhooks/{endpoint}/enabled",
                web::post().to(hooks::set_enabled),
            )
            .route(
                "/o/{org}/webhooks/{endpoint}/test",
                web::post().to(hooks::send_test),
            )
            .route(
                "/o/{org}/webhooks/{endpoint}/rotate",
                web::post().to(hooks::rotate),
            )
            .route(
                "/o/{org}/webhooks/{endpoint}/delete",
                web::post().to(hooks::delete),
            )
            .route("/operator/queue", web::get().to(operator::queue))
            .route("/operator/requeue-stale", web::post().to(operator::requeue_stale))
            .route("/operator/queue/{action}/pause", web::post().to(operator::pause))
            .route(
                "/operator/queue/{action}/resume",
                web::post().to(operator::resume),
            )
            .route("/operator/failed", web::get().to(operator::failed))
            .route("/operator/failed/retry", web::post().to(operator::retry_failed))
            .route("/operator/writer", web::get().to(operator::writer))
            .route("/operator/webhooks", web::get().to(hooks::failing))
            .route("/operator/grants", web::get().to(operator::grants))
            .route("/operator/grants", web::post().to(operator::grant))
            .default_service(web::to(not_found)),
    );
}

async fn not_found() -> Result<HttpResponse, ConsoleError> {
    Err(ConsoleError::NotFound)
}

/// A console failure, answered as a page (or, signed out, a way back to the sign-in form).
#[derive(Debug, thiserror::Error)]
pub enum ConsoleError {
    /// Not signed in (any more): to the sign-in form, then back to `next`; a cookie that
    /// was sent and no longer holds is cleared (one that was not sent is left alone: a
    /// cross-site navigation may simply not have carried it).
    #[error("signed out")]
    SignedOut { clear: bool, next: Option<String> },
    #[error("not found")]
    NotFound,
    #[error("{0}")]
    Forbidden(&'static str),
    #[error(transparent)]
    Api(#[from] ApiError),
}

impl ConsoleError {
    /// The session no longer holds (its cookie is cleared).
    pub fn signed_out() -> Self {
        Self::SignedOut {
            clear: true,
            next: None,
        }
    }
}

/// A page fails as the JSON API would for the same error (its status), shown as a page.
macro_rules! console_error_from {
    ($($error:ty),+ $(,)?) => {
        $(impl From<$error> for ConsoleError {
            fn from(err: $error) -> Self {
                Self::Api(err.into())
            }
        })+
    };
}

console_error_from!(
    sea_orm::DbErr,
    keel_core::billing::BillingError,
    keel_core::queue::JobError,
    keel_core::orgs::OrgError,
    keel_core::keys::KeyError,
    keel_core::projects::ProjectError,
    keel_core::traces::TraceError,
    keel_core::evals::EvalError,
    keel_core::runs::RunError,
);

impl ResponseError for ConsoleError {
    fn status_code(&self) -> StatusCode {
        match self {
            Self::SignedOut { .. } => StatusCode::SEE_OTHER,
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::Api(err) => err.status_code(),
        }
    }

    fn error_response(&self) -> HttpResponse {
        let status = self.status_code();
        if let Self::SignedOut { clear, next } = self {
            let to = match next {
                Some(next) => format!(
                    "/console/login?{}",
                    form_urlencoded::Serializer::new(String::new())
                        .append_pair("next", next)
                        .finish()
                ),
                None => "/console/login".to_owned(),
            };
            let mut answer = HttpResponse::SeeOther();
            answer.insert_header((header::LOCATION, to));
            if *clear {
                let mut gone = Cookie::new(session::COOKIE, "");
                gone.set_path("/console");
                gone.make_removal();
                answer.cookie(gone);
            }
            return answer.finish();
        }
        let message = match self {
            Self::NotFound => "There is nothing here, or it belongs to another organization.".to_owned(),
            Self::Forbidden(why) => (*why).to_owned(),
            Self::Api(err) => {
                if status.is_server_error() {
                    // The cause goes to the log once, as the API logs it.
                    drop(err.error_response());
                }
                describe(err)
            }
            Self::SignedOut { .. } => String::new(),
        };
        let page = pages::ErrorPage {
            l: pages::Layout::bare(status.canonical_reason().unwrap_or("Error")),
            status: status.as_u16(),
            message,
        };
        html(status, &page)
    }
}

/// A 400 for a page address whose `name` holds a value the page does not offer.
pub(crate) fn unknown_choice<'a>(
    name: &str,
    value: &str,
    choices: impl Iterator<Item = &'a str>,
) -> ConsoleError {
    let shown: String = value.chars().take(40).collect();
    ConsoleError::Api(ApiError::BadRequest(format!(
        "This address asks for {name} \"{shown}\", which is not one of: {}.",
        choices.collect::<Vec<_>>().join(", ")
    )))
}

/// A 400 for a page address whose `name` cannot be read.
pub(crate) fn unreadable(name: &str) -> ConsoleError {
    ConsoleError::Api(ApiError::BadRequest(format!(
        "This address has a {name} the page cannot read; follow the page's own links instead."
    )))
}

/// What a user is told about a failed call (never internals).
fn describe(err: &ApiError) -> String {
    match err {
        ApiError::Validation(issues) => words::issues(issues),
        ApiError::Unexpected(_) => "Something went wrong on our side; it has been logged.".into(),
        other => other.to_string(),
    }
}

/// A rendered page.
fn html(status: StatusCode, page: &impl Template) -> HttpResponse {
    match page.render() {
        Ok(body) => HttpResponse::build(status)
            .insert_header((
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/html; charset=utf-8"),
            ))
            .body(body),
        Err(err) => {
            tracing::error!(error = %err, "console template failed");
            HttpResponse::InternalServerError().finish()
        }
    }
}

/// The outcome of a form, shown once on the next page.
#[derive(Debug, Clone)]
pub struct Flash {
    pub ok: bool,
    pub message: String,
}

const FLASH_COOKIE: &str = "keel_flash";

impl Flash {
    fn read(req: &HttpRequest) -> Option<Self> {
        let cookie = req.cookie(FLASH_COOKIE)?;
        let raw = hex::decode(cookie.value()).ok()?;
        let text = String::from_utf8(raw).ok()?;
        let (kind, message) = text.split_once(':')?;
        Some(Self {
            ok: kind == "ok",
            message: message.chars().take(500).collect(),
        })
    }

    fn cookie(&self) -> Cookie<'static> {
        let kind = if self.ok { "ok" } else { "error" };
        let message: String = self.message.chars().take(500).collect();
        let mut cookie = Cookie::new(FLASH_COOKIE, hex::encode(format!("{kind}:{message}")));
        cookie.set_path("/console");
        cookie.set_http_only(true);
        cookie.set_same_site(actix_web::cookie::SameSite::Strict);
        cookie
    }

    fn cleared() -> Cookie<'static> {
        let mut cookie = Cookie::new(FLASH_COOKIE, "");
        cookie.set_path("/console");
        cookie.make_removal();
        cookie
    }
}

/// After a form: back to `to`, with its outcome. A refused call (4xx) is shown on the page;
/// anything else is an error page.
fn after_form<T, E: Into<ApiError>>(
    to: &str,
    outcome: Result<T, E>,
    ok: impl FnOnce(T) -> String,
) -> Result<HttpResponse, ConsoleError> {
    let flash = match outcome.map_err(Into::into) {
        Ok(value) => Flash {
            ok: true,
            message: ok(value),
        },
        Err(err) if err.status_code().is_client_error() => Flash {
            ok: false,
            message: describe(&err),
        },
        Err(err) => return Err(err.into()),
    };
    Ok(redirect(to).cookie(flash.cookie()).finish())
}

fn redirect(to: &str) -> actix_web::HttpResponseBuilder {
    let mut builder = HttpResponse::SeeOther();
    builder.insert_header((header::LOCATION, to.to_owned()));
    builder
}

/// What the page that asks before a destructive action says.
pub struct Confirm {
    pub title: &'static str,
    pub question: String,
    /// What it acts on (the first 50 are listed, then a count).
    pub details: Vec<String>,
    /// The form's own action, posted again with `confirmed=yes`.
    pub action: String,
    pub button: &'static str,
    /// Where "Cancel" goes.
    pub back: String,
}

/// The second step of every destructive console form (stop, retry, requeue stale, pause): a
/// page that says what will happen and posts the same `fields` again with `confirmed=yes`.
/// Nothing has changed when it shows.
fn confirm_page(l: pages::Layout, confirm: Confirm, fields: Vec<(String, String)>) -> HttpResponse {
    const LISTED: usize = 50;
    let more = confirm.details.len().saturating_sub(LISTED);
    let mut details = confirm.details;
    details.truncate(LISTED);
    html(
        StatusCode::OK,
        &pages::ConfirmPage {
            l,
            question: confirm.question,
            details,
            more,
            action: confirm.action,
            fields,
            button: confirm.button.to_owned(),
            back: confirm.back,
        },
    )
}

/// A page, with the flash it showed cleared.
fn page(req: &HttpRequest, page: &impl Template) -> HttpResponse {
    let mut response = html(StatusCode::OK, page);
    if req.cookie(FLASH_COOKIE).is_some() {
        let _ = response.add_cookie(&Flash::cleared());
    }
    response
}

/// Whether the request asks only for the part of a page that refreshes itself.
fn wants_partial(req: &HttpRequest) -> bool {
    req.headers().contains_key("x-console-partial")
}

/// A submitted console form: its CSRF token, and its other fields, which parse and validate
/// as the JSON API's body for the same action (the same bounds, the same messages).
pub struct FormFields {
    csrf: String,
    fields: Vec<(String, String)>,
}

impl FormFields {
    fn parse(body: &[u8]) -> Self {
        let mut csrf = String::new();
        let mut fields = Vec::new();
        for (name, value) in form_urlencoded::parse(body) {
            match name.as_ref() {
                "csrf" => csrf = value.into_owned(),
                _ if value.trim().is_empty() => {}
                _ => fields.push((name.into_owned(), value.into_owned())),
            }
        }
        Self { csrf, fields }
    }

    /// Every value of a repeated field.
    fn all(&self, name: &str) -> Vec<&str> {
        self.fields
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.all(name).into_iter().next()
    }

    /// A field as a JSON number for an API body, or as the text it is (for that body's own
    /// 422) when it is not one; `None` when absent.
    fn number(&self, name: &str) -> Option<serde_json::Value> {
        self.get(name).map(|text| {
            text.trim()
                .parse::<i64>()
                .map_or_else(|_| serde_json::Value::from(text), serde_json::Value::from)
        })
    }

    /// The form carries the confirmation its destructive action asks for first.
    fn confirmed(&self) -> bool {
        self.get("confirmed") == Some("yes")
    }

    /// Its fields but the confirmation, as a confirmation page carries them on.
    fn carried(&self) -> Vec<(String, String)> {
        self.fields
            .iter()
            .filter(|(name, _)| name != "confirmed")
            .cloned()
            .collect()
    }

    /// The fields as the API's body `T` of organization `org_id`.
    fn body<T: serde::de::DeserializeOwned + crate::http::validate::Validate + utoipa::ToSchema>(
        &self,
        org_id: &OrgId,
    ) -> Result<T, ApiError> {
        self.parse_as(Some(org_id))
    }

    /// The fields as the API's body `T`, which names no organization.
    fn plain_body<T: serde::de::DeserializeOwned + crate::http::validate::Validate + utoipa::ToSchema>(
        &self,
    ) -> Result<T, ApiError> {
        self.parse_as(None)
    }

    fn parse_as<T: serde::de::DeserializeOwned + crate::http::validate::Validate + utoipa::ToSchema>(
        &self,
        org_id: Option<&str>,
    ) -> Result<T, ApiError> {
        let mut fields: Vec<(String, String)> = Vec::new();
        if let Some(org_id) = org_id {
            fields.push(("orgId".into(), org_id.to_owned()));
        }
        fields.extend(self.fields.iter().cloned());
        let mut query = form_urlencoded::Serializer::new(String::new());
        for (name, value) in &fields {
            query.append_pair(name, value);
        }
        let parsed: T = crate::http::extract::parse_query(&query.finish())?;
        // Held to the body's bounds, as the JSON API holds the same body.
        let value = crate::http::schemas::form_value(&T::name(), &fields);
        let issues = crate::http::schemas::bound_issues("query", &T::name(), &value);
        if issues.is_empty() {
            Ok(parsed)
        } else {
            Err(ApiError::Validation(issues))
        }
    }
}
