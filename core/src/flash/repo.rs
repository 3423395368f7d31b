//! The control plane's mirrors: environments, their uses, managed runs and checkpoints, and
//! product events. Upserts insert with `ON CONFLICT DO NOTHING`, then update the row under
//! a lock (`FOR UPDATE` on PostgreSQL; SQLite serializes writers), so concurrent upserts of
//! one key keep one row and lose no field.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use entities::{
    flash_checkpoint, flash_environment, flash_environment_use, flash_run, hub_backoff, product_event,
    project,
};
use sea_orm::sea_query::{Condition, Expr, ExprTrait, OnConflict};
use sea_orm::{
    ActiveModelTrait, ActiveValue::Set, ColumnTrait, ConnectionTrait, DatabaseConnection, DbErr, EntityTrait,
    IntoActiveModel, PaginatorTrait, QueryFilter, QueryOrder, QuerySelect, TransactionTrait, TryInsertResult,
};

use crate::domain::{HubStatus, OrgId, ProjectId};
use serde_json::{Map, Value};

use super::{EnvironmentPublish, FlashError};

const HUB_PENDING: HubStatus = HubStatus::Pending;
const HUB_PROVISIONED: HubStatus = HubStatus::Provisioned;

/// What an upsert did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Upserted {
    Created,
    Updated,
    /// The body's `updatedAt` is older than the stored one: nothing changed.
    Stale,
}

impl Upserted {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Created => "created",
            Self::Updated => "updated",
            Self::Stale => "stale",
        }
    }
}

/// Whether an update stamped `incoming` is older than the stored `stored` (both RFC 3339;
/// anything that does not parse never counts as older, so the latest arrival wins).
pub fn is_stale(stored: Option<&str>, incoming: Option<&str>) -> bool {
    let parse = |s: Option<&str>| s.and_then(|s| DateTime::parse_from_rfc3339(s).ok());
    matches!((parse(stored), parse(incoming)), (Some(stored), Some(incoming)) if incoming < stored)
}

/// `patch` laid over the stored JSON object: present keys replace (a `null` clears).
pub fn merge(stored: &str, patch: Map<String, Value>) -> String {
    let mut data: Map<String, Value> = serde_json::from_str(stored).unwrap_or_default();
    data.extend(patch);
    Value::Object(data).to_string()
}

fn source_updated_at(patch: &Map<String, Value>) -> Option<String> {
    patch.get("updatedAt").and_then(Value::as_str).map(str::to_owned)
}

pub async fn find_environment(
    db: &impl ConnectionTrait,
    slug: &str,
) -> Result<Option<flash_environment::Model>, DbErr> {
    flash_environment::Entity::find()
        .filter(flash_environment::Column::Slug.eq(slug))
        .one(db)
        .await
}

/// Creates or replaces the mirror of an environment (by slug). A changed hub location sends
/// it back to provisioning. Answers the row and whether it was created.
pub async fn publish_environment(
    db: &DatabaseConnection,
    project: &project::Model,
    body: &EnvironmentPublish,
    default_repo: &str,
) -> Result<(flash_environment::Model, bool), FlashError> {
    let now = Utc::now();
    let hub_repo = body.hub_repo.clone().unwrap_or_else(|| default_repo.to_owned());
    let hub_ref = body.hub_ref.clone().unwrap_or_else(|| "main".to_owned());
    let metadata = body
        .metadata
        .as_ref()
        .map(|m| Value::Object(m.clone()).to_string());
    let fresh = flash_environment::Model {
        id: uuid::Uuid::new_v4().to_string(),
        org_id: project.org_id.clone(),
        project_id: project.id.clone(),
        slug: body.slug.clone(),
        name: body.name.clone(),
        hub_repo,
        hub_ref,
        hub_path: body.hub_path.clone(),
        package_sha256: body.package_sha256.clone(),
        published_by_user_id: body.published_by_user_id.clone(),
        api_key_id: body.api_key_id.clone(),
        metadata,
        hub_status: HUB_PENDING,
        hub_attempts: 0,
        hub_error: None,
        hub_lease_until: None,
        hub_provisioned_at: None,
        created_at: now,
        updated_at: now,
    };
    let txn = db.begin().await?;
    let inserted = flash_environment::Entity::insert(fresh.clone().into_active_model())
        .on_conflict_do_nothing_on([flash_environment::Column::Slug])
        .exec_without_returning(&txn)
        .await?;
    if matches!(inserted, TryInsertResult::Inserted(1)) {
        txn.commit().await?;
        return Ok((fresh, true));
    }
    let stored = flash_environment::Entity::find()
        .filter(flash_environment::Column::Slug.eq(&body.slug))
        .lock_exclusive()
        .one(&txn)
        .await?
        .ok_or_else(|| FlashError::Changed("environment"))?;
    if stored.org_id != fresh.org_id {
        return Err(FlashError::OtherOrgsEnvironment);
    }
    let moved = stored.hub_repo != fresh.hub_repo
        || stored.hub_ref != fresh.hub_ref
        || stored.hub_path != fresh.hub_path;
    let mut row = flash_environment::Model {
        id: stored.id.clone(),
        created_at: stored.created_at,
        hub_status: stored.hub_status,
        hub_attempts: stored.hub_attempts,
        hub_error: stored.hub_error.clone(),
        hub_lease_until: stored.hub_lease_until,
        hub_provisioned_at: stored.hub_provisioned_at,
        ..fresh
    };
    if moved {
        row.hub_status = HUB_PENDING;
        row.hub_attempts = 0;
        row.hub_error = None;
        row.hub_provisioned_at = None;
    }
    let mut active = row.clone().into_active_model();
    active.id = sea_orm::ActiveValue::Unchanged(row.id.clone());
    for column in [
        flash_environment::Column::ProjectId,
        flash_environment::Column::Name,
        flash_environment::Column::HubRepo,
        flash_environment::Column::HubRef,
        flash_environment::Column::HubPath,
        flash_environment::Column::PackageSha256,
        flash_environment::Column::PublishedByUserId,
        flash_environment::Column::ApiKeyId,
        flash_environment::Column::Metadata,
        flash_environment::Column::HubStatus,
        flash_environment::Column::HubAttempts,
        flash_environment::Column::HubError,
        flash_environment::Column::HubProvisionedAt,
        flash_environment::Column::UpdatedAt,
    ] {
        active.reset(column);
    }
    active.update(&txn).await?;
    txn.commit().await?;
    Ok((row, false))
}

/// Drops the mirror row if it is that project's; never calls the control plane back.
pub async fn delete_environment(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    project_id: &ProjectId,
    slug: &str,
) -> Result<bool, DbErr> {
    let result = flash_environment::Entity::delete_many()
        .filter(flash_environment::Column::Slug.eq(slug))
        .filter(flash_environment::Column::OrgId.eq(org_id))
        .filter(flash_environment::Column::ProjectId.eq(project_id))
        .exec(db)
        .await?;
    Ok(result.rows_affected > 0)
}

/// Records that a run (or someone, without a run id) referenced `slug`; a run's reference
/// is recorded once.
pub async fn record_use(
    db: &impl ConnectionTrait,
    project: &project::Model,
    slug: &str,
    run_id: Option<&str>,
) -> Result<(), DbErr> {
    flash_environment_use::Entity::insert(flash_environment_use::ActiveModel {
        id: Set(uuid::Uuid::new_v4().to_string()),
        org_id: Set(project.org_id.clone()),
        project_id: Set(project.id.clone()),
        slug: Set(slug.to_owned()),
        run_id: Set(run_id.map(str::to_owned)),
        created_at: Set(Utc::now()),
    })
    .on_conflict_do_nothing_on([
        flash_environment_use::Column::ProjectId,
        flash_environment_use::Column::Slug,
        flash_environment_use::Column::RunId,
    ])
    .exec_without_returning(db)
    .await?;
    Ok(())
}

/// Upserts a managed run by (organization, run id): the latest status wins, fields the body
/// leaves out are kept. Answers the stored status and what happened.
pub async fn upsert_run(
    db: &DatabaseConnection,
    project: &project::Model,
    run_id: &str,
    status: &str,
    patch: Map<String, Value>,
) -> Result<(String, Upserted), FlashError> {
    let now = Utc::now();
    let incoming = source_updated_at(&patch);
    let txn = db.begin().await?;
    let inserted = flash_run::Entity::insert(flash_run::ActiveModel {
        org_id: Set(project.org_id.clone()),
        run_id: Set(run_id.to_owned()),
        project_id: Set(project.id.clone()),
        status: Set(status.to_owned()),
        data: Set(Value::Object(patch.clone()).to_string()),
        source_updated_at: Set(incoming.clone()),
        created_at: Set(now),
        updated_at: Set(now),
    })
    .on_conflict_do_nothing_on([flash_run::Column::OrgId, flash_run::Column::RunId])
    .exec_without_returning(&txn)
    .await?;
    if matches!(inserted, TryInsertResult::Inserted(1)) {
        txn.commit().await?;
        return Ok((status.to_owned(), Upserted::Created));
    }
    let stored = flash_run::Entity::find_by_id((project.org_id.clone(), run_id.to_owned()))
        .lock_exclusive()
        .one(&txn)
        .await?
        .ok_or_else(|| FlashError::Changed("run"))?;
    if stored.project_id != project.id {
        return Err(FlashError::OtherProjectsRun);
    }
    if is_stale(stored.source_updated_at.as_deref(), incoming.as_deref()) {
        return Ok((stored.status, Upserted::Stale));
    }
    let data = merge(&stored.data, patch);
    let mut active = stored.into_active_model();
    active.status = Set(status.to_owned());
    active.data = Set(data);
    if incoming.is_some() {
        active.source_updated_at = Set(incoming);
    }
    active.updated_at = Set(now);
    active.update(&txn).await?;
    txn.commit().await?;
    Ok((status.to_owned(), Upserted::Updated))
}

/// Upserts a checkpoint by (organization, run id, checkpoint id); fields left out are kept.
pub async fn upsert_checkpoint(
    db: &DatabaseConnection,
    project: &project::Model,
    run_id: &str,
    checkpoint_id: &str,
    patch: Map<String, Value>,
) -> Result<Upserted, FlashError> {
    let now = Utc::now();
    let incoming = source_updated_at(&patch);
    let txn = db.begin().await?;
    let inserted = flash_checkpoint::Entity::insert(flash_checkpoint::ActiveModel {
        org_id: Set(project.org_id.clone()),
        run_id: Set(run_id.to_owned()),
        checkpoint_id: Set(checkpoint_id.to_owned()),
        project_id: Set(project.id.clone()),
        data: Set(Value::Object(patch.clone()).to_string()),
        source_updated_at: Set(incoming.clone()),
        created_at: Set(now),
        updated_at: Set(now),
    })
    .on_conflict_do_nothing_on([
        flash_checkpoint::Column::OrgId,
        flash_checkpoint::Column::RunId,
        flash_checkpoint::Column::CheckpointId,
    ])
    .exec_without_returning(&txn)
    .await?;
    if matches!(inserted, TryInsertResult::Inserted(1)) {
        txn.commit().await?;
        return Ok(Upserted::Created);
    }
    let key = (
        project.org_id.clone(),
        run_id.to_owned(),
        checkpoint_id.to_owned(),
    );
    let stored = flash_checkpoint::Entity::find_by_id(key)
        .lock_exclusive()
        .one(&txn)
        .await?
        .ok_or_else(|| FlashError::Changed("checkpoint"))?;
    if stored.project_id != project.id {
        return Err(FlashError::OtherProjectsCheckpoint);
    }
    if is_stale(stored.source_updated_at.as_deref(), incoming.as_deref()) {
        return Ok(Upserted::Stale);
    }
    let data = merge(&stored.data, patch);
    let mut active = stored.into_active_model();
    active.data = Set(data);
    if incoming.is_some() {
        active.source_updated_at = Set(incoming);
    }
    active.updated_at = Set(now);
    active.update(&txn).await?;
    txn.commit().await?;
    Ok(Upserted::Updated)
}

pub async fn record_event(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    event: &str,
    user_id: Option<&str>,
    properties: Option<String>,
) -> Result<(), DbErr> {
    product_event::Entity::insert(product_event::ActiveModel {
        id: Set(uuid::Uuid::new_v4().to_string()),
        org_id: Set(org_id.to_owned()),
        event: Set(event.to_owned()),
        user_id: Set(user_id.map(str::to_owned)),
        properties: Set(properties),
        created_at: Set(Utc::now()),
    })
    .exec_without_returning(db)
    .await?;
    Ok(())
}

/// Organizations whose hub provisioning backs off until after `now` (one, or all).
pub async fn orgs_backing_off(
    db: &impl ConnectionTrait,
    org: Option<&OrgId>,
    now: DateTime<Utc>,
) -> Result<HashSet<OrgId>, DbErr> {
    let mut find = hub_backoff::Entity::find().filter(hub_backoff::Column::NextAttemptAt.gt(now));
    if let Some(org) = org {
        find = find.filter(hub_backoff::Column::OrgId.eq(org));
    }
    Ok(find.all(db).await?.into_iter().map(|b| b.org_id).collect())
}

/// Environments waiting for provisioning (of one organization, or all).
fn pending(org: Option<&OrgId>) -> sea_orm::Select<flash_environment::Entity> {
    let mut find =
        flash_environment::Entity::find().filter(flash_environment::Column::HubStatus.eq(HUB_PENDING));
    if let Some(org) = org {
        find = find.filter(flash_environment::Column::OrgId.eq(org));
    }
    find
}

/// How many waiting environments belong to `orgs`.
pub async fn pending_of_orgs(
    db: &impl ConnectionTrait,
    org: Option<&OrgId>,
    orgs: &HashSet<OrgId>,
) -> Result<u64, DbErr> {
    if orgs.is_empty() {
        return Ok(0);
    }
    pending(org)
        .filter(flash_environment::Column::OrgId.is_in(orgs.iter().cloned()))
        .count(db)
        .await
}

/// The oldest `limit` waiting environments that no pass holds, outside `excluded` orgs.
pub async fn provisioning_candidates(
    db: &impl ConnectionTrait,
    org: Option<&OrgId>,
    excluded: &HashSet<OrgId>,
    now: DateTime<Utc>,
    limit: u64,
) -> Result<Vec<flash_environment::Model>, DbErr> {
    let free = Condition::any()
        .add(flash_environment::Column::HubLeaseUntil.is_null())
        .add(flash_environment::Column::HubLeaseUntil.lt(now));
    let mut candidates = pending(org).filter(free);
    if !excluded.is_empty() {
        candidates = candidates.filter(flash_environment::Column::OrgId.is_not_in(excluded.iter().cloned()));
    }
    candidates
        .order_by_asc(flash_environment::Column::CreatedAt)
        .order_by_asc(flash_environment::Column::Id)
        .limit(limit)
        .all(db)
        .await
}

/// The organization provisioned again: its failures are forgotten.
pub async fn clear_backoff(db: &impl ConnectionTrait, org_id: &OrgId) -> Result<(), DbErr> {
    hub_backoff::Entity::delete_many()
        .filter(hub_backoff::Column::OrgId.eq(org_id))
        .exec(db)
        .await?;
    Ok(())
}

/// Holds the environment for this pass; false when another pass holds it or it is done.
pub async fn take_lease(db: &impl ConnectionTrait, env_id: &str, lease_secs: u64) -> Result<bool, DbErr> {
    let now = Utc::now();
    let until = now + chrono::Duration::seconds(i64::try_from(lease_secs).unwrap_or(i64::MAX / 2));
    let result = flash_environment::Entity::update_many()
        .col_expr(flash_environment::Column::HubLeaseUntil, Expr::value(until))
        .filter(flash_environment::Column::Id.eq(env_id))
        .filter(flash_environment::Column::HubStatus.eq(HUB_PENDING))
        .filter(
            Condition::any()
                .add(flash_environment::Column::HubLeaseUntil.is_null())
                .add(flash_environment::Column::HubLeaseUntil.lt(now)),
        )
        .exec(db)
        .await?;
    Ok(result.rows_affected == 1)
}

/// Records the outcome and releases the lease.
pub async fn finish_provisioning(
    db: &impl ConnectionTrait,
    env: &flash_environment::Model,
    error: Option<&str>,
) -> Result<(), DbErr> {
    let now = Utc::now();
    let mut update = flash_environment::Entity::update_many()
        .col_expr(
            flash_environment::Column::HubLeaseUntil,
            Expr::value(Option::<DateTime<Utc>>::None),
        )
        .col_expr(
            flash_environment::Column::HubAttempts,
            Expr::col(flash_environment::Column::HubAttempts).add(1),
        )
        .col_expr(
            flash_environment::Column::HubError,
            Expr::value(error.map(str::to_owned)),
        )
        .col_expr(flash_environment::Column::UpdatedAt, Expr::value(now));
    if error.is_none() {
        update = update
            .col_expr(flash_environment::Column::HubStatus, Expr::value(HUB_PROVISIONED))
            .col_expr(
                flash_environment::Column::HubProvisionedAt,
                Expr::value(Some(now)),
            );
    }
    update
        .filter(flash_environment::Column::Id.eq(&env.id))
        // A re-publish meanwhile moved it: that version is provisioned by a later pass.
        .filter(flash_environment::Column::HubRepo.eq(&env.hub_repo))
        .filter(flash_environment::Column::HubRef.eq(&env.hub_ref))
        .filter(flash_environment::Column::HubPath.eq(&env.hub_path))
        .exec(db)
        .await?;
    Ok(())
}

/// One more consecutive failure for the organization, and its next allowed attempt `delay`
/// (of its count of consecutive failures) from now.
pub async fn back_off(
    db: &impl ConnectionTrait,
    delay: impl FnOnce(u32) -> std::time::Duration,
    org_id: &OrgId,
    reason: &str,
) -> Result<(), DbErr> {
    let failures = hub_backoff::Entity::find_by_id(org_id.to_owned())
        .one(db)
        .await?
        .map_or(0, |b| b.failures)
        .saturating_add(1);
    let now = Utc::now();
    let delay = delay(u32::try_from(failures).unwrap_or(u32::MAX));
    let next = now + chrono::Duration::from_std(delay).unwrap_or(chrono::Duration::days(1));
    hub_backoff::Entity::insert(hub_backoff::ActiveModel {
        org_id: Set(org_id.to_owned()),
        failures: Set(failures),
        next_attempt_at: Set(next),
        last_error: Set(Some(reason.to_owned())),
        updated_at: Set(now),
    })
    .on_conflict(
        OnConflict::column(hub_backoff::Column::OrgId)
            .update_columns([
                hub_backoff::Column::Failures,
                hub_backoff::Column::NextAttemptAt,
                hub_backoff::Column::LastError,
                hub_backoff::Column::UpdatedAt,
            ])
            .to_owned(),
    )
    .exec_without_returning(db)
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn an_older_update_is_stale_and_unparsable_stamps_never_are() {
        let (old, new) = (Some("2026-01-01T00:00:00Z"), Some("2026-01-02T00:00:00+00:00"));
        assert!(is_stale(new, old));
        assert!(!is_stale(old, new));
        assert!(!is_stale(old, old));
        assert!(!is_stale(Some("yesterday"), old));
        assert!(!is_stale(None, old));
        assert!(!is_stale(new, None));
    }

    #[test]
    fn merge_replaces_present_keys_and_clears_nulls() {
        let stored = json!({"model": "a", "phase": "train", "costUsd": 1.5}).to_string();
        let Value::Object(patch) = json!({"phase": null, "costUsd": 2.0}) else {
            unreachable!()
        };
        let merged: Value = serde_json::from_str(&merge(&stored, patch)).unwrap();
        assert_eq!(merged, json!({"model": "a", "phase": null, "costUsd": 2.0}));
    }
}
