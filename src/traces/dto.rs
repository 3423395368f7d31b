//! Bodies, queries and views of the trace routes.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::export::Format;
use crate::domain::TraceId;
use crate::http::validate::{Checks, Validate};

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TraceProject {
    pub project_id: String,
    pub name: String,
    pub trace_count: i64,
    pub last_trace_at: DateTime<Utc>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TraceProjectsResponse {
    /// Projects with at least one trace, most recently recorded first.
    pub projects: Vec<TraceProject>,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ExportQuery {
    /// Text that is no project id names no project (404, as an unknown one).
    #[param(min_length = 1, max_length = 100)]
    pub project_id: String,
    /// 1..1000, default 1000: the newest traces.
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
    /// `records` (default), `prompts` or `raw`.
    #[param(value_type = Option<crate::schemas::Format>)]
    pub format: Option<String>,
    /// The previous page's `nextCursor`: the walk goes on from there (newest to oldest,
    /// without gaps or repeats while new traces arrive).
    #[param(pattern = "^[0-9]{1,12}-[0-9]{9}-[0-9a-f]{32}$")]
    pub cursor: Option<String>,
    /// Only traces recorded at or after this time (RFC 3339).
    #[param(format = DateTime)]
    pub since: Option<String>,
    /// Only traces recorded before this time (RFC 3339).
    #[param(format = DateTime)]
    pub until: Option<String>,
    /// Only traces of this model.
    #[param(min_length = 1, max_length = 200)]
    pub model: Option<String>,
    /// `ok` (a 2xx answer) or `error` (any other).
    #[param(pattern = "^(ok|error)$")]
    pub status: Option<String>,
}

impl ExportQuery {
    /// The query's filters, as the selection form has them.
    pub fn filters(&self) -> ExportFilters {
        ExportFilters {
            since: self.since.clone(),
            until: self.until.clone(),
            model: self.model.clone(),
            status: self.status.clone(),
        }
    }
}

/// Which traces an export takes (each optional).
#[derive(Debug, Default, Clone, Deserialize, ToSchema)]
pub struct ExportFilters {
    /// Only traces recorded at or after this time (RFC 3339).
    #[schema(format = DateTime)]
    pub since: Option<String>,
    /// Only traces recorded before this time (RFC 3339).
    #[schema(format = DateTime)]
    pub until: Option<String>,
    /// Only traces of this model.
    #[schema(min_length = 1, max_length = 200)]
    pub model: Option<String>,
    /// `ok` (a 2xx answer) or `error` (any other).
    #[schema(pattern = "^(ok|error)$")]
    pub status: Option<String>,
}

fn rfc3339(value: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(value)
        .ok()
        .map(|at| at.with_timezone(&Utc))
}

impl ExportFilters {
    fn check(&self, c: &mut Checks) {
        for (field, value) in [("since", &self.since), ("until", &self.until)] {
            if value.as_deref().is_some_and(|v| rfc3339(v).is_none()) {
                c.fail(
                    field,
                    "datetime_from_date_parsing",
                    "Input should be a valid RFC 3339 datetime",
                );
            }
        }
        if let Some(status) = &self.status {
            c.one_of("status", status, &["ok", "error"]);
        }
    }

    /// The repository's filter (the values were checked).
    pub fn to_filter(&self) -> super::repo::TraceFilter {
        super::repo::TraceFilter {
            model: self.model.clone(),
            ok: self.status.as_deref().map(|s| s == "ok"),
            before: None,
            since: self.since.as_deref().and_then(rfc3339),
            until: self.until.as_deref().and_then(rfc3339),
        }
    }
}

impl Validate for ExportQuery {
    fn validate(&self, c: &mut Checks) {
        if let Some(format) = &self.format {
            c.one_of("format", format, Format::NAMES);
        }
        if self
            .cursor
            .as_deref()
            .is_some_and(|cursor| super::service::Cursor::decode(cursor).is_none())
        {
            c.fail(
                "cursor",
                "value_error",
                "Value error, not a cursor an export answered",
            );
        }
        self.filters().check(c);
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TracesExportResponse {
    /// The project exported (for a selection: their one project, else null).
    pub project_id: Option<String>,
    pub format: String,
    /// Rows in `records`.
    pub count: usize,
    /// Traces without an extractable request/response pair.
    pub skipped: usize,
    /// Selected trace ids that are not the caller's (selection only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_found: Option<usize>,
    /// The next page's `cursor`; null at the end (and for a selection).
    pub next_cursor: Option<String>,
    #[schema(value_type = Vec<Object>)]
    pub records: Vec<Value>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TraceSelectionBody {
    /// The selected traces, exported in this order.
    #[schema(value_type = Vec<uuid::Uuid>, min_items = 1, max_items = 1000)]
    pub trace_ids: Vec<TraceId>,
    /// `records` (default), `prompts` or `raw`.
    #[schema(value_type = Option<crate::schemas::Format>)]
    pub format: Option<String>,
    /// Of the selected traces, only those these filters keep.
    #[serde(flatten)]
    pub filters: ExportFilters,
}

impl Validate for TraceSelectionBody {
    fn validate(&self, c: &mut Checks) {
        for (i, id) in self.trace_ids.iter().enumerate() {
            if uuid::Uuid::parse_str(id).is_err() {
                c.fail_item("traceIds", i, "uuid_parsing", "Input should be a valid UUID");
            }
        }
        if let Some(format) = &self.format {
            c.one_of("format", format, Format::NAMES);
        }
        self.filters.check(c);
    }
}
