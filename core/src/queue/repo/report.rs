//! Workers' terminal reports: each ends its attempt in the job's history, retries a
//! retryable failure after a backoff, and announces the ended job, all in one transaction
//! (one statement on PostgreSQL when it can).

use entities::{training_job, training_job_attempt};
use sea_orm::{DatabaseConnection, EntityTrait, TransactionTrait};
use serde_json::json;

use super::*;
use crate::domain::AttemptOutcome;

/// A worker's terminal report.
#[derive(Debug, Clone)]
pub struct Report {
    pub job_id: JobId,
    pub worker_id: String,
    /// `succeeded`, `blocked`, `user_stopped` or `failed`.
    pub status: JobStatus,
    pub result: Option<String>,
    pub error: Option<String>,
    /// A failure worth another attempt: with attempts left the job is scheduled again
    /// after a backoff instead of failing.
    pub retryable: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportOutcome {
    Applied,
    /// The same terminal report again: harmless.
    Repeated,
    NotHeld,
    NotFound,
}

impl ReportOutcome {
    /// As `keel_queue_reports_total` labels it.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Applied => "applied",
            Self::Repeated => "repeated",
            Self::NotHeld => "not_held",
            Self::NotFound => "not_found",
        }
    }
}

/// How retryable failures wait before their next attempt.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Claims a job may take in all.
    pub max_attempts: i32,
    /// The wait after the first attempt, doubling with each further one...
    pub backoff_base: Duration,
    /// ...up to this.
    pub backoff_max: Duration,
}

impl RetryPolicy {
    /// The wait after attempt `attempt` (1 for the first) failed, before jitter:
    /// base × 2^(attempt − 1), at most the max.
    pub fn backoff(&self, attempt: i32) -> Duration {
        let doublings = attempt.saturating_sub(1).clamp(0, 40) as u32;
        let base = Ord::max(self.backoff_base.num_milliseconds(), 0);
        let wait = base.saturating_mul(1_i64 << doublings);
        Duration::milliseconds(Ord::min(wait, self.backoff_max.num_milliseconds()))
    }

    /// The backoff with ±20% jitter, so jobs that failed together do not return together.
    pub fn jittered(&self, attempt: i32) -> Duration {
        let factor = rand::Rng::random_range(&mut rand::rng(), 0.8..=1.2);
        Duration::milliseconds((self.backoff(attempt).num_milliseconds() as f64 * factor) as i64)
    }
}

/// An attempt that ended: its history row, and its action (for the run metric).
#[derive(Debug, Clone)]
pub struct EndedAttempt {
    pub action: JobAction,
    /// The job's organization (its log line names it).
    pub org_id: OrgId,
    pub row: training_job_attempt::Model,
}

impl EndedAttempt {
    pub(super) fn of(
        job: &training_job::Model,
        worker_id: Option<String>,
        outcome: AttemptOutcome,
        error: Option<String>,
        now: DateTime<Utc>,
    ) -> Self {
        Self {
            action: job.action,
            org_id: job.org_id.clone(),
            row: training_job_attempt::Model {
                job_id: job.id.clone(),
                ordinal: job.attempts + job.refusals,
                attempt: job.attempts,
                worker_id,
                claimed_at: job.claimed_at,
                ended_at: now,
                outcome,
                error,
            },
        }
    }
}

/// Writes ended attempts to the jobs' history (an attempt already written stays as it is).
pub(super) async fn record_attempts(db: &impl ConnectionTrait, ended: &[EndedAttempt]) -> Result<(), DbErr> {
    for chunk in ended.chunks(500) {
        training_job_attempt::Entity::insert_many(
            chunk
                .iter()
                .map(|e| training_job_attempt::ActiveModel::from(e.row.clone())),
        )
        .on_conflict(
            OnConflict::columns([
                training_job_attempt::Column::JobId,
                training_job_attempt::Column::Ordinal,
            ])
            .do_nothing()
            .to_owned(),
        )
        .exec_without_returning(db)
        .await?;
    }
    Ok(())
}

/// Schedules each retryable failure whose job has attempts left (and no stop request) for
/// its next attempt after the backoff; answers the jobs it scheduled.
async fn retry_failures(
    db: &impl ConnectionTrait,
    reports: &[Report],
    policy: &RetryPolicy,
    now: DateTime<Utc>,
) -> Result<Vec<(training_job::Model, EndedAttempt)>, DbErr> {
    let mut retried = Vec::new();
    for report in reports
        .iter()
        .filter(|r| r.retryable && r.status == JobStatus::Failed)
    {
        // The attempt number is the job's, read in the update itself: one due time per
        // attempt that can still be retried.
        let mut due = sea_orm::sea_query::CaseStatement::new();
        for attempt in 1..policy.max_attempts.clamp(1, 100) {
            due = due.case(
                Expr::col(training_job::Column::Attempts).eq(attempt),
                Expr::value(now + policy.jittered(attempt)),
            );
        }
        let due = due.finally(Expr::value(now + policy.jittered(policy.max_attempts)));
        let updated = transition(JobEvent::FailRetryable)
            .col_expr(training_job::Column::ScheduledAt, due.into())
            .col_expr(
                training_job::Column::WorkerId,
                Expr::value(Option::<String>::None),
            )
            .col_expr(
                training_job::Column::HeartbeatAt,
                Expr::value(Option::<DateTime<Utc>>::None),
            )
            .col_expr(training_job::Column::Error, Expr::value(report.error.clone()))
            .col_expr(training_job::Column::UpdatedAt, Expr::value(now))
            .filter(training_job::Column::Id.eq(&report.job_id))
            .filter(training_job::Column::WorkerId.eq(report.worker_id.as_str()))
            .filter(training_job::Column::Attempts.lt(policy.max_attempts))
            .exec_with_returning(db)
            .await?;
        if let Some(job) = updated.into_iter().next() {
            let ended = EndedAttempt::of(
                &job,
                Some(report.worker_id.clone()),
                AttemptOutcome::Retried,
                report.error.clone(),
                now,
            );
            retried.push((job, ended));
        }
    }
    Ok(retried)
}

/// Applies many reports, every ended attempt written to its job's history with its status
/// change, and the job events its organization's webhook endpoints listen to written with
/// them (the outbox); every job id appears at most once. Answers each report's outcome and
/// the attempts that ended. On PostgreSQL the reports of jobs whose organization has no
/// enabled endpoint, in a batch without retryable failures, are one statement (the history
/// rows inserted by a data-modifying CTE of the update); the rest one transaction, the
/// retryable failures first.
pub async fn apply_reports(
    db: &DatabaseConnection,
    reports: &[Report],
    policy: &RetryPolicy,
) -> Result<AppliedReports, DbErr> {
    if reports.is_empty() {
        return Ok(AppliedReports::default());
    }
    let now = Utc::now();
    let retrying = reports
        .iter()
        .any(|r| r.retryable && r.status == JobStatus::Failed);
    if db.get_database_backend() == DbBackend::Postgres && !retrying {
        let all: Vec<&Report> = reports.iter().collect();
        let (mut ended, _, _) = end_reported(db, &all, now, Announced::NotHere).await?;
        let done: std::collections::HashSet<JobId> = ended.iter().map(|e| e.row.job_id.clone()).collect();
        let rest: Vec<Report> = reports
            .iter()
            .filter(|r| !done.contains(&r.job_id))
            .cloned()
            .collect();
        if rest.is_empty() {
            return Ok(AppliedReports {
                outcomes: vec![ReportOutcome::Applied; reports.len()],
                ended,
                settled: Vec::new(),
            });
        }
        // Jobs of organizations with endpoints, or with dependents (or not held: the
        // transaction tells which).
        let rest_applied = apply_in_transaction(db, &rest, policy, now).await?;
        ended.extend(rest_applied.ended);
        let mut by_id: HashMap<&JobId, ReportOutcome> = rest
            .iter()
            .map(|r| &r.job_id)
            .zip(rest_applied.outcomes)
            .collect();
        let outcomes = reports
            .iter()
            .map(|r| by_id.remove(&r.job_id).unwrap_or(ReportOutcome::Applied))
            .collect();
        return Ok(AppliedReports {
            outcomes,
            ended,
            settled: rest_applied.settled,
        });
    }
    apply_in_transaction(db, reports, policy, now).await
}

/// What a batch of reports did.
#[derive(Debug, Default)]
pub struct AppliedReports {
    /// Each report's outcome, in order.
    pub outcomes: Vec<ReportOutcome>,
    /// The attempts that ended.
    pub ended: Vec<EndedAttempt>,
    /// The jobs waiting for the reported ones that changed (queued, scheduled, cancelled), as
    /// they are now.
    pub settled: Vec<training_job::Model>,
}

/// Whether `end_reported` ends jobs whose organization has an enabled webhook endpoint, or
/// that other jobs wait for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Announced {
    /// Ends them too: the caller's transaction writes their events and settles their
    /// dependents.
    Here,
    /// Leaves them (a statement on its own can do neither).
    NotHere,
}

/// `apply_reports` in one transaction, the job events with the changes.
async fn apply_in_transaction(
    db: &DatabaseConnection,
    reports: &[Report],
    policy: &RetryPolicy,
    now: DateTime<Utc>,
) -> Result<AppliedReports, DbErr> {
    let txn = db.begin().await?;
    let mut ended: Vec<EndedAttempt> = retry_failures(&txn, reports, policy, now)
        .await?
        .into_iter()
        .map(|(_, attempt)| attempt)
        .collect();
    let retried: std::collections::HashSet<JobId> = ended.iter().map(|e| e.row.job_id.clone()).collect();
    let rest: Vec<&Report> = reports.iter().filter(|r| !retried.contains(&r.job_id)).collect();
    let (reported, recorded, with_dependents) = end_reported(&txn, &rest, now, Announced::Here).await?;
    record_attempts(&txn, &ended).await?;
    if !recorded {
        record_attempts(&txn, &reported).await?;
    }
    let settled = super::pipeline::settle_dependents(&txn, &with_dependents, now).await?;
    let mut ended_ids: Vec<JobId> = reported.iter().map(|e| e.row.job_id.clone()).collect();
    ended_ids.extend(
        settled
            .iter()
            .filter(|job| job.status == JobStatus::Cancelled)
            .map(|job| job.id.clone()),
    );
    crate::queue::events::announce_ended(&txn, &ended_ids).await?;
    ended.extend(reported);
    let outcomes = outcomes_of(&txn, reports, &ended).await?;
    txn.commit().await?;
    Ok(AppliedReports {
        outcomes,
        ended,
        settled,
    })
}

/// Ends the reported jobs that their workers hold, in one statement, and answers the
/// attempts that ended, with whether the statement wrote their history rows itself (on
/// PostgreSQL, by a data-modifying CTE; on SQLite the caller writes them), and the ended
/// jobs that others wait for.
///
/// Every job is found by its primary key, not by a scan of all held jobs joined to the
/// batch. On PostgreSQL through `= ANY(ARRAY(...))`, with `status || ''` keeping the status
/// check a filter: written plainly, the planner (trusting a young table's statistics) also
/// read the whole partial index of held jobs and intersected the two. On SQLite the unary
/// `+` does the same (without it SQLite walked the held jobs and, for each, the batch).
async fn end_reported(
    db: &impl ConnectionTrait,
    reports: &[&Report],
    now: DateTime<Utc>,
    announced: Announced,
) -> Result<(Vec<EndedAttempt>, bool, Vec<JobId>), DbErr> {
    let backend = db.get_database_backend();
    let postgres = backend == DbBackend::Postgres;
    if reports.is_empty() {
        return Ok((Vec::new(), postgres, Vec::new()));
    }
    let rows: Vec<serde_json::Value> = reports
        .iter()
        .map(|r| {
            let status = JobEvent::of_report(r.status, false).and_then(JobEvent::to);
            json!({"id": r.job_id, "worker_id": r.worker_id, "status": status, "result": r.result, "error": r.error})
        })
        .collect();
    // A report's status is its attempt's outcome (succeeded, blocked, user_stopped, failed),
    // the one its event leads to in the transition table.
    let (sql, values): (String, Vec<Value>) = match postgres {
        true => (
            super::sql::postgres::END_REPORTED.replace(
                "{unannounced}",
                match announced {
                    Announced::Here => "",
                    Announced::NotHere => {
                        "AND NOT j.has_dependents \
                         AND NOT EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.org_id = j.org_id AND e.enabled)"
                    }
                },
            ),
            vec![serde_json::Value::Array(rows).into(), now.into()],
        ),
        false => (
            super::sql::sqlite::END_REPORTED.clone(),
            vec![now.into(), now.into(), serde_json::Value::Array(rows).to_string().into()],
        ),
    };
    let by_id: HashMap<&JobId, &Report> = reports.iter().map(|r| (&r.job_id, *r)).collect();
    let mut ended = Vec::new();
    let mut with_dependents = Vec::new();
    for row in db
        .query_all_raw(Statement::from_sql_and_values(backend, sql, values))
        .await?
    {
        let job_id: JobId = row.try_get_by_index(0)?;
        if row.try_get_by_index::<bool>(6)? {
            with_dependents.push(job_id.clone());
        }
        if let Some(report) = by_id.get(&job_id) {
            ended.push(ended_by_report(row, job_id, report, now)?);
        }
    }
    Ok((ended, postgres, with_dependents))
}

/// The attempt a report ended, from the update's `RETURNING id, attempts, claimed_at, action,
/// refusals, org_id, has_dependents`.
fn ended_by_report(
    row: sea_orm::QueryResult,
    job_id: JobId,
    report: &Report,
    now: DateTime<Utc>,
) -> Result<EndedAttempt, DbErr> {
    let action: String = row.try_get_by_index(3)?;
    let attempt: i32 = row.try_get_by_index(1)?;
    let refusals: i32 = row.try_get_by_index(4)?;
    Ok(EndedAttempt {
        action: JobAction::parse(&action).unwrap_or(JobAction::Training),
        org_id: row.try_get_by_index(5)?,
        row: training_job_attempt::Model {
            job_id,
            ordinal: attempt + refusals,
            attempt,
            worker_id: Some(report.worker_id.clone()),
            claimed_at: row.try_get_by_index(2)?,
            ended_at: now,
            outcome: AttemptOutcome::of_report(report.status),
            error: report.error.clone(),
        },
    })
}

/// Each report's outcome, given the attempts the batch ended: the others are read back to
/// tell a repeat of an applied report from a report of a job the worker does not hold.
async fn outcomes_of(
    db: &impl ConnectionTrait,
    reports: &[Report],
    ended: &[EndedAttempt],
) -> Result<Vec<ReportOutcome>, DbErr> {
    let applied: std::collections::HashSet<&JobId> = ended.iter().map(|e| &e.row.job_id).collect();
    let missing: Vec<JobId> = reports
        .iter()
        .filter(|r| !applied.contains(&r.job_id))
        .map(|r| r.job_id.clone())
        .collect();
    let (current, history): (HashMap<JobId, training_job::Model>, _) = if missing.is_empty() {
        (HashMap::new(), HashMap::new())
    } else {
        let current = training_job::Entity::find()
            .filter(training_job::Column::Id.is_in(missing.clone()))
            .all(db)
            .await?
            .into_iter()
            .map(|job| (job.id.clone(), job))
            .collect();
        (current, crate::queue::history::histories(db, &missing).await?)
    };
    Ok(reports
        .iter()
        .map(|r| {
            if applied.contains(&r.job_id) {
                return ReportOutcome::Applied;
            }
            let Some(job) = current.get(&r.job_id) else {
                return ReportOutcome::NotFound;
            };
            // The same report again: the job still ended as this worker said, or the
            // attempt this worker held is in the history with its outcome (a retried one
            // is scheduled, queued or running again by now).
            let same_end = job.status == r.status && job.worker_id.as_deref() == Some(r.worker_id.as_str());
            let recorded = history
                .get(&r.job_id)
                .and_then(|attempts| attempts.last())
                .is_some_and(|last| {
                    last.worker_id.as_deref() == Some(r.worker_id.as_str())
                        && (last.outcome == AttemptOutcome::of_report(r.status)
                            || (r.status == JobStatus::Failed && last.outcome == AttemptOutcome::Retried))
                });
            match same_end || recorded {
                true => ReportOutcome::Repeated,
                false => ReportOutcome::NotHeld,
            }
        })
        .collect())
}
