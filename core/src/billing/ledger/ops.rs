//! What callers hand the ledger and what it answers.

pub use crate::domain::EntryKind;
use std::sync::Arc;

use serde::Serialize;

use crate::domain::{Cents, IdempotencyKey, Microcents, OrgId};

/// What a repeated idempotency key means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnDuplicate {
    /// Answer the original change again (`replayed: true`).
    Replay,
    /// Refuse the repeat (409): a one-time grant.
    Conflict,
}

/// Rows written with the entry, in the same transaction.
#[derive(Debug, Clone)]
pub enum SideEffect {
    None,
    ServingUsage(ServingUsageRow),
    PromoGrant {
        code: String,
        cents: Cents,
    },
    StarterCredit,
    /// The credit of an auto top-up: ends the one in flight and clears the declines.
    AutoTopupCredited,
    /// Ends a grant: its remainder (found when planned) becomes an `expiry` entry.
    Expire {
        grant_id: String,
    },
}

/// What a credit's grant is, beyond its amount (all optional: the kind follows the entry's,
/// the priority the policy's default for the kind, and it never expires).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GrantTerms {
    pub kind: Option<crate::domain::GrantKind>,
    pub priority: Option<i32>,
    pub expires_at: Option<chrono::DateTime<chrono::Utc>>,
    /// A manual grant's maker (the internal key's label), key and body hash.
    pub created_by: Option<String>,
    pub idempotency_key: Option<String>,
    pub request_hash: Option<String>,
}

/// Default grant priorities (lower is drawn first) and the low-balance threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LedgerPolicy {
    /// `billing.balance.low` is sent under this, for organizations without an auto top-up
    /// threshold of their own.
    pub low_balance: Cents,
    /// Starter credit, promo codes and manual grants.
    pub promotional_priority: i32,
    /// Top-ups, auto top-ups, refunds and migrated balances.
    pub paid_priority: i32,
}

impl Default for LedgerPolicy {
    fn default() -> Self {
        Self {
            low_balance: Cents(1000),
            promotional_priority: 10,
            paid_priority: 50,
        }
    }
}

impl LedgerPolicy {
    pub fn priority(&self, kind: crate::domain::GrantKind) -> i32 {
        use crate::domain::GrantKind;
        match kind {
            GrantKind::Starter | GrantKind::Promo | GrantKind::Manual => self.promotional_priority,
            GrantKind::Topup | GrantKind::AutoTopup | GrantKind::Refund | GrantKind::Migrated => {
                self.paid_priority
            }
        }
    }
}

/// One metered serving request (a row of `serving_usage`; its JSON is the row's insert).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ServingUsageRow {
    pub request_id: String,
    pub org_id: OrgId,
    pub adapter_id: Option<String>,
    pub model: String,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub cost_microcents: Microcents,
    pub charged_microcents: Microcents,
}

#[derive(Debug, Clone)]
pub struct LedgerOp {
    pub kind: EntryKind,
    /// Signed change: credits positive, debits negative.
    pub amount: Microcents,
    pub idempotency_key: Option<String>,
    pub reason: String,
    pub on_duplicate: OnDuplicate,
    /// A debit for work already delivered may leave the balance below zero; fees and
    /// estimates may not (they answer 402 instead).
    pub may_overdraw: bool,
    pub side: SideEffect,
    /// The payment this credit settles: written in the credit's transaction.
    pub payment: Option<Arc<SettledPayment>>,
    /// A credit's grant terms (none: the defaults).
    pub grant: Option<Box<GrantTerms>>,
    /// The request that submitted it (set by [`crate::billing::Ledger::submit`]): the commit's
    /// span is its child, and a failure names it.
    pub cause: crate::context::Cause,
}

/// A succeeded charge settled by its credit: its payment row is recorded as succeeded and its
/// pending row removed in the same transaction as the ledger entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SettledPayment {
    pub processor_key: String,
    pub payment_intent_id: String,
    pub org_id: OrgId,
    pub amount: Cents,
    /// `topup` or `auto_topup`.
    pub kind: EntryKind,
    /// The client's `Idempotency-Key` of a top-up.
    pub client_key: Option<String>,
}

impl LedgerOp {
    pub fn credit(
        kind: EntryKind,
        amount: Microcents,
        key: Option<IdempotencyKey>,
        reason: impl Into<String>,
    ) -> Self {
        Self {
            kind,
            amount,
            idempotency_key: key.map(String::from),
            reason: reason.into(),
            on_duplicate: OnDuplicate::Replay,
            may_overdraw: false,
            side: SideEffect::None,
            payment: None,
            grant: None,
            cause: crate::context::Cause::default(),
        }
    }

    /// Ends grant `grant_id` of the organization: its remainder becomes an `expiry` entry,
    /// once (keyed by the grant).
    pub fn expiry(grant_id: &str) -> Self {
        Self::credit(
            EntryKind::Expiry,
            Microcents::ZERO,
            Some(IdempotencyKey::expiry(grant_id)),
            format!("credit grant {grant_id} expired"),
        )
        .once_only()
        .with_side(SideEffect::Expire {
            grant_id: grant_id.to_owned(),
        })
    }

    /// The credit's grant terms.
    pub fn granting(mut self, terms: GrantTerms) -> Self {
        self.grant = Some(Box::new(terms));
        self
    }

    pub fn debit(
        kind: EntryKind,
        amount: Microcents,
        key: Option<IdempotencyKey>,
        reason: impl Into<String>,
    ) -> Self {
        Self::credit(kind, -amount, key, reason)
    }

    pub fn overdrawing(mut self) -> Self {
        self.may_overdraw = true;
        self
    }

    pub fn once_only(mut self) -> Self {
        self.on_duplicate = OnDuplicate::Conflict;
        self
    }

    pub fn settling(mut self, payment: SettledPayment) -> Self {
        self.payment = Some(Arc::new(payment));
        self
    }

    pub fn with_side(mut self, side: SideEffect) -> Self {
        self.side = side;
        self
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The (original, for a replay) signed change.
    pub amount: Microcents,
    /// The balance right after this operation (the current one, for a replay).
    pub balance: Microcents,
    pub replayed: bool,
    /// For serving charges: the recorded usage row (the original one, for a replay).
    pub serving: Option<ServingUsageRow>,
}

impl Outcome {
    /// A debit's charge in whole cents, rounded up.
    pub fn charged_cents(&self) -> Cents {
        (-self.amount).ceil_cents()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    #[error("insufficient balance: {balance} µ¢ available, {needed} µ¢ needed")]
    InsufficientFunds { balance: Microcents, needed: Microcents },
    #[error("organization not found")]
    UnknownOrg,
    #[error("already applied")]
    Duplicate,
    #[error("ledger unavailable: {0}")]
    Unavailable(String),
    /// Another session held the organization's balance row past `database.lock_timeout_ms`.
    #[error("the organization's balance is held by another session")]
    Locked,
    /// Inside the ledger only: the row was held by another transaction when a shared batch
    /// locked its accounts, so this organization's operations go on alone (nothing written).
    #[error("the organization's balance was held; committing alone")]
    Contended,
}

/// An answered operation as `keel_ledger_operations_total` labels it (one of
/// [`crate::metrics::LEDGER_OUTCOMES`]).
pub fn outcome_label(outcome: &Result<Outcome, LedgerError>) -> &'static str {
    match outcome {
        Ok(outcome) if outcome.replayed => "replayed",
        Ok(_) => "applied",
        Err(LedgerError::InsufficientFunds { .. }) => "insufficient_funds",
        Err(LedgerError::Duplicate) => "duplicate",
        Err(LedgerError::UnknownOrg) => "unknown_org",
        Err(LedgerError::Locked | LedgerError::Contended) => "locked",
        Err(LedgerError::Unavailable(_)) => "unavailable",
    }
}

/// What the account looked like once the batch committed (auto top-up reads it).
#[derive(Debug, Clone)]
pub struct AccountAfter {
    pub balance: Microcents,
    pub auto_topup: Option<AutoTopup>,
    /// What each grant the batch expired had left (the sweep's, or lapsed grants ended
    /// before the batch's operations).
    pub expired: Vec<Microcents>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutoTopup {
    pub threshold: Cents,
    pub amount: Cents,
}

#[derive(Debug)]
pub struct BatchResult {
    pub outcomes: Vec<Result<Outcome, LedgerError>>,
    pub account: Option<AccountAfter>,
}

/// Consecutive declines after which auto top-up pauses until its settings are saved.
pub const MAX_AUTO_TOPUP_DECLINES: i32 = 3;
