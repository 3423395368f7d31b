//! A project's trace settings, the one flow behind `PATCH /api/projects/{id}` and the
//! console: how long it keeps its traces (`traceRetentionDays`) and where it pushes them
//! (`otlpExport`), changed together in one transaction; and the project with both, as views
//! show it.

use std::collections::HashMap;

use entities::project;
use sea_orm::{DatabaseConnection, TransactionTrait};

use super::push::{self, Destination, ExportView, Push, PushError};
use crate::domain::{OrgId, ProjectId};
use crate::projects::ProjectError;

/// A project with where it pushes its recorded calls.
#[derive(Debug, Clone)]
pub struct ProjectDetail {
    pub project: project::Model,
    pub otlp_export: Option<ExportView>,
}

/// What a change sets (each `None`: left as it is; `Some(None)`: cleared).
#[derive(Debug, Clone, Default)]
pub struct TraceSettingsChange {
    pub trace_retention_days: Option<Option<i32>>,
    pub otlp_export: Option<Option<Destination>>,
}

/// Why a change did not happen.
#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error(transparent)]
    Project(#[from] ProjectError),
    #[error(transparent)]
    Push(#[from] PushError),
}

impl From<sea_orm::DbErr> for SettingsError {
    fn from(err: sea_orm::DbErr) -> Self {
        Self::Project(ProjectError::Database(err))
    }
}

/// Changes a project of `orgs` (another organization's is not found) and answers it. The
/// caller has checked who may change what (setting the push needs an owner).
#[tracing::instrument(level = "debug", skip_all, fields(project_id = %project_id))]
pub async fn change(
    db: &DatabaseConnection,
    push: &Push,
    orgs: &[OrgId],
    project_id: &ProjectId,
    change: TraceSettingsChange,
) -> Result<ProjectDetail, SettingsError> {
    let txn = db.begin().await?;
    let project = crate::projects::repo::find_in_orgs(&txn, project_id, orgs)
        .await?
        .ok_or(ProjectError::NotFound)?;
    if let Some(days) = change.trace_retention_days {
        crate::projects::repo::set_trace_retention(&txn, project_id, days).await?;
    }
    if let Some(destination) = change.otlp_export {
        push::service::set(push, &txn, &project, destination).await?;
    }
    txn.commit().await?;
    detail(db, orgs, project_id).await
}

/// A project of `orgs` with its push.
pub async fn detail(
    db: &DatabaseConnection,
    orgs: &[OrgId],
    project_id: &ProjectId,
) -> Result<ProjectDetail, SettingsError> {
    let project = crate::projects::repo::find_in_orgs(db, project_id, orgs)
        .await?
        .ok_or(ProjectError::NotFound)?;
    let otlp_export = push::service::view(db, project_id).await?;
    Ok(ProjectDetail { project, otlp_export })
}

/// The projects of `orgs` with their pushes (two queries for the pushes, whatever the count).
pub async fn list(db: &DatabaseConnection, orgs: &[OrgId]) -> Result<Vec<ProjectDetail>, SettingsError> {
    let projects = crate::projects::repo::list_for_orgs(db, orgs).await?;
    let ids: Vec<ProjectId> = projects.iter().map(|p| p.id.clone()).collect();
    let mut views: HashMap<ProjectId, ExportView> = push::service::views_of(db, &ids).await?;
    Ok(projects
        .into_iter()
        .map(|project| ProjectDetail {
            otlp_export: views.remove(&project.id),
            project,
        })
        .collect())
}
