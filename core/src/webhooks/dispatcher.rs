//! The dispatcher each instance runs: it claims due deliveries (on PostgreSQL skipping the
//! ones another instance holds), signs and POSTs them, records each attempt and schedules the
//! next. Woken by the commits that write deliveries (on PostgreSQL, those of every instance:
//! see [`super::outbox`]); otherwise it looks every second (retries fall due by the clock).
//!
//! Fair across endpoints: each endpoint has at most [`PER_ENDPOINT`] deliveries in flight
//! here, a claim takes every endpoint's first due delivery before any endpoint's second, and
//! there is no batch to wait for: as a send ends, its slot is taken again. A slow or dead
//! endpoint holds only its own slots; every other endpoint's deliveries go on.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use entities::{outbound_event, webhook_delivery, webhook_endpoint};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::repo::{self, AttemptRecord, Health};
use super::{destination, schedule, service, signing, Webhooks};
use crate::domain::DeliveryStatus;

/// How long a claimed delivery is this dispatcher's: if it dies meanwhile, the delivery is
/// due again after that (so it is sent at least once, and never twice at once).
const LEASE: Duration = Duration::from_secs(60);
/// Deliveries in flight on this dispatcher, in all.
const IN_FLIGHT: usize = 64;
/// Deliveries in flight to one endpoint.
pub const PER_ENDPOINT: usize = 4;
/// A claim made because sends ended waits until this many slots are free (one claim per
/// send would be a query per delivery); a wake-up or the clock claims for any free slot.
const CLAIM_AT_LEAST: usize = 16;
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

/// A host's addresses, if every one of them is one keel may call.
async fn checked_addresses(
    host: &str,
    port: u16,
    rules: destination::Rules,
) -> std::io::Result<Vec<SocketAddr>> {
    let addresses: Vec<SocketAddr> = tokio::net::lookup_host((host, port)).await?.collect();
    let ips: Vec<IpAddr> = addresses.iter().map(SocketAddr::ip).collect();
    destination::check_addresses(&ips, rules).map_err(std::io::Error::other)?;
    Ok(addresses)
}

impl reqwest::dns::Resolve for CheckedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let rules = self.rules;
        Box::pin(async move {
            let addresses: reqwest::dns::Addrs =
                Box::new(checked_addresses(name.as_str(), 0, rules).await?.into_iter());
            Ok(addresses)
        })
    }
}

/// The client deliveries go through: no redirects, the destination rules on every address,
/// and never a proxy from the environment (`HTTPS_PROXY` would take the destination's
/// resolution, and so its check, away from keel). With `proxy_url`, deliveries go through
/// that proxy, each destination resolved and checked by keel first ([`attempt`]).
pub fn client(rules: destination::Rules, proxy_url: Option<&str>) -> reqwest::Result<reqwest::Client> {
    let builder = checked_client_builder(rules, "keel-webhooks/1", TIMEOUT);
    match proxy_url {
        Some(url) => builder.proxy(reqwest::Proxy::all(url)?).build(),
        None => builder.build(),
    }
}

/// A client for calls to destinations people configure (webhook endpoints, OTLP endpoints):
/// no redirects, no proxy from the environment, every address it connects to checked against
/// the destination rules.
pub fn checked_client_builder(
    rules: destination::Rules,
    user_agent: &str,
    timeout: Duration,
) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(timeout)
        .connect_timeout(timeout)
        .user_agent(user_agent)
        .no_proxy()
        .dns_resolver(Arc::new(CheckedResolver { rules }))
}

/// A claimed delivery with what sending it needs.
struct Job {
    delivery: webhook_delivery::Model,
    endpoint: Option<webhook_endpoint::Model>,
    event: Option<outbound_event::Model>,
}

/// What this dispatcher holds: sends in flight, and claimed deliveries waiting for a slot of
/// their endpoint (never more than its slots: a full endpoint is not claimed for).
#[derive(Default)]
struct Slots {
    in_flight: HashMap<String, usize>,
    waiting: HashMap<String, VecDeque<Job>>,
    sending: usize,
    queued: usize,
}

impl Slots {
    /// Endpoints with no slot left here.
    fn busy(&self) -> Vec<String> {
        let mut busy: Vec<String> = self
            .in_flight
            .iter()
            .filter(|(endpoint, n)| {
                **n + self.waiting.get(*endpoint).map_or(0, VecDeque::len) >= PER_ENDPOINT
            })
            .map(|(endpoint, _)| endpoint.clone())
            .collect();
        busy.sort();
        busy
    }

    fn room(&self) -> usize {
        IN_FLIGHT.saturating_sub(self.sending + self.queued)
    }

    /// Sends `job` now if its endpoint has a slot, else keeps it for the next one.
    fn start(
        &mut self,
        job: Job,
        sends: &mut JoinSet<String>,
        webhooks: &Webhooks,
        client: &reqwest::Client,
    ) {
        let endpoint = job.delivery.endpoint_id.clone();
        let n = self.in_flight.entry(endpoint.clone()).or_default();
        if *n >= PER_ENDPOINT {
            self.waiting.entry(endpoint).or_default().push_back(job);
            self.queued += 1;
            return;
        }
        *n += 1;
        self.sending += 1;
        let (webhooks, client) = (webhooks.clone(), client.clone());
        sends.spawn(async move {
            deliver(&webhooks, &client, job).await;
            endpoint
        });
    }

    /// A send to `endpoint` ended: its slot goes to the endpoint's next waiting delivery.
    fn ended(
        &mut self,
        endpoint: String,
        sends: &mut JoinSet<String>,
        webhooks: &Webhooks,
        client: &reqwest::Client,
    ) {
        self.sending -= 1;
        if let Some(n) = self.in_flight.get_mut(&endpoint) {
            *n -= 1;
            if *n == 0 {
                self.in_flight.remove(&endpoint);
            }
        }
        let next = self.waiting.get_mut(&endpoint).and_then(VecDeque::pop_front);
        if self.waiting.get(&endpoint).is_some_and(VecDeque::is_empty) {
            self.waiting.remove(&endpoint);
        }
        if let Some(job) = next {
            self.queued -= 1;
            self.start(job, sends, webhooks, client);
        }
    }
}

/// Claims what the free slots can take and starts it.
async fn claim(
    webhooks: &Webhooks,
    client: &reqwest::Client,
    slots: &mut Slots,
    sends: &mut JoinSet<String>,
) {
    let room = slots.room();
    if room == 0 {
        return;
    }
    let now = Utc::now();
    let lease_until = now + chrono::Duration::from_std(LEASE).unwrap_or_default();
    let claimed = match repo::claim_due(
        &webhooks.db,
        now,
        lease_until,
        room as u64,
        PER_ENDPOINT as u64,
        &slots.busy(),
    )
    .await
    {
        Ok(claimed) => claimed,
        Err(err) => {
            tracing::warn!(error = %err, "webhook dispatcher: claiming due deliveries failed");
            return;
        }
    };
    if claimed.is_empty() {
        return;
    }
    // The claim's endpoints and events in two queries, not two per delivery.
    let parts = match Parts::of(webhooks, &claimed).await {
        Ok(parts) => parts,
        Err(err) => {
            tracing::warn!(error = %err, "webhook dispatcher: reading the claimed deliveries' endpoints and events failed");
            if let Err(err) = repo::release_leases(&webhooks.db, &claimed).await {
                tracing::warn!(error = %err, "webhook dispatcher: giving back leases failed; they lapse");
            }
            return;
        }
    };
    for delivery in claimed {
        let job = Job {
            endpoint: parts.endpoints.get(&delivery.endpoint_id).cloned(),
            event: parts.events.get(&delivery.event_id).cloned(),
            delivery,
        };
        slots.start(job, sends, webhooks, client);
    }
}

/// Sends due deliveries until `stop`; then lets the sends in flight finish (each within
/// [`TIMEOUT`]) and gives back what it claimed and did not send.
pub async fn run(webhooks: Webhooks, stop: CancellationToken) {
    let client = match client(webhooks.rules, webhooks.proxy_url.as_deref()) {
        Ok(client) => client,
        Err(err) => {
            tracing::error!(error = %err, "webhook dispatcher: no HTTP client; deliveries wait");
            return;
        }
    };
    let mut woken = super::outbox::subscribe();
    let mut slots = Slots::default();
    let mut sends: JoinSet<String> = JoinSet::new();
    let mut look = true;
    loop {
        if look || slots.room() >= CLAIM_AT_LEAST {
            claim(&webhooks, &client, &mut slots, &mut sends).await;
        }
        look = tokio::select! {
            Some(ended) = sends.join_next(), if !sends.is_empty() => {
                if let Ok(endpoint) = ended {
                    slots.ended(endpoint, &mut sends, &webhooks, &client);
                }
                // Whatever else ended meanwhile, in one go.
                while let Some(Ok(endpoint)) = sends.try_join_next() {
                    slots.ended(endpoint, &mut sends, &webhooks, &client);
                }
                // Nothing left in flight: look at once (a backlog's next deliveries).
                sends.is_empty()
            }
            _ = woken.changed() => true,
            _ = tokio::time::sleep(Duration::from_secs(1)) => true,
            _ = stop.cancelled() => break,
        };
    }
    let unsent: Vec<webhook_delivery::Model> = slots
        .waiting
        .drain()
        .flat_map(|(_, jobs)| jobs.into_iter().map(|job| job.delivery))
        .collect();
    if let Err(err) = repo::release_leases(&webhooks.db, &unsent).await {
        tracing::warn!(error = %err, "webhook dispatcher: giving back unsent deliveries failed; their leases lapse");
    }
    let _ = tokio::time::timeout(TIMEOUT + Duration::from_secs(1), async {
        while sends.join_next().await.is_some() {}
    })
    .await;
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

/// The endpoints and events of a claim, by id.
#[derive(Default)]
struct Parts {
    endpoints: HashMap<String, webhook_endpoint::Model>,
    events: HashMap<String, outbound_event::Model>,
}

impl Parts {
    async fn of(webhooks: &Webhooks, claimed: &[webhook_delivery::Model]) -> Result<Self, sea_orm::DbErr> {
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

async fn deliver(webhooks: &Webhooks, client: &reqwest::Client, job: Job) {
    let delivery = &job.delivery;
    let claimed_until = delivery.next_attempt_at;
    // Disabled since it was claimed: it waits, its attempts untouched, until enabled again.
    if job.endpoint.as_ref().is_some_and(|e| !e.enabled) {
        if let Err(err) = repo::release_leases(&webhooks.db, std::slice::from_ref(delivery)).await {
            tracing::warn!(delivery = %delivery.id, error = %err, "giving back a disabled endpoint's delivery failed; its lease lapses");
        }
        return;
    }
    // A delivery's span continues the trace of the request whose change announced it.
    let span = tracing::info_span!(
        "webhook.deliver",
        delivery_id = %delivery.id,
        endpoint_id = %delivery.endpoint_id,
        otel.kind = "client",
    );
    if let Some(traceparent) = job.event.as_ref().and_then(|e| e.traceparent.as_deref()) {
        crate::context::continue_from(&span, traceparent);
    }
    let outcome = tracing::Instrument::instrument(attempt(webhooks, client, &job), span).await;
    let (record, succeeded, health) = match outcome {
        Ok(record) => {
            let ok = record.status_code.is_some_and(|s| (200..300).contains(&s));
            let health = match record.status_code {
                _ if ok => Health::Succeeded,
                // The receiver says it is gone for good: disabled, not retried (until enabled).
                Some(410) => Health::Gone,
                _ => Health::Failed,
            };
            (record, ok, health)
        }
        Err((record, health)) => (record, false, health),
    };
    let seconds = f64::from(record.latency_ms) / 1000.0;
    let (status, next) = match succeeded {
        true => (DeliveryStatus::Succeeded, None),
        false => match schedule::next_retry((delivery.attempts + 1) as u32) {
            Some(wait) => (
                DeliveryStatus::Pending,
                Some(Utc::now() + chrono::Duration::from_std(wait).unwrap_or_default()),
            ),
            None => (DeliveryStatus::Failed, None),
        },
    };
    if !succeeded {
        log_failed(&job, &record, status, next);
    }
    match repo::record_attempt(
        &webhooks.db,
        delivery,
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
                DeliveryStatus::Succeeded => "succeeded",
                DeliveryStatus::Pending => "retrying",
                DeliveryStatus::Failed => "failed",
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

/// A failed attempt's line (never the answer's body: it is the receiver's text): INFO while
/// it is retried, WARN once its retries are spent.
fn log_failed(
    job: &Job,
    record: &repo::AttemptRecord,
    status: DeliveryStatus,
    next: Option<chrono::DateTime<Utc>>,
) {
    let delivery = &job.delivery;
    let org_id = job.endpoint.as_ref().map(|e| e.org_id.as_str());
    let event_type = job.event.as_ref().map(|e| e.event_type.as_str());
    // The request whose change announced the event.
    let request_id = job.event.as_ref().and_then(|e| e.request_id.as_deref());
    let error = record
        .error
        .as_deref()
        .map(|e| e.chars().take(300).collect::<String>());
    let attempt = delivery.attempts + 1;
    let next_attempt_at = next.map(|at| at.to_rfc3339());
    macro_rules! failed {
        ($level:ident, $message:literal) => {
            tracing::$level!(
                target: "keel_event",
                event = "webhook.delivery_failed",
                org_id,
                endpoint_id = %delivery.endpoint_id,
                delivery_id = %delivery.id,
                event_type,
                request_id,
                attempt,
                status_code = record.status_code,
                error = error.as_deref(),
                next_attempt_at = next_attempt_at.as_deref(),
                $message
            )
        };
    }
    match status {
        DeliveryStatus::Failed => failed!(warn, "webhook delivery failed; no attempts left"),
        _ => failed!(info, "webhook delivery failed; retried later"),
    }
}

/// One attempt: the answer's status and the start of its body, or why there was none (and
/// whether the endpoint was called at all).
async fn attempt(
    webhooks: &Webhooks,
    client: &reqwest::Client,
    job: &Job,
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
    let Some(endpoint) = &job.endpoint else {
        return Err(failed("the endpoint is gone".into()));
    };
    let Some(event) = &job.event else {
        return Err(failed("the event is gone".into()));
    };
    // The rules may have changed since the URL was saved; a literal address is checked here
    // (a name's addresses are checked as it resolves).
    let url = match destination::check_url(&endpoint.url, webhooks.rules) {
        Ok(url) => url,
        Err(refused) => return Err(failed(refused.to_string())),
    };
    // Through the operator's proxy the proxy resolves the name: keel resolves and checks it
    // first, and does not ask the proxy for a destination it would not call itself.
    if webhooks.proxy_url.is_some() {
        if let (Some(url::Host::Domain(host)), Some(port)) = (url.host(), url.port_or_known_default()) {
            if let Err(err) = checked_addresses(host, port, webhooks.rules).await {
                return Err(failed(failure(err)));
            }
        }
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
    let mut request = client.post(&endpoint.url);
    // The receiver sees the trace (when keel exports its spans).
    if let Some(traceparent) = crate::context::traceparent() {
        request = request.header("traceparent", traceparent);
    }
    let sent = request
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
