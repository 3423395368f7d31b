//! The outbox: the events a change announces are written by the change's own transaction,
//! one pending delivery per enabled endpoint of the organization subscribed to the event.
//! A committed change always has its events; a rolled-back one never does.
//!
//! Waking the dispatchers: on PostgreSQL the writing transaction also sends a `NOTIFY` on
//! the cluster channel, which PostgreSQL delivers at commit (never on rollback) to every
//! instance, this one included. On SQLite (one process) the writer signals this process's
//! dispatchers at once; their claim is a write, so it waits for the writer's commit and
//! sees its rows.

use std::collections::HashMap;
use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use entities::{outbound_event, webhook_endpoint};
use sea_orm::{ColumnTrait, ConnectionTrait, DbBackend, DbErr, EntityTrait, QueryFilter, Statement};
use serde_json::{json, Value};
use tokio::sync::watch;

use super::repo;
use crate::cluster::{self, Event};
use crate::domain::{EventType, OrgId};

/// One event a change announces.
#[derive(Debug, Clone, PartialEq)]
pub struct Announcement {
    pub org_id: OrgId,
    pub event_type: EventType,
    pub data: Value,
}

/// The enabled endpoints of some organizations, with what each subscribes to.
#[derive(Debug, Default)]
pub struct Listeners {
    by_org: HashMap<OrgId, Vec<(String, Vec<String>)>>,
}

impl Listeners {
    pub fn is_empty(&self) -> bool {
        self.by_org.is_empty()
    }

    /// The endpoints of `org_id` subscribed to `event_type`.
    pub fn of(&self, org_id: &OrgId, event_type: EventType) -> Vec<String> {
        self.by_org
            .get(org_id)
            .into_iter()
            .flatten()
            .filter(|(_, events)| event_type.subscribed_by(events))
            .map(|(id, _)| id.clone())
            .collect()
    }
}

/// The events an endpoint is subscribed to, as stored.
pub(super) fn events_of(endpoint: &webhook_endpoint::Model) -> Vec<String> {
    serde_json::from_str(&endpoint.events).unwrap_or_default()
}

/// The enabled endpoints of `org_ids` (one indexed query; none when the list is empty).
pub async fn listeners(db: &impl ConnectionTrait, org_ids: &[OrgId]) -> Result<Listeners, DbErr> {
    let mut listeners = Listeners::default();
    for chunk in org_ids.chunks(500) {
        let rows = webhook_endpoint::Entity::find()
            .filter(webhook_endpoint::Column::OrgId.is_in(chunk.iter().cloned()))
            .filter(webhook_endpoint::Column::Enabled.eq(true))
            .all(db)
            .await?;
        for endpoint in rows {
            let events = events_of(&endpoint);
            listeners
                .by_org
                .entry(endpoint.org_id)
                .or_default()
                .push((endpoint.id, events));
        }
    }
    Ok(listeners)
}

/// An event's row: its body is `{id, type, createdAt, orgId, data}`.
pub(super) fn event_row(
    org_id: &OrgId,
    event_type: EventType,
    data: Value,
    now: DateTime<Utc>,
) -> outbound_event::Model {
    let id = format!("evt_{}", uuid::Uuid::new_v4().simple());
    let body = json!({
        "id": id,
        "type": event_type,
        "createdAt": now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        "orgId": org_id,
        "data": data,
    });
    outbound_event::Model {
        id,
        org_id: org_id.clone(),
        event_type: event_type.as_str().to_owned(),
        body: body.to_string(),
        created_at: now,
        request_id: crate::context::request_id().map(|id| id.to_string()),
        traceparent: crate::context::traceparent(),
    }
}

/// Writes each announcement for the endpoints in `listeners` subscribed to it, within the
/// caller's transaction `db`, and arranges for the dispatchers to be woken by its commit.
/// An announcement nobody listens to writes nothing. Answers the deliveries written.
pub async fn announce(
    db: &impl ConnectionTrait,
    listeners: &Listeners,
    announcements: Vec<Announcement>,
) -> Result<usize, DbErr> {
    let now = Utc::now();
    let mut written = 0;
    for announcement in announcements {
        let endpoints = listeners.of(&announcement.org_id, announcement.event_type);
        if endpoints.is_empty() {
            continue;
        }
        let row = event_row(
            &announcement.org_id,
            announcement.event_type,
            announcement.data,
            now,
        );
        written += repo::insert_event(db, row, &endpoints).await?.len();
    }
    if written > 0 {
        committed_soon(db).await?;
    }
    Ok(written)
}

/// [`listeners`] of the announcements' organizations, then [`announce`].
pub async fn emit(db: &impl ConnectionTrait, announcements: Vec<Announcement>) -> Result<usize, DbErr> {
    if announcements.is_empty() {
        return Ok(0);
    }
    let mut orgs: Vec<OrgId> = announcements.iter().map(|a| a.org_id.clone()).collect();
    orgs.sort();
    orgs.dedup();
    let listeners = listeners(db, &orgs).await?;
    if listeners.is_empty() {
        return Ok(0);
    }
    announce(db, &listeners, announcements).await
}

/// Deliveries are being written by an open transaction: wake the dispatchers once it commits.
async fn committed_soon(db: &impl ConnectionTrait) -> Result<(), DbErr> {
    match db.get_database_backend() {
        DbBackend::Postgres => {
            // Transactional: delivered to every listening instance at commit only.
            db.execute_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                "SELECT pg_notify($1, $2)",
                [cluster::CHANNEL.into(), Event::Outbox.encode().into()],
            ))
            .await?;
        }
        _ => signal(),
    }
    Ok(())
}

/// This process's dispatchers' wake-up (a counter they watch).
static WAKE: LazyLock<watch::Sender<u64>> = LazyLock::new(|| watch::channel(0).0);

/// Wakes this process's dispatchers.
pub fn signal() {
    WAKE.send_modify(|n| *n = n.wrapping_add(1));
}

/// What a dispatcher waits on.
pub fn subscribe() -> watch::Receiver<u64> {
    WAKE.subscribe()
}

/// Wakes the dispatchers when the cluster channel says another instance (or this one, on
/// PostgreSQL) committed deliveries; and when the channel was lost (a wake-up may have been).
pub struct Waker;

impl cluster::Subscriber for Waker {
    fn apply(&self, event: &Event) {
        if *event == Event::Outbox {
            signal();
        }
    }

    fn clear(&self) {
        signal();
    }
}
