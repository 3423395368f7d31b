//! Eval flows.

use sea_orm::DatabaseConnection;

use super::{derive, repo, Derived, EvalError, EvalUpload};
use crate::domain::OrgId;

/// Stores an uploaded run for a project of one of `orgs`; answers its id and what was
/// derived from its cases.
#[tracing::instrument(level = "debug", skip_all)]
pub async fn upload_run(
    db: &DatabaseConnection,
    orgs: &[OrgId],
    upload: &EvalUpload,
) -> Result<(String, Derived), EvalError> {
    let project = crate::projects::repo::find_in_orgs(db, &upload.project_id, orgs)
        .await?
        .ok_or(EvalError::ProjectNotFound)?;
    let derived = derive(&upload.cases);
    let id = uuid::Uuid::new_v4().to_string();
    repo::insert_run(db, &id, &project, upload, derived).await?;
    Ok((id, derived))
}

/// The organization's eval runs, newest first, older than `before` `(created_at, id)`, at
/// most `limit`, of one project when named.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn runs_of_org(
    db: &DatabaseConnection,
    org_id: &OrgId,
    project_id: Option<&str>,
    before: Option<&(chrono::DateTime<chrono::Utc>, String)>,
    limit: u64,
) -> Result<Vec<entities::eval_run::Model>, EvalError> {
    Ok(repo::runs_of_org(db, org_id, project_id, before, limit).await?)
}

/// How many eval runs the organization has (of one project, if given).
pub async fn count_of_org(
    db: &DatabaseConnection,
    org_id: &OrgId,
    project_id: Option<&str>,
) -> Result<u64, EvalError> {
    Ok(repo::count_of_org(db, org_id, project_id).await?)
}

/// The organization's eval run; `None` for another organization's or none.
pub async fn run_of_org(
    db: &DatabaseConnection,
    org_id: &OrgId,
    run_id: &str,
) -> Result<Option<entities::eval_run::Model>, EvalError> {
    Ok(repo::find_run(db, org_id, run_id).await?)
}

/// A run's cases in upload order, from `after` (a position), at most `limit`.
#[tracing::instrument(level = "debug", skip_all, fields(run_id = %run_id))]
pub async fn cases(
    db: &DatabaseConnection,
    run_id: &str,
    filter: super::CaseFilter,
    after: Option<i32>,
    limit: u64,
) -> Result<Vec<entities::eval_case::Model>, EvalError> {
    Ok(repo::cases(db, run_id, filter, after, limit).await?)
}
