//! One actor per organization serializes every change of its balance. Requests that
//! arrive while a batch is committing wait in `pending` and go together into the next
//! transaction (group commit): one transaction when idle, large batches when hot.
//!
//! The mailbox is deliberately not held during a commit (no `AtomicResponse`): the
//! actor's `flushing` flag keeps one transaction at a time, and the open mailbox is what
//! lets the next batch gather. The actor never stops while it holds work.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use sea_orm::DatabaseConnection;
use tokio::sync::{mpsc, oneshot};

use super::ledger::{
    apply_batch, apply_group_locked, apply_guarded, is_lock_timeout, AccountAfter, AccountCache, BatchResult,
    LedgerError, LedgerOp, LedgerPolicy, Outcome,
};
use crate::domain::{Cents, OrgId};

type Reply = oneshot::Sender<Result<Outcome, LedgerError>>;

#[derive(Debug, Clone)]
pub struct LedgerConfig {
    /// Most operations committed in one transaction (1 = no group commit).
    pub max_batch: usize,
    /// Grouped transactions in flight at once (PostgreSQL; 1 on SQLite, whose one writer
    /// would only make them queue). Groups never share an organization (each has one batch
    /// in flight), so they lock disjoint accounts.
    pub groups_in_flight: usize,
    /// An actor with nothing to do for this long stops.
    pub idle_after: Duration,
    /// Grants' default priorities and the low-balance threshold.
    pub policy: super::ledger::LedgerPolicy,
}

/// A committed change left an organization's balance under its auto top-up threshold (see
/// [`Ledger::watch_balance_below`]). The ledger moves money in and out of grants and nothing
/// else: charging the card is the auto top-up task's (`auto_topup::run`), which submits the
/// credit back as any caller would.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BalanceBelow {
    pub org_id: OrgId,
    /// What the organization's auto top-up charges.
    pub amount: Cents,
}

struct Shared {
    db: DatabaseConnection,
    metrics: crate::metrics::Metrics,
    config: LedgerConfig,
    committer: mpsc::Sender<Pending>,
    /// The accounts as the committer last left them (PostgreSQL's guarded writes).
    cache: Arc<AccountCache>,
    /// Organizations whose balance row another session held past the lock timeout: their
    /// batches commit alone, outside the shared committer, until one succeeds.
    held: Arc<Mutex<HashSet<OrgId>>>,
    /// Operations submitted and not yet answered, and when the ledger last answered one
    /// (`/healthz` and `keel_ledger_stalled_seconds`).
    in_flight: AtomicUsize,
    last_progress_ms: AtomicU64,
    epoch: Instant,
    /// Told each organization whose balance a committed credit raised (see
    /// [`Ledger::watch_credits`]).
    credits: std::sync::OnceLock<mpsc::UnboundedSender<OrgId>>,
    /// Told each organization a commit left under its auto top-up threshold.
    below: std::sync::OnceLock<mpsc::UnboundedSender<BalanceBelow>>,
}

/// One organization's batch waiting for the committer.
struct Pending {
    org_id: OrgId,
    ops: Vec<LedgerOp>,
    reply: oneshot::Sender<BatchResult>,
}

/// How long the committer waits on one commit before it lets that commit finish on its
/// own and goes on with the next batches (a commit waiting on a held row lock must not hold
/// up other organizations).
const DETACH_AFTER: Duration = Duration::from_millis(200);

impl Shared {
    /// Commits through the shared committer, which puts the batches of every organization
    /// waiting at that moment into one transaction.
    async fn commit(&self, org_id: OrgId, ops: Vec<LedgerOp>) -> BatchResult {
        let low = self.config.policy;
        if self.config.max_batch <= 1 {
            // No batching at all (the benchmarks' baseline): each organization commits alone.
            return commit_batch(&self.db, None, &self.held, low, &org_id, ops, Path::Any).await;
        }
        if lock(&self.held).contains(&org_id) {
            return commit_batch(
                &self.db,
                Some(&self.cache),
                &self.held,
                low,
                &org_id,
                ops,
                Path::Any,
            )
            .await;
        }
        if self.db.get_database_backend() == sea_orm::DbBackend::Postgres {
            // Each organization's batch first by its own guarded statements, beside every
            // other organization's (a round trip each, no row held across one, and no wait
            // for another organization's commit); what they cannot write goes to the
            // committer's locked transactions.
            match apply_guarded(&self.db, &self.cache, low, &org_id, &ops).await {
                Ok(Some((result, guard))) => {
                    self.metrics
                        .ledger_guarded_writes
                        .with_label_values(&[guard.as_str()])
                        .inc();
                    return result;
                }
                Ok(None) => {}
                Err(err) => {
                    tracing::debug!(org_id = %org_id, error = %err, "guarded ledger write failed; taking the locked path");
                }
            }
        }
        let (reply, answer) = oneshot::channel();
        let pending = Pending { org_id, ops, reply };
        if let Err(mpsc::error::SendError(pending)) = self.committer.send(pending).await {
            return commit_batch(
                &self.db,
                Some(&self.cache),
                &self.held,
                low,
                &pending.org_id,
                pending.ops,
                Path::Locked,
            )
            .await;
        }
        answer.await.unwrap_or_else(|_| BatchResult {
            outcomes: Vec::new(),
            account: None,
        })
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// How long operations have waited without the ledger answering any; zero when none wait.
    fn stalled_for(&self) -> Duration {
        if self.in_flight.load(Ordering::Relaxed) == 0 {
            return Duration::ZERO;
        }
        let last = self.last_progress_ms.load(Ordering::Relaxed);
        Duration::from_millis(self.now_ms().saturating_sub(last))
    }
}

/// One operation waiting for the ledger, from submission until its caller has the answer
/// or has gone.
struct Waiting<'a>(&'a Shared);

impl<'a> Waiting<'a> {
    fn start(shared: &'a Shared) -> Self {
        if shared.in_flight.fetch_add(1, Ordering::Relaxed) == 0 {
            // Work starts waiting now, not when the ledger last answered.
            shared.last_progress_ms.store(shared.now_ms(), Ordering::Relaxed);
        }
        Self(shared)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Gathers the batches that arrive while transactions commit (across organizations, up to
/// `max_ops` operations) and commits them together, up to `in_flight` groups at once: with
/// the database a network hop away a group's transaction takes several round trips, and one
/// group at a time would make every organization wait out every other's. A group still
/// committing after [`DETACH_AFTER`] gives its place up to the next and finishes on its own.
async fn run_committer(
    db: DatabaseConnection,
    cache: Arc<AccountCache>,
    held: Arc<Mutex<HashSet<OrgId>>>,
    mut queue: mpsc::Receiver<Pending>,
    max_ops: usize,
    in_flight: usize,
    policy: LedgerPolicy,
) {
    let places = Arc::new(tokio::sync::Semaphore::new(in_flight.max(1)));
    loop {
        // A place first: while every place is taken, batches gather into the next group.
        let Ok(place) = places.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = queue.recv().await else {
            return;
        };
        let mut size = first.ops.len();
        let mut group = vec![first];
        while size < max_ops {
            match queue.try_recv() {
                Ok(next) => {
                    size += next.ops.len();
                    group.push(next);
                }
                Err(_) => break,
            }
        }
        group.sort_by(|a, b| a.org_id.cmp(&b.org_id));
        let commit = actix::spawn(commit_group(
            db.clone(),
            cache.clone(),
            held.clone(),
            policy,
            group,
        ));
        actix::spawn(async move {
            let _ = tokio::time::timeout(DETACH_AFTER, commit).await;
            drop(place);
        });
    }
}

/// Commits one gathered group and answers each batch. An organization whose row another
/// transaction held (contended), or every organization of a group that failed as a whole,
/// commits alone, concurrently, so each waits only on its own row.
async fn commit_group(
    db: DatabaseConnection,
    cache: Arc<AccountCache>,
    held: Arc<Mutex<HashSet<OrgId>>>,
    policy: LedgerPolicy,
    mut group: Vec<Pending>,
) {
    if group.len() == 1 {
        if let Some(only) = group.pop() {
            let result = commit_batch(
                &db,
                Some(&cache),
                &held,
                policy,
                &only.org_id,
                only.ops,
                Path::Locked,
            )
            .await;
            let _ = only.reply.send(result);
        }
        return;
    }
    let mut alone = Vec::new();
    let batches: Vec<(&OrgId, &[LedgerOp])> = group.iter().map(|p| (&p.org_id, p.ops.as_slice())).collect();
    match apply_group_locked(&db, Some(&cache), policy, &batches).await {
        Ok(results) => {
            for (pending, result) in group.into_iter().zip(results) {
                if matches!(result.outcomes.first(), Some(Err(LedgerError::Contended))) {
                    alone.push(pending);
                } else {
                    let _ = pending.reply.send(result);
                }
            }
        }
        Err(err) => {
            tracing::warn!(error = %err, orgs = group.len(), "grouped ledger commit failed; committing each organization alone");
            alone = group;
        }
    }
    let commits = alone.into_iter().map(|pending| {
        let (db, cache, held) = (&db, &cache, &held);
        async move {
            let result = commit_batch(
                db,
                Some(cache),
                held,
                policy,
                &pending.org_id,
                pending.ops,
                Path::Locked,
            )
            .await;
            let _ = pending.reply.send(result);
        }
    });
    futures_util::future::join_all(commits).await;
}

pub struct LedgerActor {
    org_id: OrgId,
    shared: Arc<Shared>,
    pending: VecDeque<(LedgerOp, Option<Reply>)>,
    flushing: bool,
    last_active: Instant,
    drain_waiters: Vec<oneshot::Sender<()>>,
}

#[derive(Message)]
#[rtype(result = "Result<Outcome, LedgerError>")]
struct Submit(LedgerOp);

/// Several operations of one organization, handed over together: they join the same batch
/// (one transaction) when the batch size allows, and each answers its own outcome.
#[derive(Message)]
#[rtype(result = "Vec<Result<Outcome, LedgerError>>")]
struct SubmitAll(Vec<LedgerOp>);

/// Resolves once the actor holds no work (shutdown).
#[derive(Message)]
#[rtype(result = "()")]
struct Drain;

impl Actor for LedgerActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(4096);
        let every = self.shared.config.idle_after.max(Duration::from_millis(100)) / 2;
        ctx.run_interval(every, |act, ctx| {
            if act.is_idle() && act.last_active.elapsed() >= act.shared.config.idle_after {
                ctx.stop();
            }
        });
    }

    fn stopping(&mut self, _: &mut Self::Context) -> Running {
        if self.is_idle() {
            Running::Stop
        } else {
            Running::Continue
        }
    }
}

impl LedgerActor {
    fn is_idle(&self) -> bool {
        self.pending.is_empty() && !self.flushing
    }

    fn enqueue(&mut self, op: LedgerOp, reply: Option<Reply>, ctx: &mut Context<Self>) {
        self.pending.push_back((op, reply));
        self.last_active = Instant::now();
        if !self.flushing {
            self.flush(ctx);
        }
    }

    fn flush(&mut self, ctx: &mut Context<Self>) {
        let n = self.pending.len().min(self.shared.config.max_batch.max(1));
        if n == 0 {
            self.notify_if_idle();
            return;
        }
        let (ops, replies): (Vec<LedgerOp>, Vec<_>) = self.pending.drain(..n).unzip();
        self.flushing = true;
        let shared = self.shared.clone();
        let org_id = self.org_id.clone();
        // The commit's span is a child of the first operation's request (and follows from
        // the others'), so what is exported of it belongs to a request. At debug: on the
        // ledger's hot path it is made only while spans are exported (or the log asks).
        let span = tracing::debug_span!(
            parent: ops[0].cause.span.id(),
            "ledger.commit",
            org_id = %org_id,
            ops = ops.len(),
            request_id = ops[0].cause.request_id(),
        );
        for op in &ops[1..] {
            span.follows_from(op.cause.span.id());
        }
        // Its own task, so the commit always runs to its end (never frozen or dropped with
        // the actor's context while it holds a connection).
        let commit = actix::spawn(tracing::Instrument::instrument(
            async move { shared.commit(org_id, ops).await },
            span,
        ));
        ctx.spawn(commit.into_actor(self).map(move |result, act, ctx| {
            let result = result.unwrap_or_else(|e| BatchResult {
                outcomes: (0..replies.len())
                    .map(|_| Err(LedgerError::Unavailable(format!("ledger task failed: {e}"))))
                    .collect(),
                account: None,
            });
            let credited = result
                .outcomes
                .iter()
                .flatten()
                .any(|outcome| outcome.amount.0 > 0 && !outcome.replayed);
            if credited {
                if let Some(credits) = act.shared.credits.get() {
                    let _ = credits.send(act.org_id.clone());
                }
            }
            for (reply, outcome) in replies.into_iter().zip(result.outcomes) {
                if let Some(reply) = reply {
                    // The caller may have gone; the change is committed either way.
                    let _ = reply.send(outcome);
                }
            }
            act.flushing = false;
            if let Some(account) = result.account {
                for left in &account.expired {
                    let metrics = &act.shared.metrics;
                    metrics.credit_grants_expired.inc();
                    metrics
                        .credit_expired_microcents
                        .inc_by(u64::try_from(left.get()).unwrap_or(0));
                }
                act.announce_if_below(&account);
            }
            act.flush(ctx);
        }));
    }

    /// Tells the auto top-up task when the balance is under the threshold (on every such
    /// commit: the task charges once at a time per organization).
    fn announce_if_below(&self, account: &AccountAfter) {
        let Some(settings) = account.auto_topup else {
            return;
        };
        if account.balance >= settings.threshold.micros() {
            return;
        }
        if let Some(below) = self.shared.below.get() {
            let _ = below.send(BalanceBelow {
                org_id: self.org_id.clone(),
                amount: settings.amount,
            });
        }
    }

    fn notify_if_idle(&mut self) {
        if self.is_idle() {
            for waiter in self.drain_waiters.drain(..) {
                let _ = waiter.send(());
            }
        }
    }
}

/// Which way a batch is applied: any (the guarded statements first on PostgreSQL), or the
/// locked transaction only (the guarded statements were tried already).
#[derive(Clone, Copy)]
enum Path {
    Any,
    Locked,
}

async fn apply_on(
    db: &DatabaseConnection,
    cache: Option<&AccountCache>,
    policy: LedgerPolicy,
    org_id: &OrgId,
    ops: &[LedgerOp],
    path: Path,
) -> Result<BatchResult, sea_orm::DbErr> {
    match path {
        Path::Any => apply_batch(db, cache, policy, org_id, ops).await,
        Path::Locked => Ok(apply_group_locked(db, cache, policy, &[(org_id, ops)])
            .await?
            .pop()
            .unwrap_or(BatchResult {
                outcomes: Vec::new(),
                account: None,
            })),
    }
}

/// Commits a batch; if the batch as a whole fails (say a unique key raced with another
/// instance), each operation is retried alone so one bad operation fails only itself. A
/// row held past the lock timeout fails the batch at once (`Locked`, a 503 to retry with
/// the same key) and sends the organization's next batches around the shared committer.
async fn commit_batch(
    db: &DatabaseConnection,
    cache: Option<&AccountCache>,
    held: &Mutex<HashSet<OrgId>>,
    policy: LedgerPolicy,
    org_id: &OrgId,
    ops: Vec<LedgerOp>,
    path: Path,
) -> BatchResult {
    let started = Instant::now();
    match apply_on(db, cache, policy, org_id, &ops, path).await {
        Ok(result) => {
            tracing::debug!(
                org_id = %org_id,
                size = ops.len(),
                elapsed_us = started.elapsed().as_micros() as u64,
                "ledger batch committed"
            );
            if lock(held).remove(org_id) {
                tracing::info!(target: "keel_event", event = "ledger.resumed", org_id = %org_id, "organization's balance row free again");
            }
            result
        }
        Err(err) if is_lock_timeout(&err) => {
            if lock(held).insert(org_id.to_owned()) {
                tracing::warn!(target: "keel_event", event = "ledger.stalled", org_id = %org_id, error = %err, "organization's balance row held by another session; its operations answer 503 until it is free");
            }
            BatchResult {
                outcomes: ops.iter().map(|_| Err(LedgerError::Locked)).collect(),
                account: None,
            }
        }
        Err(err) => {
            tracing::warn!(org_id = %org_id, error = %err, size = ops.len(), "ledger batch failed; retrying one by one");
            let mut outcomes = Vec::with_capacity(ops.len());
            let mut account = None;
            for op in &ops {
                match apply_on(db, cache, policy, org_id, std::slice::from_ref(op), path).await {
                    Ok(result) => {
                        outcomes.extend(result.outcomes);
                        account = match (account, result.account) {
                            // Each keeps the grants it expired: the metrics count them all.
                            (
                                Some(AccountAfter {
                                    expired: mut before, ..
                                }),
                                Some(mut after),
                            ) => {
                                before.append(&mut after.expired);
                                after.expired = before;
                                Some(after)
                            }
                            (before, after) => after.or(before),
                        };
                    }
                    Err(err) if is_lock_timeout(&err) => outcomes.push(Err(LedgerError::Locked)),
                    Err(err) => {
                        tracing::error!(
                            parent: &op.cause.span,
                            org_id = %org_id,
                            request_id = op.cause.request_id(),
                            kind = op.kind.as_str(),
                            error = %err,
                            "ledger operation failed"
                        );
                        outcomes.push(Err(LedgerError::Unavailable(err.to_string())));
                    }
                }
            }
            BatchResult { outcomes, account }
        }
    }
}

impl Handler<SubmitAll> for LedgerActor {
    type Result = ResponseFuture<Vec<Result<Outcome, LedgerError>>>;

    fn handle(&mut self, msg: SubmitAll, ctx: &mut Self::Context) -> Self::Result {
        let mut answers = Vec::with_capacity(msg.0.len());
        self.last_active = Instant::now();
        for op in msg.0 {
            let (tx, rx) = oneshot::channel();
            self.pending.push_back((op, Some(tx)));
            answers.push(rx);
        }
        if !self.flushing {
            self.flush(ctx);
        }
        Box::pin(async move {
            let mut outcomes = Vec::with_capacity(answers.len());
            for answer in answers {
                outcomes.push(
                    answer
                        .await
                        .unwrap_or_else(|_| Err(LedgerError::Unavailable("ledger actor stopped".into()))),
                );
            }
            outcomes
        })
    }
}

impl Handler<Submit> for LedgerActor {
    type Result = ResponseFuture<Result<Outcome, LedgerError>>;

    fn handle(&mut self, msg: Submit, ctx: &mut Self::Context) -> Self::Result {
        let (tx, rx) = oneshot::channel();
        self.enqueue(msg.0, Some(tx), ctx);
        Box::pin(async move {
            rx.await
                .unwrap_or_else(|_| Err(LedgerError::Unavailable("ledger actor stopped".into())))
        })
    }
}

impl Handler<Drain> for LedgerActor {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: Drain, _: &mut Self::Context) -> Self::Result {
        let (tx, rx) = oneshot::channel();
        self.drain_waiters.push(tx);
        self.notify_if_idle();
        Box::pin(async move {
            let _ = rx.await;
        })
    }
}

/// Starts ledger actors on demand (on a dedicated arbiter) and routes operations to them.
#[derive(Clone)]
pub struct Ledger {
    shared: Arc<Shared>,
    actors: Arc<Mutex<HashMap<OrgId, Addr<LedgerActor>>>>,
    arbiter: Arc<Mutex<Option<actix::Arbiter>>>,
    handle: actix::ArbiterHandle,
}

impl Ledger {
    pub fn new(db: DatabaseConnection, metrics: crate::metrics::Metrics, config: LedgerConfig) -> Self {
        let arbiter = actix::Arbiter::new();
        let (committer, queue) = mpsc::channel(4096);
        let cache = Arc::new(AccountCache::default());
        let held = Arc::new(Mutex::new(HashSet::new()));
        arbiter.spawn(run_committer(
            db.clone(),
            cache.clone(),
            held.clone(),
            queue,
            config.max_batch.max(1),
            config.groups_in_flight,
            config.policy,
        ));
        Self {
            handle: arbiter.handle(),
            arbiter: Arc::new(Mutex::new(Some(arbiter))),
            shared: Arc::new(Shared {
                db,
                metrics,
                config,
                committer,
                cache,
                held,
                in_flight: AtomicUsize::new(0),
                last_progress_ms: AtomicU64::new(0),
                epoch: Instant::now(),
                credits: std::sync::OnceLock::new(),
                below: std::sync::OnceLock::new(),
            }),
            actors: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    fn actor_for(&self, org_id: &OrgId) -> Addr<LedgerActor> {
        let mut actors = self
            .actors
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(addr) = actors.get(org_id) {
            if addr.connected() {
                return addr.clone();
            }
        }
        let shared = self.shared.clone();
        let org = org_id.to_owned();
        let addr = LedgerActor::start_in_arbiter(&self.handle, move |_| LedgerActor {
            org_id: org,
            shared,
            pending: VecDeque::new(),
            flushing: false,
            last_active: Instant::now(),
            drain_waiters: Vec::new(),
        });
        actors.retain(|_, a| a.connected());
        actors.insert(org_id.to_owned(), addr.clone());
        addr
    }

    /// The organizations whose balance a committed credit raised, each time one did (a
    /// replayed credit raised nothing). One watcher per ledger: a second call answers `None`.
    pub fn watch_credits(&self) -> Option<mpsc::UnboundedReceiver<OrgId>> {
        let (sender, receiver) = mpsc::unbounded_channel();
        self.shared.credits.set(sender).ok()?;
        Some(receiver)
    }

    /// Each organization a committed change left under its auto top-up threshold, each time
    /// one did. One watcher per ledger: a second call answers `None`.
    pub fn watch_balance_below(&self) -> Option<mpsc::UnboundedReceiver<BalanceBelow>> {
        let (sender, receiver) = mpsc::unbounded_channel();
        self.shared.below.set(sender).ok()?;
        Some(receiver)
    }

    /// Applies one operation to the organization's balance and answers its outcome once
    /// it is committed.
    pub async fn submit(&self, org_id: &OrgId, mut op: LedgerOp) -> Result<Outcome, LedgerError> {
        op.cause = crate::context::Cause::current();
        let shared = &self.shared;
        // Counted out when dropped: a caller that goes away (a client hang-up drops the
        // handler) is no longer waiting.
        let _waiting = Waiting::start(shared);
        let kind = op.kind;
        let submitted = Instant::now();
        let outcome = self.send(org_id, op).await;
        shared
            .metrics
            .ledger_seconds
            .observe(submitted.elapsed().as_secs_f64());
        shared
            .metrics
            .ledger_op(kind, super::ledger::outcome_label(&outcome));
        if !matches!(outcome, Err(LedgerError::Unavailable(_) | LedgerError::Locked)) {
            shared.last_progress_ms.store(shared.now_ms(), Ordering::Relaxed);
        }
        outcome
    }

    /// Applies several operations of one organization, handed to its actor at once (one
    /// message, one batch when the batch size allows); answers each one's outcome, in order.
    pub async fn submit_all(
        &self,
        org_id: &OrgId,
        mut ops: Vec<LedgerOp>,
    ) -> Vec<Result<Outcome, LedgerError>> {
        if ops.is_empty() {
            return Vec::new();
        }
        let cause = crate::context::Cause::current();
        for op in &mut ops {
            op.cause = cause.clone();
        }
        let shared = &self.shared;
        let _waiting = Waiting::start(shared);
        let kinds: Vec<crate::domain::EntryKind> = ops.iter().map(|op| op.kind).collect();
        let submitted = Instant::now();
        let count = ops.len();
        let mut outcomes = None;
        // As `send`: an actor that stopped for idleness never saw the message.
        for _ in 0..3 {
            match self.actor_for(org_id).send(SubmitAll(ops.clone())).await {
                Ok(answered) => {
                    outcomes = Some(answered);
                    break;
                }
                Err(MailboxError::Closed) => continue,
                Err(MailboxError::Timeout) => break,
            }
        }
        let outcomes = outcomes.unwrap_or_else(|| {
            (0..count)
                .map(|_| Err(LedgerError::Unavailable("ledger actor unavailable".into())))
                .collect()
        });
        let elapsed = submitted.elapsed().as_secs_f64();
        for (kind, outcome) in kinds.into_iter().zip(&outcomes) {
            shared.metrics.ledger_seconds.observe(elapsed);
            shared
                .metrics
                .ledger_op(kind, super::ledger::outcome_label(outcome));
        }
        if outcomes
            .iter()
            .any(|o| !matches!(o, Err(LedgerError::Unavailable(_) | LedgerError::Locked)))
        {
            shared.last_progress_ms.store(shared.now_ms(), Ordering::Relaxed);
        }
        outcomes
    }

    async fn send(&self, org_id: &OrgId, op: LedgerOp) -> Result<Outcome, LedgerError> {
        // An actor that stopped for idleness between look-up and send never saw the
        // message, so sending again to a fresh one is safe.
        for _ in 0..3 {
            match self.actor_for(org_id).send(Submit(op.clone())).await {
                Ok(outcome) => return outcome,
                Err(MailboxError::Closed) => continue,
                Err(MailboxError::Timeout) => break,
            }
        }
        Err(LedgerError::Unavailable("ledger actor unavailable".into()))
    }

    /// How long operations have waited without the ledger committing any (zero when none
    /// wait): `/healthz` reports a stalled ledger, `/metrics` shows it.
    pub fn stalled_for(&self) -> Duration {
        self.shared.stalled_for()
    }

    /// Waits until every actor holds no work, then stops the ledger arbiter.
    pub async fn drain(&self) {
        let actors: Vec<_> = self
            .actors
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .values()
            .cloned()
            .collect();
        for addr in actors {
            let _ = tokio::time::timeout(Duration::from_secs(30), addr.send(Drain)).await;
        }
        if let Some(arbiter) = self
            .arbiter
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take()
        {
            arbiter.stop();
        }
    }
}
