//! Operators' settings: paused actions, organizations' weights and caps.

use entities::{queue_org_setting, queue_pause};
use sea_orm::ActiveValue::Set;
use sea_orm::EntityTrait;

use super::*;

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
