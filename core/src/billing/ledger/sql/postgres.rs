//! PostgreSQL's statements: a group written by one statement (one round trip while the
//! accounts are locked), and the guarded autocommit write of a cached account.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, Statement, Value};

use super::rows::{
    json_param, JsonRows, LEDGER_ROWS, LEDGER_ROWS_SKIPPING_APPLIED, USAGE_ROWS, USAGE_ROWS_SKIPPING_RECORDED,
};
use crate::billing::ledger::grants::Grant;
use crate::billing::ledger::planner::{BalanceRow, KeyCheck, Writes};

/// Whether PostgreSQL gave up waiting (`lock_timeout`, `statement_timeout`): the row is
/// held by another session, and trying again at once would wait again.
pub fn is_lock_timeout(err: &DbErr) -> bool {
    let text = err.to_string();
    text.contains("due to lock timeout") || text.contains("due to statement timeout")
}

/// With `skip_locked` (a shared batch), rows another transaction holds are left out instead
/// of waited for: that organization goes on alone and the others are not held up.
pub(super) fn lock_accounts(ids: serde_json::Value, skip_locked: bool) -> Statement {
    let sql = match skip_locked {
        true => {
            "SELECT * FROM billing_accounts WHERE org_id IN (SELECT jsonb_array_elements_text($1)) \
             ORDER BY org_id FOR UPDATE SKIP LOCKED"
        }
        false => {
            "SELECT * FROM billing_accounts WHERE org_id IN (SELECT jsonb_array_elements_text($1)) \
             ORDER BY org_id FOR UPDATE"
        }
    };
    Statement::from_sql_and_values(DbBackend::Postgres, sql, [Value::from(ids)])
}

/// Which of `ids` have an account row (read without locking).
pub(super) fn existing_accounts(ids: serde_json::Value) -> Statement {
    Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT org_id FROM billing_accounts WHERE org_id IN (SELECT jsonb_array_elements_text($1))",
        [Value::from(ids)],
    )
}

/// One statement text whatever the batch size, so it is prepared once; each key is one
/// probe of the unique index (`LATERAL ... LIMIT 1` cannot become a hash join, which a
/// young table's statistics otherwise chose: a scan of every entry per batch).
pub(super) fn applied_keys(rows: Vec<serde_json::Value>) -> Statement {
    Statement::from_sql_and_values(
        DbBackend::Postgres,
        "SELECT le.org_id, le.idempotency_key, le.amount_microcents \
         FROM jsonb_to_recordset($1) AS k(org_id text, idempotency_key text) \
         CROSS JOIN LATERAL (SELECT e.org_id, e.idempotency_key, e.amount_microcents \
            FROM ledger_entries e \
            WHERE e.org_id = k.org_id AND e.idempotency_key = k.idempotency_key LIMIT 1) le",
        [Value::from(serde_json::Value::Array(rows))],
    )
}

impl JsonRows {
    /// The rows are the JSON array `$rows`, stamped with `$now`, inserted only if `guard`
    /// (a condition, or an empty string) holds.
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
}

/// The update of the grants a batch changed (`$changes`: `[{id, remaining, expired}]`),
/// stamped `$now`, only if `guard` holds.
fn grant_changes(changes: usize, now: usize, guard: &str) -> String {
    let guard = match guard {
        "" => String::new(),
        g => format!(" AND {}", g.trim_start_matches("WHERE ")),
    };
    format!(
        "UPDATE credit_grants AS g SET remaining_microcents = x.remaining, \
            expired_at = CASE WHEN x.expired THEN ${now} ELSE g.expired_at END \
         FROM jsonb_to_recordset(${changes}) AS x(id text, remaining bigint, expired boolean) \
         WHERE g.id = x.id{guard}"
    )
}

/// A group's entries (`$1`), usage rows (`$2`), balances (`$3`) and grant changes (`$5`),
/// stamped `$4`, written by one statement; it answers how many entries and usage rows it
/// inserted, and each updated account's new row version (`xmin`) as a JSON list of
/// `[org_id, version]`.
fn pg_writes(entries: &JsonRows, usage: &JsonRows) -> String {
    format!(
        "WITH e AS ({} RETURNING 1), u AS ({} RETURNING 1), g AS ({}), \
              balances AS (UPDATE billing_accounts AS b SET balance_microcents = x.balance, \
                      starter_credit_granted = x.starter, updated_at = $4 \
                    FROM jsonb_to_recordset($3) AS x(org_id text, balance bigint, starter boolean) \
                    WHERE b.org_id = x.org_id RETURNING b.org_id, b.xmin::text AS version) \
         SELECT (SELECT count(*) FROM e), (SELECT count(*) FROM u), \
                (SELECT json_agg(json_build_array(org_id, version))::text FROM balances)",
        entries.pg_insert(1, 4, ""),
        usage.pg_insert(2, 4, ""),
        grant_changes(5, 4, "")
    )
}

/// Keys looked up first: every insert must land (a unique violation is an error).
static PG_WRITES: LazyLock<String> = LazyLock::new(|| pg_writes(&LEDGER_ROWS, &USAGE_ROWS));

/// Optimistic: rows whose key is already taken are skipped and show in the counts.
static PG_WRITES_SKIPPING_APPLIED: LazyLock<String> =
    LazyLock::new(|| pg_writes(&LEDGER_ROWS_SKIPPING_APPLIED, &USAGE_ROWS_SKIPPING_RECORDED));

/// An account row with its row version and its active grants, one row per grant (or one
/// without): what [`account_from_rows`] reads (`{a}`: the account's alias).
const ACCOUNT_WITH_GRANTS: &str = "{a}.*, {a}.xmin::text AS keel_version, g.id AS grant_id, \
    g.remaining_microcents AS grant_remaining, g.priority AS grant_priority, \
    g.expires_at AS grant_expires_at, g.created_at AS grant_created_at \
    FROM billing_accounts {a} LEFT JOIN credit_grants g \
      ON g.org_id = {a}.org_id AND g.remaining_microcents > 0";

/// [`guarded_write`]'s one autocommit statement: the account `$3` takes balance `$5` and
/// starter flag `$6` only if its row version is still `$7`; the entries (`$1`) and usage
/// rows (`$2`), stamped `$4`, are inserted (and the grant changes `$8` made) only if it did (no conflict clause: a key
/// already taken fails the whole statement, so they insert every row or none). Answers the
/// account's new version in `keel_written`; when the row had moved (nothing written), the
/// account as the statement found it, with its grants (so the next try needs no read).
static PG_GUARDED_WRITES: LazyLock<String> = LazyLock::new(|| {
    let guard = "WHERE EXISTS (SELECT 1 FROM balances)";
    format!(
        "WITH balances AS (UPDATE billing_accounts SET balance_microcents = $5, \
                  starter_credit_granted = $6, updated_at = $4 \
                WHERE org_id = $3 AND xmin = $7::text::xid RETURNING xmin::text AS version), \
              e AS ({}), u AS ({}), g AS ({}) \
         SELECT (SELECT version FROM balances) AS keel_written, {} WHERE a.org_id = $3",
        LEDGER_ROWS.pg_insert(1, 4, guard),
        USAGE_ROWS.pg_insert(2, 4, guard),
        grant_changes(8, 4, guard),
        ACCOUNT_WITH_GRANTS.replace("{a}", "a")
    )
});

/// The group's entries, usage rows and balances in one statement. `None`: an optimistic
/// insert skipped a row whose key was taken (the caller rolls back).
pub(super) async fn write_group(
    txn: &impl ConnectionTrait,
    writes: &Writes,
    now: DateTime<Utc>,
) -> Result<Option<Vec<(crate::domain::OrgId, String)>>, DbErr> {
    let params = [
        Value::from(json_param(&writes.entries)?),
        Value::from(json_param(&writes.usage_rows)?),
        Value::from(json_param(&writes.balances)?),
        Value::from(now),
        Value::from(json_param(&writes.grant_changes)?),
    ];
    let sql = match writes.check {
        KeyCheck::LookUp => &*PG_WRITES,
        KeyCheck::Optimistic => &*PG_WRITES_SKIPPING_APPLIED,
    };
    let row = txn
        .query_one_raw(Statement::from_sql_and_values(DbBackend::Postgres, sql, params))
        .await?
        .ok_or_else(|| DbErr::Custom("the ledger write answered no row".into()))?;
    let (entries, usage_rows): (i64, i64) = (row.try_get_by_index(0)?, row.try_get_by_index(1)?);
    if entries as usize != writes.entries.len() || usage_rows as usize != writes.usage_rows.len() {
        return Ok(None);
    }
    let updated: Option<String> = row.try_get_by_index(2)?;
    match updated {
        Some(updated) => serde_json::from_str::<Vec<(crate::domain::OrgId, String)>>(&updated)
            .map(Some)
            .map_err(|e| DbErr::Custom(format!("account versions: {e}"))),
        None => Ok(Some(Vec::new())),
    }
}

/// An account as the planner needs it: the row, its active grants and its row version.
pub(in crate::billing::ledger) type ReadAccount = (entities::billing_account::Model, Vec<Grant>, String);

/// What a guarded write did.
pub(in crate::billing::ledger) enum Guarded {
    /// Written; the account's new row version.
    Written(String),
    /// Written by [`debit_on_current`] on `found` (the account as the lock found it); the
    /// row's new version.
    WrittenOn {
        found: Box<ReadAccount>,
        version: String,
    },
    /// Nothing written: the row had moved since it was read (another writer, perhaps
    /// another instance); the account as the statement found it (if it still has one), to
    /// plan on again.
    Moved(Option<Box<ReadAccount>>),
    /// Nothing written: the statement was refused (a key already taken, say). The locked
    /// path, which looks keys up, decides.
    Refused,
}

/// One organization's planned batch in one autocommit statement, guarded by the row
/// version it was planned on.
pub(in crate::billing::ledger) async fn guarded_write(
    db: &DatabaseConnection,
    writes: &Writes,
    after: &BalanceRow,
    now: DateTime<Utc>,
    version: String,
) -> Result<Guarded, DbErr> {
    let params = [
        Value::from(json_param(&writes.entries)?),
        Value::from(json_param(&writes.usage_rows)?),
        Value::from(after.org_id.as_str()),
        Value::from(now),
        Value::from(after.balance.get()),
        Value::from(after.starter),
        Value::from(version),
        Value::from(json_param(&writes.grant_changes)?),
    ];
    let answer = db
        .query_all_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            &*PG_GUARDED_WRITES,
            params,
        ))
        .await;
    match answer {
        Ok(rows) => {
            let written = match rows.first() {
                Some(row) => row.try_get::<Option<String>>("", "keel_written")?,
                None => None,
            };
            Ok(match written {
                Some(version) => Guarded::Written(version),
                None => Guarded::Moved(account_from_rows(&rows)?.map(Box::new)),
            })
        }
        // Waiting longer on the locked path would only double the wait.
        Err(err) if is_lock_timeout(&err) => Err(err),
        Err(err) => {
            tracing::debug!(org_id = %after.org_id, error = %err, "guarded ledger write refused; taking the locked path");
            Ok(Guarded::Refused)
        }
    }
}

/// An account as it is now, without locking it: the row, its active grants and its row
/// version (`xmin`), read in one statement (one snapshot), so a guarded write planned on
/// them lands only if nothing changed either since (every change of a grant changes its
/// account row). `None`: no account row yet.
pub(in crate::billing::ledger) async fn read_account(
    db: &DatabaseConnection,
    org_id: &crate::domain::OrgId,
) -> Result<Option<ReadAccount>, DbErr> {
    static READ: LazyLock<String> = LazyLock::new(|| {
        format!(
            "SELECT {} WHERE a.org_id = $1",
            ACCOUNT_WITH_GRANTS.replace("{a}", "a")
        )
    });
    let rows = db
        .query_all_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            READ.as_str(),
            [Value::from(org_id.as_str())],
        ))
        .await?;
    account_from_rows(&rows)
}

/// The account of [`ACCOUNT_WITH_GRANTS`]'s rows (`None`: no row).
fn account_from_rows(rows: &[sea_orm::QueryResult]) -> Result<Option<ReadAccount>, DbErr> {
    use sea_orm::FromQueryResult;
    let Some(first) = rows.first() else {
        return Ok(None);
    };
    let account = entities::billing_account::Model::from_query_result(first, "")?;
    let version: String = first.try_get("", "keel_version")?;
    let mut grants = Vec::new();
    for row in rows {
        if let Some(id) = row.try_get::<Option<String>>("", "grant_id")? {
            grants.push(Grant {
                id,
                remaining: row.try_get("", "grant_remaining")?,
                priority: row.try_get("", "grant_priority")?,
                expires_at: row.try_get("", "grant_expires_at")?,
                created_at: row.try_get("", "grant_created_at")?,
            });
        }
    }
    Ok(Some((account, grants, version)))
}

/// Taken by the transaction that installs [`DEBIT_FUNCTION`] (instances starting together).
const INSTALL_LOCK: &str = "SELECT pg_advisory_xact_lock(1801807214, 1)";

/// One organization's plain debits, planned (by the planner) on an account that may have
/// moved since, all drawn from one grant: written on the account as it is once locked, if
/// the planner would have planned the same writes on it. That holds when the grant is still
/// the first in draw order with enough left (no other active grant before it, none lapsed),
/// the balance covers the debits, and they cross no low-balance threshold; the entries'
/// balances are then the planned ones moved by what the balance moved, and the grant and
/// balance move by the debits' sum. The account row is locked for the function's run only
/// (one statement, no round trip), so instances charging one organization write one after
/// the other without either planning again. Answers the account as the lock found it, with
/// its active grants and row version, and whether it wrote (then the new version); NULL
/// without an account. A key already taken fails the whole statement (nothing written).
static DEBIT_FUNCTION: LazyLock<String> = LazyLock::new(|| {
    DEBIT_FUNCTION_TEXT
        .replace(
            "{micros_per_cent}",
            &crate::domain::Cents(1).micros().get().to_string(),
        )
        .replace("{ledger_columns}", super::rows::LEDGER_COLUMNS)
});

/// [`DEBIT_FUNCTION`] before its constants are filled in. The draw order it checks is
/// [`Grant`]'s order key (priority, then soonest expiry with none last, then oldest, then id
/// by byte): a change there is a change here.
const DEBIT_FUNCTION_TEXT: &str = r#"
CREATE OR REPLACE FUNCTION keel_ledger_debit(p_org text, p_grant text, p_total bigint, p_planned bigint,
    p_entries jsonb, p_now timestamptz, p_low bigint) RETURNS jsonb LANGUAGE plpgsql AS $$
DECLARE
  a billing_accounts%ROWTYPE;
  g credit_grants%ROWTYPE;
  found_account jsonb;
  row_version text;
  threshold bigint;
BEGIN
  SELECT * INTO a FROM billing_accounts WHERE org_id = p_org FOR UPDATE;
  IF a.org_id IS NULL THEN
    RETURN NULL;
  END IF;
  found_account := jsonb_build_object('account', to_jsonb(a), 'grants', COALESCE((
      SELECT jsonb_agg(jsonb_build_object('id', c.id, 'remaining', c.remaining_microcents,
          'priority', c.priority, 'expires_at', c.expires_at, 'created_at', c.created_at))
      FROM credit_grants c WHERE c.org_id = p_org AND c.remaining_microcents > 0), '[]'::jsonb));
  SELECT * INTO g FROM credit_grants WHERE id = p_grant AND org_id = p_org;
  threshold := CASE WHEN a.auto_topup_enabled AND a.auto_topup_threshold_cents IS NOT NULL
      THEN a.auto_topup_threshold_cents * {micros_per_cent} ELSE p_low END;
  IF g.id IS NULL OR g.remaining_microcents < -p_total
     OR (g.expires_at IS NOT NULL AND g.expires_at <= p_now)
     OR a.balance_microcents + p_total < 0
     OR (threshold IS NOT NULL AND a.balance_microcents >= threshold
         AND a.balance_microcents + p_total < threshold)
     OR EXISTS (SELECT 1 FROM credit_grants h
         WHERE h.org_id = p_org AND h.remaining_microcents > 0 AND h.id <> p_grant
           AND (h.expires_at <= p_now
             OR (h.priority, h.expires_at IS NULL, COALESCE(h.expires_at, 'infinity'), h.created_at,
                 h.id COLLATE "C")
              < (g.priority, g.expires_at IS NULL, COALESCE(g.expires_at, 'infinity'), g.created_at,
                 g.id COLLATE "C"))) THEN
    SELECT b.xmin::text INTO row_version FROM billing_accounts b WHERE b.org_id = p_org;
    RETURN found_account || jsonb_build_object('written', false, 'version', row_version);
  END IF;
  INSERT INTO ledger_entries ({ledger_columns}, created_at)
  SELECT x.org_id, x.kind, x.amount, x.balance_after + (a.balance_microcents - p_planned),
      x.idempotency_key, x.reason, x.grants, p_now
  FROM ROWS FROM (jsonb_to_recordset(p_entries) AS (org_id text, kind text, amount bigint,
      balance_after bigint, idempotency_key text, reason text, grants text))
      WITH ORDINALITY AS x(org_id, kind, amount, balance_after, idempotency_key, reason, grants, ord)
  ORDER BY x.ord;
  UPDATE credit_grants SET remaining_microcents = remaining_microcents + p_total WHERE id = p_grant;
  UPDATE billing_accounts SET balance_microcents = balance_microcents + p_total, updated_at = p_now
    WHERE org_id = p_org RETURNING xmin::text INTO row_version;
  RETURN found_account || jsonb_build_object('written', true, 'version', row_version);
END $$
"#;

/// Installs (or replaces) [`DEBIT_FUNCTION`]: at every start, so it always matches this
/// build.
pub(in crate::billing) async fn install(db: &DatabaseConnection) -> Result<(), DbErr> {
    use sea_orm::TransactionTrait;
    let txn = db.begin().await?;
    txn.execute_unprepared(INSTALL_LOCK).await?;
    txn.execute_unprepared(DEBIT_FUNCTION.as_str()).await?;
    txn.commit().await
}

/// The account as [`DEBIT_FUNCTION`] answers it (`to_jsonb` of the row): every column of
/// [`entities::billing_account::Model`], so a column added there must be added here.
#[derive(serde::Deserialize)]
struct FoundAccount {
    org_id: crate::domain::OrgId,
    customer_id: Option<String>,
    balance_microcents: crate::domain::Microcents,
    payment_method_id: Option<String>,
    pm_brand: Option<String>,
    pm_last4: Option<String>,
    pm_exp_month: Option<i32>,
    pm_exp_year: Option<i32>,
    auto_topup_enabled: bool,
    auto_topup_threshold_cents: Option<crate::domain::Cents>,
    auto_topup_amount_cents: Option<crate::domain::Cents>,
    auto_topup_declines: i32,
    auto_topup_started_at: Option<DateTime<Utc>>,
    starter_credit_granted: bool,
    auto_topup_monthly_limit_cents: Option<crate::domain::Cents>,
    auto_topup_limit_notified_month: Option<String>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl From<FoundAccount> for entities::billing_account::Model {
    fn from(a: FoundAccount) -> Self {
        Self {
            org_id: a.org_id,
            customer_id: a.customer_id,
            balance_microcents: a.balance_microcents,
            payment_method_id: a.payment_method_id,
            pm_brand: a.pm_brand,
            pm_last4: a.pm_last4,
            pm_exp_month: a.pm_exp_month,
            pm_exp_year: a.pm_exp_year,
            auto_topup_enabled: a.auto_topup_enabled,
            auto_topup_threshold_cents: a.auto_topup_threshold_cents,
            auto_topup_amount_cents: a.auto_topup_amount_cents,
            auto_topup_declines: a.auto_topup_declines,
            auto_topup_started_at: a.auto_topup_started_at,
            starter_credit_granted: a.starter_credit_granted,
            auto_topup_monthly_limit_cents: a.auto_topup_monthly_limit_cents,
            auto_topup_limit_notified_month: a.auto_topup_limit_notified_month,
            created_at: a.created_at,
            updated_at: a.updated_at,
        }
    }
}

#[derive(serde::Deserialize)]
struct FoundGrant {
    id: String,
    remaining: crate::domain::Microcents,
    priority: i32,
    expires_at: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
}

#[derive(serde::Deserialize)]
struct DebitAnswer {
    account: FoundAccount,
    grants: Vec<FoundGrant>,
    written: bool,
    version: String,
}

/// A planned batch of plain debits drawn from `grant_id` (see [`DEBIT_FUNCTION`]), `total`
/// their sum, planned on a balance of `planned`; `low` the balance under which an account
/// without an auto top-up threshold is low.
#[allow(clippy::too_many_arguments)]
pub(in crate::billing::ledger) async fn debit_on_current(
    db: &DatabaseConnection,
    writes: &Writes,
    org_id: &crate::domain::OrgId,
    grant_id: &str,
    total: crate::domain::Microcents,
    planned: crate::domain::Microcents,
    now: DateTime<Utc>,
    low: crate::domain::Microcents,
) -> Result<Guarded, DbErr> {
    let params = [
        Value::from(org_id.as_str()),
        Value::from(grant_id),
        Value::from(total.get()),
        Value::from(planned.get()),
        Value::from(json_param(&writes.entries)?),
        Value::from(now),
        Value::from(low.get()),
    ];
    let answer = db
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT keel_ledger_debit($1, $2, $3, $4, $5::jsonb, $6, $7)::text AS answer",
            params,
        ))
        .await;
    let text: Option<String> = match answer {
        Ok(Some(row)) => row.try_get("", "answer")?,
        Ok(None) => None,
        Err(err) if is_lock_timeout(&err) => return Err(err),
        Err(err) => {
            tracing::debug!(org_id = %org_id, error = %err, "ledger debit refused; taking the locked path");
            return Ok(Guarded::Refused);
        }
    };
    let Some(text) = text else {
        return Ok(Guarded::Moved(None));
    };
    let answer: DebitAnswer =
        serde_json::from_str(&text).map_err(|e| DbErr::Custom(format!("the ledger debit's answer: {e}")))?;
    let grants = answer
        .grants
        .into_iter()
        .map(|g| Grant {
            id: g.id,
            remaining: g.remaining,
            priority: g.priority,
            expires_at: g.expires_at,
            created_at: g.created_at,
        })
        .collect();
    let found = Box::new((answer.account.into(), grants, answer.version.clone()));
    Ok(match answer.written {
        true => Guarded::WrittenOn {
            found,
            version: answer.version,
        },
        false => Guarded::Moved(Some(found)),
    })
}
