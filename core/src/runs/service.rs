//! Run flows: create, update and link runs of the caller's organizations; record and read
//! checkpoints; read linked runs from the experiment tracker.
//!
//! Tracker API used: `GET <tracker>/api/runs/{entity}/{project}/{trackerRunId}` with
//! `Authorization: Bearer <tracker.api_key>`, answering the run as a JSON object. Each run
//! is read on its own with a timeout; a failing read is reported in that run's entry and
//! never fails the answer. Only runs linked in the caller's organizations are read, so the
//! tracker key cannot be used to browse other projects.

use std::collections::HashSet;
use std::time::Duration;

use entities::run;
use futures_util::{stream, StreamExt};
use sea_orm::ConnectionTrait;
use serde_json::Value;

use super::{repo, Checkpoint, NewRun, RunChanges, RunError, TrackerEntry, TrackerLink, TrackerStatus};
use crate::config::TrackerSettings;
use crate::domain::{OrgId, ProjectId, RunId};
use crate::peer::PeerError;

/// Tracker reads in flight at once for one request.
const READ_CONCURRENCY: usize = 16;

/// Creates a run in a project of one of `orgs`.
#[tracing::instrument(level = "debug", skip_all)]
pub async fn create_run(
    db: &impl ConnectionTrait,
    orgs: &[OrgId],
    new: &NewRun,
) -> Result<run::Model, RunError> {
    let project = crate::projects::repo::find_in_orgs(db, &new.project_id, orgs)
        .await?
        .ok_or(RunError::ProjectNotFound)?;
    Ok(repo::insert_run(db, &project, new).await?)
}

/// A run of one of `orgs`.
pub async fn run_of(
    db: &impl ConnectionTrait,
    orgs: &[OrgId],
    run_id: &RunId,
) -> Result<run::Model, RunError> {
    repo::find_run(db, run_id, orgs)
        .await?
        .ok_or(RunError::RunNotFound)
}

/// Applies `changes` to a run of one of `orgs`.
#[tracing::instrument(level = "debug", skip_all, fields(run_id = %run_id))]
pub async fn update_run(
    db: &impl ConnectionTrait,
    orgs: &[OrgId],
    run_id: &RunId,
    changes: RunChanges,
) -> Result<run::Model, RunError> {
    let run = run_of(db, orgs, run_id).await?;
    Ok(repo::update_run(db, run, changes).await?)
}

/// Links a run of one of `orgs` to the tracker; answers the run's id.
#[tracing::instrument(level = "debug", skip_all, fields(run_id = %run_id))]
pub async fn link_tracker(
    db: &impl ConnectionTrait,
    orgs: &[OrgId],
    run_id: &RunId,
    link: &TrackerLink,
) -> Result<RunId, RunError> {
    let run = run_of(db, orgs, run_id).await?;
    repo::link_tracker(db, &run.id, link).await?;
    Ok(run.id)
}

/// The project, which must be `org_id`'s: its canonical `(organization, project)` ids.
async fn project_of_org(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    project_id: &ProjectId,
) -> Result<(OrgId, ProjectId), RunError> {
    let project = crate::projects::repo::find_in_org(db, org_id, project_id)
        .await?
        .ok_or(RunError::ProjectNotFound)?;
    Ok((project.org_id, project.id))
}

/// Upserts a run's checkpoints by step; answers the distinct steps written and the
/// checkpoints the run has now.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id, project_id = %project_id, run_id = %run_id))]
pub async fn record_checkpoints(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    project_id: &ProjectId,
    run_id: &RunId,
    checkpoints: &[Checkpoint],
) -> Result<(usize, u64), RunError> {
    let (org_id, project_id) = project_of_org(db, org_id, project_id).await?;
    let upserted = repo::upsert_checkpoints(db, &org_id, &project_id, run_id, checkpoints).await?;
    let total = repo::count_checkpoints(db, &org_id, &project_id, run_id).await?;
    Ok((upserted, total))
}

/// A run's checkpoints, by step.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id, project_id = %project_id, run_id = %run_id))]
pub async fn checkpoints(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    project_id: &ProjectId,
    run_id: &RunId,
) -> Result<Vec<Checkpoint>, RunError> {
    let (org_id, project_id) = project_of_org(db, org_id, project_id).await?;
    Ok(repo::list_checkpoints(db, &org_id, &project_id, run_id).await?)
}

/// The tracker's view of the asked runs of `entity/project` linked in `orgs`, one entry per
/// distinct asked id in the order asked; the stored links when no tracker is configured.
#[tracing::instrument(level = "debug", skip_all)]
pub async fn read_tracker(
    db: &impl ConnectionTrait,
    http: &reqwest::Client,
    settings: &TrackerSettings,
    orgs: &[OrgId],
    entity: &str,
    project: &str,
    asked: Vec<String>,
) -> Result<Vec<TrackerEntry>, RunError> {
    let linked = repo::linked_runs(db, orgs, entity, project).await?;
    let mut seen = HashSet::new();
    let asked: Vec<String> = asked.into_iter().filter(|id| seen.insert(id.clone())).collect();
    let base = settings.url.trim_end_matches('/');
    let timeout = Duration::from_millis(settings.timeout_ms);
    let runs = stream::iter(asked)
        .map(|asked_id| {
            let link = linked
                .iter()
                .find(|r| r.tracker_run_id.as_deref() == Some(&asked_id))
                .or_else(|| linked.iter().find(|r| r.id == asked_id));
            async move {
                let mut entry = TrackerEntry {
                    run_id: asked_id,
                    status: TrackerStatus::NotLinked,
                    keel_run_id: None,
                    project_id: None,
                    tracker_run_id: None,
                    url: None,
                    run: None,
                    error: None,
                };
                let Some(link) = link else {
                    return entry;
                };
                let tracker_run_id = link.tracker_run_id.clone().unwrap_or_default();
                entry.keel_run_id = Some(link.id.clone());
                entry.project_id = Some(link.project_id.clone());
                entry.url = link.tracker_url.clone();
                entry.tracker_run_id = Some(tracker_run_id.clone());
                if base.is_empty() {
                    entry.status = TrackerStatus::Linked;
                    return entry;
                }
                match read_run(
                    http,
                    base,
                    &settings.api_key,
                    timeout,
                    entity,
                    project,
                    &tracker_run_id,
                )
                .await
                {
                    Ok(run) => {
                        entry.status = TrackerStatus::Ok;
                        entry.run = Some(run);
                    }
                    Err(error) => {
                        entry.status = TrackerStatus::Error;
                        entry.error = Some(error.to_string());
                    }
                }
                entry
            }
        })
        .buffered(READ_CONCURRENCY)
        .collect()
        .await;
    Ok(runs)
}

async fn read_run(
    http: &reqwest::Client,
    base: &str,
    api_key: &str,
    timeout: Duration,
    entity: &str,
    project: &str,
    run_id: &str,
) -> Result<Value, PeerError> {
    const TRACKER: &str = "the tracker";
    let mut url = reqwest::Url::parse(base).map_err(|_| PeerError::BadUrl { peer: TRACKER })?;
    url.path_segments_mut()
        .map_err(|()| PeerError::BadUrl { peer: TRACKER })?
        .pop_if_empty()
        .extend(["api", "runs", entity, project, run_id]);
    let mut request = http.get(url).timeout(timeout);
    if !api_key.is_empty() {
        request = request.bearer_auth(api_key);
    }
    let response = request.send().await.map_err(|e| PeerError::call(TRACKER, e))?;
    let status = response.status();
    if !status.is_success() {
        return Err(PeerError::Status {
            peer: TRACKER,
            status,
        });
    }
    response
        .json::<Value>()
        .await
        .map_err(|source| PeerError::NotJson {
            peer: TRACKER,
            source,
        })
}

/// The organization's runs, newest first, older than `before` `(created_at, id)`, at most
/// `limit`, of one project when named.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn runs_of_org(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    project_id: Option<&str>,
    before: Option<&(chrono::DateTime<chrono::Utc>, String)>,
    limit: u64,
) -> Result<Vec<run::Model>, RunError> {
    Ok(repo::runs_of_org(db, org_id, project_id, before, limit).await?)
}

/// How many runs the organization has (of one project, if given).
pub async fn count_of_org(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    project_id: Option<&str>,
) -> Result<u64, RunError> {
    Ok(repo::count_of_org(db, org_id, project_id).await?)
}

/// The checkpoints of the organization's runs `run_ids`.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn checkpoints_of_runs(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    run_ids: &[RunId],
) -> Result<Vec<entities::run_checkpoint::Model>, RunError> {
    Ok(repo::checkpoints_of_runs(db, org_id, run_ids).await?)
}
