//! What users and operators do to a job: stop it, retry it.

use entities::training_job;
use sea_orm::{TransactionSession, TransactionTrait};

use super::*;

pub enum StopOutcome {
    Stopped(training_job::Model),
    AlreadyFinished(training_job::Model),
    NotFound,
}

/// queued, scheduled or waiting → user_stopped (announced to the organization's endpoints in
/// the same transaction, the jobs waiting for it cancelled); running → stopping (the next
/// heartbeat says so); stopping stays. Answers the outcome and the jobs its stop settled.
pub async fn stop_job(
    db: &impl TransactionTrait,
    job_id: &JobId,
    reason: Option<&str>,
) -> Result<(StopOutcome, Vec<training_job::Model>), DbErr> {
    let now = Utc::now();
    let txn = db.begin().await?;
    let stopped = stop_waiting(&txn, std::slice::from_ref(job_id), reason, now).await?;
    transition(JobEvent::StopRunning)
        .col_expr(training_job::Column::StopRequested, Expr::value(true))
        .col_expr(training_job::Column::StopReason, Expr::value(reason))
        .col_expr(training_job::Column::UpdatedAt, Expr::value(now))
        .filter(training_job::Column::Id.eq(job_id))
        .exec(&txn)
        .await?;
    let settled = ended_with_dependents(&txn, &stopped, now).await?;
    let job = find_job(&txn, job_id).await?;
    txn.commit().await?;
    let outcome = match job {
        None => StopOutcome::NotFound,
        Some(job)
            if job.status == JobStatus::Stopping
                || (job.status == JobStatus::UserStopped && job.stop_requested) =>
        {
            StopOutcome::Stopped(job)
        }
        Some(job) => StopOutcome::AlreadyFinished(job),
    };
    Ok((outcome, settled))
}

/// The queued, scheduled and waiting jobs among `job_ids` end user-stopped.
async fn stop_waiting(
    db: &impl ConnectionTrait,
    job_ids: &[JobId],
    reason: Option<&str>,
    now: DateTime<Utc>,
) -> Result<Vec<training_job::Model>, DbErr> {
    transition(JobEvent::StopWaiting)
        .col_expr(training_job::Column::StopRequested, Expr::value(true))
        .col_expr(training_job::Column::Error, Expr::value(reason))
        .col_expr(training_job::Column::StopReason, Expr::value(reason))
        .col_expr(training_job::Column::FinishedAt, Expr::value(now))
        .col_expr(training_job::Column::UpdatedAt, Expr::value(now))
        .filter(training_job::Column::Id.is_in(job_ids.iter().cloned()))
        .exec_with_returning(db)
        .await
}

/// Jobs that just ended: the jobs waiting for them settled, and the ended and the cancelled
/// announced, in the caller's transaction; answers the settled.
pub(super) async fn ended_with_dependents(
    db: &impl ConnectionTrait,
    ended: &[training_job::Model],
    now: DateTime<Utc>,
) -> Result<Vec<training_job::Model>, DbErr> {
    let settled = super::pipeline::settle_after(db, ended, now).await?;
    let announced: Vec<JobId> = ended
        .iter()
        .map(|job| job.id.clone())
        .chain(
            settled
                .iter()
                .filter(|job| job.status == JobStatus::Cancelled)
                .map(|job| job.id.clone()),
        )
        .collect();
    crate::queue::events::announce_ended(db, &announced).await?;
    Ok(settled)
}

/// Of `job_ids`, the queued, scheduled and waiting end now (user_stopped, announced in the
/// same transaction, their dependents cancelled) and the running are asked to stop
/// (stopping), as [`stop_job`] does each; in one transaction. Answers the jobs it changed
/// (the others, ended or already stopping, are left alone) and the jobs it settled.
pub async fn stop_jobs(
    db: &impl TransactionTrait,
    job_ids: &[JobId],
    reason: Option<&str>,
) -> Result<(Vec<training_job::Model>, Vec<training_job::Model>), DbErr> {
    if job_ids.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let now = Utc::now();
    let txn = db.begin().await?;
    let mut changed = stop_waiting(&txn, job_ids, reason, now).await?;
    let settled = ended_with_dependents(&txn, &changed, now).await?;
    let asked = transition(JobEvent::StopRunning)
        .col_expr(training_job::Column::StopRequested, Expr::value(true))
        .col_expr(training_job::Column::StopReason, Expr::value(reason))
        .col_expr(training_job::Column::UpdatedAt, Expr::value(now))
        .filter(training_job::Column::Id.is_in(job_ids.iter().cloned()))
        .exec_with_returning(&txn)
        .await?;
    txn.commit().await?;
    changed.extend(asked);
    Ok((changed, settled))
}

pub enum RetryOutcome {
    Retried {
        job: training_job::Model,
        /// The jobs waiting for it that it settled (cancelled ones waiting again).
        settled: Vec<training_job::Model>,
    },
    /// Not failed, blocked or user-stopped: nothing to retry.
    NotRetryable(training_job::Model),
    /// Cancelled, or stopped while it waited, and one of its dependencies ended without
    /// success: that one is to be retried.
    DependencyBroken {
        dependency: JobId,
        status: JobStatus,
    },
    /// Another open job of the organization holds its unique key (created after it ended):
    /// it may be retried once that one is done.
    KeyTaken {
        holder: JobId,
    },
    NotFound,
}

/// failed, blocked or user_stopped → queued, as a new job would be (its attempts keep
/// counting), or waiting when its dependencies have not all succeeded; the jobs waiting for
/// it that its failure cancelled wait again. Any other state is left alone.
pub async fn retry_job(
    db: &(impl TransactionTrait + ConnectionTrait),
    job_id: &JobId,
) -> Result<RetryOutcome, DbErr> {
    let retried = retry_jobs(db, std::slice::from_ref(job_id)).await?;
    if let Some(job) = retried.retried.into_iter().next() {
        return Ok(RetryOutcome::Retried {
            job,
            settled: retried.settled,
        });
    }
    if let Some((_, holder)) = retried.key_taken.into_iter().next() {
        return Ok(RetryOutcome::KeyTaken { holder });
    }
    let Some(job) = find_job(db, job_id).await? else {
        return Ok(RetryOutcome::NotFound);
    };
    let broken = match job.status {
        JobStatus::Cancelled => super::pipeline::dependencies_of(db, std::slice::from_ref(job_id))
            .await?
            .remove(job_id)
            .unwrap_or_default()
            .into_iter()
            .find(|d| d.broken())
            .map(|d| (d.id, d.status)),
        _ => retried
            .refused
            .into_iter()
            .next()
            .map(|(_, id, status)| (id, status)),
    };
    Ok(match broken {
        Some((dependency, status)) => RetryOutcome::DependencyBroken { dependency, status },
        None => RetryOutcome::NotRetryable(job),
    })
}

/// What a retry of many did.
#[derive(Debug, Default)]
pub struct Retried {
    /// The jobs it put back (queued, or waiting for their dependencies).
    pub retried: Vec<training_job::Model>,
    /// Jobs it left because a dependency of theirs ended without success: `(job, dependency,
    /// its status)`.
    pub refused: Vec<(JobId, JobId, JobStatus)>,
    /// Jobs it left because another open job holds their unique key (one created after they
    /// ended, or an earlier one of the same retry): `(job, the holder)`.
    pub key_taken: Vec<(JobId, JobId)>,
    /// The jobs waiting for the retried ones that it settled.
    pub settled: Vec<training_job::Model>,
}

/// Of `job_ids`, the failed, blocked or user-stopped jobs go back to the queue (or, with
/// dependencies not all succeeded, wait for them again), the jobs waiting for them settled,
/// in one transaction; answers those it moved (the others are left alone). A job whose
/// unique key another open job holds stays as it is (of several retried together with one
/// key, the first asked goes back).
pub async fn retry_jobs(db: &impl TransactionTrait, job_ids: &[JobId]) -> Result<Retried, DbErr> {
    // A job created with the key between the look and the update breaks the unique index
    // (PostgreSQL): the transaction is rolled back and the look taken again.
    let mut tries = 0;
    loop {
        match retry_once(db, job_ids).await {
            Err(err) if tries < 2 && crate::orgs::repo::is_unique_violation(&err) => tries += 1,
            done => return done,
        }
    }
}

async fn retry_once(db: &impl TransactionTrait, job_ids: &[JobId]) -> Result<Retried, DbErr> {
    use super::pipeline::{dependencies_of, lock_jobs, verdict, Verdict};
    if job_ids.is_empty() {
        return Ok(Retried::default());
    }
    let now = Utc::now();
    let txn = db.begin().await?;
    write_lock(&txn).await?;
    // Locked before their dependencies are read: a dependency's end settles them after.
    let mut locked: HashMap<JobId, training_job::Model> = lock_jobs(&txn, job_ids)
        .await?
        .into_iter()
        .filter(|job| JobEvent::Retry.applies_to(job.status))
        .map(|job| (job.id.clone(), job))
        .collect();
    // In the order asked (the first of several with one unique key goes back).
    let retryable: Vec<training_job::Model> = job_ids.iter().filter_map(|id| locked.remove(id)).collect();
    let ids: Vec<JobId> = retryable.iter().map(|job| job.id.clone()).collect();
    let dependencies = dependencies_of(&txn, &ids).await?;
    let mut reopened = Vec::new();
    let mut refused = Vec::new();
    for job in &retryable {
        match dependencies.get(&job.id).map(|d| verdict(d)) {
            None | Some(Verdict::Met) => reopened.push((job, JobEvent::Retry)),
            Some(Verdict::Wait) => reopened.push((job, JobEvent::RetryWaiting)),
            Some(Verdict::Broken(dependency, status)) => refused.push((job.id.clone(), dependency, status)),
        }
    }
    let candidates: Vec<&training_job::Model> = reopened.iter().map(|(job, _)| *job).collect();
    let key_taken = super::keys_taken(&txn, &candidates).await?;
    let mut retried = Vec::new();
    for event in [JobEvent::Retry, JobEvent::RetryWaiting] {
        let chosen: Vec<JobId> = reopened
            .iter()
            .filter(|(job, e)| *e == event && !key_taken.iter().any(|(id, _)| id == &job.id))
            .map(|(job, _)| job.id.clone())
            .collect();
        for chunk in chosen.chunks(500) {
            retried.extend(
                reset(transition(event), now, event == JobEvent::Retry)
                    .filter(super::key_free())
                    .filter(training_job::Column::Id.is_in(chunk.iter().cloned()))
                    .exec_with_returning(&txn)
                    .await?,
            );
        }
    }
    let settled = super::pipeline::settle_after(&txn, &retried, now).await?;
    txn.commit().await?;
    // In the order asked.
    let mut by_id: HashMap<JobId, training_job::Model> =
        retried.into_iter().map(|job| (job.id.clone(), job)).collect();
    let retried = job_ids.iter().filter_map(|id| by_id.remove(id)).collect();
    Ok(Retried {
        retried,
        refused,
        key_taken,
        settled,
    })
}

/// A retried job's reset: no worker, result, error or stop; claimable from now when queued.
fn reset(
    update: sea_orm::UpdateMany<training_job::Entity>,
    now: DateTime<Utc>,
    queued: bool,
) -> sea_orm::UpdateMany<training_job::Entity> {
    update
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
        .col_expr(training_job::Column::QueuedAt, Expr::value(queued.then_some(now)))
        .col_expr(training_job::Column::UpdatedAt, Expr::value(now))
}
