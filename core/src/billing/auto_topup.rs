//! Auto top-up: once a debit leaves the balance under the threshold (the ledger says so,
//! `BalanceBelow`), charge the saved card once and submit the credit to the ledger. A database claim (`auto_topup_started_at`) keeps it to one at a time per
//! organization across instances; the credit that settles it clears the claim in the
//! same transaction.

use chrono::{Duration, Utc};
use sea_orm::{DatabaseConnection, DbErr};

use std::collections::HashSet;
use std::sync::Arc;

use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::actor::{BalanceBelow, Ledger};
use super::charges::{self, ChargeError, Charged};
use super::ledger::{EntryKind, LedgerOp};
use super::payments::Payments;
use super::repo;
use crate::domain::{Cents, OrgId};

/// A claim older than this is taken to be abandoned (the instance died mid-charge).
const CLAIM_EXPIRY_MINUTES: i64 = 10;

/// Counts an auto top-up the cap stopped, and announces the month's first one
/// (`billing.auto_topup.limit_reached`, written with the mark that it was sent).
async fn limit_reached(
    db: &DatabaseConnection,
    metrics: &crate::metrics::Metrics,
    account: &entities::billing_account::Model,
    charged: Cents,
    now: chrono::DateTime<Utc>,
) -> Result<(), DbErr> {
    use sea_orm::TransactionTrait;
    metrics.auto_topup_limit_reached.inc();
    let month = now.format("%Y-%m").to_string();
    let txn = db.begin().await?;
    if repo::mark_limit_notified(&txn, &account.org_id, &month).await? {
        tracing::info!(target: "keel_event", event = "auto_topup.capped", org_id = %account.org_id, %month, "auto top-up reached its monthly cap");
        crate::webhooks::outbox::emit(
            &txn,
            vec![crate::webhooks::outbox::Announcement {
                org_id: account.org_id.clone(),
                event_type: crate::domain::EventType::AutoTopupLimitReached,
                data: serde_json::json!({
                    "month": month,
                    "monthlyLimitCents": account.auto_topup_monthly_limit_cents,
                    "chargedCents": charged,
                }),
            }],
        )
        .await?;
    }
    txn.commit().await
}

/// The auto top-up task: for each organization the ledger reports under its threshold,
/// charges the card (one charge at a time per organization in this process; the
/// database claim holds it to one across instances) and submits the credit. On `stop` it
/// takes no new work and waits for the charges under way, so their credits reach the
/// ledger before it drains.
pub async fn run(
    db: DatabaseConnection,
    payments: Arc<Payments>,
    metrics: crate::metrics::Metrics,
    ledger: Ledger,
    mut below: mpsc::UnboundedReceiver<BalanceBelow>,
    stop: CancellationToken,
) {
    let mut in_flight: HashSet<OrgId> = HashSet::new();
    let mut charging: JoinSet<OrgId> = JoinSet::new();
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            Some(done) = charging.join_next(), if !charging.is_empty() => {
                if let Ok(org_id) = done {
                    in_flight.remove(&org_id);
                }
            }
            next = below.recv() => {
                let Some(BalanceBelow { org_id, amount }) = next else { break };
                if !in_flight.insert(org_id.clone()) {
                    continue;
                }
                let (db, payments, metrics, ledger) = (db.clone(), payments.clone(), metrics.clone(), ledger.clone());
                charging.spawn(async move {
                    if let Some(credit) = charge(&db, &payments, &metrics, &org_id, amount).await {
                        if let Err(err) = ledger.submit(&org_id, credit).await {
                            // The charge is recorded as pending: the reconciler credits it.
                            tracing::error!(org_id = %org_id, error = %err, "auto top-up credit failed; the reconciler settles it");
                        }
                    }
                    org_id
                });
            }
        }
    }
    while charging.join_next().await.is_some() {}
}

/// Charges the card; answers the credit to apply when the charge succeeded.
pub async fn charge(
    db: &DatabaseConnection,
    payments: &Payments,
    metrics: &crate::metrics::Metrics,
    org_id: &OrgId,
    amount: Cents,
) -> Option<LedgerOp> {
    match try_charge(db, payments, metrics, org_id, amount).await {
        Ok(credit) => credit,
        Err(err) => {
            tracing::error!(org_id = %org_id, error = %err, "auto top-up failed");
            let _ = repo::release_auto_topup_claim(db, org_id).await;
            None
        }
    }
}

async fn try_charge(
    db: &DatabaseConnection,
    payments: &Payments,
    metrics: &crate::metrics::Metrics,
    org_id: &OrgId,
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
        .is_some_and(|t| account.balance_microcents < t.micros());
    if !below {
        repo::release_auto_topup_claim(db, org_id).await?;
        return Ok(None);
    }
    // The month's cap, checked under the claim (one auto top-up at a time per organization,
    // across instances): a charge that would pass it is not made.
    if account.auto_topup_monthly_limit_cents.is_some() {
        let charged = repo::auto_topup_charged(db, org_id, super::topup_policy::month_start(now)).await?;
        if !super::topup_policy::under_cap(&account, charged, amount) {
            limit_reached(db, metrics, &account, charged, now).await?;
            repo::release_auto_topup_claim(db, org_id).await?;
            return Ok(None);
        }
    }
    let processor_key = format!("keel-auto-topup-{org_id}-{}", now.timestamp_millis());
    // Recorded before the card is charged: a crash after the charge is settled on restart.
    let pending = charges::pending(
        org_id,
        EntryKind::AutoTopup,
        amount,
        customer_id,
        payment_method_id,
        processor_key,
        None,
    );
    let charged = charges::charge(db, payments, &pending).await;
    let outcome = match &charged {
        Ok(Charged::Succeeded { .. }) => "charged",
        Ok(Charged::Waiting(_)) => "waiting",
        Ok(Charged::Declined { .. }) => "declined",
        Err(_) => "failed",
    };
    metrics.auto_topups.with_label_values(&[outcome]).inc();
    match charged {
        Ok(Charged::Succeeded { intent, credit }) => {
            tracing::info!(target: "keel_event", event = "auto_topup.charged", org_id = %org_id, amount_cents = amount.get(), payment_intent = %intent.id, "auto top-up charged");
            Ok(Some(*credit))
        }
        // Not settled synchronously: the webhook credits it when it succeeds.
        Ok(Charged::Waiting(_)) => Ok(None),
        Ok(Charged::Declined { message, .. }) => {
            repo::count_auto_topup_decline(db, org_id).await?;
            tracing::warn!(target: "keel_event", event = "auto_topup.declined", org_id = %org_id, %message, "auto top-up declined");
            Ok(None)
        }
        Err(ChargeError::Database(err)) => Err(err),
        Err(ChargeError::Processor(err)) => {
            // The charge stays pending; the reconciler asks the processor again later. The
            // claim stays too (it expires), so no second charge starts meanwhile.
            tracing::error!(org_id = %org_id, error = %err, "auto top-up charge failed; left pending for the reconciler");
            Ok(None)
        }
        // Its key is its own (one per claim), so another amount under it is a charge of
        // this claim's already under way: nothing more to do.
        Err(ChargeError::Mismatch(first)) => {
            tracing::warn!(
                org_id = %org_id,
                first_cents = %first,
                "auto top-up key already charging another amount"
            );
            Ok(None)
        }
    }
}
