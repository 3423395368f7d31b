//! The dispatcher each instance runs: it claims due deliveries (on PostgreSQL skipping the
//! ones another instance holds), signs and POSTs them, records each attempt and schedules the
//! next. Woken by the commits that write deliveries (on PostgreSQL, those of every instance:
//! see [`super::outbox`]); otherwise it looks every second (retries fall due by the clock).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::collections::HashMap;

use chrono::Utc;
use entities::{outbound_event, webhook_delivery, webhook_endpoint};
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use super::repo::{self, AttemptRecord, Health, FAILED, PENDING, SUCCEEDED};
use super::{destination, schedule, service, signing, Webhooks};

/// How long a claimed delivery is this dispatcher's: if it dies meanwhile, the delivery is
/// due again after that (so it is sent at least once, and never twice at once).
const LEASE: Duration = Duration::from_secs(60);
/// Deliveries claimed at once, and sent at once.
const BATCH: u64 = 64;
const IN_FLIGHT: usize = 16;
/// A delivery's request, connection included.
pub const TIMEOUT: Duration = Duration::from_secs(10);
/// The most of an answer's body that is read; the first 1 KiB of it is kept.
const READ_AT_MOST: usize = 64 * 1024;
const KEPT: usize = 1024;

/// Resolves an endpoint's host and refuses it when an address it resolved to is not one
/// keel may call (the request then connects to those same addresses).
struct CheckedResolver {
    rules: destination::Rules,
}

impl reqwest::dns::Resolve for CheckedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let rules = self.rules;
        Box::pin(async move {
            let addresses: Vec<SocketAddr> = tokio::net::lookup_host((name.as_str(), 0)).await?.collect();
            let ips: Vec<IpAddr> = addresses.iter().map(SocketAddr::ip).collect();
            destination::check_addresses(&ips, rules)?;
            let addresses: reqwest::dns::Addrs = Box::new(addresses.into_iter());
            Ok(addresses)
        })
    }
}

/// The client deliveries go through: no redirects, the destination rules on every address.
pub fn client(rules: destination::Rules) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(TIMEOUT)
        .connect_timeout(TIMEOUT)
        .user_agent("keel-webhooks/1")
        .dns_resolver(Arc::new(CheckedResolver { rules }))
        .build()
}

/// Sends due deliveries until `stop`.
pub async fn run(webhooks: Webhooks, stop: CancellationToken) {
    let client = match client(webhooks.rules) {
        Ok(client) => client,
        Err(err) => {
            tracing::error!(error = %err, "webhook dispatcher: no HTTP client; deliveries wait");
            return;
        }
    };
    let mut woken = super::outbox::subscribe();
    loop {
        let now = Utc::now();
        let lease_until = now + chrono::Duration::from_std(LEASE).unwrap_or_default();
        let claimed = match repo::claim_due(&webhooks.db, now, lease_until, BATCH).await {
            Ok(claimed) => claimed,
            Err(err) => {
                tracing::warn!(error = %err, "webhook dispatcher: claiming due deliveries failed");
                Vec::new()
            }
        };
        let full = claimed.len() as u64 == BATCH;
        // The batch's endpoints and events in two queries, not two per delivery.
        let parts = match Parts::of(&webhooks, &claimed).await {
            Ok(parts) => parts,
            Err(err) => {
                tracing::warn!(error = %err, "webhook dispatcher: reading the claimed deliveries' endpoints and events failed");
                Parts::default()
            }
        };
        futures_util::stream::iter(claimed)
            .for_each_concurrent(IN_FLIGHT, |delivery| {
                deliver(&webhooks, &client, &parts, delivery)
            })
            .await;
        if full {
            continue;
        }
        tokio::select! {
            _ = woken.changed() => {}
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            _ = stop.cancelled() => return,
        }
    }
}

/// Why an attempt did not reach an answer, with its causes (never a secret or the URL).
fn failure(err: impl std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text.chars().take(500).collect()
}

/// The endpoints and events of a claimed batch, by id.
#[derive(Default)]
struct Parts {
    endpoints: HashMap<String, webhook_endpoint::Model>,
    events: HashMap<String, outbound_event::Model>,
}

impl Parts {
    async fn of(webhooks: &Webhooks, claimed: &[webhook_delivery::Model]) -> Result<Self, sea_orm::DbErr> {
        if claimed.is_empty() {
            return Ok(Self::default());
        }
        let endpoint_ids: Vec<String> = claimed.iter().map(|d| d.endpoint_id.clone()).collect();
        let event_ids: Vec<String> = claimed.iter().map(|d| d.event_id.clone()).collect();
        Ok(Self {
            endpoints: repo::endpoints_by_id(&webhooks.db, &endpoint_ids)
                .await?
                .into_iter()
                .map(|e| (e.id.clone(), e))
                .collect(),
            events: repo::events_by_id(&webhooks.db, &event_ids)
                .await?
                .into_iter()
                .map(|e| (e.id.clone(), e))
                .collect(),
        })
    }
}

async fn deliver(
    webhooks: &Webhooks,
    client: &reqwest::Client,
    parts: &Parts,
    delivery: webhook_delivery::Model,
) {
    let claimed_until = delivery.next_attempt_at;
    let outcome = attempt(webhooks, client, parts, &delivery).await;
    let (record, succeeded, health) = match outcome {
        Ok(record) => {
            let ok = record.status_code.is_some_and(|s| (200..300).contains(&s));
            let health = if ok { Health::Succeeded } else { Health::Failed };
            (record, ok, health)
        }
        Err((record, health)) => (record, false, health),
    };
    let seconds = f64::from(record.latency_ms) / 1000.0;
    let (status, next) = match succeeded {
        true => (SUCCEEDED, None),
        false => match schedule::next_retry((delivery.attempts + 1) as u32) {
            Some(wait) => (
                PENDING,
                Some(Utc::now() + chrono::Duration::from_std(wait).unwrap_or_default()),
            ),
            None => (FAILED, None),
        },
    };
    match repo::record_attempt(
        &webhooks.db,
        &delivery,
        claimed_until,
        record,
        status,
        next,
        health,
    )
    .await
    {
        Ok(true) => webhooks.metrics.webhook_attempt(
            match status {
                SUCCEEDED => "succeeded",
                PENDING => "retrying",
                _ => "failed",
            },
            seconds,
        ),
        Ok(false) => {
            tracing::info!(delivery = %delivery.id, "webhook delivery changed while sent; its attempt is not recorded")
        }
        Err(err) => {
            tracing::warn!(delivery = %delivery.id, error = %err, "recording a webhook attempt failed")
        }
    }
}

/// One attempt: the answer's status and the start of its body, or why there was none (and
/// whether the endpoint was called at all).
async fn attempt(
    webhooks: &Webhooks,
    client: &reqwest::Client,
    parts: &Parts,
    delivery: &webhook_delivery::Model,
) -> Result<AttemptRecord, (AttemptRecord, Health)> {
    let attempted_at = Utc::now();
    let started = Instant::now();
    let record = |error: String| AttemptRecord {
        attempted_at,
        status_code: None,
        latency_ms: started.elapsed().as_millis().min(i32::MAX as u128) as i32,
        response: None,
        error: Some(error),
    };
    let failed = |error: String| (record(error), Health::NotCalled);
    let Some(endpoint) = parts.endpoints.get(&delivery.endpoint_id) else {
        return Err(failed("the endpoint is gone".into()));
    };
    if !endpoint.enabled {
        return Err(failed("the endpoint is disabled".into()));
    }
    let Some(event) = parts.events.get(&delivery.event_id) else {
        return Err(failed("the event is gone".into()));
    };
    // The rules may have changed since the URL was saved; a literal address is checked here
    // (a name's addresses are checked as it resolves).
    if let Err(refused) = destination::check_url(&endpoint.url, webhooks.rules) {
        return Err(failed(refused.to_string()));
    }
    let secrets = match service::open_secrets(webhooks, endpoint, attempted_at) {
        Ok(secrets) => secrets,
        Err(err) => return Err(failed(failure(err))),
    };
    let secrets: Vec<&str> = secrets.iter().map(String::as_str).collect();
    let timestamp = attempted_at.timestamp();
    let signature = match signing::signature_header(&secrets, &event.id, timestamp, event.body.as_bytes()) {
        Ok(signature) => signature,
        Err(err) => return Err(failed(failure(err))),
    };
    let sent = client
        .post(&endpoint.url)
        .header("content-type", "application/json")
        .header("webhook-id", &event.id)
        .header("webhook-timestamp", timestamp.to_string())
        .header("webhook-signature", signature)
        .body(event.body.clone())
        .send()
        .await;
    let mut answer = match sent {
        Ok(answer) => answer,
        Err(err) => return Err((record(failure(err.without_url())), Health::Failed)),
    };
    let status_code = i32::from(answer.status().as_u16());
    let mut body = Vec::new();
    while body.len() < READ_AT_MOST {
        match answer.chunk().await {
            Ok(Some(chunk)) => body.extend_from_slice(&chunk[..chunk.len().min(READ_AT_MOST - body.len())]),
            Ok(None) | Err(_) => break,
        }
    }
    body.truncate(KEPT);
    Ok(AttemptRecord {
        attempted_at,
        status_code: Some(status_code),
        latency_ms: started.elapsed().as_millis().min(i32::MAX as u128) as i32,
        response: Some(String::from_utf8_lossy(&body).into_owned()),
        error: None,
    })
}
