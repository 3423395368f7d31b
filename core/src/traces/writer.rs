//! The batched background trace writer: the proxy hands finished traces over without waiting;
//! the writer inserts them at `flush_rows` rows or after `flush_ms`, whichever comes first,
//! paces itself under load (a batch at most once per `batch_interval_ms`), and drains
//! everything it holds at shutdown. The queue is bounded: when it is full, a trace is
//! dropped, counted (`keel_traces_dropped_total`) and logged, never silently.
//!
//! The hand-over is a locked queue, not a channel, so the writer is woken per batch rather
//! than per trace (docs/ARCHITECTURE.md, "The recording proxy").

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use entities::trace;
use prometheus::{IntCounter, Registry};
use sea_orm::{DatabaseConnection, DbErr, RuntimeErr};
use tokio::sync::{oneshot, Notify};
use tokio::time::Instant;

use crate::config::TraceSettings;

use super::repo::{self, MAX_BATCH_ROWS};
const WRITE_ATTEMPTS: u32 = 3;

/// A trace to be finished (parsed, redacted) on the writer's task, off the request path.
pub type PendingTrace = Box<dyn FnOnce() -> trace::Model + Send>;

/// What the proxy and the writer share.
struct Shared {
    queue: Mutex<Queue>,
    wake: Notify,
    capacity: usize,
    flush_rows: usize,
}

#[derive(Default)]
struct Queue {
    traces: VecDeque<PendingTrace>,
    /// Traces ever queued: a drain waits for the writer to have written this many.
    queued_total: u64,
    drains: Vec<(u64, oneshot::Sender<()>)>,
    /// Every handle is gone: write what is left and stop.
    closed: bool,
    /// The writer task ended (or panicked): nothing queued now would ever be written.
    writer_gone: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A panic while holding the lock leaves the queue itself consistent (every change
        // is one push or drain), so a poisoned lock is taken over.
        self.queue
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The proxy's side; the last one dropped closes the queue (the writer then stops).
struct Handle(Arc<Shared>);

impl Drop for Handle {
    fn drop(&mut self) {
        self.0.lock().closed = true;
        self.0.wake.notify_one();
    }
}

#[derive(Clone)]
pub struct TraceMetrics {
    pub recorded: IntCounter,
    pub written: IntCounter,
    pub batches: IntCounter,
    pub dropped: IntCounter,
    pub refused: IntCounter,
    pub write_failures: IntCounter,
}

impl TraceMetrics {
    fn new() -> prometheus::Result<Self> {
        let counter = |name: &str, help: &str| IntCounter::new(name, help);
        Ok(Self {
            recorded: counter("keel_traces_recorded_total", "Traces handed to the trace writer")?,
            written: counter("keel_traces_written_total", "Traces inserted into the database")?,
            batches: counter(
                "keel_trace_batches_written_total",
                "Batches (one transaction each) the trace writer committed (written / batches = rows per batch)",
            )?,
            dropped: counter(
                "keel_traces_dropped_total",
                "Traces dropped because the writer's queue was full",
            )?,
            refused: counter(
                "keel_traces_refused_total",
                "Traces the database refused: their organization or project deleted before they were written, or a value it cannot hold",
            )?,
            write_failures: counter(
                "keel_traces_write_failures_total",
                "Traces lost because the database refused them after retries",
            )?,
        })
    }

    pub fn register(&self, registry: &Registry) -> prometheus::Result<()> {
        for counter in [
            &self.recorded,
            &self.written,
            &self.batches,
            &self.dropped,
            &self.refused,
            &self.write_failures,
        ] {
            registry.register(Box::new(counter.clone()))?;
        }
        Ok(())
    }
}

#[derive(Clone)]
pub struct TraceWriter {
    handle: Arc<Handle>,
    pub metrics: TraceMetrics,
}

impl TraceWriter {
    /// Starts the writer task (inside the actix system).
    pub fn start(
        db: DatabaseConnection,
        settings: &TraceSettings,
        figures: crate::metrics::Metrics,
        tasks: &crate::tasks::Tasks,
    ) -> prometheus::Result<Self> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue::default()),
            wake: Notify::new(),
            capacity: settings.queue_capacity.max(1),
            flush_rows: settings.flush_rows.clamp(1, MAX_BATCH_ROWS),
        });
        let metrics = TraceMetrics::new()?;
        let pace = Pace {
            flush_every: Duration::from_millis(settings.flush_ms),
            batch_interval: Duration::from_millis(settings.batch_interval_ms),
        };
        tasks.spawn(
            "trace writer",
            run(db, shared.clone(), pace, metrics.clone(), figures),
        );
        Ok(Self {
            handle: Arc::new(Handle(shared)),
            metrics,
        })
    }

    /// Hands over a trace that the writer finishes building (parsing and redacting the
    /// response) before it inserts it, so the proxy's request path does not pay for it.
    pub fn record_pending(&self, pending: PendingTrace) {
        let shared = &self.handle.0;
        let queued = {
            let mut queue = shared.lock();
            if queue.writer_gone {
                Err("the trace writer has stopped")
            } else if queue.traces.len() >= shared.capacity {
                Err("the trace queue is full")
            } else {
                queue.traces.push_back(pending);
                queue.queued_total += 1;
                Ok(queue.traces.len())
            }
        };
        match queued {
            Ok(len) => {
                self.metrics.recorded.inc();
                // A batch starts (the writer starts its clock), is full, or is a whole
                // backlog batch (written even before its paced turn); in between the writer
                // sleeps on.
                if len == 1 || len == shared.flush_rows || len == MAX_BATCH_ROWS {
                    shared.wake.notify_one();
                }
            }
            Err(reason) => {
                self.metrics.dropped.inc();
                tracing::warn!(reason, "trace dropped");
            }
        }
    }

    /// Traces waiting for the writer now.
    pub fn queue_depth(&self) -> usize {
        self.handle.0.lock().traces.len()
    }

    /// Writes everything handed over so far; answers when it is in the database (at once
    /// if the writer is gone).
    /// Closes the queue: the writer writes what it holds, then stops (shutdown awaits it).
    pub fn close(&self) {
        let shared = &self.handle.0;
        shared.lock().closed = true;
        shared.wake.notify_one();
    }

    pub async fn drain(&self) {
        let shared = &self.handle.0;
        let (ack, done) = oneshot::channel();
        {
            let mut queue = shared.lock();
            if queue.writer_gone {
                return;
            }
            let upto = queue.queued_total;
            queue.drains.push((upto, ack));
        }
        shared.wake.notify_one();
        let _ = done.await;
    }
}

/// What the writer takes from the queue in one turn.
struct Turn {
    traces: Vec<PendingTrace>,
    /// The drains that this turn's write completes.
    drains: Vec<(u64, oneshot::Sender<()>)>,
    last: bool,
}

/// Dropped when the writer task ends, however it ends (a panic in a trace's finishing, the
/// runtime shutting down): waiting drains are answered, queued traces counted as dropped, and
/// later ones refused, instead of a drain (the shutdown's) waiting forever.
struct WriterGone {
    shared: Arc<Shared>,
    metrics: TraceMetrics,
}

impl Drop for WriterGone {
    fn drop(&mut self) {
        let mut queue = self.shared.lock();
        queue.writer_gone = true;
        queue.drains.clear();
        let lost = queue.traces.len();
        queue.traces.clear();
        if lost > 0 {
            self.metrics.dropped.inc_by(lost as u64);
            tracing::error!(traces = lost, "the trace writer stopped; queued traces are lost");
        }
    }
}

/// When the writer writes.
struct Pace {
    /// The longest a trace waits for its batch (`traces.flush_ms`).
    flush_every: Duration,
    /// The shortest time from one batch's start to the next's, unless a drain, the shutdown,
    /// a backlog of a whole batch (`MAX_BATCH_ROWS` rows) or `flush_every` calls for one sooner
    /// (`traces.batch_interval_ms`).
    batch_interval: Duration,
}

async fn run(
    db: DatabaseConnection,
    shared: Arc<Shared>,
    pace: Pace,
    metrics: TraceMetrics,
    figures: crate::metrics::Metrics,
) {
    let _gone = WriterGone {
        shared: shared.clone(),
        metrics: metrics.clone(),
    };
    let mut taken_total: u64 = 0;
    // When the oldest queued trace must be written by; set when the writer first sees it.
    let mut deadline: Option<Instant> = None;
    // When the next batch may start, however full it is.
    let mut next_batch = Instant::now();
    loop {
        let (turn, wake_at) = {
            let mut queue = shared.lock();
            let now = Instant::now();
            let due = deadline.is_some_and(|at| now >= at);
            let len = queue.traces.len();
            let full = len >= shared.flush_rows;
            let flush_now = (full && now >= next_batch)
                || len >= MAX_BATCH_ROWS
                || !queue.drains.is_empty()
                || queue.closed
                || (due && len > 0);
            if flush_now {
                // One batch's worth at a time: a backlog is written in large batches, and
                // the queue keeps taking traces meanwhile.
                let take = queue.traces.len().min(MAX_BATCH_ROWS);
                let traces: Vec<PendingTrace> = queue.traces.drain(..take).collect();
                taken_total += take as u64;
                let (answered, waiting): (Vec<_>, Vec<_>) = std::mem::take(&mut queue.drains)
                    .into_iter()
                    .partition(|(upto, _)| *upto <= taken_total);
                queue.drains = waiting;
                deadline = None;
                next_batch = now + pace.batch_interval;
                let turn = Turn {
                    traces,
                    drains: answered,
                    last: queue.closed && queue.traces.is_empty(),
                };
                (Some(turn), None)
            } else {
                if len == 0 {
                    deadline = None;
                } else if deadline.is_none() {
                    deadline = Some(now + pace.flush_every);
                }
                // A full batch waits for its turn; any other for its deadline (or a wake-up).
                let wake_at = deadline.map(|at| if full { at.min(next_batch) } else { at });
                (None, wake_at)
            }
        };
        match turn {
            Some(turn) => {
                let batch: Vec<trace::Model> = turn.traces.into_iter().map(|pending| pending()).collect();
                count_tokens(&figures, &batch);
                let oldest = batch.iter().map(|t| t.created_at).min();
                flush(&db, batch, &metrics).await;
                if let Some(oldest) = oldest {
                    let lag = (chrono::Utc::now() - oldest).num_milliseconds().max(0) as f64 / 1000.0;
                    figures.trace_lag.set(lag);
                }
                for (_, ack) in turn.drains {
                    let _ = ack.send(());
                }
                if turn.last {
                    return;
                }
            }
            None => match wake_at {
                Some(at) => {
                    let _ = tokio::time::timeout_at(at, shared.wake.notified()).await;
                }
                None => shared.wake.notified().await,
            },
        }
    }
}

/// `keel_proxy_tokens_total`, counted here on the writer's task (off the proxy's path).
fn count_tokens(figures: &crate::metrics::Metrics, batch: &[trace::Model]) {
    for trace in batch {
        let model = trace.model.as_deref().unwrap_or("");
        for (kind, tokens) in [
            ("prompt", trace.prompt_tokens),
            ("completion", trace.completion_tokens),
        ] {
            if let Some(tokens) = tokens.filter(|t| *t > 0) {
                figures.count_tokens(&trace.provider, model, kind, tokens as u64);
            }
        }
    }
}

/// Writes one batch (at most [`MAX_BATCH_ROWS`]). A part the database refuses (a row whose
/// organization or project was deleted since it was recorded, or holding a value it cannot
/// store) is split in halves until only the rows it refuses are left: those are dropped and
/// counted, every other row is written. Any other failure (the database unreachable) is
/// retried whole, then counted as lost.
async fn flush(db: &DatabaseConnection, batch: Vec<trace::Model>, metrics: &TraceMetrics) {
    let mut parts = vec![batch];
    while let Some(mut part) = parts.pop() {
        if part.is_empty() {
            continue;
        }
        match write_retrying(db, &part).await {
            Ok(()) => {
                metrics.written.inc_by(part.len() as u64);
                metrics.batches.inc();
            }
            Err(WriteError::Refused(_)) if part.len() > 1 => {
                let second = part.split_off(part.len() / 2);
                parts.push(second);
                parts.push(part);
            }
            Err(WriteError::Refused(err)) => {
                metrics.refused.inc();
                tracing::warn!(error = %err, trace_id = %part[0].id, org_id = %part[0].org_id,
                    "the database refused a trace (its organization or project is gone, or it holds a value the database cannot); it is dropped");
            }
            Err(WriteError::Failed(err)) => {
                metrics.write_failures.inc_by(part.len() as u64);
                tracing::error!(error = %err, traces = part.len(), "writing traces failed; they are lost");
            }
        }
    }
}

enum WriteError {
    /// A constraint or a column refused a row: the same rows would be refused again.
    Refused(DbErr),
    /// Anything else, after [`WRITE_ATTEMPTS`].
    Failed(DbErr),
}

/// A row PostgreSQL refuses for what it holds (SQLSTATE class 22, data exception: NUL in
/// text, a number out of range; or 23, any integrity constraint, beyond the unique and
/// foreign keys sea-orm names): the same rows would be refused again.
fn refuses_value(err: &DbErr) -> bool {
    let (DbErr::Exec(RuntimeErr::SqlxError(err)) | DbErr::Query(RuntimeErr::SqlxError(err))) = err else {
        return false;
    };
    err.as_database_error()
        .and_then(|err| err.try_downcast_ref::<sea_orm::sqlx::postgres::PgDatabaseError>())
        .is_some_and(|err| matches!(err.code().get(..2), Some("22" | "23")))
}

async fn write_retrying(db: &DatabaseConnection, traces: &[trace::Model]) -> Result<(), WriteError> {
    let mut attempt = 0;
    // A pool of the writer's own, opened on its runtime, once the shared pool's connections
    // turn out to belong to a runtime that is gone.
    let mut own: Option<DatabaseConnection> = None;
    loop {
        attempt += 1;
        match repo::insert_traces(own.as_ref().unwrap_or(db), traces).await {
            Ok(queued) => {
                if queued > 0 {
                    super::push::exporter::queued(queued);
                }
                return Ok(());
            }
            Err(err) if err.sql_err().is_some() || refuses_value(&err) => {
                return Err(WriteError::Refused(err))
            }
            Err(err) if attempt < WRITE_ATTEMPTS => {
                if own.is_none() && runtime_gone(&err) {
                    own = private_pool(db).await;
                }
                tracing::warn!(error = %err, attempt, "writing traces failed; retrying");
                tokio::time::sleep(Duration::from_millis(100 * u64::from(attempt))).await;
            }
            Err(err) => return Err(WriteError::Failed(err)),
        }
    }
}

/// Whether a connection failed because the runtime that opened it is shutting down (an HTTP
/// worker's, at SIGTERM): every connection that runtime opened fails the same way, however
/// often it is retried.
fn runtime_gone(err: &DbErr) -> bool {
    err.to_string().contains("being shutdown")
}

/// A one-connection PostgreSQL pool with the shared pool's options, opened here (on the
/// writer's runtime, which outlives the HTTP workers'). `None` on SQLite (its connections run
/// on threads of their own) or when it cannot connect.
async fn private_pool(db: &DatabaseConnection) -> Option<DatabaseConnection> {
    if db.get_database_backend() != sea_orm::DbBackend::Postgres {
        return None;
    }
    let options = db.get_postgres_connection_pool().connect_options();
    match sea_orm::sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with((*options).clone())
        .await
    {
        Ok(pool) => {
            tracing::warn!(
                "the shared pool's connections belong to a stopped runtime: the trace writer opens its own"
            );
            Some(sea_orm::SqlxPostgresConnector::from_sqlx_postgres_pool(pool))
        }
        Err(err) => {
            tracing::error!(error = %err, "the trace writer could not open a connection of its own");
            None
        }
    }
}
