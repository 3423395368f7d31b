//! The queue actor of an instance: claims one at a time (so an instance never races
//! itself; billing the claimed jobs' run fees happens after, without holding the turn or the
//! mailbox), terminal reports gathered into one statement per batch (group commit),
//! heartbeats, and the periodic stale sweep. Across instances the database decides
//! (`FOR UPDATE SKIP LOCKED`, conditional updates).

use std::collections::HashSet;
use std::time::Duration;

use actix::prelude::*;
use entities::training_job;
use futures_util::future::join_all;
use sea_orm::{DatabaseConnection, DbErr};
use tokio::sync::oneshot;

use super::repo::{self, EndedAttempt, Held, NewJob, Report, ReportOutcome, RetryPolicy, SweepCounts};
use crate::billing::actor::Ledger;
use crate::billing::ledger::{EntryKind, LedgerError, LedgerOp};
use crate::cluster::{Cluster, Event};
use crate::domain::{Cents, IdempotencyKey, JobAction, JobId};
use crate::metrics::Metrics;

#[derive(Clone)]
pub struct QueueConfig {
    pub stale_after: Duration,
    pub max_attempts: u32,
    pub sweep_interval: Duration,
    pub run_fee: Cents,
    pub max_batch: usize,
    /// A retryable failure's first wait, doubling per attempt...
    pub retry_backoff_base: Duration,
    /// ...up to this.
    pub retry_backoff_max: Duration,
    /// Running jobs an organization may hold unless an operator set its own cap; 0: none.
    pub max_running_per_org: u32,
    /// Jobs blocked for want of funds are queued again at the organization's next credit.
    pub requeue_blocked_on_credit: bool,
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
    ledger: Ledger,
    /// Wakes waiting claims (here and on other instances) when jobs are queued or requeued.
    cluster: Cluster,
    metrics: Metrics,
    config: QueueConfig,
    pending: Vec<(Report, Reply<ReportOutcome>)>,
    flushing: bool,
    enqueues: Vec<(NewJob, Reply<training_job::Model>)>,
    enqueuing: bool,
    /// Claims of this instance take turns; reports and heartbeats never wait for them.
    claim_turn: std::sync::Arc<tokio::sync::Mutex<()>>,
}

impl QueueActor {
    pub fn new(
        db: DatabaseConnection,
        ledger: Ledger,
        cluster: Cluster,
        metrics: Metrics,
        config: QueueConfig,
    ) -> Self {
        Self {
            db,
            ledger,
            cluster,
            metrics,
            config,
            pending: Vec::new(),
            flushing: false,
            enqueues: Vec::new(),
            enqueuing: false,
            claim_turn: std::sync::Arc::default(),
        }
    }

    fn flush(&mut self, ctx: &mut Context<Self>) {
        if self.pending.is_empty() {
            return;
        }
        // One report per job in a batch; a second report of the same job waits for the next.
        let mut seen = HashSet::new();
        let mut batch = Vec::new();
        let mut rest = Vec::new();
        for (report, reply) in self.pending.drain(..) {
            if batch.len() < self.config.max_batch && seen.insert(report.job_id.clone()) {
                batch.push((report, reply));
            } else {
                rest.push((report, reply));
            }
        }
        self.pending = rest;
        self.flushing = true;
        let (reports, replies): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
        let db = self.db.clone();
        let metrics = self.metrics.clone();
        let policy = self.config.retry_policy();
        // Its own task: a database call must never be frozen mid-way (holding a pooled
        // connection) while the actor waits on a claim.
        let apply = actix::spawn(async move {
            // A retried job is scheduled: the promotion poll of every instance queues it
            // when due and wakes the claims then.
            let applied = repo::apply_reports(&db, &reports, &policy).await;
            applied.map(|(outcomes, ended)| {
                for outcome in &outcomes {
                    metrics.reports.with_label_values(&[outcome.as_str()]).inc();
                }
                observe_ended(&metrics, &ended);
                outcomes
            })
        });
        ctx.spawn(apply.into_actor(self).map(move |outcomes, act, ctx| {
            let outcomes = outcomes
                .map_err(QueueError::from)
                .and_then(|applied| applied.map_err(QueueError::from))
                .map(|applied| applied.into_iter().map(Ok).collect());
            answer_all(replies, outcomes, "applying job reports");
            act.flushing = false;
            act.flush(ctx);
        }));
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
    let (counts, ended) = repo::requeue_stale(db, stale_after, config.max_attempts as i32).await?;
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

/// Claim up to `limit` jobs of `action` for `worker_id`; each is billed the run fee once.
#[derive(Message)]
#[rtype(result = "Result<Vec<training_job::Model>, QueueError>")]
pub struct Claim {
    pub worker_id: String,
    pub action: JobAction,
    pub limit: u32,
    /// Whether the claiming worker still waits for the answer: a claim for one that left
    /// takes nothing (its jobs go back in the claim's own transaction, or after billing).
    pub wanted: StillWanted,
}

/// Asked before a claim hands jobs out: `false` once the claimant has gone.
pub type StillWanted = std::sync::Arc<dyn Fn() -> bool + Send + Sync>;

impl Handler<Claim> for QueueActor {
    type Result = ResponseFuture<Result<Vec<training_job::Model>, QueueError>>;

    fn handle(&mut self, msg: Claim, _: &mut Self::Context) -> Self::Result {
        let db = self.db.clone();
        let ledger = self.ledger.clone();
        let turn = self.claim_turn.clone();
        let cluster = self.cluster.clone();
        let metrics = self.metrics.clone();
        let config = self.config.clone();
        // Its own task: the actor keeps taking reports while a claim and its billing run.
        let claim = actix::spawn(async move {
            let claimed = claim_and_bill(&db, &ledger, &cluster, &metrics, &turn, &config, msg).await;
            if let Ok((handed, unsettled)) = &claimed {
                metrics.jobs_claimed.inc_by(handed.len() as u64);
                for job in handed {
                    if let (Some(queued), Some(claimed)) = (job.queued_at, job.claimed_at) {
                        metrics.job_waited(job.action, (claimed - queued).as_seconds_f64());
                    }
                }
                metrics
                    .requeued
                    .with_label_values(&["unsettled"])
                    .inc_by(*unsettled);
            }
            claimed.map(|(handed, _)| handed)
        });
        Box::pin(async move { Ok(claim.await??) })
    }
}

async fn claim_and_bill(
    db: &DatabaseConnection,
    ledger: &Ledger,
    cluster: &Cluster,
    metrics: &Metrics,
    turn: &tokio::sync::Mutex<()>,
    config: &QueueConfig,
    msg: Claim,
) -> Result<(Vec<training_job::Model>, u64), sea_orm::DbErr> {
    let claimed = {
        // Claims of one instance that ran together would rank the same jobs and mostly skip
        // each other's locks; taking turns hands every claim a full batch.
        let _turn = turn.lock().await;
        // A paused action hands out nothing (the claim reads the pause with the backlog; a
        // waiting claim keeps waiting: its resume wakes it).
        let (txn, claimed) = repo::claim(
            db,
            &msg.worker_id,
            msg.action,
            msg.limit,
            config.max_running_per_org,
        )
        .await?;
        if !claimed.is_empty() && !(msg.wanted)() {
            // The worker left while the claim ran: nothing was taken.
            txn.rollback().await?;
            return Ok((Vec::new(), 0));
        }
        txn.commit().await?;
        claimed
    };
    let charges = claimed.iter().map(|job| {
        let op = LedgerOp::debit(
            EntryKind::RunFee,
            config.run_fee.micros(),
            Some(IdempotencyKey::job_fee(&job.id)),
            format!("run fee, {} job {}", job.action, job.id),
        );
        ledger.submit(&job.org_id, op)
    });
    let outcomes = join_all(charges).await;
    let mut handed = Vec::with_capacity(claimed.len());
    let mut unpaid = Vec::new();
    let mut unsettled = Vec::new();
    for (job, outcome) in claimed.into_iter().zip(outcomes) {
        match outcome {
            Ok(_) => handed.push(job),
            Err(LedgerError::InsufficientFunds { .. }) | Err(LedgerError::UnknownOrg) => unpaid.push(job.id),
            Err(err) => {
                tracing::warn!(job_id = %job.id, error = %err, "run fee not settled; job returned to the queue");
                unsettled.push(job.id);
            }
        }
    }
    let reason = match config.requeue_blocked_on_credit {
        true => {
            "insufficient balance for the run fee: the job is queued again at the organization's next credit"
        }
        false => "insufficient balance for the run fee: top up, then retry the job",
    };
    let blocked = repo::block_unpaid(db, &unpaid, &msg.worker_id, reason).await?;
    observe_ended(metrics, &blocked);
    if !handed.is_empty() && !(msg.wanted)() {
        // The worker left while its jobs were billed: they go back to the queue (their fee
        // stays paid; the next claim's charge of it is a replay, not a second charge).
        tracing::info!(worker_id = %msg.worker_id, jobs = handed.len(), "claimant gone; its jobs go back to the queue");
        unsettled.extend(handed.drain(..).map(|job| job.id));
    }
    repo::release_claims(db, &unsettled, &msg.worker_id).await?;
    if !unsettled.is_empty() {
        cluster
            .publish(Event::JobsQueued(crate::cluster::Wake::Action(msg.action)))
            .await;
    }
    Ok((handed, unsettled.len() as u64))
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

/// A terminal report; batched with others arriving meanwhile.
#[derive(Message)]
#[rtype(result = "Result<ReportOutcome, QueueError>")]
pub struct Submit(pub Report);

impl Handler<Submit> for QueueActor {
    type Result = ResponseFuture<Result<ReportOutcome, QueueError>>;

    fn handle(&mut self, msg: Submit, ctx: &mut Self::Context) -> Self::Result {
        let (tx, rx) = oneshot::channel();
        self.pending.push((msg.0, tx));
        if !self.flushing {
            self.flush(ctx);
        }
        Box::pin(async move { rx.await.unwrap_or(Err(QueueError::Stopped)) })
    }
}

#[derive(Message)]
#[rtype(result = "Result<Held, QueueError>")]
pub struct Heartbeat {
    pub job_id: JobId,
    pub worker_id: String,
}

impl Handler<Heartbeat> for QueueActor {
    type Result = ResponseFuture<Result<Held, QueueError>>;

    fn handle(&mut self, msg: Heartbeat, _: &mut Self::Context) -> Self::Result {
        let db = self.db.clone();
        Box::pin(async move { Ok(repo::heartbeat(&db, &msg.job_id, &msg.worker_id).await?) })
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
