//! The ledger's statements. What both dialects share is here; each dialect's own text
//! is in its module.

mod payments;
pub(super) mod postgres;
mod rows;
mod sqlite;

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use entities::{billing_account, credit_grant, ledger_entry, organization, promo_grant, serving_usage};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DbBackend, DbErr, EntityTrait, QueryFilter, QuerySelect,
};
use serde_json::json;

use super::grants::Grant;
use super::ops::ServingUsageRow;
use super::planner::{Applied, GrantRow, LedgerEvent, Writes};
use crate::domain::{EntryKind, EventType, GrantKind};
use crate::domain::{Microcents, OrgId, PaymentState};
use crate::webhooks::outbox::{self, Announcement};

pub use payments::{record_payment, settle_pending, PaymentRow};
pub use postgres::is_lock_timeout;
pub(super) use postgres::{debit_on_current, guarded_write, read_account, Guarded};

/// Locked accounts, and the organizations whose account row another transaction held.
pub(super) struct Locked {
    pub accounts: HashMap<OrgId, billing_account::Model>,
    pub contended: std::collections::HashSet<OrgId>,
}

/// Locks the accounts of `org_ids` (creating missing ones of existing organizations);
/// unknown organizations are absent from the answer. Of several organizations (PostgreSQL),
/// one whose row another transaction holds is not waited for but answered as contended.
pub(super) async fn lock_accounts(txn: &impl ConnectionTrait, org_ids: &[OrgId]) -> Result<Locked, DbErr> {
    let backend = txn.get_database_backend();
    let ids = json!(org_ids);
    let skip_locked = org_ids.len() > 1;
    let statement = match backend {
        DbBackend::Postgres => postgres::lock_accounts(ids, skip_locked),
        _ => sqlite::lock_accounts(txn, ids).await?,
    };
    let mut accounts: HashMap<OrgId, billing_account::Model> = billing_account::Entity::find()
        .from_raw_sql(statement)
        .all(txn)
        .await?
        .into_iter()
        .map(|a| (a.org_id.clone(), a))
        .collect();
    let missing: Vec<&OrgId> = org_ids.iter().filter(|id| !accounts.contains_key(*id)).collect();
    let mut contended = std::collections::HashSet::new();
    if backend == DbBackend::Postgres && skip_locked && !missing.is_empty() {
        for row in txn
            .query_all_raw(postgres::existing_accounts(json!(missing)))
            .await?
        {
            contended.insert(row.try_get_by_index::<OrgId>(0)?);
        }
    }
    for org_id in missing {
        if !contended.contains(org_id) {
            if let Some(account) = lock_account(txn, org_id).await? {
                accounts.insert(org_id.clone(), account);
            }
        }
    }
    Ok(Locked { accounts, contended })
}

/// The (organization, idempotency key) pairs among `keys` already applied, with amounts.
pub(super) async fn applied_keys(
    txn: &impl ConnectionTrait,
    keys: &[(OrgId, String)],
) -> Result<Applied, DbErr> {
    if keys.is_empty() {
        return Ok(HashMap::new());
    }
    let backend = txn.get_database_backend();
    let rows: Vec<serde_json::Value> = keys
        .iter()
        .map(|(org, key)| json!({"org_id": org, "idempotency_key": key}))
        .collect();
    let statement = match backend {
        DbBackend::Postgres => postgres::applied_keys(rows),
        _ => sqlite::applied_keys(rows),
    };
    let found = txn.query_all_raw(statement).await?;
    found
        .into_iter()
        .map(|row| {
            Ok((
                (
                    row.try_get_by_index::<OrgId>(0)?,
                    row.try_get_by_index::<String>(1)?,
                ),
                row.try_get_by_index::<Microcents>(2)?,
            ))
        })
        .collect()
}

/// The usage rows already recorded under `request_ids`, by request id.
pub(super) async fn recorded_usage(
    txn: &impl ConnectionTrait,
    request_ids: Vec<String>,
) -> Result<HashMap<String, ServingUsageRow>, DbErr> {
    if request_ids.is_empty() {
        return Ok(HashMap::new());
    }
    Ok(serving_usage::Entity::find()
        .filter(serving_usage::Column::RequestId.is_in(request_ids))
        .all(txn)
        .await?
        .into_iter()
        .map(|row| {
            (
                row.request_id.clone(),
                ServingUsageRow {
                    request_id: row.request_id,
                    org_id: row.org_id,
                    adapter_id: row.adapter_id,
                    model: row.model,
                    prompt_tokens: row.prompt_tokens,
                    completion_tokens: row.completion_tokens,
                    cost_microcents: row.cost_microcents,
                    charged_microcents: row.charged_microcents,
                },
            )
        })
        .collect())
}

/// Writes everything planned and answers, on PostgreSQL, the row version (`xmin`) each
/// updated account was left with; `None` (and nothing more written) when an optimistic
/// insert skipped an entry whose idempotency key was already applied.
pub(super) async fn flush(
    writes: Writes,
    txn: &impl ConnectionTrait,
    now: DateTime<Utc>,
) -> Result<Option<Vec<(OrgId, String)>>, DbErr> {
    if writes.entries.is_empty() {
        return Ok(Some(Vec::new()));
    }
    let versions = match txn.get_database_backend() {
        DbBackend::Postgres => postgres::write_group(txn, &writes, now).await?,
        _ => sqlite::write_group(txn, &writes, now).await?,
    };
    if versions.is_none() {
        return Ok(None);
    }
    if !writes.promo_rows.is_empty() {
        let rows = writes.promo_rows.into_iter().map(|row| promo_grant::ActiveModel {
            org_id: Set(row.org_id),
            code: Set(row.code),
            amount_cents: Set(row.amount),
            created_at: Set(now),
        });
        promo_grant::Entity::insert_many(rows)
            .exec_without_returning(txn)
            .await?;
    }
    for payment in &writes.settled_payments {
        payments::settle_pending(
            txn,
            &payment.processor_key,
            payments::PaymentRow {
                payment_intent_id: &payment.payment_intent_id,
                org_id: &payment.org_id,
                amount: payment.amount,
                status: PaymentState::Succeeded,
                kind: payment.kind,
                idempotency_key: payment.client_key.as_deref(),
            },
        )
        .await?;
    }
    if !writes.settled_auto_topups.is_empty() {
        billing_account::Entity::update_many()
            .col_expr(
                billing_account::Column::AutoTopupStartedAt,
                Option::<DateTime<Utc>>::None.into(),
            )
            .col_expr(billing_account::Column::AutoTopupDeclines, 0.into())
            .filter(billing_account::Column::OrgId.is_in(writes.settled_auto_topups))
            .exec(txn)
            .await?;
    }
    if !writes.new_grants.is_empty() {
        insert_grants(txn, &writes.new_grants, now).await?;
    }
    announce(txn, writes.events).await?;
    Ok(versions)
}

/// The active grants (something left) of `org_ids`, by organization.
pub(super) async fn active_grants(
    txn: &impl ConnectionTrait,
    org_ids: &[OrgId],
) -> Result<HashMap<OrgId, Vec<Grant>>, DbErr> {
    let rows = credit_grant::Entity::find()
        .filter(credit_grant::Column::OrgId.is_in(org_ids.iter().cloned()))
        // As the partial index states it (a bound 0 would not match it in a generic plan).
        .filter(sea_orm::sea_query::Expr::cust("remaining_microcents > 0"))
        .all(txn)
        .await?;
    let mut by_org: HashMap<OrgId, Vec<Grant>> = HashMap::new();
    for row in rows {
        by_org.entry(row.org_id.clone()).or_default().push(Grant {
            id: row.id,
            remaining: row.remaining_microcents,
            priority: row.priority,
            expires_at: row.expires_at,
            created_at: row.created_at,
        });
    }
    Ok(by_org)
}

/// The grants the batch's credits made (through the entity, so both dialects store their
/// times alike).
async fn insert_grants(
    txn: &impl ConnectionTrait,
    rows: &[GrantRow],
    now: DateTime<Utc>,
) -> Result<(), DbErr> {
    let models = rows.iter().map(|row| credit_grant::ActiveModel {
        id: Set(row.id.clone()),
        org_id: Set(row.org_id.clone()),
        kind: Set(GrantKind::parse(row.kind).unwrap_or(GrantKind::Refund)),
        original_microcents: Set(row.original),
        remaining_microcents: Set(row.remaining),
        priority: Set(row.priority),
        expires_at: Set(row.expires_at),
        reason: Set(row.reason.clone()),
        created_by: Set(row.created_by.clone()),
        idempotency_key: Set(row.idempotency_key.clone()),
        request_hash: Set(row.request_hash.clone()),
        expiring_notified_at: Set(None),
        expired_at: Set(None),
        created_at: Set(now),
    });
    credit_grant::Entity::insert_many(models)
        .exec_without_returning(txn)
        .await
        .map(drop)
}

/// Writes the batch's webhook events for the endpoints listening (the outbox): a credited
/// top-up's data is its ledger entry, read back by its key; a low balance's the balance and
/// the threshold it fell under.
async fn announce(txn: &impl ConnectionTrait, events: Vec<LedgerEvent>) -> Result<(), DbErr> {
    if events.is_empty() {
        return Ok(());
    }
    let mut orgs: Vec<OrgId> = events
        .iter()
        .map(|event| match event {
            LedgerEvent::Credited { org_id, .. }
            | LedgerEvent::BalanceLow { org_id, .. }
            | LedgerEvent::CreditExpired { org_id, .. } => org_id.clone(),
        })
        .collect();
    orgs.sort();
    orgs.dedup();
    let listeners = outbox::listeners(txn, &orgs).await?;
    if listeners.is_empty() {
        return Ok(());
    }
    let mut announcements = Vec::with_capacity(events.len());
    for event in events {
        match event {
            LedgerEvent::Credited {
                org_id,
                kind,
                idempotency_key,
            } => {
                let event_type = match kind {
                    EntryKind::AutoTopup => EventType::AutoTopupSucceeded,
                    _ => EventType::TopupSucceeded,
                };
                if listeners.of(&org_id, event_type).is_empty() {
                    continue;
                }
                let entry = ledger_entry::Entity::find()
                    .filter(ledger_entry::Column::OrgId.eq(org_id.clone()))
                    .filter(ledger_entry::Column::IdempotencyKey.eq(idempotency_key))
                    .one(txn)
                    .await?
                    .ok_or_else(|| DbErr::Custom("a credited top-up's entry is missing".into()))?;
                announcements.push(Announcement {
                    org_id,
                    event_type,
                    data: entry_data(&entry),
                });
            }
            LedgerEvent::CreditExpired {
                org_id,
                grant_id,
                microcents,
            } => announcements.push(Announcement {
                org_id,
                event_type: EventType::CreditExpired,
                data: json!({"grantId": grant_id, "expiredMicrocents": microcents}),
            }),
            LedgerEvent::BalanceLow {
                org_id,
                balance,
                threshold,
            } => announcements.push(Announcement {
                org_id,
                event_type: EventType::BalanceLow,
                data: json!({"balanceMicrocents": balance, "thresholdCents": threshold}),
            }),
        }
    }
    outbox::announce(txn, &listeners, announcements).await?;
    Ok(())
}

/// The account row, locked for this transaction (`FOR UPDATE` on PostgreSQL; SQLite's
/// single connection serializes writers), created on first use. `None`: no such org.
pub async fn lock_account(
    txn: &impl ConnectionTrait,
    org_id: &OrgId,
) -> Result<Option<billing_account::Model>, DbErr> {
    let find = || {
        billing_account::Entity::find_by_id(org_id.to_owned())
            .lock_exclusive()
            .one(txn)
    };
    if let Some(account) = find().await? {
        return Ok(Some(account));
    }
    if organization::Entity::find_by_id(org_id.to_owned())
        .one(txn)
        .await?
        .is_none()
    {
        return Ok(None);
    }
    ensure_account(txn, org_id).await?;
    find().await
}

/// Creates the organization's billing account if it has none (a new org starts at 0).
pub async fn ensure_account(db: &impl ConnectionTrait, org_id: &OrgId) -> Result<(), DbErr> {
    let now = Utc::now();
    billing_account::Entity::insert(billing_account::ActiveModel {
        org_id: Set(org_id.to_owned()),
        customer_id: Set(None),
        balance_microcents: Set(Microcents::ZERO),
        payment_method_id: Set(None),
        pm_brand: Set(None),
        pm_last4: Set(None),
        pm_exp_month: Set(None),
        pm_exp_year: Set(None),
        auto_topup_enabled: Set(false),
        auto_topup_threshold_cents: Set(None),
        auto_topup_amount_cents: Set(None),
        auto_topup_declines: Set(0),
        auto_topup_started_at: Set(None),
        starter_credit_granted: Set(false),
        auto_topup_monthly_limit_cents: Set(None),
        auto_topup_limit_notified_month: Set(None),
        created_at: Set(now),
        updated_at: Set(now),
    })
    .on_conflict_do_nothing_on([billing_account::Column::OrgId])
    .exec_without_returning(db)
    .await?;
    Ok(())
}

/// A ledger entry as `GET /api/billing/ledger` shows it (the web layer's `LedgerEntryView`;
/// a test there holds the two equal): the data of a top-up's webhook event.
pub fn entry_data(entry: &entities::ledger_entry::Model) -> serde_json::Value {
    serde_json::json!({
        "id": entry.id,
        "kind": entry.kind.to_string(),
        "amountMicrocents": entry.amount_microcents,
        "balanceAfterMicrocents": entry.balance_after_microcents,
        "reason": entry.reason,
        "createdAt": entry.created_at,
    })
}
