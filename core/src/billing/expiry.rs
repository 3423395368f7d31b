//! The expiry sweep every instance runs: a grant whose expiry has passed has its remainder
//! turned into an `expiry` ledger entry, through the ledger (serialized with the account's
//! other changes; keyed by the grant, so two instances, or a sweep repeated after a crash,
//! expire it once); a grant that expires within 7 days is announced once
//! (`billing.credit.expiring`, written with the mark that it was).

use chrono::{DateTime, Duration, Utc};
use entities::credit_grant;
use sea_orm::{
    ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect, TransactionTrait,
};
use serde_json::json;

use super::ledger::{LedgerError, LedgerOp};
use super::{Billing, BillingError};
use crate::domain::Microcents;
use crate::webhooks::outbox::{self, Announcement};

/// How long before its expiry a grant is announced as expiring.
pub const EXPIRING_NOTICE_DAYS: i64 = 7;
/// Grants handled per pass (the next pass takes the rest).
const PER_PASS: u64 = 500;

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Swept {
    pub expired: u64,
    pub expired_microcents: i64,
    pub announced: u64,
}

/// Grants with something left whose expiry is at or before `until`, soonest first.
async fn lapsing(
    db: &impl ConnectionTrait,
    until: DateTime<Utc>,
    unannounced_only: bool,
) -> Result<Vec<credit_grant::Model>, DbErr> {
    let mut query = credit_grant::Entity::find()
        // As the partial index states it.
        .filter(sea_orm::sea_query::Expr::cust("remaining_microcents > 0"))
        .filter(credit_grant::Column::ExpiresAt.lte(until));
    if unannounced_only {
        query = query.filter(credit_grant::Column::ExpiringNotifiedAt.is_null());
    }
    query
        .order_by_asc(credit_grant::Column::ExpiresAt)
        .limit(PER_PASS)
        .all(db)
        .await
}

/// One pass at `now`: announces the grants expiring within 7 days (once each), then expires
/// the grants whose time has come.
pub async fn sweep(billing: &Billing, now: DateTime<Utc>) -> Result<Swept, BillingError> {
    let mut swept = Swept::default();
    for grant in lapsing(&billing.db, now + Duration::days(EXPIRING_NOTICE_DAYS), true).await? {
        let Some(expires_at) = grant.expires_at.filter(|at| *at > now) else {
            continue;
        };
        let txn = billing.db.begin().await?;
        let marked = credit_grant::Entity::update_many()
            .col_expr(credit_grant::Column::ExpiringNotifiedAt, now.into())
            .filter(credit_grant::Column::Id.eq(grant.id.clone()))
            .filter(credit_grant::Column::ExpiringNotifiedAt.is_null())
            .exec(&txn)
            .await?;
        if marked.rows_affected == 1 {
            outbox::emit(
                &txn,
                vec![Announcement {
                    org_id: grant.org_id.clone(),
                    event_type: crate::domain::EventType::CreditExpiring,
                    data: json!({
                        "grantId": grant.id,
                        "kind": grant.kind.as_str(),
                        "remainingMicrocents": grant.remaining_microcents,
                        "expiresAt": expires_at,
                    }),
                }],
            )
            .await?;
            swept.announced += 1;
        }
        txn.commit().await?;
    }
    for grant in lapsing(&billing.db, now, false).await? {
        match billing
            .ledger
            .submit(&grant.org_id, LedgerOp::expiry(&grant.id))
            .await
        {
            // (The ledger counts expiries in the metrics, whoever wrote them.)
            Ok(outcome) if outcome.amount < Microcents::ZERO => {
                tracing::info!(
                    target: "keel_event",
                    event = "grant.expired",
                    org_id = %grant.org_id,
                    grant_id = %grant.id,
                    kind = grant.kind.as_str(),
                    expired_microcents = -outcome.amount.get(),
                    "credit grant expired"
                );
                swept.expired += 1;
                swept.expired_microcents += -outcome.amount.get();
            }
            // Nothing was left, or another instance, an earlier pass or an operation of the
            // organization expired it first.
            Ok(_) | Err(LedgerError::Duplicate) => {}
            Err(err) => return Err(err.into()),
        }
    }
    Ok(swept)
}

/// Sweeps every `billing.expiry_sweep_secs` until the process stops.
pub async fn run(billing: Billing) {
    let every = std::time::Duration::from_secs(billing.settings.expiry_sweep_secs.max(1));
    let stopping = billing.stopping.clone();
    loop {
        match sweep(&billing, Utc::now()).await {
            Ok(swept) if swept != Swept::default() => tracing::info!(?swept, "credit grants swept"),
            Ok(_) => {}
            Err(err) => tracing::warn!(error = %err, "expiring credit grants failed; next pass later"),
        }
        tokio::select! {
            _ = stopping.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}
