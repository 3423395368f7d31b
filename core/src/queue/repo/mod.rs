//! Queue persistence, by concern: new jobs (`insert`), claims (`claim`, its statements per
//! dialect in `sql`), what a claim's fee settles (`settle`), workers' reports and heartbeats
//! (`report`, `heartbeat`), stops and retries (`control`), pipelines' dependencies
//! (`pipeline`), the periodic sweeps (`sweep`),
//! reads (`read`), operators' settings (`settings`) and secrets (`secrets`).
//!
//! Every change of a job's status is a guarded update named by its [`JobEvent`]: the
//! event's from-statuses are the update's `WHERE status IN (…)` and its to-status the new
//! one ([`transition`], [`guard`], [`from_sql`]), so the database decides who wins when
//! several instances act on one job at once, and no status changes outside the table.

mod claim;
mod control;
mod heartbeat;
mod insert;
mod pipeline;
mod read;
mod report;
mod secrets;
mod settings;
mod settle;
mod sql;
mod sweep;
#[cfg(test)]
mod tests;

pub(crate) use claim::install;
pub use claim::{claim, Claimant};
pub use control::{retry_job, retry_jobs, stop_job, stop_jobs, RetryOutcome, StopOutcome};
pub use heartbeat::{heartbeat, heartbeats, set_live_status, Held};
pub use insert::{insert_batch, insert_jobs, insert_keyed, Inserted, JobDataset, NewJob, DEFAULT_PRIORITY};
pub use pipeline::{
    jobs_of_org, pipeline_graph, pipeline_view, Dependency, Linked, PipelineGraph, PipelineView,
    DEPENDENTS_SHOWN,
};
pub use read::{
    count_failed, counts_by_action_status, ended_per_bucket, failed_jobs, find_job, held_jobs,
    job_ids_matching, list_jobs, oldest_queued, open_counts_by_org, sorted_jobs, status_counts, statuses_of,
    FailedFilter, JobFilter, JobSort,
};
pub use report::{apply_reports, AppliedReports, EndedAttempt, Report, ReportOutcome, RetryPolicy};
pub use secrets::{apply_secret_changes, sealed_secrets, SecretChange};
pub use settings::{
    all_org_settings, is_paused, org_settings, pause, paused_actions, resume, running_count, set_org_settings,
};
pub use settle::{block_unpaid, release_claims, requeue_blocked_for_funds};
pub use sweep::{next_due, promote_due, requeue_interrupted, requeue_stale, SweepCounts};

use std::collections::HashMap;
use std::sync::LazyLock;

use chrono::{DateTime, Duration, Utc};
use entities::training_job;
use sea_orm::sea_query::{Condition, Expr, OnConflict};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DbBackend, DbErr, EntityTrait, ExprTrait, QueryFilter, Statement, Value,
};

use crate::domain::{JobAction, JobEvent, JobId, JobStatus, OrgId};

/// A status as a SQL literal: the partial indexes' conditions must stand in a statement's
/// text, not as parameters (SQLite uses a partial index only when the query repeats its
/// condition; PostgreSQL cannot match a bound parameter against it in a generic plan).
fn literal(status: JobStatus) -> String {
    format!("'{}'", status.as_str())
}

/// `column IN (…)` of the statuses, as literals (`column = '…'` for one).
fn statuses_sql(column: &str, statuses: &[JobStatus]) -> String {
    match statuses {
        [one] => format!("{column} = {}", literal(*one)),
        many => format!(
            "{column} IN ({})",
            many.iter().map(|s| literal(*s)).collect::<Vec<_>>().join(", ")
        ),
    }
}

/// The held statuses (running, stopping), as the held jobs' partial indexes state them
/// (migration `m20261122_000004`).
const HELD_STATUSES: [JobStatus; 2] = [JobStatus::Running, JobStatus::Stopping];
static HELD: LazyLock<String> = LazyLock::new(|| statuses_sql("status", &HELD_STATUSES));

/// A held job (running or stopping), in the held-jobs indexes' words.
fn held() -> Condition {
    Condition::all().add(Expr::cust(HELD.as_str()))
}

/// The guard of `event`'s update: the job is in one of its from-statuses. A guard within the
/// held statuses also names the held-jobs indexes' condition, so the planner may use them.
fn guard(event: JobEvent) -> Condition {
    let from = event.from();
    let condition = Expr::cust(statuses_sql("status", from));
    match from.iter().all(|s| HELD_STATUSES.contains(s)) && from != HELD_STATUSES {
        true => held().add(condition),
        false => Condition::all().add(condition),
    }
}

/// `event`'s guard for a raw statement, on `column` (say `t.status`).
fn from_sql(event: JobEvent, column: &str) -> String {
    statuses_sql(column, event.from())
}

/// `event`'s new status as a SQL literal (for raw statements). An event that keeps the
/// status (a heartbeat) writes none: its statements set no status.
fn to_sql(event: JobEvent) -> String {
    event.to().map(literal).unwrap_or_else(|| "status".to_owned())
}

/// The update of the jobs `event` applies to: its new status (if it changes one), guarded
/// by its from-statuses. The caller adds the rest of the change and which jobs.
fn transition(event: JobEvent) -> sea_orm::UpdateMany<training_job::Entity> {
    let update = training_job::Entity::update_many();
    let update = match event.to() {
        Some(to) => update.col_expr(training_job::Column::Status, Expr::value(to.as_str())),
        None => update,
    };
    update.filter(guard(event))
}

/// The statuses a job with a unique key holds it in (the unique index's condition,
/// migration `m20261204_000001`): every status a job is not done in.
const OPEN: [JobStatus; 5] = [
    JobStatus::Queued,
    JobStatus::Scheduled,
    JobStatus::Running,
    JobStatus::Stopping,
    JobStatus::Waiting,
];

/// The job has no unique key, or no other open job of its organization holds it: the guard
/// of every update that reopens a job, so a reopened job never breaks the unique index.
static KEY_FREE: LazyLock<String> = LazyLock::new(|| {
    format!(
        "(\"training_jobs\".\"unique_key\" IS NULL OR NOT EXISTS (SELECT 1 FROM training_jobs o \
         WHERE o.org_id = \"training_jobs\".\"org_id\" AND o.unique_key = \"training_jobs\".\"unique_key\" \
         AND o.id <> \"training_jobs\".\"id\" AND {}))",
        statuses_sql("o.status", &OPEN)
    )
});

fn key_free() -> Condition {
    Condition::all().add(Expr::cust(KEY_FREE.as_str()))
}

/// Of `jobs`, about to be reopened together in this order, those whose unique key an open job
/// of their organization holds, or an earlier one of `jobs` will: `(job, the holder)`.
async fn keys_taken(
    db: &impl ConnectionTrait,
    jobs: &[&training_job::Model],
) -> Result<Vec<(JobId, JobId)>, DbErr> {
    use sea_orm::QuerySelect;
    let keys: Vec<&str> = jobs.iter().filter_map(|job| job.unique_key.as_deref()).collect();
    let mut holders: HashMap<(OrgId, String), JobId> = HashMap::new();
    for chunk in keys.chunks(500) {
        let open: Vec<(JobId, OrgId, String)> = training_job::Entity::find()
            .select_only()
            .column(training_job::Column::Id)
            .column(training_job::Column::OrgId)
            .column(training_job::Column::UniqueKey)
            .filter(training_job::Column::UniqueKey.is_in(chunk.iter().copied()))
            .filter(Expr::cust(statuses_sql("status", &OPEN)))
            .into_tuple()
            .all(db)
            .await?;
        holders.extend(open.into_iter().map(|(id, org, key)| ((org, key), id)));
    }
    let mut taken = Vec::new();
    for job in jobs {
        let Some(key) = &job.unique_key else { continue };
        match holders.entry((job.org_id.clone(), key.clone())) {
            std::collections::hash_map::Entry::Occupied(holder) if holder.get() != &job.id => {
                taken.push((job.id.clone(), holder.get().clone()));
            }
            std::collections::hash_map::Entry::Occupied(_) => {}
            std::collections::hash_map::Entry::Vacant(free) => {
                free.insert(job.id.clone());
            }
        }
    }
    Ok(taken)
}

/// The claim index's order (migration `m20261126_000003`), unqualified and for alias `t`.
const CLAIM_ORDER: &str = "action, org_id, priority, created_at, id";
const CLAIM_ORDER_T: &str = "t.action, t.org_id, t.priority, t.created_at, t.id";

/// Held jobs (running or stopping, of any action) per organization, for `org_ids`.
async fn running_counts(db: &impl ConnectionTrait, org_ids: &[OrgId]) -> Result<HashMap<OrgId, i64>, DbErr> {
    use sea_orm::QuerySelect;
    if org_ids.is_empty() {
        return Ok(HashMap::new());
    }
    Ok(training_job::Entity::find()
        .select_only()
        .column(training_job::Column::OrgId)
        .column_as(Expr::col(training_job::Column::Id).count(), "jobs")
        .filter(held())
        .filter(training_job::Column::OrgId.is_in(org_ids.iter().cloned()))
        .group_by(training_job::Column::OrgId)
        .into_tuple::<(OrgId, i64)>()
        .all(db)
        .await?
        .into_iter()
        .collect())
}

/// Takes SQLite's write lock first (as `BEGIN IMMEDIATE` would), so a transaction that reads
/// before it writes is not refused its write by another that wrote meanwhile; on PostgreSQL
/// nothing (its row locks decide).
async fn write_lock(db: &impl ConnectionTrait) -> Result<(), DbErr> {
    match db.get_database_backend() {
        DbBackend::Postgres => Ok(()),
        _ => db
            .execute_unprepared("UPDATE training_jobs SET status = status WHERE 0")
            .await
            .map(|_| ()),
    }
}
