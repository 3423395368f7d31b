//! The ledger: every change of a balance is one append-only entry, applied inside a
//! transaction that holds the organization's account row. A batch of operations (group
//! commit) is applied in order in one transaction; each still gets its own outcome.

use std::collections::{HashMap, HashSet};
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use entities::{billing_account, organization, promo_grant, serving_usage};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseConnection, DbBackend, DbErr, EntityTrait,
    QueryFilter, QuerySelect, Statement, TransactionTrait, Value,
};
use serde_json::json;

use crate::domain::IdempotencyKey;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    Topup,
    AutoTopup,
    Promo,
    StarterCredit,
    RunFee,
    ServingUsage,
    TrainingEstimate,
    TrainingRun,
}

impl EntryKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Topup => "topup",
            Self::AutoTopup => "auto_topup",
            Self::Promo => "promo",
            Self::StarterCredit => "starter_credit",
            Self::RunFee => "run_fee",
            Self::ServingUsage => "serving_usage",
            Self::TrainingEstimate => "training_estimate",
            Self::TrainingRun => "training_run",
        }
    }
}

/// What a repeated idempotency key means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnDuplicate {
    /// Answer the original change again (`replayed: true`).
    Replay,
    /// Refuse the repeat (409): a one-time grant.
    Conflict,
}

/// Rows written with the entry, in the same transaction.
#[derive(Debug, Clone)]
pub enum SideEffect {
    None,
    ServingUsage(ServingUsageRow),
    PromoGrant {
        code: String,
        cents: i64,
    },
    StarterCredit,
    /// The credit of an auto top-up: ends the one in flight and clears the declines.
    AutoTopupCredited,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServingUsageRow {
    pub request_id: String,
    pub org_id: String,
    pub adapter_id: Option<String>,
    pub model: String,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub cost_microcents: i64,
    pub charged_microcents: i64,
}

#[derive(Debug, Clone)]
pub struct LedgerOp {
    pub kind: EntryKind,
    /// Signed change: credits positive, debits negative.
    pub amount_microcents: i64,
    pub idempotency_key: Option<String>,
    pub reason: String,
    pub on_duplicate: OnDuplicate,
    /// A debit for work already delivered may leave the balance below zero; fees and
    /// estimates may not (they answer 402 instead).
    pub may_overdraw: bool,
    pub side: SideEffect,
}

impl LedgerOp {
    pub fn credit(
        kind: EntryKind,
        micros: i64,
        key: Option<IdempotencyKey>,
        reason: impl Into<String>,
    ) -> Self {
        Self {
            kind,
            amount_microcents: micros,
            idempotency_key: key.map(String::from),
            reason: reason.into(),
            on_duplicate: OnDuplicate::Replay,
            may_overdraw: false,
            side: SideEffect::None,
        }
    }

    pub fn debit(
        kind: EntryKind,
        micros: i64,
        key: Option<IdempotencyKey>,
        reason: impl Into<String>,
    ) -> Self {
        Self {
            amount_microcents: -micros,
            ..Self::credit(kind, 0, key, reason)
        }
    }

    pub fn overdrawing(mut self) -> Self {
        self.may_overdraw = true;
        self
    }

    pub fn once_only(mut self) -> Self {
        self.on_duplicate = OnDuplicate::Conflict;
        self
    }

    pub fn with_side(mut self, side: SideEffect) -> Self {
        self.side = side;
        self
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    /// The (original, for a replay) signed change.
    pub amount_microcents: i64,
    /// The balance right after this operation (the current one, for a replay).
    pub balance_microcents: i64,
    pub replayed: bool,
    /// For serving charges: the recorded usage row (the original one, for a replay).
    pub serving: Option<ServingUsageRow>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LedgerError {
    #[error("insufficient balance: {balance_microcents} µ¢ available, {needed_microcents} µ¢ needed")]
    InsufficientFunds {
        balance_microcents: i64,
        needed_microcents: i64,
    },
    #[error("organization not found")]
    UnknownOrg,
    #[error("already applied")]
    Duplicate,
    #[error("ledger unavailable: {0}")]
    Unavailable(String),
}

/// What the account looked like once the batch committed (auto top-up reads it).
#[derive(Debug, Clone)]
pub struct AccountAfter {
    pub balance_microcents: i64,
    pub auto_topup: Option<AutoTopup>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AutoTopup {
    pub threshold_cents: i64,
    pub amount_cents: i64,
}

pub struct BatchResult {
    pub outcomes: Vec<Result<Outcome, LedgerError>>,
    pub account: Option<AccountAfter>,
}

/// Consecutive declines after which auto top-up pauses until its settings are saved.
pub const MAX_AUTO_TOPUP_DECLINES: i32 = 3;

/// Applies `ops` in order in one transaction. `Err` means nothing was written (the caller
/// may retry the operations one by one).
pub async fn apply_batch(
    db: &DatabaseConnection,
    cache: Option<&AccountCache>,
    org_id: &str,
    ops: &[LedgerOp],
) -> Result<BatchResult, DbErr> {
    let mut results = apply_group(db, cache, &[(org_id, ops)]).await?;
    Ok(results.pop().unwrap_or(BatchResult {
        outcomes: Vec::new(),
        account: None,
    }))
}

/// How a group finds the idempotency keys it repeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyCheck {
    /// Look every key up before planning.
    LookUp,
    /// Plan as if every key were new and let the unique index say otherwise: the entries
    /// are inserted with `ON CONFLICT DO NOTHING`, and if one was skipped the whole
    /// transaction is dropped and the group planned again with `LookUp` (PostgreSQL).
    Optimistic,
}

/// Several organizations' batches in one transaction, with set-based statements: one
/// lock of all accounts (ascending order, so instances doing the same never deadlock),
/// then the entries, usage rows and balances (one statement on PostgreSQL, so one round
/// trip while the accounts are locked; three on SQLite, which has no round trips). Repeated
/// idempotency keys are rare, so on PostgreSQL the group is first tried without looking
/// its keys up (the unique index checks them anyway); only a group that repeats a key
/// pays for the look-up, in a second transaction. `Err`: nothing was written.
pub async fn apply_group(
    db: &DatabaseConnection,
    cache: Option<&AccountCache>,
    batches: &[(&str, &[LedgerOp])],
) -> Result<Vec<BatchResult>, DbErr> {
    let distinct: HashSet<&str> = batches.iter().map(|(org, _)| *org).collect();
    if distinct.len() != batches.len() {
        // Each planned batch starts from the locked balance: one batch per organization.
        return Err(DbErr::Custom(
            "an organization appears twice in one ledger group".into(),
        ));
    }
    if db.get_database_backend() == DbBackend::Postgres {
        if let (Some(cache), [(org_id, ops)]) = (cache, batches) {
            if let Some(result) = apply_cached(db, cache, org_id, ops).await {
                return Ok(vec![result]);
            }
        }
        if let Some(results) = apply_group_with(db, cache, batches, KeyCheck::Optimistic).await? {
            return Ok(results);
        }
    }
    apply_group_with(db, cache, batches, KeyCheck::LookUp)
        .await?
        .ok_or_else(|| DbErr::Custom("ledger entries skipped after their keys were looked up".into()))
}

/// One attempt of `apply_group`; `None`: an optimistic attempt met a key already applied
/// and wrote nothing.
async fn apply_group_with(
    db: &DatabaseConnection,
    cache: Option<&AccountCache>,
    batches: &[(&str, &[LedgerOp])],
    check: KeyCheck,
) -> Result<Option<Vec<BatchResult>>, DbErr> {
    let txn = db.begin().await?;
    let org_ids: Vec<String> = batches.iter().map(|(org, _)| (*org).to_owned()).collect();
    let accounts = lock_accounts(&txn, &org_ids).await?;

    let mut applied = match check {
        KeyCheck::Optimistic => HashMap::new(),
        KeyCheck::LookUp => {
            let keys: Vec<(String, String)> = batches
                .iter()
                .flat_map(|(org, ops)| {
                    ops.iter()
                        .filter_map(|op| op.idempotency_key.clone().map(|k| ((*org).to_owned(), k)))
                })
                .collect();
            applied_keys(&txn, &keys).await?
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
                            .is_some_and(|k| applied.contains_key(&((*org).to_owned(), k.clone()))) =>
                {
                    Some(row.request_id.clone())
                }
                _ => None,
            })
        })
        .collect();
    let mut usage: HashMap<String, ServingUsageRow> = if usage_ids.is_empty() {
        HashMap::new()
    } else {
        serving_usage::Entity::find()
            .filter(serving_usage::Column::RequestId.is_in(usage_ids))
            .all(&txn)
            .await?
            .into_iter()
            .map(|row| (row.request_id.clone(), usage_row_of(row)))
            .collect()
    };

    let now = Utc::now();
    let mut writes = Writes::new(check);
    let mut results = Vec::with_capacity(batches.len());
    for (org_id, ops) in batches {
        let Some(account) = accounts.get(*org_id) else {
            results.push(BatchResult {
                outcomes: ops.iter().map(|_| Err(LedgerError::UnknownOrg)).collect(),
                account: None,
            });
            continue;
        };
        results.push(plan(
            org_id,
            account,
            ops,
            &mut applied,
            &mut usage,
            &mut writes,
            now,
        ));
    }
    // What the cache learns from this commit (the flush consumes the writes).
    let after = cache.map(|_| (writes.balances.clone(), writes.settled_auto_topups.clone()));
    let versions = match writes.keys_unchecked {
        true => None,
        false => writes.flush(&txn, now).await?,
    };
    let Some(versions) = versions else {
        // Rolled back before the caller plans again: the retry locks the same accounts.
        txn.rollback().await?;
        return Ok(None);
    };
    txn.commit().await?;
    if let (Some(cache), Some((balances, settled))) = (cache, after) {
        // What this transaction left is what the next batch of these organizations may
        // plan on (unless another writer moves the row first, which its version shows).
        // Settling a top-up also changes fields the plan does not track: not kept.
        for (org_id, _) in batches {
            cache.forget(org_id);
        }
        let versions: HashMap<String, String> = versions.into_iter().collect();
        for row in balances.iter().filter(|row| !settled.contains(&row.org_id)) {
            if let (Some(account), Some(version)) = (accounts.get(&row.org_id), versions.get(&row.org_id)) {
                cache.put(row.account_after(account, now), version.clone());
            }
        }
    }
    Ok(Some(results))
}

/// PostgreSQL: one planned batch of one organization written in one autocommit
/// statement, planned on the account as this process last committed it and guarded by
/// that row version (`xmin`, which every update of the row changes): no `BEGIN`, no lock
/// round trip, no separate `COMMIT`. The statement writes everything or nothing: if the
/// row moved meanwhile (another instance, a settings change) the guarded update matches
/// nothing and neither do the inserts; an idempotency key or request id already taken
/// fails the statement. `None`: not applicable, or nothing written (the caller takes the
/// locked path, which looks at the row itself).
async fn apply_cached(
    db: &DatabaseConnection,
    cache: &AccountCache,
    org_id: &str,
    ops: &[LedgerOp],
) -> Option<BatchResult> {
    let (account, version) = cache.get(org_id)?;
    let now = Utc::now();
    let mut writes = Writes::new(KeyCheck::Optimistic);
    let result = plan(
        org_id,
        &account,
        ops,
        &mut HashMap::new(),
        &mut HashMap::new(),
        &mut writes,
        now,
    );
    // Only a batch whose account row it updates is checked by the guard; promo grants
    // and settled top-ups write more than this statement does.
    let after = writes.balances.first()?.clone();
    if writes.keys_unchecked || !writes.promo_rows.is_empty() || !writes.settled_auto_topups.is_empty() {
        return None;
    }
    let params = [
        Value::from(serde_json::Value::Array(writes.entries)),
        Value::from(serde_json::Value::Array(writes.usage_rows)),
        Value::from(org_id),
        Value::from(now),
        Value::from(after.balance),
        Value::from(after.starter),
        Value::from(version),
    ];
    let answer = db
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            &*PG_GUARDED_WRITES,
            params,
        ))
        .await;
    // A row: written, with the account's new version. No row: the account had moved and
    // nothing was written. An error (a key already taken, the database): nothing written.
    let version = match answer {
        Ok(row) => row.and_then(|row| row.try_get_by_index::<String>(0).ok()),
        Err(err) => {
            tracing::debug!(org_id, error = %err, "guarded ledger write refused; taking the locked path");
            None
        }
    };
    cache.forget(org_id);
    cache.put(after.account_after(&account, now), version?);
    Some(result)
}

/// PostgreSQL: each organization's account as this process last committed it, with the
/// row version (`xmin`) that commit left, for [`apply_cached`]. Entries older than
/// [`AccountCache::TTL`] are not used (the version is a transaction id, so a stale entry
/// must never live long enough for the id to come round again).
#[derive(Default)]
pub struct AccountCache {
    accounts: Mutex<HashMap<String, (billing_account::Model, String, Instant)>>,
}

impl AccountCache {
    const TTL: Duration = Duration::from_secs(30);
    const MAX: usize = 10_000;

    fn get(&self, org_id: &str) -> Option<(billing_account::Model, String)> {
        let accounts = self.accounts.lock().unwrap_or_else(|p| p.into_inner());
        let (account, version, at) = accounts.get(org_id)?;
        (at.elapsed() < Self::TTL).then(|| (account.clone(), version.clone()))
    }

    fn put(&self, account: billing_account::Model, version: String) {
        let mut accounts = self.accounts.lock().unwrap_or_else(|p| p.into_inner());
        if accounts.len() >= Self::MAX {
            accounts.retain(|_, (_, _, at)| at.elapsed() < Self::TTL);
            if accounts.len() >= Self::MAX {
                accounts.clear();
            }
        }
        accounts.insert(account.org_id.clone(), (account, version, Instant::now()));
    }

    fn forget(&self, org_id: &str) {
        let mut accounts = self.accounts.lock().unwrap_or_else(|p| p.into_inner());
        accounts.remove(org_id);
    }
}

/// An account's planned balance and starter-credit flag after its batch (a JSON row of
/// the balance update).
#[derive(Debug, Clone, serde::Serialize)]
struct BalanceRow {
    org_id: String,
    balance: i64,
    starter: bool,
}

impl BalanceRow {
    /// `account` as this row leaves it.
    fn account_after(&self, account: &billing_account::Model, now: DateTime<Utc>) -> billing_account::Model {
        billing_account::Model {
            balance_microcents: self.balance,
            starter_credit_granted: self.starter,
            updated_at: now,
            ..account.clone()
        }
    }
}

/// Rows a group writes, gathered while planning.
struct Writes {
    /// How this attempt checks idempotency keys.
    check: KeyCheck,
    entries: Vec<serde_json::Value>,
    usage_rows: Vec<serde_json::Value>,
    seen_requests: HashSet<String>,
    promo_rows: Vec<promo_grant::ActiveModel>,
    balances: Vec<BalanceRow>,
    settled_auto_topups: Vec<String>,
    /// An optimistic plan refused a keyed operation: its outcome needs the key looked up.
    keys_unchecked: bool,
}

impl Writes {
    fn new(check: KeyCheck) -> Self {
        Self {
            check,
            entries: Vec::new(),
            usage_rows: Vec::new(),
            seen_requests: HashSet::new(),
            promo_rows: Vec::new(),
            balances: Vec::new(),
            settled_auto_topups: Vec::new(),
            keys_unchecked: false,
        }
    }

    /// Writes everything and answers, on PostgreSQL, the row version (`xmin`) each
    /// updated account was left with; `None` (and nothing more written) when an
    /// optimistic insert skipped an entry whose idempotency key was already applied.
    async fn flush(
        self,
        txn: &impl ConnectionTrait,
        now: DateTime<Utc>,
    ) -> Result<Option<Vec<(String, String)>>, DbErr> {
        let mut versions = Vec::new();
        if self.entries.is_empty() {
            return Ok(Some(versions));
        }
        let planned = self.entries.len() as u64;
        if txn.get_database_backend() == DbBackend::Postgres {
            // One statement, so one round trip, for entries, usage rows and balances.
            let usage = self.usage_rows.len() as u64;
            let params = [
                Value::from(serde_json::Value::Array(self.entries)),
                Value::from(serde_json::Value::Array(self.usage_rows)),
                Value::from(serde_json::to_value(&self.balances).map_err(|e| DbErr::Custom(e.to_string()))?),
                Value::from(now),
            ];
            let sql = match self.check {
                KeyCheck::LookUp => &*PG_WRITES,
                KeyCheck::Optimistic => &*PG_WRITES_SKIPPING_APPLIED,
            };
            let row = txn
                .query_one_raw(Statement::from_sql_and_values(DbBackend::Postgres, sql, params))
                .await?
                .ok_or_else(|| DbErr::Custom("the ledger write answered no row".into()))?;
            let (entries, usage_rows): (i64, i64) = (row.try_get_by_index(0)?, row.try_get_by_index(1)?);
            if entries as u64 != planned || usage_rows as u64 != usage {
                return Ok(None);
            }
            let updated: Option<String> = row.try_get_by_index(2)?;
            if let Some(updated) = updated {
                versions = serde_json::from_str::<Vec<(String, String)>>(&updated)
                    .map_err(|e| DbErr::Custom(format!("account versions: {e}")))?;
            }
        } else {
            if insert_json_rows(txn, &LEDGER_ROWS, self.entries, now).await? != planned {
                return Ok(None);
            }
            if !self.usage_rows.is_empty() {
                insert_json_rows(txn, &USAGE_ROWS, self.usage_rows, now).await?;
            }
            update_balances(txn, self.balances, now).await?;
        }
        if !self.promo_rows.is_empty() {
            promo_grant::Entity::insert_many(self.promo_rows)
                .exec_without_returning(txn)
                .await?;
        }
        if !self.settled_auto_topups.is_empty() {
            billing_account::Entity::update_many()
                .col_expr(
                    billing_account::Column::AutoTopupStartedAt,
                    Option::<DateTime<Utc>>::None.into(),
                )
                .col_expr(billing_account::Column::AutoTopupDeclines, 0.into())
                .filter(billing_account::Column::OrgId.is_in(self.settled_auto_topups))
                .exec(txn)
                .await?;
        }
        Ok(Some(versions))
    }
}

/// Decides every operation of one organization, in order, against its locked account.
fn plan(
    org_id: &str,
    account: &billing_account::Model,
    ops: &[LedgerOp],
    applied: &mut HashMap<(String, String), i64>,
    usage: &mut HashMap<String, ServingUsageRow>,
    writes: &mut Writes,
    now: DateTime<Utc>,
) -> BatchResult {
    let mut balance = account.balance_microcents;
    let mut starter_granted = account.starter_credit_granted;
    let mut changed = false;
    let mut outcomes = Vec::with_capacity(ops.len());
    for op in ops {
        // A serving request already metered (globally, by request id) is a replay.
        if let SideEffect::ServingUsage(row) = &op.side {
            if let Some(original) = usage.get(&row.request_id) {
                outcomes.push(Ok(Outcome {
                    amount_microcents: -original.charged_microcents,
                    balance_microcents: balance,
                    replayed: true,
                    serving: Some(original.clone()),
                }));
                continue;
            }
        }
        let key = op
            .idempotency_key
            .as_ref()
            .map(|k| (org_id.to_owned(), k.clone()));
        if let Some(original) = key.as_ref().and_then(|k| applied.get(k)) {
            outcomes.push(match op.on_duplicate {
                OnDuplicate::Replay => Ok(Outcome {
                    amount_microcents: *original,
                    balance_microcents: balance,
                    replayed: true,
                    serving: None,
                }),
                OnDuplicate::Conflict => Err(LedgerError::Duplicate),
            });
            continue;
        }
        let after = balance.saturating_add(op.amount_microcents);
        let refusal = if matches!(op.side, SideEffect::StarterCredit) && starter_granted {
            Some(LedgerError::Duplicate)
        } else if op.amount_microcents < 0 && !op.may_overdraw && after < 0 {
            Some(LedgerError::InsufficientFunds {
                balance_microcents: balance,
                needed_microcents: -op.amount_microcents,
            })
        } else {
            None
        };
        if let Some(refusal) = refusal {
            if key.is_some() && writes.check == KeyCheck::Optimistic {
                // A refusal writes no entry, so the unique index cannot tell whether this was
                // a replay (answered as such whatever the balance): look the keys up.
                writes.keys_unchecked = true;
            }
            outcomes.push(Err(refusal));
            continue;
        }
        balance = after;
        changed = true;
        writes.entries.push(json!({
            "org_id": org_id,
            "kind": op.kind.as_str(),
            "amount": op.amount_microcents,
            "balance_after": balance,
            "idempotency_key": op.idempotency_key,
            "reason": op.reason,
        }));
        if let Some(key) = key {
            applied.insert(key, op.amount_microcents);
        }
        let mut serving = None;
        match &op.side {
            SideEffect::None => {}
            SideEffect::ServingUsage(row) => {
                if writes.seen_requests.insert(row.request_id.clone()) {
                    writes.usage_rows.push(json!({
                        "request_id": row.request_id,
                        "org_id": row.org_id,
                        "adapter_id": row.adapter_id,
                        "model": row.model,
                        "prompt_tokens": row.prompt_tokens,
                        "completion_tokens": row.completion_tokens,
                        "cost_microcents": row.cost_microcents,
                        "charged_microcents": row.charged_microcents,
                    }));
                }
                usage.insert(row.request_id.clone(), row.clone());
                serving = Some(row.clone());
            }
            SideEffect::PromoGrant { code, cents } => writes.promo_rows.push(promo_grant::ActiveModel {
                org_id: Set(org_id.to_owned()),
                code: Set(code.clone()),
                amount_cents: Set(*cents),
                created_at: Set(now),
            }),
            SideEffect::StarterCredit => starter_granted = true,
            SideEffect::AutoTopupCredited => writes.settled_auto_topups.push(org_id.to_owned()),
        }
        outcomes.push(Ok(Outcome {
            amount_microcents: op.amount_microcents,
            balance_microcents: balance,
            replayed: false,
            serving,
        }));
    }
    if changed {
        writes.balances.push(BalanceRow {
            org_id: org_id.to_owned(),
            balance,
            starter: starter_granted,
        });
    }
    let auto_topup = match (
        account.auto_topup_enabled,
        account.auto_topup_threshold_cents,
        account.auto_topup_amount_cents,
        &account.payment_method_id,
    ) {
        (true, Some(threshold_cents), Some(amount_cents), Some(_))
            if account.auto_topup_declines < MAX_AUTO_TOPUP_DECLINES =>
        {
            Some(AutoTopup {
                threshold_cents,
                amount_cents,
            })
        }
        _ => None,
    };
    BatchResult {
        outcomes,
        account: Some(AccountAfter {
            balance_microcents: balance,
            auto_topup,
        }),
    }
}

/// Locks the accounts of `org_ids` (creating missing ones of existing organizations);
/// unknown organizations are absent from the answer.
async fn lock_accounts(
    txn: &impl ConnectionTrait,
    org_ids: &[String],
) -> Result<HashMap<String, billing_account::Model>, DbErr> {
    let backend = txn.get_database_backend();
    if backend == DbBackend::Sqlite {
        // Take SQLite's write lock first (as BEGIN IMMEDIATE would), so that another
        // process writing the same file makes this one wait instead of failing later.
        txn.execute_unprepared("UPDATE billing_accounts SET balance_microcents = balance_microcents WHERE 0")
            .await?;
    }
    let sql = match backend {
        DbBackend::Postgres => {
            "SELECT * FROM billing_accounts WHERE org_id IN (SELECT jsonb_array_elements_text($1)) \
             ORDER BY org_id FOR UPDATE"
        }
        _ => {
            "SELECT * FROM billing_accounts WHERE org_id IN (SELECT value FROM json_each(?)) ORDER BY org_id"
        }
    };
    let ids = json!(org_ids);
    let param = match backend {
        DbBackend::Postgres => Value::from(ids),
        _ => Value::from(ids.to_string()),
    };
    let mut accounts: HashMap<String, billing_account::Model> = billing_account::Entity::find()
        .from_raw_sql(Statement::from_sql_and_values(backend, sql, [param]))
        .all(txn)
        .await?
        .into_iter()
        .map(|a| (a.org_id.clone(), a))
        .collect();
    for org_id in org_ids {
        if !accounts.contains_key(org_id) {
            if let Some(account) = lock_account(txn, org_id).await? {
                accounts.insert(org_id.clone(), account);
            }
        }
    }
    Ok(accounts)
}

/// SQLite: sets each account's planned balance (PostgreSQL does it in [`PG_WRITES`]).
async fn update_balances(
    txn: &impl ConnectionTrait,
    rows: Vec<BalanceRow>,
    now: DateTime<Utc>,
) -> Result<(), DbErr> {
    if rows.is_empty() {
        return Ok(());
    }
    let sql = "UPDATE billing_accounts SET balance_microcents = x.balance, \
                starter_credit_granted = x.starter, updated_at = ? \
             FROM (SELECT json_extract(value, '$.org_id') AS org_id, json_extract(value, '$.balance') AS balance, \
                          json_extract(value, '$.starter') AS starter FROM json_each(?)) AS x \
             WHERE billing_accounts.org_id = x.org_id";
    let params = [
        Value::from(now),
        Value::from(serde_json::to_string(&rows).map_err(|e| DbErr::Custom(e.to_string()))?),
    ];
    txn.execute_raw(Statement::from_sql_and_values(DbBackend::Sqlite, sql, params))
        .await?;
    Ok(())
}

/// The (organization, idempotency key) pairs among `keys` already applied, with amounts.
async fn applied_keys(
    txn: &impl ConnectionTrait,
    keys: &[(String, String)],
) -> Result<HashMap<(String, String), i64>, DbErr> {
    if keys.is_empty() {
        return Ok(HashMap::new());
    }
    let backend = txn.get_database_backend();
    let rows: Vec<serde_json::Value> = keys
        .iter()
        .map(|(org, key)| json!({"org_id": org, "idempotency_key": key}))
        .collect();
    // One statement text whatever the batch size, so it is prepared once. On PostgreSQL each
    // key is one probe of the unique index (`LATERAL ... LIMIT 1` cannot be turned into a hash
    // join, which a young table's statistics otherwise chose: a scan of every entry per batch).
    let (sql, param) = match backend {
        DbBackend::Postgres => (
            "SELECT le.org_id, le.idempotency_key, le.amount_microcents \
             FROM jsonb_to_recordset($1) AS k(org_id text, idempotency_key text) \
             CROSS JOIN LATERAL (SELECT e.org_id, e.idempotency_key, e.amount_microcents \
                FROM ledger_entries e \
                WHERE e.org_id = k.org_id AND e.idempotency_key = k.idempotency_key LIMIT 1) le",
            Value::from(serde_json::Value::Array(rows)),
        ),
        _ => (
            "SELECT le.org_id, le.idempotency_key, le.amount_microcents FROM ledger_entries le \
             JOIN (SELECT json_extract(value, '$.org_id') AS org_id, \
                          json_extract(value, '$.idempotency_key') AS idempotency_key FROM json_each(?)) AS k \
               ON le.org_id = k.org_id AND le.idempotency_key = k.idempotency_key",
            Value::from(serde_json::Value::Array(rows).to_string()),
        ),
    };
    let found = txn
        .query_all_raw(Statement::from_sql_and_values(backend, sql, [param]))
        .await?;
    found
        .into_iter()
        .map(|row| {
            Ok((
                (
                    row.try_get_by_index::<String>(0)?,
                    row.try_get_by_index::<String>(1)?,
                ),
                row.try_get_by_index::<i64>(2)?,
            ))
        })
        .collect()
}

/// A multi-row insert whose rows travel as one JSON array: the statement text is the
/// same for every batch size.
struct JsonRows {
    table: &'static str,
    /// (column, PostgreSQL type)
    columns: &'static [(&'static str, &'static str)],
    /// Rows that would repeat this unique key are skipped (`ON CONFLICT ... DO NOTHING`).
    skip_conflicts_on: Option<&'static str>,
}

const LEDGER_ROWS: JsonRows = JsonRows {
    table: "ledger_entries",
    columns: &[
        ("org_id", "text"),
        ("kind", "text"),
        ("amount", "bigint"),
        ("balance_after", "bigint"),
        ("idempotency_key", "text"),
        ("reason", "text"),
    ],
    skip_conflicts_on: None,
};

/// Ledger entries whose idempotency key is already applied are skipped, and counted out.
const LEDGER_ROWS_SKIPPING_APPLIED: JsonRows = JsonRows {
    skip_conflicts_on: Some("org_id, idempotency_key"),
    ..LEDGER_ROWS
};

const LEDGER_COLUMNS: &str =
    "org_id, kind, amount_microcents, balance_after_microcents, idempotency_key, reason";

const USAGE_ROWS: JsonRows = JsonRows {
    table: "serving_usage",
    columns: &[
        ("request_id", "text"),
        ("org_id", "text"),
        ("adapter_id", "text"),
        ("model", "text"),
        ("prompt_tokens", "bigint"),
        ("completion_tokens", "bigint"),
        ("cost_microcents", "bigint"),
        ("charged_microcents", "bigint"),
    ],
    skip_conflicts_on: None,
};

/// Usage rows already recorded (a replay, or a request id another organization used)
/// are skipped, and counted out.
const USAGE_ROWS_SKIPPING_RECORDED: JsonRows = JsonRows {
    skip_conflicts_on: Some("request_id"),
    ..USAGE_ROWS
};

impl JsonRows {
    fn target_columns(&self) -> String {
        if self.table == "ledger_entries" {
            LEDGER_COLUMNS.to_owned()
        } else {
            self.columns
                .iter()
                .map(|(c, _)| *c)
                .collect::<Vec<_>>()
                .join(", ")
        }
    }

    fn on_conflict(&self) -> String {
        self.skip_conflicts_on
            .map(|key| format!(" ON CONFLICT ({key}) DO NOTHING"))
            .unwrap_or_default()
    }

    /// PostgreSQL: the rows are the JSON array `$rows`, stamped with `$now`, inserted
    /// only if `guard` (a condition, or an empty string) holds.
    fn pg_insert(&self, rows: usize, now: usize, guard: &str) -> String {
        let fields: Vec<String> = self.columns.iter().map(|(c, _)| format!("x.{c}")).collect();
        let names: Vec<&str> = self.columns.iter().map(|(c, _)| *c).collect();
        let types: Vec<String> = self.columns.iter().map(|(c, t)| format!("{c} {t}")).collect();
        format!(
            "INSERT INTO {} ({}, created_at) SELECT {}, ${now} \
             FROM ROWS FROM (jsonb_to_recordset(${rows}) AS ({})) WITH ORDINALITY AS x({}, ord) \
             {guard} ORDER BY x.ord{}",
            self.table,
            self.target_columns(),
            fields.join(", "),
            types.join(", "),
            names.join(", "),
            self.on_conflict()
        )
    }

    /// SQLite: `?` the timestamp, `?` the rows as JSON text.
    fn sqlite_insert(&self) -> String {
        let fields: Vec<String> = self
            .columns
            .iter()
            .map(|(c, _)| format!("json_extract(value, '$.{c}')"))
            .collect();
        format!(
            // `WHERE true`: SQLite's parser needs it before an `ON CONFLICT`.
            "INSERT INTO {} ({}, created_at) SELECT {}, ? FROM json_each(?) WHERE true ORDER BY key{}",
            self.table,
            self.target_columns(),
            fields.join(", "),
            self.on_conflict()
        )
    }
}

/// PostgreSQL: a group's entries (`$1`), usage rows (`$2`) and balances (`$3`), stamped
/// `$4`, written by one statement (one round trip inside the locked transaction); it
/// answers how many entries and usage rows it inserted, and each updated account's new
/// row version (`xmin`) as a JSON list of `[org_id, version]`.
fn pg_writes(entries: &JsonRows, usage: &JsonRows) -> String {
    format!(
        "WITH e AS ({} RETURNING 1), u AS ({} RETURNING 1), \
              balances AS (UPDATE billing_accounts AS b SET balance_microcents = x.balance, \
                      starter_credit_granted = x.starter, updated_at = $4 \
                    FROM jsonb_to_recordset($3) AS x(org_id text, balance bigint, starter boolean) \
                    WHERE b.org_id = x.org_id RETURNING b.org_id, b.xmin::text AS version) \
         SELECT (SELECT count(*) FROM e), (SELECT count(*) FROM u), \
                (SELECT json_agg(json_build_array(org_id, version))::text FROM balances)",
        entries.pg_insert(1, 4, ""),
        usage.pg_insert(2, 4, "")
    )
}

/// Keys looked up first: every insert must land (a unique violation is an error).
static PG_WRITES: LazyLock<String> = LazyLock::new(|| pg_writes(&LEDGER_ROWS, &USAGE_ROWS));

/// Optimistic: rows whose key is already taken are skipped and show in the counts.
static PG_WRITES_SKIPPING_APPLIED: LazyLock<String> =
    LazyLock::new(|| pg_writes(&LEDGER_ROWS_SKIPPING_APPLIED, &USAGE_ROWS_SKIPPING_RECORDED));

/// [`apply_cached`]'s one autocommit statement: the account `$3` takes balance `$5` and
/// starter flag `$6` only if its row version is still `$7`; the entries (`$1`) and usage
/// rows (`$2`), stamped `$4`, are inserted only if it did (no conflict clause: a key
/// already taken fails the whole statement, so they insert every row or none). Answers
/// one row with the account's new version, or no row if it had moved (nothing written).
static PG_GUARDED_WRITES: LazyLock<String> = LazyLock::new(|| {
    let guard = "WHERE EXISTS (SELECT 1 FROM balances)";
    format!(
        "WITH balances AS (UPDATE billing_accounts SET balance_microcents = $5, \
                  starter_credit_granted = $6, updated_at = $4 \
                WHERE org_id = $3 AND xmin = $7::text::xid RETURNING xmin::text AS version), \
              e AS ({}), u AS ({}) \
         SELECT version FROM balances",
        LEDGER_ROWS.pg_insert(1, 4, guard),
        USAGE_ROWS.pg_insert(2, 4, guard)
    )
});

/// SQLite: inserts `values`; answers how many rows it inserted.
async fn insert_json_rows(
    txn: &impl ConnectionTrait,
    rows: &JsonRows,
    values: Vec<serde_json::Value>,
    now: DateTime<Utc>,
) -> Result<u64, DbErr> {
    let params = [
        Value::from(now),
        Value::from(serde_json::Value::Array(values).to_string()),
    ];
    Ok(txn
        .execute_raw(Statement::from_sql_and_values(
            DbBackend::Sqlite,
            rows.sqlite_insert(),
            params,
        ))
        .await?
        .rows_affected())
}

fn usage_row_of(row: serving_usage::Model) -> ServingUsageRow {
    ServingUsageRow {
        request_id: row.request_id,
        org_id: row.org_id,
        adapter_id: row.adapter_id,
        model: row.model,
        prompt_tokens: row.prompt_tokens,
        completion_tokens: row.completion_tokens,
        cost_microcents: row.cost_microcents,
        charged_microcents: row.charged_microcents,
    }
}

/// The account row, locked for this transaction (`FOR UPDATE` on PostgreSQL; SQLite's
/// single connection serializes writers), created on first use. `None`: no such org.
pub async fn lock_account(
    txn: &impl ConnectionTrait,
    org_id: &str,
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
pub async fn ensure_account(db: &impl ConnectionTrait, org_id: &str) -> Result<(), DbErr> {
    let now = Utc::now();
    billing_account::Entity::insert(billing_account::ActiveModel {
        org_id: Set(org_id.to_owned()),
        customer_id: Set(None),
        balance_microcents: Set(0),
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
        created_at: Set(now),
        updated_at: Set(now),
    })
    .on_conflict_do_nothing_on([billing_account::Column::OrgId])
    .exec_without_returning(db)
    .await?;
    Ok(())
}
