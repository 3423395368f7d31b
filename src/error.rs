//! One error type for every route. 422 carries FastAPI's `detail` list; every other
//! error is `{"detail": "<reason>"}`. Unexpected failures are logged with their cause
//! chain and answered with a generic 500 that never carries internals or secrets.

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
}

/// Body of a 422.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct ValidationErrorBody {
    pub detail: Vec<ValidationIssue>,
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
    PaymentRequired(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("{1}")]
    Status(StatusCode, String),
    #[error("service unavailable: {0}")]
    Unavailable(String),
    #[error(transparent)]
    Unexpected(#[from] anyhow::Error),
}

impl ApiError {
    pub fn validation(loc: Vec<Value>, kind: &str, msg: impl Into<String>) -> Self {
        Self::Validation(vec![ValidationIssue::new(loc, kind, msg)])
    }

    pub fn not_found(what: &str) -> Self {
        Self::NotFound(format!("{what} not found"))
    }

    /// A database error shared by the callers of one look-up (`cache::LoadCache`).
    pub fn database(err: std::sync::Arc<sea_orm::DbErr>) -> Self {
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
        match self {
            Self::Validation(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            Self::PaymentRequired(_) => StatusCode::PAYMENT_REQUIRED,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Conflict(_) => StatusCode::CONFLICT,
            Self::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Status(status, _) => *status,
            Self::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Unexpected(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let status = self.status_code();
        match self {
            Self::Validation(issues) => HttpResponse::build(status).json(ValidationErrorBody {
                detail: issues.clone(),
            }),
            Self::Unexpected(err) => {
                tracing::error!(error = ?err, "request failed");
                HttpResponse::build(status).json(ErrorBody {
                    detail: "internal server error".into(),
                })
            }
            other => HttpResponse::build(status).json(ErrorBody {
                detail: other.to_string(),
            }),
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
        let (kind, code) = match status.as_u16() {
            400 if message.starts_with("missing required header") => {
                ("invalid_request_error", "missing_header")
            }
            400 | 422 => ("invalid_request_error", "invalid_request"),
            401 => ("authentication_error", "invalid_api_key"),
            403 => ("permission_error", "forbidden"),
            404 => ("invalid_request_error", "not_found"),
            413 => ("invalid_request_error", "payload_too_large"),
            502 => ("api_error", "upstream_unreachable"),
            504 => ("api_error", "upstream_timeout"),
            503 => ("api_error", "unavailable"),
            _ => ("api_error", "internal_error"),
        };
        HttpResponse::build(status).json(serde_json::json!({
            "detail": message,
            "error": {"message": message, "type": kind, "param": null, "code": code},
        }))
    }
}

// What each domain's errors are on the wire: one place for every status.

use keel_core::billing::ledger::LedgerError;
use keel_core::billing::payments::PaymentError;
use keel_core::billing::BillingError;
use keel_core::evals::EvalError;
use keel_core::flash::FlashError;
use keel_core::orgs::OrgError;
use keel_core::projects::ProjectError;
use keel_core::queue::actor::QueueError;
use keel_core::queue::JobError;
use keel_core::runs::RunError;
use keel_core::serving::ServingError;
use keel_core::traces::TraceError;

impl From<LedgerError> for ApiError {
    fn from(err: LedgerError) -> Self {
        match err {
            LedgerError::InsufficientFunds { .. } => ApiError::PaymentRequired(err.to_string()),
            LedgerError::UnknownOrg => ApiError::not_found("organization"),
            LedgerError::Duplicate => ApiError::Conflict("already applied to this organization".into()),
            LedgerError::Locked | LedgerError::Contended => ApiError::Unavailable(
                "this organization's balance is held by another session right now; retry with the same Idempotency-Key"
                    .into(),
            ),
            LedgerError::Unavailable(reason) => {
                tracing::error!(%reason, "ledger unavailable");
                ApiError::Unavailable("the ledger is unavailable; retry with the same idempotency key".into())
            }
        }
    }
}

impl From<PaymentError> for ApiError {
    fn from(err: PaymentError) -> Self {
        match err {
            PaymentError::Declined { message, .. } => ApiError::PaymentRequired(message),
            PaymentError::NotFound => ApiError::not_found("payment method"),
            PaymentError::Processor(reason) => {
                tracing::error!(%reason, "payment processor error");
                ApiError::Status(
                    StatusCode::BAD_GATEWAY,
                    "the payment processor is unavailable".into(),
                )
            }
        }
    }
}

impl From<BillingError> for ApiError {
    fn from(err: BillingError) -> Self {
        use BillingError as E;
        match err {
            E::Ledger(err) => err.into(),
            E::Payment(err) => err.into(),
            E::Database(err) => err.into(),
            E::CachedDatabase(err) => ApiError::database(err),
            E::OrgNotFound
            | E::NoSavedCard
            | E::UnknownPromoCode
            | E::AdapterNotFound
            | E::ModelNotPriced(_) => ApiError::NotFound(err.to_string()),
            E::CardNeededForAutoTopup
            | E::CardNeededForTopup
            | E::KeyReused { .. }
            | E::StarterCreditGranted
            | E::PromoRedeemed(_)
            | E::AdapterOfAnotherOrg => ApiError::Conflict(err.to_string()),
            E::Declined(_) | E::DeclinedBefore | E::CannotCoverEstimate => {
                ApiError::PaymentRequired(err.to_string())
            }
            E::Signature(_) | E::InvalidEvent(_) => ApiError::BadRequest(err.to_string()),
        }
    }
}

impl From<QueueError> for ApiError {
    fn from(err: QueueError) -> Self {
        tracing::error!(error = &err as &dyn std::error::Error, "queue unavailable");
        ApiError::Unavailable("the queue is unavailable; retry".into())
    }
}

impl From<JobError> for ApiError {
    fn from(err: JobError) -> Self {
        match err {
            JobError::NotFound => ApiError::NotFound(err.to_string()),
            JobError::AlreadyEnded(_) => ApiError::Conflict(err.to_string()),
            JobError::SecretsUnconfigured => ApiError::Unavailable(err.to_string()),
            JobError::Sealing(err) => ApiError::Unexpected(err),
            JobError::Queue(err) => err.into(),
            JobError::Database(err) => err.into(),
        }
    }
}

impl From<TraceError> for ApiError {
    fn from(err: TraceError) -> Self {
        match err {
            TraceError::ProjectNotFound => ApiError::NotFound(err.to_string()),
            TraceError::SelectionTooLarge { .. } => ApiError::validation(
                vec![Value::from("body"), Value::from("traceIds")],
                "too_large",
                err.to_string(),
            ),
            TraceError::Serialize(err) => ApiError::Unexpected(err.into()),
            TraceError::Database(err) => err.into(),
        }
    }
}

impl From<OrgError> for ApiError {
    fn from(err: OrgError) -> Self {
        match err {
            OrgError::OrgNotFound | OrgError::AdapterNotFound | OrgError::KeyNotFound => {
                ApiError::NotFound(err.to_string())
            }
            OrgError::SlugTaken(_) | OrgError::NoFreeSlug => ApiError::Conflict(err.to_string()),
            OrgError::Database(err) => err.into(),
        }
    }
}

impl From<ProjectError> for ApiError {
    fn from(err: ProjectError) -> Self {
        match err {
            ProjectError::NotFound => ApiError::NotFound(err.to_string()),
            ProjectError::SlugTaken(_) | ProjectError::NoFreeSlug => ApiError::Conflict(err.to_string()),
            ProjectError::Database(err) => err.into(),
        }
    }
}

impl From<RunError> for ApiError {
    fn from(err: RunError) -> Self {
        match err {
            RunError::RunNotFound | RunError::ProjectNotFound => ApiError::NotFound(err.to_string()),
            RunError::Database(err) => err.into(),
        }
    }
}

impl From<EvalError> for ApiError {
    fn from(err: EvalError) -> Self {
        match err {
            EvalError::ProjectNotFound => ApiError::NotFound(err.to_string()),
            EvalError::Database(err) => err.into(),
        }
    }
}

impl From<FlashError> for ApiError {
    fn from(err: FlashError) -> Self {
        match err {
            FlashError::ProjectNotActive | FlashError::EnvironmentNotFound | FlashError::OrgNotFound => {
                ApiError::NotFound(err.to_string())
            }
            FlashError::Changed(_)
            | FlashError::OtherOrgsEnvironment
            | FlashError::OtherProjectsRun
            | FlashError::OtherProjectsCheckpoint => ApiError::Conflict(err.to_string()),
            FlashError::EventNotAllowed { .. } => ApiError::validation(
                vec![Value::from("body"), Value::from("event")],
                "literal_error",
                err.to_string(),
            ),
            FlashError::Database(err) => err.into(),
        }
    }
}

impl From<ServingError> for ApiError {
    fn from(err: ServingError) -> Self {
        match err {
            ServingError::NotOwner => ApiError::Forbidden(err.to_string()),
            ServingError::UnknownModel => ApiError::NotFound(err.to_string()),
            ServingError::InvalidApiKey => ApiError::Unauthorized(err.to_string()),
            ServingError::NotConfigured => ApiError::Unavailable(err.to_string()),
            ServingError::Database(err) => err.into(),
            ServingError::CachedDatabase(err) => ApiError::database(err),
        }
    }
}
