//! Project flows shared by the JSON API and the console.

use entities::project;
use sea_orm::ConnectionTrait;

use super::repo;
use super::ProjectError;
use crate::domain::{OrgId, ProjectId};
use crate::orgs::repo::{derived_slug, is_unique_violation, with_suffix};

/// Creates a project. An explicit slug already taken in the organization is 409; a slug
/// derived from the name gets a short random suffix instead.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn create_project(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    name: &str,
    slug: Option<&str>,
    description: Option<&str>,
) -> Result<project::Model, ProjectError> {
    let base = slug.map_or_else(|| derived_slug(name, "project"), str::to_owned);
    for attempt in 0..5 {
        let candidate = if attempt == 0 {
            base.clone()
        } else {
            with_suffix(&base)
        };
        match repo::insert(db, org_id, name, &candidate, description).await {
            Ok(project) => return Ok(project),
            Err(err) if is_unique_violation(&err) && slug.is_none() => continue,
            Err(err) if is_unique_violation(&err) => return Err(ProjectError::SlugTaken(candidate)),
            Err(err) => return Err(err.into()),
        }
    }
    Err(ProjectError::NoFreeSlug)
}

/// The projects of `orgs`, oldest first (the console's names for the ids it shows).
#[tracing::instrument(level = "debug", skip_all)]
pub async fn projects_in(
    db: &impl ConnectionTrait,
    orgs: &[OrgId],
) -> Result<Vec<project::Model>, sea_orm::DbErr> {
    repo::list_for_orgs(db, orgs).await
}

/// A project of one of `orgs`; another organization's is not found.
#[tracing::instrument(level = "debug", skip_all, fields(project_id = %project_id))]
pub async fn project_of(
    db: &impl ConnectionTrait,
    orgs: &[OrgId],
    project_id: &ProjectId,
) -> Result<project::Model, ProjectError> {
    repo::find_in_orgs(db, project_id, orgs)
        .await?
        .ok_or(ProjectError::NotFound)
}

/// The organization a project belongs to, whichever it is (the proxy's look-up, which it
/// caches; the caller decides what another organization's project means).
#[tracing::instrument(level = "debug", skip_all, fields(project_id = %project_id))]
pub async fn owner_of(
    db: &impl ConnectionTrait,
    project_id: &ProjectId,
) -> Result<Option<OrgId>, sea_orm::DbErr> {
    Ok(repo::find(db, project_id).await?.map(|project| project.org_id))
}
