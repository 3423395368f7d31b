//! Operator pages (internal key): the queue across organizations and the trace writer.

use std::collections::BTreeMap;

use actix_web::{web, HttpRequest, HttpResponse};

use super::pages::{CountRow, HeldJob, HeldRow, Layout, OrgShareRow, QueuePage, WriterPage};
use super::session::Viewer;
use super::signin::CsrfForm;
use super::{after_form, format, page, ConsoleError, Flash};
use crate::domain::{JobAction, JobStatus};

fn operator_only(viewer: &Viewer) -> Result<(), ConsoleError> {
    match viewer.is_operator() {
        true => Ok(()),
        false => Err(ConsoleError::NotFound),
    }
}

const STATUSES: [JobStatus; 8] = [
    JobStatus::Queued,
    JobStatus::Scheduled,
    JobStatus::Running,
    JobStatus::Stopping,
    JobStatus::Succeeded,
    JobStatus::Blocked,
    JobStatus::UserStopped,
    JobStatus::Failed,
];

fn held_job(job: &entities::training_job::Model, now: chrono::DateTime<chrono::Utc>, stale: bool) -> HeldJob {
    HeldJob {
        id: job.id.to_string(),
        org_id: job.org_id.to_string(),
        action: job.action.to_string(),
        status: job.status.to_string(),
        heartbeat: match job.heartbeat_at.or(job.claimed_at) {
            Some(at) => format!("{} ago", format::age(now - at)),
            None => "—".into(),
        },
        stale,
    }
}

pub async fn queue(req: HttpRequest, viewer: Viewer) -> Result<HttpResponse, ConsoleError> {
    operator_only(&viewer)?;
    let overview = crate::queue::service::queue_overview(&viewer.state.jobs).await?;
    let paused: Vec<JobAction> = crate::queue::service::action_queues(&viewer.state.jobs)
        .await?
        .into_iter()
        .filter(|q| q.paused)
        .map(|q| q.action)
        .collect();
    let shares = crate::queue::service::org_shares(&viewer.state.jobs)
        .await?
        .into_iter()
        .map(|(share, queued)| OrgShareRow {
            org_id: share.org_id.to_string(),
            weight: share.weight,
            queued,
            running: share.running,
            cap: match (share.effective_max_running, share.max_running) {
                (0, _) => "none".into(),
                (cap, None) => format!("{cap} (default)"),
                (cap, Some(_)) => cap.to_string(),
            },
            at_cap: share.effective_max_running > 0 && share.running >= share.effective_max_running,
        })
        .collect();
    let now = chrono::Utc::now();
    let counts = JobAction::NAMES
        .iter()
        .map(|action| CountRow {
            action: (*action).to_owned(),
            paused: paused.iter().any(|p| p.as_str() == *action),
            counts: STATUSES
                .iter()
                .map(|s| {
                    overview
                        .counts
                        .iter()
                        .filter(|(a, st, _)| a == action && st == s.as_str())
                        .map(|(_, _, n)| *n)
                        .sum()
                })
                .collect(),
            oldest: overview
                .oldest_queued
                .iter()
                .find(|(a, _)| a == action)
                .map(|(_, age)| format::age(*age))
                .unwrap_or_else(|| "—".into()),
        })
        .collect();
    let stale_ids: Vec<&str> = overview.stale.iter().map(|j| j.id.as_str()).collect();
    let mut by_worker: BTreeMap<String, Vec<HeldJob>> = BTreeMap::new();
    for job in &overview.held {
        by_worker
            .entry(job.worker_id.clone().unwrap_or_else(|| "(none)".into()))
            .or_default()
            .push(held_job(job, now, stale_ids.contains(&job.id.as_str())));
    }
    Ok(page(
        &req,
        &QueuePage {
            l: Layout::new("Queue", &viewer, "queue", Flash::read(&req)),
            statuses: STATUSES.iter().map(|s| s.as_str()).collect(),
            counts,
            shares,
            held: by_worker
                .into_iter()
                .map(|(worker, jobs)| HeldRow { worker, jobs })
                .collect(),
            stale: overview.stale.iter().map(|j| held_job(j, now, true)).collect(),
            stale_after: format::age(overview.stale_after),
        },
    ))
}

/// The same sweep as `POST /api/training/internal/jobs/requeue-stale`.
pub async fn requeue_stale(viewer: Viewer, form: web::Form<CsrfForm>) -> Result<HttpResponse, ConsoleError> {
    viewer.check_csrf(form.csrf())?;
    operator_only(&viewer)?;
    let outcome = crate::queue::service::requeue_stale(&viewer.state.jobs).await;
    after_form("/console/operator/queue", outcome, |c| {
        format!(
            "Stale sweep: {} requeued, {} failed, {} stopped.",
            c.requeued, c.failed, c.stopped
        )
    })
}

/// Pauses an action's queue, as `POST /api/internal/queue/{action}/pause` does.
pub async fn pause(
    viewer: Viewer,
    path: web::Path<String>,
    form: web::Form<CsrfForm>,
) -> Result<HttpResponse, ConsoleError> {
    set_paused(viewer, &path, &form, true).await
}

/// Resumes an action's queue, as `POST /api/internal/queue/{action}/resume` does.
pub async fn resume(
    viewer: Viewer,
    path: web::Path<String>,
    form: web::Form<CsrfForm>,
) -> Result<HttpResponse, ConsoleError> {
    set_paused(viewer, &path, &form, false).await
}

async fn set_paused(
    viewer: Viewer,
    action: &str,
    form: &CsrfForm,
    paused: bool,
) -> Result<HttpResponse, ConsoleError> {
    viewer.check_csrf(form.csrf())?;
    operator_only(&viewer)?;
    let action = JobAction::parse(action).ok_or(ConsoleError::NotFound)?;
    let jobs = &viewer.state.jobs;
    let outcome = match paused {
        true => crate::queue::service::pause(jobs, action).await,
        false => crate::queue::service::resume(jobs, action).await,
    };
    after_form("/console/operator/queue", outcome, |q| match q.paused {
        true => format!("{}: paused; its jobs are not claimed until resumed.", q.action),
        false => format!("{}: resumed.", q.action),
    })
}

pub async fn writer(req: HttpRequest, viewer: Viewer) -> Result<HttpResponse, ConsoleError> {
    operator_only(&viewer)?;
    let traces = &viewer.state.traces;
    let m = &traces.metrics;
    let figures = vec![
        ("Recorded (handed to the writer)", m.recorded.get().to_string()),
        ("Written", m.written.get().to_string()),
        ("Batches committed", m.batches.get().to_string()),
        ("Dropped (queue full)", m.dropped.get().to_string()),
        (
            "Refused (project or organization gone)",
            m.refused.get().to_string(),
        ),
        ("Failed after retries", m.write_failures.get().to_string()),
        ("Queue depth now", traces.queue_depth().to_string()),
    ];
    Ok(page(
        &req,
        &WriterPage {
            l: Layout::new("Trace writer", &viewer, "writer", Flash::read(&req)),
            figures,
        },
    ))
}
