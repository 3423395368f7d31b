//! Bodies, queries and views of the dataset routes.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::http::validate::{Checks, Validate};
use crate::traces::dto::ExportFilters;
use keel_core::datasets::{self as core, Dataset, DatasetFilter, Dedupe, LineFormat, SplitPart};
use keel_core::domain::{OrgId, ProjectId, TraceId};

/// Which traces a version takes, as `GET /api/traces` reads its query (each optional).
#[derive(Debug, Default, Clone, Deserialize, ToSchema)]
pub struct DatasetFilterBody {
    /// Words and "quoted phrases" of the user and assistant messages, all required.
    #[schema(max_length = 500)]
    pub q: Option<String>,
    #[serde(flatten)]
    pub filters: ExportFilters,
}

impl DatasetFilterBody {
    fn check(&self, c: &mut Checks) {
        self.filters.check(c);
    }

    /// The core's filter (the values were checked).
    pub fn to_core(&self) -> DatasetFilter {
        // The times as the trace export reads them.
        let read = self.filters.to_filter();
        DatasetFilter {
            q: self.q.clone().filter(|q| !q.trim().is_empty()),
            model: self.filters.model.clone(),
            status: self.filters.status.clone(),
            since: read.since,
            until: read.until,
            tag: self.filters.tag.clone(),
            min_score: self.filters.min_score.clone(),
        }
    }
}

/// How each version's lines are split: a share in validation, by trace id and seed.
#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SplitBody {
    /// 0 (the default: every line in train) to 0.5.
    #[schema(minimum = 0, maximum = 0.5)]
    pub validation: f64,
    /// With a trace's id, which side it is on (0 by default).
    pub seed: Option<i64>,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DatasetCreateBody {
    /// The project's organization (optional: the project says).
    #[schema(value_type = Option<String>, min_length = 1, max_length = 100)]
    #[serde(default, deserialize_with = "OrgId::optional")]
    pub org_id: Option<OrgId>,
    #[schema(value_type = String, format = Uuid)]
    pub project_id: ProjectId,
    /// Unique in the project (not only whitespace).
    // Its pattern (not blank) is set on the document: openapi::refine::NOT_BLANK.
    #[schema(min_length = 1, max_length = 200)]
    pub name: String,
    #[schema(max_length = 2000)]
    pub description: Option<String>,
    /// The traces it takes (at least one of `filter` and `traceIds`).
    pub filter: Option<DatasetFilterBody>,
    /// Traces it takes besides the filter's (of the project).
    #[schema(value_type = Option<Vec<uuid::Uuid>>, min_items = 1, max_items = 10000)]
    pub trace_ids: Option<Vec<TraceId>>,
    pub split: Option<SplitBody>,
    /// `none` (default) or `prompt`: one trace per identical request messages (the latest).
    #[schema(value_type = Option<DedupeName>)]
    pub dedupe: Option<String>,
}

/// `none` or `prompt`.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
#[allow(dead_code)]
pub enum DedupeName {
    None,
    Prompt,
}

impl Validate for DatasetCreateBody {
    fn validate(&self, c: &mut Checks) {
        c.display_name("name", &self.name, 200);
        if self.filter.is_none() && self.trace_ids.as_ref().is_none_or(Vec::is_empty) {
            c.fail(
                "filter",
                "missing",
                "Field required: a dataset takes a filter, traceIds or both",
            );
        }
        if let Some(filter) = &self.filter {
            filter.check(c);
        }
        if let Some(split) = &self.split {
            if !(0.0..=0.5).contains(&split.validation) {
                c.fail(
                    "split",
                    "value_error",
                    "Value error, split.validation is 0 to 0.5",
                );
            }
        }
        if let Some(dedupe) = &self.dedupe {
            c.one_of("dedupe", dedupe, Dedupe::NAMES);
        }
    }
}

impl DatasetCreateBody {
    pub fn into_core(self) -> core::NewDataset {
        core::NewDataset {
            project_id: self.project_id,
            org_id: self.org_id,
            name: self.name,
            description: self.description,
            filter: self.filter.as_ref().map(DatasetFilterBody::to_core),
            trace_ids: self.trace_ids.unwrap_or_default(),
            split: self.split.map_or_else(core::Split::default, |s| core::Split {
                validation: s.validation,
                seed: s.seed.unwrap_or(0),
            }),
            dedupe: self.dedupe.as_deref().and_then(Dedupe::parse).unwrap_or_default(),
        }
    }
}

/// Trace ids to add to the previous version's selection and to remove from it.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TraceIdsChange {
    #[schema(value_type = Option<Vec<uuid::Uuid>>, max_items = 10000)]
    pub add: Option<Vec<TraceId>>,
    #[schema(value_type = Option<Vec<uuid::Uuid>>, max_items = 10000)]
    pub remove: Option<Vec<TraceId>>,
}

/// A new version: the latest one's selection with `filter`'s matches and `traceIds.add`,
/// less `traceIds.remove`. An empty body runs the last filter a version ran again.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DatasetVersionBody {
    pub filter: Option<DatasetFilterBody>,
    pub trace_ids: Option<TraceIdsChange>,
}

impl Validate for DatasetVersionBody {
    fn validate(&self, c: &mut Checks) {
        if let Some(filter) = &self.filter {
            filter.check(c);
        }
    }
}

impl DatasetVersionBody {
    pub fn into_core(self) -> core::VersionChange {
        let ids = self.trace_ids.unwrap_or_default();
        core::VersionChange {
            filter: self.filter.as_ref().map(DatasetFilterBody::to_core),
            add: ids.add.unwrap_or_default(),
            remove: ids.remove.unwrap_or_default(),
        }
    }
}

/// A change of name or description (only the fields given; `description: null` clears it).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DatasetPatchBody {
    // Its pattern (not blank) is set on the document: openapi::refine::NOT_BLANK.
    #[schema(min_length = 1, max_length = 200)]
    pub name: Option<String>,
    #[serde(default, deserialize_with = "crate::http::extract::present")]
    #[schema(value_type = Option<String>, max_length = 2000)]
    pub description: Option<Option<String>>,
}

impl Validate for DatasetPatchBody {
    fn validate(&self, c: &mut Checks) {
        if let Some(name) = &self.name {
            c.display_name("name", name, 200);
        }
    }
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(rename_all = "camelCase")]
pub struct DatasetListQuery {
    /// The project (of the caller's organizations; another's is 404).
    #[param(min_length = 1, max_length = 100)]
    pub project_id: String,
}

impl Validate for DatasetListQuery {
    fn validate(&self, _: &mut Checks) {}
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ExportQuery {
    /// `openai-chat` (default), `records` or `prompts`.
    #[param(pattern = "^(openai-chat|records|prompts)$")]
    pub format: Option<String>,
    /// `train`, `validation` or `all` (default).
    #[param(pattern = "^(train|validation|all)$")]
    pub split: Option<String>,
    /// Lines to leave out at the start: a download resumed after the lines it has (the
    /// headers still describe the whole split, whose bytes never change). Default 0.
    #[param(minimum = 0, maximum = 2147483647)]
    pub offset: Option<i64>,
}

impl ExportQuery {
    /// Lines to leave out at the start.
    pub fn offset(&self) -> u64 {
        self.offset.map_or(0, |o| o.max(0) as u64)
    }

    pub fn format(&self) -> LineFormat {
        self.format
            .as_deref()
            .and_then(LineFormat::parse)
            .unwrap_or(LineFormat::OpenaiChat)
    }

    pub fn part(&self, default: SplitPart) -> SplitPart {
        self.split
            .as_deref()
            .and_then(SplitPart::parse)
            .unwrap_or(default)
    }
}

impl Validate for ExportQuery {
    fn validate(&self, c: &mut Checks) {
        if let Some(format) = &self.format {
            c.one_of("format", format, LineFormat::NAMES);
        }
        if let Some(split) = &self.split {
            c.one_of("split", split, SplitPart::NAMES);
        }
    }
}

/// The worker's read of its job's dataset.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct JobDatasetQuery {
    /// The worker that holds the job (required: none is 409 as any other worker).
    #[param(min_length = 1, max_length = 200)]
    pub worker_id: Option<String>,
    /// `openai-chat` (default), `records` or `prompts`.
    #[param(pattern = "^(openai-chat|records|prompts)$")]
    pub format: Option<String>,
    /// `train` (default), `validation` or `all`.
    #[param(pattern = "^(train|validation|all)$")]
    pub split: Option<String>,
    /// Lines to leave out at the start (a read resumed after the lines it has). Default 0.
    #[param(minimum = 0, maximum = 2147483647)]
    pub offset: Option<i64>,
}

impl JobDatasetQuery {
    /// The format and split asked for, as an export's query.
    pub fn export(&self) -> ExportQuery {
        ExportQuery {
            format: self.format.clone(),
            split: self.split.clone(),
            offset: self.offset,
        }
    }
}

impl Validate for JobDatasetQuery {
    fn validate(&self, c: &mut Checks) {
        self.export().validate(c);
    }
}

/// Lines of each split.
#[derive(Debug, Serialize, ToSchema)]
pub struct SplitCounts {
    pub train: i64,
    pub validation: i64,
}

/// SHA-256 (hex) of each split's `openai-chat` lines (each line followed by `\n`).
#[derive(Debug, Serialize, ToSchema)]
pub struct SplitDigests {
    pub train: String,
    pub validation: String,
}

/// The dataset version a job trains on, as pinned at its create.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PinnedDataset {
    #[schema(format = Uuid)]
    pub dataset_id: String,
    pub version: i32,
    pub counts: SplitCounts,
    pub sha256: SplitDigests,
}

/// A job that trained (or trains) on a version.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatasetJobView {
    pub job_id: String,
    pub action: String,
    pub status: String,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatasetVersionView {
    pub version: i32,
    pub created_at: DateTime<Utc>,
    /// The filter this version ran, if any.
    #[schema(value_type = Option<Object>)]
    pub filter: Option<serde_json::Value>,
    pub counts: SplitCounts,
    /// Selected traces left out: not trainable (incomplete, an error, no messages or no
    /// reply to learn from) or a duplicate prompt.
    pub skipped: i64,
    pub sha256: SplitDigests,
    /// The jobs that pinned this version, newest first.
    pub jobs: Vec<DatasetJobView>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DatasetView {
    pub dataset_id: String,
    pub org_id: String,
    pub project_id: String,
    pub name: String,
    pub description: Option<String>,
    /// The latest version.
    pub version: i32,
    /// The share of each version's lines in validation, and the seed.
    pub split: SplitView,
    /// `none` or `prompt`.
    pub dedupe: String,
    /// Oldest first.
    pub versions: Vec<DatasetVersionView>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SplitView {
    pub validation: f64,
    pub seed: i64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DatasetList {
    /// Newest first.
    pub datasets: Vec<DatasetView>,
}

impl From<Dataset> for DatasetView {
    fn from(d: Dataset) -> Self {
        let model = d.dataset;
        let versions = d
            .versions
            .into_iter()
            .map(|v| DatasetVersionView {
                version: v.version,
                created_at: v.created_at,
                filter: v.filter.as_ref().and_then(|f| serde_json::to_value(f).ok()),
                counts: SplitCounts {
                    train: v.counts.train,
                    validation: v.counts.validation,
                },
                skipped: v.skipped,
                sha256: SplitDigests {
                    train: v.sha256.train,
                    validation: v.sha256.validation,
                },
                jobs: d
                    .jobs
                    .iter()
                    .filter(|j| j.version == v.version)
                    .map(|j| DatasetJobView {
                        job_id: j.job_id.to_string(),
                        action: j.action.as_str().to_owned(),
                        status: j.status.as_str().to_owned(),
                        created_at: j.created_at,
                    })
                    .collect(),
            })
            .collect();
        Self {
            dataset_id: model.id.to_string(),
            org_id: model.org_id.to_string(),
            project_id: model.project_id.to_string(),
            name: model.name,
            description: model.description,
            version: model.latest_version,
            split: SplitView {
                validation: model.split_validation,
                seed: model.split_seed,
            },
            dedupe: model.dedupe,
            versions,
            created_at: model.created_at,
            updated_at: model.updated_at,
        }
    }
}
