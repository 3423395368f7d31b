//! The queue actor of an instance: what one process must serialize, and nothing else. New
//! plain jobs gathered into one statement per batch (group commit), the timers that queue
//! scheduled jobs when due, and the periodic stale sweep. Claims, reports and heartbeats
//! never pass through it: they go straight to the database, which decides between them
//! (`FOR UPDATE SKIP LOCKED`, guarded updates from the transition table).

use std::collections::HashSet;
use std::time::Duration;

use actix::prelude::*;
use entities::training_job;
use sea_orm::{DatabaseConnection, DbErr};
use tokio::sync::oneshot;

use super::repo::{self, EndedAttempt, NewJob, RetryPolicy, SweepCounts};
use crate::cluster::{Cluster, Event};
use crate::domain::JobAction;
use crate::metrics::Metrics;

#[derive(Clone)]
pub struct QueueConfig {
    pub stale_after: Duration,
    pub max_attempts: u32,
    pub sweep_interval: Duration,
    pub max_batch: usize,
    /// A retryable failure's first wait, doubling per attempt...
    pub retry_backoff_base: Duration,
    /// ...up to this.
    pub retry_backoff_max: Duration,
}

impl QueueConfig {
    pub fn retry_policy(&self) -> RetryPolicy {
        let chrono = |d: Duration| chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX);
        RetryPolicy {
            max_attempts: self.max_attempts.min(i32::MAX as u32) as i32,
            backoff_base: chrono(self.retry_backoff_base),
            backoff_max: chrono(self.retry_backoff_max),
        }
    }
}

pub struct QueueActor {
    db: DatabaseConnection,
    /// Wakes waiting claims (here and on other instances) when jobs are queued or requeued.
    cluster: Cluster,
    metrics: Metrics,
    config: QueueConfig,
    enqueues: Vec<(NewJob, Reply<training_job::Model>)>,
    enqueuing: bool,
}

impl QueueActor {
    pub fn new(db: DatabaseConnection, cluster: Cluster, metrics: Metrics, config: QueueConfig) -> Self {
        Self {
            db,
            cluster,
            metrics,
            config,
            enqueues: Vec::new(),
            enqueuing: false,
        }
    }

    /// Inserts the waiting new jobs in one statement; jobs arriving meanwhile wait for the
    /// next (group commit, like reports).
    fn flush_enqueues(&mut self, ctx: &mut Context<Self>) {
        if self.enqueues.is_empty() {
            return;
        }
        let take = self.enqueues.len().min(self.config.max_batch.max(1));
        let (jobs, replies): (Vec<_>, Vec<_>) = self.enqueues.drain(..take).unzip();
        self.enqueuing = true;
        let db = self.db.clone();
        let cluster = self.cluster.clone();
        // Its own task, like every database call of this actor.
        let insert = actix::spawn(async move {
            let inserted = repo::insert_jobs(&db, jobs).await;
            let actions: HashSet<JobAction> = inserted
                .iter()
                .filter_map(|job| job.as_ref().ok())
                .map(|job| job.action)
                .collect();
            for action in actions {
                cluster
                    .publish(Event::JobsQueued(crate::cluster::Wake::Action(action)))
                    .await;
            }
            inserted
        });
        ctx.spawn(insert.into_actor(self).map(move |results, act, ctx| {
            // A scheduled job is queued at its time to the millisecond by the instance that
            // made it (the poll of every instance covers a restart in between).
            let now = chrono::Utc::now();
            let mut due: Vec<chrono::DateTime<chrono::Utc>> = results
                .iter()
                .flatten()
                .filter_map(|job| job.as_ref().ok().and_then(|job| job.scheduled_at))
                .collect();
            due.sort();
            due.dedup();
            for at in due.into_iter().take(MAX_PROMOTION_TIMERS) {
                let delay = (at - now).to_std().unwrap_or_default();
                ctx.run_later(delay, |act, _| act.promote());
            }
            answer_all(replies, results.map_err(QueueError::from), "queueing jobs");
            act.enqueuing = false;
            act.flush_enqueues(ctx);
        }));
    }
}

/// How often every instance looks for scheduled jobs that came due.
const PROMOTION_POLL: Duration = Duration::from_secs(1);
/// Timers a batch of new scheduled jobs sets at most (their earliest times).
const MAX_PROMOTION_TIMERS: usize = 64;

impl QueueActor {
    /// Queues the scheduled jobs that came due and wakes the claims waiting on their
    /// actions, here and on every instance.
    fn promote(&self) {
        let db = self.db.clone();
        let cluster = self.cluster.clone();
        // Its own task, like every database call of this actor.
        actix::spawn(async move {
            // A read first: the poll writes (SQLite's one writer included) only when a job
            // is due.
            let now = chrono::Utc::now();
            let due = match repo::next_due(&db).await {
                Ok(next) => next.is_some_and(|at| at <= now),
                Err(err) => {
                    tracing::warn!(error = %err, "reading the next scheduled job failed");
                    return;
                }
            };
            if !due {
                return;
            }
            match repo::promote_due(&db, now).await {
                Ok(actions) => {
                    for action in actions {
                        cluster
                            .publish(Event::JobsQueued(crate::cluster::Wake::Action(action)))
                            .await;
                    }
                }
                Err(err) => tracing::warn!(error = %err, "queueing due scheduled jobs failed"),
            }
        });
    }
}

/// Why the queue could not answer; every kind is a 503 (retry) to the caller.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    #[error("the queue's database call failed")]
    Database(#[from] DbErr),
    /// The group commit this request was part of failed as a whole (logged once, with its
    /// cause, for the whole batch).
    #[error("the batch this request was part of failed")]
    Batch,
    #[error("the queue's task ended early")]
    Task(#[from] tokio::task::JoinError),
    #[error("the queue actor did not take the request")]
    Mailbox(#[from] MailboxError),
    #[error("the queue stopped before answering")]
    Stopped,
}

/// Sends `msg` to the queue actor and waits for its answer.
pub async fn ask<M, T>(queue: &Addr<QueueActor>, msg: M) -> Result<T, QueueError>
where
    M: Message<Result = Result<T, QueueError>> + Send + 'static,
    T: Send + 'static,
    QueueActor: Handler<M>,
{
    queue.send(msg).await?
}

type Reply<T> = oneshot::Sender<Result<T, QueueError>>;

/// Answers every request of a group commit with its own outcome; when the batch's task or
/// statement failed as a whole, that is logged once and every request told so.
fn answer_all<T>(replies: Vec<Reply<T>>, outcomes: Result<Vec<Result<T, DbErr>>, QueueError>, what: &str) {
    match outcomes {
        Ok(outcomes) => {
            for (reply, outcome) in replies.into_iter().zip(outcomes) {
                let _ = reply.send(outcome.map_err(QueueError::from));
            }
        }
        Err(err) => {
            tracing::error!(error = &err as &dyn std::error::Error, "{what} failed");
            for reply in replies {
                let _ = reply.send(Err(QueueError::Batch));
            }
        }
    }
}

impl Actor for QueueActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(4096);
        ctx.run_interval(PROMOTION_POLL, |act, _| act.promote());
        if !self.config.sweep_interval.is_zero() {
            ctx.run_interval(self.config.sweep_interval, |act, _| {
                let db = act.db.clone();
                let config = act.config.clone();
                let cluster = act.cluster.clone();
                let metrics = act.metrics.clone();
                // Its own task, like every database call of this actor.
                actix::spawn(async move {
                    match sweep(&db, &config, &cluster, &metrics).await {
                        Ok(counts) if counts != SweepCounts::default() => {
                            tracing::info!(?counts, "stale job sweep");
                        }
                        Ok(_) => {}
                        Err(err) => tracing::warn!(error = %err, "stale job sweep failed"),
                    }
                });
            });
        }
    }
}

/// Requeues stale jobs; waiting claims of every action look again when any went back.
async fn sweep(
    db: &DatabaseConnection,
    config: &QueueConfig,
    cluster: &Cluster,
    metrics: &Metrics,
) -> Result<SweepCounts, DbErr> {
    let stale_after = chrono::Duration::from_std(config.stale_after).unwrap_or(chrono::Duration::MAX);
    let (counts, ended, settled) = repo::requeue_stale(db, stale_after, config.max_attempts as i32).await?;
    super::logged::settled(&settled);
    // The repo answers the stopped attempts first, then the failed, then the requeued.
    let (stopped, rest) = ended.split_at((counts.stopped as usize).min(ended.len()));
    let (failed, requeued) = rest.split_at((counts.failed as usize).min(rest.len()));
    super::logged::swept("job.stale_stopped", stopped);
    super::logged::swept("job.stale_failed", failed);
    super::logged::swept("job.requeued_stale", requeued);
    observe_ended(metrics, &ended);
    metrics
        .requeued
        .with_label_values(&["stale"])
        .inc_by(counts.requeued);
    metrics.attempts_exhausted.inc_by(counts.failed);
    if counts.requeued > 0 {
        cluster
            .publish(Event::JobsQueued(crate::cluster::Wake::Any))
            .await;
    }
    Ok(counts)
}

/// Counts ended attempts in the run metric (and the retried ones as retries).
pub fn observe_ended(metrics: &Metrics, ended: &[EndedAttempt]) {
    for attempt in ended {
        let ran = attempt
            .row
            .claimed_at
            .map_or(0.0, |at| (attempt.row.ended_at - at).as_seconds_f64());
        metrics.attempt_ended(attempt.action, attempt.row.outcome, ran);
    }
}

/// A new job; queued together with the others arriving meanwhile.
#[derive(Message)]
#[rtype(result = "Result<training_job::Model, QueueError>")]
pub struct Enqueue(pub NewJob);

impl Handler<Enqueue> for QueueActor {
    type Result = ResponseFuture<Result<training_job::Model, QueueError>>;

    fn handle(&mut self, msg: Enqueue, ctx: &mut Self::Context) -> Self::Result {
        let (tx, rx) = oneshot::channel();
        self.enqueues.push((msg.0, tx));
        if !self.enqueuing {
            self.flush_enqueues(ctx);
        }
        Box::pin(async move { rx.await.unwrap_or(Err(QueueError::Stopped)) })
    }
}

#[derive(Message)]
#[rtype(result = "Result<SweepCounts, QueueError>")]
pub struct RequeueStale;

impl Handler<RequeueStale> for QueueActor {
    type Result = ResponseFuture<Result<SweepCounts, QueueError>>;

    fn handle(&mut self, _: RequeueStale, _: &mut Self::Context) -> Self::Result {
        let db = self.db.clone();
        let config = self.config.clone();
        let cluster = self.cluster.clone();
        let metrics = self.metrics.clone();
        Box::pin(async move { Ok(sweep(&db, &config, &cluster, &metrics).await?) })
    }
}

/// Stops the actor (shutdown): no sweep runs against a closed pool.
#[derive(Message)]
#[rtype(result = "()")]
pub struct Shutdown;

impl Handler<Shutdown> for QueueActor {
    type Result = ();

    fn handle(&mut self, _: Shutdown, ctx: &mut Self::Context) {
        ctx.stop();
    }
}
