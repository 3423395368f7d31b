//! A claim and its run fees: the jobs are taken (the repo's claim, nothing held across round
//! trips on PostgreSQL), then each organization's fees go to its ledger actor as one batched
//! operation; a job whose organization cannot pay is blocked, one whose fee could not be
//! settled now (or whose claimant left) goes back to the queue.
//!
//! Claims of one action that arrive together on an instance share one claim statement: up
//! to `queue.claims_in_flight` statements of an action are in flight at once (one on
//! SQLite), and claims that arrive while all are busy wait for the next, which hands jobs to
//! every one of them ([`super::batcher::GroupCommit`], one group per action). An idle queue
//! claims at once; a busy one makes fewer statements, each serving many claimants, so one
//! action's claims no longer wait out each other's turn on the server one by one.

use std::collections::{BTreeMap, HashMap, HashSet};

use entities::training_job;
use futures_util::future::join_all;

use super::actor::observe_ended;
use super::repo::{self, Claimant};
use super::{ClaimGroup, JobError, Jobs, QueueError, StillWanted};
use crate::billing::ledger::{EntryKind, LedgerError, LedgerOp};
use crate::cluster::{Event, Wake};
use crate::domain::{IdempotencyKey, JobAction, JobId, OrgId};

/// Claims one statement serves at most, and the jobs they may ask for together (a
/// statement's allotment weighs every organization's next picks up to that many).
const CLAIMS_AT_ONCE: usize = 64;
const JOBS_AT_ONCE: u32 = 400;

/// Claims up to `limit` jobs of `action` for `worker_id` once (no waiting), each billed its
/// run fee once.
pub(super) async fn claim_once(
    jobs: &Jobs,
    worker_id: &str,
    action: JobAction,
    limit: u32,
    wanted: &StillWanted,
) -> Result<Vec<training_job::Model>, JobError> {
    let group = jobs.claims.of(action);
    let (answer, lead) = group.push(Claimant {
        worker_id: worker_id.to_owned(),
        limit,
    });
    if lead {
        // Its own task: it serves the claims of other requests too.
        tokio::spawn(crate::context::carry(apply_waiting_claims(jobs.clone(), action)));
    }
    let claimed = answer
        .await
        .unwrap_or(Err(JobError::Queue(QueueError::Stopped)))?;
    if claimed.is_empty() {
        return Ok(claimed);
    }
    if !wanted() {
        // The worker left while the claim ran: the jobs go back untouched (no fee charged).
        let ids: Vec<JobId> = claimed.iter().map(|job| job.id.clone()).collect();
        repo::release_claims(&jobs.db, &ids, worker_id).await?;
        jobs.cluster
            .publish(Event::JobsQueued(Wake::Action(action)))
            .await;
        return Ok(Vec::new());
    }
    let (handed, unsettled) = bill(jobs, worker_id, action, claimed, wanted).await?;
    super::logged::claimed(worker_id, &handed);
    let metrics = &jobs.metrics;
    metrics.jobs_claimed.inc_by(handed.len() as u64);
    for job in &handed {
        if let (Some(queued), Some(claimed)) = (job.queued_at, job.claimed_at) {
            metrics.job_waited(job.action, (claimed - queued).as_seconds_f64());
        }
    }
    metrics
        .requeued
        .with_label_values(&["unsettled"])
        .inc_by(unsettled);
    Ok(handed)
}

/// Claims what waits in `action`'s group, statement after statement, until none does. A
/// statement serves one claim per worker (a worker's second claim waits for the next).
async fn apply_waiting_claims(jobs: Jobs, action: JobAction) {
    /// Should this task panic, the group does not keep its place taken with nobody applying.
    struct Unwinding<'a>(&'a ClaimGroup);
    impl Drop for Unwinding<'_> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                self.0.abandon();
            }
        }
    }
    let group = jobs.claims.of(action);
    let _unwinding = Unwinding(group);
    while let Some(batch) = group.next_batch(CLAIMS_AT_ONCE) {
        let mut left = batch;
        while !left.is_empty() {
            let mut workers = HashSet::new();
            let mut asked = 0u32;
            let (round, later): (Vec<_>, Vec<_>) = left.into_iter().partition(|(claimant, _)| {
                let fits = asked == 0 || asked + claimant.limit <= JOBS_AT_ONCE;
                let take = fits && workers.insert(claimant.worker_id.clone());
                if take {
                    asked += claimant.limit;
                }
                take
            });
            left = later;
            let (claimants, replies): (Vec<Claimant>, Vec<_>) = round.into_iter().unzip();
            jobs.metrics.claims_per_statement.observe(claimants.len() as f64);
            match repo::claim(&jobs.db, action, &claimants, jobs.max_running_per_org).await {
                Ok(claimed) => {
                    let mut by_worker: HashMap<String, Vec<training_job::Model>> = HashMap::new();
                    for job in claimed {
                        let worker = job.worker_id.clone().unwrap_or_default();
                        by_worker.entry(worker).or_default().push(job);
                    }
                    for (claimant, reply) in claimants.iter().zip(replies) {
                        let mine = by_worker.remove(&claimant.worker_id).unwrap_or_default();
                        if let Err(Ok(unanswered)) = reply.send(Ok(mine)) {
                            // Its claim is gone (the runtime stopping): the jobs go back.
                            let ids: Vec<JobId> = unanswered.into_iter().map(|job| job.id).collect();
                            if let Err(err) = repo::release_claims(&jobs.db, &ids, &claimant.worker_id).await
                            {
                                tracing::warn!(error = %err, "handing back an unanswered claim's jobs failed");
                            }
                        }
                    }
                }
                Err(err) => {
                    let busy = crate::billing::ledger::is_lock_timeout(&err);
                    if !busy {
                        tracing::error!(
                            error = &err as &dyn std::error::Error,
                            claims = replies.len(),
                            %action,
                            "claiming jobs failed"
                        );
                    }
                    for reply in replies {
                        let _ = reply.send(Err(match busy {
                            true => JobError::Busy,
                            false => JobError::Queue(QueueError::Batch),
                        }));
                    }
                }
            }
        }
    }
}

/// Charges the claimed jobs' run fees, one batched ledger operation per organization;
/// answers the jobs handed over and how many went back unsettled.
async fn bill(
    jobs: &Jobs,
    worker_id: &str,
    action: JobAction,
    claimed: Vec<training_job::Model>,
    wanted: &StillWanted,
) -> Result<(Vec<training_job::Model>, u64), JobError> {
    let run_fee = jobs.run_fee;
    if run_fee.micros() == crate::domain::Microcents::ZERO {
        // No fee configured: nothing to charge, no ledger entry of zero.
        return Ok((claimed, 0));
    }
    let mut by_org: BTreeMap<OrgId, Vec<training_job::Model>> = BTreeMap::new();
    for job in claimed {
        by_org.entry(job.org_id.clone()).or_default().push(job);
    }
    let charges = by_org.iter().map(|(org_id, org_jobs)| {
        let ops = org_jobs
            .iter()
            .map(|job| {
                LedgerOp::debit(
                    EntryKind::RunFee,
                    run_fee.micros(),
                    Some(IdempotencyKey::job_fee(&job.id)),
                    format!("run fee, {} job {}", job.action, job.id),
                )
            })
            .collect();
        jobs.ledger.submit_all(org_id, ops)
    });
    let outcomes = join_all(charges).await;
    let mut handed = Vec::new();
    let mut unpaid = Vec::new();
    let mut unsettled = Vec::new();
    for (org_jobs, outcomes) in by_org.into_values().zip(outcomes) {
        for (job, outcome) in org_jobs.into_iter().zip(outcomes) {
            match outcome {
                Ok(_) => handed.push(job),
                Err(LedgerError::InsufficientFunds { .. }) | Err(LedgerError::UnknownOrg) => unpaid.push(job),
                Err(err) => {
                    tracing::warn!(job_id = %job.id, error = %err, "run fee not settled; job returned to the queue");
                    unsettled.push(job.id);
                }
            }
        }
    }
    let reason = match jobs.requeue_blocked_on_credit {
        true => {
            "insufficient balance for the run fee: the job is queued again at the organization's next credit"
        }
        false => "insufficient balance for the run fee: top up, then retry the job",
    };
    let unpaid_ids: Vec<JobId> = unpaid.iter().map(|job| job.id.clone()).collect();
    let blocked = repo::block_unpaid(&jobs.db, &unpaid_ids, worker_id, reason).await?;
    let blocked_ids: std::collections::HashSet<&JobId> = blocked.iter().map(|b| &b.row.job_id).collect();
    unpaid.retain(|job| blocked_ids.contains(&job.id));
    super::logged::blocked_for_funds(worker_id, &unpaid);
    observe_ended(&jobs.metrics, &blocked);
    if !handed.is_empty() && !wanted() {
        // The worker left while its jobs were billed: they go back to the queue (their fee
        // stays paid; the next claim's charge of it is a replay, not a second charge).
        tracing::info!(
            worker_id,
            jobs = handed.len(),
            "claimant gone; its jobs go back to the queue"
        );
        unsettled.extend(handed.drain(..).map(|job| job.id));
    }
    repo::release_claims(&jobs.db, &unsettled, worker_id).await?;
    if !unsettled.is_empty() {
        jobs.cluster
            .publish(Event::JobsQueued(Wake::Action(action)))
            .await;
    }
    Ok((handed, unsettled.len() as u64))
}
