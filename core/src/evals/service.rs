//! Eval flows.

use sea_orm::DatabaseConnection;

use super::{derive, repo, Derived, EvalError, EvalUpload};
use crate::domain::OrgId;

/// Stores an uploaded run for a project of one of `orgs`; answers its id and what was
/// derived from its cases.
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
