//! How a console handler answers: a rendered page, a redirect after a form with its outcome,
//! the confirmation a destructive form asks first, and an error as a page.

use actix_web::cookie::Cookie;
use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse, ResponseError};
use askama::Template;

use crate::error::ApiError;

use super::error::{describe, ConsoleError};
use super::forms::{Flash, FLASH_COOKIE};
use super::{pages, session};

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

/// A rendered page.
pub(crate) fn html(status: StatusCode, page: &impl Template) -> HttpResponse {
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

/// After a form: back to `to`, with its outcome. A refused call (4xx) is shown on the page;
/// anything else is an error page.
pub(crate) fn after_form<T, E: Into<ApiError>>(
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

pub(crate) fn redirect(to: &str) -> actix_web::HttpResponseBuilder {
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
pub(crate) fn confirm_page(
    l: pages::Layout,
    confirm: Confirm,
    fields: Vec<(String, String)>,
) -> HttpResponse {
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
pub(crate) fn page(req: &HttpRequest, page: &impl Template) -> HttpResponse {
    let mut response = html(StatusCode::OK, page);
    if req.cookie(FLASH_COOKIE).is_some() {
        let _ = response.add_cookie(&Flash::cleared());
    }
    response
}

/// Whether the request asks only for the part of a page that refreshes itself.
pub(crate) fn wants_partial(req: &HttpRequest) -> bool {
    req.headers().contains_key("x-console-partial")
}
