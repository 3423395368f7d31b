//! Queue flows shared by the JSON API and the console.

use std::collections::BTreeMap;

use entities::training_job;

use super::actor::{ask, Claim, RequeueStale};
use super::repo::{self, SecretChange, StopOutcome, SweepCounts};
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// Sets (or, with an empty value, deletes) training secrets: every value is sealed first,
/// then all are written in one transaction. Answers every name the organization has.
pub async fn set_secrets(
    state: &AppState,
    org_id: &str,
    secrets: BTreeMap<String, String>,
) -> ApiResult<Vec<String>> {
    let Some(secret_box) = &state.secret_box else {
        return Err(ApiError::Unavailable(
            "secrets need secrets.encryption_key or KEEL_SESSION_SECRET to be configured".into(),
        ));
    };
    let changes = secrets
        .into_iter()
        .map(|(name, value)| {
            let sealed = match value.is_empty() {
                true => None,
                false => Some(secret_box.seal(org_id, &name, &value)?),
            };
            Ok(SecretChange { name, sealed })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(repo::apply_secret_changes(&state.db, org_id, changes).await?)
}

/// The organization's secrets, opened, for the worker that runs one of its jobs. A secret
/// that cannot be opened (the key changed) is left out and logged.
pub async fn worker_secrets(state: &AppState, org_id: &str) -> ApiResult<BTreeMap<String, String>> {
    let mut secrets = BTreeMap::new();
    let Some(secret_box) = &state.secret_box else {
        return Ok(secrets);
    };
    for row in repo::sealed_secrets(&state.db, org_id).await? {
        match secret_box.open(&row.org_id, &row.name, &row.sealed) {
            Ok(value) => {
                secrets.insert(row.name, value);
            }
            Err(err) => {
                tracing::error!(org_id = %row.org_id, name = %row.name, error = %err, "secret unreadable")
            }
        }
    }
    Ok(secrets)
}

/// Stops a job (queued → user_stopped, running → stopping); 409 once it has ended.
pub async fn stop_job(
    state: &AppState,
    job: &training_job::Model,
    reason: Option<&str>,
) -> ApiResult<training_job::Model> {
    match repo::stop_job(&state.db, &job.id, reason).await? {
        StopOutcome::Stopped(job) => Ok(job),
        StopOutcome::AlreadyFinished(job) => Err(ApiError::Conflict(format!(
            "the job already ended ({})",
            job.status
        ))),
        StopOutcome::NotFound => Err(ApiError::not_found("job")),
    }
}

/// Requeues (or ends) jobs whose worker stopped sending heartbeats, through the queue actor.
pub async fn requeue_stale(state: &AppState) -> ApiResult<SweepCounts> {
    Ok(ask(&state.queue, RequeueStale).await?)
}

/// A restarted worker's running and stopping jobs go back to the queue; waiting claims
/// look again.
pub async fn requeue_interrupted(state: &AppState, worker_id: &str) -> ApiResult<u64> {
    let requeued = repo::requeue_interrupted(&state.db, worker_id).await?;
    state
        .metrics
        .requeued
        .with_label_values(&["interrupted"])
        .inc_by(requeued);
    if requeued > 0 {
        state
            .cluster
            .publish(crate::cluster::Event::JobsQueued(
                crate::cluster::ANY_ACTION.into(),
            ))
            .await;
    }
    Ok(requeued)
}

/// Claims up to `limit` jobs of `action` for `worker_id` (each billed its run fee once).
/// With `wait`, a claim that finds none waits until jobs of that action are queued or
/// requeued on any instance, the wait ends, or the process begins to shut down; it then
/// answers what it finds (nothing on timeout).
pub async fn claim(
    state: &AppState,
    worker_id: String,
    action: crate::domain::JobAction,
    limit: u32,
    wait: Option<std::time::Duration>,
    wanted: super::actor::StillWanted,
) -> ApiResult<Vec<training_job::Model>> {
    let deadline = wait.map(|w| tokio::time::Instant::now() + w);
    let signal = state.cluster.jobs_signal(action.as_str());
    let stopping = state.cluster.stopping().clone();
    loop {
        // Registered before looking, so a job queued meanwhile still wakes this claim.
        let woken = signal.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        if !wanted() {
            return Ok(Vec::new());
        }
        let claim = Claim {
            worker_id: worker_id.clone(),
            action,
            limit,
            wanted: wanted.clone(),
        };
        let jobs = ask(&state.queue, claim).await?;
        let Some(deadline) = deadline.filter(|_| jobs.is_empty()) else {
            return Ok(jobs);
        };
        // A claimant that leaves while waiting is noticed within a second.
        let left = async {
            loop {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                if !wanted() {
                    break;
                }
            }
        };
        tokio::select! {
            _ = &mut woken => {}
            _ = tokio::time::sleep_until(deadline) => return Ok(jobs),
            _ = stopping.cancelled() => return Ok(jobs),
            _ = left => return Ok(jobs),
        }
    }
}

/// The queue as an operator sees it.
pub struct QueueOverview {
    /// `(action, status, jobs)`.
    pub counts: Vec<(String, String, i64)>,
    /// The oldest queued job's age per action.
    pub oldest_queued: Vec<(String, chrono::Duration)>,
    /// Held jobs (running or stopping), by worker.
    pub held: Vec<training_job::Model>,
    /// Held jobs whose last sign of life is older than the stale threshold.
    pub stale: Vec<training_job::Model>,
    pub stale_after: chrono::Duration,
}

/// How many held jobs the overview lists.
const HELD_SHOWN: u64 = 500;

pub async fn queue_overview(state: &AppState) -> ApiResult<QueueOverview> {
    let now = chrono::Utc::now();
    let stale_after = chrono::Duration::seconds(state.settings.queue.stale_after_secs as i64);
    let counts = repo::counts_by_action_status(&state.db).await?;
    let oldest_queued = repo::oldest_queued(&state.db)
        .await?
        .into_iter()
        .map(|(action, at)| (action, now - at))
        .collect();
    let held = repo::held_jobs(&state.db, HELD_SHOWN).await?;
    let stale = held
        .iter()
        .filter(|job| {
            job.heartbeat_at
                .or(job.claimed_at)
                .is_some_and(|seen| now - seen > stale_after)
        })
        .cloned()
        .collect();
    Ok(QueueOverview {
        counts,
        oldest_queued,
        held,
        stale,
        stale_after,
    })
}

/// The organization's job (another organization's is "not found").
pub async fn job_of_org(state: &AppState, org_id: &str, job_id: &str) -> ApiResult<training_job::Model> {
    repo::find_job(&state.db, job_id)
        .await?
        .filter(|job| job.org_id == org_id)
        .ok_or_else(|| ApiError::not_found("job"))
}

/// A page of the organization's jobs, newest first, and whether more follow.
pub async fn jobs_page(
    state: &AppState,
    org_id: &crate::domain::OrgId,
    filter: &repo::JobFilter,
    limit: u64,
) -> ApiResult<(Vec<training_job::Model>, bool)> {
    let mut jobs = repo::list_jobs(&state.db, std::slice::from_ref(org_id), filter, limit + 1).await?;
    let more = jobs.len() as u64 > limit;
    jobs.truncate(limit as usize);
    Ok((jobs, more))
}
