//! What each domain's errors are on the wire: its code (and so its status), in one place.
//! `detail` is the error's own words.

use serde_json::Value;

use super::{ApiError, Code, ValidationIssue};

use keel_core::billing::ledger::LedgerError;
use keel_core::billing::payments::PaymentError;
use keel_core::billing::BillingError;
use keel_core::evals::EvalError;
use keel_core::flash::FlashError;
use keel_core::keys::limiter::Limited;
use keel_core::keys::KeyError;
use keel_core::orgs::OrgError;
use keel_core::projects::ProjectError;
use keel_core::queue::JobError;
use keel_core::queue::QueueError;
use keel_core::runs::RunError;
use keel_core::serving::ServingError;
use keel_core::traces::TraceError;
use keel_core::webhooks::WebhookError;

/// How long a worker that asked a draining instance for jobs is told to wait.
pub const DRAINING_RETRY_AFTER_SECS: u64 = 5;

/// An error whose `detail` is its own words, with `code`.
fn coded(code: Code, err: impl std::fmt::Display) -> ApiError {
    ApiError::Coded(code, err.to_string())
}

impl From<LedgerError> for ApiError {
    fn from(err: LedgerError) -> Self {
        match err {
            LedgerError::InsufficientFunds { .. } => coded(Code::InsufficientBalance, err),
            LedgerError::UnknownOrg => ApiError::not_found("organization"),
            LedgerError::Duplicate => coded(Code::AlreadyApplied, "already applied to this organization"),
            LedgerError::Locked | LedgerError::Contended => ApiError::unavailable(
                Code::BalanceLocked,
                "this organization's balance is held by another session right now; retry with the same Idempotency-Key",
            ),
            LedgerError::Unavailable(reason) => {
                tracing::error!(%reason, "ledger unavailable");
                ApiError::unavailable(
                    Code::LedgerUnavailable,
                    "the ledger is unavailable; retry with the same idempotency key",
                )
            }
        }
    }
}

impl From<PaymentError> for ApiError {
    fn from(err: PaymentError) -> Self {
        match err {
            PaymentError::Declined { message, .. } => coded(Code::CardDeclined, message),
            PaymentError::NotFound => ApiError::not_found("payment method"),
            PaymentError::Processor(reason) => {
                tracing::error!(%reason, "payment processor error");
                coded(
                    Code::PaymentProcessorUnavailable,
                    "the payment processor is unavailable",
                )
            }
        }
    }
}

impl From<BillingError> for ApiError {
    fn from(err: BillingError) -> Self {
        use BillingError as E;
        let code = match &err {
            E::Ledger(_) | E::Payment(_) | E::Database(_) | E::CachedDatabase(_) | E::NotAMonth => None,
            E::OrgNotFound => Some(Code::OrganizationNotFound),
            E::NoSavedCard => Some(Code::PaymentMethodNotFound),
            E::UnknownPromoCode => Some(Code::PromoCodeNotFound),
            E::AdapterNotFound => Some(Code::AdapterNotFound),
            E::ModelNotPriced(_) => Some(Code::ModelNotPriced),
            E::CardNeededForAutoTopup | E::CardNeededForTopup => Some(Code::PaymentMethodRequired),
            E::KeyReused { .. } | E::GrantKeyReused => Some(Code::IdempotencyKeyReused),
            E::StarterCreditGranted | E::PromoRedeemed(_) => Some(Code::AlreadyApplied),
            E::AdapterOfAnotherOrg => Some(Code::AdapterOrganizationMismatch),
            E::Declined(_) | E::DeclinedBefore => Some(Code::CardDeclined),
            E::CannotCoverEstimate => Some(Code::CannotCoverEstimate),
            E::Signature(_) => Some(Code::InvalidSignature),
            E::InvalidEvent(_) => Some(Code::InvalidEvent),
        };
        if let Some(code) = code {
            return coded(code, err);
        }
        match err {
            E::Ledger(err) => err.into(),
            E::Payment(err) => err.into(),
            E::Database(err) => err.into(),
            E::CachedDatabase(err) => ApiError::database(err),
            E::NotAMonth => ApiError::validation(
                vec!["query".into(), "month".into()],
                "value_error",
                "month must be YYYY-MM",
            ),
            _ => ApiError::Unexpected(anyhow::anyhow!("unmapped billing error")),
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
            JobError::NotFound => coded(Code::JobNotFound, err),
            JobError::AlreadyEnded(_) => coded(Code::JobEnded, err),
            JobError::NotRetryable(_)
            | JobError::DependencyBroken { .. }
            | JobError::UniqueKeyTaken { .. } => coded(Code::JobNotRetryable, err),
            JobError::DependencyNotFound { .. } => coded(Code::DependencyNotFound, err),
            // A batch's item too: the schema cannot say which projects exist (a 404 as for one
            // job, its message naming the item).
            JobError::ProjectNotFound { .. } => coded(Code::ProjectNotFound, err),
            JobError::DatasetNotFound { .. } => coded(Code::DatasetNotFound, err),
            JobError::IdempotencyKeyReused => coded(Code::IdempotencyKeyReused, err),
            JobError::OrgNotFound => coded(Code::OrganizationNotFound, err),
            JobError::SecretsUnconfigured => {
                ApiError::unavailable(Code::SecretsNotConfigured, &err.to_string())
            }
            JobError::Sealing(err) => ApiError::Unexpected(err),
            JobError::Draining | JobError::Busy => ApiError::Draining {
                detail: err.to_string(),
                retry_after_secs: DRAINING_RETRY_AFTER_SECS,
            },
            JobError::Queue(err) => err.into(),
            JobError::Database(err) => err.into(),
        }
    }
}

impl From<TraceError> for ApiError {
    fn from(err: TraceError) -> Self {
        match err {
            TraceError::ProjectNotFound => coded(Code::ProjectNotFound, err),
            TraceError::TraceNotFound => coded(Code::TraceNotFound, err),
            TraceError::TooManyMarks { what, .. } => ApiError::validation(
                vec![
                    Value::from("body"),
                    Value::from(if what == "tags" { "add" } else { "value" }),
                ],
                "too_long",
                err.to_string(),
            ),
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
            OrgError::OrgNotFound => coded(Code::OrganizationNotFound, err),
            OrgError::AdapterNotFound => coded(Code::AdapterNotFound, err),
            OrgError::SlugTaken(_) | OrgError::NoFreeSlug => coded(Code::SlugTaken, err),
            OrgError::Database(err) => err.into(),
        }
    }
}

impl From<KeyError> for ApiError {
    fn from(err: KeyError) -> Self {
        match err {
            KeyError::NotFound => coded(Code::ApiKeyNotFound, err),
            KeyError::OrgNotFound => coded(Code::OrganizationNotFound, err),
            KeyError::ExpiryInPast => ApiError::validation(
                vec![Value::from("body"), Value::from("expiresAt")],
                "value_error",
                "expiresAt must be in the future",
            ),
            KeyError::Database(err) => err.into(),
        }
    }
}

impl From<Limited> for ApiError {
    fn from(err: Limited) -> Self {
        match err {
            Limited::Refused(refusal) => ApiError::Limited {
                detail: refusal.message(),
                retry_after_secs: refusal.retry_after_secs,
            },
            Limited::Database(err) => err.into(),
        }
    }
}

impl From<ProjectError> for ApiError {
    fn from(err: ProjectError) -> Self {
        match err {
            ProjectError::NotFound => coded(Code::ProjectNotFound, err),
            ProjectError::SlugTaken(_) | ProjectError::NoFreeSlug => coded(Code::SlugTaken, err),
            ProjectError::Database(err) => err.into(),
        }
    }
}

impl From<RunError> for ApiError {
    fn from(err: RunError) -> Self {
        match err {
            RunError::RunNotFound => coded(Code::RunNotFound, err),
            RunError::ProjectNotFound => coded(Code::ProjectNotFound, err),
            RunError::Database(err) => err.into(),
        }
    }
}

impl From<keel_core::queue::schedules::ScheduleError> for ApiError {
    fn from(err: keel_core::queue::schedules::ScheduleError) -> Self {
        use keel_core::queue::schedules::ScheduleError as E;
        match err {
            E::NotFound => coded(Code::ScheduleNotFound, err),
            E::LimitReached => coded(Code::ScheduleLimitReached, err),
            // The body's fault: a 422 naming the field.
            E::Cadence(cadence) => ApiError::validation(
                vec!["body".into(), cadence.field().into()],
                "value_error",
                format!("Value error, {cadence}"),
            ),
            E::JobOrgMismatch => ApiError::validation(
                vec!["body".into(), "job".into(), "orgId".into()],
                "value_error",
                format!("Value error, {err}"),
            ),
            E::Job(err) => err.into(),
            E::Database(err) => err.into(),
        }
    }
}

impl From<keel_core::datasets::DatasetError> for ApiError {
    fn from(err: keel_core::datasets::DatasetError) -> Self {
        use keel_core::datasets::DatasetError as E;
        match err {
            E::ProjectNotFound => coded(Code::ProjectNotFound, err),
            E::DatasetNotFound | E::VersionNotFound => coded(Code::DatasetNotFound, err),
            E::JobNotFound => coded(Code::JobNotFound, err),
            E::JobNotHeld => coded(Code::JobNotHeld, err),
            E::NameTaken(_) => coded(Code::DatasetNameTaken, err),
            E::InUse(_) => coded(Code::DatasetInUse, err),
            E::Concurrent => coded(Code::Conflict, err),
            // The listed ids are the body's fault: a 422 naming the field.
            E::UnknownTraces(_) => ApiError::validation(
                vec!["body".into(), "traceIds".into()],
                "value_error",
                format!("Value error, {err}"),
            ),
            E::Database(err) => err.into(),
        }
    }
}

impl From<EvalError> for ApiError {
    fn from(err: EvalError) -> Self {
        match err {
            EvalError::ProjectNotFound => coded(Code::ProjectNotFound, err),
            EvalError::Database(err) => err.into(),
        }
    }
}

impl From<FlashError> for ApiError {
    fn from(err: FlashError) -> Self {
        match err {
            FlashError::ProjectNotActive => coded(Code::ProjectNotFound, err),
            FlashError::EnvironmentNotFound => coded(Code::EnvironmentNotFound, err),
            FlashError::OrgNotFound => coded(Code::OrganizationNotFound, err),
            FlashError::Changed(_)
            | FlashError::OtherOrgsEnvironment
            | FlashError::OtherProjectsRun
            | FlashError::OtherProjectsCheckpoint => coded(Code::MirrorConflict, err),
            // Refused as a bound of the body: the same 422 as any other value out of its set.
            FlashError::EventNotAllowed { allowed } => {
                let allowed: Vec<&str> = allowed.iter().map(String::as_str).collect();
                ApiError::Validation(vec![ValidationIssue::not_one_of(
                    vec![Value::from("body"), Value::from("event")],
                    &allowed,
                )])
            }
            FlashError::Database(err) => err.into(),
        }
    }
}

impl From<ServingError> for ApiError {
    fn from(err: ServingError) -> Self {
        match err {
            ServingError::NotOwner => coded(Code::AdapterNotOwned, err),
            ServingError::UnknownModel => coded(Code::AdapterNotFound, err),
            ServingError::InvalidApiKey => coded(Code::InvalidApiKey, err),
            ServingError::ScopeNotAllowed => coded(Code::ScopeNotAllowed, err),
            ServingError::ModelNotAllowed(_) => coded(Code::ModelNotAllowed, err),
            ServingError::Limited(limited) => limited.into(),
            ServingError::NotConfigured => {
                ApiError::unavailable(Code::ServingLayerNotConfigured, &err.to_string())
            }
            ServingError::Database(err) => err.into(),
            ServingError::CachedDatabase(err) => ApiError::database(err),
        }
    }
}

impl From<keel_core::traces::push::PushError> for ApiError {
    fn from(err: keel_core::traces::push::PushError) -> Self {
        use keel_core::traces::push::PushError;
        let at = |path: &[&str]| {
            let mut loc = vec![Value::from("body"), Value::from("otlpExport")];
            loc.extend(path.iter().map(|p| Value::from(*p)));
            loc
        };
        match err {
            // A destination keel will not call is the endpoint's fault: a 422 naming it.
            PushError::Destination(refused) => ApiError::Validation(vec![ValidationIssue::new(
                at(&["endpoint"]),
                "value_error",
                refused.to_string(),
            )]),
            PushError::Header { ref name, reason } => ApiError::Validation(vec![ValidationIssue::new(
                at(&["headers", name.as_str()]),
                "value_error",
                reason,
            )]),
            PushError::SecretsUnconfigured => {
                ApiError::unavailable(Code::SecretsNotConfigured, &err.to_string())
            }
            PushError::Sealing(err) => ApiError::Unexpected(err),
            PushError::Database(err) => err.into(),
        }
    }
}

impl From<keel_core::traces::settings::SettingsError> for ApiError {
    fn from(err: keel_core::traces::settings::SettingsError) -> Self {
        match err {
            keel_core::traces::settings::SettingsError::Project(err) => err.into(),
            keel_core::traces::settings::SettingsError::Push(err) => err.into(),
        }
    }
}

impl From<WebhookError> for ApiError {
    fn from(err: WebhookError) -> Self {
        match err {
            WebhookError::NotFound(what) => ApiError::not_found(what),
            // A destination keel will not call is the URL's fault: a 422 naming it.
            WebhookError::Destination(refused) => ApiError::Validation(vec![ValidationIssue::new(
                vec![Value::from("body"), Value::from("url")],
                "value_error",
                refused.to_string(),
            )]),
            WebhookError::SecretsUnconfigured => {
                ApiError::unavailable(Code::SecretsNotConfigured, &err.to_string())
            }
            WebhookError::Sealing(err) => ApiError::Unexpected(err),
            WebhookError::EndpointLimit(_) => coded(Code::EndpointLimitReached, err),
            WebhookError::TestsLimited { retry_after_secs } => ApiError::Limited {
                detail: err.to_string(),
                retry_after_secs,
            },
            WebhookError::DeliveryInFlight => coded(Code::DeliveryInFlight, err),
            WebhookError::Database(err) => err.into(),
        }
    }
}
