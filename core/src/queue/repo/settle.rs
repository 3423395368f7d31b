//! What a claim's run fee settles: jobs whose fee could not be charged now go back, jobs
//! whose organization cannot pay are blocked, and queued again at its next credit.

use entities::training_job;
use sea_orm::{TransactionSession, TransactionTrait};

use super::report::{record_attempts, EndedAttempt};
use super::*;
use crate::domain::AttemptOutcome;

/// Puts claimed jobs back in the queue (their fee could not be settled now).
pub async fn release_claims(
    db: &impl ConnectionTrait,
    job_ids: &[JobId],
    worker_id: &str,
) -> Result<(), DbErr> {
    if job_ids.is_empty() {
        return Ok(());
    }
    transition(JobEvent::Release)
        .col_expr(
            training_job::Column::WorkerId,
            Expr::value(Option::<String>::None),
        )
        .col_expr(
            training_job::Column::Attempts,
            Expr::col(training_job::Column::Attempts).sub(1),
        )
        .filter(training_job::Column::Id.is_in(job_ids.iter().cloned()))
        .filter(training_job::Column::WorkerId.eq(worker_id))
        .exec(db)
        .await?;
    Ok(())
}

/// Marks claimed jobs blocked (their organization could not pay the run fee), marked so
/// that the organization's next credit queues them again; the attempts end in the history.
pub async fn block_unpaid(
    db: &impl TransactionTrait,
    job_ids: &[JobId],
    worker_id: &str,
    reason: &str,
) -> Result<Vec<EndedAttempt>, DbErr> {
    if job_ids.is_empty() {
        return Ok(Vec::new());
    }
    let now = Utc::now();
    let txn = db.begin().await?;
    // The refused claim gives its attempt back: `attempts` counts attempts handed to a
    // worker, and the refusal is a history row of its own (its place: attempts + refusals).
    let blocked = transition(JobEvent::BlockForFunds)
        .col_expr(training_job::Column::Error, Expr::value(reason))
        .col_expr(training_job::Column::BlockedForFunds, Expr::value(true))
        .col_expr(
            training_job::Column::Attempts,
            Expr::col(training_job::Column::Attempts).sub(1),
        )
        .col_expr(
            training_job::Column::Refusals,
            Expr::col(training_job::Column::Refusals).add(1),
        )
        .col_expr(training_job::Column::FinishedAt, Expr::value(now))
        .col_expr(training_job::Column::UpdatedAt, Expr::value(now))
        .filter(training_job::Column::Id.is_in(job_ids.iter().cloned()))
        .filter(training_job::Column::WorkerId.eq(worker_id))
        .exec_with_returning(&txn)
        .await?;
    let ended: Vec<EndedAttempt> = blocked
        .iter()
        .map(|job| {
            let mut refused = EndedAttempt::of(
                job,
                job.worker_id.clone(),
                AttemptOutcome::Blocked,
                Some(reason.to_owned()),
                now,
            );
            // The attempt it would have been.
            refused.row.attempt = job.attempts + 1;
            refused
        })
        .collect();
    record_attempts(&txn, &ended).await?;
    let ids: Vec<JobId> = blocked.iter().map(|job| job.id.clone()).collect();
    crate::queue::events::announce_ended(&txn, &ids).await?;
    txn.commit().await?;
    Ok(ended)
}

/// The organization's jobs blocked at their claim for want of funds go back to the queue
/// (a job a worker reported blocked is not touched); answers them. One whose unique key an
/// open job holds (created after it was blocked) stays blocked, as do all but the first
/// blocked with one key: a later credit looks at them again.
pub async fn requeue_blocked_for_funds(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
) -> Result<Vec<training_job::Model>, DbErr> {
    // A job created with the key between the statement's look and its write breaks the
    // unique index (PostgreSQL): the statement is run again, and then sees it.
    let mut tries = 0;
    loop {
        match requeue_once(db, org_id).await {
            Err(err) if tries < 2 && crate::orgs::repo::is_unique_violation(&err) => tries += 1,
            done => return done,
        }
    }
}

/// No job blocked for funds with the same unique key created before it (by id at the same
/// instant): the first of them.
static FIRST_WITH_KEY: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "(\"training_jobs\".\"unique_key\" IS NULL OR NOT EXISTS (SELECT 1 FROM training_jobs e \
         WHERE e.org_id = \"training_jobs\".\"org_id\" AND e.unique_key = \"training_jobs\".\"unique_key\" \
         AND e.blocked_for_funds AND {} AND (e.created_at < \"training_jobs\".\"created_at\" \
         OR (e.created_at = \"training_jobs\".\"created_at\" AND e.id < \"training_jobs\".\"id\"))))",
        from_sql(JobEvent::RequeueOnCredit, "e.status")
    )
});

async fn requeue_once(db: &impl ConnectionTrait, org_id: &OrgId) -> Result<Vec<training_job::Model>, DbErr> {
    let now = Utc::now();
    transition(JobEvent::RequeueOnCredit)
        .col_expr(training_job::Column::BlockedForFunds, Expr::value(false))
        .col_expr(
            training_job::Column::WorkerId,
            Expr::value(Option::<String>::None),
        )
        .col_expr(training_job::Column::Error, Expr::value(Option::<String>::None))
        .col_expr(
            training_job::Column::FinishedAt,
            Expr::value(Option::<DateTime<Utc>>::None),
        )
        .col_expr(training_job::Column::QueuedAt, Expr::value(now))
        .col_expr(training_job::Column::UpdatedAt, Expr::value(now))
        .filter(training_job::Column::OrgId.eq(org_id))
        .filter(training_job::Column::BlockedForFunds.eq(true))
        .filter(key_free())
        .filter(Expr::cust(FIRST_WITH_KEY.as_str()))
        .exec_with_returning(db)
        .await
}
