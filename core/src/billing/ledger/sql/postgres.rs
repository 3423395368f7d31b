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
