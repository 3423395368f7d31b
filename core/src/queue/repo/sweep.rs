//! The periodic work: scheduled jobs queued when due, held jobs without a sign of life
//! requeued (or ended), a restarted worker's jobs handed back.

use entities::training_job;
use sea_orm::{EntityTrait, QueryOrder, QuerySelect, TransactionSession, TransactionTrait};

use super::report::{record_attempts, EndedAttempt};
use super::*;
use crate::domain::AttemptOutcome;

/// Queues every scheduled job due by `now`; answers the actions of the jobs it queued.
pub async fn promote_due(db: &impl ConnectionTrait, now: DateTime<Utc>) -> Result<Vec<JobAction>, DbErr> {
    let promoted = transition(JobEvent::Promote)
        .col_expr(training_job::Column::QueuedAt, Expr::value(now))
        .col_expr(training_job::Column::UpdatedAt, Expr::value(now))
        .filter(training_job::Column::ScheduledAt.lte(now))
        .exec_with_returning(db)
        .await?;
    let mut actions: Vec<JobAction> = promoted.into_iter().map(|job| job.action).collect();
    actions.sort_by_key(|a| a.as_str());
    actions.dedup();
    Ok(actions)
}

/// When the next scheduled job is due, if any is.
pub async fn next_due(db: &impl ConnectionTrait) -> Result<Option<DateTime<Utc>>, DbErr> {
    training_job::Entity::find()
        .select_only()
        .column(training_job::Column::ScheduledAt)
        .filter(guard(JobEvent::Promote))
        .order_by_asc(training_job::Column::ScheduledAt)
        .limit(1)
        .into_tuple::<Option<DateTime<Utc>>>()
        .one(db)
        .await
        .map(Option::flatten)
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct SweepCounts {
    pub requeued: u64,
    pub failed: u64,
    pub stopped: u64,
}

/// Jobs whose last heartbeat (or claim) is older than `stale_after`: stopping ones end
/// `user_stopped`, running ones go back to the queue, or fail once their attempts are spent.
/// Each ended attempt is written to its job's history (outcome `stale`) in the same
/// transaction, and the jobs waiting for the ended ones settled (cancelled); answers those too.
pub async fn requeue_stale(
    db: &impl TransactionTrait,
    stale_after: Duration,
    max_attempts: i32,
) -> Result<(SweepCounts, Vec<EndedAttempt>, Vec<training_job::Model>), DbErr> {
    let now = Utc::now();
    let cutoff: DateTime<Utc> = now - stale_after;
    let stale = || {
        Expr::col(training_job::Column::HeartbeatAt)
            .lt(cutoff)
            .or(Expr::col(training_job::Column::HeartbeatAt)
                .is_null()
                .and(Expr::col(training_job::Column::ClaimedAt).lt(cutoff)))
    };
    let txn = db.begin().await?;
    let stopped = transition(JobEvent::StaleStopping)
        .col_expr(training_job::Column::FinishedAt, Expr::value(now))
        .col_expr(training_job::Column::UpdatedAt, Expr::value(now))
        .filter(stale())
        .exec_with_returning(&txn)
        .await?;
    const NO_HEARTBEAT: &str = "no heartbeat from the worker and no attempts left";
    let failed = transition(JobEvent::StaleFail)
        .col_expr(training_job::Column::Error, Expr::value(NO_HEARTBEAT))
        .col_expr(training_job::Column::FinishedAt, Expr::value(now))
        .col_expr(training_job::Column::UpdatedAt, Expr::value(now))
        .filter(training_job::Column::Attempts.gte(max_attempts))
        .filter(stale())
        .exec_with_returning(&txn)
        .await?;
    // The worker's id stays on the row until its attempt is in the history, then goes.
    let requeued = transition(JobEvent::StaleRequeue)
        .col_expr(
            training_job::Column::HeartbeatAt,
            Expr::value(Option::<DateTime<Utc>>::None),
        )
        .col_expr(training_job::Column::QueuedAt, Expr::value(now))
        .col_expr(training_job::Column::UpdatedAt, Expr::value(now))
        .filter(training_job::Column::Attempts.lt(max_attempts))
        .filter(stale())
        .exec_with_returning(&txn)
        .await?;
    clear_workers(&txn, &requeued).await?;
    let no_heartbeat = Some("no heartbeat from the worker".to_owned());
    let ended: Vec<EndedAttempt> = stopped
        .iter()
        .chain(&failed)
        .chain(&requeued)
        .map(|job| {
            EndedAttempt::of(
                job,
                job.worker_id.clone(),
                AttemptOutcome::Stale,
                no_heartbeat.clone(),
                now,
            )
        })
        .collect();
    record_attempts(&txn, &ended).await?;
    let ended_jobs: Vec<training_job::Model> = stopped.iter().chain(&failed).cloned().collect();
    let settled = super::control::ended_with_dependents(&txn, &ended_jobs, now).await?;
    txn.commit().await?;
    Ok((
        SweepCounts {
            requeued: requeued.len() as u64,
            failed: failed.len() as u64,
            stopped: stopped.len() as u64,
        },
        ended,
        settled,
    ))
}

/// Clears the worker of jobs just put back in the queue.
async fn clear_workers(db: &impl ConnectionTrait, jobs: &[training_job::Model]) -> Result<(), DbErr> {
    if jobs.is_empty() {
        return Ok(());
    }
    training_job::Entity::update_many()
        .col_expr(
            training_job::Column::WorkerId,
            Expr::value(Option::<String>::None),
        )
        .filter(training_job::Column::Id.is_in(jobs.iter().map(|job| job.id.clone())))
        .filter(Expr::cust(statuses_sql("status", &[JobStatus::Queued])))
        .exec(db)
        .await?;
    Ok(())
}

/// A worker restarted: its running and stopping jobs go back to the queue, each attempt
/// ended `interrupted` in the history.
pub async fn requeue_interrupted(
    db: &impl TransactionTrait,
    worker_id: &str,
) -> Result<Vec<EndedAttempt>, DbErr> {
    let now = Utc::now();
    let txn = db.begin().await?;
    let requeued = transition(JobEvent::Interrupted)
        .col_expr(
            training_job::Column::WorkerId,
            Expr::value(Option::<String>::None),
        )
        .col_expr(training_job::Column::StopRequested, Expr::value(false))
        .col_expr(
            training_job::Column::HeartbeatAt,
            Expr::value(Option::<DateTime<Utc>>::None),
        )
        .col_expr(training_job::Column::QueuedAt, Expr::value(now))
        .col_expr(training_job::Column::UpdatedAt, Expr::value(now))
        .filter(training_job::Column::WorkerId.eq(worker_id))
        .exec_with_returning(&txn)
        .await?;
    let ended: Vec<EndedAttempt> = requeued
        .iter()
        .map(|job| {
            EndedAttempt::of(
                job,
                Some(worker_id.to_owned()),
                AttemptOutcome::Interrupted,
                None,
                now,
            )
        })
        .collect();
    record_attempts(&txn, &ended).await?;
    txn.commit().await?;
    Ok(ended)
}
