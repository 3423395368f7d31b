//! The job events keel sends out (`job.succeeded`, `job.failed`, `job.blocked`,
//! `job.user_stopped`, `job.cancelled`), written by the transaction that ends the job (the webhook outbox).

use entities::{training_job, training_job_attempt};
use sea_orm::{ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter};
use serde_json::{json, Value};

use crate::domain::{EventType, JobId, JobStatus};
use crate::webhooks::outbox::{self, Announcement};

/// The event a job's status announces, if it ended.
pub fn event_of(status: JobStatus) -> Option<EventType> {
    match status {
        JobStatus::Succeeded => Some(EventType::JobSucceeded),
        JobStatus::Failed => Some(EventType::JobFailed),
        JobStatus::Blocked => Some(EventType::JobBlocked),
        JobStatus::UserStopped => Some(EventType::JobUserStopped),
        JobStatus::Cancelled => Some(EventType::JobCancelled),
        _ => None,
    }
}

/// A stored JSON text as its value (text that is not JSON as a string).
pub fn parse_stored(text: Option<&str>) -> Option<Value> {
    text.map(|t| serde_json::from_str(t).unwrap_or_else(|_| Value::String(t.to_owned())))
}

/// The job's view, as `GET /api/jobs/{id}` answers it (the web layer's `JobView`; a test
/// there holds the two equal), with its ended attempts oldest first.
pub fn job_data(job: &training_job::Model, history: &[training_job_attempt::Model]) -> Value {
    let history: Vec<Value> = history
        .iter()
        .map(|a| {
            json!({
                "attempt": a.attempt,
                "workerId": a.worker_id,
                "claimedAt": a.claimed_at,
                "endedAt": a.ended_at,
                "outcome": a.outcome.to_string(),
                "error": a.error,
            })
        })
        .collect();
    json!({
        "jobId": job.id.to_string(),
        "orgId": job.org_id.to_string(),
        "projectId": job.project_id.to_string(),
        "trainingTaskId": job.training_task_id,
        "action": job.action.to_string(),
        "status": job.status.to_string(),
        "workerId": job.worker_id,
        "attempts": job.attempts,
        "stopRequested": job.stop_requested,
        "stopReason": job.stop_reason,
        "liveStatus": parse_stored(job.live_status.as_deref()),
        "result": parse_stored(job.result.as_deref()),
        "error": job.error,
        "createdAt": job.created_at,
        "updatedAt": job.updated_at,
        "claimedAt": job.claimed_at,
        "heartbeatAt": job.heartbeat_at,
        "finishedAt": job.finished_at,
        "priority": job.priority,
        "scheduledAt": job.scheduled_at,
        "dataset": parse_stored(job.dataset.as_deref()),
        "scheduleId": job.schedule_id.as_ref().map(|id| id.to_string()),
        "scheduleTick": job.schedule_tick,
        "history": history,
    })
}

/// Announces, within the caller's transaction, each of `job_ids` that has ended (as it is
/// now), to its organization's endpoints subscribed to the event. Costs one query of the
/// jobs and one of their organizations' endpoints when nobody listens.
pub async fn announce_ended(db: &impl ConnectionTrait, job_ids: &[JobId]) -> Result<usize, DbErr> {
    if job_ids.is_empty() {
        return Ok(0);
    }
    let mut ended = Vec::new();
    for chunk in job_ids.chunks(500) {
        ended.extend(
            training_job::Entity::find()
                .filter(training_job::Column::Id.is_in(chunk.iter().cloned()))
                .all(db)
                .await?
                .into_iter()
                .filter(|job| event_of(job.status).is_some()),
        );
    }
    let mut orgs: Vec<_> = ended.iter().map(|job| job.org_id.clone()).collect();
    orgs.sort();
    orgs.dedup();
    let listeners = outbox::listeners(db, &orgs).await?;
    ended
        .retain(|job| event_of(job.status).is_some_and(|event| !listeners.of(&job.org_id, event).is_empty()));
    if ended.is_empty() {
        return Ok(0);
    }
    let ids: Vec<JobId> = ended.iter().map(|job| job.id.clone()).collect();
    let mut histories = super::history::histories(db, &ids).await?;
    let announcements = ended
        .iter()
        .filter_map(|job| {
            Some(Announcement {
                org_id: job.org_id.clone(),
                event_type: event_of(job.status)?,
                data: job_data(job, &histories.remove(&job.id).unwrap_or_default()),
            })
        })
        .collect();
    outbox::announce(db, &listeners, announcements).await
}
