//! Billing rows outside the balance: accounts' settings, payments, costs, webhook events.

use chrono::{DateTime, Utc};
use entities::{
    billing_account, credit_grant, ledger_entry, payment, pending_payment, serving_usage, training_run_cost,
    webhook_event,
};
use sea_orm::sea_query::{Expr, OnConflict};
use sea_orm::{
    ActiveModelTrait, ActiveValue::Set, ColumnTrait, ConnectionTrait, DbBackend, DbErr, EntityTrait,
    ExprTrait, PaginatorTrait, QueryFilter, QueryOrder, QuerySelect, Statement,
};

use super::ledger::{ensure_account, MAX_AUTO_TOPUP_DECLINES};
use crate::domain::{Cents, EntryKind, Microcents, OrgId, PaymentState, RunId};
use crate::orgs::repo::org_exists;

/// The organization's account, created on first use; `None` when the org is unknown.
pub async fn account(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
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
    org_id: &OrgId,
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
    org_id: &OrgId,
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

pub async fn save_card(db: &impl ConnectionTrait, org_id: &OrgId, card: SavedCard<'_>) -> Result<(), DbErr> {
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

pub async fn clear_customer(db: &impl ConnectionTrait, org_id: &OrgId) -> Result<(), DbErr> {
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
    org_id: &OrgId,
    settings: super::topup_policy::AutoTopupSettings,
) -> Result<(), DbErr> {
    billing_account::Entity::update_many()
        .col_expr(
            billing_account::Column::AutoTopupEnabled,
            Expr::value(settings.enabled),
        )
        .col_expr(
            billing_account::Column::AutoTopupThresholdCents,
            Expr::value(settings.threshold.map(Cents::get)),
        )
        .col_expr(
            billing_account::Column::AutoTopupAmountCents,
            Expr::value(settings.amount.map(Cents::get)),
        )
        .col_expr(
            billing_account::Column::AutoTopupMonthlyLimitCents,
            Expr::value(settings.monthly_limit.map(Cents::get)),
        )
        .col_expr(billing_account::Column::AutoTopupDeclines, Expr::value(0))
        .col_expr(billing_account::Column::UpdatedAt, Expr::value(Utc::now()))
        .filter(billing_account::Column::OrgId.eq(org_id))
        .exec(db)
        .await?;
    Ok(())
}

pub use super::ledger::{record_payment, settle_pending, PaymentRow};

/// Records a charge before the processor is called (a repeat of its key changes nothing).
pub async fn insert_pending(db: &impl ConnectionTrait, pending: pending_payment::Model) -> Result<(), DbErr> {
    let active: pending_payment::ActiveModel = pending.into();
    pending_payment::Entity::insert(active.reset_all())
        .on_conflict_do_nothing_on([pending_payment::Column::ProcessorKey])
        .exec_without_returning(db)
        .await
        .map(drop)
}

/// An amount other than `pending`'s that its keys already stand for: a pending row under the
/// processor key, or a settled payment under the client's key. Read in that order: a
/// settlement writes the payment and removes the pending row in one transaction, so a call
/// that finds no row (the first call settled since this one's insert was refused) finds
/// the payment.
pub async fn other_amount_of_key(
    db: &impl ConnectionTrait,
    pending: &pending_payment::Model,
) -> Result<Option<Cents>, DbErr> {
    let row = pending_payment::Entity::find_by_id(pending.processor_key.clone())
        .one(db)
        .await?
        .map(|row| row.amount_cents);
    let paid = match &pending.client_key {
        Some(key) => topup_by_key(db, &pending.org_id, key)
            .await?
            .map(|p| p.amount_cents),
        None => None,
    };
    Ok([row, paid]
        .into_iter()
        .flatten()
        .find(|amount| *amount != pending.amount_cents))
}

/// Removes a pending row of `pending`'s amount under its key: a call that lost the key to
/// another amount's settled payment inserted it after that payment's row was gone.
pub async fn drop_pending_of_amount(
    db: &impl ConnectionTrait,
    pending: &pending_payment::Model,
) -> Result<(), DbErr> {
    pending_payment::Entity::delete_many()
        .filter(pending_payment::Column::ProcessorKey.eq(pending.processor_key.as_str()))
        .filter(pending_payment::Column::AmountCents.eq(pending.amount_cents))
        .exec(db)
        .await
        .map(drop)
}

/// Charges recorded as pending before `older_than`, oldest first.
pub async fn pending_before(
    db: &impl ConnectionTrait,
    older_than: DateTime<Utc>,
    limit: u64,
) -> Result<Vec<pending_payment::Model>, DbErr> {
    pending_payment::Entity::find()
        .filter(pending_payment::Column::CreatedAt.lte(older_than))
        .order_by_asc(pending_payment::Column::CreatedAt)
        .limit(limit)
        .all(db)
        .await
}

/// How many charges wait to be settled (`keel_payments_pending`).
pub async fn pending_count(db: &impl ConnectionTrait) -> Result<u64, DbErr> {
    pending_payment::Entity::find().count(db).await
}

/// Charges not settled yet, and when the oldest was recorded.
pub async fn pending_summary(
    db: &impl ConnectionTrait,
) -> Result<(u64, Option<chrono::DateTime<chrono::Utc>>), DbErr> {
    let oldest = pending_payment::Entity::find()
        .order_by_asc(pending_payment::Column::CreatedAt)
        .one(db)
        .await?
        .map(|p| p.created_at);
    Ok((pending_count(db).await?, oldest))
}

/// The organization's top-up made with this client `Idempotency-Key`, if any.
pub async fn topup_by_key(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
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
    run_id: &RunId,
    cost: Cents,
    provider: Option<&str>,
) -> Result<(), DbErr> {
    let now = Utc::now();
    training_run_cost::Entity::insert(training_run_cost::ActiveModel {
        run_id: Set(run_id.clone()),
        cost_cents: Set(cost),
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

/// The id of one of the organization's grants whose expiry is at or before `now` and that
/// still holds something (the sweep's and the operations' business to end).
pub async fn first_lapsed_grant(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    now: DateTime<Utc>,
) -> Result<Option<String>, DbErr> {
    credit_grant::Entity::find()
        .select_only()
        .column(credit_grant::Column::Id)
        .filter(credit_grant::Column::OrgId.eq(org_id.to_owned()))
        // As the partial index states it.
        .filter(Expr::cust("remaining_microcents > 0"))
        .filter(credit_grant::Column::ExpiresAt.lte(now))
        .into_tuple()
        .one(db)
        .await
}

/// The organization's billing account as stored (not created when missing).
pub async fn find_account(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
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
    org_id: &OrgId,
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
pub async fn release_auto_topup_claim(db: &impl ConnectionTrait, org_id: &OrgId) -> Result<(), DbErr> {
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
pub async fn count_auto_topup_decline(db: &impl ConnectionTrait, org_id: &OrgId) -> Result<(), DbErr> {
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

/// A page of the organization's ledger, newest first: entries before `before` (an entry id),
/// of one kind when given.
pub async fn ledger_page(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    kind: Option<&str>,
    before: Option<i64>,
    limit: u64,
) -> Result<Vec<ledger_entry::Model>, DbErr> {
    let mut query = ledger_entry::Entity::find().filter(ledger_entry::Column::OrgId.eq(org_id));
    if let Some(kind) = kind {
        query = query.filter(ledger_entry::Column::Kind.eq(kind));
    }
    if let Some(before) = before {
        query = query.filter(ledger_entry::Column::Id.lt(before));
    }
    query
        .order_by_desc(ledger_entry::Column::Id)
        .limit(limit)
        .all(db)
        .await
}

/// The organization's ledger entries (of `kind`, if given).
pub async fn ledger_count(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    kind: Option<&str>,
) -> Result<u64, DbErr> {
    let mut query = ledger_entry::Entity::find().filter(ledger_entry::Column::OrgId.eq(org_id));
    if let Some(kind) = kind {
        query = query.filter(ledger_entry::Column::Kind.eq(kind));
    }
    sea_orm::PaginatorTrait::count(query, db).await
}

/// The ledger since `since`, summed per (UTC day `YYYY-MM-DD`, kind).
pub async fn daily_totals(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    since: DateTime<Utc>,
) -> Result<Vec<(String, String, i64)>, DbErr> {
    let day = match db.get_database_backend() {
        DbBackend::Postgres => "to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD')",
        _ => "substr(created_at, 1, 10)",
    };
    let sql = format!(
        "SELECT {day} AS day, kind, CAST(SUM(amount_microcents) AS BIGINT) AS total \
         FROM ledger_entries WHERE org_id = $1 AND created_at >= $2 GROUP BY 1, 2 ORDER BY 1"
    );
    let statement =
        Statement::from_sql_and_values(db.get_database_backend(), sql, [org_id.into(), since.into()]);
    db.query_all_raw(statement)
        .await?
        .iter()
        .map(|row| {
            Ok((
                row.try_get("", "day")?,
                row.try_get("", "kind")?,
                row.try_get("", "total")?,
            ))
        })
        .collect()
}

/// Serving usage since `since` per model: `(model, prompt tokens, completion tokens,
/// charged microcents, requests)`, the most charged first.
pub async fn usage_by_model(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    since: DateTime<Utc>,
) -> Result<Vec<(String, i64, i64, i64, i64)>, DbErr> {
    use sea_orm::sea_query::ExprTrait;
    // sea-query's own functions, written right for each database (a custom `$1` expression
    // is a bound parameter to SQLite, which read every column as the request count).
    let sum = |column: serving_usage::Column| Expr::col(column).sum().cast_as("bigint");
    let mut rows: Vec<(String, i64, i64, i64, i64)> = serving_usage::Entity::find()
        .select_only()
        .column(serving_usage::Column::Model)
        .column_as(sum(serving_usage::Column::PromptTokens), "prompt")
        .column_as(sum(serving_usage::Column::CompletionTokens), "completion")
        .column_as(sum(serving_usage::Column::ChargedMicrocents), "charged")
        .column_as(
            Expr::col(serving_usage::Column::RequestId)
                .count()
                .cast_as("bigint"),
            "requests",
        )
        .filter(serving_usage::Column::OrgId.eq(org_id))
        .filter(serving_usage::Column::CreatedAt.gte(since))
        .group_by(serving_usage::Column::Model)
        .into_tuple()
        .all(db)
        .await?;
    rows.sort_by_key(|r| std::cmp::Reverse(r.3));
    Ok(rows)
}

/// Every organization's balance, by organization id.
pub async fn balances(db: &impl ConnectionTrait) -> Result<Vec<(OrgId, Microcents)>, DbErr> {
    billing_account::Entity::find()
        .select_only()
        .column(billing_account::Column::OrgId)
        .column(billing_account::Column::BalanceMicrocents)
        .into_tuple()
        .all(db)
        .await
}

/// Each organization's newest ledger entry time.
pub async fn last_ledger_activity(db: &impl ConnectionTrait) -> Result<Vec<(OrgId, DateTime<Utc>)>, DbErr> {
    ledger_entry::Entity::find()
        .select_only()
        .column(ledger_entry::Column::OrgId)
        .column_as(Expr::col(ledger_entry::Column::CreatedAt).max(), "last")
        .group_by(ledger_entry::Column::OrgId)
        .into_tuple()
        .all(db)
        .await
}

/// The organization's grants: active ones (something left) first, in draw order (priority,
/// soonest expiry, oldest); then the rest, newest first.
pub async fn grants(db: &impl ConnectionTrait, org_id: &OrgId) -> Result<Vec<credit_grant::Model>, DbErr> {
    let mut all = credit_grant::Entity::find()
        .filter(credit_grant::Column::OrgId.eq(org_id.clone()))
        .all(db)
        .await?;
    all.sort_by(|a, b| {
        let active = |g: &credit_grant::Model| g.remaining_microcents > Microcents::ZERO;
        active(b).cmp(&active(a)).then_with(|| match active(a) {
            true => (
                a.priority,
                a.expires_at.is_none(),
                a.expires_at,
                a.created_at,
                &a.id,
            )
                .cmp(&(
                    b.priority,
                    b.expires_at.is_none(),
                    b.expires_at,
                    b.created_at,
                    &b.id,
                )),
            false => b.created_at.cmp(&a.created_at).then_with(|| b.id.cmp(&a.id)),
        })
    });
    Ok(all)
}

/// The organization's manual grant made with `key`.
pub async fn grant_by_key(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    key: &str,
) -> Result<Option<credit_grant::Model>, DbErr> {
    credit_grant::Entity::find()
        .filter(credit_grant::Column::OrgId.eq(org_id.clone()))
        .filter(credit_grant::Column::IdempotencyKey.eq(key))
        .one(db)
        .await
}

/// The organization's entries after id `after` (all: none), oldest first, created in
/// `[from, to)` where given; at most `limit`.
pub async fn ledger_after(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    after: Option<i64>,
    from: Option<DateTime<Utc>>,
    to: Option<DateTime<Utc>>,
    limit: u64,
) -> Result<Vec<ledger_entry::Model>, DbErr> {
    let mut query = ledger_entry::Entity::find().filter(ledger_entry::Column::OrgId.eq(org_id.clone()));
    if let Some(after) = after {
        query = query.filter(ledger_entry::Column::Id.gt(after));
    }
    if let Some(from) = from {
        query = query.filter(ledger_entry::Column::CreatedAt.gte(from));
    }
    if let Some(to) = to {
        query = query.filter(ledger_entry::Column::CreatedAt.lt(to));
    }
    query
        .order_by_asc(ledger_entry::Column::Id)
        .limit(limit)
        .all(db)
        .await
}

/// Sums of the organization's entries created before `before` (all of them) and, in
/// `[from, before)`, per (kind, whether a credit).
pub async fn month_sums(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    from: DateTime<Utc>,
    before: DateTime<Utc>,
) -> Result<(i64, Vec<(EntryKind, bool, i64)>), DbErr> {
    let opening: Option<i64> = ledger_entry::Entity::find()
        .select_only()
        .column_as(
            Expr::cust("CAST(COALESCE(SUM(amount_microcents), 0) AS BIGINT)"),
            "total",
        )
        .filter(ledger_entry::Column::OrgId.eq(org_id.clone()))
        .filter(ledger_entry::Column::CreatedAt.lt(from))
        .into_tuple()
        .one(db)
        .await?;
    let rows: Vec<(EntryKind, bool, i64)> = ledger_entry::Entity::find()
        .select_only()
        .column(ledger_entry::Column::Kind)
        .column_as(Expr::cust("amount_microcents > 0"), "credit")
        .column_as(Expr::cust("CAST(SUM(amount_microcents) AS BIGINT)"), "total")
        .filter(ledger_entry::Column::OrgId.eq(org_id.clone()))
        .filter(ledger_entry::Column::CreatedAt.gte(from))
        .filter(ledger_entry::Column::CreatedAt.lt(before))
        .group_by(ledger_entry::Column::Kind)
        .group_by(Expr::cust("amount_microcents > 0"))
        .into_tuple()
        .all(db)
        .await?;
    Ok((opening.unwrap_or(0), rows))
}

/// What auto top-ups of the organization have charged since `since` (the start of a UTC
/// month): succeeded and still-processing payments, and charges recorded but not settled.
pub async fn auto_topup_charged(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    since: DateTime<Utc>,
) -> Result<Cents, DbErr> {
    let sum = || Expr::cust("CAST(COALESCE(SUM(amount_cents), 0) AS BIGINT)");
    let paid: Option<i64> = payment::Entity::find()
        .select_only()
        .column_as(sum(), "total")
        .filter(payment::Column::OrgId.eq(org_id.clone()))
        .filter(payment::Column::Kind.eq(EntryKind::AutoTopup))
        .filter(payment::Column::Status.ne(PaymentState::Declined))
        .filter(payment::Column::CreatedAt.gte(since))
        .into_tuple()
        .one(db)
        .await?;
    let pending: Option<i64> = pending_payment::Entity::find()
        .select_only()
        .column_as(sum(), "total")
        .filter(pending_payment::Column::OrgId.eq(org_id.clone()))
        .filter(pending_payment::Column::Kind.eq(EntryKind::AutoTopup))
        .filter(pending_payment::Column::CreatedAt.gte(since))
        .into_tuple()
        .one(db)
        .await?;
    Ok(Cents(paid.unwrap_or(0) + pending.unwrap_or(0)))
}

/// Marks the month whose `billing.auto_topup.limit_reached` is sent; answers whether this
/// call marked it (once per organization and month, across instances).
pub async fn mark_limit_notified(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    month: &str,
) -> Result<bool, DbErr> {
    let marked = billing_account::Entity::update_many()
        .col_expr(
            billing_account::Column::AutoTopupLimitNotifiedMonth,
            Expr::value(month),
        )
        .filter(billing_account::Column::OrgId.eq(org_id.clone()))
        .filter(
            Expr::col(billing_account::Column::AutoTopupLimitNotifiedMonth)
                .is_null()
                .or(Expr::col(billing_account::Column::AutoTopupLimitNotifiedMonth).ne(month)),
        )
        .exec(db)
        .await?;
    Ok(marked.rows_affected == 1)
}
