//! Flash: environments, managed runs, checkpoints and product events mirrored from the control plane.

pub mod hub;
pub(crate) mod repo;
pub mod service;

use serde_json::{Map, Value};

/// An environment as the control plane publishes it (the mirror's fields).
#[derive(Debug, Clone)]
pub struct EnvironmentPublish {
    pub slug: String,
    pub name: String,
    pub hub_repo: Option<String>,
    pub hub_ref: Option<String>,
    pub hub_path: String,
    pub package_sha256: Option<String>,
    pub published_by_user_id: Option<String>,
    pub api_key_id: Option<String>,
    pub metadata: Option<Map<String, Value>>,
}

/// Why a mirror was not written.
#[derive(Debug, thiserror::Error)]
pub enum FlashError {
    #[error("project not found or not active in this organization")]
    ProjectNotActive,
    #[error("environment not found in this project")]
    EnvironmentNotFound,
    #[error("organization not found")]
    OrgNotFound,
    /// The event is not on `flash.event_allowlist` (the allowed ones).
    #[error("the event is not on the allowlist")]
    EventNotAllowed { allowed: Vec<String> },
    /// A concurrent writer removed the row between the insert and the update.
    #[error("the {0} changed meanwhile; try again")]
    Changed(&'static str),
    #[error("this slug is another organization's environment")]
    OtherOrgsEnvironment,
    #[error("this run belongs to another project")]
    OtherProjectsRun,
    #[error("this checkpoint belongs to another project")]
    OtherProjectsCheckpoint,
    #[error(transparent)]
    Database(#[from] sea_orm::DbErr),
}
