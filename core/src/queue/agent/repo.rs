//! Agent logs, agent account usage and optimizer timelines.

use chrono::Utc;
use entities::{agent_log, agent_usage, optimizer_timeline};
use sea_orm::sea_query::OnConflict;
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect,
    TransactionSession, TransactionTrait,
};
use serde_json::Value;

use crate::domain::OrgId;

/// Stores a log; answers its id. `source` is `api` or `internal`.
pub async fn insert_log(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    content: &str,
    job_id: Option<&str>,
    source: &str,
) -> Result<String, DbErr> {
    let id = uuid::Uuid::new_v4().to_string();
    agent_log::Entity::insert(agent_log::ActiveModel {
        id: Set(id.clone()),
        org_id: Set(org_id.to_owned()),
        job_id: Set(job_id.map(str::to_owned)),
        content: Set(content.to_owned()),
        source: Set(source.to_owned()),
        created_at: Set(Utc::now()),
    })
    .exec_without_returning(db)
    .await?;
    Ok(id)
}

/// The organization's newest logs first.
pub async fn newest_logs(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    limit: u64,
) -> Result<Vec<agent_log::Model>, DbErr> {
    agent_log::Entity::find()
        .filter(agent_log::Column::OrgId.eq(org_id))
        .order_by_desc(agent_log::Column::CreatedAt)
        .order_by_desc(agent_log::Column::Id)
        .limit(limit)
        .all(db)
        .await
}

/// Keeps the latest usage report of an agent account.
pub async fn upsert_usage(
    db: &impl ConnectionTrait,
    account_label: &str,
    report: &Value,
) -> Result<(), DbErr> {
    agent_usage::Entity::insert(agent_usage::ActiveModel {
        account_label: Set(account_label.to_owned()),
        report: Set(report.to_string()),
        updated_at: Set(Utc::now()),
    })
    .on_conflict(
        OnConflict::column(agent_usage::Column::AccountLabel)
            .update_columns([agent_usage::Column::Report, agent_usage::Column::UpdatedAt])
            .to_owned(),
    )
    .exec_without_returning(db)
    .await?;
    Ok(())
}

/// Replaces each `(timeline id, events)` of the organization, all in one transaction.
pub async fn replace_timelines(
    db: &impl TransactionTrait,
    org_id: &OrgId,
    job_id: Option<&str>,
    timelines: &[(String, Value)],
) -> Result<(), DbErr> {
    let txn = db.begin().await?;
    let now = Utc::now();
    for (timeline_id, events) in timelines {
        optimizer_timeline::Entity::insert(optimizer_timeline::ActiveModel {
            org_id: Set(org_id.to_owned()),
            timeline_id: Set(timeline_id.clone()),
            job_id: Set(job_id.map(str::to_owned)),
            events: Set(events.to_string()),
            updated_at: Set(now),
        })
        .on_conflict(
            OnConflict::columns([
                optimizer_timeline::Column::OrgId,
                optimizer_timeline::Column::TimelineId,
            ])
            .update_columns([
                optimizer_timeline::Column::JobId,
                optimizer_timeline::Column::Events,
                optimizer_timeline::Column::UpdatedAt,
            ])
            .to_owned(),
        )
        .exec_without_returning(&txn)
        .await?;
    }
    txn.commit().await
}
