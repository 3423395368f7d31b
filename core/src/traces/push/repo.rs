//! The push's rows: each project's destination (`otlp_exports`) and the traces waiting to
//! go (`otlp_outbox`, one row a trace, leased while an exporter sends it).

use chrono::{DateTime, Utc};
use entities::{otlp_export, otlp_outbox, trace};
use sea_orm::sea_query::{Expr, OnConflict};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DbBackend, DbErr, EntityTrait, ExprTrait, PaginatorTrait, QueryFilter,
    QueryOrder, QuerySelect, Statement, Value,
};

use crate::domain::{ProjectId, TraceId};

pub async fn find_export(
    db: &impl ConnectionTrait,
    project_id: &ProjectId,
) -> Result<Option<otlp_export::Model>, DbErr> {
    otlp_export::Entity::find_by_id(project_id.clone()).one(db).await
}

/// Sets a project's destination (a new one starts with no failures and no backoff).
pub async fn save_export(db: &impl ConnectionTrait, export: otlp_export::Model) -> Result<(), DbErr> {
    use sea_orm::IntoActiveModel;
    otlp_export::Entity::insert(export.into_active_model())
        .on_conflict(
            OnConflict::column(otlp_export::Column::ProjectId)
                .update_columns([
                    otlp_export::Column::Url,
                    otlp_export::Column::HeaderNames,
                    otlp_export::Column::HeadersSealed,
                    otlp_export::Column::Failures,
                    otlp_export::Column::RetryAt,
                    otlp_export::Column::UpdatedAt,
                ])
                .to_owned(),
        )
        .exec_without_returning(db)
        .await?;
    Ok(())
}

/// Removes a project's destination and what waited for it; answers the traces dropped.
pub async fn delete_export(db: &impl ConnectionTrait, project_id: &ProjectId) -> Result<u64, DbErr> {
    let dropped = otlp_outbox::Entity::delete_many()
        .filter(otlp_outbox::Column::ProjectId.eq(project_id.clone()))
        .exec(db)
        .await?
        .rows_affected;
    otlp_export::Entity::delete_by_id(project_id.clone())
        .exec(db)
        .await?;
    Ok(dropped)
}

pub async fn exports_of(
    db: &impl ConnectionTrait,
    project_ids: &[ProjectId],
) -> Result<Vec<otlp_export::Model>, DbErr> {
    if project_ids.is_empty() {
        return Ok(Vec::new());
    }
    otlp_export::Entity::find()
        .filter(otlp_export::Column::ProjectId.is_in(project_ids.iter().cloned()))
        .all(db)
        .await
}

/// Traces waiting, per project of `project_ids` (absent: none).
pub async fn pending_counts(
    db: &impl ConnectionTrait,
    project_ids: &[ProjectId],
) -> Result<std::collections::HashMap<ProjectId, u64>, DbErr> {
    let rows: Vec<(ProjectId, i64)> = otlp_outbox::Entity::find()
        .select_only()
        .column(otlp_outbox::Column::ProjectId)
        .column_as(Expr::col(otlp_outbox::Column::TraceId).count(), "waiting")
        .filter(otlp_outbox::Column::ProjectId.is_in(project_ids.iter().cloned()))
        .group_by(otlp_outbox::Column::ProjectId)
        .into_tuple()
        .all(db)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(project, n)| (project, u64::try_from(n).unwrap_or(0)))
        .collect())
}

pub async fn pending_of(db: &impl ConnectionTrait, project_id: &ProjectId) -> Result<u64, DbErr> {
    otlp_outbox::Entity::find()
        .filter(otlp_outbox::Column::ProjectId.eq(project_id.clone()))
        .count(db)
        .await
}

/// Puts the traces of projects that push in the outbox (in the trace writer's transaction:
/// one look-up of the batch's projects, and an insert only if one of them pushes); answers
/// how many.
pub async fn enqueue(db: &impl ConnectionTrait, traces: &[trace::Model]) -> Result<u64, DbErr> {
    use sea_orm::ActiveValue::Set;
    if traces.is_empty() {
        return Ok(0);
    }
    let mut projects: Vec<ProjectId> = traces.iter().map(|t| t.project_id.clone()).collect();
    projects.sort();
    projects.dedup();
    let pushing: Vec<ProjectId> = otlp_export::Entity::find()
        .select_only()
        .column(otlp_export::Column::ProjectId)
        .filter(otlp_export::Column::ProjectId.is_in(projects))
        .into_tuple()
        .all(db)
        .await?;
    if pushing.is_empty() {
        return Ok(0);
    }
    let rows: Vec<otlp_outbox::ActiveModel> = traces
        .iter()
        .filter(|t| pushing.contains(&t.project_id))
        .map(|t| otlp_outbox::ActiveModel {
            trace_id: Set(t.id.clone()),
            project_id: Set(t.project_id.clone()),
            created_at: Set(t.created_at),
            leased_until: Set(None),
        })
        .collect();
    let count = rows.len() as u64;
    otlp_outbox::Entity::insert_many(rows)
        .on_conflict(
            OnConflict::column(otlp_outbox::Column::TraceId)
                .do_nothing()
                .to_owned(),
        )
        .exec_without_returning(db)
        .await?;
    Ok(count)
}

/// Projects with traces waiting, not backed off, not all leased (at most `limit`).
pub async fn due_projects(
    db: &impl ConnectionTrait,
    now: DateTime<Utc>,
    limit: u64,
) -> Result<Vec<ProjectId>, DbErr> {
    let ready: Vec<ProjectId> = otlp_export::Entity::find()
        .select_only()
        .column(otlp_export::Column::ProjectId)
        .filter(
            Expr::col(otlp_export::Column::RetryAt)
                .is_null()
                .or(Expr::col(otlp_export::Column::RetryAt).lte(now)),
        )
        .into_tuple()
        .all(db)
        .await?;
    if ready.is_empty() {
        return Ok(Vec::new());
    }
    otlp_outbox::Entity::find()
        .select_only()
        .column(otlp_outbox::Column::ProjectId)
        .distinct()
        .filter(otlp_outbox::Column::ProjectId.is_in(ready))
        .filter(
            Expr::col(otlp_outbox::Column::LeasedUntil)
                .is_null()
                .or(Expr::col(otlp_outbox::Column::LeasedUntil).lt(now)),
        )
        .limit(limit)
        .into_tuple::<ProjectId>()
        .all(db)
        .await
}

/// Leases up to `limit` of a project's waiting traces (oldest first) until `until`.
pub async fn lease(
    db: &impl ConnectionTrait,
    project_id: &ProjectId,
    now: DateTime<Utc>,
    until: DateTime<Utc>,
    limit: u64,
) -> Result<Vec<otlp_outbox::Model>, DbErr> {
    let backend = db.get_database_backend();
    let sql = match backend {
        DbBackend::Postgres => {
            "UPDATE otlp_outbox SET leased_until = $1 WHERE trace_id IN (\
                SELECT trace_id FROM otlp_outbox WHERE project_id = $2 \
                AND (leased_until IS NULL OR leased_until < $3) \
                ORDER BY created_at, trace_id LIMIT $4 FOR UPDATE SKIP LOCKED) \
             RETURNING *"
        }
        _ => {
            "UPDATE otlp_outbox SET leased_until = ?1 WHERE trace_id IN (\
                SELECT trace_id FROM otlp_outbox WHERE project_id = ?2 \
                AND (leased_until IS NULL OR leased_until < ?3) \
                ORDER BY created_at, trace_id LIMIT ?4) \
             RETURNING *"
        }
    };
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let values: Vec<Value> = vec![until.into(), project_id.as_str().into(), now.into(), limit.into()];
    let mut rows = otlp_outbox::Entity::find()
        .from_raw_sql(Statement::from_sql_and_values(backend, sql, values))
        .all(db)
        .await?;
    rows.sort_by(|a, b| (a.created_at, &a.trace_id).cmp(&(b.created_at, &b.trace_id)));
    Ok(rows)
}

/// Removes traces from the outbox (pushed, or dropped).
pub async fn remove(db: &impl ConnectionTrait, ids: &[TraceId]) -> Result<u64, DbErr> {
    if ids.is_empty() {
        return Ok(0);
    }
    Ok(otlp_outbox::Entity::delete_many()
        .filter(otlp_outbox::Column::TraceId.is_in(ids.iter().cloned()))
        .exec(db)
        .await?
        .rows_affected)
}

/// Gives leased traces back (a failed push: they go with the project's next one).
pub async fn release(db: &impl ConnectionTrait, ids: &[TraceId]) -> Result<(), DbErr> {
    if ids.is_empty() {
        return Ok(());
    }
    otlp_outbox::Entity::update_many()
        .col_expr(
            otlp_outbox::Column::LeasedUntil,
            Expr::value(Option::<DateTime<Utc>>::None),
        )
        .filter(otlp_outbox::Column::TraceId.is_in(ids.iter().cloned()))
        .exec(db)
        .await?;
    Ok(())
}

/// A push went through: the project's backoff ends.
pub async fn record_success(
    db: &impl ConnectionTrait,
    project_id: &ProjectId,
    now: DateTime<Utc>,
) -> Result<(), DbErr> {
    otlp_export::Entity::update_many()
        .col_expr(otlp_export::Column::Failures, Expr::value(0))
        .col_expr(
            otlp_export::Column::RetryAt,
            Expr::value(Option::<DateTime<Utc>>::None),
        )
        .col_expr(otlp_export::Column::LastExportedAt, Expr::value(now))
        .filter(otlp_export::Column::ProjectId.eq(project_id.clone()))
        .exec(db)
        .await?;
    Ok(())
}

/// A push failed: its error, and when the project's next may go; answers the failures in a row.
pub async fn record_failure(
    db: &impl ConnectionTrait,
    project_id: &ProjectId,
    now: DateTime<Utc>,
    error: &str,
    retry_at: impl Fn(i32) -> DateTime<Utc>,
) -> Result<i32, DbErr> {
    let Some(export) = find_export(db, project_id).await? else {
        return Ok(0);
    };
    let failures = export.failures.saturating_add(1);
    otlp_export::Entity::update_many()
        .col_expr(otlp_export::Column::Failures, Expr::value(failures))
        .col_expr(otlp_export::Column::RetryAt, Expr::value(retry_at(failures)))
        .col_expr(otlp_export::Column::LastError, Expr::value(error))
        .col_expr(otlp_export::Column::LastErrorAt, Expr::value(now))
        .filter(otlp_export::Column::ProjectId.eq(project_id.clone()))
        .exec(db)
        .await?;
    Ok(failures)
}

/// Drops a project's traces that waited since before `before` and nobody is sending; answers how many.
pub async fn drop_older(
    db: &impl ConnectionTrait,
    project_id: &ProjectId,
    before: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<u64, DbErr> {
    Ok(otlp_outbox::Entity::delete_many()
        .filter(otlp_outbox::Column::ProjectId.eq(project_id.clone()))
        .filter(otlp_outbox::Column::CreatedAt.lt(before))
        .filter(
            Expr::col(otlp_outbox::Column::LeasedUntil)
                .is_null()
                .or(Expr::col(otlp_outbox::Column::LeasedUntil).lt(now)),
        )
        .exec(db)
        .await?
        .rows_affected)
}

/// When the oldest trace waiting was recorded (none: nothing waits).
pub async fn oldest_pending(db: &impl ConnectionTrait) -> Result<Option<DateTime<Utc>>, DbErr> {
    Ok(otlp_outbox::Entity::find()
        .order_by_asc(otlp_outbox::Column::CreatedAt)
        .one(db)
        .await?
        .map(|row| row.created_at))
}
