//! Runs and run checkpoints.

use std::collections::BTreeMap;

use chrono::Utc;
use entities::{project, run, run_checkpoint};
use sea_orm::sea_query::OnConflict;
use sea_orm::{
    ActiveModelTrait, ActiveValue::Set, ColumnTrait, ConnectionTrait, DbErr, EntityTrait, IntoActiveModel,
    PaginatorTrait, QueryFilter, QueryOrder, QuerySelect,
};

use super::{Checkpoint, NewRun, RunChanges, TrackerLink, INITIAL_STATUS};

use crate::domain::{OrgId, ProjectId, RunId};

/// Rows per insert statement (SQLite allows 32,766 bound parameters).
const CHUNK: usize = 500;

pub async fn insert_run(
    db: &impl ConnectionTrait,
    project: &project::Model,
    body: &NewRun,
) -> Result<run::Model, DbErr> {
    let now = Utc::now();
    let row = run::Model {
        id: RunId::generate(),
        org_id: project.org_id.clone(),
        project_id: project.id.clone(),
        name: body.name.clone(),
        model: body.model.clone(),
        environment_slug: body.environment_slug.clone(),
        config: body
            .config
            .as_ref()
            .map(|c| serde_json::Value::Object(c.clone()).to_string()),
        status: INITIAL_STATUS.to_owned(),
        summary: None,
        metrics: None,
        error: None,
        tracker_entity: None,
        tracker_project: None,
        tracker_run_id: None,
        tracker_url: None,
        created_at: now,
        updated_at: now,
    };
    run::Entity::insert(row.clone().into_active_model())
        .exec_without_returning(db)
        .await?;
    Ok(row)
}

/// A run of one of `org_ids`; another organization's run is "not found".
pub async fn find_run(
    db: &impl ConnectionTrait,
    run_id: &RunId,
    org_ids: &[OrgId],
) -> Result<Option<run::Model>, DbErr> {
    Ok(run::Entity::find_by_id(run_id.to_owned())
        .one(db)
        .await?
        .filter(|r| org_ids.iter().any(|o| o.as_str() == r.org_id)))
}

/// Applies the fields the update names (`null` clears summary, metrics and error).
pub async fn update_run(
    db: &impl ConnectionTrait,
    run: run::Model,
    body: RunChanges,
) -> Result<run::Model, DbErr> {
    let mut active = run.into_active_model();
    if let Some(status) = body.status {
        active.status = Set(status);
    }
    if let Some(summary) = body.summary {
        active.summary = Set(summary.map(|v| v.to_string()));
    }
    if let Some(metrics) = body.metrics {
        active.metrics = Set(metrics.map(|m| serde_json::Value::Object(m).to_string()));
    }
    if let Some(error) = body.error {
        active.error = Set(error);
    }
    active.updated_at = Set(Utc::now());
    active.update(db).await
}

pub async fn link_tracker(
    db: &impl ConnectionTrait,
    run_id: &RunId,
    link: &TrackerLink,
) -> Result<(), DbErr> {
    run::Entity::update_many()
        .col_expr(run::Column::TrackerEntity, link.entity.clone().into())
        .col_expr(run::Column::TrackerProject, link.project.clone().into())
        .col_expr(run::Column::TrackerRunId, link.tracker_run_id.clone().into())
        .col_expr(run::Column::TrackerUrl, link.url.clone().into())
        .col_expr(run::Column::UpdatedAt, Utc::now().into())
        .filter(run::Column::Id.eq(run_id))
        .exec(db)
        .await?;
    Ok(())
}

/// The runs of `org_ids` linked to `entity/project` in the tracker.
pub async fn linked_runs(
    db: &impl ConnectionTrait,
    org_ids: &[OrgId],
    entity: &str,
    project: &str,
) -> Result<Vec<run::Model>, DbErr> {
    if org_ids.is_empty() {
        return Ok(Vec::new());
    }
    run::Entity::find()
        .filter(run::Column::OrgId.is_in(org_ids.iter().map(OrgId::to_string)))
        .filter(run::Column::TrackerEntity.eq(entity))
        .filter(run::Column::TrackerProject.eq(project))
        .order_by_asc(run::Column::CreatedAt)
        .all(db)
        .await
}

/// Upserts by (organization, run, step); a step repeated in one call keeps its last
/// subfolder. Answers the number of distinct steps written.
pub async fn upsert_checkpoints(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    project_id: &ProjectId,
    run_id: &RunId,
    items: &[Checkpoint],
) -> Result<usize, DbErr> {
    let by_step: BTreeMap<i64, &str> = items.iter().map(|c| (c.step, c.subfolder.as_str())).collect();
    let now = Utc::now();
    let rows: Vec<run_checkpoint::ActiveModel> = by_step
        .iter()
        .map(|(step, subfolder)| run_checkpoint::ActiveModel {
            org_id: Set(org_id.to_owned()),
            run_id: Set(run_id.to_owned()),
            step: Set(*step),
            project_id: Set(project_id.to_owned()),
            subfolder: Set((*subfolder).to_owned()),
            created_at: Set(now),
            updated_at: Set(now),
        })
        .collect();
    for chunk in rows.chunks(CHUNK) {
        run_checkpoint::Entity::insert_many(chunk.to_vec())
            .on_conflict(
                OnConflict::columns([
                    run_checkpoint::Column::OrgId,
                    run_checkpoint::Column::RunId,
                    run_checkpoint::Column::Step,
                ])
                .update_columns([
                    run_checkpoint::Column::Subfolder,
                    run_checkpoint::Column::ProjectId,
                    run_checkpoint::Column::UpdatedAt,
                ])
                .to_owned(),
            )
            .exec_without_returning(db)
            .await?;
    }
    Ok(by_step.len())
}

pub async fn list_checkpoints(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    project_id: &ProjectId,
    run_id: &RunId,
) -> Result<Vec<Checkpoint>, DbErr> {
    Ok(run_checkpoint::Entity::find()
        .filter(run_checkpoint::Column::OrgId.eq(org_id))
        .filter(run_checkpoint::Column::RunId.eq(run_id))
        .filter(run_checkpoint::Column::ProjectId.eq(project_id))
        .order_by_asc(run_checkpoint::Column::Step)
        .all(db)
        .await?
        .into_iter()
        .map(|c| Checkpoint {
            step: c.step,
            subfolder: c.subfolder,
        })
        .collect())
}

/// How many checkpoints a run has.
pub async fn count_checkpoints(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    project_id: &ProjectId,
    run_id: &RunId,
) -> Result<u64, DbErr> {
    run_checkpoint::Entity::find()
        .filter(run_checkpoint::Column::OrgId.eq(org_id))
        .filter(run_checkpoint::Column::RunId.eq(run_id))
        .filter(run_checkpoint::Column::ProjectId.eq(project_id))
        .count(db)
        .await
}

/// How many runs the organization has (of one project, if given).
pub async fn count_of_org(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    project_id: Option<&str>,
) -> Result<u64, DbErr> {
    let mut query = run::Entity::find().filter(run::Column::OrgId.eq(org_id));
    if let Some(project) = project_id {
        query = query.filter(run::Column::ProjectId.eq(project));
    }
    sea_orm::PaginatorTrait::count(query, db).await
}

/// The organization's runs (of one project when given), newest first; at most `limit`.
pub async fn runs_of_org(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    project_id: Option<&str>,
    before: Option<&(chrono::DateTime<chrono::Utc>, String)>,
    limit: u64,
) -> Result<Vec<run::Model>, DbErr> {
    let mut query = run::Entity::find().filter(run::Column::OrgId.eq(org_id));
    if let Some(project) = project_id {
        query = query.filter(run::Column::ProjectId.eq(project));
    }
    // Keyset paging: only runs older than `before` (`created_at`, then id).
    if let Some((at, id)) = before {
        query = query.filter(
            sea_orm::Condition::any().add(run::Column::CreatedAt.lt(*at)).add(
                sea_orm::Condition::all()
                    .add(run::Column::CreatedAt.eq(*at))
                    .add(run::Column::Id.lt(id.as_str())),
            ),
        );
    }
    query
        .order_by_desc(run::Column::CreatedAt)
        .order_by_desc(run::Column::Id)
        .limit(limit)
        .all(db)
        .await
}

/// The checkpoints of these runs of the organization, by run then step.
pub async fn checkpoints_of_runs(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    run_ids: &[RunId],
) -> Result<Vec<run_checkpoint::Model>, DbErr> {
    if run_ids.is_empty() {
        return Ok(Vec::new());
    }
    run_checkpoint::Entity::find()
        .filter(run_checkpoint::Column::OrgId.eq(org_id))
        .filter(run_checkpoint::Column::RunId.is_in(run_ids.iter().cloned()))
        .order_by_asc(run_checkpoint::Column::RunId)
        .order_by_asc(run_checkpoint::Column::Step)
        .all(db)
        .await
}
