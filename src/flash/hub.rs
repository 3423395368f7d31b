//! Hub provisioning: one bounded pass over environments still waiting for their hub
//! repository.
//!
//! Hub API used: `POST <hub.url>/repos` with `Authorization: Bearer <hub.token>` and
//! `{repo, ref, path, slug, orgId, projectId}`; any 2xx, or 409 (it exists already), means
//! provisioned. An organization whose call fails waits `backoff_base_secs * 2^(failures-1)`
//! (at most `backoff_max_secs`) before its environments are tried again; its environments
//! are `skipped` meanwhile. Backoff is per organization, so one broken organization never
//! delays another, and a pass narrowed to one organization touches only that one's backoff.
//! Each environment is leased while it is tried, so instances sweeping at once never call
//! the hub twice for it.

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use entities::{flash_environment, hub_backoff};
use futures_util::{stream, StreamExt};
use sea_orm::sea_query::{Expr, OnConflict};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, Condition, ConnectionTrait, DbErr, EntityTrait, PaginatorTrait,
    QueryFilter, QueryOrder, QuerySelect,
};
use serde::Serialize;
use serde_json::json;
use utoipa::ToSchema;

use super::repo::{HUB_PENDING, HUB_PROVISIONED};
use crate::config::HubSettings;
use crate::error::{ApiError, ApiResult};
use crate::http::PeerError;
use crate::state::AppState;

/// Organizations provisioned at once in a pass (each one's environments go one by one).
const ORG_CONCURRENCY: usize = 8;

#[derive(Debug, Default, Serialize, ToSchema, PartialEq, Eq)]
pub struct PassReport {
    /// Hub calls made.
    pub attempted: u64,
    pub provisioned: u64,
    pub failed: u64,
    /// Waiting environments not tried: their organization is backing off (or failed earlier
    /// in this pass), or another instance holds them.
    pub skipped: u64,
}

/// The delay after `failures` consecutive failures.
pub fn backoff_delay(settings: &HubSettings, failures: u32) -> Duration {
    let exponent = failures.saturating_sub(1).min(30);
    let secs = settings.backoff_base_secs.saturating_mul(1u64 << exponent);
    Duration::from_secs(secs.min(settings.backoff_max_secs))
}

pub async fn run_pass(state: &AppState, limit: u64, org: Option<&str>) -> ApiResult<PassReport> {
    let settings = &state.settings.hub;
    if settings.url.is_empty() {
        return Err(ApiError::Unavailable(
            "no hub is configured (KEEL_HUB_URL)".into(),
        ));
    }
    let db = &state.db;
    let now = Utc::now();
    let waiting: HashSet<String> = {
        let mut find = hub_backoff::Entity::find().filter(hub_backoff::Column::NextAttemptAt.gt(now));
        if let Some(org) = org {
            find = find.filter(hub_backoff::Column::OrgId.eq(org));
        }
        find.all(db).await?.into_iter().map(|b| b.org_id).collect()
    };
    let pending = || {
        let mut find =
            flash_environment::Entity::find().filter(flash_environment::Column::HubStatus.eq(HUB_PENDING));
        if let Some(org) = org {
            find = find.filter(flash_environment::Column::OrgId.eq(org));
        }
        find
    };
    let mut report = PassReport {
        skipped: if waiting.is_empty() {
            0
        } else {
            pending()
                .filter(flash_environment::Column::OrgId.is_in(waiting.iter().cloned()))
                .count(db)
                .await?
        },
        ..PassReport::default()
    };
    let free = Condition::any()
        .add(flash_environment::Column::HubLeaseUntil.is_null())
        .add(flash_environment::Column::HubLeaseUntil.lt(now));
    let mut candidates = pending().filter(free);
    if !waiting.is_empty() {
        candidates = candidates.filter(flash_environment::Column::OrgId.is_not_in(waiting.iter().cloned()));
    }
    let candidates = candidates
        .order_by_asc(flash_environment::Column::CreatedAt)
        .order_by_asc(flash_environment::Column::Id)
        .limit(limit)
        .all(db)
        .await?;
    let mut by_org: BTreeMap<String, Vec<flash_environment::Model>> = BTreeMap::new();
    for env in candidates {
        by_org.entry(env.org_id.clone()).or_default().push(env);
    }
    let hub = Hub {
        http: &state.http,
        settings,
    };
    let outcomes: Vec<Result<PassReport, DbErr>> = stream::iter(by_org)
        .map(|(org_id, envs)| {
            let hub = &hub;
            async move { provision_org(db, hub, &org_id, envs).await }
        })
        .buffer_unordered(ORG_CONCURRENCY)
        .collect()
        .await;
    for outcome in outcomes {
        let part = outcome?;
        report.attempted += part.attempted;
        report.provisioned += part.provisioned;
        report.failed += part.failed;
        report.skipped += part.skipped;
    }
    Ok(report)
}

/// One organization's environments, one at a time; the first failure backs the
/// organization off and skips the rest.
async fn provision_org(
    db: &impl ConnectionTrait,
    hub: &Hub<'_>,
    org_id: &str,
    envs: Vec<flash_environment::Model>,
) -> Result<PassReport, DbErr> {
    let mut report = PassReport::default();
    let mut backing_off = false;
    for env in envs {
        if backing_off || !take_lease(db, &env.id, hub.settings.lease_secs).await? {
            report.skipped += 1;
            continue;
        }
        report.attempted += 1;
        match hub.ensure_repo(&env).await {
            Ok(()) => {
                report.provisioned += 1;
                finish(db, &env, None).await?;
                hub_backoff::Entity::delete_many()
                    .filter(hub_backoff::Column::OrgId.eq(org_id))
                    .exec(db)
                    .await?;
            }
            Err(err) => {
                let reason = err.to_string();
                tracing::warn!(org = %org_id, slug = %env.slug, error = &err as &dyn std::error::Error, "hub provisioning failed");
                report.failed += 1;
                finish(db, &env, Some(&reason)).await?;
                back_off(db, hub.settings, org_id, &reason).await?;
                backing_off = true;
            }
        }
    }
    Ok(report)
}

/// Holds the environment for this pass; false when another pass holds it or it is done.
async fn take_lease(db: &impl ConnectionTrait, env_id: &str, lease_secs: u64) -> Result<bool, DbErr> {
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
async fn finish(
    db: &impl ConnectionTrait,
    env: &flash_environment::Model,
    error: Option<&str>,
) -> Result<(), DbErr> {
    use sea_orm::sea_query::ExprTrait;
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

/// One more consecutive failure for the organization, and its next allowed attempt.
async fn back_off(
    db: &impl ConnectionTrait,
    settings: &HubSettings,
    org_id: &str,
    reason: &str,
) -> Result<(), DbErr> {
    let failures = hub_backoff::Entity::find_by_id(org_id.to_owned())
        .one(db)
        .await?
        .map_or(0, |b| b.failures)
        .saturating_add(1);
    let now = Utc::now();
    let delay = backoff_delay(settings, u32::try_from(failures).unwrap_or(u32::MAX));
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

struct Hub<'a> {
    http: &'a reqwest::Client,
    settings: &'a HubSettings,
}

impl Hub<'_> {
    async fn ensure_repo(&self, env: &flash_environment::Model) -> Result<(), PeerError> {
        let mut request = self
            .http
            .post(format!("{}/repos", self.settings.url.trim_end_matches('/')))
            .timeout(Duration::from_millis(self.settings.timeout_ms))
            .json(&json!({
                "repo": env.hub_repo,
                "ref": env.hub_ref,
                "path": env.hub_path,
                "slug": env.slug,
                "orgId": env.org_id,
                "projectId": env.project_id,
            }));
        if !self.settings.token.is_empty() {
            request = request.bearer_auth(&self.settings.token);
        }
        let response = request.send().await.map_err(|e| PeerError::call("the hub", e))?;
        let status = response.status();
        if status.is_success() || status == reqwest::StatusCode::CONFLICT {
            Ok(())
        } else {
            Err(PeerError::Status {
                peer: "the hub",
                status,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_per_failure_up_to_the_cap() {
        let settings = HubSettings {
            url: String::new(),
            token: String::new(),
            default_repo: "r".into(),
            timeout_ms: 1,
            backoff_base_secs: 30,
            backoff_max_secs: 100,
            lease_secs: 60,
        };
        let secs: Vec<u64> = (1..=4).map(|f| backoff_delay(&settings, f).as_secs()).collect();
        assert_eq!(secs, vec![30, 60, 100, 100]);
        assert_eq!(backoff_delay(&settings, u32::MAX).as_secs(), 100);
    }
}
