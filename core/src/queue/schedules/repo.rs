//! The schedules' queries: rows, due ticks, tick rows and the jobs a schedule enqueued.

use chrono::{DateTime, Utc};
use entities::{training_job, training_schedule, training_schedule_tick};
use sea_orm::sea_query::{Expr, OnConflict};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DbErr, EntityTrait, PaginatorTrait, QueryFilter,
    QueryOrder, QuerySelect,
};

use crate::domain::{JobId, OrgId, ScheduleId};

/// One class of PostgreSQL's two-key advisory locks: an organization's schedule creates.
const CREATE_LOCKS: i32 = 0x6b65_656e;

/// Until the transaction ends, makes the organization's schedule creates take turns
/// (PostgreSQL: an advisory lock on the organization; SQLite: its write lock, one writer).
pub async fn lock_org_creates(db: &impl ConnectionTrait, org_id: &OrgId) -> Result<(), DbErr> {
    match db.get_database_backend() {
        sea_orm::DbBackend::Postgres => db
            .execute_raw(sea_orm::Statement::from_sql_and_values(
                sea_orm::DbBackend::Postgres,
                format!("SELECT pg_advisory_xact_lock({CREATE_LOCKS}, hashtext($1))"),
                [org_id.as_str().into()],
            ))
            .await
            .map(|_| ()),
        _ => db
            .execute_unprepared("UPDATE training_schedules SET enabled = enabled WHERE 0")
            .await
            .map(|_| ()),
    }
}

pub async fn count_in_org(db: &impl ConnectionTrait, org_id: &OrgId) -> Result<u64, DbErr> {
    training_schedule::Entity::find()
        .filter(training_schedule::Column::OrgId.eq(org_id))
        .count(db)
        .await
}

pub async fn insert(db: &impl ConnectionTrait, row: training_schedule::Model) -> Result<(), DbErr> {
    training_schedule::Entity::insert(training_schedule::ActiveModel::from(row))
        .exec_without_returning(db)
        .await
        .map(|_| ())
}

/// The schedules of `orgs`, oldest first.
pub async fn list(db: &impl ConnectionTrait, orgs: &[OrgId]) -> Result<Vec<training_schedule::Model>, DbErr> {
    training_schedule::Entity::find()
        .filter(training_schedule::Column::OrgId.is_in(orgs))
        .order_by_asc(training_schedule::Column::CreatedAt)
        .order_by_asc(training_schedule::Column::Id)
        .all(db)
        .await
}

pub async fn find_in_orgs(
    db: &impl ConnectionTrait,
    id: &ScheduleId,
    orgs: &[OrgId],
) -> Result<Option<training_schedule::Model>, DbErr> {
    training_schedule::Entity::find_by_id(id.clone())
        .filter(training_schedule::Column::OrgId.is_in(orgs))
        .one(db)
        .await
}

/// Writes a changed schedule: every field a change sets, and its next tick only when
/// `retimed` (else a tick moving it on meanwhile keeps its move).
pub async fn save(
    db: &impl ConnectionTrait,
    row: training_schedule::Model,
    retimed: bool,
) -> Result<(), DbErr> {
    use sea_orm::ActiveValue::{Set, Unchanged};
    let next_run_at = row.next_run_at;
    let mut active = training_schedule::ActiveModel::from(row).reset_all();
    active.id = Unchanged(active.id.unwrap());
    active.created_at = Unchanged(active.created_at.unwrap());
    active.last_tick_at = Unchanged(active.last_tick_at.unwrap());
    active.next_run_at = match retimed {
        true => Set(next_run_at),
        false => Unchanged(next_run_at),
    };
    active.update(db).await.map(|_| ())
}

pub async fn delete(db: &impl ConnectionTrait, id: &ScheduleId) -> Result<u64, DbErr> {
    training_schedule::Entity::delete_by_id(id.clone())
        .exec(db)
        .await
        .map(|done| done.rows_affected)
}

/// Enabled schedules whose next tick is at or before `now`, the most overdue first.
pub async fn due_ids(
    db: &impl ConnectionTrait,
    now: DateTime<Utc>,
    limit: u64,
) -> Result<Vec<ScheduleId>, DbErr> {
    training_schedule::Entity::find()
        .select_only()
        .column(training_schedule::Column::Id)
        .filter(training_schedule::Column::Enabled.eq(true))
        .filter(training_schedule::Column::NextRunAt.lte(now))
        .order_by_asc(training_schedule::Column::NextRunAt)
        .limit(limit)
        .into_tuple()
        .all(db)
        .await
}

/// The earliest next tick of an enabled schedule (what the tick loop sleeps until).
pub async fn next_due(db: &impl ConnectionTrait) -> Result<Option<DateTime<Utc>>, DbErr> {
    let earliest: Option<Option<DateTime<Utc>>> = training_schedule::Entity::find()
        .select_only()
        .column_as(training_schedule::Column::NextRunAt.min(), "earliest")
        .filter(training_schedule::Column::Enabled.eq(true))
        .into_tuple()
        .one(db)
        .await?;
    Ok(earliest.flatten())
}

/// The earliest tick due and not enqueued yet (`keel_schedule_lag_seconds`).
pub async fn oldest_due(db: &impl ConnectionTrait) -> Result<Option<DateTime<Utc>>, DbErr> {
    Ok(next_due(db).await?.filter(|at| *at <= Utc::now()))
}

/// A due schedule, locked until the transaction ends (PostgreSQL: one another instance holds
/// is skipped, not waited for); `None` once it is no longer due.
pub async fn lock_due(
    db: &impl ConnectionTrait,
    id: &ScheduleId,
    now: DateTime<Utc>,
) -> Result<Option<training_schedule::Model>, DbErr> {
    let mut query = training_schedule::Entity::find_by_id(id.clone())
        .filter(training_schedule::Column::Enabled.eq(true))
        .filter(training_schedule::Column::NextRunAt.lte(now));
    match db.get_database_backend() {
        sea_orm::DbBackend::Postgres => {
            query = query.lock_with_behavior(
                sea_orm::sea_query::LockType::Update,
                sea_orm::sea_query::LockBehavior::SkipLocked,
            );
        }
        // SQLite's write lock first (as `BEGIN IMMEDIATE` would): a transaction that read
        // before writing fails at its first write if another wrote meanwhile (the trace
        // writer, a report), where one that holds the lock waits its busy timeout.
        _ => {
            db.execute_unprepared("UPDATE training_schedules SET enabled = enabled WHERE 0")
                .await?;
        }
    }
    query.one(db).await
}

/// Records a tick as enqueued: `false` when it already was (the unique key).
pub async fn insert_tick(
    db: &impl ConnectionTrait,
    schedule_id: &ScheduleId,
    tick: DateTime<Utc>,
) -> Result<bool, DbErr> {
    let row = training_schedule_tick::Model {
        schedule_id: schedule_id.clone(),
        tick_at: tick,
        job_id: None,
        created_at: Utc::now(),
    };
    let inserted = training_schedule_tick::Entity::insert(training_schedule_tick::ActiveModel::from(row))
        .on_conflict(OnConflict::new().do_nothing().to_owned())
        .exec_without_returning(db)
        .await?;
    Ok(inserted > 0)
}

pub async fn set_tick_job(
    db: &impl ConnectionTrait,
    schedule_id: &ScheduleId,
    tick: DateTime<Utc>,
    job_id: &JobId,
) -> Result<(), DbErr> {
    training_schedule_tick::Entity::update_many()
        .col_expr(
            training_schedule_tick::Column::JobId,
            Expr::value(job_id.as_str()),
        )
        .filter(training_schedule_tick::Column::ScheduleId.eq(schedule_id))
        .filter(training_schedule_tick::Column::TickAt.eq(tick))
        .exec(db)
        .await
        .map(|_| ())
}

/// Moves a schedule's next tick on from `from` (the value it was read with): `false` when
/// something else moved it first.
pub async fn advance(
    db: &impl ConnectionTrait,
    id: &ScheduleId,
    from: DateTime<Utc>,
    next: Option<DateTime<Utc>>,
    last_tick: Option<DateTime<Utc>>,
) -> Result<bool, DbErr> {
    let mut update = training_schedule::Entity::update_many()
        .col_expr(training_schedule::Column::NextRunAt, Expr::value(next))
        .filter(training_schedule::Column::Id.eq(id))
        .filter(training_schedule::Column::NextRunAt.eq(from));
    if let Some(last) = last_tick {
        update = update.col_expr(training_schedule::Column::LastTickAt, Expr::value(last));
    }
    Ok(update.exec(db).await?.rows_affected == 1)
}

/// Deletes a schedule's tick rows but the newest `keep` (older ones can never be due again:
/// a schedule's next tick only moves forward).
pub async fn prune_ticks(db: &impl ConnectionTrait, id: &ScheduleId, keep: u64) -> Result<(), DbErr> {
    let oldest_kept: Option<DateTime<Utc>> = training_schedule_tick::Entity::find()
        .select_only()
        .column(training_schedule_tick::Column::TickAt)
        .filter(training_schedule_tick::Column::ScheduleId.eq(id))
        .order_by_desc(training_schedule_tick::Column::TickAt)
        .offset(keep - 1)
        .limit(1)
        .into_tuple()
        .one(db)
        .await?;
    if let Some(oldest_kept) = oldest_kept {
        training_schedule_tick::Entity::delete_many()
            .filter(training_schedule_tick::Column::ScheduleId.eq(id))
            .filter(training_schedule_tick::Column::TickAt.lt(oldest_kept))
            .exec(db)
            .await?;
    }
    Ok(())
}

/// The jobs a schedule enqueued, newest first.
pub async fn recent_jobs(
    db: &impl ConnectionTrait,
    id: &ScheduleId,
    limit: u64,
) -> Result<Vec<training_job::Model>, DbErr> {
    training_job::Entity::find()
        .filter(training_job::Column::ScheduleId.eq(id))
        .order_by_desc(training_job::Column::CreatedAt)
        .order_by_desc(training_job::Column::Id)
        .limit(limit)
        .all(db)
        .await
}
