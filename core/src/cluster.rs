//! What the instances sharing one PostgreSQL tell each other, on one `LISTEN/NOTIFY`
//! channel: which cached entries to drop (a revoked key, an organization's deletion or
//! membership change, an adapter's owner or liveness) and which job
//! actions have new work for waiting claims. On SQLite (one instance) the same events are
//! delivered in process.
//!
//! Publishing applies the event here at once, then notifies the others. If the listener's
//! connection drops, every cache is cleared (events may have been missed meanwhile), waiting
//! claims look again, and the listener reconnects.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::{IntCounter, IntCounterVec, Opts};
use sea_orm::DatabaseConnection;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::domain::{ApiKeyId, JobAction, OrgId};

/// Which waiting claims new jobs concern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Wake {
    /// Claims of this action.
    Action(JobAction),
    /// Claims of every action (a sweep or a restarted worker requeued jobs of any).
    Any,
}

/// The listener connection's `application_name` (`pg_stat_activity` shows it).
pub const LISTENER_NAME: &str = "keel-listener";

/// The one channel every instance listens on.
pub const CHANNEL: &str = "keel_events";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// An API key was revoked or its settings changed.
    KeyChanged(ApiKeyId),
    /// An organization was deleted or its memberships changed.
    OrgChanged(OrgId),
    /// An adapter was registered, re-attributed, changed liveness or was removed.
    AdapterChanged(String),
    /// Jobs were queued or requeued.
    JobsQueued(Wake),
    /// Webhook deliveries were committed (sent by the committing transaction itself).
    Outbox,
}

impl Event {
    pub fn encode(&self) -> String {
        let (kind, id) = self.parts();
        format!("{kind}:{id}")
    }

    fn parts(&self) -> (&'static str, &str) {
        match self {
            Self::KeyChanged(id) => ("key", id.as_str()),
            Self::OrgChanged(id) => ("org", id.as_str()),
            Self::AdapterChanged(id) => ("adapter", id),
            Self::JobsQueued(Wake::Action(action)) => ("jobs", action.as_str()),
            Self::JobsQueued(Wake::Any) => ("jobs", "*"),
            Self::Outbox => ("outbox", ""),
        }
    }

    fn decode(payload: &str) -> Option<Self> {
        let (kind, id) = payload.split_once(':')?;
        Some(match kind {
            "key" => Self::KeyChanged(ApiKeyId::parse(id).ok()?),
            "org" => Self::OrgChanged(OrgId::parse(id).ok()?),
            "adapter" => Self::AdapterChanged(id.to_owned()),
            "jobs" if id == "*" => Self::JobsQueued(Wake::Any),
            "jobs" => Self::JobsQueued(Wake::Action(JobAction::parse(id)?)),
            "outbox" => Self::Outbox,
            _ => return None,
        })
    }
}

/// A cache that drops what an event makes stale. Caches subscribe when the cluster is made,
/// so this module knows none of them.
pub trait Subscriber: Send + Sync {
    /// Drops the entries `event` makes stale.
    fn apply(&self, event: &Event);
    /// Drops every entry (events may have been missed).
    fn clear(&self);
}

/// The process's side of the channel.
#[derive(Clone)]
pub struct Cluster {
    inner: Arc<Inner>,
}

struct Inner {
    db: DatabaseConnection,
    postgres: bool,
    caches: Vec<Box<dyn Subscriber>>,
    /// Claims waiting for jobs, by action.
    waiting: Mutex<HashMap<JobAction, Arc<Notify>>>,
    /// Cancelled when the process begins to shut down.
    stopping: CancellationToken,
    received: IntCounterVec,
    listener_restarts: IntCounter,
}

impl Cluster {
    /// The cluster of this process; `caches` drop what each event makes stale.
    pub fn new(db: DatabaseConnection, caches: Vec<Box<dyn Subscriber>>) -> prometheus::Result<Self> {
        let postgres = db.get_database_backend() == sea_orm::DbBackend::Postgres;
        let received = IntCounterVec::new(
            Opts::new(
                "keel_cache_invalidations_received_total",
                "Events received from other instances (and this one) on the cluster channel, by kind",
            ),
            &["kind"],
        )?;
        let listener_restarts = IntCounter::new(
            "keel_cluster_listener_reconnects_total",
            "Times the LISTEN connection was lost and every cache was cleared",
        )?;
        Ok(Self {
            inner: Arc::new(Inner {
                db,
                postgres,
                caches,
                waiting: Mutex::new(HashMap::new()),
                stopping: CancellationToken::new(),
                received,
                listener_restarts,
            }),
        })
    }

    pub fn register(&self, registry: &prometheus::Registry) -> prometheus::Result<()> {
        registry.register(Box::new(self.inner.received.clone()))?;
        registry.register(Box::new(self.inner.listener_restarts.clone()))
    }

    /// Applies the event on this instance at once and tells the others. A failed notify
    /// is logged: the other instances then see the change when their entries expire.
    pub async fn publish(&self, event: Event) {
        self.apply(&event);
        if !self.inner.postgres {
            return;
        }
        let notified = crate::database::execute_pg(
            &self.inner.db,
            "SELECT pg_notify($1, $2)",
            vec![CHANNEL.into(), event.encode().into()],
        )
        .await;
        if let Err(err) = notified {
            tracing::warn!(error = %err, event = %event.encode(), "could not notify the other instances");
        }
    }

    fn apply(&self, event: &Event) {
        match event {
            Event::JobsQueued(wake) => self.wake(*wake),
            other => self.inner.caches.iter().for_each(|cache| cache.apply(other)),
        }
    }

    /// Drops every cached entry and wakes every waiting claim (events may have been missed).
    fn forget_everything(&self) {
        self.inner.caches.iter().for_each(|cache| cache.clear());
        let waiting = self.inner.waiting.lock().unwrap_or_else(|p| p.into_inner());
        for notify in waiting.values() {
            notify.notify_waiters();
        }
    }

    fn wake(&self, wake: Wake) {
        let waiting = self.inner.waiting.lock().unwrap_or_else(|p| p.into_inner());
        match wake {
            Wake::Any => waiting.values().for_each(|notify| notify.notify_waiters()),
            Wake::Action(action) => {
                if let Some(notify) = waiting.get(&action) {
                    notify.notify_waiters();
                }
            }
        }
    }

    /// What a claim of `action` waits on for new jobs.
    pub fn jobs_signal(&self, action: JobAction) -> Arc<Notify> {
        let mut waiting = self.inner.waiting.lock().unwrap_or_else(|p| p.into_inner());
        waiting.entry(action).or_default().clone()
    }

    /// Cancelled once the process begins to shut down (waiting claims answer at once).
    pub fn stopping(&self) -> &CancellationToken {
        &self.inner.stopping
    }

    /// The listener on PostgreSQL, to run until the stop signal (nothing to listen to on
    /// SQLite).
    pub fn listener(&self, url: &str) -> Option<impl std::future::Future<Output = ()> + 'static> {
        if !self.inner.postgres {
            return None;
        }
        Some(self.clone().listen(url.to_owned()))
    }

    async fn listen(self, url: String) {
        use std::str::FromStr;

        use sea_orm::sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
        let stopping = self.inner.stopping.clone();
        let mut first = true;
        while !stopping.is_cancelled() {
            let connected = async {
                // A pool of its own, named so an operator can tell the connection apart.
                let options = PgConnectOptions::from_str(&url)?.application_name(LISTENER_NAME);
                let pool = PgPoolOptions::new()
                    .max_connections(1)
                    .acquire_timeout(Duration::from_secs(5))
                    .connect_with(options)
                    .await?;
                let mut listener = PgListener::connect_with(&pool).await?;
                listener.listen(CHANNEL).await?;
                Ok::<_, sea_orm::sqlx::Error>(listener)
            };
            let mut listener = match connected.await {
                Ok(listener) => listener,
                Err(err) => {
                    tracing::warn!(error = %err, "cluster listener cannot connect; retrying in 1 s");
                    tokio::select! {
                        _ = stopping.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    }
                }
            };
            if !first {
                // Whatever was published while no one listened is unknown: start afresh.
                self.forget_everything();
                tracing::info!("cluster listener reconnected; caches cleared");
            }
            first = false;
            loop {
                let next = tokio::select! {
                    _ = stopping.cancelled() => return,
                    next = listener.try_recv() => next,
                };
                match next {
                    Ok(Some(notification)) => {
                        if let Some(event) = Event::decode(notification.payload()) {
                            self.inner.received.with_label_values(&[event.parts().0]).inc();
                            self.apply(&event);
                        }
                    }
                    Ok(None) | Err(_) => {
                        self.inner.listener_restarts.inc();
                        self.forget_everything();
                        tracing::warn!("cluster listener connection lost; caches cleared, reconnecting");
                        break;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{Event, Wake};
    use crate::domain::{ApiKeyId, JobAction, OrgId};

    #[test]
    fn events_survive_the_channel() {
        for event in [
            Event::KeyChanged(ApiKeyId::parse("3f2c0a1e-4b5d-4c6e-8f90-a1b2c3d4e5f6").unwrap()),
            Event::OrgChanged(OrgId::parse("0b6f5f0e-4c1a-4a44-9d5c-2f1c3e0a7b11").unwrap()),
            Event::AdapterChanged("acme/bot".into()),
            Event::JobsQueued(Wake::Action(JobAction::Training)),
            Event::JobsQueued(Wake::Any),
            Event::Outbox,
        ] {
            assert_eq!(Event::decode(&event.encode()), Some(event));
        }
        assert_eq!(Event::decode("nonsense"), None);
        assert_eq!(Event::decode("what:x"), None);
        assert_eq!(Event::decode("jobs:nonsense"), None);
    }
}
