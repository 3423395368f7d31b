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

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::Utc;
use entities::flash_environment;
use futures_util::{stream, StreamExt};
use sea_orm::{ConnectionTrait, DbErr};
use serde::Serialize;
use serde_json::json;

use super::repo;
use crate::config::HubSettings;
use crate::domain::OrgId;
use crate::peer::PeerError;

/// Organizations provisioned at once in a pass (each one's environments go one by one).
const ORG_CONCURRENCY: usize = 8;

#[derive(Debug, Default, Serialize, PartialEq, Eq)]
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

/// One pass over at most `limit` waiting environments (of `org` only, if named). With no hub
/// configured, nothing is called: the environments the pass would have tried are `skipped`,
/// and the pass logs one warning.
pub async fn run_pass(
    db: &impl ConnectionTrait,
    http: &reqwest::Client,
    settings: &HubSettings,
    limit: u64,
    org: Option<&OrgId>,
) -> Result<PassReport, DbErr> {
    let now = Utc::now();
    let waiting = repo::orgs_backing_off(db, org, now).await?;
    let mut report = PassReport {
        skipped: repo::pending_of_orgs(db, org, &waiting).await?,
        ..PassReport::default()
    };
    let candidates = repo::provisioning_candidates(db, org, &waiting, now, limit).await?;
    if settings.url.is_empty() {
        tracing::warn!(
            environments = candidates.len(),
            "no hub is configured (KEEL_HUB_URL): the pass skipped every environment it would have tried"
        );
        report.skipped += candidates.len() as u64;
        return Ok(report);
    }
    let mut by_org: BTreeMap<OrgId, Vec<flash_environment::Model>> = BTreeMap::new();
    for env in candidates {
        by_org.entry(env.org_id.clone()).or_default().push(env);
    }
    let hub = Hub { http, settings };
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
    org_id: &OrgId,
    envs: Vec<flash_environment::Model>,
) -> Result<PassReport, DbErr> {
    let mut report = PassReport::default();
    let mut backing_off = false;
    for env in envs {
        if backing_off || !repo::take_lease(db, &env.id, hub.settings.lease_secs).await? {
            report.skipped += 1;
            continue;
        }
        report.attempted += 1;
        match hub.ensure_repo(&env).await {
            Ok(()) => {
                report.provisioned += 1;
                repo::finish_provisioning(db, &env, None).await?;
                repo::clear_backoff(db, org_id).await?;
            }
            Err(err) => {
                let reason = err.to_string();
                tracing::warn!(org = %org_id, slug = %env.slug, error = &err as &dyn std::error::Error, "hub provisioning failed");
                report.failed += 1;
                repo::finish_provisioning(db, &env, Some(&reason)).await?;
                repo::back_off(db, |n| backoff_delay(hub.settings, n), org_id, &reason).await?;
                backing_off = true;
            }
        }
    }
    Ok(report)
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
