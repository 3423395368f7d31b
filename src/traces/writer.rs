//! The batched background trace writer: the proxy hands finished traces over without waiting;
//! the writer inserts them at `flush_rows` rows or after `flush_ms`, whichever comes first,
//! and drains everything it holds at shutdown. The queue is bounded: when it is full, a trace
//! is dropped, counted (`keel_traces_dropped_total`) and logged, never silently.

use std::time::Duration;

use entities::trace;
use prometheus::{IntCounter, Registry};
use sea_orm::{DatabaseConnection, EntityTrait, IntoActiveModel};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// Rows per insert statement (17 columns; SQLite allows 32,766 parameters).
const INSERT_CHUNK: usize = 500;
const WRITE_ATTEMPTS: u32 = 3;

/// A trace to be finished (parsed, redacted) on the writer's task, off the request path.
pub type PendingTrace = Box<dyn FnOnce() -> trace::Model + Send>;

enum Message {
    Trace(PendingTrace),
    Drain(oneshot::Sender<()>),
}

#[derive(Clone)]
pub struct TraceMetrics {
    pub recorded: IntCounter,
    pub written: IntCounter,
    pub dropped: IntCounter,
    pub write_failures: IntCounter,
}

impl TraceMetrics {
    fn new() -> Self {
        let counter = |name: &str, help: &str| {
            IntCounter::new(name, help).unwrap_or_else(|_| unreachable!("valid metric name {name}"))
        };
        Self {
            recorded: counter("keel_traces_recorded_total", "Traces handed to the trace writer"),
            written: counter("keel_traces_written_total", "Traces inserted into the database"),
            dropped: counter(
                "keel_traces_dropped_total",
                "Traces dropped because the writer's queue was full",
            ),
            write_failures: counter(
                "keel_traces_write_failures_total",
                "Traces lost because the database refused them after retries",
            ),
        }
    }

    pub fn register(&self, registry: &Registry) -> prometheus::Result<()> {
        for counter in [&self.recorded, &self.written, &self.dropped, &self.write_failures] {
            registry.register(Box::new(counter.clone()))?;
        }
        Ok(())
    }
}

#[derive(Clone)]
pub struct TraceWriter {
    tx: mpsc::Sender<Message>,
    pub metrics: TraceMetrics,
}

impl TraceWriter {
    /// Starts the writer task (inside the actix system).
    pub fn start(db: DatabaseConnection, flush_rows: usize, flush_every: Duration, capacity: usize) -> Self {
        let (tx, rx) = mpsc::channel(capacity);
        let metrics = TraceMetrics::new();
        actix_web::rt::spawn(run(db, rx, flush_rows, flush_every, metrics.clone()));
        Self { tx, metrics }
    }

    /// Hands over a trace that the writer finishes building (parsing and redacting the
    /// response) before it inserts it, so the proxy's request path does not pay for it.
    pub fn record_pending(&self, pending: PendingTrace) {
        match self.tx.try_send(Message::Trace(pending)) {
            Ok(()) => self.metrics.recorded.inc(),
            Err(err) => {
                self.metrics.dropped.inc();
                let reason = match err {
                    mpsc::error::TrySendError::Full(_) => "the trace queue is full",
                    mpsc::error::TrySendError::Closed(_) => "the trace writer has stopped",
                };
                tracing::warn!(reason, "trace dropped");
            }
        }
    }

    /// Writes everything handed over so far; answers when it is in the database.
    pub async fn drain(&self) {
        let (ack, done) = oneshot::channel();
        if self.tx.send(Message::Drain(ack)).await.is_ok() {
            let _ = done.await;
        }
    }
}

async fn run(
    db: DatabaseConnection,
    mut rx: mpsc::Receiver<Message>,
    flush_rows: usize,
    flush_every: Duration,
    metrics: TraceMetrics,
) {
    let mut batch: Vec<trace::Model> = Vec::with_capacity(flush_rows);
    let mut deadline = Instant::now();
    loop {
        let message = if batch.is_empty() {
            rx.recv().await
        } else {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(message) => message,
                Err(_) => {
                    flush(&db, &mut batch, &metrics).await;
                    continue;
                }
            }
        };
        match message {
            Some(Message::Trace(pending)) => {
                if batch.is_empty() {
                    deadline = Instant::now() + flush_every;
                }
                batch.push(pending());
                if batch.len() >= flush_rows {
                    // Behind: what is already queued goes into the same statement (up to
                    // one statement's rows), so a backlog is written in fewer, larger
                    // transactions. Idle, nothing is queued and the batch stays as it is.
                    let mut acks = Vec::new();
                    while batch.len() < INSERT_CHUNK {
                        match rx.try_recv() {
                            Ok(Message::Trace(pending)) => batch.push(pending()),
                            Ok(Message::Drain(ack)) => {
                                // Everything handed over before it is in this batch.
                                acks.push(ack);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    flush(&db, &mut batch, &metrics).await;
                    for ack in acks {
                        let _ = ack.send(());
                    }
                }
            }
            Some(Message::Drain(ack)) => {
                let mut acks = vec![ack];
                while let Ok(more) = rx.try_recv() {
                    match more {
                        Message::Trace(pending) => batch.push(pending()),
                        Message::Drain(ack) => acks.push(ack),
                    }
                }
                flush(&db, &mut batch, &metrics).await;
                for ack in acks {
                    let _ = ack.send(());
                }
            }
            None => {
                flush(&db, &mut batch, &metrics).await;
                return;
            }
        }
    }
}

async fn flush(db: &DatabaseConnection, batch: &mut Vec<trace::Model>, metrics: &TraceMetrics) {
    for chunk in batch.chunks(INSERT_CHUNK) {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let rows = chunk.iter().cloned().map(IntoActiveModel::into_active_model);
            match trace::Entity::insert_many(rows).exec_without_returning(db).await {
                Ok(_) => {
                    metrics.written.inc_by(chunk.len() as u64);
                    break;
                }
                Err(err) if attempt < WRITE_ATTEMPTS => {
                    tracing::warn!(error = %err, attempt, "writing traces failed; retrying");
                    tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt))).await;
                }
                Err(err) => {
                    metrics.write_failures.inc_by(chunk.len() as u64);
                    tracing::error!(error = %err, traces = chunk.len(), "writing traces failed; they are lost");
                    break;
                }
            }
        }
    }
    batch.clear();
}
