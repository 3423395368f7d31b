//! What users and operators do to a job: stop it, retry it.

use entities::training_job;
use sea_orm::{TransactionSession, TransactionTrait};

use super::*;

pub enum StopOutcome {
    Stopped(training_job::Model),
    AlreadyFinished(training_job::Model),
    NotFound,
}

/// queued or scheduled → user_stopped (announced to the organization's endpoints in the same
/// transaction); running → stopping (the next heartbeat says so); stopping stays.
pub async fn stop_job(
    db: &impl TransactionTrait,
    job_id: &JobId,
    reason: Option<&str>,
) -> Result<StopOutcome, DbErr> {
    let now = Utc::now();
    let txn = db.begin().await?;
    let stopped = transition(JobEvent::StopWaiting)
        .col_expr(training_job::Column::StopRequested, Expr::value(true))
        .col_expr(training_job::Column::Error, Expr::value(reason))
        .col_expr(training_job::Column::StopReason, Expr::value(reason))
        .col_expr(training_job::Column::FinishedAt, Expr::value(now))
        .col_expr(training_job::Column::UpdatedAt, Expr::value(now))
        .filter(training_job::Column::Id.eq(job_id))
        .exec(&txn)
        .await?;
    transition(JobEvent::StopRunning)
        .col_expr(training_job::Column::StopRequested, Expr::value(true))
        .col_expr(training_job::Column::StopReason, Expr::value(reason))
        .col_expr(training_job::Column::UpdatedAt, Expr::value(now))
        .filter(training_job::Column::Id.eq(job_id))
        .exec(&txn)
        .await?;
    if stopped.rows_affected > 0 {
        crate::queue::events::announce_ended(&txn, std::slice::from_ref(job_id)).await?;
    }
    let job = find_job(&txn, job_id).await?;
    txn.commit().await?;
    Ok(match job {
        None => StopOutcome::NotFound,
        Some(job)
            if job.status == JobStatus::Stopping
                || (job.status == JobStatus::UserStopped && job.stop_requested) =>
        {
            StopOutcome::Stopped(job)
        }
        Some(job) => StopOutcome::AlreadyFinished(job),
    })
}

/// Of `job_ids`, the queued and scheduled end now (user_stopped, announced in the same
/// transaction) and the running are asked to stop (stopping), as [`stop_job`] does each; in
/// one transaction. Answers the jobs it changed; the others (ended, already stopping) are
/// left alone.
pub async fn stop_jobs(
    db: &impl TransactionTrait,
    job_ids: &[JobId],
    reason: Option<&str>,
) -> Result<Vec<training_job::Model>, DbErr> {
    if job_ids.is_empty() {
        return Ok(Vec::new());
    }
    let now = Utc::now();
    let txn = db.begin().await?;
    let mut changed = transition(JobEvent::StopWaiting)
        .col_expr(training_job::Column::StopRequested, Expr::value(true))
        .col_expr(training_job::Column::Error, Expr::value(reason))
        .col_expr(training_job::Column::StopReason, Expr::value(reason))
        .col_expr(training_job::Column::FinishedAt, Expr::value(now))
        .col_expr(training_job::Column::UpdatedAt, Expr::value(now))
        .filter(training_job::Column::Id.is_in(job_ids.iter().cloned()))
        .exec_with_returning(&txn)
        .await?;
    let ended: Vec<JobId> = changed.iter().map(|job| job.id.clone()).collect();
    crate::queue::events::announce_ended(&txn, &ended).await?;
    let asked = transition(JobEvent::StopRunning)
        .col_expr(training_job::Column::StopRequested, Expr::value(true))
        .col_expr(training_job::Column::StopReason, Expr::value(reason))
        .col_expr(training_job::Column::UpdatedAt, Expr::value(now))
        .filter(training_job::Column::Id.is_in(job_ids.iter().cloned()))
        .exec_with_returning(&txn)
        .await?;
    txn.commit().await?;
    changed.extend(asked);
    Ok(changed)
}

pub enum RetryOutcome {
    Retried(training_job::Model),
    /// Not failed, blocked or user-stopped: nothing to retry.
    NotRetryable(training_job::Model),
    NotFound,
}

/// failed, blocked or user_stopped → queued, as a new job would be (its attempts keep
/// counting); any other state is left alone.
pub async fn retry_job(db: &impl ConnectionTrait, job_id: &JobId) -> Result<RetryOutcome, DbErr> {
    let retried = retry_jobs(db, std::slice::from_ref(job_id)).await?;
    Ok(match retried.into_iter().next() {
        Some(job) => RetryOutcome::Retried(job),
        None => match find_job(db, job_id).await? {
            Some(job) => RetryOutcome::NotRetryable(job),
            None => RetryOutcome::NotFound,
        },
    })
}

/// Of `job_ids`, the failed, blocked or user-stopped jobs go back to the queue, in one
/// guarded update; answers those it moved (the others are left alone).
pub async fn retry_jobs(
    db: &impl ConnectionTrait,
    job_ids: &[JobId],
) -> Result<Vec<training_job::Model>, DbErr> {
    if job_ids.is_empty() {
        return Ok(Vec::new());
    }
    let now = Utc::now();
    transition(JobEvent::Retry)
        .col_expr(
            training_job::Column::WorkerId,
            Expr::value(Option::<String>::None),
        )
        .col_expr(training_job::Column::StopRequested, Expr::value(false))
        .col_expr(
            training_job::Column::StopReason,
            Expr::value(Option::<String>::None),
        )
        .col_expr(training_job::Column::Result, Expr::value(Option::<String>::None))
        .col_expr(training_job::Column::Error, Expr::value(Option::<String>::None))
        .col_expr(
            training_job::Column::ScheduledAt,
            Expr::value(Option::<DateTime<Utc>>::None),
        )
        .col_expr(
            training_job::Column::HeartbeatAt,
            Expr::value(Option::<DateTime<Utc>>::None),
        )
        .col_expr(
            training_job::Column::FinishedAt,
            Expr::value(Option::<DateTime<Utc>>::None),
        )
        .col_expr(training_job::Column::BlockedForFunds, Expr::value(false))
        .col_expr(training_job::Column::QueuedAt, Expr::value(now))
        .col_expr(training_job::Column::UpdatedAt, Expr::value(now))
        .filter(training_job::Column::Id.is_in(job_ids.iter().cloned()))
        .exec_with_returning(db)
        .await
}
