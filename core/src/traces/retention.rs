//! A project's trace retention: a sweep on every instance deletes each such project's traces
//! older than its `traceRetentionDays`, 1,000 at a time (each batch its own statement, so no
//! lock is held long and two instances sweeping at once only share the work).

use std::time::Duration;

use chrono::Utc;
use sea_orm::{DatabaseConnection, DbErr};
use tokio_util::sync::CancellationToken;

use super::repo;

/// Traces deleted by one statement.
pub const BATCH: u64 = 1_000;

/// One pass: every retained project's old traces; answers how many were deleted.
pub async fn sweep(db: &DatabaseConnection, expired: &prometheus::IntCounter) -> Result<u64, DbErr> {
    let mut deleted = 0;
    for (project_id, days) in repo::retained_projects(db).await? {
        let before = Utc::now() - chrono::Duration::days(i64::from(days));
        let mut of_project = 0;
        loop {
            let gone = repo::delete_older(db, &project_id, before, BATCH).await?;
            of_project += gone;
            expired.inc_by(gone);
            if gone < BATCH {
                break;
            }
            // Room for the writers between batches.
            tokio::task::yield_now().await;
        }
        if of_project > 0 {
            tracing::info!(
                target: "keel_event",
                event = "traces.retention_deleted",
                project_id = %project_id,
                retention_days = days,
                deleted = of_project,
                "trace retention deleted a project's old traces"
            );
        }
        deleted += of_project;
    }
    Ok(deleted)
}

/// How many of a project's traces (of one of `orgs`) a retention of `days` would delete at its
/// next sweep.
pub async fn traces_past_retention(
    db: &impl sea_orm::ConnectionTrait,
    orgs: &[crate::domain::OrgId],
    project_id: &crate::domain::ProjectId,
    days: i32,
) -> Result<u64, super::TraceError> {
    crate::projects::repo::find_in_orgs(db, project_id, orgs)
        .await?
        .ok_or(super::TraceError::ProjectNotFound)?;
    let before = Utc::now() - chrono::Duration::days(i64::from(days));
    Ok(repo::count_older(db, project_id, before).await?)
}

/// Sweeps every `every` until `stop`.
pub async fn run(
    db: DatabaseConnection,
    every: Duration,
    expired: prometheus::IntCounter,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(every) => {
                match sweep(&db, &expired).await {
                    Ok(0) => {}
                    Ok(deleted) => tracing::info!(deleted, "trace retention: old traces deleted"),
                    Err(err) => tracing::warn!(error = %err, "trace retention sweep failed; it runs again"),
                }
            }
        }
    }
}
