//! Charging a saved card so that no crash loses the money: the charge is recorded as
//! pending (with the processor idempotency key) before the processor is called; its credit
//! and its payment's `succeeded` state commit in one ledger transaction; a decline or a
//! status to wait on is recorded as the pending row goes. A charge left pending (the process
//! died between the processor's answer and the credit) is settled by [`reconcile`], which asks
//! the processor again with the same key (it answers the first charge's result, never a second
//! charge) and settles it exactly once. Top-ups, auto top-ups and both processors go this way.

use std::time::Duration;

use chrono::Utc;
use entities::pending_payment;
use sea_orm::{DatabaseConnection, DbErr};

use super::actor::Ledger;
use super::ledger::{EntryKind, LedgerError, LedgerOp, Outcome, SettledPayment, SideEffect};
use super::payments::{declined_intent_id, ChargeRequest, PaymentError, PaymentIntent, Payments};
use super::repo;
use crate::domain::{Cents, IdempotencyKey, OrgId, PaymentState};
use crate::webhooks::outbox::{self, Announcement};

/// What became of a charge.
pub enum Charged {
    /// Succeeded: the credit to apply, which settles the payment in its transaction.
    Succeeded {
        intent: PaymentIntent,
        credit: Box<LedgerOp>,
    },
    /// The processor still works on it (`processing`, `requires_action`); recorded, and
    /// credited by the webhook once it succeeds.
    Waiting(PaymentIntent),
    /// Declined; recorded.
    Declined {
        message: String,
        payment_intent_id: String,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum ChargeError {
    #[error(transparent)]
    Database(#[from] DbErr),
    /// The processor did not answer clearly; the charge stays pending for the reconciler.
    #[error(transparent)]
    Processor(PaymentError),
    /// Another call with the same key asked for another amount first (its amount in cents):
    /// one key is one payment, so this call charges nothing.
    #[error("the key was first used for {0} cents")]
    Mismatch(Cents),
}

/// The pending row of a new charge.
pub fn pending(
    org_id: &OrgId,
    kind: EntryKind,
    amount: Cents,
    customer_id: &str,
    payment_method_id: &str,
    processor_key: String,
    client_key: Option<&str>,
) -> pending_payment::Model {
    pending_payment::Model {
        processor_key,
        org_id: org_id.to_owned(),
        kind,
        amount_cents: amount,
        customer_id: customer_id.to_owned(),
        payment_method_id: payment_method_id.to_owned(),
        client_key: client_key.map(str::to_owned),
        created_at: Utc::now(),
    }
}

/// Records the charge as pending, then charges it.
pub async fn charge(
    db: &DatabaseConnection,
    payments: &Payments,
    pending: &pending_payment::Model,
) -> Result<Charged, ChargeError> {
    repo::insert_pending(db, pending.clone()).await?;
    // Calls racing with one key insert one pending row between them; a call whose amount is
    // not the first one's must not take the first one's payment for its own.
    if let Some(first) = repo::other_amount_of_key(db, pending).await? {
        // If the first call had settled before this one's insert, this call's own row went
        // in: it is taken back (a row of the first call's amount is left alone).
        repo::drop_pending_of_amount(db, pending).await?;
        return Err(ChargeError::Mismatch(first));
    }
    let answer = ask(payments, pending).await;
    fault_point("after_charge");
    settle_answer(db, pending, answer).await
}

/// Applies a succeeded charge's credit; a replay (credited before, its pending row left by
/// a crash) settles the row here.
pub async fn credit(
    db: &DatabaseConnection,
    ledger: &Ledger,
    pending: &pending_payment::Model,
    intent_id: &str,
    credit: LedgerOp,
) -> Result<Outcome, LedgerError> {
    let outcome = ledger.submit(&pending.org_id, credit).await?;
    if outcome.replayed {
        if let Err(err) = repo::settle_pending(
            db,
            &pending.processor_key,
            payment_row(pending, intent_id, PaymentState::Succeeded),
        )
        .await
        {
            tracing::warn!(error = %err, processor_key = %pending.processor_key, "replayed payment not marked settled; the reconciler will");
        }
    }
    Ok(outcome)
}

async fn ask(payments: &Payments, pending: &pending_payment::Model) -> Result<PaymentIntent, PaymentError> {
    payments
        .charge(ChargeRequest {
            org_id: pending.org_id.as_str(),
            customer_id: &pending.customer_id,
            payment_method_id: &pending.payment_method_id,
            amount: pending.amount_cents,
            kind: pending.kind.as_str(),
            idempotency_key: &pending.processor_key,
        })
        .await
}

/// Records a decline or a status to wait on (removing the pending row in the same
/// transaction, with a decline's webhook event); a success becomes its credit.
async fn settle_answer(
    db: &DatabaseConnection,
    pending: &pending_payment::Model,
    answer: Result<PaymentIntent, PaymentError>,
) -> Result<Charged, ChargeError> {
    use sea_orm::TransactionTrait;
    let record = |intent_id: String, status: PaymentState, declined: Option<String>| async move {
        let txn = db.begin().await?;
        let settled_here = repo::settle_pending(
            &txn,
            &pending.processor_key,
            payment_row(pending, &intent_id, status),
        )
        .await?;
        if let (true, Some(reason)) = (settled_here, declined) {
            outbox::emit(&txn, vec![declined_event(pending, reason)]).await?;
        }
        txn.commit().await?;
        Ok::<_, DbErr>(intent_id)
    };
    match answer {
        Ok(intent) if intent.status.is_succeeded() => {
            tracing::info!(
                target: "keel_event",
                event = "payment.succeeded",
                org_id = %pending.org_id,
                kind = pending.kind.as_str(),
                amount_cents = pending.amount_cents.get(),
                payment_intent = %intent.id,
                "payment succeeded"
            );
            let credit = Box::new(credit_op(pending, &intent.id));
            Ok(Charged::Succeeded { intent, credit })
        }
        Ok(intent) => {
            record(intent.id.clone(), intent.status.clone(), None).await?;
            Ok(Charged::Waiting(intent))
        }
        Err(PaymentError::Declined {
            message,
            payment_intent_id,
        }) => {
            // The processor's reason ("Your card was declined."), never card data.
            tracing::info!(
                target: "keel_event",
                event = "payment.declined",
                org_id = %pending.org_id,
                kind = pending.kind.as_str(),
                amount_cents = pending.amount_cents.get(),
                reason = %message.chars().take(200).collect::<String>(),
                "payment declined"
            );
            let id = record(
                declined_intent_id(payment_intent_id),
                PaymentState::Declined,
                Some(message.clone()),
            )
            .await?;
            Ok(Charged::Declined {
                message,
                payment_intent_id: id,
            })
        }
        Err(err) => Err(ChargeError::Processor(err)),
    }
}

/// `billing.topup.failed` or `billing.auto_topup.failed`: `{amountCents, paymentMethod, reason}`.
fn declined_event(pending: &pending_payment::Model, reason: String) -> Announcement {
    Announcement {
        org_id: pending.org_id.clone(),
        event_type: match is_auto(pending) {
            true => crate::domain::EventType::AutoTopupFailed,
            false => crate::domain::EventType::TopupFailed,
        },
        data: serde_json::json!({
            "amountCents": pending.amount_cents,
            "paymentMethod": pending.payment_method_id,
            "reason": reason.chars().take(1000).collect::<String>(),
        }),
    }
}

fn is_auto(pending: &pending_payment::Model) -> bool {
    pending.kind == EntryKind::AutoTopup
}

/// The payment row a pending charge becomes.
fn payment_row<'a>(
    pending: &'a pending_payment::Model,
    intent_id: &'a str,
    status: PaymentState,
) -> repo::PaymentRow<'a> {
    repo::PaymentRow {
        payment_intent_id: intent_id,
        org_id: &pending.org_id,
        amount: pending.amount_cents,
        status,
        kind: pending.kind,
        idempotency_key: pending.client_key.as_deref(),
    }
}

/// The credit of a succeeded charge: once per payment intent (its ledger key), settling the
/// payment in the same transaction.
fn credit_op(pending: &pending_payment::Model, intent_id: &str) -> LedgerOp {
    let amount = pending.amount_cents;
    let (kind, reason) = match is_auto(pending) {
        true => (EntryKind::AutoTopup, format!("auto top-up {intent_id}")),
        false => (EntryKind::Topup, format!("top-up {intent_id}")),
    };
    let mut op = LedgerOp::credit(
        kind,
        amount.micros(),
        Some(IdempotencyKey::payment(intent_id)),
        reason,
    )
    .settling(SettledPayment {
        processor_key: pending.processor_key.clone(),
        payment_intent_id: intent_id.to_owned(),
        org_id: pending.org_id.clone(),
        amount,
        kind: pending.kind,
        client_key: pending.client_key.clone(),
    });
    if is_auto(pending) {
        op = op.with_side(SideEffect::AutoTopupCredited);
    }
    op
}

/// A test-only crash: `KEEL_FAULT_POINT=<name>` aborts the process there (as a kill -9
/// would), so the tests can show what a restart heals. Never set in production.
fn fault_point(name: &str) {
    static POINT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let point = POINT.get_or_init(|| std::env::var("KEEL_FAULT_POINT").ok());
    if point.as_deref() == Some(name) {
        tracing::error!(fault_point = name, "KEEL_FAULT_POINT reached: aborting");
        std::process::abort();
    }
}

/// What one reconciler pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Reconciled {
    pub credited: u32,
    pub declined: u32,
    pub waiting: u32,
    pub failed: u32,
}

/// Settles the charges left pending for at least `min_age`: asks the processor with each one's
/// key and credits (once), or records the decline or the status to wait on.
pub async fn reconcile(
    db: &DatabaseConnection,
    payments: &Payments,
    ledger: &Ledger,
    min_age: Duration,
    metrics: &crate::metrics::Metrics,
) -> Result<Reconciled, DbErr> {
    let cutoff = Utc::now() - chrono::Duration::from_std(min_age).unwrap_or_default();
    let mut done = Reconciled::default();
    for pending in repo::pending_before(db, cutoff, 500).await? {
        let answer = ask(payments, &pending).await;
        let outcome = match settle_answer(db, &pending, answer).await {
            Ok(Charged::Succeeded { intent, credit: op }) => {
                match credit(db, ledger, &pending, &intent.id, *op).await {
                    Ok(_) => {
                        tracing::info!(org_id = %pending.org_id, payment_intent = %intent.id, amount_cents = pending.amount_cents.get(), "pending payment credited");
                        done.credited += 1;
                        "credited"
                    }
                    Err(err) => {
                        tracing::warn!(target: "keel_event", event = "payment.unsettled", org_id = %pending.org_id, processor_key = %pending.processor_key, error = %err, "pending payment not credited yet");
                        done.failed += 1;
                        "failed"
                    }
                }
            }
            Ok(Charged::Waiting(_)) => {
                done.waiting += 1;
                "waiting"
            }
            Ok(Charged::Declined { .. }) => {
                if is_auto(&pending) {
                    repo::count_auto_topup_decline(db, &pending.org_id).await?;
                }
                done.declined += 1;
                "declined"
            }
            Err(err) => {
                tracing::warn!(target: "keel_event", event = "payment.unsettled", org_id = %pending.org_id, processor_key = %pending.processor_key, error = %err, "pending payment not settled yet: the reconciler cannot settle it now");
                done.failed += 1;
                "failed"
            }
        };
        metrics.payments_reconciled.with_label_values(&[outcome]).inc();
    }
    Ok(done)
}
