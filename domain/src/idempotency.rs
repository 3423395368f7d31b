//! Ledger idempotency keys (unique per organization): one constructor per kind of charge or
//! credit, so a retry of the same operation always spells the same key.

use std::fmt;

use crate::{JobId, RunId};

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// The flat run fee of a queue job, charged once whatever its requeues.
    pub fn job_fee(job_id: &JobId) -> Self {
        Self(format!("job-fee:{job_id}"))
    }

    /// The flat run fee of a run (`POST /api/billing/debit` with a `runId`).
    pub fn run_fee(run_id: &RunId) -> Self {
        Self(format!("run-fee:{run_id}"))
    }

    /// A metered serving request.
    pub fn serving(request_id: &str) -> Self {
        Self(format!("serving:{request_id}"))
    }

    /// A user's training estimate charge for a run.
    pub fn training_usage(run_id: &RunId) -> Self {
        Self(format!("training-usage:{run_id}"))
    }

    /// The control plane's training charge for a run.
    pub fn training_run(run_id: &RunId) -> Self {
        Self(format!("training-run:{run_id}"))
    }

    /// A promo code's credit (the code as configured, upper case).
    pub fn promo(code: &str) -> Self {
        Self(format!("promo:{code}"))
    }

    /// The organization's one starter credit.
    pub fn starter_credit() -> Self {
        Self("starter-credit".into())
    }

    /// A card payment's credit: shared by the synchronous top-up, auto top-up and the
    /// webhook, so a payment is credited once whichever path sees it first.
    pub fn payment(payment_intent_id: &str) -> Self {
        Self(format!("payment:{payment_intent_id}"))
    }

    /// An operator's manual grant, by the client's key.
    pub fn manual_grant(key: &str) -> Self {
        Self(format!("manual:{key}"))
    }

    /// A credit grant's expiry: once per grant.
    pub fn expiry(grant_id: &str) -> Self {
        Self(format!("expiry:{grant_id}"))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<IdempotencyKey> for String {
    fn from(key: IdempotencyKey) -> Self {
        key.0
    }
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
