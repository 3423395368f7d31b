//! One error type for every route. 422 carries FastAPI's `detail` list; every other
//! error is `{"detail": "<reason>"}`; both carry a stable machine `code` (`codes`), which
//! decides the status. Unexpected failures are logged with their cause chain and answered
//! with a generic 500 that never carries internals or secrets.

pub mod codes;
mod domain;

pub use codes::Code;

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde::Serialize;
use serde_json::Value;

/// One item of a 422 `detail` list, shaped like FastAPI's (pydantic v2) errors.
#[derive(Debug, Clone, Serialize, PartialEq, utoipa::ToSchema)]
pub struct ValidationIssue {
    /// Where the problem is: `["body", "field", 0, ...]`, `["query", "limit"]`, `["path", "id"]`.
    #[schema(value_type = Vec<LocItem>)]
    pub loc: Vec<Value>,
    pub msg: String,
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub ctx: Option<Value>,
}

impl ValidationIssue {
    pub fn new(loc: Vec<Value>, kind: &str, msg: impl Into<String>) -> Self {
        Self {
            loc,
            msg: msg.into(),
            kind: kind.to_owned(),
            ctx: None,
        }
    }

    /// A value that is none of `allowed` (pydantic's `literal_error`).
    pub fn not_one_of(loc: Vec<Value>, allowed: &[&str]) -> Self {
        let quoted: Vec<String> = allowed.iter().map(|a| format!("'{a}'")).collect();
        let expected = match quoted.split_last() {
            None => String::new(),
            Some((last, [])) => last.clone(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
        };
        Self::new(loc, "literal_error", format!("Input should be {expected}"))
            .with_ctx(serde_json::json!({ "expected": expected }))
    }

    pub fn with_ctx(mut self, ctx: Value) -> Self {
        self.ctx = Some(ctx);
        self
    }
}

/// One step of a 422 `loc`: a field or parameter name, or a list index (the schema only:
/// `loc` is built as JSON values).
#[derive(Serialize, utoipa::ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum LocItem {
    Name(String),
    Index(u64),
}

/// Body of every non-422 error.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub detail: String,
    pub code: Code,
}

impl ErrorBody {
    pub fn new(code: Code, detail: impl Into<String>) -> Self {
        Self {
            detail: detail.into(),
            code,
        }
    }
}

/// Body of a 422 (`code` is always `validation_failed`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ValidationErrorBody {
    pub detail: Vec<ValidationIssue>,
    pub code: Code,
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("validation failed")]
    Validation(Vec<ValidationIssue>),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("service unavailable: {0}")]
    Unavailable(String),
    /// An error with a code of its own; `detail` is the text as given.
    #[error("{1}")]
    Coded(Code, String),
    /// A limit refused the call: 429 with `Retry-After` (seconds).
    #[error("{detail}")]
    Limited { detail: String, retry_after_secs: u64 },
    /// This instance is shutting down, or its claims waited past the lock timeout: 503
    /// `unavailable` with `Retry-After` (seconds), so a client pauses (or goes to another
    /// instance) instead of asking again at once.
    #[error("service unavailable: {detail}")]
    Draining { detail: String, retry_after_secs: u64 },
    #[error(transparent)]
    Unexpected(#[from] anyhow::Error),
}

impl ApiError {
    pub fn validation(loc: Vec<Value>, kind: &str, msg: impl Into<String>) -> Self {
        Self::Validation(vec![ValidationIssue::new(loc, kind, msg)])
    }

    /// "`what` not found", with the code of that kind of thing.
    pub fn not_found(what: &str) -> Self {
        let code = match what {
            "organization" => Code::OrganizationNotFound,
            "project" => Code::ProjectNotFound,
            "job" => Code::JobNotFound,
            "run" => Code::RunNotFound,
            "adapter" => Code::AdapterNotFound,
            "API key" => Code::ApiKeyNotFound,
            "payment method" | "saved payment method" => Code::PaymentMethodNotFound,
            "promo code" => Code::PromoCodeNotFound,
            _ => Code::NotFound,
        };
        Self::Coded(code, format!("{what} not found"))
    }

    /// A 503 with its own code; `detail` reads as every 503's ("service unavailable: ...").
    pub fn unavailable(code: Code, reason: &str) -> Self {
        Self::Coded(code, format!("service unavailable: {reason}"))
    }

    /// The machine code of this error.
    pub fn code(&self) -> Code {
        match self {
            Self::Validation(_) => Code::ValidationFailed,
            Self::BadRequest(_) => Code::BadRequest,
            Self::Unauthorized(_) => Code::Unauthenticated,
            Self::Forbidden(_) => Code::Forbidden,
            Self::NotFound(_) => Code::NotFound,
            Self::Conflict(_) => Code::Conflict,
            Self::PayloadTooLarge(_) => Code::PayloadTooLarge,
            Self::Unavailable(_) | Self::Draining { .. } => Code::Unavailable,
            Self::Coded(code, _) => *code,
            Self::Limited { .. } => Code::RateLimitExceeded,
            Self::Unexpected(_) => Code::InternalError,
        }
    }

    /// An answer of `status` with the headers this error carries (a limit's `Retry-After`).
    fn reply(&self, status: StatusCode) -> actix_web::HttpResponseBuilder {
        let mut reply = HttpResponse::build(status);
        if let Self::Limited { retry_after_secs, .. } | Self::Draining { retry_after_secs, .. } = self {
            reply.insert_header((actix_web::http::header::RETRY_AFTER, retry_after_secs.to_string()));
        }
        reply
    }

    /// A database error shared by the callers of one look-up (`cache::LoadCache`): an
    /// unreachable database is a 503 to retry, as on every other route.
    pub fn database(err: std::sync::Arc<sea_orm::DbErr>) -> Self {
        if database_unreachable(&err) {
            tracing::warn!(error = %err, "database unreachable");
            return Self::Unavailable("the database is unreachable; retry".into());
        }
        Self::Unexpected(anyhow::Error::new(err).context("database"))
    }
}

impl From<sea_orm::DbErr> for ApiError {
    fn from(err: sea_orm::DbErr) -> Self {
        if database_unreachable(&err) {
            tracing::warn!(error = %err, "database unreachable");
            return Self::Unavailable("the database is unreachable; retry".into());
        }
        Self::Unexpected(anyhow::Error::new(err).context("database"))
    }
}

/// Whether `err` says the database could not be reached (no pooled connection within
/// `database.acquire_timeout_secs`, a connection lost): a 503 to retry, not a 500.
pub fn database_unreachable(err: &sea_orm::DbErr) -> bool {
    use sea_orm::{DbErr, RuntimeErr};
    match err {
        DbErr::ConnectionAcquire(_) | DbErr::Conn(_) => true,
        DbErr::Exec(RuntimeErr::SqlxError(err)) | DbErr::Query(RuntimeErr::SqlxError(err)) => matches!(
            err.as_ref(),
            sea_orm::sqlx::Error::Io(_)
                | sea_orm::sqlx::Error::PoolTimedOut
                | sea_orm::sqlx::Error::PoolClosed
                | sea_orm::sqlx::Error::WorkerCrashed
        ),
        _ => false,
    }
}

impl From<sea_orm::TransactionError<ApiError>> for ApiError {
    fn from(err: sea_orm::TransactionError<ApiError>) -> Self {
        match err {
            sea_orm::TransactionError::Connection(db) => db.into(),
            sea_orm::TransactionError::Transaction(api) => api,
        }
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.code().status()
    }

    fn error_response(&self) -> HttpResponse {
        let status = self.status_code();
        let code = self.code();
        match self {
            Self::Validation(issues) => HttpResponse::build(status).json(ValidationErrorBody {
                detail: issues.clone(),
                code,
            }),
            Self::Unexpected(err) => {
                tracing::error!(error = ?err, "request failed");
                HttpResponse::build(status).json(ErrorBody::new(code, "internal server error"))
            }
            Self::Limited { detail, .. } => self.reply(status).json(ErrorBody::new(code, detail.clone())),
            Self::Draining { .. } => self.reply(status).json(ErrorBody::new(code, self.to_string())),
            other => HttpResponse::build(status).json(ErrorBody::new(code, other.to_string())),
        }
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

impl ApiError {
    /// The answer under `/v1`: the contract's `detail` beside OpenAI's `error` object, which
    /// the OpenAI SDKs read and show (`{"message", "type", "param", "code"}`).
    pub fn openai_response(&self) -> HttpResponse {
        use actix_web::ResponseError;
        let status = self.status_code();
        let message = match self {
            Self::Unexpected(err) => {
                tracing::error!(error = ?err, "request failed");
                "internal server error".to_owned()
            }
            Self::Validation(issues) => issues
                .first()
                .map_or_else(|| "the request is not valid".to_owned(), |i| i.msg.clone()),
            other => other.to_string(),
        };
        let kind = match status.as_u16() {
            400 | 404 | 413 | 422 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            429 => "rate_limit_exceeded",
            _ => "api_error",
        };
        let code = self.code();
        self.reply(status).json(serde_json::json!({
            "detail": message,
            "code": code,
            "error": {"message": message, "type": kind, "param": null, "code": code},
        }))
    }
}
