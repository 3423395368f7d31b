//! The queue's domain events as log lines (target `keel_event`, field `event`): one INFO
//! line each, with its ids; WARN where an operator should look (retries exhausted).

use entities::training_job;

use super::repo::{EndedAttempt, Report};
use crate::domain::{AttemptOutcome, JobAction, JobStatus, OrgId};

/// One line for each of `jobs`: the event, the job's ids, action and attempt, and the worker
/// when one is involved.
fn each_job(
    event: &'static str,
    message: &'static str,
    jobs: &[training_job::Model],
    worker_id: Option<&str>,
) {
    for job in jobs {
        tracing::info!(
            target: "keel_event",
            event,
            org_id = %job.org_id,
            job_id = %job.id,
            project_id = %job.project_id,
            worker_id,
            action = %job.action,
            attempt = job.attempts,
            "{message}"
        );
    }
}

/// One line for each ended attempt: the event, its job's ids, worker, action and attempt, and
/// its outcome.
fn each_attempt(event: &'static str, message: &'static str, ended: &[&EndedAttempt]) {
    for attempt in ended {
        let row = &attempt.row;
        tracing::info!(
            target: "keel_event",
            event,
            org_id = %attempt.org_id,
            job_id = %row.job_id,
            worker_id = row.worker_id.as_deref(),
            action = %attempt.action,
            attempt = row.attempt,
            outcome = %row.outcome,
            "{message}"
        );
    }
}

/// Jobs created: one line a job, or one a batch's organization (with the count).
pub(super) fn created(jobs: &[training_job::Model], batch: bool) {
    if !batch {
        return each_job("job.created", "job created", jobs, None);
    }
    let mut by_org: std::collections::BTreeMap<&OrgId, usize> = Default::default();
    for job in jobs {
        *by_org.entry(&job.org_id).or_default() += 1;
    }
    for (org_id, count) in by_org {
        tracing::info!(target: "keel_event", event = "jobs.created", org_id = %org_id, count, "jobs created (batch)");
    }
}

/// Jobs handed to a worker (their run fee paid).
pub(super) fn claimed(worker_id: &str, jobs: &[training_job::Model]) {
    each_job("job.claimed", "job claimed", jobs, Some(worker_id));
}

/// Attempts that ended by a worker's report: the job ended (its outcome) or, for a
/// retryable failure with attempts left, retried; a retryable failure without attempts
/// left is a warning.
pub(super) fn reported(reports: &[Report], ended: &[EndedAttempt]) {
    let retryable: std::collections::HashSet<&str> = reports
        .iter()
        .filter(|r| r.retryable && r.status == JobStatus::Failed)
        .map(|r| r.job_id.as_str())
        .collect();
    for attempt in ended {
        let row = &attempt.row;
        match row.outcome {
            AttemptOutcome::Retried => {
                each_attempt("job.retried", "job failed, retried after its backoff", &[attempt])
            }
            AttemptOutcome::Failed if retryable.contains(row.job_id.as_str()) => tracing::warn!(
                target: "keel_event",
                event = "job.retries_exhausted",
                org_id = %attempt.org_id,
                job_id = %row.job_id,
                worker_id = row.worker_id.as_deref(),
                action = %attempt.action,
                attempt = row.attempt,
                "job failed with no attempts left: it stays failed"
            ),
            _ => each_attempt("job.ended", "job ended", &[attempt]),
        }
    }
}

/// Attempts the stale sweep ended (requeued, failed or stopped), or that a restarted
/// worker handed back.
pub(super) fn swept(event: &'static str, ended: &[EndedAttempt]) {
    let ended: Vec<&EndedAttempt> = ended.iter().collect();
    each_attempt(event, "job's attempt ended without a report", &ended);
}

/// Jobs put back in the queue by hand.
pub(super) fn retried_by_hand(jobs: &[training_job::Model]) {
    each_job("job.retried", "job retried by hand", jobs, None);
}

/// An organization's jobs blocked for funds queued again at its credit.
pub(super) fn requeued_on_credit(jobs: &[training_job::Model]) {
    each_job(
        "job.requeued_on_credit",
        "job blocked for funds queued again at the organization's credit",
        jobs,
        None,
    );
}

/// Claimed jobs blocked because their organization could not pay the run fee.
pub(super) fn blocked_for_funds(worker_id: &str, jobs: &[training_job::Model]) {
    each_job(
        "job.blocked_for_funds",
        "job blocked: its organization cannot pay the run fee",
        jobs,
        Some(worker_id),
    );
}

/// Jobs of pipelines settled by their dependencies: queued or scheduled once all succeeded
/// (`job.dependencies_met`), cancelled by one that ended without success (`job.cancelled`,
/// WARN: a pipeline stopped short, its `error` names the dependency), waiting again after
/// that one was retried (`job.waiting_again`).
pub(super) fn settled(jobs: &[training_job::Model]) {
    for job in jobs {
        match job.status {
            JobStatus::Cancelled => tracing::warn!(
                target: "keel_event",
                event = "job.cancelled",
                org_id = %job.org_id,
                job_id = %job.id,
                project_id = %job.project_id,
                action = %job.action,
                error = job.error.as_deref(),
                "job cancelled: a job it depends on ended without success"
            ),
            JobStatus::Waiting => each_job(
                "job.waiting_again",
                "job waits again: the dependency that cancelled it was retried",
                std::slice::from_ref(job),
                None,
            ),
            _ => each_job(
                "job.dependencies_met",
                "job's dependencies all succeeded: it is queued",
                std::slice::from_ref(job),
                None,
            ),
        }
    }
}

/// An action's queue paused or resumed.
pub(super) fn paused(action: JobAction, paused: bool) {
    match paused {
        true => {
            tracing::info!(target: "keel_event", event = "queue.paused", action = %action, "queue paused")
        }
        false => {
            tracing::info!(target: "keel_event", event = "queue.resumed", action = %action, "queue resumed")
        }
    }
}
