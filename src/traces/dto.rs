//! Bodies, queries and views of the trace routes.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use crate::http::validate::{Checks, Validate};
use keel_core::domain::TraceId;
use keel_core::traces::export::Format;

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
    /// `records` (default), `prompts`, `raw`, `openai-chat` or `otlp-json` (each record an OTLP/JSON
    /// `ExportTraceServiceRequest` of up to 1,000 spans, ids in hex).
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
    /// Only traces with this tag.
    #[param(pattern = "^[a-z0-9_.:-]{1,50}$")]
    pub tag: Option<String>,
    /// `NAME:VALUE`: only traces whose score `NAME` is at least `VALUE`.
    #[serde(rename = "minScore")]
    #[param(
        rename = "minScore",
        pattern = r"^[a-z0-9_.:-]{1,50}:-?[0-9]{1,15}(\.[0-9]{1,15})?$"
    )]
    pub min_score: Option<String>,
}

impl ExportQuery {
    /// The query's filters, as the selection form has them.
    pub fn filters(&self) -> ExportFilters {
        ExportFilters {
            since: self.since.clone(),
            until: self.until.clone(),
            model: self.model.clone(),
            status: self.status.clone(),
            tag: self.tag.clone(),
            min_score: self.min_score.clone(),
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
    /// Only traces with this tag.
    #[schema(pattern = "^[a-z0-9_.:-]{1,50}$")]
    pub tag: Option<String>,
    /// `NAME:VALUE`: only traces whose score `NAME` is at least `VALUE`.
    #[serde(rename = "minScore")]
    #[schema(pattern = r"^[a-z0-9_.:-]{1,50}:-?[0-9]{1,15}(\.[0-9]{1,15})?$")]
    pub min_score: Option<String>,
}

fn rfc3339(value: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(value)
        .ok()
        .map(|at| at.with_timezone(&Utc))
}

impl ExportFilters {
    pub fn check(&self, c: &mut Checks) {
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
        if self.min_score.as_deref().is_some_and(|m| min_score(m).is_none()) {
            c.fail("minScore", "value_error", "Value error, minScore is NAME:VALUE");
        }
    }

    /// The repository's filter (the values were checked).
    pub fn to_filter(&self) -> keel_core::traces::TraceFilter {
        keel_core::traces::TraceFilter {
            model: self.model.clone(),
            ok: self.status.as_deref().map(|s| s == "ok"),
            before: None,
            since: self.since.as_deref().and_then(rfc3339),
            until: self.until.as_deref().and_then(rfc3339),
            tag: self.tag.clone(),
            min_score: self.min_score.as_deref().and_then(min_score),
            search: None,
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
            .is_some_and(|cursor| keel_core::traces::service::Cursor::decode(cursor).is_none())
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
    /// `records` (default), `prompts`, `raw`, `openai-chat` or `otlp-json` (each record an OTLP/JSON
    /// `ExportTraceServiceRequest` of up to 1,000 spans, ids in hex).
    #[schema(value_type = Option<crate::schemas::Format>)]
    pub format: Option<String>,
    /// Of the selected traces, only those these filters keep.
    #[serde(flatten)]
    pub filters: ExportFilters,
}

impl Validate for TraceSelectionBody {
    fn validate(&self, c: &mut Checks) {
        if let Some(format) = &self.format {
            c.one_of("format", format, Format::NAMES);
        }
        self.filters.check(c);
    }
}

/// A tag or a score's name: 1 to 50 of `a-z0-9_.:-`.
pub struct TagName;

impl utoipa::PartialSchema for TagName {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .pattern(Some(keel_core::traces::marks::NAME_PATTERN))
            .into()
    }
}

impl ToSchema for TagName {}

/// `NAME:VALUE` as the name and the value (the pattern was checked).
pub fn min_score(raw: &str) -> Option<(String, f64)> {
    keel_core::traces::marks::parse_min_score(raw)
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(rename_all = "camelCase")]
pub struct TraceListQuery {
    /// The project (of the caller's organizations; another's is 404).
    #[param(min_length = 1, max_length = 100)]
    pub project_id: String,
    /// Words and "quoted phrases" of the user and assistant messages, all required; keel
    /// tokenizes it (punctuation separates words; nothing is an operator).
    #[param(max_length = 500)]
    pub q: Option<String>,
    #[param(min_length = 1, max_length = 200)]
    pub model: Option<String>,
    /// `ok` (complete, 2xx, no error) or `error`.
    #[param(pattern = "^(ok|error)$")]
    pub status: Option<String>,
    /// Recorded at or after (RFC 3339).
    #[param(format = DateTime)]
    pub since: Option<String>,
    /// Recorded before (RFC 3339).
    #[param(format = DateTime)]
    pub until: Option<String>,
    /// Only traces with this tag.
    #[param(pattern = "^[a-z0-9_.:-]{1,50}$")]
    pub tag: Option<String>,
    /// `NAME:VALUE`: only traces whose score `NAME` is at least `VALUE`.
    #[param(pattern = r"^[a-z0-9_.:-]{1,50}:-?[0-9]{1,15}(\.[0-9]{1,15})?$")]
    pub min_score: Option<String>,
    /// The previous page's `nextCursor`.
    #[param(pattern = "^[0-9]{1,12}-[0-9]{9}-[0-9a-f]{32}$")]
    pub cursor: Option<String>,
    /// 1..200, default 50.
    #[param(minimum = 1, maximum = 200)]
    pub limit: Option<i64>,
}

impl Validate for TraceListQuery {
    fn validate(&self, c: &mut Checks) {
        if self
            .cursor
            .as_deref()
            .is_some_and(|cursor| keel_core::traces::service::Cursor::decode(cursor).is_none())
        {
            c.fail(
                "cursor",
                "value_error",
                "Value error, not a cursor a list answered",
            );
        }
        self.filters().check(c);
    }
}

impl TraceListQuery {
    fn filters(&self) -> ExportFilters {
        ExportFilters {
            since: self.since.clone(),
            until: self.until.clone(),
            model: self.model.clone(),
            status: self.status.clone(),
            tag: self.tag.clone(),
            min_score: self.min_score.clone(),
        }
    }

    /// The repository's filter (the values were checked), with the search.
    pub fn to_filter(&self) -> keel_core::traces::TraceFilter {
        let mut filter = self.filters().to_filter();
        filter.search = self
            .q
            .as_deref()
            .map(keel_core::traces::search::Query::parse)
            .filter(|q| !q.is_empty());
        filter
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TracePreview {
    /// The last user message (200 characters at most).
    pub input: Option<String>,
    /// The reply (200 characters at most).
    pub output: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ScoreView {
    pub value: f64,
    pub comment: Option<String>,
}

fn scores_view(
    scores: std::collections::BTreeMap<String, keel_core::traces::marks::Score>,
) -> std::collections::BTreeMap<String, ScoreView> {
    scores
        .into_iter()
        .map(|(name, s)| {
            (
                name,
                ScoreView {
                    value: s.value,
                    comment: s.comment,
                },
            )
        })
        .collect()
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TraceView {
    pub trace_id: String,
    pub project_id: String,
    pub created_at: DateTime<Utc>,
    pub provider: String,
    pub model: Option<String>,
    /// `ok` (complete, 2xx, no error) or `error`.
    pub status: String,
    /// The provider's HTTP status (keel's own, 502 or 504, when the provider was not reached).
    pub status_code: i32,
    /// Why the call is not `ok`: the provider's error, a cut stream, a client that left.
    pub error: Option<String>,
    pub latency_ms: i64,
    pub prompt_tokens: Option<i64>,
    pub completion_tokens: Option<i64>,
    /// The tokens were estimated from the text (a stream whose provider sent no usage).
    pub usage_estimated: bool,
    pub streamed: bool,
    pub preview: TracePreview,
    pub tags: Vec<String>,
    pub scores: std::collections::BTreeMap<String, ScoreView>,
}

impl From<keel_core::traces::browse::Listed> for TraceView {
    fn from(l: keel_core::traces::browse::Listed) -> Self {
        let t = l.trace;
        Self {
            status: keel_core::traces::status_of(t.status_code, t.complete, t.error.as_deref()).into(),
            trace_id: t.id.into(),
            project_id: t.project_id.into(),
            created_at: t.created_at,
            provider: t.provider,
            model: t.model,
            status_code: t.status_code,
            error: t.error,
            latency_ms: t.latency_ms,
            prompt_tokens: t.prompt_tokens,
            completion_tokens: t.completion_tokens,
            usage_estimated: t.usage_estimated,
            streamed: t.stream,
            preview: TracePreview {
                input: t.preview_input,
                output: t.preview_output,
            },
            tags: l.marks.tags,
            scores: scores_view(l.marks.scores),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TraceList {
    pub traces: Vec<TraceView>,
    /// The next page's `cursor`; null at the end.
    pub next_cursor: Option<String>,
}

/// A trace whole: its view, and its request and response as stored (redacted).
#[derive(Debug, Serialize, ToSchema)]
pub struct TraceDetail {
    #[serde(flatten)]
    pub view: TraceView,
    #[schema(value_type = Object)]
    pub request: Value,
    #[schema(value_type = Option<Object>)]
    pub response: Option<Value>,
}

impl TraceDetail {
    pub fn of(t: entities::trace::Model, marks: keel_core::traces::marks::Marks) -> Self {
        let request = serde_json::from_str(&t.request).unwrap_or(Value::String(t.request.clone()));
        let response = t
            .response
            .as_deref()
            .map(|r| serde_json::from_str(r).unwrap_or_else(|_| Value::String(r.to_owned())));
        let listed = keel_core::traces::browse::Listed {
            trace: keel_core::traces::ListedTrace::of(&t),
            marks,
        };
        Self {
            view: TraceView::from(listed),
            request,
            response,
        }
    }
}

/// Tags to add and to remove (at least one of them).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TagsBody {
    #[schema(value_type = Option<Vec<TagName>>, max_items = 20)]
    pub add: Option<Vec<String>>,
    #[schema(value_type = Option<Vec<TagName>>, max_items = 20)]
    pub remove: Option<Vec<String>>,
}

fn check_tags(c: &mut Checks, add: &Option<Vec<String>>, remove: &Option<Vec<String>>) {
    if add.as_ref().is_none_or(Vec::is_empty) && remove.as_ref().is_none_or(Vec::is_empty) {
        c.fail("add", "missing", "Field required: add or remove at least one tag");
    }
}

impl Validate for TagsBody {
    fn validate(&self, c: &mut Checks) {
        check_tags(c, &self.add, &self.remove);
    }
}

/// The same change of tags on many traces, all or nothing.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BulkTagsBody {
    #[schema(value_type = Vec<uuid::Uuid>, min_items = 1, max_items = 1000)]
    pub trace_ids: Vec<TraceId>,
    #[schema(value_type = Option<Vec<TagName>>, max_items = 20)]
    pub add: Option<Vec<String>>,
    #[schema(value_type = Option<Vec<TagName>>, max_items = 20)]
    pub remove: Option<Vec<String>>,
}

impl Validate for BulkTagsBody {
    fn validate(&self, c: &mut Checks) {
        check_tags(c, &self.add, &self.remove);
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TagsView {
    pub tags: Vec<String>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BulkTagged {
    /// Traces changed.
    pub updated: usize,
    /// Asked ids that are not traces of the caller's organizations.
    pub not_found: usize,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScoreBody {
    pub value: f64,
    #[schema(max_length = 1000)]
    pub comment: Option<String>,
}

impl Validate for ScoreBody {
    fn validate(&self, _c: &mut Checks) {}
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ScoresView {
    pub scores: std::collections::BTreeMap<String, ScoreView>,
}

impl ScoresView {
    pub fn of(scores: std::collections::BTreeMap<String, keel_core::traces::marks::Score>) -> Self {
        Self {
            scores: scores_view(scores),
        }
    }
}
