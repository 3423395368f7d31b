//! Flash flows: the control plane's mirrors of environments, managed runs and checkpoints,
//! and its product events. Every mirror belongs to an active project of the organization.

use entities::{flash_environment, project};
use sea_orm::{ConnectionTrait, DatabaseConnection};
use serde_json::{Map, Value};

use super::repo::{self, Upserted};
use super::{EnvironmentPublish, FlashError};
use crate::domain::{OrgId, ProjectId};

/// The project, active within the organization.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id, project_id = %project_id))]
pub async fn active_project(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    project_id: &ProjectId,
) -> Result<project::Model, FlashError> {
    crate::projects::repo::find_in_org(db, org_id, project_id)
        .await?
        .filter(|p| p.active)
        .ok_or(FlashError::ProjectNotActive)
}

/// Creates or replaces an environment's mirror (by slug); answers it and whether it is new.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id, project_id = %project_id))]
pub async fn publish_environment(
    db: &DatabaseConnection,
    org_id: &OrgId,
    project_id: &ProjectId,
    environment: &EnvironmentPublish,
    default_repo: &str,
) -> Result<(flash_environment::Model, bool), FlashError> {
    let project = active_project(db, org_id, project_id).await?;
    repo::publish_environment(db, &project, environment, default_repo).await
}

/// Deletes an environment's mirror; answers whether there was one.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id, project_id = %project_id))]
pub async fn delete_environment(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    project_id: &ProjectId,
    slug: &str,
) -> Result<bool, FlashError> {
    Ok(repo::delete_environment(db, org_id, project_id, slug).await?)
}

/// Whether the environment is the project's.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id, project_id = %project_id))]
pub async fn check_environment(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    project_id: &ProjectId,
    slug: &str,
) -> Result<(), FlashError> {
    match repo::find_environment(db, slug).await? {
        Some(env) if env.org_id == *org_id && env.project_id == *project_id => Ok(()),
        _ => Err(FlashError::EnvironmentNotFound),
    }
}

/// Records one use of an environment (by a run, when named).
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id, project_id = %project_id))]
pub async fn record_use(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    project_id: &ProjectId,
    slug: &str,
    run_id: Option<&str>,
) -> Result<(), FlashError> {
    let project = active_project(db, org_id, project_id).await?;
    Ok(repo::record_use(db, &project, slug, run_id).await?)
}

/// What a mirror upsert did, with the project's canonical ids.
pub struct Mirrored {
    pub project: project::Model,
    pub result: Upserted,
}

/// Creates or updates a managed run's mirror with the fields sent; answers its status too.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id, project_id = %project_id, run_id = %run_id))]
pub async fn upsert_run(
    db: &DatabaseConnection,
    org_id: &OrgId,
    project_id: &ProjectId,
    run_id: &str,
    status: &str,
    patch: Map<String, Value>,
) -> Result<(Mirrored, String), FlashError> {
    let project = active_project(db, org_id, project_id).await?;
    let (status, result) = repo::upsert_run(db, &project, run_id, status, patch).await?;
    Ok((Mirrored { project, result }, status))
}

/// Creates or updates a run's checkpoint mirror with the fields sent.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id, project_id = %project_id, run_id = %run_id))]
pub async fn upsert_checkpoint(
    db: &DatabaseConnection,
    org_id: &OrgId,
    project_id: &ProjectId,
    run_id: &str,
    checkpoint_id: &str,
    patch: Map<String, Value>,
) -> Result<Mirrored, FlashError> {
    let project = active_project(db, org_id, project_id).await?;
    let result = repo::upsert_checkpoint(db, &project, run_id, checkpoint_id, patch).await?;
    Ok(Mirrored { project, result })
}

/// Records a product event on `allowlist` for an existing organization.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn record_event(
    db: &impl ConnectionTrait,
    allowlist: &[String],
    org_id: &OrgId,
    event: &str,
    user_id: Option<&str>,
    properties: Option<String>,
) -> Result<(), FlashError> {
    if !allowlist.iter().any(|e| e == event) {
        return Err(FlashError::EventNotAllowed {
            allowed: allowlist.to_vec(),
        });
    }
    if !crate::orgs::repo::org_exists(db, org_id).await? {
        return Err(FlashError::OrgNotFound);
    }
    Ok(repo::record_event(db, org_id, event, user_id, properties).await?)
}
