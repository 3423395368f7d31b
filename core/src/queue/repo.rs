//! Queue persistence. Every transition is a conditional update, so the database decides
//! who wins when several instances act on one job at once.

use std::collections::HashMap;

use std::sync::LazyLock;

use chrono::{DateTime, Duration, Utc};
use entities::{org_secret, queue_org_setting, queue_pause, queue_share, training_job, training_job_attempt};

use super::shares::{allot, Allotment, Contender};
use sea_orm::sea_query::{Condition, Expr, Func, LikeExpr, OnConflict};
use sea_orm::ActiveValue::Set;
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DatabaseTransaction, DbBackend, DbErr, EntityTrait,
    ExprTrait, QueryFilter, QueryOrder, QuerySelect, Statement, TransactionSession, TransactionTrait, Value,
};
use serde_json::json;

use crate::domain::{AttemptOutcome, JobAction, JobId, JobStatus, OrgId, ProjectId};

const QUEUED: &str = JobStatus::Queued.as_str();
const SCHEDULED: &str = JobStatus::Scheduled.as_str();
const RUNNING: &str = JobStatus::Running.as_str();
const STOPPING: &str = JobStatus::Stopping.as_str();
const BLOCKED: &str = JobStatus::Blocked.as_str();
const USER_STOPPED: &str = JobStatus::UserStopped.as_str();
const FAILED: &str = JobStatus::Failed.as_str();

/// `sql` with `{queued}`, `{running}` and `{stopping}` written as the statuses' SQL literals:
/// the partial indexes' conditions must stand in a statement's text, not as parameters.
fn with_statuses(sql: &str) -> String {
    let literal = |status: JobStatus| format!("'{}'", status.as_str());
    sql.replace("{queued}", &literal(JobStatus::Queued))
        .replace("{running}", &literal(JobStatus::Running))
        .replace("{stopping}", &literal(JobStatus::Stopping))
}

/// The held statuses' condition, and the running one's (built once).
static HELD: LazyLock<String> = LazyLock::new(|| with_statuses("status IN ({running}, {stopping})"));
static IS_RUNNING: LazyLock<String> = LazyLock::new(|| with_statuses("status = {running}"));
static IS_STOPPING: LazyLock<String> = LazyLock::new(|| with_statuses("status = {stopping}"));

/// A held job (running or stopping), written as the partial indexes state it (migration
/// `m20261122_000004`): SQLite uses a partial index only when the query repeats its
/// condition, and PostgreSQL cannot match a bound parameter against it in a generic plan.
fn held() -> Condition {
    Condition::all().add(Expr::cust(HELD.as_str()))
}

/// A running job, in a form that still names the held-jobs indexes' condition.
fn running() -> Condition {
    held().add(Expr::cust(IS_RUNNING.as_str()))
}

#[derive(Clone)]
pub struct NewJob {
    pub org_id: OrgId,
    pub project_id: ProjectId,
    pub training_task_id: Option<String>,
    pub action: JobAction,
    pub payload: serde_json::Value,
    /// 0 (most urgent) to 9.
    pub priority: i32,
    /// A time in the future makes the job `scheduled` until then.
    pub run_at: Option<DateTime<Utc>>,
    /// While this job is not terminal, its organization's creates with the same key answer it.
    pub unique_key: Option<String>,
    /// The `Idempotency-Key` it was submitted with, and the SHA-256 (hex) of its body.
    pub idempotency: Option<(String, String)>,
}

/// The priority of a job created without one.
pub const DEFAULT_PRIORITY: i32 = 5;

fn queued_job(job: NewJob, now: DateTime<Utc>) -> training_job::Model {
    let scheduled_at = job.run_at.filter(|at| *at > now);
    training_job::Model {
        id: JobId::generate(),
        org_id: job.org_id,
        project_id: job.project_id,
        training_task_id: job.training_task_id,
        action: job.action,
        status: match scheduled_at {
            Some(_) => JobStatus::Scheduled,
            None => JobStatus::Queued,
        },
        priority: job.priority,
        queued_at: match scheduled_at {
            Some(_) => None,
            None => Some(now),
        },
        scheduled_at,
        unique_key: job.unique_key,
        idempotency_key: job.idempotency.as_ref().map(|(key, _)| key.clone()),
        request_hash: job.idempotency.map(|(_, hash)| hash),
        blocked_for_funds: false,
        refusals: 0,
        stop_reason: None,
        payload: job.payload.to_string(),
        worker_id: None,
        attempts: 0,
        stop_requested: false,
        live_status: None,
        result: None,
        error: None,
        created_at: now,
        updated_at: now,
        claimed_at: None,
        heartbeat_at: None,
        finished_at: None,
    }
}

/// Queues `jobs` in one statement (one commit for all), in order. If that fails (say one
/// job's project was deleted meanwhile), each is inserted on its own, so only the failing
/// job fails.
pub async fn insert_jobs(
    db: &impl ConnectionTrait,
    jobs: Vec<NewJob>,
) -> Vec<Result<training_job::Model, DbErr>> {
    // One clock reading per batch; the id breaks ties, so claim order stays total.
    let now = Utc::now();
    let models: Vec<training_job::Model> = jobs.into_iter().map(|job| queued_job(job, now)).collect();
    let rows = models.iter().map(|m| training_job::ActiveModel::from(m.clone()));
    match training_job::Entity::insert_many(rows)
        .exec_without_returning(db)
        .await
    {
        Ok(_) => models.into_iter().map(Ok).collect(),
        Err(err) if models.len() == 1 => vec![Err(err)],
        Err(_) => {
            let mut results = Vec::with_capacity(models.len());
            for model in models {
                let row = training_job::ActiveModel::from(model.clone());
                results.push(
                    training_job::Entity::insert(row)
                        .exec_without_returning(db)
                        .await
                        .map(|_| model),
                );
            }
            results
        }
    }
}

/// What a create with a unique key or an idempotency key made of it.
pub enum Inserted {
    New(training_job::Model),
    /// An open job of the organization already has the unique key: no new one.
    Unique(training_job::Model),
    /// The job first created with this idempotency key and the same body.
    Replayed(training_job::Model),
    /// The idempotency key came with another body.
    KeyReused,
}

/// The statuses a job with a unique key holds it in (the unique index's condition).
const OPEN: [&str; 4] = [QUEUED, SCHEDULED, RUNNING, STOPPING];

/// Creates a job with a unique key or an idempotency key. The database's unique indexes
/// decide between instances: the insert does nothing on a conflict, then the job it
/// conflicted with is read. (If that one ended in between, the insert is tried again.)
pub async fn insert_keyed(db: &impl ConnectionTrait, job: NewJob) -> Result<Inserted, DbErr> {
    for _ in 0..3 {
        let model = queued_job(job.clone(), Utc::now());
        let inserted = training_job::Entity::insert(training_job::ActiveModel::from(model.clone()))
            .on_conflict(OnConflict::new().do_nothing().to_owned())
            .exec_without_returning(db)
            .await?;
        if inserted > 0 {
            return Ok(Inserted::New(model));
        }
        if let Some((key, hash)) = &job.idempotency {
            let first = training_job::Entity::find()
                .filter(training_job::Column::OrgId.eq(&job.org_id))
                .filter(training_job::Column::IdempotencyKey.eq(key.as_str()))
                .one(db)
                .await?;
            if let Some(first) = first {
                return Ok(match first.request_hash.as_deref() == Some(hash.as_str()) {
                    true => Inserted::Replayed(first),
                    false => Inserted::KeyReused,
                });
            }
        }
        if let Some(unique_key) = &job.unique_key {
            let open = training_job::Entity::find()
                .filter(training_job::Column::OrgId.eq(&job.org_id))
                .filter(training_job::Column::UniqueKey.eq(unique_key.as_str()))
                .filter(training_job::Column::Status.is_in(OPEN))
                .one(db)
                .await?;
            if let Some(open) = open {
                return Ok(Inserted::Unique(open));
            }
        }
    }
    Err(DbErr::Custom(
        "a job's unique key kept conflicting with jobs that ended".into(),
    ))
}

/// Creates many jobs at once, all or none, in order: the ones without a unique key in
/// multi-row statements, each with one as [`insert_keyed`] does (an earlier item of the
/// batch with the same key counts).
pub async fn insert_batch(db: &impl TransactionTrait, jobs: Vec<NewJob>) -> Result<Vec<Inserted>, DbErr> {
    let txn = db.begin().await?;
    let now = Utc::now();
    let mut results: Vec<Option<Inserted>> = Vec::with_capacity(jobs.len());
    let mut plain = Vec::new();
    for job in jobs {
        if job.unique_key.is_some() || job.idempotency.is_some() {
            results.push(Some(insert_keyed(&txn, job).await?));
        } else {
            plain.push((results.len(), queued_job(job, now)));
            results.push(None);
        }
    }
    // 500 rows of the table's columns stay under both databases' bound-parameter limits.
    for chunk in plain.chunks(500) {
        training_job::Entity::insert_many(
            chunk
                .iter()
                .map(|(_, model)| training_job::ActiveModel::from(model.clone())),
        )
        .exec_without_returning(&txn)
        .await?;
    }
    txn.commit().await?;
    for (index, model) in plain {
        results[index] = Some(Inserted::New(model));
    }
    Ok(results.into_iter().flatten().collect())
}

#[derive(Default)]
pub struct JobFilter {
    pub project_id: Option<String>,
    pub training_task_id: Option<String>,
    /// Any of these (none: any status).
    pub status: Vec<JobStatus>,
    pub action: Option<JobAction>,
    /// Keyset paging: only jobs older than this `(created_at, id)`.
    pub before: Option<(DateTime<Utc>, JobId)>,
}

pub async fn list_jobs(
    db: &impl ConnectionTrait,
    org_ids: &[OrgId],
    filter: &JobFilter,
    limit: u64,
) -> Result<Vec<training_job::Model>, DbErr> {
    if org_ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut query = training_job::Entity::find()
        .filter(training_job::Column::OrgId.is_in(org_ids.iter().map(OrgId::to_string)));
    if let Some(project) = &filter.project_id {
        query = query.filter(training_job::Column::ProjectId.eq(project.as_str()));
    }
    if let Some(task) = &filter.training_task_id {
        query = query.filter(training_job::Column::TrainingTaskId.eq(task.as_str()));
    }
    if !filter.status.is_empty() {
        query = query.filter(training_job::Column::Status.is_in(filter.status.iter().map(|s| s.as_str())));
    }
    if let Some(action) = filter.action {
        query = query.filter(training_job::Column::Action.eq(action.as_str()));
    }
    if let Some((at, id)) = &filter.before {
        query = query.filter(
            Condition::any().add(training_job::Column::CreatedAt.lt(*at)).add(
                Condition::all()
                    .add(training_job::Column::CreatedAt.eq(*at))
                    .add(training_job::Column::Id.lt(id.as_str())),
            ),
        );
    }
    query
        .order_by_desc(training_job::Column::CreatedAt)
        .order_by_desc(training_job::Column::Id)
        .limit(limit)
        .all(db)
        .await
}

pub async fn find_job(
    db: &impl ConnectionTrait,
    job_id: &JobId,
) -> Result<Option<training_job::Model>, DbErr> {
    training_job::Entity::find_by_id(job_id.to_owned()).one(db).await
}

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
    let stopped = training_job::Entity::update_many()
        .col_expr(training_job::Column::Status, Expr::value(USER_STOPPED))
        .col_expr(training_job::Column::StopRequested, Expr::value(true))
        .col_expr(training_job::Column::Error, Expr::value(reason))
        .col_expr(training_job::Column::StopReason, Expr::value(reason))
        .col_expr(training_job::Column::FinishedAt, Expr::value(now))
        .col_expr(training_job::Column::UpdatedAt, Expr::value(now))
        .filter(training_job::Column::Id.eq(job_id))
        .filter(training_job::Column::Status.is_in([QUEUED, SCHEDULED]))
        .exec(&txn)
        .await?;
    training_job::Entity::update_many()
        .col_expr(training_job::Column::Status, Expr::value(STOPPING))
        .col_expr(training_job::Column::StopRequested, Expr::value(true))
        .col_expr(training_job::Column::StopReason, Expr::value(reason))
        .col_expr(training_job::Column::UpdatedAt, Expr::value(now))
        .filter(training_job::Column::Id.eq(job_id))
        .filter(training_job::Column::Status.eq(RUNNING))
        .exec(&txn)
        .await?;
    if stopped.rows_affected > 0 {
        super::events::announce_ended(&txn, std::slice::from_ref(job_id)).await?;
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

/// The key of the PostgreSQL advisory lock under which claims of every instance take turns
/// (shares and caps are decided from what the claims before left).
const CLAIM_LOCK: i64 = 0x6b65_656c_636c_6169; // "keelclai"

/// Hands up to `limit` queued jobs of `action` to `worker_id`. Across organizations in
/// proportion to their weights over successive claims ([`super::shares`]), never past an
/// organization's running cap (its own, else `default_cap`; 0: none); within one, most
/// urgent (lowest priority) first, then oldest. On PostgreSQL the claim's transaction takes
/// the claims' advisory lock first, and `FOR UPDATE SKIP LOCKED` with the `status =
/// 'queued'` condition makes a job go to one worker only.
///
/// Answers the claimed jobs and the open transaction that claimed them: the caller commits
/// it (or rolls it back, taking nothing). On SQLite what is read comes before the
/// transaction (its first statement must write, else it cannot wait for the write lock);
/// one instance's claims take turns, so nothing read can change in a way that matters.
pub async fn claim(
    db: &DatabaseConnection,
    worker_id: &str,
    action: JobAction,
    limit: u32,
    default_cap: u32,
) -> Result<(DatabaseTransaction, Vec<training_job::Model>), DbErr> {
    let backend = db.get_database_backend();
    let locked = match backend {
        DbBackend::Postgres => {
            let txn = db.begin().await?;
            txn.execute_raw(Statement::from_sql_and_values(
                backend,
                "SELECT pg_advisory_xact_lock($1)",
                [CLAIM_LOCK.into()],
            ))
            .await?;
            Some(txn)
        }
        _ => None,
    };
    let allotted = match &locked {
        Some(txn) => allot_claim(txn, action, limit, default_cap).await?,
        None => allot_claim(db, action, limit, default_cap).await?,
    };
    let txn = match locked {
        Some(txn) => txn,
        None => db.begin().await?,
    };
    let mut jobs = match backend {
        // The claim and the passes it moves in one statement.
        DbBackend::Postgres if !allotted.is_empty() => {
            claim_allotted_pg(&txn, worker_id, action, &allotted).await?
        }
        DbBackend::Postgres => Vec::new(),
        _ => {
            let wanted: Vec<&Allotment> = allotted.iter().filter(|a| a.jobs > 0).collect();
            let jobs = match wanted.is_empty() {
                true => Vec::new(),
                false => claim_allotted_sqlite(&txn, worker_id, action, &wanted).await?,
            };
            let mut handed: HashMap<OrgId, i64> = HashMap::new();
            for job in &jobs {
                *handed.entry(job.org_id.clone()).or_default() += 1;
            }
            save_passes(&txn, action, &allotted, &handed).await?;
            jobs
        }
    };
    jobs.sort_by(|a, b| {
        (a.priority, a.created_at)
            .cmp(&(b.priority, b.created_at))
            .then_with(|| a.id.cmp(&b.id))
    });
    Ok((txn, jobs))
}

/// How a claim of `limit` splits among the organizations with queued jobs of `action`.
async fn allot_claim(
    db: &impl ConnectionTrait,
    action: JobAction,
    limit: u32,
    default_cap: u32,
) -> Result<Vec<Allotment>, DbErr> {
    let backlog = backlog(db, action, limit).await?;
    if backlog.is_empty() {
        return Ok(Vec::new());
    }
    let cap_of = |b: &Backlogged| b.max_running.map_or(i64::from(default_cap), i64::from);
    let capped: Vec<OrgId> = backlog
        .iter()
        .filter(|b| cap_of(b) > 0)
        .map(|b| b.org_id.clone())
        .collect();
    let running = running_counts(db, &capped).await?;
    let contenders: Vec<Contender> = backlog
        .iter()
        .map(|b| {
            let room = match cap_of(b) {
                0 => i64::MAX,
                cap => Ord::max(cap - running.get(&b.org_id).copied().unwrap_or(0), 0),
            };
            Contender {
                org_id: b.org_id.clone(),
                weight: b.weight.unwrap_or(1),
                available: Ord::min(b.queued, room),
                pass: b.pass,
            }
        })
        .collect();
    Ok(allot(&contenders, limit))
}

/// An organization with queued jobs of the action being claimed.
struct Backlogged {
    org_id: OrgId,
    /// Its queued jobs of the action, counted up to the claim's limit.
    queued: i64,
    weight: Option<i32>,
    max_running: Option<i32>,
    pass: Option<f64>,
}

/// The claim index's order (migration `m20261126_000003`), unqualified and for alias `t`.
const CLAIM_ORDER: &str = "action, org_id, priority, created_at, id";
const CLAIM_ORDER_T: &str = "t.action, t.org_id, t.priority, t.created_at, t.id";

/// Every organization with queued jobs of `action`, with its settings and its pass; none
/// while the action is paused.
async fn backlog(db: &impl ConnectionTrait, action: JobAction, limit: u32) -> Result<Vec<Backlogged>, DbErr> {
    let backend = db.get_database_backend();
    // Every probe is ordered as the claim index is, so the planner reads that index (its
    // queued jobs only): ordered by fewer columns, PostgreSQL took the organization's index
    // and walked past every finished job of the organization, each claim.
    let counted = "(SELECT count(*) FROM (SELECT 1 FROM training_jobs t WHERE t.org_id = o.org_id \
        AND t.action = {action} AND t.status = {queued} ORDER BY {claim_order_t} LIMIT {limit}) x)";
    let joined = "LEFT JOIN queue_org_settings s ON s.org_id = o.org_id \
        LEFT JOIN queue_shares q ON q.action = {action} AND q.org_id = o.org_id";
    // A paused action has no backlog to hand out (decision 93).
    let not_paused = "NOT EXISTS (SELECT 1 FROM queue_pauses WHERE action = {action})";
    let (sql, values): (String, Vec<Value>) = match backend {
        // One index probe per organization (a loose index scan), as the claim index allows.
        DbBackend::Postgres => (
            with_statuses(
                &format!(
                    "WITH RECURSIVE orgs(org_id) AS (\
                    (SELECT org_id FROM training_jobs WHERE action = $1 AND status = {{queued}} \
                        ORDER BY {{claim_order}} LIMIT 1) \
                    UNION ALL \
                    SELECT (SELECT t.org_id FROM training_jobs t WHERE t.action = $1 AND t.status = {{queued}} \
                        AND t.org_id > orgs.org_id ORDER BY {{claim_order_t}} LIMIT 1) \
                    FROM orgs WHERE orgs.org_id IS NOT NULL) \
                 SELECT o.org_id, {counted} AS queued, s.weight, s.max_running, q.pass \
                 FROM orgs o {joined} WHERE o.org_id IS NOT NULL AND {not_paused}"
                )
                .replace("{action}", "$1")
                .replace("{limit}", "$2")
                .replace("{claim_order_t}", CLAIM_ORDER_T)
                .replace("{claim_order}", CLAIM_ORDER),
            ),
            vec![action.as_str().into(), i64::from(limit).into()],
        ),
        _ => (
            with_statuses(
                &format!(
                    "SELECT o.org_id, {counted} AS queued, s.weight, s.max_running, q.pass \
                 FROM (SELECT DISTINCT org_id FROM training_jobs WHERE action = ?1 AND status = {{queued}}) o \
                 {joined} WHERE {not_paused}"
                )
                .replace("{action}", "?1")
                .replace("{limit}", "?2")
                .replace("{claim_order_t}", CLAIM_ORDER_T),
            ),
            vec![action.as_str().into(), i64::from(limit).into()],
        ),
    };
    db.query_all_raw(Statement::from_sql_and_values(backend, sql, values))
        .await?
        .into_iter()
        .map(|row| {
            Ok(Backlogged {
                org_id: row.try_get_by_index(0)?,
                queued: row.try_get_by_index(1)?,
                weight: row.try_get_by_index(2)?,
                max_running: row.try_get_by_index(3)?,
                pass: row.try_get_by_index(4)?,
            })
        })
        .collect()
}

/// Held jobs (running or stopping, of any action) per organization, for `org_ids`.
async fn running_counts(db: &impl ConnectionTrait, org_ids: &[OrgId]) -> Result<HashMap<OrgId, i64>, DbErr> {
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

/// Claims each organization's allotted number of its most urgent queued jobs of `action`
/// (PostgreSQL): each organization's first `n` jobs by the claim index, locked as they are
/// read (skipping rows another transaction holds) and updated by `ctid`; in the same
/// statement, the passes of the organizations handed jobs (or placed for the first time)
/// move by what each was actually handed.
async fn claim_allotted_pg(
    db: &impl ConnectionTrait,
    worker_id: &str,
    action: JobAction,
    allotted: &[Allotment],
) -> Result<Vec<training_job::Model>, DbErr> {
    let plan: Vec<serde_json::Value> = allotted
        .iter()
        .map(|a| json!({"org_id": a.org_id, "n": a.jobs, "pass": a.pass, "weight": a.weight, "first": a.first}))
        .collect();
    let sql = with_statuses(
        "WITH p AS (SELECT * FROM jsonb_to_recordset($1) \
                AS p(org_id text, n bigint, pass float8, weight int, first boolean)), \
         heads AS (SELECT h.ctid FROM p CROSS JOIN LATERAL (\
            SELECT t.ctid FROM training_jobs t \
            WHERE t.org_id = p.org_id AND t.action = $2 AND t.status = {queued} AND p.n > 0 \
            ORDER BY t.action, t.org_id, t.priority, t.created_at, t.id LIMIT p.n FOR UPDATE SKIP LOCKED) h), \
         u AS (UPDATE training_jobs SET status = {running}, worker_id = $3, attempts = attempts + 1, \
            claimed_at = $4, heartbeat_at = $4, updated_at = $4, stop_requested = false \
            WHERE ctid = ANY(ARRAY(SELECT ctid FROM heads)) AND status = {queued} RETURNING *), \
         handed AS (SELECT org_id, count(*) AS n FROM u GROUP BY org_id), \
         saved AS (INSERT INTO queue_shares (action, org_id, pass) \
            SELECT $2, p.org_id, p.pass + COALESCE(handed.n, 0)::float8 / GREATEST(p.weight, 1) \
            FROM p LEFT JOIN handed ON handed.org_id = p.org_id WHERE handed.n > 0 OR p.first \
            ON CONFLICT (action, org_id) DO UPDATE SET pass = excluded.pass) \
         SELECT * FROM u",
    );
    let values: Vec<Value> = vec![
        serde_json::Value::Array(plan).into(),
        action.as_str().into(),
        worker_id.into(),
        Utc::now().into(),
    ];
    training_job::Entity::find()
        .from_raw_sql(Statement::from_sql_and_values(DbBackend::Postgres, sql, values))
        .all(db)
        .await
}

/// Claims each organization's allotted number of its most urgent queued jobs of `action`
/// (SQLite): one index range per organization, its first `n` jobs.
async fn claim_allotted_sqlite(
    db: &impl ConnectionTrait,
    worker_id: &str,
    action: JobAction,
    allotted: &[&Allotment],
) -> Result<Vec<training_job::Model>, DbErr> {
    let now = Utc::now();
    let mut values: Vec<Value> = vec![worker_id.into(), now.into(), now.into(), now.into()];
    let heads: Vec<String> = allotted
        .iter()
        .map(|a| {
            values.push(a.org_id.as_str().into());
            values.push(action.as_str().into());
            values.push(a.jobs.into());
            with_statuses(
                "SELECT id FROM (SELECT id FROM training_jobs WHERE org_id = ? AND action = ? \
                 AND status = {queued} ORDER BY priority, created_at, id LIMIT ?)",
            )
        })
        .collect();
    let sql = with_statuses(&format!(
        "UPDATE training_jobs SET status = {{running}}, worker_id = ?, attempts = attempts + 1, \
            claimed_at = ?, heartbeat_at = ?, updated_at = ?, stop_requested = 0 \
         WHERE status = {{queued}} AND id IN ({}) RETURNING *",
        heads.join(" UNION ALL ")
    ));
    training_job::Entity::find()
        .from_raw_sql(Statement::from_sql_and_values(DbBackend::Sqlite, sql, values))
        .all(db)
        .await
}

/// Keeps the passes of the organizations this claim handed jobs (and of those it placed
/// for the first time): SQLite's half of what [`claim_allotted_pg`] does in its statement.
async fn save_passes(
    db: &impl ConnectionTrait,
    action: JobAction,
    allotted: &[Allotment],
    handed: &HashMap<OrgId, i64>,
) -> Result<(), DbErr> {
    let rows: Vec<queue_share::ActiveModel> = allotted
        .iter()
        .filter_map(|a| {
            let jobs = handed.get(&a.org_id).copied().unwrap_or(0);
            (jobs > 0 || a.first).then(|| queue_share::ActiveModel {
                action: Set(action),
                org_id: Set(a.org_id.clone()),
                pass: Set(a.pass_after(jobs)),
            })
        })
        .collect();
    for chunk in rows.chunks(500) {
        queue_share::Entity::insert_many(chunk.to_vec())
            .on_conflict(
                OnConflict::columns([queue_share::Column::Action, queue_share::Column::OrgId])
                    .update_column(queue_share::Column::Pass)
                    .to_owned(),
            )
            .exec_without_returning(db)
            .await?;
    }
    Ok(())
}

/// Queues every scheduled job due by `now`; answers the actions of the jobs it queued.
pub async fn promote_due(db: &impl ConnectionTrait, now: DateTime<Utc>) -> Result<Vec<JobAction>, DbErr> {
    let promoted = training_job::Entity::update_many()
        .col_expr(training_job::Column::Status, Expr::value(QUEUED))
        .col_expr(training_job::Column::QueuedAt, Expr::value(now))
        .col_expr(training_job::Column::UpdatedAt, Expr::value(now))
        .filter(training_job::Column::Status.eq(SCHEDULED))
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
        .filter(training_job::Column::Status.eq(SCHEDULED))
        .order_by_asc(training_job::Column::ScheduledAt)
        .limit(1)
        .into_tuple::<Option<DateTime<Utc>>>()
        .one(db)
        .await
        .map(Option::flatten)
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
    training_job::Entity::update_many()
        .col_expr(training_job::Column::Status, Expr::value(QUEUED))
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
        .filter(training_job::Column::Status.is_in([FAILED, BLOCKED, USER_STOPPED]))
        .exec_with_returning(db)
        .await
}

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
    pub row: training_job_attempt::Model,
}

impl EndedAttempt {
    fn of(
        job: &training_job::Model,
        worker_id: Option<String>,
        outcome: AttemptOutcome,
        error: Option<String>,
        now: DateTime<Utc>,
    ) -> Self {
        Self {
            action: job.action,
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
async fn record_attempts(db: &impl ConnectionTrait, ended: &[EndedAttempt]) -> Result<(), DbErr> {
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
        let updated = training_job::Entity::update_many()
            .col_expr(training_job::Column::Status, Expr::value(SCHEDULED))
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
            .filter(running())
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
) -> Result<(Vec<ReportOutcome>, Vec<EndedAttempt>), DbErr> {
    if reports.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let now = Utc::now();
    let retrying = reports
        .iter()
        .any(|r| r.retryable && r.status == JobStatus::Failed);
    if db.get_database_backend() == DbBackend::Postgres && !retrying {
        let all: Vec<&Report> = reports.iter().collect();
        let (mut ended, _) = end_reported(db, &all, now, Announced::NotHere).await?;
        let done: std::collections::HashSet<JobId> = ended.iter().map(|e| e.row.job_id.clone()).collect();
        let rest: Vec<Report> = reports
            .iter()
            .filter(|r| !done.contains(&r.job_id))
            .cloned()
            .collect();
        if rest.is_empty() {
            return Ok((vec![ReportOutcome::Applied; reports.len()], ended));
        }
        // Jobs of organizations with endpoints (or not held: the transaction tells which).
        let (rest_outcomes, rest_ended) = apply_in_transaction(db, &rest, policy, now).await?;
        ended.extend(rest_ended);
        let mut by_id: HashMap<&JobId, ReportOutcome> =
            rest.iter().map(|r| &r.job_id).zip(rest_outcomes).collect();
        let outcomes = reports
            .iter()
            .map(|r| by_id.remove(&r.job_id).unwrap_or(ReportOutcome::Applied))
            .collect();
        return Ok((outcomes, ended));
    }
    apply_in_transaction(db, reports, policy, now).await
}

/// Whether `end_reported` ends jobs whose organization has an enabled webhook endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Announced {
    /// Ends them too: the caller's transaction writes their events.
    Here,
    /// Leaves them (a statement on its own cannot write their events).
    NotHere,
}

/// `apply_reports` in one transaction, the job events with the changes.
async fn apply_in_transaction(
    db: &DatabaseConnection,
    reports: &[Report],
    policy: &RetryPolicy,
    now: DateTime<Utc>,
) -> Result<(Vec<ReportOutcome>, Vec<EndedAttempt>), DbErr> {
    let txn = db.begin().await?;
    let mut ended: Vec<EndedAttempt> = retry_failures(&txn, reports, policy, now)
        .await?
        .into_iter()
        .map(|(_, attempt)| attempt)
        .collect();
    let retried: std::collections::HashSet<JobId> = ended.iter().map(|e| e.row.job_id.clone()).collect();
    let rest: Vec<&Report> = reports.iter().filter(|r| !retried.contains(&r.job_id)).collect();
    let (reported, recorded) = end_reported(&txn, &rest, now, Announced::Here).await?;
    record_attempts(&txn, &ended).await?;
    if !recorded {
        record_attempts(&txn, &reported).await?;
    }
    let ended_ids: Vec<JobId> = reported.iter().map(|e| e.row.job_id.clone()).collect();
    super::events::announce_ended(&txn, &ended_ids).await?;
    ended.extend(reported);
    let outcomes = outcomes_of(&txn, reports, &ended).await?;
    txn.commit().await?;
    Ok((outcomes, ended))
}

/// Ends the reported jobs that their workers hold, in one statement, and answers the
/// attempts that ended, with whether the statement wrote their history rows itself (on
/// PostgreSQL, by a data-modifying CTE; on SQLite the caller writes them).
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
) -> Result<(Vec<EndedAttempt>, bool), DbErr> {
    let backend = db.get_database_backend();
    let postgres = backend == DbBackend::Postgres;
    if reports.is_empty() {
        return Ok((Vec::new(), postgres));
    }
    let rows: Vec<serde_json::Value> = reports
        .iter()
        .map(|r| json!({"id": r.job_id, "worker_id": r.worker_id, "status": r.status, "result": r.result, "error": r.error}))
        .collect();
    // A report's status is its attempt's outcome (succeeded, blocked, user_stopped, failed).
    let (sql, values): (String, Vec<Value>) = match postgres {
        true => (
            with_statuses(
                "WITH u AS (UPDATE training_jobs AS j SET status = r.status, result = r.result, error = r.error, \
                    finished_at = $2, updated_at = $2 \
                 FROM jsonb_to_recordset($1) AS r(id text, worker_id text, status text, result text, error text) \
                 WHERE j.id = ANY(ARRAY(SELECT x->>'id' FROM jsonb_array_elements($1) AS x)) \
                   AND j.id = r.id AND j.worker_id = r.worker_id AND j.status || '' IN ({running}, {stopping}) \
                   {unannounced} \
                 RETURNING j.id, j.attempts, j.claimed_at, j.action, r.worker_id, r.status, r.error, j.refusals), \
                 h AS (INSERT INTO training_job_attempts (job_id, ordinal, attempt, worker_id, claimed_at, ended_at, outcome, error) \
                    SELECT id, attempts + refusals, attempts, worker_id, claimed_at, $2, status, error FROM u \
                    ON CONFLICT (job_id, ordinal) DO NOTHING) \
                 SELECT id, attempts, claimed_at, action, refusals FROM u",
            )
            .replace(
                "{unannounced}",
                match announced {
                    Announced::Here => "",
                    Announced::NotHere => {
                        "AND NOT EXISTS (SELECT 1 FROM webhook_endpoints e WHERE e.org_id = j.org_id AND e.enabled)"
                    }
                },
            ),
            vec![serde_json::Value::Array(rows).into(), now.into()],
        ),
        false => (
            with_statuses("UPDATE training_jobs SET status = r.status, result = r.result, error = r.error, \
                finished_at = ?, updated_at = ? \
             FROM (SELECT json_extract(value, '$.id') AS id, json_extract(value, '$.worker_id') AS worker_id, \
                          json_extract(value, '$.status') AS status, json_extract(value, '$.result') AS result, \
                          json_extract(value, '$.error') AS error FROM json_each(?)) AS r \
             WHERE training_jobs.id = r.id AND training_jobs.worker_id = r.worker_id \
               AND +training_jobs.status IN ({running}, {stopping}) \
             RETURNING training_jobs.id, training_jobs.attempts, training_jobs.claimed_at, training_jobs.action, \
                training_jobs.refusals"),
            vec![now.into(), now.into(), serde_json::Value::Array(rows).to_string().into()],
        ),
    };
    let by_id: HashMap<&JobId, &Report> = reports.iter().map(|r| (&r.job_id, *r)).collect();
    let mut ended = Vec::new();
    for row in db
        .query_all_raw(Statement::from_sql_and_values(backend, sql, values))
        .await?
    {
        let job_id: JobId = row.try_get_by_index(0)?;
        if let Some(report) = by_id.get(&job_id) {
            ended.push(ended_by_report(row, job_id, report, now)?);
        }
    }
    Ok((ended, postgres))
}

/// The attempt a report ended, from the update's `RETURNING id, attempts, claimed_at, action,
/// refusals`.
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
        (current, super::history::histories(db, &missing).await?)
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

/// Puts claimed jobs back in the queue (their fee could not be settled now).
pub async fn release_claims(
    db: &impl ConnectionTrait,
    job_ids: &[JobId],
    worker_id: &str,
) -> Result<(), DbErr> {
    if job_ids.is_empty() {
        return Ok(());
    }
    training_job::Entity::update_many()
        .col_expr(training_job::Column::Status, Expr::value(QUEUED))
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
        .filter(training_job::Column::Status.eq(RUNNING))
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
    let blocked = training_job::Entity::update_many()
        .col_expr(training_job::Column::Status, Expr::value(BLOCKED))
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
        .filter(training_job::Column::Status.eq(RUNNING))
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
    super::events::announce_ended(&txn, &ids).await?;
    txn.commit().await?;
    Ok(ended)
}

/// The organization's jobs blocked at their claim for want of funds go back to the queue
/// (a job a worker reported blocked is not touched); answers their actions.
pub async fn requeue_blocked_for_funds(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
) -> Result<Vec<JobAction>, DbErr> {
    let now = Utc::now();
    let requeued = training_job::Entity::update_many()
        .col_expr(training_job::Column::Status, Expr::value(QUEUED))
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
        .filter(training_job::Column::Status.eq(BLOCKED))
        .filter(training_job::Column::BlockedForFunds.eq(true))
        .exec_with_returning(db)
        .await?;
    let mut actions: Vec<JobAction> = requeued.into_iter().map(|job| job.action).collect();
    actions.sort_by_key(|a| a.as_str());
    actions.dedup();
    Ok(actions)
}

pub enum Held {
    Yes { stop_requested: bool },
    NotHeld,
    NotFound,
}

/// Applies `update` to the job only while `worker_id` holds it (running or stopping);
/// answers whether it did, and the job's stop request.
async fn update_held(
    db: &impl ConnectionTrait,
    job_id: &JobId,
    worker_id: &str,
    update: sea_orm::UpdateMany<training_job::Entity>,
) -> Result<Held, DbErr> {
    let updated = update
        .filter(training_job::Column::Id.eq(job_id))
        .filter(training_job::Column::WorkerId.eq(worker_id))
        .filter(training_job::Column::Status.is_in([RUNNING, STOPPING]))
        .exec(db)
        .await?
        .rows_affected;
    Ok(match find_job(db, job_id).await? {
        None => Held::NotFound,
        Some(_) if updated == 0 => Held::NotHeld,
        Some(job) => Held::Yes {
            stop_requested: job.stop_requested,
        },
    })
}

pub async fn heartbeat(db: &impl ConnectionTrait, job_id: &JobId, worker_id: &str) -> Result<Held, DbErr> {
    let update = training_job::Entity::update_many()
        .col_expr(training_job::Column::HeartbeatAt, Expr::value(Utc::now()));
    update_held(db, job_id, worker_id, update).await
}

pub async fn set_live_status(
    db: &impl ConnectionTrait,
    job_id: &JobId,
    worker_id: &str,
    live_status: &serde_json::Value,
) -> Result<Held, DbErr> {
    let update = training_job::Entity::update_many()
        .col_expr(
            training_job::Column::LiveStatus,
            Expr::value(live_status.to_string()),
        )
        .col_expr(training_job::Column::UpdatedAt, Expr::value(Utc::now()));
    update_held(db, job_id, worker_id, update).await
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
/// transaction.
pub async fn requeue_stale(
    db: &impl TransactionTrait,
    stale_after: Duration,
    max_attempts: i32,
) -> Result<(SweepCounts, Vec<EndedAttempt>), DbErr> {
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
    let stopped = training_job::Entity::update_many()
        .col_expr(training_job::Column::Status, Expr::value(USER_STOPPED))
        .col_expr(training_job::Column::FinishedAt, Expr::value(now))
        .col_expr(training_job::Column::UpdatedAt, Expr::value(now))
        .filter(held().add(Expr::cust(IS_STOPPING.as_str())))
        .filter(stale())
        .exec_with_returning(&txn)
        .await?;
    const NO_HEARTBEAT: &str = "no heartbeat from the worker and no attempts left";
    let failed = training_job::Entity::update_many()
        .col_expr(training_job::Column::Status, Expr::value(FAILED))
        .col_expr(training_job::Column::Error, Expr::value(NO_HEARTBEAT))
        .col_expr(training_job::Column::FinishedAt, Expr::value(now))
        .col_expr(training_job::Column::UpdatedAt, Expr::value(now))
        .filter(running())
        .filter(training_job::Column::Attempts.gte(max_attempts))
        .filter(stale())
        .exec_with_returning(&txn)
        .await?;
    // The worker's id stays on the row until its attempt is in the history, then goes.
    let requeued = training_job::Entity::update_many()
        .col_expr(training_job::Column::Status, Expr::value(QUEUED))
        .col_expr(
            training_job::Column::HeartbeatAt,
            Expr::value(Option::<DateTime<Utc>>::None),
        )
        .col_expr(training_job::Column::QueuedAt, Expr::value(now))
        .col_expr(training_job::Column::UpdatedAt, Expr::value(now))
        .filter(running())
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
    let ended_ids: Vec<JobId> = stopped.iter().chain(&failed).map(|job| job.id.clone()).collect();
    super::events::announce_ended(&txn, &ended_ids).await?;
    txn.commit().await?;
    Ok((
        SweepCounts {
            requeued: requeued.len() as u64,
            failed: failed.len() as u64,
            stopped: stopped.len() as u64,
        },
        ended,
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
        .filter(training_job::Column::Status.eq(QUEUED))
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
    let requeued = training_job::Entity::update_many()
        .col_expr(training_job::Column::Status, Expr::value(QUEUED))
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
        .filter(held())
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

/// One change to an organization's training secrets: a sealed value to store, or `None` to
/// delete the name.
pub struct SecretChange {
    pub name: String,
    pub sealed: Option<String>,
}

/// Applies every change in one transaction (all or none) and answers every name the
/// organization has afterwards, in order.
pub async fn apply_secret_changes(
    db: &impl TransactionTrait,
    org_id: &OrgId,
    changes: Vec<SecretChange>,
) -> Result<Vec<String>, DbErr> {
    let txn = db.begin().await?;
    let now = Utc::now();
    for change in changes {
        match change.sealed {
            None => {
                org_secret::Entity::delete_by_id((org_id.to_owned(), change.name))
                    .exec(&txn)
                    .await?;
            }
            Some(sealed) => {
                org_secret::Entity::insert(org_secret::ActiveModel {
                    org_id: Set(org_id.to_owned()),
                    name: Set(change.name),
                    sealed: Set(sealed),
                    updated_at: Set(now),
                })
                .on_conflict(
                    OnConflict::columns([org_secret::Column::OrgId, org_secret::Column::Name])
                        .update_columns([org_secret::Column::Sealed, org_secret::Column::UpdatedAt])
                        .to_owned(),
                )
                .exec_without_returning(&txn)
                .await?;
            }
        }
    }
    let names = org_secret::Entity::find()
        .filter(org_secret::Column::OrgId.eq(org_id))
        .order_by_asc(org_secret::Column::Name)
        .all(&txn)
        .await?
        .into_iter()
        .map(|s| s.name)
        .collect();
    txn.commit().await?;
    Ok(names)
}

/// The organization's sealed secrets.
pub async fn sealed_secrets(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
) -> Result<Vec<org_secret::Model>, DbErr> {
    org_secret::Entity::find()
        .filter(org_secret::Column::OrgId.eq(org_id))
        .all(db)
        .await
}

/// Jobs counted per `(action, status)`, over every organization.
pub async fn counts_by_action_status(db: &impl ConnectionTrait) -> Result<Vec<(String, String, i64)>, DbErr> {
    training_job::Entity::find()
        .select_only()
        .column(training_job::Column::Action)
        .column(training_job::Column::Status)
        .column_as(Expr::col(training_job::Column::Id).count(), "jobs")
        .group_by(training_job::Column::Action)
        .group_by(training_job::Column::Status)
        .into_tuple()
        .all(db)
        .await
}

/// When the longest-waiting queued job of each action became claimable.
pub async fn oldest_queued(db: &impl ConnectionTrait) -> Result<Vec<(String, DateTime<Utc>)>, DbErr> {
    let mut oldest = Vec::new();
    // One probe per action of the waiting index, from the longest-waiting job on.
    for action in JobAction::NAMES {
        let first: Option<Option<DateTime<Utc>>> = training_job::Entity::find()
            .select_only()
            .column(training_job::Column::QueuedAt)
            .filter(training_job::Column::Action.eq(action))
            .filter(Expr::cust(with_statuses("status = {queued}")))
            .filter(training_job::Column::QueuedAt.is_not_null())
            .order_by_asc(training_job::Column::QueuedAt)
            .limit(1)
            .into_tuple()
            .one(db)
            .await?;
        if let Some(Some(at)) = first {
            oldest.push((action.to_owned(), at));
        }
    }
    Ok(oldest)
}

/// Held jobs (running or stopping) of every organization, by worker then age; at most `limit`.
pub async fn held_jobs(db: &impl ConnectionTrait, limit: u64) -> Result<Vec<training_job::Model>, DbErr> {
    training_job::Entity::find()
        .filter(held())
        .order_by_asc(training_job::Column::WorkerId)
        .order_by_asc(training_job::Column::ClaimedAt)
        .limit(limit)
        .all(db)
        .await
}

/// What an operator narrows failed jobs to.
#[derive(Debug, Clone, Default)]
pub struct FailedFilter {
    pub action: Option<JobAction>,
    pub org_id: Option<OrgId>,
    /// Words the error contains, as typed (case-insensitive, no pattern syntax).
    pub error_text: Option<String>,
}

/// `text`, lowercased, as a `LIKE` pattern (escape `!`) matching it anywhere, its `%`, `_`
/// and `!` taken literally.
fn contains_pattern(text: &str) -> String {
    let mut pattern = String::with_capacity(text.len() + 2);
    pattern.push('%');
    for c in text.to_lowercase().chars() {
        if matches!(c, '%' | '_' | '!') {
            pattern.push('!');
        }
        pattern.push(c);
    }
    pattern.push('%');
    pattern
}

/// Failed jobs of every organization, the latest to fail first; at most `limit`.
pub async fn failed_jobs(
    db: &impl ConnectionTrait,
    filter: &FailedFilter,
    limit: u64,
) -> Result<Vec<training_job::Model>, DbErr> {
    // Written as the partial index states it (`m20261126_000006`).
    let mut query = training_job::Entity::find().filter(Expr::cust("status = 'failed'"));
    if let Some(action) = filter.action {
        query = query.filter(training_job::Column::Action.eq(action.as_str()));
    }
    if let Some(org_id) = &filter.org_id {
        query = query.filter(training_job::Column::OrgId.eq(org_id.as_str()));
    }
    if let Some(text) = filter.error_text.as_deref().filter(|t| !t.is_empty()) {
        let error = Expr::expr(Func::lower(Expr::col(training_job::Column::Error)));
        query = query.filter(error.like(LikeExpr::new(contains_pattern(text)).escape('!')));
    }
    query
        .order_by_desc(training_job::Column::FinishedAt)
        .order_by_desc(training_job::Column::Id)
        .limit(limit)
        .all(db)
        .await
}

/// Attempts that ended since `since`, counted per `bucket_secs`-long bucket (seconds since
/// the epoch divided by `bucket_secs`) and outcome: `(bucket, outcome, attempts)`.
pub async fn ended_per_bucket(
    db: &impl ConnectionTrait,
    since: DateTime<Utc>,
    bucket_secs: i64,
) -> Result<Vec<(i64, String, i64)>, DbErr> {
    let backend = db.get_database_backend();
    let bucket = match backend {
        DbBackend::Postgres => "(FLOOR(EXTRACT(EPOCH FROM ended_at) / $1))::BIGINT",
        _ => "CAST(strftime('%s', ended_at) AS INTEGER) / ?1",
    };
    let since_param = match backend {
        DbBackend::Postgres => "$2",
        _ => "?2",
    };
    let sql = format!(
        "SELECT {bucket} AS bucket, outcome, COUNT(*) AS attempts FROM training_job_attempts \
         WHERE ended_at >= {since_param} GROUP BY 1, 2"
    );
    let rows = db
        .query_all_raw(Statement::from_sql_and_values(
            backend,
            sql,
            [Value::from(bucket_secs), Value::from(since)],
        ))
        .await?;
    rows.iter()
        .map(|row| {
            Ok((
                row.try_get::<i64>("", "bucket")?,
                row.try_get::<String>("", "outcome")?,
                row.try_get::<i64>("", "attempts")?,
            ))
        })
        .collect()
}

/// Queued and held jobs per organization: `(org id, status, count)`.
pub async fn open_counts_by_org(db: &impl ConnectionTrait) -> Result<Vec<(OrgId, JobStatus, i64)>, DbErr> {
    training_job::Entity::find()
        .select_only()
        .column(training_job::Column::OrgId)
        .column(training_job::Column::Status)
        .column_as(Expr::col(training_job::Column::Id).count(), "jobs")
        .filter(training_job::Column::Status.is_in([QUEUED, RUNNING, STOPPING]))
        .group_by(training_job::Column::OrgId)
        .group_by(training_job::Column::Status)
        .into_tuple()
        .all(db)
        .await
}

/// Pauses an action's queue (again: no change); answers nothing new.
pub async fn pause(db: &impl ConnectionTrait, action: JobAction) -> Result<(), DbErr> {
    queue_pause::Entity::insert(queue_pause::ActiveModel {
        action: Set(action),
        paused_at: Set(Utc::now()),
    })
    .on_conflict(
        OnConflict::column(queue_pause::Column::Action)
            .do_nothing()
            .to_owned(),
    )
    .exec_without_returning(db)
    .await?;
    Ok(())
}

/// Resumes an action's queue (not paused: no change).
pub async fn resume(db: &impl ConnectionTrait, action: JobAction) -> Result<(), DbErr> {
    queue_pause::Entity::delete_by_id(action).exec(db).await?;
    Ok(())
}

pub async fn is_paused(db: &impl ConnectionTrait, action: JobAction) -> Result<bool, DbErr> {
    Ok(queue_pause::Entity::find_by_id(action).one(db).await?.is_some())
}

pub async fn paused_actions(db: &impl ConnectionTrait) -> Result<Vec<JobAction>, DbErr> {
    Ok(queue_pause::Entity::find()
        .all(db)
        .await?
        .into_iter()
        .map(|p| p.action)
        .collect())
}

/// An operator's queue settings for one organization (none set: weight 1, the default cap).
pub async fn org_settings(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
) -> Result<Option<queue_org_setting::Model>, DbErr> {
    queue_org_setting::Entity::find_by_id(org_id.clone())
        .one(db)
        .await
}

/// Sets an organization's weight and cap (`None`: the default cap).
pub async fn set_org_settings(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    weight: i32,
    max_running: Option<i32>,
) -> Result<queue_org_setting::Model, DbErr> {
    let row = queue_org_setting::Model {
        org_id: org_id.clone(),
        weight,
        max_running,
        updated_at: Utc::now(),
    };
    queue_org_setting::Entity::insert(queue_org_setting::ActiveModel::from(row.clone()))
        .on_conflict(
            OnConflict::column(queue_org_setting::Column::OrgId)
                .update_columns([
                    queue_org_setting::Column::Weight,
                    queue_org_setting::Column::MaxRunning,
                    queue_org_setting::Column::UpdatedAt,
                ])
                .to_owned(),
        )
        .exec_without_returning(db)
        .await?;
    Ok(row)
}

/// Held jobs (running or stopping, of any action) of one organization.
pub async fn running_count(db: &impl ConnectionTrait, org_id: &OrgId) -> Result<i64, DbErr> {
    Ok(running_counts(db, std::slice::from_ref(org_id))
        .await?
        .get(org_id)
        .copied()
        .unwrap_or(0))
}

/// Every organization's settings an operator set.
pub async fn all_org_settings(db: &impl ConnectionTrait) -> Result<Vec<queue_org_setting::Model>, DbErr> {
    queue_org_setting::Entity::find().all(db).await
}
