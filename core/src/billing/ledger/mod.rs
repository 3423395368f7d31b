//! The ledger: every change of a balance is one append-only entry, applied inside a
//! transaction that holds the organization's account row. A batch of operations (group
//! commit) is applied in order in one transaction; each still gets its own outcome.
//!
//! `ops` is what callers hand it and get back, `planner` decides (pure), `sql` writes
//! (a module per dialect), `cache` keeps PostgreSQL's last committed rows.

mod cache;
pub mod grants;
mod ops;
mod planner;
mod sql;

use std::collections::{HashMap, HashSet};

use chrono::Utc;
use sea_orm::{DatabaseConnection, DbBackend, DbErr, TransactionTrait};

use crate::domain::OrgId;

pub use cache::AccountCache;
pub use ops::{
    outcome_label, AccountAfter, AutoTopup, BatchResult, EntryKind, GrantTerms, LedgerError, LedgerOp,
    LedgerPolicy, OnDuplicate, Outcome, ServingUsageRow, SettledPayment, SideEffect, MAX_AUTO_TOPUP_DECLINES,
};
use planner::{plan, KeyCheck, Writes};
pub use sql::{
    ensure_account, entry_data, is_lock_timeout, lock_account, record_payment, settle_pending, PaymentRow,
};

/// Installs (or replaces) the ledger's database function on PostgreSQL (the debits of
/// [`apply_cached`]); nothing on SQLite. Run at every start, after the migrations.
pub async fn install(db: &DatabaseConnection) -> Result<(), DbErr> {
    match db.get_database_backend() {
        DbBackend::Postgres => sql::postgres::install(db).await,
        _ => Ok(()),
    }
}

/// Applies `ops` in order in one transaction. `Err` means nothing was written (the caller
/// may retry the operations one by one).
pub async fn apply_batch(
    db: &DatabaseConnection,
    cache: Option<&AccountCache>,
    policy: LedgerPolicy,
    org_id: &OrgId,
    ops: &[LedgerOp],
) -> Result<BatchResult, DbErr> {
    let mut results = apply_group(db, cache, policy, &[(org_id, ops)]).await?;
    Ok(results.pop().unwrap_or(BatchResult {
        outcomes: Vec::new(),
        account: None,
    }))
}

/// Several organizations' batches in one transaction, with set-based statements: one
/// lock of all accounts (ascending order, so instances doing the same never deadlock),
/// then the entries, usage rows and balances. On PostgreSQL the group is first tried
/// without looking its keys up (the unique index checks them anyway); only a group that
/// repeats a key pays for the look-up, in a second transaction. `Err`: nothing written.
pub async fn apply_group(
    db: &DatabaseConnection,
    cache: Option<&AccountCache>,
    policy: LedgerPolicy,
    batches: &[(&OrgId, &[LedgerOp])],
) -> Result<Vec<BatchResult>, DbErr> {
    let distinct: HashSet<&OrgId> = batches.iter().map(|(org, _)| *org).collect();
    if distinct.len() != batches.len() {
        // Each planned batch starts from the locked balance: one batch per organization.
        return Err(DbErr::Custom(
            "an organization appears twice in one ledger group".into(),
        ));
    }
    if db.get_database_backend() == DbBackend::Postgres {
        if let (Some(cache), [(org_id, ops)]) = (cache, batches) {
            if let Some((result, _)) = apply_cached(db, cache, policy, org_id, ops).await? {
                return Ok(vec![result]);
            }
        }
    }
    apply_group_locked(db, cache, policy, batches).await
}

/// How a guarded statement checked that its batch still held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// The row version the batch was planned on.
    Version,
    /// Plain debits of one grant, checked by the debit function against the account as it
    /// locked it.
    CurrentAccount,
}

impl Guard {
    /// Its label in `keel_ledger_guarded_writes_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Version => "version",
            Self::CurrentAccount => "current_account",
        }
    }
}

/// PostgreSQL: one organization's batch written by guarded autocommit statements (see
/// [`apply_cached`]), without a transaction or a lock held across a round trip, and the
/// guard of the statement that wrote it. `None`: not written (not applicable, refused, or
/// the row kept moving); the locked path decides. Nothing on SQLite.
pub async fn apply_guarded(
    db: &DatabaseConnection,
    cache: &AccountCache,
    policy: LedgerPolicy,
    org_id: &OrgId,
    ops: &[LedgerOp],
) -> Result<Option<(BatchResult, Guard)>, DbErr> {
    match db.get_database_backend() {
        DbBackend::Postgres => apply_cached(db, cache, policy, org_id, ops).await,
        _ => Ok(None),
    }
}

/// [`apply_group`] on the locked path only (the guarded statements already tried).
pub async fn apply_group_locked(
    db: &DatabaseConnection,
    cache: Option<&AccountCache>,
    policy: LedgerPolicy,
    batches: &[(&OrgId, &[LedgerOp])],
) -> Result<Vec<BatchResult>, DbErr> {
    let distinct: HashSet<&OrgId> = batches.iter().map(|(org, _)| *org).collect();
    if distinct.len() != batches.len() {
        return Err(DbErr::Custom(
            "an organization appears twice in one ledger group".into(),
        ));
    }
    if db.get_database_backend() == DbBackend::Postgres {
        if let Some(results) = apply_group_with(db, cache, policy, batches, KeyCheck::Optimistic).await? {
            return Ok(results);
        }
    }
    apply_group_with(db, cache, policy, batches, KeyCheck::LookUp)
        .await?
        .ok_or_else(|| DbErr::Custom("ledger entries skipped after their keys were looked up".into()))
}

/// One attempt of `apply_group`; `None`: an optimistic attempt met a key already applied
/// and wrote nothing.
async fn apply_group_with(
    db: &DatabaseConnection,
    cache: Option<&AccountCache>,
    policy: LedgerPolicy,
    batches: &[(&OrgId, &[LedgerOp])],
    check: KeyCheck,
) -> Result<Option<Vec<BatchResult>>, DbErr> {
    let started = std::time::Instant::now();
    let txn = db.begin().await?;
    let org_ids: Vec<OrgId> = batches.iter().map(|(org, _)| (*org).clone()).collect();
    let sql::Locked { accounts, contended } = sql::lock_accounts(&txn, &org_ids).await?;
    // Read under the accounts' locks: every change of a grant holds its account's.
    let mut grants = sql::active_grants(&txn, &org_ids).await?;

    let mut applied = match check {
        KeyCheck::Optimistic => HashMap::new(),
        KeyCheck::LookUp => {
            let keys: Vec<(OrgId, String)> = batches
                .iter()
                .flat_map(|(org, ops)| {
                    ops.iter()
                        .filter_map(|op| op.idempotency_key.clone().map(|k| ((*org).clone(), k)))
                })
                .collect();
            sql::applied_keys(&txn, &keys).await?
        }
    };
    // Serving replays are found by the organization's idempotency key; a request id used
    // by another organization trips the usage table's primary key, and the one-by-one
    // retry of that batch (a batch of one) looks it up globally here.
    let single = batches.iter().map(|(_, ops)| ops.len()).sum::<usize>() == 1;
    let usage_ids: Vec<String> = batches
        .iter()
        .flat_map(|(org, ops)| {
            let applied = &applied;
            ops.iter().filter_map(move |op| match &op.side {
                SideEffect::ServingUsage(row)
                    if single
                        || op
                            .idempotency_key
                            .as_ref()
                            .is_some_and(|k| applied.contains_key(&((*org).clone(), k.clone()))) =>
                {
                    Some(row.request_id.clone())
                }
                _ => None,
            })
        })
        .collect();
    let mut usage = sql::recorded_usage(&txn, usage_ids).await?;

    let now = Utc::now();
    let mut writes = Writes::new(check).policy(policy);
    let mut results = Vec::with_capacity(batches.len());
    for (org_id, ops) in batches {
        if contended.contains(*org_id) {
            results.push(BatchResult {
                outcomes: ops.iter().map(|_| Err(LedgerError::Contended)).collect(),
                account: None,
            });
            continue;
        }
        let Some(account) = accounts.get(*org_id) else {
            results.push(BatchResult {
                outcomes: ops.iter().map(|_| Err(LedgerError::UnknownOrg)).collect(),
                account: None,
            });
            continue;
        };
        let held = grants.remove(*org_id).unwrap_or_default();
        results.push(plan(
            org_id,
            account,
            &held,
            ops,
            &mut applied,
            &mut usage,
            &mut writes,
            now,
        ));
    }
    // What the cache learns from this commit (the flush consumes the writes).
    let after = cache.map(|_| {
        let grants: HashMap<OrgId, Vec<grants::Grant>> = writes.grants_after.iter().cloned().collect();
        (
            writes.balances.clone(),
            writes.settled_auto_topups.clone(),
            grants,
        )
    });
    let versions = match writes.keys_unchecked {
        true => None,
        false => sql::flush(writes, &txn, now).await?,
    };
    let Some(versions) = versions else {
        // Rolled back before the caller plans again: the retry locks the same accounts.
        txn.rollback().await?;
        return Ok(None);
    };
    txn.commit().await?;
    tracing::debug!(
        orgs = batches.len(),
        elapsed_us = started.elapsed().as_micros() as u64,
        "locked ledger group committed"
    );
    if let (Some(cache), Some((balances, settled, mut grants))) = (cache, after) {
        // What this transaction left is what the next batch of these organizations may
        // plan on (unless another writer moves the row first, which its version shows).
        // Settling a top-up also changes fields the plan does not track: not kept.
        for (org_id, _) in batches {
            cache.forget(org_id);
        }
        let versions: HashMap<OrgId, String> = versions.into_iter().collect();
        for row in balances.iter().filter(|row| !settled.contains(&row.org_id)) {
            if let (Some(account), Some(version)) = (accounts.get(&row.org_id), versions.get(&row.org_id)) {
                let held = grants.remove(&row.org_id).unwrap_or_default();
                cache.put(row.account_after(account, now), held, version.clone());
            }
        }
    }
    Ok(Some(results))
}

/// The grant a planned batch drew all of its debits from, and their sum: a batch of plain
/// debits (no side effect, payment or grant terms), each planned as a new entry, one grant
/// changed by exactly their sum (no overdraft, nothing lapsed). `None`: another batch, which
/// the version-guarded write takes.
fn one_grant_debits(
    ops: &[LedgerOp],
    result: &BatchResult,
    writes: &Writes,
    held: &[grants::Grant],
) -> Option<(String, crate::domain::Microcents)> {
    use crate::domain::Microcents;
    let plain = ops.iter().all(|op| {
        op.amount < Microcents::ZERO
            && matches!(op.side, SideEffect::None)
            && op.payment.is_none()
            && op.grant.is_none()
    });
    let all_new = result
        .outcomes
        .iter()
        .all(|outcome| matches!(outcome, Ok(outcome) if !outcome.replayed));
    if !plain || !all_new || writes.entries.len() != ops.len() || !writes.usage_rows.is_empty() {
        return None;
    }
    let [change] = writes.grant_changes.as_slice() else {
        return None;
    };
    let total = writes
        .entries
        .iter()
        .fold(Microcents::ZERO, |sum, entry| sum + entry.amount);
    let before = held.iter().find(|g| g.id == change.id)?.remaining;
    (!change.expired && change.remaining == before + total).then(|| (change.id.clone(), total))
}

/// One organization's batch planned on `account` and `held` as if every key were new (a
/// guarded statement's plan: the unique index checks the keys).
fn plan_alone(
    policy: LedgerPolicy,
    org_id: &OrgId,
    account: &entities::billing_account::Model,
    held: &[grants::Grant],
    ops: &[LedgerOp],
    now: chrono::DateTime<Utc>,
) -> (BatchResult, Writes) {
    let mut writes = Writes::new(KeyCheck::Optimistic).policy(policy);
    let result = plan(
        org_id,
        account,
        held,
        ops,
        &mut HashMap::new(),
        &mut HashMap::new(),
        &mut writes,
        now,
    );
    (result, writes)
}

/// A batch [`sql::debit_on_current`] wrote on `found`: planned again on it (what the
/// function wrote, so the outcomes' balances are those of the entries), and what it left
/// kept for the next batch.
#[allow(clippy::too_many_arguments)]
fn replan_written(
    cache: &AccountCache,
    policy: LedgerPolicy,
    org_id: &OrgId,
    ops: &[LedgerOp],
    found: sql::postgres::ReadAccount,
    (grant_id, total): (String, crate::domain::Microcents),
    version: String,
    now: chrono::DateTime<Utc>,
) -> BatchResult {
    let (account, held, _) = found;
    let (result, mut writes) = plan_alone(policy, org_id, &account, &held, ops, now);
    // The same debits of the same grant as the function wrote, and nothing announced.
    let same =
        writes.events.is_empty() && one_grant_debits(ops, &result, &writes, &held) == Some((grant_id, total));
    match writes.balances.first() {
        Some(after) if same && after.balance == account.balance_microcents + total => {
            let held = writes.grants_after.pop().map(|(_, g)| g).unwrap_or_default();
            cache.put(after.account_after(&account, now), held, version);
        }
        // The function wrote what the planner would not have: nothing kept (the next batch
        // reads the account), and said loudly.
        _ => {
            tracing::error!(org_id = %org_id, "a ledger debit was written where the planner plans otherwise")
        }
    }
    result
}

/// Guarded writes one batch tries (the kept account, then the account read again after
/// each time the row moved) before it takes the locked path.
const GUARDED_TRIES: usize = 3;

/// PostgreSQL: one planned batch of one organization written in one autocommit
/// statement, planned on the account as this process last committed it and guarded by
/// that row version (`xmin`): no `BEGIN`, no lock round trip, no separate `COMMIT`. If none
/// was kept, the account is read as it is now (one unlocked statement); if the row moved
/// meanwhile (another instance wrote it, say), the failed statement answers the account as
/// it found it, and the batch is planned and written again on that, a few times, so instances that charge the same organization never hold its row across a
/// round trip. `None`: not applicable, refused, or still moving (the caller takes the locked
/// path, which looks at the row itself).
async fn apply_cached(
    db: &DatabaseConnection,
    cache: &AccountCache,
    policy: LedgerPolicy,
    org_id: &OrgId,
    ops: &[LedgerOp],
) -> Result<Option<(BatchResult, Guard)>, DbErr> {
    let mut kept = cache.get(org_id);
    let started = std::time::Instant::now();
    for attempt in 1..=GUARDED_TRIES {
        let (account, held, version) = match kept.take() {
            Some(kept) => kept,
            None => match sql::read_account(db, org_id).await? {
                Some(read) => read,
                None => return Ok(None),
            },
        };
        let now = Utc::now();
        let (result, mut writes) = plan_alone(policy, org_id, &account, &held, ops, now);
        // Only a batch whose account row it updates is checked by the guard; promo grants,
        // settled top-ups, webhook events and new grants write more than this statement does
        // (changes of existing grants it writes, under the same guard).
        let Some(after) = writes.balances.first().cloned() else {
            return Ok(None);
        };
        if writes.keys_unchecked
            || !writes.promo_rows.is_empty()
            || !writes.settled_auto_topups.is_empty()
            || !writes.settled_payments.is_empty()
            || !writes.events.is_empty()
            || !writes.new_grants.is_empty()
        {
            return Ok(None);
        }
        // Plain debits of one grant are written on the account as it is, if the plan holds
        // on it (no version to match); any other batch only on the row it was planned on.
        let debits = one_grant_debits(ops, &result, &writes, &held);
        let written = match &debits {
            Some((grant_id, total)) => {
                sql::debit_on_current(
                    db,
                    &writes,
                    org_id,
                    grant_id,
                    *total,
                    account.balance_microcents,
                    now,
                    policy.low_balance.micros(),
                )
                .await
            }
            None => sql::guarded_write(db, &writes, &after, now, version).await,
        };
        cache.forget(org_id);
        match written? {
            sql::Guarded::Written(version) => {
                tracing::debug!(org_id = %org_id, attempt, elapsed_us = started.elapsed().as_micros() as u64, "guarded ledger write");
                let held = writes.grants_after.pop().map(|(_, g)| g).unwrap_or_default();
                cache.put(after.account_after(&account, now), held, version);
                return Ok(Some((result, Guard::Version)));
            }
            sql::Guarded::WrittenOn { found, version } => {
                tracing::debug!(org_id = %org_id, attempt, elapsed_us = started.elapsed().as_micros() as u64, "ledger debit on the current account");
                let drawn = debits.unwrap_or_default();
                let result = replan_written(cache, policy, org_id, ops, *found, drawn, version, now);
                return Ok(Some((result, Guard::CurrentAccount)));
            }
            // Planned again on the account as the failed write found it.
            sql::Guarded::Moved(found) => match found {
                Some(found) => kept = Some(*found),
                None => return Ok(None),
            },
            sql::Guarded::Refused => return Ok(None),
        }
    }
    tracing::debug!(org_id = %org_id, elapsed_us = started.elapsed().as_micros() as u64, "guarded ledger writes lost to other writers; taking the locked path");
    Ok(None)
}
