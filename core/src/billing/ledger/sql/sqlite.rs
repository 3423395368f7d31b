//! SQLite's statements: JSON rows through `json_each`, three statements per group (SQLite
//! has no round trips to save).

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DbBackend, DbErr, Statement, Value};

use super::rows::{json_text, JsonRows, LEDGER_ROWS, USAGE_ROWS};
use crate::billing::ledger::planner::Writes;

/// Takes SQLite's write lock first (as `BEGIN IMMEDIATE` would), so another process
/// writing the same file makes this one wait instead of failing later.
pub(super) async fn lock_accounts(
    txn: &impl ConnectionTrait,
    ids: serde_json::Value,
) -> Result<Statement, DbErr> {
    txn.execute_unprepared("UPDATE billing_accounts SET balance_microcents = balance_microcents WHERE 0")
        .await?;
    Ok(Statement::from_sql_and_values(
        DbBackend::Sqlite,
        "SELECT * FROM billing_accounts WHERE org_id IN (SELECT value FROM json_each(?)) ORDER BY org_id",
        [Value::from(ids.to_string())],
    ))
}

pub(super) fn applied_keys(rows: Vec<serde_json::Value>) -> Statement {
    Statement::from_sql_and_values(
        DbBackend::Sqlite,
        "SELECT le.org_id, le.idempotency_key, le.amount_microcents FROM ledger_entries le \
         JOIN (SELECT json_extract(value, '$.org_id') AS org_id, \
                      json_extract(value, '$.idempotency_key') AS idempotency_key FROM json_each(?)) AS k \
           ON le.org_id = k.org_id AND le.idempotency_key = k.idempotency_key",
        [Value::from(serde_json::Value::Array(rows).to_string())],
    )
}

impl JsonRows {
    /// `?` the timestamp, `?` the rows as JSON text.
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

/// Inserts `values`; answers how many rows it inserted.
async fn insert_json_rows(
    txn: &impl ConnectionTrait,
    rows: &JsonRows,
    values: String,
    now: DateTime<Utc>,
) -> Result<u64, DbErr> {
    let params = [Value::from(now), Value::from(values)];
    Ok(txn
        .execute_raw(Statement::from_sql_and_values(
            DbBackend::Sqlite,
            rows.sqlite_insert(),
            params,
        ))
        .await?
        .rows_affected())
}

/// The group's entries, usage rows and balances. `None`: an entry was not inserted.
pub(super) async fn write_group(
    txn: &impl ConnectionTrait,
    writes: &Writes,
    now: DateTime<Utc>,
) -> Result<Option<Vec<(crate::domain::OrgId, String)>>, DbErr> {
    let planned = writes.entries.len() as u64;
    if insert_json_rows(txn, &LEDGER_ROWS, json_text(&writes.entries)?, now).await? != planned {
        return Ok(None);
    }
    if !writes.usage_rows.is_empty() {
        insert_json_rows(txn, &USAGE_ROWS, json_text(&writes.usage_rows)?, now).await?;
    }
    if !writes.balances.is_empty() {
        let sql = "UPDATE billing_accounts SET balance_microcents = x.balance, \
                    starter_credit_granted = x.starter, updated_at = ? \
                 FROM (SELECT json_extract(value, '$.org_id') AS org_id, json_extract(value, '$.balance') AS balance, \
                              json_extract(value, '$.starter') AS starter FROM json_each(?)) AS x \
                 WHERE billing_accounts.org_id = x.org_id";
        let params = [Value::from(now), Value::from(json_text(&writes.balances)?)];
        txn.execute_raw(Statement::from_sql_and_values(DbBackend::Sqlite, sql, params))
            .await?;
    }
    if !writes.grant_changes.is_empty() {
        let sql = "UPDATE credit_grants SET remaining_microcents = x.remaining, \
                    expired_at = CASE WHEN x.expired THEN ? ELSE credit_grants.expired_at END \
                 FROM (SELECT json_extract(value, '$.id') AS id, json_extract(value, '$.remaining') AS remaining, \
                              json_extract(value, '$.expired') AS expired FROM json_each(?)) AS x \
                 WHERE credit_grants.id = x.id";
        let params = [Value::from(now), Value::from(json_text(&writes.grant_changes)?)];
        txn.execute_raw(Statement::from_sql_and_values(DbBackend::Sqlite, sql, params))
            .await?;
    }
    Ok(Some(Vec::new()))
}
