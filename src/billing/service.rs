//! Billing flows, shared by every client of the domain (the JSON API, the console): each
//! runs the processor, the payment records and the ledger in the order that makes a retry
//! harmless.

use entities::{billing_account, payment};

use super::ledger::{EntryKind, LedgerOp};
use super::money::cents_to_micros;
use super::payments::{ChargeRequest, PaymentError};
use super::repo::{self, PaymentRow};
use crate::domain::IdempotencyKey;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// The organization's billing account; 404 when the organization is unknown.
pub async fn account_of(state: &AppState, org_id: &str) -> ApiResult<billing_account::Model> {
    repo::account(&state.db, org_id)
        .await?
        .ok_or_else(|| ApiError::not_found("organization"))
}

/// The processor's customer of the account, created on first use.
pub async fn ensure_customer(state: &AppState, account: &billing_account::Model) -> ApiResult<String> {
    if let Some(customer) = &account.customer_id {
        return Ok(customer.clone());
    }
    let customer = state.payments.create_customer(&account.org_id).await?;
    Ok(repo::save_customer(&state.db, &account.org_id, &customer).await?)
}

/// What a top-up came to.
pub struct Topup {
    /// `succeeded`, or `processing` / `requires_action` (credited later by the webhook).
    pub status: String,
    pub payment_intent_id: String,
    pub balance_microcents: i64,
    pub client_secret: Option<String>,
}

/// Charges the saved card `amount_cents` and credits them once it succeeds.
///
/// With a client `Idempotency-Key`, a retry answers the first attempt's result (its decline
/// included) and charges nothing; the same key for another amount is 409. Requests with the
/// same key that race each other reach the processor with the same key of its own, so they
/// get one payment intent, credited once by its ledger key.
pub async fn topup(
    state: &AppState,
    org_id: &str,
    amount_cents: i64,
    client_key: Option<&str>,
) -> ApiResult<Topup> {
    let account = account_of(state, org_id).await?;
    let Some(payment_method_id) = account.payment_method_id.clone() else {
        return Err(ApiError::Conflict(
            "save a payment method before topping up".into(),
        ));
    };
    if let Some(key) = client_key {
        if let Some(earlier) = repo::topup_by_key(&state.db, org_id, key).await? {
            return replay_topup(state, earlier, amount_cents).await;
        }
    }
    let customer_id = ensure_customer(state, &account).await?;
    let processor_key = match client_key {
        Some(key) => format!("keel-topup-{org_id}-{key}"),
        None => format!("keel-topup-{}", uuid::Uuid::new_v4()),
    };
    let charged = state
        .payments
        .charge(ChargeRequest {
            org_id,
            customer_id: &customer_id,
            payment_method_id: &payment_method_id,
            amount_cents,
            kind: "topup",
            idempotency_key: &processor_key,
        })
        .await;
    let row = |payment_intent_id, status| PaymentRow {
        payment_intent_id,
        org_id,
        amount_cents,
        status,
        kind: "topup",
        idempotency_key: client_key,
    };
    let intent = match charged {
        Ok(intent) => intent,
        Err(PaymentError::Declined {
            message,
            payment_intent_id,
        }) => {
            let id =
                payment_intent_id.unwrap_or_else(|| format!("declined_{}", uuid::Uuid::new_v4().simple()));
            repo::record_payment(&state.db, row(&id, "declined")).await?;
            return Err(ApiError::PaymentRequired(message));
        }
        Err(err) => return Err(err.into()),
    };
    repo::record_payment(&state.db, row(&intent.id, &intent.status)).await?;
    let balance_microcents = settle_topup(state, org_id, &intent.id, amount_cents, &intent.status).await?;
    Ok(Topup {
        status: intent.status,
        payment_intent_id: intent.id,
        balance_microcents,
        client_secret: intent.client_secret,
    })
}

/// The first attempt's result for a retried `Idempotency-Key`.
async fn replay_topup(state: &AppState, earlier: payment::Model, amount_cents: i64) -> ApiResult<Topup> {
    if earlier.amount_cents != amount_cents {
        return Err(ApiError::Conflict(format!(
            "this Idempotency-Key was used for a top-up of {} cents; use a new key for another amount",
            earlier.amount_cents
        )));
    }
    if earlier.status == "declined" {
        return Err(ApiError::PaymentRequired(
            "the card was declined (the first attempt with this Idempotency-Key)".into(),
        ));
    }
    // A succeeded payment is credited here if a crash came between its record and its
    // credit; otherwise its ledger key makes this a replay.
    let balance_microcents = settle_topup(
        state,
        &earlier.org_id,
        &earlier.payment_intent_id,
        earlier.amount_cents,
        &earlier.status,
    )
    .await?;
    Ok(Topup {
        status: earlier.status,
        payment_intent_id: earlier.payment_intent_id,
        balance_microcents,
        client_secret: None,
    })
}

/// Credits a succeeded payment (once, by its ledger key); answers the balance.
async fn settle_topup(
    state: &AppState,
    org_id: &str,
    payment_intent_id: &str,
    amount_cents: i64,
    status: &str,
) -> ApiResult<i64> {
    if status != "succeeded" {
        return Ok(account_of(state, org_id).await?.balance_microcents);
    }
    let op = LedgerOp::credit(
        EntryKind::Topup,
        cents_to_micros(amount_cents),
        Some(IdempotencyKey::payment(payment_intent_id)),
        format!("top-up {payment_intent_id}"),
    );
    Ok(state.ledger.submit(org_id, op).await?.balance_microcents)
}
