//! The console's failure: answered as a page (`respond`), or, signed out, as a way back to
//! the sign-in form; and the words a user is told about a refused call.

use crate::error::ApiError;

use super::words;

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
    keel_core::traces::push::PushError,
    keel_core::traces::settings::SettingsError,
    keel_core::evals::EvalError,
    keel_core::runs::RunError,
);

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
pub(crate) fn describe(err: &ApiError) -> String {
    match err {
        ApiError::Validation(issues) => words::issues(issues),
        ApiError::Unexpected(_) => "Something went wrong on our side; it has been logged.".into(),
        other => other.to_string(),
    }
}
