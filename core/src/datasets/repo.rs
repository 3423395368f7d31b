//! Dataset queries. Every function takes `&impl ConnectionTrait`, so it runs inside a
//! transaction or not.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use entities::{dataset, dataset_item, dataset_line, dataset_version, training_job};
use sea_orm::sea_query::{Expr, OnConflict};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect,
    Set,
};

use crate::domain::{DatasetId, JobId, JobStatus, ProjectId, TraceId};

/// Rows a multi-row insert carries at most (SQLite binds at most 32,766 values).
const INSERT_CHUNK: usize = 500;

pub async fn find(db: &impl ConnectionTrait, id: &DatasetId) -> Result<Option<dataset::Model>, DbErr> {
    dataset::Entity::find_by_id(id.clone()).one(db).await
}

pub async fn find_by_name(
    db: &impl ConnectionTrait,
    project_id: &ProjectId,
    name: &str,
) -> Result<Option<dataset::Model>, DbErr> {
    dataset::Entity::find()
        .filter(dataset::Column::ProjectId.eq(project_id))
        .filter(dataset::Column::Name.eq(name))
        .one(db)
        .await
}

/// The project's datasets, newest first.
pub async fn of_project(
    db: &impl ConnectionTrait,
    project_id: &ProjectId,
) -> Result<Vec<dataset::Model>, DbErr> {
    dataset::Entity::find()
        .filter(dataset::Column::ProjectId.eq(project_id))
        .order_by_desc(dataset::Column::CreatedAt)
        .order_by_desc(dataset::Column::Id)
        .all(db)
        .await
}

/// The versions of `ids`, oldest first.
pub async fn versions_of(
    db: &impl ConnectionTrait,
    ids: &[DatasetId],
) -> Result<Vec<dataset_version::Model>, DbErr> {
    dataset_version::Entity::find()
        .filter(dataset_version::Column::DatasetId.is_in(ids.iter().cloned()))
        .order_by_asc(dataset_version::Column::Version)
        .all(db)
        .await
}

/// Version `version` of a dataset, or its latest when `None`.
pub async fn version_one(
    db: &impl ConnectionTrait,
    id: &DatasetId,
    version: Option<i32>,
) -> Result<Option<dataset_version::Model>, DbErr> {
    let query = dataset_version::Entity::find().filter(dataset_version::Column::DatasetId.eq(id));
    match version {
        Some(v) => query.filter(dataset_version::Column::Version.eq(v)).one(db).await,
        None => {
            query
                .order_by_desc(dataset_version::Column::Version)
                .one(db)
                .await
        }
    }
}

/// The jobs that pinned one of `ids`, newest first (at most 1,000).
pub async fn jobs_of(
    db: &impl ConnectionTrait,
    ids: &[DatasetId],
) -> Result<Vec<training_job::Model>, DbErr> {
    training_job::Entity::find()
        .filter(training_job::Column::DatasetId.is_in(ids.iter().cloned()))
        .order_by_desc(training_job::Column::CreatedAt)
        .limit(1000)
        .all(db)
        .await
}

/// A job of the dataset that is not over (queued, scheduled, running or stopping).
pub async fn open_job(db: &impl ConnectionTrait, id: &DatasetId) -> Result<Option<JobId>, DbErr> {
    training_job::Entity::find()
        .select_only()
        .column(training_job::Column::Id)
        .filter(training_job::Column::DatasetId.eq(id))
        .filter(training_job::Column::Status.is_in([
            JobStatus::Queued,
            JobStatus::Scheduled,
            JobStatus::Running,
            JobStatus::Stopping,
        ]))
        .limit(1)
        .into_tuple()
        .one(db)
        .await
}

/// Every trace the dataset took lines of: its time and its prompt's key.
pub async fn line_keys(
    db: &impl ConnectionTrait,
    id: &DatasetId,
) -> Result<HashMap<TraceId, (DateTime<Utc>, String)>, DbErr> {
    let rows: Vec<(TraceId, DateTime<Utc>, String)> = dataset_line::Entity::find()
        .select_only()
        .columns([
            dataset_line::Column::TraceId,
            dataset_line::Column::TraceCreatedAt,
            dataset_line::Column::PromptKey,
        ])
        .filter(dataset_line::Column::DatasetId.eq(id))
        .into_tuple()
        .all(db)
        .await?;
    Ok(rows.into_iter().map(|(id, at, key)| (id, (at, key))).collect())
}

/// Stores lines (a trace's lines already taken stay as they were).
pub async fn insert_lines(db: &impl ConnectionTrait, lines: Vec<dataset_line::Model>) -> Result<(), DbErr> {
    for chunk in lines.chunks(INSERT_CHUNK / 4) {
        let rows = chunk.iter().cloned().map(dataset_line::ActiveModel::from);
        dataset_line::Entity::insert_many(rows)
            .on_conflict(
                OnConflict::columns([dataset_line::Column::DatasetId, dataset_line::Column::TraceId])
                    .do_nothing()
                    .to_owned(),
            )
            .exec_without_returning(db)
            .await?;
    }
    Ok(())
}

/// The dataset's lines of `ids` (any order).
pub async fn lines(
    db: &impl ConnectionTrait,
    id: &DatasetId,
    ids: &[TraceId],
) -> Result<Vec<dataset_line::Model>, DbErr> {
    dataset_line::Entity::find()
        .filter(dataset_line::Column::DatasetId.eq(id))
        .filter(dataset_line::Column::TraceId.is_in(ids.iter().cloned()))
        .all(db)
        .await
}

/// Which of `ids` are still traces (retention may have deleted some).
pub async fn traces_kept(
    db: &impl ConnectionTrait,
    ids: &[TraceId],
) -> Result<std::collections::HashSet<TraceId>, DbErr> {
    let kept: Vec<TraceId> = entities::trace::Entity::find()
        .select_only()
        .column(entities::trace::Column::Id)
        .filter(entities::trace::Column::Id.is_in(ids.iter().cloned()))
        .into_tuple()
        .all(db)
        .await?;
    Ok(kept.into_iter().collect())
}

/// The traces a version holds, in its order.
pub async fn selection(
    db: &impl ConnectionTrait,
    id: &DatasetId,
    version: i32,
) -> Result<Vec<TraceId>, DbErr> {
    dataset_item::Entity::find()
        .select_only()
        .column(dataset_item::Column::TraceId)
        .filter(dataset_item::Column::DatasetId.eq(id))
        .filter(dataset_item::Column::Version.eq(version))
        .order_by_asc(dataset_item::Column::Ordinal)
        .into_tuple()
        .all(db)
        .await
}

/// The next `limit` items of a version after `after` (an ordinal), of one side of the
/// split or both.
pub async fn items_page(
    db: &impl ConnectionTrait,
    id: &DatasetId,
    version: i32,
    validation: Option<bool>,
    after: Option<i32>,
    limit: u64,
) -> Result<Vec<dataset_item::Model>, DbErr> {
    let mut query = dataset_item::Entity::find()
        .filter(dataset_item::Column::DatasetId.eq(id))
        .filter(dataset_item::Column::Version.eq(version));
    if let Some(validation) = validation {
        query = query.filter(dataset_item::Column::Validation.eq(validation));
    }
    if let Some(after) = after {
        query = query.filter(dataset_item::Column::Ordinal.gt(after));
    }
    query
        .order_by_asc(dataset_item::Column::Ordinal)
        .limit(limit)
        .all(db)
        .await
}

/// The next `limit` lines of a version after `after` (an ordinal, or the first `skip` of
/// them), of one side of the split or both, in `column`'s format: one statement joining each
/// item to its line (ordinal, line).
#[allow(clippy::too_many_arguments)]
pub async fn page_lines(
    db: &impl ConnectionTrait,
    id: &DatasetId,
    version: i32,
    validation: Option<bool>,
    after: Option<i32>,
    skip: u64,
    limit: u64,
    column: dataset_line::Column,
) -> Result<Vec<(i32, String)>, DbErr> {
    use sea_orm::JoinType;
    let line = dataset_item::Entity::belongs_to(dataset_line::Entity)
        .from((dataset_item::Column::DatasetId, dataset_item::Column::TraceId))
        .to((dataset_line::Column::DatasetId, dataset_line::Column::TraceId))
        .into();
    let mut query = dataset_item::Entity::find()
        .join(JoinType::InnerJoin, line)
        .filter(dataset_item::Column::DatasetId.eq(id))
        .filter(dataset_item::Column::Version.eq(version));
    if let Some(validation) = validation {
        query = query.filter(dataset_item::Column::Validation.eq(validation));
    }
    if let Some(after) = after {
        query = query.filter(dataset_item::Column::Ordinal.gt(after));
    }
    if skip > 0 {
        query = query.offset(skip);
    }
    query
        .select_only()
        .column(dataset_item::Column::Ordinal)
        .column(column)
        .order_by_asc(dataset_item::Column::Ordinal)
        .limit(limit)
        .into_tuple()
        .all(db)
        .await
}

pub async fn insert_dataset(db: &impl ConnectionTrait, model: dataset::Model) -> Result<(), DbErr> {
    dataset::Entity::insert(dataset::ActiveModel::from(model))
        .exec_without_returning(db)
        .await
        .map(|_| ())
}

/// Moves the dataset's latest version from `from` to `from + 1`; false when another
/// version was made meanwhile.
pub async fn bump_version(db: &impl ConnectionTrait, id: &DatasetId, from: i32) -> Result<bool, DbErr> {
    let updated = dataset::Entity::update_many()
        .col_expr(dataset::Column::LatestVersion, Expr::value(from + 1))
        .col_expr(dataset::Column::UpdatedAt, Expr::value(Utc::now()))
        .filter(dataset::Column::Id.eq(id))
        .filter(dataset::Column::LatestVersion.eq(from))
        .exec(db)
        .await?;
    Ok(updated.rows_affected == 1)
}

pub async fn insert_version(
    db: &impl ConnectionTrait,
    version: dataset_version::Model,
    items: Vec<dataset_item::Model>,
) -> Result<(), DbErr> {
    dataset_version::Entity::insert(dataset_version::ActiveModel::from(version))
        .exec_without_returning(db)
        .await?;
    for chunk in items.chunks(INSERT_CHUNK) {
        dataset_item::Entity::insert_many(chunk.iter().cloned().map(dataset_item::ActiveModel::from))
            .exec_without_returning(db)
            .await?;
    }
    Ok(())
}

pub async fn update(
    db: &impl ConnectionTrait,
    dataset: dataset::Model,
    name: Option<String>,
    description: Option<Option<String>>,
) -> Result<dataset::Model, DbErr> {
    let mut active = dataset::ActiveModel::from(dataset);
    if let Some(name) = name {
        active.name = Set(name);
    }
    if let Some(description) = description {
        active.description = Set(description);
    }
    active.updated_at = Set(Utc::now());
    active.update(db).await
}

/// Deletes the dataset, its versions and items, and its lines.
pub async fn delete(db: &impl ConnectionTrait, id: &DatasetId) -> Result<(), DbErr> {
    dataset::Entity::delete_by_id(id.clone()).exec(db).await?;
    delete_lines(db, id).await
}

/// The lines of a dataset (after its row is gone, or when its first version failed).
pub async fn delete_lines(db: &impl ConnectionTrait, id: &DatasetId) -> Result<(), DbErr> {
    dataset_line::Entity::delete_many()
        .filter(dataset_line::Column::DatasetId.eq(id))
        .exec(db)
        .await
        .map(|_| ())
}
