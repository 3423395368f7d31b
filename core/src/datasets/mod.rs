//! Datasets: a project's named selections of recorded calls, in versions that never change
//! (issue 60). A version's lines are taken from its traces once (`dataset_lines`, per
//! dataset and trace) and read from there ever after, so retagging, rescoring, retention
//! and redaction change nothing in it; each version keeps its order, its split (by trace id
//! and seed) and the SHA-256 of each split's lines. Jobs pin a version at create.

pub mod export;
mod lines;
pub(crate) mod repo;
pub mod service;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::domain::{DatasetId, JobId, JobStatus, TraceId};
use crate::traces::search;
use crate::traces::TraceFilter;

/// At most this many trace ids in one create or version body.
pub const MAX_TRACE_IDS: usize = 10_000;

/// Which of a project's traces a version selects, as `GET /api/traces` reads its query.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DatasetFilter {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub q: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// `ok` or `error`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub since: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub until: Option<DateTime<Utc>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// `NAME:VALUE`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_score: Option<String>,
}

impl DatasetFilter {
    /// The traces' filter (the values were checked at the edge).
    pub fn to_trace_filter(&self) -> TraceFilter {
        TraceFilter {
            model: self.model.clone(),
            ok: self.status.as_deref().map(|s| s == "ok"),
            before: None,
            since: self.since,
            until: self.until,
            tag: self.tag.clone(),
            min_score: self
                .min_score
                .as_deref()
                .and_then(crate::traces::marks::parse_min_score),
            search: self
                .q
                .as_deref()
                .map(search::Query::parse)
                .filter(|q| !q.is_empty()),
        }
    }
}

/// How a dataset splits each version's lines.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Split {
    /// The share in validation, 0 to 0.5.
    pub validation: f64,
    pub seed: i64,
}

impl Default for Split {
    fn default() -> Self {
        Self {
            validation: 0.0,
            seed: 0,
        }
    }
}

impl Split {
    /// Whether `trace` is on the validation side: the first 8 bytes of SHA-256 of the seed
    /// and the id, as a fraction of 2^64, below the share. The same trace and seed always
    /// land on the same side, in every version.
    pub fn is_validation(&self, trace: &TraceId) -> bool {
        if self.validation <= 0.0 {
            return false;
        }
        let digest = Sha256::digest(format!("{}:{}", self.seed, trace.as_str()));
        let mut head = [0u8; 8];
        head.copy_from_slice(&digest[..8]);
        let fraction = u64::from_be_bytes(head) as f64 / 18_446_744_073_709_551_616.0;
        fraction < self.validation
    }
}

/// Which traces of a selection are kept when several share a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Dedupe {
    #[default]
    None,
    /// One trace per identical request messages: the latest.
    Prompt,
}

impl Dedupe {
    pub const NAMES: &'static [&'static str] = &["none", "prompt"];

    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "none" => Some(Self::None),
            "prompt" => Some(Self::Prompt),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Prompt => "prompt",
        }
    }
}

/// A split of a version's lines, as exports name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitPart {
    Train,
    Validation,
    All,
}

impl SplitPart {
    pub const NAMES: &'static [&'static str] = &["train", "validation", "all"];

    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "train" => Some(Self::Train),
            "validation" => Some(Self::Validation),
            "all" => Some(Self::All),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Train => "train",
            Self::Validation => "validation",
            Self::All => "all",
        }
    }

    /// The items' `validation` value this part takes (`None`: both).
    fn validation(self) -> Option<bool> {
        match self {
            Self::Train => Some(false),
            Self::Validation => Some(true),
            Self::All => None,
        }
    }
}

/// The formats a dataset's lines come in (those of the trace export that train).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineFormat {
    OpenaiChat,
    Records,
    Prompts,
}

impl LineFormat {
    pub const ALL: [Self; 3] = [Self::OpenaiChat, Self::Records, Self::Prompts];
    pub const NAMES: &'static [&'static str] = &["openai-chat", "records", "prompts"];

    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "openai-chat" => Some(Self::OpenaiChat),
            "records" => Some(Self::Records),
            "prompts" => Some(Self::Prompts),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::OpenaiChat => "openai-chat",
            Self::Records => "records",
            Self::Prompts => "prompts",
        }
    }
}

/// A new dataset: its first version's selection, its split and dedupe.
#[derive(Debug, Clone)]
pub struct NewDataset {
    pub project_id: crate::domain::ProjectId,
    /// The organization named (it must be the project's).
    pub org_id: Option<crate::domain::OrgId>,
    pub name: String,
    pub description: Option<String>,
    pub filter: Option<DatasetFilter>,
    pub trace_ids: Vec<TraceId>,
    pub split: Split,
    pub dedupe: Dedupe,
}

/// A new version: the previous one's selection, with the filter's matches (the body's, or
/// the previous filter run again when the body names no filter and no ids) and `add`, less
/// `remove`.
#[derive(Debug, Clone, Default)]
pub struct VersionChange {
    pub filter: Option<DatasetFilter>,
    pub add: Vec<TraceId>,
    pub remove: Vec<TraceId>,
}

/// A change of a dataset's name or description.
#[derive(Debug, Clone, Default)]
pub struct DatasetPatch {
    pub name: Option<String>,
    /// `Some(None)` clears it.
    pub description: Option<Option<String>>,
}

/// Lines of each split.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub train: i64,
    pub validation: i64,
}

/// SHA-256 (hex) of a split's lines, each followed by `\n`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Digests {
    pub train: String,
    pub validation: String,
    pub all: String,
}

/// One version as views show it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Version {
    pub version: i32,
    pub created_at: DateTime<Utc>,
    pub filter: Option<DatasetFilter>,
    pub counts: Counts,
    pub skipped: i64,
    /// Of the `openai-chat` lines.
    pub sha256: Sha256s,
    #[serde(skip)]
    pub digests: std::collections::BTreeMap<String, Digests>,
}

/// SHA-256 (hex) of each split's `openai-chat` lines.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Sha256s {
    pub train: String,
    pub validation: String,
}

impl Version {
    /// The digest of `format`'s lines of `part`.
    pub fn digest(&self, format: LineFormat, part: SplitPart) -> Option<&str> {
        let digests = self.digests.get(format.as_str())?;
        Some(match part {
            SplitPart::Train => &digests.train,
            SplitPart::Validation => &digests.validation,
            SplitPart::All => &digests.all,
        })
    }

    /// The lines of `part`.
    pub fn lines(&self, part: SplitPart) -> i64 {
        match part {
            SplitPart::Train => self.counts.train,
            SplitPart::Validation => self.counts.validation,
            SplitPart::All => self.counts.train + self.counts.validation,
        }
    }

    /// What a job pins: `{datasetId, version, counts, sha256}`.
    pub fn pinned(&self, dataset_id: &DatasetId) -> serde_json::Value {
        serde_json::json!({
            "datasetId": dataset_id,
            "version": self.version,
            "counts": self.counts,
            "sha256": self.sha256,
        })
    }
}

/// A job that trained on a version.
#[derive(Debug, Clone, PartialEq)]
pub struct DatasetJob {
    pub job_id: JobId,
    pub version: i32,
    pub status: JobStatus,
    pub action: crate::domain::JobAction,
    pub created_at: DateTime<Utc>,
}

/// A dataset with its versions (oldest first) and the jobs that used them.
#[derive(Debug, Clone)]
pub struct Dataset {
    pub dataset: entities::dataset::Model,
    pub versions: Vec<Version>,
    pub jobs: Vec<DatasetJob>,
}

impl Dataset {
    pub fn version(&self, version: i32) -> Option<&Version> {
        self.versions.iter().find(|v| v.version == version)
    }

    pub fn latest(&self) -> Option<&Version> {
        self.versions.last()
    }
}

/// Why a dataset operation did not happen.
#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    #[error("project not found")]
    ProjectNotFound,
    #[error("dataset not found")]
    DatasetNotFound,
    #[error("dataset version not found")]
    VersionNotFound,
    #[error("the project has a dataset named {0:?} already")]
    NameTaken(String),
    /// A job that is not over trains on it.
    #[error("job {0} (not over) trains on this dataset: stop it or let it end first")]
    InUse(JobId),
    /// Listed trace ids that are no traces of the project (at most the first 10 named).
    #[error("not traces of this project: {}", .0.iter().map(TraceId::as_str).collect::<Vec<_>>().join(", "))]
    UnknownTraces(Vec<TraceId>),
    #[error("job not found")]
    JobNotFound,
    /// The worker does not hold the job while it runs (or named no worker).
    #[error("this worker does not hold the job while it runs")]
    JobNotHeld,
    /// Another version was made meanwhile.
    #[error("another version of the dataset was made meanwhile: retry")]
    Concurrent,
    #[error(transparent)]
    Database(#[from] sea_orm::DbErr),
}

/// An event's `data`: `{datasetId, projectId, name, version}` with the version's view.
pub fn version_event(dataset: &entities::dataset::Model, version: &Version) -> serde_json::Value {
    serde_json::json!({
        "datasetId": dataset.id,
        "projectId": dataset.project_id,
        "name": dataset.name,
        "version": version,
    })
}
