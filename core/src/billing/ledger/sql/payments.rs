//! A payment's row, written by the ledger when it credits a settled charge in the same
//! transaction, and by the charge flows before and after the processor answers.

use chrono::Utc;
use entities::{payment, pending_payment};
use sea_orm::sea_query::{Expr, OnConflict};
use sea_orm::{ActiveValue::Set, ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter};

use crate::domain::{Cents, EntryKind, OrgId, PaymentState};

/// A charge attempted on a saved card, as [`record_payment`] keeps it.
pub struct PaymentRow<'a> {
    pub payment_intent_id: &'a str,
    pub org_id: &'a OrgId,
    pub amount: Cents,
    pub status: PaymentState,
    /// `topup` or `auto_topup`.
    pub kind: EntryKind,
    /// A top-up's client `Idempotency-Key`.
    pub idempotency_key: Option<&'a str>,
}

/// Records a payment, or updates a recorded one's status (its amount and key stay).
///
/// Retries racing with the same client key record the same payment intent at once: the
/// insert can then trip the `(org_id, idempotency_key)` index before the arbiter on the
/// intent id (PostgreSQL checks the indexes in its own order), so a unique violation is that
/// same payment, whose status is updated instead.
pub async fn record_payment(db: &impl ConnectionTrait, row: PaymentRow<'_>) -> Result<(), DbErr> {
    let now = Utc::now();
    let inserted = payment::Entity::insert(payment::ActiveModel {
        payment_intent_id: Set(row.payment_intent_id.to_owned()),
        org_id: Set(row.org_id.to_owned()),
        amount_cents: Set(row.amount),
        status: Set(row.status.clone()),
        kind: Set(row.kind),
        idempotency_key: Set(row.idempotency_key.map(str::to_owned)),
        created_at: Set(now),
        updated_at: Set(now),
    })
    .on_conflict(
        OnConflict::column(payment::Column::PaymentIntentId)
            .update_columns([payment::Column::Status, payment::Column::UpdatedAt])
            .to_owned(),
    )
    .exec_without_returning(db)
    .await;
    match inserted {
        Err(err) if crate::orgs::repo::is_unique_violation(&err) => {
            payment::Entity::update_many()
                .col_expr(payment::Column::Status, Expr::value(row.status))
                .col_expr(payment::Column::UpdatedAt, Expr::value(now))
                .filter(payment::Column::PaymentIntentId.eq(row.payment_intent_id))
                .exec(db)
                .await?;
            Ok(())
        }
        other => other.map(drop),
    }
}

/// Records what became of a pending charge and forgets it as pending (the caller's
/// transaction makes it one step); answers whether it was still pending (settled here).
pub async fn settle_pending(
    db: &impl ConnectionTrait,
    processor_key: &str,
    row: PaymentRow<'_>,
) -> Result<bool, DbErr> {
    record_payment(db, row).await?;
    let deleted = pending_payment::Entity::delete_by_id(processor_key.to_owned())
        .exec(db)
        .await?;
    Ok(deleted.rows_affected > 0)
}
