//! Outbound webhooks' flows: an organization's endpoints, the events it is sent, its
//! deliveries' log and replay.

use std::collections::HashMap;

use chrono::{DateTime, Duration, Utc};
use entities::{webhook_delivery, webhook_delivery_attempt, webhook_endpoint};
use sea_orm::TransactionTrait;
use serde_json::json;

use super::repo;
use super::{destination, outbox, signing, WebhookError, Webhooks};
use crate::domain::OrgId;

/// How long a rotated-out secret keeps signing beside the new one.
pub const ROTATION_OVERLAP_HOURS: i64 = 24;
/// Test deliveries an endpoint may be sent a minute.
pub const TESTS_PER_MINUTE: usize = 10;

/// An endpoint as it is created.
pub struct NewEndpoint {
    pub url: String,
    pub events: Vec<String>,
    pub description: Option<String>,
}

/// What a change to an endpoint sets (`None`: unchanged; `Some(None)`: cleared).
#[derive(Default)]
pub struct EndpointChange {
    pub url: Option<String>,
    pub events: Option<Vec<String>>,
    pub description: Option<Option<String>>,
    pub enabled: Option<bool>,
}

fn seal(
    webhooks: &Webhooks,
    org_id: &OrgId,
    endpoint_id: &str,
    secret: &str,
) -> Result<String, WebhookError> {
    let secret_box = webhooks
        .secret_box
        .as_ref()
        .ok_or(WebhookError::SecretsUnconfigured)?;
    secret_box
        .seal(org_id, &format!("webhook:{endpoint_id}"), secret)
        .map_err(WebhookError::Sealing)
}

/// A secret rotated out, sealed, and until when it keeps signing.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PreviousSecret {
    pub sealed: String,
    pub until: DateTime<Utc>,
}

/// The endpoint's rotated-out secrets that still sign at `now`, newest first.
pub fn previous_secrets(endpoint: &webhook_endpoint::Model, now: DateTime<Utc>) -> Vec<PreviousSecret> {
    let mut list: Vec<PreviousSecret> = endpoint
        .previous_secrets
        .as_deref()
        .and_then(|text| serde_json::from_str(text).ok())
        .unwrap_or_default();
    list.retain(|s| s.until > now);
    list.sort_by_key(|s| std::cmp::Reverse(s.until));
    list
}

/// The live secrets of an endpoint, newest first (every rotated-out one while it still
/// signs).
pub(super) fn open_secrets(
    webhooks: &Webhooks,
    endpoint: &webhook_endpoint::Model,
    now: DateTime<Utc>,
) -> Result<Vec<String>, WebhookError> {
    let secret_box = webhooks
        .secret_box
        .as_ref()
        .ok_or(WebhookError::SecretsUnconfigured)?;
    let name = format!("webhook:{}", endpoint.id);
    let mut secrets = vec![secret_box
        .open(&endpoint.org_id, &name, &endpoint.secret_sealed)
        .map_err(WebhookError::Sealing)?];
    for old in previous_secrets(endpoint, now) {
        secrets.push(
            secret_box
                .open(&endpoint.org_id, &name, &old.sealed)
                .map_err(WebhookError::Sealing)?,
        );
    }
    Ok(secrets)
}

/// An endpoint's subscribed events, as stored.
pub fn events_of(endpoint: &webhook_endpoint::Model) -> Vec<String> {
    outbox::events_of(endpoint)
}

/// Creates an endpoint: its URL checked against the destination rules, a new secret (shown
/// once: answered here, stored sealed).
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn create_endpoint(
    webhooks: &Webhooks,
    org_id: &OrgId,
    new: NewEndpoint,
) -> Result<(webhook_endpoint::Model, String), WebhookError> {
    let url = destination::check_url(&new.url, webhooks.rules)?;
    // Checked before the insert: two creations at once may both pass, one over the bound.
    let count = repo::count_endpoints(&webhooks.db, org_id).await?;
    if count >= webhooks.max_endpoints_per_org {
        return Err(WebhookError::EndpointLimit(webhooks.max_endpoints_per_org));
    }
    let id = uuid::Uuid::new_v4().to_string();
    let secret = signing::new_secret();
    let now = Utc::now();
    let endpoint = webhook_endpoint::Model {
        secret_sealed: seal(webhooks, org_id, &id, &secret)?,
        id,
        org_id: org_id.clone(),
        url: url.to_string(),
        description: new.description,
        events: json!(new.events).to_string(),
        previous_secrets: None,
        enabled: true,
        disabled_reason: None,
        created_at: now,
        updated_at: now,
        failing_since: None,
        disabled_at: None,
    };
    repo::insert_endpoint(&webhooks.db, endpoint.clone()).await?;
    Ok((endpoint, secret))
}

/// The organizations' endpoints, oldest first.
#[tracing::instrument(level = "debug", skip_all)]
pub async fn endpoints(
    webhooks: &Webhooks,
    orgs: &[OrgId],
) -> Result<Vec<webhook_endpoint::Model>, WebhookError> {
    Ok(repo::endpoints(&webhooks.db, orgs).await?)
}

/// One of the organizations' endpoints; another organization's is "not found".
#[tracing::instrument(level = "debug", skip_all)]
pub async fn endpoint(
    webhooks: &Webhooks,
    orgs: &[OrgId],
    id: &str,
) -> Result<webhook_endpoint::Model, WebhookError> {
    repo::endpoint(&webhooks.db, orgs, id)
        .await?
        .ok_or(WebhookError::NotFound("endpoint"))
}

/// Changes an endpoint; enabling it again clears why it was disabled.
#[tracing::instrument(level = "debug", skip_all)]
pub async fn update_endpoint(
    webhooks: &Webhooks,
    orgs: &[OrgId],
    id: &str,
    change: EndpointChange,
) -> Result<webhook_endpoint::Model, WebhookError> {
    let mut endpoint = endpoint(webhooks, orgs, id).await?;
    if let Some(url) = change.url {
        endpoint.url = destination::check_url(&url, webhooks.rules)?.to_string();
    }
    if let Some(events) = change.events {
        endpoint.events = json!(events).to_string();
    }
    if let Some(description) = change.description {
        endpoint.description = description;
    }
    if let Some(enabled) = change.enabled {
        if enabled && !endpoint.enabled {
            // A fresh start: the failures that disabled it no longer count.
            endpoint.disabled_reason = None;
            endpoint.disabled_at = None;
            endpoint.failing_since = None;
        } else if !enabled && endpoint.enabled {
            endpoint.disabled_at = Some(Utc::now());
        }
        endpoint.enabled = enabled;
    }
    endpoint.updated_at = Utc::now();
    repo::save_endpoint(&webhooks.db, endpoint.clone()).await?;
    Ok(endpoint)
}

#[tracing::instrument(level = "debug", skip_all)]
pub async fn delete_endpoint(webhooks: &Webhooks, orgs: &[OrgId], id: &str) -> Result<(), WebhookError> {
    let endpoint = endpoint(webhooks, orgs, id).await?;
    match repo::delete_endpoint(&webhooks.db, &endpoint.id).await? {
        true => Ok(()),
        false => Err(WebhookError::NotFound("endpoint")),
    }
}

/// A new secret for the endpoint (answered once) and until when the one it replaces keeps
/// signing beside it (24 hours), so receivers can switch without missing a delivery. Secrets
/// rotated out before keep their own deadlines.
#[tracing::instrument(level = "debug", skip_all)]
pub async fn rotate_secret(
    webhooks: &Webhooks,
    orgs: &[OrgId],
    id: &str,
) -> Result<(String, DateTime<Utc>), WebhookError> {
    let mut endpoint = endpoint(webhooks, orgs, id).await?;
    let secret = signing::new_secret();
    let now = Utc::now();
    let until = now + Duration::hours(ROTATION_OVERLAP_HOURS);
    let sealed = seal(webhooks, &endpoint.org_id, &endpoint.id, &secret)?;
    let mut previous = previous_secrets(&endpoint, now);
    previous.insert(
        0,
        PreviousSecret {
            sealed: std::mem::replace(&mut endpoint.secret_sealed, sealed),
            until,
        },
    );
    endpoint.previous_secrets = Some(json!(previous).to_string());
    endpoint.updated_at = now;
    repo::save_endpoint(&webhooks.db, endpoint).await?;
    Ok((secret, until))
}

/// Sends the endpoint a `webhook.test` event (whatever it subscribes to), at most
/// [`TESTS_PER_MINUTE`] a minute; answers the delivery's id.
#[tracing::instrument(level = "debug", skip_all)]
pub async fn send_test(webhooks: &Webhooks, orgs: &[OrgId], id: &str) -> Result<String, WebhookError> {
    let endpoint = endpoint(webhooks, orgs, id).await?;
    // The count and the insert under one lock, so that sends at once cannot all pass it: this
    // instance's take turns, and on PostgreSQL every instance's wait on the endpoint's row.
    let _turn = webhooks.tests_turn.lock().await;
    let txn = webhooks.db.begin().await?;
    repo::lock_endpoint(&txn, &endpoint.id).await?;
    let now = Utc::now();
    let recent = repo::tests_since(&txn, &endpoint.id, now - Duration::minutes(1)).await?;
    if recent.len() >= TESTS_PER_MINUTE {
        // Free again once the oldest of the last ten leaves the minute.
        let frees_at = recent[recent.len() - TESTS_PER_MINUTE] + Duration::minutes(1);
        let wait = (frees_at - now).num_milliseconds().max(0) as u64;
        return Err(WebhookError::TestsLimited {
            retry_after_secs: wait.div_ceil(1000).max(1),
        });
    }
    let event = outbox::event_row(
        &endpoint.org_id,
        crate::domain::EventType::WebhookTest,
        json!({"endpointId": endpoint.id}),
        Utc::now(),
    );
    let delivery = repo::insert_event(&txn, event, std::slice::from_ref(&endpoint.id))
        .await?
        .pop()
        .ok_or(WebhookError::NotFound("delivery"))?;
    txn.commit().await?;
    outbox::signal();
    Ok(delivery)
}

/// A delivery with its event's type and its attempts, as the log shows it.
pub struct DeliveryLog {
    pub delivery: webhook_delivery::Model,
    pub event_type: String,
    pub attempts: Vec<webhook_delivery_attempt::Model>,
}

/// Where a page of deliveries ends: the last one's time and id.
pub type DeliveryCursor = (DateTime<Utc>, String);

/// How many deliveries of `status` and `event_type` (each when given) an endpoint has.
pub async fn count_deliveries(
    webhooks: &Webhooks,
    orgs: &[OrgId],
    endpoint_id: &str,
    status: Option<crate::domain::DeliveryStatus>,
    event_type: Option<crate::domain::EventType>,
) -> Result<u64, WebhookError> {
    let endpoint = endpoint(webhooks, orgs, endpoint_id).await?;
    Ok(repo::count_deliveries(&webhooks.db, &endpoint.id, status, event_type.map(|t| t.as_str())).await?)
}

/// A page of an endpoint's deliveries, newest first, and the cursor of the next page.
#[tracing::instrument(level = "debug", skip_all, fields(endpoint_id = %endpoint_id))]
pub async fn deliveries(
    webhooks: &Webhooks,
    orgs: &[OrgId],
    endpoint_id: &str,
    status: Option<crate::domain::DeliveryStatus>,
    event_type: Option<crate::domain::EventType>,
    before: Option<DeliveryCursor>,
    limit: u64,
) -> Result<(Vec<DeliveryLog>, Option<DeliveryCursor>), WebhookError> {
    let endpoint = endpoint(webhooks, orgs, endpoint_id).await?;
    let event_type = event_type.map(|t| t.as_str());
    let mut page =
        repo::deliveries(&webhooks.db, &endpoint.id, status, event_type, before, limit + 1).await?;
    let more = page.len() as u64 > limit;
    page.truncate(limit as usize);
    let next = more
        .then(|| page.last().map(|d| (d.created_at, d.id.clone())))
        .flatten();
    let ids: Vec<String> = page.iter().map(|d| d.id.clone()).collect();
    let event_ids: Vec<String> = page.iter().map(|d| d.event_id.clone()).collect();
    let types: HashMap<String, String> = repo::event_types(&webhooks.db, &event_ids)
        .await?
        .into_iter()
        .collect();
    let mut attempts: HashMap<String, Vec<webhook_delivery_attempt::Model>> = HashMap::new();
    for attempt in repo::attempts(&webhooks.db, &ids).await? {
        attempts
            .entry(attempt.delivery_id.clone())
            .or_default()
            .push(attempt);
    }
    let log = page
        .into_iter()
        .map(|delivery| DeliveryLog {
            event_type: types.get(&delivery.event_id).cloned().unwrap_or_default(),
            attempts: attempts.remove(&delivery.id).unwrap_or_default(),
            delivery,
        })
        .collect();
    Ok((log, next))
}

/// One delivery of the organization as its page shows it: the delivery, its event (type and
/// body as sent) and every attempt, oldest first.
pub struct DeliveryDetail {
    pub delivery: webhook_delivery::Model,
    pub event: Option<entities::outbound_event::Model>,
    pub attempts: Vec<webhook_delivery_attempt::Model>,
}

#[tracing::instrument(level = "debug", skip_all)]
pub async fn delivery_detail(
    webhooks: &Webhooks,
    orgs: &[OrgId],
    id: &str,
) -> Result<DeliveryDetail, WebhookError> {
    let delivery = repo::delivery(&webhooks.db, orgs, id)
        .await?
        .ok_or(WebhookError::NotFound("delivery"))?;
    let event = repo::event(&webhooks.db, &delivery.event_id).await?;
    let attempts = repo::attempts(&webhooks.db, std::slice::from_ref(&delivery.id)).await?;
    Ok(DeliveryDetail {
        delivery,
        event,
        attempts,
    })
}

/// Sends the organization's delivery again now (the same event id, so receivers can tell
/// it is one they may have had).
#[tracing::instrument(level = "debug", skip_all)]
pub async fn retry_delivery(webhooks: &Webhooks, orgs: &[OrgId], id: &str) -> Result<(), WebhookError> {
    let delivery = repo::delivery(&webhooks.db, orgs, id)
        .await?
        .ok_or(WebhookError::NotFound("delivery"))?;
    if !repo::retry_delivery(&webhooks.db, &delivery.id).await? {
        return Err(WebhookError::DeliveryInFlight);
    }
    outbox::signal();
    Ok(())
}

/// Every organization's endpoints that keep failing or were disabled for it (the operator's
/// view), with each one's pending deliveries.
#[tracing::instrument(level = "debug", skip_all)]
pub async fn failing_endpoints(
    webhooks: &Webhooks,
    limit: u64,
) -> Result<Vec<(webhook_endpoint::Model, u64)>, WebhookError> {
    let endpoints = repo::failing_endpoints(&webhooks.db, limit).await?;
    let ids: Vec<String> = endpoints.iter().map(|e| e.id.clone()).collect();
    let pending = repo::pending_by_endpoint(&webhooks.db, &ids).await?;
    Ok(endpoints
        .into_iter()
        .map(|e| {
            let n = pending.get(&e.id).copied().unwrap_or(0);
            (e, n)
        })
        .collect())
}

/// What keel did on its own that the organization should see (an endpoint it disabled),
/// newest first.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn console_events(
    webhooks: &Webhooks,
    org_id: &OrgId,
) -> Result<Vec<entities::console_event::Model>, WebhookError> {
    Ok(crate::console::repo::events(&webhooks.db, org_id, 20).await?)
}
