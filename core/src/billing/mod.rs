//! Prepaid billing: balances, payments, metering and idempotent charges.

pub(crate) mod actor;
pub mod auto_topup;
pub mod charges;
pub mod expiry;
pub mod ledger;
pub mod payments;
pub(crate) mod repo;
pub mod service;
pub mod statement;
pub mod topup_policy;
pub mod webhook;

use std::sync::Arc;

use sea_orm::DatabaseConnection;

use crate::config::{BillingSettings, PaymentSettings, PricingSettings};
use crate::domain::Cents;
use crate::metrics::Metrics;
use crate::orgs::adapters::AdapterDirectory;

/// What the billing flows need: the database, the ledger, the payment processor, the
/// adapters' cache (serving charges), the prices and the billing and payment settings.
#[derive(Clone)]
pub struct Billing {
    pub db: DatabaseConnection,
    pub(crate) ledger: actor::Ledger,
    pub payments: Arc<payments::Payments>,
    pub adapters: AdapterDirectory,
    pub settings: Arc<BillingSettings>,
    pub pricing: Arc<PricingSettings>,
    pub payment_settings: Arc<PaymentSettings>,
    pub metrics: Metrics,
    /// Cancelled when the process begins to shut down (ends the reconciler).
    pub stopping: tokio_util::sync::CancellationToken,
}

/// Why a billing flow did not happen.
#[derive(Debug, thiserror::Error)]
pub enum BillingError {
    #[error("organization not found")]
    OrgNotFound,
    #[error("saved payment method not found")]
    NoSavedCard,
    #[error("save a payment method before enabling auto top-up")]
    CardNeededForAutoTopup,
    #[error("save a payment method before topping up")]
    CardNeededForTopup,
    /// The client's Idempotency-Key already stands for a top-up of another amount.
    #[error(
        "this Idempotency-Key was used for a top-up of {first_cents} cents; use a new key for another amount"
    )]
    KeyReused { first_cents: Cents },
    /// The Idempotency-Key of a manual grant already stands for another grant.
    #[error("this Idempotency-Key was used for a grant with another body; use a new key for another grant")]
    GrantKeyReused,
    /// Not a month (`YYYY-MM`).
    #[error("month must be YYYY-MM")]
    NotAMonth,
    /// The processor declined the card (its message).
    #[error("{0}")]
    Declined(String),
    #[error("the card was declined (the first attempt with this Idempotency-Key)")]
    DeclinedBefore,
    #[error("the organization cannot cover the estimate: top up or save a card with auto top-up")]
    CannotCoverEstimate,
    #[error("the starter credit was already granted")]
    StarterCreditGranted,
    #[error("promo code not found")]
    UnknownPromoCode,
    #[error("promo code {0} was already redeemed by this organization")]
    PromoRedeemed(String),
    #[error("adapter not found")]
    AdapterNotFound,
    #[error("orgId does not match the adapter's owning organization")]
    AdapterOfAnotherOrg,
    #[error("model {0} is not priced")]
    ModelNotPriced(String),
    #[error(transparent)]
    Signature(#[from] webhook::SignatureError),
    /// A processor event that is not one keel can read.
    #[error("{0}")]
    InvalidEvent(&'static str),
    #[error(transparent)]
    Ledger(#[from] ledger::LedgerError),
    #[error(transparent)]
    Payment(#[from] payments::PaymentError),
    #[error(transparent)]
    Database(#[from] sea_orm::DbErr),
    #[error(transparent)]
    CachedDatabase(#[from] Arc<sea_orm::DbErr>),
}

pub use ledger::entry_data;
