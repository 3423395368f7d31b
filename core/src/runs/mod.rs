//! Runs of projects: created and updated by their owners, linked to an experiment tracker,
//! and their checkpoints (recorded by the control plane).

pub(crate) mod repo;
pub mod service;

use serde_json::{Map, Value};

use crate::domain::ProjectId;

/// The status of a run nobody has updated yet.
pub const INITIAL_STATUS: &str = "created";

/// Most checkpoints one call may record.
pub const MAX_CHECKPOINTS_PER_CALL: usize = 1000;

/// A run to create.
#[derive(Debug, Clone)]
pub struct NewRun {
    pub project_id: ProjectId,
    pub name: Option<String>,
    pub model: Option<String>,
    pub environment_slug: Option<String>,
    pub config: Option<Map<String, Value>>,
}

/// The fields an update names: `Some(None)` clears one.
#[derive(Debug, Clone, Default)]
pub struct RunChanges {
    pub status: Option<String>,
    pub summary: Option<Option<Value>>,
    pub metrics: Option<Option<Map<String, Value>>>,
    pub error: Option<Option<String>>,
}

/// Where a run lives in the experiment tracker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrackerLink {
    pub entity: String,
    pub project: String,
    pub tracker_run_id: String,
    pub url: Option<String>,
}

impl TrackerLink {
    /// The run's link, if it has one.
    pub fn of(r: &entities::run::Model) -> Option<Self> {
        Some(Self {
            entity: r.tracker_entity.clone()?,
            project: r.tracker_project.clone()?,
            tracker_run_id: r.tracker_run_id.clone()?,
            url: r.tracker_url.clone(),
        })
    }
}

/// One checkpoint of a run: its step and the subfolder holding it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub step: i64,
    pub subfolder: String,
}

/// What the tracker said of one asked run.
#[derive(Debug, Clone)]
pub struct TrackerEntry {
    /// As asked.
    pub run_id: String,
    pub status: TrackerStatus,
    pub keel_run_id: Option<crate::domain::RunId>,
    pub project_id: Option<ProjectId>,
    pub tracker_run_id: Option<String>,
    pub url: Option<String>,
    /// The tracker's answer for the run ([`TrackerStatus::Ok`] only).
    pub run: Option<Value>,
    pub error: Option<String>,
}

/// How one asked run was answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrackerStatus {
    /// Read from the tracker.
    Ok,
    /// No tracker is configured: the stored link.
    Linked,
    /// No run of the caller's is linked to it.
    NotLinked,
    /// The read failed.
    Error,
}

impl TrackerStatus {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Linked => "linked",
            Self::NotLinked => "not_linked",
            Self::Error => "error",
        }
    }
}

/// Why a run flow did not happen.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("run not found")]
    RunNotFound,
    #[error("project not found")]
    ProjectNotFound,
    #[error(transparent)]
    Database(#[from] sea_orm::DbErr),
}
