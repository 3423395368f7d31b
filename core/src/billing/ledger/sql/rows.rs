//! The rows both dialects write as one JSON parameter: which table, which columns.

use sea_orm::DbErr;

/// A multi-row insert whose rows travel as one JSON array: the statement text is the
/// same for every batch size.
pub(super) struct JsonRows {
    pub(super) table: &'static str,
    /// (column, PostgreSQL type)
    pub(super) columns: &'static [(&'static str, &'static str)],
    /// Rows that would repeat this unique key are skipped (`ON CONFLICT ... DO NOTHING`).
    pub(super) skip_conflicts_on: Option<&'static str>,
}

pub(super) const LEDGER_ROWS: JsonRows = JsonRows {
    table: "ledger_entries",
    columns: &[
        ("org_id", "text"),
        ("kind", "text"),
        ("amount", "bigint"),
        ("balance_after", "bigint"),
        ("idempotency_key", "text"),
        ("reason", "text"),
        ("grants", "text"),
    ],
    skip_conflicts_on: None,
};

/// Ledger entries whose idempotency key is already applied are skipped, and counted out.
pub(super) const LEDGER_ROWS_SKIPPING_APPLIED: JsonRows = JsonRows {
    skip_conflicts_on: Some("org_id, idempotency_key"),
    ..LEDGER_ROWS
};

pub(super) const LEDGER_COLUMNS: &str =
    "org_id, kind, amount_microcents, balance_after_microcents, idempotency_key, reason, grants";

pub(super) const USAGE_ROWS: JsonRows = JsonRows {
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
pub(super) const USAGE_ROWS_SKIPPING_RECORDED: JsonRows = JsonRows {
    skip_conflicts_on: Some("request_id"),
    ..USAGE_ROWS
};

impl JsonRows {
    pub(super) fn target_columns(&self) -> String {
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

    pub(super) fn on_conflict(&self) -> String {
        self.skip_conflicts_on
            .map(|key| format!(" ON CONFLICT ({key}) DO NOTHING"))
            .unwrap_or_default()
    }
}

/// Rows as one JSON parameter (PostgreSQL binds a `jsonb` value).
pub(super) fn json_param<T: serde::Serialize>(rows: &T) -> Result<serde_json::Value, DbErr> {
    serde_json::to_value(rows).map_err(|e| DbErr::Custom(format!("ledger rows: {e}")))
}

/// Rows as one JSON text parameter (SQLite reads it with `json_each`).
pub(super) fn json_text<T: serde::Serialize>(rows: &T) -> Result<String, DbErr> {
    serde_json::to_string(rows).map_err(|e| DbErr::Custom(format!("ledger rows: {e}")))
}
