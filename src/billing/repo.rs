//! Billing rows outside the balance: accounts' settings, payments, costs, webhook events.

use chrono::{DateTime, Utc};
use entities::{billing_account, ledger_entry, payment, training_run_cost, webhook_event};
use sea_orm::sea_query::{Expr, OnConflict};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DbErr, EntityTrait, ExprTrait, QueryFilter, QueryOrder,
    QuerySelect,
};

use super::ledger::{ensure_account, MAX_AUTO_TOPUP_DECLINES};
use crate::domain::Cents;
use crate::orgs::repo::org_exists;

/// The organization's account, created on first use; `None` when the org is unknown.
pub async fn account(
    db: &impl ConnectionTrait,
    org_id: &str,
) -> Result<Option<billing_account::Model>, DbErr> {
    if let Some(account) = find_account(db, org_id).await? {
        return Ok(Some(account));
    }
    if !org_exists(db, org_id).await? {
        return Ok(None);
    }
    ensure_account(db, org_id).await?;
    find_account(db, org_id).await
}

pub async fn recent_ledger(
    db: &impl ConnectionTrait,
    org_id: &str,
    limit: u64,
) -> Result<Vec<ledger_entry::Model>, DbErr> {
    ledger_entry::Entity::find()
        .filter(ledger_entry::Column::OrgId.eq(org_id))
        .order_by_desc(ledger_entry::Column::Id)
        .limit(limit)
        .all(db)
        .await
}

/// Saves the customer id unless one is already saved; answers the one that holds.
pub async fn save_customer(
    db: &impl ConnectionTrait,
    org_id: &str,
    customer_id: &str,
) -> Result<String, DbErr> {
    billing_account::Entity::update_many()
        .col_expr(billing_account::Column::CustomerId, Expr::value(customer_id))
        .filter(billing_account::Column::OrgId.eq(org_id))
        .filter(billing_account::Column::CustomerId.is_null())
        .exec(db)
        .await?;
    Ok(billing_account::Entity::find_by_id(org_id.to_owned())
        .one(db)
        .await?
        .and_then(|a| a.customer_id)
        .unwrap_or_else(|| customer_id.to_owned()))
}

pub struct SavedCard<'a> {
    pub payment_method_id: Option<&'a str>,
    pub brand: Option<&'a str>,
    pub last4: Option<&'a str>,
    pub exp_month: Option<i32>,
    pub exp_year: Option<i32>,
}

impl SavedCard<'_> {
    /// No saved card (a removed one).
    pub const NONE: Self = Self {
        payment_method_id: None,
        brand: None,
        last4: None,
        exp_month: None,
        exp_year: None,
    };
}

pub async fn save_card(db: &impl ConnectionTrait, org_id: &str, card: SavedCard<'_>) -> Result<(), DbErr> {
    let mut update = billing_account::Entity::update_many()
        .col_expr(
            billing_account::Column::PaymentMethodId,
            Expr::value(card.payment_method_id),
        )
        .col_expr(billing_account::Column::PmBrand, Expr::value(card.brand))
        .col_expr(billing_account::Column::PmLast4, Expr::value(card.last4))
        .col_expr(billing_account::Column::PmExpMonth, Expr::value(card.exp_month))
        .col_expr(billing_account::Column::PmExpYear, Expr::value(card.exp_year))
        .col_expr(billing_account::Column::UpdatedAt, Expr::value(Utc::now()));
    if card.payment_method_id.is_none() {
        // Auto top-up needs a card.
        update = update.col_expr(billing_account::Column::AutoTopupEnabled, Expr::value(false));
    } else {
        // A new card gets a fresh start after declines.
        update = update.col_expr(billing_account::Column::AutoTopupDeclines, Expr::value(0));
    }
    update
        .filter(billing_account::Column::OrgId.eq(org_id))
        .exec(db)
        .await?;
    Ok(())
}

pub async fn clear_customer(db: &impl ConnectionTrait, org_id: &str) -> Result<(), DbErr> {
    save_card(db, org_id, SavedCard::NONE).await?;
    billing_account::Entity::update_many()
        .col_expr(
            billing_account::Column::CustomerId,
            Expr::value(Option::<String>::None),
        )
        .filter(billing_account::Column::OrgId.eq(org_id))
        .exec(db)
        .await?;
    Ok(())
}

/// Saving auto top-up settings also lifts a pause after declines.
pub async fn save_auto_topup(
    db: &impl ConnectionTrait,
    org_id: &str,
    enabled: bool,
    threshold: Option<Cents>,
    amount: Option<Cents>,
) -> Result<(), DbErr> {
    billing_account::Entity::update_many()
        .col_expr(billing_account::Column::AutoTopupEnabled, Expr::value(enabled))
        .col_expr(
            billing_account::Column::AutoTopupThresholdCents,
            Expr::value(threshold.map(Cents::get)),
        )
        .col_expr(
            billing_account::Column::AutoTopupAmountCents,
            Expr::value(amount.map(Cents::get)),
        )
        .col_expr(billing_account::Column::AutoTopupDeclines, Expr::value(0))
        .col_expr(billing_account::Column::UpdatedAt, Expr::value(Utc::now()))
        .filter(billing_account::Column::OrgId.eq(org_id))
        .exec(db)
        .await?;
    Ok(())
}

/// A charge attempted on a saved card, as [`record_payment`] keeps it.
pub struct PaymentRow<'a> {
    pub payment_intent_id: &'a str,
    pub org_id: &'a str,
    pub amount: Cents,
    pub status: &'a str,
    /// `topup` or `auto_topup`.
    pub kind: &'a str,
    /// A top-up's client `Idempotency-Key`.
    pub idempotency_key: Option<&'a str>,
}

/// Records a payment, or updates a recorded one's status (its amount and key stay).
pub async fn record_payment(db: &impl ConnectionTrait, row: PaymentRow<'_>) -> Result<(), DbErr> {
    let now = Utc::now();
    payment::Entity::insert(payment::ActiveModel {
        payment_intent_id: Set(row.payment_intent_id.to_owned()),
        org_id: Set(row.org_id.to_owned()),
        amount_cents: Set(row.amount.get()),
        status: Set(row.status.to_owned()),
        kind: Set(row.kind.to_owned()),
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
    .await?;
    Ok(())
}

/// The organization's top-up made with this client `Idempotency-Key`, if any.
pub async fn topup_by_key(
    db: &impl ConnectionTrait,
    org_id: &str,
    idempotency_key: &str,
) -> Result<Option<payment::Model>, DbErr> {
    payment::Entity::find()
        .filter(payment::Column::OrgId.eq(org_id))
        .filter(payment::Column::IdempotencyKey.eq(idempotency_key))
        .one(db)
        .await
}

pub async fn upsert_training_cost(
    db: &impl ConnectionTrait,
    run_id: &str,
    cost: Cents,
    provider: Option<&str>,
) -> Result<(), DbErr> {
    let now = Utc::now();
    training_run_cost::Entity::insert(training_run_cost::ActiveModel {
        run_id: Set(run_id.to_owned()),
        cost_cents: Set(cost.get()),
        provider: Set(provider.map(str::to_owned)),
        created_at: Set(now),
        updated_at: Set(now),
    })
    .on_conflict(
        OnConflict::column(training_run_cost::Column::RunId)
            .update_columns([
                training_run_cost::Column::CostCents,
                training_run_cost::Column::Provider,
                training_run_cost::Column::UpdatedAt,
            ])
            .to_owned(),
    )
    .exec_without_returning(db)
    .await?;
    Ok(())
}

pub async fn webhook_event_seen(db: &impl ConnectionTrait, event_id: &str) -> Result<bool, DbErr> {
    Ok(webhook_event::Entity::find_by_id(event_id.to_owned())
        .one(db)
        .await?
        .is_some())
}

pub async fn record_webhook_event(
    db: &impl ConnectionTrait,
    event_id: &str,
    event_type: &str,
) -> Result<(), DbErr> {
    webhook_event::Entity::insert(webhook_event::ActiveModel {
        event_id: Set(event_id.to_owned()),
        event_type: Set(event_type.to_owned()),
        received_at: Set(Utc::now()),
    })
    .on_conflict_do_nothing_on([webhook_event::Column::EventId])
    .exec_without_returning(db)
    .await?;
    Ok(())
}

/// The organization's billing account as stored (not created when missing).
pub async fn find_account(
    db: &impl ConnectionTrait,
    org_id: &str,
) -> Result<Option<billing_account::Model>, DbErr> {
    billing_account::Entity::find_by_id(org_id.to_owned())
        .one(db)
        .await
}

/// Takes the organization's auto top-up claim if auto top-up may charge now (enabled, not
/// paused, a saved card) and nobody holds the claim (or its holder started before
/// `expired_before`); answers whether it was taken.
pub async fn claim_auto_topup(
    db: &impl ConnectionTrait,
    org_id: &str,
    now: DateTime<Utc>,
    expired_before: DateTime<Utc>,
) -> Result<bool, DbErr> {
    let claimed = billing_account::Entity::update_many()
        .col_expr(billing_account::Column::AutoTopupStartedAt, Expr::value(now))
        .filter(billing_account::Column::OrgId.eq(org_id))
        .filter(billing_account::Column::AutoTopupEnabled.eq(true))
        .filter(billing_account::Column::AutoTopupDeclines.lt(MAX_AUTO_TOPUP_DECLINES))
        .filter(billing_account::Column::PaymentMethodId.is_not_null())
        .filter(billing_account::Column::CustomerId.is_not_null())
        .filter(
            Expr::col(billing_account::Column::AutoTopupStartedAt)
                .is_null()
                .or(Expr::col(billing_account::Column::AutoTopupStartedAt).lt(expired_before)),
        )
        .exec(db)
        .await?
        .rows_affected;
    Ok(claimed == 1)
}

/// Releases the organization's auto top-up claim.
pub async fn release_auto_topup_claim(db: &impl ConnectionTrait, org_id: &str) -> Result<(), DbErr> {
    billing_account::Entity::update_many()
        .col_expr(
            billing_account::Column::AutoTopupStartedAt,
            Expr::value(Option::<DateTime<Utc>>::None),
        )
        .filter(billing_account::Column::OrgId.eq(org_id))
        .exec(db)
        .await?;
    Ok(())
}

/// One more consecutive decline of auto top-up (three pause it), and the claim released.
pub async fn count_auto_topup_decline(db: &impl ConnectionTrait, org_id: &str) -> Result<(), DbErr> {
    billing_account::Entity::update_many()
        .col_expr(
            billing_account::Column::AutoTopupDeclines,
            Expr::col(billing_account::Column::AutoTopupDeclines).add(1),
        )
        .col_expr(
            billing_account::Column::AutoTopupStartedAt,
            Expr::value(Option::<DateTime<Utc>>::None),
        )
        .filter(billing_account::Column::OrgId.eq(org_id))
        .exec(db)
        .await?;
    Ok(())
}
