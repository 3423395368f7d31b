//! Prepaid billing: balances, payments, metering and idempotent charges.

pub mod actor;
pub mod auto_topup;
pub mod charges;
pub mod dto;
pub mod ledger;
pub mod payments;
pub mod repo;
pub mod routes;
pub mod service;
pub mod webhook;

use crate::error::ApiError;
use ledger::LedgerError;

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

impl From<payments::PaymentError> for ApiError {
    fn from(err: payments::PaymentError) -> Self {
        match err {
            payments::PaymentError::Declined { message, .. } => ApiError::PaymentRequired(message),
            payments::PaymentError::NotFound => ApiError::not_found("payment method"),
            payments::PaymentError::Processor(reason) => {
                tracing::error!(%reason, "payment processor error");
                ApiError::Status(
                    actix_web::http::StatusCode::BAD_GATEWAY,
                    "the payment processor is unavailable".into(),
                )
            }
        }
    }
}
