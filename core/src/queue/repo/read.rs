//! Reads of jobs: pages, one job, counts and the operator's views.

use entities::training_job;
use sea_orm::sea_query::{Func, LikeExpr};
use sea_orm::{EntityTrait, QueryOrder, QuerySelect};

use super::*;

#[derive(Default)]
pub struct JobFilter {
    pub project_id: Option<String>,
    pub training_task_id: Option<String>,
    /// Any of these (none: any status).
    pub status: Vec<JobStatus>,
    pub action: Option<JobAction>,
    /// Only the jobs of this cron schedule (its ticks and runs now).
    pub schedule_id: Option<String>,
    /// Only the jobs of the pipeline this job is in: every job linked to it by dependencies,
    /// either way (itself included).
    pub pipeline: Option<String>,
    /// Keyset paging: only jobs older than this `(created_at, id)`.
    pub before: Option<(DateTime<Utc>, JobId)>,
}

/// The order of a console's page of jobs (the API's lists are newest first).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum JobSort {
    /// Newest created first.
    #[default]
    Created,
    /// Most recently changed first.
    Updated,
    /// Highest priority (the lowest number) first, then oldest queued first: the order
    /// claims take them in.
    Priority,
}

impl JobSort {
    pub const ALL: [JobSort; 3] = [JobSort::Created, JobSort::Updated, JobSort::Priority];

    pub fn as_str(self) -> &'static str {
        match self {
            JobSort::Created => "created",
            JobSort::Updated => "updated",
            JobSort::Priority => "priority",
        }
    }

    pub fn parse(raw: &str) -> Option<JobSort> {
        JobSort::ALL.into_iter().find(|s| s.as_str() == raw)
    }
}

/// The jobs of `org_ids` that `filter` keeps (its `before` included), in no order.
fn filtered(
    backend: DbBackend,
    org_ids: &[OrgId],
    filter: &JobFilter,
    with_status: bool,
) -> sea_orm::Select<training_job::Entity> {
    let mut query = training_job::Entity::find()
        .filter(training_job::Column::OrgId.is_in(org_ids.iter().map(OrgId::to_string)));
    if let Some(project) = &filter.project_id {
        query = query.filter(training_job::Column::ProjectId.eq(project.as_str()));
    }
    if let Some(task) = &filter.training_task_id {
        query = query.filter(training_job::Column::TrainingTaskId.eq(task.as_str()));
    }
    if with_status && !filter.status.is_empty() {
        query = query.filter(training_job::Column::Status.is_in(filter.status.iter().map(|s| s.as_str())));
    }
    if let Some(action) = filter.action {
        query = query.filter(training_job::Column::Action.eq(action.as_str()));
    }
    if let Some(schedule) = &filter.schedule_id {
        query = query.filter(training_job::Column::ScheduleId.eq(schedule.as_str()));
    }
    if let Some(job_id) = &filter.pipeline {
        query = query.filter(Expr::cust_with_values(
            format!(
                "\"training_jobs\".\"id\" IN ({})",
                super::pipeline::pipeline_ids_sql(backend)
            ),
            [job_id.as_str()],
        ));
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
    filtered(db.get_database_backend(), org_ids, filter, true)
        .order_by_desc(training_job::Column::CreatedAt)
        .order_by_desc(training_job::Column::Id)
        .limit(limit)
        .all(db)
        .await
}

/// A page of the jobs `filter` keeps in `sort`'s order: `limit` from `offset`.
pub async fn sorted_jobs(
    db: &impl ConnectionTrait,
    org_ids: &[OrgId],
    filter: &JobFilter,
    sort: JobSort,
    offset: u64,
    limit: u64,
) -> Result<Vec<training_job::Model>, DbErr> {
    if org_ids.is_empty() {
        return Ok(Vec::new());
    }
    let query = filtered(db.get_database_backend(), org_ids, filter, true);
    let query = match sort {
        JobSort::Created => query.order_by_desc(training_job::Column::CreatedAt),
        JobSort::Updated => query.order_by_desc(training_job::Column::UpdatedAt),
        JobSort::Priority => query
            .order_by_asc(training_job::Column::Priority)
            .order_by_asc(training_job::Column::CreatedAt),
    };
    query
        .order_by_desc(training_job::Column::Id)
        .offset(offset)
        .limit(limit)
        .all(db)
        .await
}

/// The ids of the jobs `filter` keeps, newest first, at most `limit`.
pub async fn job_ids_matching(
    db: &impl ConnectionTrait,
    org_ids: &[OrgId],
    filter: &JobFilter,
    limit: u64,
) -> Result<Vec<JobId>, DbErr> {
    if org_ids.is_empty() {
        return Ok(Vec::new());
    }
    filtered(db.get_database_backend(), org_ids, filter, true)
        .select_only()
        .column(training_job::Column::Id)
        .order_by_desc(training_job::Column::CreatedAt)
        .order_by_desc(training_job::Column::Id)
        .limit(limit)
        .into_tuple()
        .all(db)
        .await
}

/// The status of each of `ids` that is a job of one of `org_ids`.
pub async fn statuses_of(
    db: &impl ConnectionTrait,
    org_ids: &[OrgId],
    ids: &[JobId],
) -> Result<Vec<(JobId, JobStatus)>, DbErr> {
    let mut found = Vec::with_capacity(ids.len());
    if org_ids.is_empty() {
        return Ok(found);
    }
    for chunk in ids.chunks(500) {
        let rows: Vec<(JobId, String)> = training_job::Entity::find()
            .select_only()
            .column(training_job::Column::Id)
            .column(training_job::Column::Status)
            .filter(training_job::Column::OrgId.is_in(org_ids.iter().map(OrgId::to_string)))
            .filter(training_job::Column::Id.is_in(chunk.iter().cloned()))
            .into_tuple()
            .all(db)
            .await?;
        found.extend(
            rows.into_iter()
                .filter_map(|(id, status)| JobStatus::parse(&status).map(|s| (id, s))),
        );
    }
    Ok(found)
}

/// How many jobs `filter` keeps in each status, its own statuses set aside (the counts a
/// page shows beside its status choices).
pub async fn status_counts(
    db: &impl ConnectionTrait,
    org_ids: &[OrgId],
    filter: &JobFilter,
) -> Result<Vec<(JobStatus, u64)>, DbErr> {
    if org_ids.is_empty() {
        return Ok(Vec::new());
    }
    let rows: Vec<(String, i64)> = filtered(db.get_database_backend(), org_ids, filter, false)
        .select_only()
        .column(training_job::Column::Status)
        .column_as(Expr::col(training_job::Column::Id).count(), "jobs")
        .group_by(training_job::Column::Status)
        .into_tuple()
        .all(db)
        .await?;
    Ok(rows
        .into_iter()
        .filter_map(|(status, n)| JobStatus::parse(&status).map(|s| (s, u64::try_from(n).unwrap_or(0))))
        .collect())
}

pub async fn find_job(
    db: &impl ConnectionTrait,
    job_id: &JobId,
) -> Result<Option<training_job::Model>, DbErr> {
    training_job::Entity::find_by_id(job_id.to_owned()).one(db).await
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
            .filter(Expr::cust(statuses_sql("status", &[JobStatus::Queued])))
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
/// How many failed jobs `filter` keeps.
pub async fn count_failed(db: &impl ConnectionTrait, filter: &FailedFilter) -> Result<u64, DbErr> {
    use sea_orm::PaginatorTrait;
    failed_kept(filter).count(db).await
}

pub async fn failed_jobs(
    db: &impl ConnectionTrait,
    filter: &FailedFilter,
    offset: u64,
    limit: u64,
) -> Result<Vec<training_job::Model>, DbErr> {
    failed_kept(filter)
        .order_by_desc(training_job::Column::FinishedAt)
        .order_by_desc(training_job::Column::Id)
        .offset(offset)
        .limit(limit)
        .all(db)
        .await
}

/// The failed jobs `filter` keeps, in no order.
fn failed_kept(filter: &FailedFilter) -> sea_orm::Select<training_job::Entity> {
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
        .filter(
            training_job::Column::Status
                .is_in([JobStatus::Queued, JobStatus::Running, JobStatus::Stopping].map(JobStatus::as_str)),
        )
        .group_by(training_job::Column::OrgId)
        .group_by(training_job::Column::Status)
        .into_tuple()
        .all(db)
        .await
}
