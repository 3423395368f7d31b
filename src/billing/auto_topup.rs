//! Auto top-up: once a debit leaves the balance under the threshold, charge the saved
//! card once. A database claim (`auto_topup_started_at`) keeps it to one at a time per
//! organization across instances; the credit that settles it clears the claim in the
//! same transaction.

use chrono::{Duration, Utc};
use sea_orm::{DatabaseConnection, DbErr};

use super::ledger::{EntryKind, LedgerOp, SideEffect};
use super::payments::{declined_intent_id, ChargeRequest, PaymentError, Payments};
use super::repo;
use crate::domain::{Cents, IdempotencyKey, Microcents};

/// A claim older than this is taken to be abandoned (the instance died mid-charge).
const CLAIM_EXPIRY_MINUTES: i64 = 10;

/// Charges the card; answers the credit to apply when the charge succeeded.
pub async fn charge(
    db: &DatabaseConnection,
    payments: &Payments,
    org_id: &str,
    amount: Cents,
) -> Option<LedgerOp> {
    match try_charge(db, payments, org_id, amount).await {
        Ok(credit) => credit,
        Err(err) => {
            tracing::error!(org_id, error = %err, "auto top-up failed");
            let _ = repo::release_auto_topup_claim(db, org_id).await;
            None
        }
    }
}

async fn try_charge(
    db: &DatabaseConnection,
    payments: &Payments,
    org_id: &str,
    amount: Cents,
) -> Result<Option<LedgerOp>, DbErr> {
    let now = Utc::now();
    if !repo::claim_auto_topup(db, org_id, now, now - Duration::minutes(CLAIM_EXPIRY_MINUTES)).await? {
        return Ok(None);
    }
    let Some(account) = repo::find_account(db, org_id).await? else {
        return Ok(None);
    };
    let (Some(customer_id), Some(payment_method_id)) = (&account.customer_id, &account.payment_method_id)
    else {
        repo::release_auto_topup_claim(db, org_id).await?;
        return Ok(None);
    };
    // Decided on a balance read before this claim: a top-up settled meanwhile (its credit
    // clears the claim in the same transaction) may already have lifted the balance.
    let below = account
        .auto_topup_threshold_cents
        .is_some_and(|t| Microcents(account.balance_microcents) < Cents(t).micros());
    if !below {
        repo::release_auto_topup_claim(db, org_id).await?;
        return Ok(None);
    }
    let idempotency_key = format!("keel-auto-topup-{org_id}-{}", now.timestamp_millis());
    let charged = payments
        .charge(ChargeRequest {
            org_id,
            customer_id,
            payment_method_id,
            amount,
            kind: "auto_topup",
            idempotency_key: &idempotency_key,
        })
        .await;
    match charged {
        Ok(intent) if intent.status == "succeeded" => {
            repo::record_payment(db, auto_topup_row(&intent.id, org_id, amount, "succeeded")).await?;
            tracing::info!(org_id, amount_cents = amount.get(), payment_intent = %intent.id, "auto top-up charged");
            Ok(Some(
                LedgerOp::credit(
                    EntryKind::AutoTopup,
                    amount.micros(),
                    Some(IdempotencyKey::payment(&intent.id)),
                    format!("auto top-up {}", intent.id),
                )
                .with_side(SideEffect::AutoTopupCredited),
            ))
        }
        Ok(intent) => {
            // Not settled synchronously: the webhook credits it when it succeeds.
            repo::record_payment(db, auto_topup_row(&intent.id, org_id, amount, &intent.status)).await?;
            Ok(None)
        }
        Err(PaymentError::Declined {
            message,
            payment_intent_id,
        }) => {
            let id = declined_intent_id(payment_intent_id);
            repo::record_payment(db, auto_topup_row(&id, org_id, amount, "declined")).await?;
            repo::count_auto_topup_decline(db, org_id).await?;
            tracing::warn!(org_id, %message, "auto top-up declined");
            Ok(None)
        }
        Err(err) => {
            tracing::error!(org_id, error = %err, "auto top-up charge failed");
            repo::release_auto_topup_claim(db, org_id).await?;
            Ok(None)
        }
    }
}

fn auto_topup_row<'a>(id: &'a str, org_id: &'a str, amount: Cents, status: &'a str) -> repo::PaymentRow<'a> {
    repo::PaymentRow {
        payment_intent_id: id,
        org_id,
        amount,
        status,
        kind: "auto_topup",
        idempotency_key: None,
    }
}
