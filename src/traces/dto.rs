//! Bodies, queries and views of the trace routes.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::export::Format;
use super::MAX_EXPORT;
use crate::domain::{ProjectId, TraceId};
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
    #[param(value_type = String, min_length = 1, max_length = 100)]
    pub project_id: ProjectId,
    /// 1..1000, default 1000: the newest traces.
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
    /// `records` (default), `prompts` or `raw`.
    #[param(value_type = Option<super::export::Format>)]
    pub format: Option<String>,
}

impl Validate for ExportQuery {
    fn validate(&self, c: &mut Checks) {
        c.str_len("project_id", &self.project_id, 1, 100);
        c.opt_int_range("limit", self.limit, 1, MAX_EXPORT as i64);
        if let Some(format) = &self.format {
            c.one_of("format", format, Format::NAMES);
        }
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
    #[schema(value_type = Option<super::export::Format>)]
    pub format: Option<String>,
}

impl Validate for TraceSelectionBody {
    fn validate(&self, c: &mut Checks) {
        c.min_items("traceIds", self.trace_ids.len(), 1);
        c.max_items("traceIds", self.trace_ids.len(), MAX_EXPORT as usize);
        for (i, id) in self.trace_ids.iter().enumerate() {
            if uuid::Uuid::parse_str(id).is_err() {
                c.fail_item("traceIds", i, "uuid_parsing", "Input should be a valid UUID");
            }
        }
        if let Some(format) = &self.format {
            c.one_of("format", format, Format::NAMES);
        }
    }
}
