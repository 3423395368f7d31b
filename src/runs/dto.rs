//! Bodies and views of the run routes and `GET /api/tracker`.

use chrono::{DateTime, Utc};
use entities::run;
use keel_core::runs::{self as core_runs};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::http::extract::present;
use crate::http::validate::{Checks, Validate};
use keel_core::domain::{OrgId, ProjectId};

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunCreateRequest {
    #[schema(value_type = String, format = Uuid)]
    pub project_id: ProjectId,
    #[schema(min_length = 1, max_length = 200)]
    pub name: Option<String>,
    #[schema(min_length = 1, max_length = 200)]
    pub model: Option<String>,
    #[schema(
        min_length = 3,
        max_length = 512,
        pattern = r"^[a-z0-9][a-z0-9._-]*/[a-z0-9][a-z0-9._-]*/[a-z0-9][a-z0-9._-]*$"
    )]
    pub environment_slug: Option<String>,
    /// Free-form run configuration.
    #[schema(value_type = Option<Object>)]
    pub config: Option<Map<String, Value>>,
}

impl Validate for RunCreateRequest {}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunCreateResponse {
    pub run_id: String,
    pub project_id: String,
    pub status: String,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct RunUpdateRequest {
    #[schema(min_length = 1, max_length = 64)]
    pub status: Option<String>,
    /// A text or an object; `null` clears it.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<Object>)]
    pub summary: Option<Option<Value>>,
    /// Free-form metrics; `null` clears them.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<Object>)]
    pub metrics: Option<Option<Map<String, Value>>>,
    /// `null` clears it.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>, max_length = 10000)]
    pub error: Option<Option<String>>,
}

impl Validate for RunUpdateRequest {
    fn validate(&self, c: &mut Checks) {
        match &self.summary {
            Some(Some(Value::String(text))) => c.str_len("summary", text, 0, 10_000),
            Some(Some(Value::Object(_)) | None) | None => {}
            Some(Some(_)) => c.fail(
                "summary",
                "dict_type",
                "Input should be a valid dictionary or string",
            ),
        }
        if let Some(Some(_error)) = &self.error {}
    }
}

/// A run as its owner sees it (the answer to an update).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunView {
    pub run_id: String,
    pub project_id: String,
    pub name: Option<String>,
    pub model: Option<String>,
    pub environment_slug: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub config: Option<Value>,
    pub status: String,
    #[schema(value_type = Option<Object>)]
    pub summary: Option<Value>,
    #[schema(value_type = Option<Object>)]
    pub metrics: Option<Value>,
    pub error: Option<String>,
    pub tracker: Option<TrackerLink>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

fn parse_json(text: Option<&str>) -> Option<Value> {
    text.and_then(|t| serde_json::from_str(t).ok())
}

impl From<run::Model> for RunView {
    fn from(r: run::Model) -> Self {
        let tracker = keel_core::runs::TrackerLink::of(&r).map(TrackerLink::from);
        Self {
            config: parse_json(r.config.as_deref()),
            summary: parse_json(r.summary.as_deref()),
            metrics: parse_json(r.metrics.as_deref()),
            run_id: r.id.into(),
            project_id: r.project_id.into(),
            name: r.name,
            model: r.model,
            environment_slug: r.environment_slug,
            status: r.status,
            error: r.error,
            tracker,
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

#[derive(Debug, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrackerLink {
    /// The tracker's entity (team or user).
    #[schema(min_length = 1, max_length = 200)]
    pub entity: String,
    /// The tracker's project.
    #[schema(min_length = 1, max_length = 200)]
    pub project: String,
    #[schema(min_length = 1, max_length = 200)]
    pub tracker_run_id: String,
    /// A link to the run in the tracker's UI (http or https).
    #[schema(
        min_length = 1,
        max_length = 2048,
        pattern = r"^https?://[A-Za-z0-9][A-Za-z0-9.-]*(:[0-9]{1,5})?([/?#][!-~]*)?$"
    )]
    pub url: Option<String>,
}

/// A tracker link: http(s), a host, an optional port, then printable ASCII (the same pattern
/// as the schema's).
static TRACKER_URL_RE: lazy_regex::Lazy<regex::Regex> =
    lazy_regex::lazy_regex!(r"^https?://[A-Za-z0-9][A-Za-z0-9.-]*(:[0-9]{1,5})?([/?#][!-~]*)?$");

impl Validate for TrackerLink {
    fn validate(&self, c: &mut Checks) {
        if let Some(url) = &self.url {
            if !TRACKER_URL_RE.is_match(url) {
                c.fail("url", "url_parsing", "Input should be a valid http or https URL");
            }
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrackerLinked {
    pub run_id: String,
    pub entity: String,
    pub project: String,
    pub tracker_run_id: String,
    pub url: Option<String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
pub struct CheckpointItem {
    #[schema(minimum = 0)]
    pub step: i64,
    #[schema(min_length = 1, max_length = 300)]
    pub subfolder: String,
}

impl Validate for CheckpointItem {}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunCheckpointsBody {
    #[schema(min_length = 1, max_length = 300)]
    pub run_id: String,
    #[schema(value_type = String, min_length = 1, max_length = 300)]
    pub org_id: OrgId,
    #[schema(value_type = String, format = Uuid)]
    pub project_id: ProjectId,
    #[schema(max_items = 1000)]
    pub checkpoints: Vec<CheckpointItem>,
}

impl Validate for RunCheckpointsBody {
    fn validate(&self, c: &mut Checks) {
        for (i, item) in self.checkpoints.iter().enumerate() {
            c.nested("checkpoints", Some(i), item);
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointsUpserted {
    pub run_id: String,
    /// Distinct steps written by this call.
    pub upserted: usize,
    /// Checkpoints the run has now.
    pub total: u64,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct CheckpointsQuery {
    #[param(min_length = 1, max_length = 300)]
    pub run_id: String,
    #[param(value_type = String, min_length = 1, max_length = 300)]
    pub org_id: OrgId,
    #[param(value_type = String, format = Uuid)]
    pub project_id: ProjectId,
}

impl Validate for CheckpointsQuery {}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunCheckpoints {
    pub run_id: String,
    /// Ordered by step.
    pub checkpoints: Vec<CheckpointItem>,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct TrackerQuery {
    /// The tracker's entity (team or user).
    #[param(min_length = 1, max_length = 200)]
    pub entity: String,
    /// The tracker's project.
    #[param(min_length = 1, max_length = 200)]
    pub project: String,
    /// Repeatable, 1..500 values: a tracker run id or a keel run id linked to one.
    #[param(schema_with = run_ids_schema)]
    pub run_id: Vec<String>,
}

/// 1..500 run ids of 1..200 characters each.
fn run_ids_schema() -> utoipa::openapi::Array {
    use utoipa::openapi::{ArrayBuilder, ObjectBuilder, Type};
    ArrayBuilder::new()
        .items(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(Some(1))
                .max_length(Some(200)),
        )
        .min_items(Some(1))
        .max_items(Some(500))
        .build()
}

impl Validate for TrackerQuery {}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrackerRunEntry {
    /// As asked.
    pub run_id: String,
    /// `ok` (read from the tracker), `linked` (no tracker configured: the stored link),
    /// `not_linked` (no run of the caller's is linked to it) or `error` (the read failed).
    pub status: String,
    pub keel_run_id: Option<String>,
    pub project_id: Option<String>,
    pub tracker_run_id: Option<String>,
    pub url: Option<String>,
    /// The tracker's answer for the run (status `ok` only).
    #[schema(value_type = Option<Object>)]
    pub run: Option<Value>,
    pub error: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrackerRuns {
    pub entity: String,
    pub project: String,
    /// Whether a tracker is configured (otherwise only stored links are answered).
    pub tracker_configured: bool,
    /// One entry per distinct asked run id, in the order asked.
    pub runs: Vec<TrackerRunEntry>,
}

impl From<RunCreateRequest> for core_runs::NewRun {
    fn from(body: RunCreateRequest) -> Self {
        Self {
            project_id: body.project_id,
            name: body.name,
            model: body.model,
            environment_slug: body.environment_slug,
            config: body.config,
        }
    }
}

impl From<RunUpdateRequest> for core_runs::RunChanges {
    fn from(body: RunUpdateRequest) -> Self {
        Self {
            status: body.status,
            summary: body.summary,
            metrics: body.metrics,
            error: body.error,
        }
    }
}

impl From<TrackerLink> for core_runs::TrackerLink {
    fn from(link: TrackerLink) -> Self {
        Self {
            entity: link.entity,
            project: link.project,
            tracker_run_id: link.tracker_run_id,
            url: link.url,
        }
    }
}

impl From<core_runs::TrackerLink> for TrackerLink {
    fn from(link: core_runs::TrackerLink) -> Self {
        Self {
            entity: link.entity,
            project: link.project,
            tracker_run_id: link.tracker_run_id,
            url: link.url,
        }
    }
}

impl From<CheckpointItem> for core_runs::Checkpoint {
    fn from(item: CheckpointItem) -> Self {
        Self {
            step: item.step,
            subfolder: item.subfolder,
        }
    }
}

impl From<core_runs::Checkpoint> for CheckpointItem {
    fn from(c: core_runs::Checkpoint) -> Self {
        Self {
            step: c.step,
            subfolder: c.subfolder,
        }
    }
}

impl From<core_runs::TrackerEntry> for TrackerRunEntry {
    fn from(e: core_runs::TrackerEntry) -> Self {
        Self {
            run_id: e.run_id,
            status: e.status.as_str().to_owned(),
            keel_run_id: e.keel_run_id.map(Into::into),
            project_id: e.project_id.map(Into::into),
            tracker_run_id: e.tracker_run_id,
            url: e.url,
            run: e.run,
            error: e.error,
        }
    }
}
