//! Pipelines: the edges between a job and the jobs it waits for (`dependsOn`), and what a
//! job's end, retry or creation does to the jobs waiting for it, in the transaction of that
//! change.
//!
//! A job with dependencies is settled by its dependencies' statuses as they are now: one
//! ended without success (failed for good, user-stopped, blocked by its worker, cancelled)
//! cancels it; all succeeded queue it (or schedule it, its `runAt` ahead); otherwise it waits
//! (a cancelled one waits again). Whenever a job's status changes, its dependents are
//! settled again, and theirs when theirs change, until nothing changes. Every dependent is
//! locked before its dependencies are read (`FOR UPDATE` on PostgreSQL, in id order; SQLite
//! has one writer), so of two dependencies ending at once on two instances the later sees the
//! earlier's commit.

use std::collections::{HashMap, HashSet};

use entities::{training_job, training_job_dependency};
use sea_orm::{EntityTrait, QueryOrder, QuerySelect};

use super::*;

/// What a new job waits for: a job that exists, or another item of its batch (by index).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Dependency {
    Job(JobId),
    Item(usize),
}

/// A dependency as its dependent is settled by it.
#[derive(Debug, Clone)]
pub struct DependencyState {
    pub id: JobId,
    pub status: JobStatus,
    pub blocked_for_funds: bool,
}

impl DependencyState {
    /// It ended without success and will not run again by itself. (A job blocked at its
    /// claim for want of funds is queued again at the organization's next credit.)
    pub fn broken(&self) -> bool {
        match self.status {
            JobStatus::Failed | JobStatus::UserStopped | JobStatus::Cancelled => true,
            JobStatus::Blocked => !self.blocked_for_funds,
            _ => false,
        }
    }
}

/// Where a job with dependencies stands by them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every dependency succeeded.
    Met,
    /// Some have not ended yet.
    Wait,
    /// This one ended without success.
    Broken(JobId, JobStatus),
}

pub fn verdict(dependencies: &[DependencyState]) -> Verdict {
    if let Some(broken) = dependencies.iter().find(|d| d.broken()) {
        return Verdict::Broken(broken.id.clone(), broken.status);
    }
    match dependencies.iter().all(|d| d.status == JobStatus::Succeeded) {
        true => Verdict::Met,
        false => Verdict::Wait,
    }
}

/// Why a waiting job was cancelled (its `error`).
pub fn cancelled_because(dependency: &JobId, status: JobStatus) -> String {
    format!("dependency {dependency} is {status}: this job will not run unless that job is retried")
}

/// Ids at a time in one `IN (…)`.
const CHUNK: usize = 500;

/// Writes the edges (`job`, `depends_on`) and marks every `depends_on` as having dependents
/// (which takes its row lock: a report of it waits for this transaction, then settles the
/// new dependents).
pub(super) async fn insert_edges(
    db: &impl ConnectionTrait,
    edges: &[(JobId, JobId)],
    now: DateTime<Utc>,
) -> Result<(), DbErr> {
    let mut targets: Vec<JobId> = edges.iter().map(|(_, on)| on.clone()).collect();
    targets.sort();
    targets.dedup();
    for chunk in targets.chunks(CHUNK) {
        training_job::Entity::update_many()
            .col_expr(training_job::Column::HasDependents, Expr::value(true))
            .filter(training_job::Column::Id.is_in(chunk.iter().cloned()))
            .exec(db)
            .await?;
    }
    for chunk in edges.chunks(CHUNK) {
        training_job_dependency::Entity::insert_many(chunk.iter().map(|(job, on)| {
            training_job_dependency::ActiveModel::from(training_job_dependency::Model {
                job_id: job.clone(),
                depends_on_id: on.clone(),
                created_at: now,
            })
        }))
        .on_conflict(
            OnConflict::columns([
                training_job_dependency::Column::JobId,
                training_job_dependency::Column::DependsOnId,
            ])
            .do_nothing()
            .to_owned(),
        )
        .exec_without_returning(db)
        .await?;
    }
    Ok(())
}

/// The jobs, locked until the transaction ends on PostgreSQL (in id order, so two settlings
/// never wait on each other in a circle).
pub(super) async fn lock_jobs(
    db: &impl ConnectionTrait,
    ids: &[JobId],
) -> Result<Vec<training_job::Model>, DbErr> {
    let mut sorted = ids.to_vec();
    sorted.sort();
    sorted.dedup();
    let mut jobs = Vec::with_capacity(sorted.len());
    for chunk in sorted.chunks(CHUNK) {
        jobs.extend(
            training_job::Entity::find()
                .filter(training_job::Column::Id.is_in(chunk.iter().cloned()))
                .order_by_asc(training_job::Column::Id)
                .lock_exclusive()
                .all(db)
                .await?,
        );
    }
    Ok(jobs)
}

/// Each of `ids`' dependencies with their statuses now (a job without any is absent).
pub async fn dependencies_of(
    db: &impl ConnectionTrait,
    ids: &[JobId],
) -> Result<HashMap<JobId, Vec<DependencyState>>, DbErr> {
    let mut found: HashMap<JobId, Vec<DependencyState>> = HashMap::new();
    for chunk in ids.chunks(CHUNK) {
        let rows: Vec<(JobId, JobId, JobStatus, bool)> = training_job_dependency::Entity::find()
            .select_only()
            .column(training_job_dependency::Column::JobId)
            .column(training_job::Column::Id)
            .column(training_job::Column::Status)
            .column(training_job::Column::BlockedForFunds)
            .join(
                sea_orm::JoinType::InnerJoin,
                training_job_dependency::Entity::belongs_to(training_job::Entity)
                    .from(training_job_dependency::Column::DependsOnId)
                    .to(training_job::Column::Id)
                    .into(),
            )
            .filter(training_job_dependency::Column::JobId.is_in(chunk.iter().cloned()))
            .order_by_asc(training_job_dependency::Column::JobId)
            .order_by_asc(training_job::Column::CreatedAt)
            .order_by_asc(training_job::Column::Id)
            .into_tuple()
            .all(db)
            .await?;
        for (job, id, status, blocked_for_funds) in rows {
            found.entry(job).or_default().push(DependencyState {
                id,
                status,
                blocked_for_funds,
            });
        }
    }
    Ok(found)
}

/// Which of `ids` are jobs of the organization.
pub async fn jobs_of_org(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    ids: &[JobId],
) -> Result<HashSet<JobId>, DbErr> {
    let mut found = HashSet::new();
    for chunk in ids.chunks(CHUNK) {
        found.extend(
            training_job::Entity::find()
                .select_only()
                .column(training_job::Column::Id)
                .filter(training_job::Column::OrgId.eq(org_id))
                .filter(training_job::Column::Id.is_in(chunk.iter().cloned()))
                .into_tuple::<JobId>()
                .all(db)
                .await?,
        );
    }
    Ok(found)
}

/// The jobs that wait for any of `ids` (each once, in id order).
pub async fn dependents_of(db: &impl ConnectionTrait, ids: &[JobId]) -> Result<Vec<JobId>, DbErr> {
    let mut found = Vec::new();
    for chunk in ids.chunks(CHUNK) {
        found.extend(
            training_job_dependency::Entity::find()
                .select_only()
                .column(training_job_dependency::Column::JobId)
                .filter(training_job_dependency::Column::DependsOnId.is_in(chunk.iter().cloned()))
                .into_tuple::<JobId>()
                .all(db)
                .await?,
        );
    }
    found.sort();
    found.dedup();
    Ok(found)
}

/// Settles `ids` (jobs with dependencies) by their dependencies as they are now; answers the
/// jobs it changed, as they are after.
async fn settle(
    db: &impl ConnectionTrait,
    ids: &[JobId],
    now: DateTime<Utc>,
) -> Result<Vec<training_job::Model>, DbErr> {
    let open: Vec<training_job::Model> = lock_jobs(db, ids)
        .await?
        .into_iter()
        .filter(|job| matches!(job.status, JobStatus::Waiting | JobStatus::Cancelled))
        .collect();
    if open.is_empty() {
        return Ok(Vec::new());
    }
    let open_ids: Vec<JobId> = open.iter().map(|job| job.id.clone()).collect();
    let dependencies = dependencies_of(db, &open_ids).await?;
    let mut met = Vec::new();
    let mut restored = Vec::new();
    let mut changed = Vec::new();
    for job in &open {
        let verdict = verdict(dependencies.get(&job.id).map_or(&[][..], Vec::as_slice));
        match (job.status, verdict) {
            (JobStatus::Waiting, Verdict::Met) => met.push(job.id.clone()),
            (JobStatus::Waiting, Verdict::Broken(dependency, status)) => {
                changed.extend(
                    transition(JobEvent::DependencyBroke)
                        .col_expr(
                            training_job::Column::Error,
                            Expr::value(cancelled_because(&dependency, status)),
                        )
                        .col_expr(training_job::Column::FinishedAt, Expr::value(now))
                        .col_expr(training_job::Column::UpdatedAt, Expr::value(now))
                        .filter(training_job::Column::Id.eq(&job.id))
                        .exec_with_returning(db)
                        .await?,
                );
            }
            (JobStatus::Cancelled, Verdict::Met | Verdict::Wait) => restored.push(job.id.clone()),
            _ => {}
        }
    }
    for chunk in met.chunks(CHUNK) {
        // Queued now, or scheduled when its `runAt` is ahead.
        let due = Expr::col(training_job::Column::ScheduledAt)
            .is_null()
            .or(Expr::col(training_job::Column::ScheduledAt).lte(now));
        changed.extend(
            transition(JobEvent::DependenciesMet)
                .col_expr(
                    training_job::Column::ScheduledAt,
                    Expr::value(Option::<DateTime<Utc>>::None),
                )
                .col_expr(training_job::Column::QueuedAt, Expr::value(now))
                .col_expr(training_job::Column::UpdatedAt, Expr::value(now))
                .filter(training_job::Column::Id.is_in(chunk.iter().cloned()))
                .filter(due)
                .exec_with_returning(db)
                .await?,
        );
        changed.extend(
            transition(JobEvent::DependenciesMetLater)
                .col_expr(training_job::Column::UpdatedAt, Expr::value(now))
                .filter(training_job::Column::Id.is_in(chunk.iter().cloned()))
                .filter(training_job::Column::ScheduledAt.gt(now))
                .exec_with_returning(db)
                .await?,
        );
    }
    for chunk in restored.chunks(CHUNK) {
        changed.extend(
            transition(JobEvent::DependencyRetried)
                // Its unique key, if another job took it while it was cancelled, keeps it
                // cancelled: a waiting job holds its key.
                .filter(key_free())
                .col_expr(training_job::Column::Error, Expr::value(Option::<String>::None))
                .col_expr(
                    training_job::Column::FinishedAt,
                    Expr::value(Option::<DateTime<Utc>>::None),
                )
                .col_expr(training_job::Column::UpdatedAt, Expr::value(now))
                .filter(training_job::Column::Id.is_in(chunk.iter().cloned()))
                .exec_with_returning(db)
                .await?,
        );
    }
    Ok(changed)
}

/// Settles the new jobs `ids` (created waiting) and, transitively, the jobs waiting for
/// those that changed; answers every job that changed, as it is now.
pub(super) async fn settle_new(
    db: &impl ConnectionTrait,
    ids: &[JobId],
    now: DateTime<Utc>,
) -> Result<Vec<training_job::Model>, DbErr> {
    settle_from(db, ids.to_vec(), Vec::new(), now).await
}

/// Settles the jobs waiting for `sources` (jobs whose status just changed), and theirs, until
/// nothing changes; answers every job that changed, as it is now (each once, its last change).
pub(super) async fn settle_dependents(
    db: &impl ConnectionTrait,
    sources: &[JobId],
    now: DateTime<Utc>,
) -> Result<Vec<training_job::Model>, DbErr> {
    settle_from(db, Vec::new(), sources.to_vec(), now).await
}

/// Of `jobs` (just changed), the settlings their dependents need.
pub(super) async fn settle_after(
    db: &impl ConnectionTrait,
    jobs: &[training_job::Model],
    now: DateTime<Utc>,
) -> Result<Vec<training_job::Model>, DbErr> {
    let sources: Vec<JobId> = jobs
        .iter()
        .filter(|job| job.has_dependents)
        .map(|job| job.id.clone())
        .collect();
    settle_dependents(db, &sources, now).await
}

async fn settle_from(
    db: &impl ConnectionTrait,
    mut again: Vec<JobId>,
    mut sources: Vec<JobId>,
    now: DateTime<Utc>,
) -> Result<Vec<training_job::Model>, DbErr> {
    let mut changed: HashMap<JobId, training_job::Model> = HashMap::new();
    let mut order: Vec<JobId> = Vec::new();
    // Each round settles the dependents of the last round's changes (a pipeline's depth
    // bounds the rounds: a job changes at most twice in one settling, waiting → cancelled
    // or cancelled → waiting → queued).
    for _ in 0..100_000 {
        let mut candidates = std::mem::take(&mut again);
        if !sources.is_empty() {
            candidates.extend(dependents_of(db, &sources).await?);
        }
        if candidates.is_empty() {
            break;
        }
        candidates.sort();
        candidates.dedup();
        let settled = settle(db, &candidates, now).await?;
        let mut next_sources = Vec::new();
        let mut seen = HashSet::new();
        for job in settled {
            // A cancelled job waiting again is settled once more (its dependencies may all
            // have succeeded meanwhile).
            if job.status == JobStatus::Waiting {
                again.push(job.id.clone());
            }
            if seen.insert(job.id.clone()) && job.has_dependents {
                next_sources.push(job.id.clone());
            }
            if !changed.contains_key(&job.id) {
                order.push(job.id.clone());
            }
            changed.insert(job.id.clone(), job);
        }
        sources = next_sources;
    }
    Ok(order.into_iter().filter_map(|id| changed.remove(&id)).collect())
}

/// The jobs of a pipeline: every job linked to `job_id` by dependencies either way (itself
/// included), as an id subquery for a list's filter.
pub(super) fn pipeline_ids_sql(backend: DbBackend) -> &'static str {
    match backend {
        // `UNION` (not `ALL`) drops the ids already reached, so the walk ends on any graph.
        DbBackend::Postgres => {
            "WITH RECURSIVE g(id) AS (SELECT $1::text UNION \
               SELECT CASE WHEN d.job_id = g.id THEN d.depends_on_id ELSE d.job_id END \
               FROM training_job_dependencies d JOIN g ON d.job_id = g.id OR d.depends_on_id = g.id) \
             SELECT id FROM g"
        }
        _ => {
            "WITH RECURSIVE g(id) AS (SELECT ? UNION \
               SELECT CASE WHEN d.job_id = g.id THEN d.depends_on_id ELSE d.job_id END \
               FROM training_job_dependencies d JOIN g ON d.job_id = g.id OR d.depends_on_id = g.id) \
             SELECT id FROM g"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dep(status: JobStatus, blocked_for_funds: bool) -> DependencyState {
        DependencyState {
            id: JobId::generate(),
            status,
            blocked_for_funds,
        }
    }

    #[test]
    fn a_job_waits_until_all_succeed_and_is_cancelled_by_one_that_ended_otherwise() {
        use JobStatus::*;
        assert_eq!(
            verdict(&[dep(Succeeded, false), dep(Succeeded, false)]),
            Verdict::Met
        );
        assert_eq!(
            verdict(&[dep(Succeeded, false), dep(Running, false)]),
            Verdict::Wait
        );
        for pending in [Queued, Scheduled, Running, Stopping, Waiting] {
            assert_eq!(verdict(&[dep(pending, false)]), Verdict::Wait, "{pending}");
        }
        // Blocked at its claim for want of funds: it runs at the next credit.
        assert_eq!(verdict(&[dep(Blocked, true)]), Verdict::Wait);
        for broken in [Failed, UserStopped, Cancelled, Blocked] {
            let d = dep(broken, false);
            assert_eq!(
                verdict(&[dep(Succeeded, false), d.clone()]),
                Verdict::Broken(d.id.clone(), broken),
                "{broken}"
            );
        }
        let id = JobId::generate();
        assert!(cancelled_because(&id, Failed).contains(id.as_str()));
        assert!(cancelled_because(&id, Failed).contains("failed"));
    }
}

/// A job as a pipeline's view lists it.
#[derive(Debug, Clone)]
pub struct Linked {
    pub id: JobId,
    pub action: JobAction,
    pub status: JobStatus,
}

/// A job's place in its pipeline: the jobs it waits for, and the jobs that wait for it.
#[derive(Debug, Clone, Default)]
pub struct PipelineView {
    /// Every job it depends on, oldest first.
    pub depends_on: Vec<Linked>,
    /// The first [`DEPENDENTS_SHOWN`] jobs that depend on it, oldest first.
    pub dependents: Vec<Linked>,
    /// How many jobs depend on it.
    pub dependents_count: u64,
}

/// Dependents a job's view lists at most (the pipeline's list has them all).
pub const DEPENDENTS_SHOWN: u64 = 100;

fn linked((id, action, status): (JobId, JobAction, JobStatus)) -> Linked {
    Linked { id, action, status }
}

/// `job_id`'s dependencies and dependents, with their states.
pub async fn pipeline_view(db: &impl ConnectionTrait, job_id: &JobId) -> Result<PipelineView, DbErr> {
    use sea_orm::PaginatorTrait;
    let edge = |from: training_job_dependency::Column| {
        training_job_dependency::Entity::belongs_to(training_job::Entity)
            .from(from)
            .to(training_job::Column::Id)
            .into()
    };
    let columns = |select: sea_orm::Select<training_job_dependency::Entity>| {
        select
            .select_only()
            .column(training_job::Column::Id)
            .column(training_job::Column::Action)
            .column(training_job::Column::Status)
            .order_by_asc(training_job::Column::CreatedAt)
            .order_by_asc(training_job::Column::Id)
    };
    let depends_on = columns(
        training_job_dependency::Entity::find()
            .join(
                sea_orm::JoinType::InnerJoin,
                edge(training_job_dependency::Column::DependsOnId),
            )
            .filter(training_job_dependency::Column::JobId.eq(job_id)),
    )
    .into_tuple()
    .all(db)
    .await?;
    let dependents_count = training_job_dependency::Entity::find()
        .filter(training_job_dependency::Column::DependsOnId.eq(job_id))
        .count(db)
        .await?;
    let dependents = match dependents_count {
        0 => Vec::new(),
        _ => {
            columns(
                training_job_dependency::Entity::find()
                    .join(
                        sea_orm::JoinType::InnerJoin,
                        edge(training_job_dependency::Column::JobId),
                    )
                    .filter(training_job_dependency::Column::DependsOnId.eq(job_id)),
            )
            .limit(DEPENDENTS_SHOWN)
            .into_tuple()
            .all(db)
            .await?
        }
    };
    Ok(PipelineView {
        depends_on: depends_on.into_iter().map(linked).collect(),
        dependents: dependents.into_iter().map(linked).collect(),
        dependents_count,
    })
}

/// A pipeline's jobs, the edges between them (`(job, depends on)`), and whether it has more.
pub type PipelineGraph = (Vec<training_job::Model>, Vec<(JobId, JobId)>, bool);

/// A pipeline as the console draws it: its first `limit` jobs (oldest first) and the edges
/// between them, and whether it has more.
pub async fn pipeline_graph(
    db: &impl ConnectionTrait,
    job_id: &JobId,
    limit: u64,
) -> Result<PipelineGraph, DbErr> {
    let backend = db.get_database_backend();
    let mut jobs = training_job::Entity::find()
        .filter(Expr::cust_with_values(
            format!("\"training_jobs\".\"id\" IN ({})", pipeline_ids_sql(backend)),
            [job_id.as_str()],
        ))
        .order_by_asc(training_job::Column::CreatedAt)
        .order_by_asc(training_job::Column::Id)
        .limit(limit + 1)
        .all(db)
        .await?;
    let more = jobs.len() as u64 > limit;
    jobs.truncate(limit as usize);
    let ids: Vec<JobId> = jobs.iter().map(|job| job.id.clone()).collect();
    let shown: HashSet<&JobId> = ids.iter().collect();
    let mut edges = Vec::new();
    for chunk in ids.chunks(CHUNK) {
        let rows: Vec<(JobId, JobId)> = training_job_dependency::Entity::find()
            .select_only()
            .column(training_job_dependency::Column::JobId)
            .column(training_job_dependency::Column::DependsOnId)
            .filter(training_job_dependency::Column::JobId.is_in(chunk.iter().cloned()))
            .into_tuple()
            .all(db)
            .await?;
        edges.extend(rows.into_iter().filter(|(_, on)| shown.contains(on)));
    }
    Ok((jobs, edges, more))
}
