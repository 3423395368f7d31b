//! Queue flows shared by the JSON API and the console.

use std::collections::BTreeMap;

use entities::training_job;

use super::actor::{ask, Enqueue, RequeueStale};
use super::repo::{self, Inserted, NewJob, RetryOutcome, SecretChange, StopOutcome, SweepCounts};
use super::{JobError, Jobs};
use crate::cluster::{Event, Wake};
use crate::domain::{JobAction, JobId, JobStatus, OrgId};

/// Sets (or, with an empty value, deletes) training secrets: every value is sealed first,
/// then all are written in one transaction. Answers every name the organization has.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn set_secrets(
    jobs: &Jobs,
    org_id: &OrgId,
    secrets: BTreeMap<String, String>,
) -> Result<Vec<String>, JobError> {
    let Some(secret_box) = &jobs.secret_box else {
        return Err(JobError::SecretsUnconfigured);
    };
    let changes = secrets
        .into_iter()
        .map(|(name, value)| {
            let sealed = match value.is_empty() {
                true => None,
                false => Some(secret_box.seal(org_id, &name, &value)?),
            };
            Ok(SecretChange { name, sealed })
        })
        .collect::<anyhow::Result<Vec<_>>>()
        .map_err(JobError::Sealing)?;
    Ok(repo::apply_secret_changes(&jobs.db, org_id, changes).await?)
}

/// The organization's secrets, opened, for the worker that runs one of its jobs. A secret
/// that cannot be opened (the key changed) is left out and logged.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn worker_secrets(jobs: &Jobs, org_id: &OrgId) -> Result<BTreeMap<String, String>, JobError> {
    let mut secrets = BTreeMap::new();
    let Some(secret_box) = &jobs.secret_box else {
        return Ok(secrets);
    };
    for row in repo::sealed_secrets(&jobs.db, org_id).await? {
        match secret_box.open(&row.org_id, &row.name, &row.sealed) {
            Ok(value) => {
                secrets.insert(row.name, value);
            }
            Err(err) => {
                tracing::error!(org_id = %row.org_id, name = %row.name, error = %err, "secret unreadable")
            }
        }
    }
    Ok(secrets)
}

/// What a create answered.
pub enum Created {
    /// A new job.
    New(training_job::Model),
    /// An open job of the organization with the same unique key: no new one.
    Existing(training_job::Model),
    /// The job first created with the same idempotency key and body.
    Replayed(training_job::Model),
}

/// Creates a job in a project of its organization. A plain job goes through the queue
/// actor (jobs enqueued together are committed together); one with a unique key or an
/// idempotency key is inserted on its own, the database's unique indexes deciding.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %job.org_id, project_id = %job.project_id))]
pub async fn create_job(jobs: &Jobs, mut job: NewJob) -> Result<Created, JobError> {
    crate::projects::repo::find_in_orgs(&jobs.db, &job.project_id, std::slice::from_ref(&job.org_id))
        .await?
        .ok_or(JobError::ProjectNotFound { index: None })?;
    pin_dataset(jobs, &mut job, None).await?;
    if !job.depends_on.is_empty() {
        check_dependencies(jobs, std::slice::from_ref(&job), false).await?;
        let mut created = create_pipeline(jobs, vec![job]).await?;
        return match created.pop() {
            Some(Some(created)) => Ok(created),
            _ => Err(JobError::IdempotencyKeyReused),
        };
    }
    if job.unique_key.is_none() && job.idempotency.is_none() {
        let job = ask(&jobs.actor, Enqueue(job)).await?;
        super::logged::created(std::slice::from_ref(&job), false);
        return Ok(Created::New(job));
    }
    let created = match repo::insert_keyed(&jobs.db, job).await? {
        Inserted::New(job) => Created::New(job),
        Inserted::Unique(job) => Created::Existing(job),
        Inserted::Replayed(job) => Created::Replayed(job),
        Inserted::KeyReused => return Err(JobError::IdempotencyKeyReused),
    };
    if let Created::New(job) = &created {
        super::logged::created(std::slice::from_ref(job), false);
        wake_if_queued(jobs, std::slice::from_ref(job)).await;
    }
    Ok(created)
}

/// Pins the version of the dataset a job names (the latest when it names none); another
/// organization's dataset, or a version it does not have, is 404.
async fn pin_dataset(jobs: &Jobs, job: &mut NewJob, index: Option<usize>) -> Result<(), JobError> {
    let Some(dataset) = job.dataset.as_mut() else {
        return Ok(());
    };
    match crate::datasets::service::pin(&jobs.db, &job.org_id, &dataset.id, dataset.version).await {
        Ok(pinned) => {
            dataset.pinned = Some(pinned);
            Ok(())
        }
        Err(crate::datasets::DatasetError::Database(err)) => Err(err.into()),
        Err(_) => Err(JobError::DatasetNotFound { index }),
    }
}

/// Creates up to a thousand jobs at once, all or none, in order; an
/// item whose unique key an open job holds answers that job. Every project must be the
/// organization's (else nothing is created, and the error names the first bad item).
#[tracing::instrument(level = "debug", skip_all)]
pub async fn create_batch(jobs: &Jobs, mut batch: Vec<NewJob>) -> Result<Vec<Created>, JobError> {
    let mut known = std::collections::HashSet::new();
    let mut orgs: Vec<&OrgId> = batch.iter().map(|job| &job.org_id).collect();
    orgs.sort();
    orgs.dedup();
    for org_id in orgs {
        let mut projects: Vec<crate::domain::ProjectId> = batch
            .iter()
            .filter(|job| job.org_id == *org_id)
            .map(|job| job.project_id.clone())
            .collect();
        projects.sort();
        projects.dedup();
        for project in crate::projects::repo::ids_in_org(&jobs.db, &projects, org_id).await? {
            known.insert((org_id.clone(), project));
        }
    }
    let unknown = |job: &NewJob| !known.contains(&(job.org_id.clone(), job.project_id.clone()));
    if let Some(index) = batch.iter().position(unknown) {
        return Err(JobError::ProjectNotFound { index: Some(index) });
    }
    type Pinned = (OrgId, crate::domain::DatasetId, Option<i32>);
    let mut pinned: std::collections::HashMap<Pinned, serde_json::Value> = std::collections::HashMap::new();
    for (index, job) in batch.iter_mut().enumerate() {
        let Some(dataset) = job.dataset.as_mut() else {
            continue;
        };
        // A pipeline's items often share one dataset: read it once.
        let key = (job.org_id.clone(), dataset.id.clone(), dataset.version);
        if let Some(view) = pinned.get(&key) {
            dataset.pinned = Some(view.clone());
            continue;
        }
        pin_dataset(jobs, job, Some(index)).await?;
        if let Some(view) = job.dataset.as_ref().and_then(|d| d.pinned.clone()) {
            pinned.insert(key, view);
        }
    }
    check_dependencies(jobs, &batch, true).await?;
    Ok(create_pipeline(jobs, batch)
        .await?
        .into_iter()
        .flatten()
        .collect())
}

/// Every job a `dependsOn` names is one of its item's organization (else 404 naming the
/// first that is not, and its item when `batch`).
async fn check_dependencies(jobs: &Jobs, batch: &[NewJob], batch_items: bool) -> Result<(), JobError> {
    let mut named: std::collections::BTreeMap<&OrgId, Vec<JobId>> = Default::default();
    for job in batch {
        for dependency in &job.depends_on {
            if let repo::Dependency::Job(id) = dependency {
                named.entry(&job.org_id).or_default().push(id.clone());
            }
        }
    }
    for (org_id, mut ids) in named {
        ids.sort();
        ids.dedup();
        let known = repo::jobs_of_org(&jobs.db, org_id, &ids).await?;
        for (index, job) in batch.iter().enumerate().filter(|(_, job)| job.org_id == *org_id) {
            for dependency in &job.depends_on {
                match dependency {
                    repo::Dependency::Job(id) if !known.contains(id) => {
                        return Err(JobError::DependencyNotFound {
                            index: batch_items.then_some(index),
                            job_id: id.clone(),
                        })
                    }
                    _ => {}
                }
            }
        }
    }
    Ok(())
}

/// Inserts a batch (one transaction, pipelines' edges and settling in it): logged, and the
/// claims of the queued jobs' actions woken. `None` for an item whose idempotency key came
/// with another body.
async fn create_pipeline(jobs: &Jobs, batch: Vec<NewJob>) -> Result<Vec<Option<Created>>, JobError> {
    let single = batch.len() == 1;
    let created: Vec<Option<Created>> = repo::insert_batch(&jobs.db, batch)
        .await?
        .into_iter()
        .map(|inserted| match inserted {
            Inserted::New(job) => Some(Created::New(job)),
            Inserted::Unique(job) => Some(Created::Existing(job)),
            Inserted::Replayed(job) => Some(Created::Replayed(job)),
            Inserted::KeyReused => None,
        })
        .collect();
    let new: Vec<training_job::Model> = created
        .iter()
        .filter_map(|c| match c {
            Some(Created::New(job)) => Some(job.clone()),
            _ => None,
        })
        .collect();
    super::logged::created(&new, !single);
    let cancelled: Vec<training_job::Model> = new
        .iter()
        .filter(|job| job.status == JobStatus::Cancelled)
        .cloned()
        .collect();
    super::logged::settled(&cancelled);
    wake_if_queued(jobs, &new).await;
    Ok(created)
}

/// Wakes the claims waiting on the actions of the queued jobs among `created`, here and on
/// every instance (a scheduled one is queued by the promotion poll when due).
pub(crate) async fn wake_if_queued(jobs: &Jobs, created: &[training_job::Model]) {
    let mut actions: Vec<JobAction> = created
        .iter()
        .filter(|job| job.status == JobStatus::Queued)
        .map(|job| job.action)
        .collect();
    actions.sort_by_key(|a| a.as_str());
    actions.dedup();
    for action in actions {
        jobs.cluster
            .publish(Event::JobsQueued(Wake::Action(action)))
            .await;
    }
}

/// The jobs' ended attempts, oldest first, by job.
#[tracing::instrument(level = "debug", skip_all)]
pub async fn histories(
    jobs: &Jobs,
    job_ids: &[JobId],
) -> Result<std::collections::HashMap<JobId, Vec<entities::training_job_attempt::Model>>, JobError> {
    Ok(super::history::histories(&jobs.db, job_ids).await?)
}

/// Stops a job (queued → user_stopped, running → stopping); 409 once it has ended.
#[tracing::instrument(level = "debug", skip_all, fields(job_id = %job.id))]
pub async fn stop_job(
    jobs: &Jobs,
    job: &training_job::Model,
    reason: Option<&str>,
) -> Result<training_job::Model, JobError> {
    let (outcome, settled) = repo::stop_job(&jobs.db, &job.id, reason).await?;
    super::logged::settled(&settled);
    match outcome {
        StopOutcome::Stopped(job) => Ok(job),
        StopOutcome::AlreadyFinished(job) => Err(JobError::AlreadyEnded(job.status)),
        StopOutcome::NotFound => Err(JobError::NotFound),
    }
}

/// Puts a failed, blocked or user-stopped job back in the queue, or back to waiting when its
/// dependencies have not all succeeded (409 for any other state, and for a job whose
/// dependency ended without success: retry that one, and for a job whose unique key another
/// open job holds); the jobs its end cancelled wait again;
/// waiting claims of its action look again, here and on every instance.
#[tracing::instrument(level = "debug", skip_all, fields(job_id = %job.id))]
pub async fn retry_job(jobs: &Jobs, job: &training_job::Model) -> Result<training_job::Model, JobError> {
    match repo::retry_job(&jobs.db, &job.id).await? {
        RetryOutcome::Retried { job, settled } => {
            super::logged::settled(&settled);
            queued_again(jobs, std::slice::from_ref(&job)).await;
            Ok(job)
        }
        RetryOutcome::NotRetryable(job) => Err(JobError::NotRetryable(job.status)),
        RetryOutcome::DependencyBroken { dependency, status } => {
            Err(JobError::DependencyBroken { dependency, status })
        }
        RetryOutcome::KeyTaken { holder } => Err(JobError::UniqueKeyTaken { holder }),
        RetryOutcome::NotFound => Err(JobError::NotFound),
    }
}

/// At most this many jobs in one retry of many.
pub const MAX_RETRIED_AT_ONCE: usize = 1000;

/// Jobs a retry of many put back, and how many of those named it left alone (no longer
/// failed, blocked or user-stopped, or unknown).
pub struct RetriedMany {
    pub retried: Vec<training_job::Model>,
    pub skipped: usize,
}

/// Puts the failed, blocked or user-stopped jobs among `job_ids` back in the queue in one
/// update (at most `MAX_RETRIED_AT_ONCE`); waiting claims of their actions look again.
#[tracing::instrument(level = "debug", skip_all)]
pub async fn retry_jobs(jobs: &Jobs, job_ids: &[JobId]) -> Result<RetriedMany, JobError> {
    let job_ids = &job_ids[..job_ids.len().min(MAX_RETRIED_AT_ONCE)];
    let retried = repo::retry_jobs(&jobs.db, job_ids).await?;
    super::logged::settled(&retried.settled);
    queued_again(jobs, &retried.retried).await;
    Ok(RetriedMany {
        skipped: job_ids.len() - retried.retried.len(),
        retried: retried.retried,
    })
}

/// Jobs retried by hand: logged, and the waiting claims of their actions look again (of
/// those queued: one that waits for its dependencies is not claimable yet).
pub(super) async fn queued_again(jobs: &Jobs, retried: &[training_job::Model]) {
    super::logged::retried_by_hand(retried);
    let mut actions: Vec<JobAction> = retried
        .iter()
        .filter(|job| job.status == JobStatus::Queued)
        .map(|job| job.action)
        .collect();
    actions.sort_unstable_by_key(|a| a.as_str());
    actions.dedup();
    for action in actions {
        jobs.cluster
            .publish(Event::JobsQueued(Wake::Action(action)))
            .await;
    }
}

/// Failed jobs across organizations a page of the operator's listing shows.
pub const FAILED_SHOWN: u64 = 50;

/// A page of failed jobs across organizations, the latest to fail first (`limit` from
/// `offset`), and how many the filter keeps.
#[tracing::instrument(level = "debug", skip_all)]
pub async fn failed_jobs(
    jobs: &Jobs,
    filter: &repo::FailedFilter,
    offset: u64,
    limit: u64,
) -> Result<(Vec<training_job::Model>, u64), JobError> {
    let total = repo::count_failed(&jobs.db, filter).await?;
    let page = match offset < total {
        true => repo::failed_jobs(&jobs.db, filter, offset, limit).await?,
        false => Vec::new(),
    };
    Ok((page, total))
}

/// Attempts ended per bucket over a window, by outcome.
pub struct Throughput {
    /// Each bucket's start, oldest first.
    pub starts: Vec<chrono::DateTime<chrono::Utc>>,
    /// Per outcome (every one, in `AttemptOutcome::ALL`'s order), one count per bucket.
    pub counts: Vec<(crate::domain::AttemptOutcome, Vec<i64>)>,
}

/// The throughput chart's shape: 5-minute buckets over the last 24 hours.
pub const THROUGHPUT_BUCKET_SECS: i64 = 300;
pub const THROUGHPUT_BUCKETS: i64 = 288;

/// Attempts that ended in the last 24 hours, per 5 minutes and outcome; the last bucket
/// holds `now`.
#[tracing::instrument(level = "debug", skip_all)]
pub async fn throughput(jobs: &Jobs, now: chrono::DateTime<chrono::Utc>) -> Result<Throughput, JobError> {
    use crate::domain::AttemptOutcome;
    let last = now.timestamp().div_euclid(THROUGHPUT_BUCKET_SECS);
    let first = last - THROUGHPUT_BUCKETS + 1;
    let since = chrono::DateTime::from_timestamp(first * THROUGHPUT_BUCKET_SECS, 0).unwrap_or(now);
    let rows = repo::ended_per_bucket(&jobs.db, since, THROUGHPUT_BUCKET_SECS).await?;
    let mut counts: Vec<(AttemptOutcome, Vec<i64>)> = AttemptOutcome::ALL
        .iter()
        .map(|&outcome| (outcome, vec![0; THROUGHPUT_BUCKETS as usize]))
        .collect();
    for (bucket, outcome, n) in rows {
        let Some(slot) = usize::try_from(bucket - first)
            .ok()
            .filter(|&slot| slot < THROUGHPUT_BUCKETS as usize)
        else {
            continue;
        };
        if let Some((_, series)) = counts.iter_mut().find(|(o, _)| o.as_str() == outcome) {
            series[slot] += n;
        }
    }
    let starts = (first..=last)
        .filter_map(|b| chrono::DateTime::from_timestamp(b * THROUGHPUT_BUCKET_SECS, 0))
        .collect();
    Ok(Throughput { starts, counts })
}

/// Pauses an action's queue on every instance: claims of it hand out nothing until resumed.
#[tracing::instrument(level = "debug", skip_all, fields(action = %action))]
pub async fn pause(jobs: &Jobs, action: JobAction) -> Result<ActionQueue, JobError> {
    repo::pause(&jobs.db, action).await?;
    super::logged::paused(action, true);
    action_queue(jobs, action).await
}

/// Resumes an action's queue; the claims waiting on it look again, here and everywhere.
#[tracing::instrument(level = "debug", skip_all, fields(action = %action))]
pub async fn resume(jobs: &Jobs, action: JobAction) -> Result<ActionQueue, JobError> {
    repo::resume(&jobs.db, action).await?;
    super::logged::paused(action, false);
    jobs.cluster
        .publish(Event::JobsQueued(Wake::Action(action)))
        .await;
    action_queue(jobs, action).await
}

/// One organization's share of the queue: its weight, its cap, and its running jobs.
pub struct OrgQueue {
    pub org_id: OrgId,
    /// 1..100 (1 unless an operator set it).
    pub weight: i32,
    /// The operator's cap (none: `queue.max_running_per_org`; 0: no cap).
    pub max_running: Option<i32>,
    /// The cap that applies (0: none).
    pub effective_max_running: i64,
    /// Its running and stopping jobs, of every action.
    pub running: i64,
}

/// An organization's share of the queue (an unknown organization is "not found").
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn org_queue(jobs: &Jobs, org_id: &OrgId) -> Result<OrgQueue, JobError> {
    if !crate::orgs::repo::org_exists(&jobs.db, org_id).await? {
        return Err(JobError::OrgNotFound);
    }
    let settings = repo::org_settings(&jobs.db, org_id).await?;
    let mut queue = OrgQueue::of(org_id, settings.as_ref(), jobs.max_running_per_org);
    queue.running = repo::running_count(&jobs.db, org_id).await?;
    Ok(queue)
}

impl OrgQueue {
    /// An organization's share as its settings (none: the defaults) make it, no job counted.
    fn of(org_id: &OrgId, settings: Option<&entities::queue_org_setting::Model>, default_cap: u32) -> Self {
        let (weight, max_running) = settings.map_or((1, None), |s| (s.weight, s.max_running));
        Self {
            org_id: org_id.clone(),
            weight,
            max_running,
            effective_max_running: max_running.map_or(i64::from(default_cap), i64::from),
            running: 0,
        }
    }
}

/// How many organizations [`org_shares`] lists at most.
const SHARES_SHOWN: usize = 200;

/// The organizations with queued or running jobs, or with settings of their own: each one's
/// share of the queue, the busiest first.
#[tracing::instrument(level = "debug", skip_all)]
pub async fn org_shares(jobs: &Jobs) -> Result<Vec<(OrgQueue, i64)>, JobError> {
    let mut by_org: std::collections::BTreeMap<OrgId, (OrgQueue, i64)> = std::collections::BTreeMap::new();
    let default_cap = jobs.max_running_per_org;
    for settings in repo::all_org_settings(&jobs.db).await? {
        let queue = OrgQueue::of(&settings.org_id, Some(&settings), default_cap);
        by_org.insert(settings.org_id.clone(), (queue, 0));
    }
    for (org_id, status, count) in repo::open_counts_by_org(&jobs.db).await? {
        let entry = by_org
            .entry(org_id.clone())
            .or_insert_with(|| (OrgQueue::of(&org_id, None, default_cap), 0));
        match status {
            JobStatus::Queued => entry.1 += count,
            _ => entry.0.running += count,
        }
    }
    let mut shares: Vec<(OrgQueue, i64)> = by_org.into_values().collect();
    shares.sort_by_key(|share| std::cmp::Reverse((share.0.running, share.1)));
    shares.truncate(SHARES_SHOWN);
    Ok(shares)
}

/// Sets an organization's weight and cap (`None`: the default cap); claims on every
/// instance use them from their next turn.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn set_org_queue(
    jobs: &Jobs,
    org_id: &OrgId,
    weight: i32,
    max_running: Option<i32>,
) -> Result<OrgQueue, JobError> {
    if !crate::orgs::repo::org_exists(&jobs.db, org_id).await? {
        return Err(JobError::OrgNotFound);
    }
    repo::set_org_settings(&jobs.db, org_id, weight, max_running).await?;
    // A higher cap may free jobs that waiting claims could take now.
    jobs.cluster.publish(Event::JobsQueued(Wake::Any)).await;
    org_queue(jobs, org_id).await
}

/// Every action's queue: whether it is paused, and its jobs counted by status.
#[tracing::instrument(level = "debug", skip_all)]
pub async fn action_queues(jobs: &Jobs) -> Result<Vec<ActionQueue>, JobError> {
    let paused = repo::paused_actions(&jobs.db).await?;
    let counts = repo::counts_by_action_status(&jobs.db).await?;
    Ok(JobAction::ALL
        .into_iter()
        .map(|action| ActionQueue::of(action, paused.contains(&action), &counts))
        .collect())
}

/// One action's queue, as the pause and resume leave it.
async fn action_queue(jobs: &Jobs, action: JobAction) -> Result<ActionQueue, JobError> {
    let paused = repo::is_paused(&jobs.db, action).await?;
    let counts = repo::counts_by_action_status(&jobs.db).await?;
    Ok(ActionQueue::of(action, paused, &counts))
}

/// One action's queue, as operators read it.
pub struct ActionQueue {
    pub action: JobAction,
    pub paused: bool,
    /// Every status, in the contract's order, with its count (0 included).
    pub counts: Vec<(JobStatus, i64)>,
}

impl ActionQueue {
    /// `action`'s counts out of every `(action, status, count)` row, each status once.
    fn of(action: JobAction, paused: bool, counts: &[(String, String, i64)]) -> Self {
        let count = |status: JobStatus| {
            counts
                .iter()
                .find(|(a, s, _)| *a == action.as_str() && *s == status.as_str())
                .map_or(0, |(_, _, n)| *n)
        };
        Self {
            action,
            paused,
            counts: JobStatus::ALL
                .into_iter()
                .map(|status| (status, count(status)))
                .collect(),
        }
    }
}

/// The organization's jobs blocked at their claim for want of funds go back to the queue
/// (its balance was just credited); the claims waiting on their actions look again, here
/// and on every instance. A job a worker reported blocked stays as it is.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn requeue_blocked_for_funds(jobs: &Jobs, org_id: &OrgId) -> Result<(), JobError> {
    let requeued = repo::requeue_blocked_for_funds(&jobs.db, org_id).await?;
    super::logged::requeued_on_credit(&requeued);
    let mut actions: Vec<JobAction> = requeued.into_iter().map(|job| job.action).collect();
    actions.sort_by_key(|a| a.as_str());
    actions.dedup();
    for action in actions {
        jobs.cluster
            .publish(Event::JobsQueued(Wake::Action(action)))
            .await;
    }
    Ok(())
}

/// Until the process stops, queues again the jobs blocked for want of funds of every
/// organization the ledger credits (`queue.requeue_blocked_on_credit`).
pub async fn requeue_blocked_on_credit(
    jobs: Jobs,
    mut credited: tokio::sync::mpsc::UnboundedReceiver<OrgId>,
    stop: tokio_util::sync::CancellationToken,
) {
    loop {
        // A credit already announced is handled before a stop (an operator's command that
        // granted credit stops right after).
        let org_id = tokio::select! {
            biased;
            credited = credited.recv() => match credited {
                Some(org_id) => org_id,
                None => return,
            },
            () = stop.cancelled() => return,
        };
        if let Err(err) = requeue_blocked_for_funds(&jobs, &org_id).await {
            tracing::warn!(org_id = %org_id, error = %err, "requeueing jobs blocked for funds failed");
        }
    }
}

/// A worker's terminal report (succeeded, failed, blocked, user-stopped), applied with the
/// others that arrive meanwhile (group commit, no actor).
#[tracing::instrument(level = "debug", skip_all)]
pub async fn report(jobs: &Jobs, report: repo::Report) -> Result<repo::ReportOutcome, JobError> {
    let (answer, lead) = jobs.reports.push(report);
    if lead {
        // Its own task: a client that hangs up cannot strand the batch.
        // (It applies the reports of other requests too: the leader's request is its cause.)
        tokio::spawn(crate::context::carry(apply_waiting_reports(jobs.clone())));
    }
    answer
        .await
        .unwrap_or(Err(JobError::Queue(super::QueueError::Stopped)))
}

/// Reports applied together at most.
const REPORTS_AT_ONCE: usize = 1000;

/// Applies the single reports that wait, batch after batch, until none does.
async fn apply_waiting_reports(jobs: Jobs) {
    /// Should this task panic, the group commit does not stay "applying" with nobody to apply.
    struct Unwinding<'a>(&'a Jobs);
    impl Drop for Unwinding<'_> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                self.0.reports.abandon();
            }
        }
    }
    let _unwinding = Unwinding(&jobs);
    while let Some(batch) = jobs.reports.next_batch(REPORTS_AT_ONCE) {
        let (batch, replies): (Vec<repo::Report>, Vec<_>) = batch.into_iter().unzip();
        match reports(&jobs, batch).await {
            Ok(outcomes) => {
                for (reply, outcome) in replies.into_iter().zip(outcomes) {
                    let _ = reply.send(Ok(outcome));
                }
            }
            Err(err) => {
                tracing::error!(
                    error = &err as &dyn std::error::Error,
                    reports = replies.len(),
                    "applying job reports failed"
                );
                for reply in replies {
                    let _ = reply.send(Err(JobError::Queue(super::QueueError::Batch)));
                }
            }
        }
    }
}

/// Several terminal reports, applied together (one transaction, one statement on PostgreSQL
/// when it can); each answers as it would alone, in order. A job named twice: the first
/// report is applied, the later ones answer as repeats or as not held, as they would after it.
#[tracing::instrument(level = "debug", skip_all)]
pub async fn reports(jobs: &Jobs, reports: Vec<repo::Report>) -> Result<Vec<repo::ReportOutcome>, JobError> {
    let mut outcomes = vec![repo::ReportOutcome::NotFound; reports.len()];
    let mut left: Vec<(usize, repo::Report)> = reports.into_iter().enumerate().collect();
    while !left.is_empty() {
        // One report per job a round; a job named again waits for the next round.
        let mut ids = std::collections::HashSet::new();
        let (round, later): (Vec<_>, Vec<_>) =
            left.into_iter().partition(|(_, r)| ids.insert(r.job_id.clone()));
        left = later;
        let (indexes, batch): (Vec<usize>, Vec<repo::Report>) = round.into_iter().unzip();
        let repo::AppliedReports {
            outcomes: applied,
            ended,
            settled,
        } = repo::apply_reports(&jobs.db, &batch, &jobs.retry_policy).await?;
        super::logged::reported(&batch, &ended);
        super::logged::settled(&settled);
        wake_if_queued(jobs, &settled).await;
        for outcome in &applied {
            jobs.metrics.reports.with_label_values(&[outcome.as_str()]).inc();
        }
        super::actor::observe_ended(&jobs.metrics, &ended);
        for (index, outcome) in indexes.into_iter().zip(applied) {
            outcomes[index] = outcome;
        }
    }
    Ok(outcomes)
}

/// A worker says it still works on the job: whether it holds it, and whether a stop was asked.
#[tracing::instrument(level = "debug", skip_all, fields(job_id = %job_id, worker_id = %worker_id))]
pub async fn heartbeat(jobs: &Jobs, job_id: JobId, worker_id: String) -> Result<repo::Held, JobError> {
    Ok(repo::heartbeat(&jobs.db, &job_id, &worker_id).await?)
}

/// A worker says it still works on each of the jobs (one statement for all); answers, in
/// order, whether it holds each and whether a stop was asked.
#[tracing::instrument(level = "debug", skip_all, fields(worker_id = %worker_id))]
pub async fn heartbeats(
    jobs: &Jobs,
    job_ids: &[JobId],
    worker_id: &str,
) -> Result<Vec<repo::Held>, JobError> {
    Ok(repo::heartbeats(&jobs.db, job_ids, worker_id).await?)
}

/// Requeues (or ends) jobs whose worker stopped sending heartbeats, through the queue actor.
#[tracing::instrument(level = "debug", skip_all)]
pub async fn requeue_stale(jobs: &Jobs) -> Result<SweepCounts, JobError> {
    Ok(ask(&jobs.actor, RequeueStale).await?)
}

/// A restarted worker's running and stopping jobs go back to the queue; waiting claims
/// look again.
#[tracing::instrument(level = "debug", skip_all, fields(worker_id = %worker_id))]
pub async fn requeue_interrupted(jobs: &Jobs, worker_id: &str) -> Result<u64, JobError> {
    let ended = repo::requeue_interrupted(&jobs.db, worker_id).await?;
    super::logged::swept("job.requeued_interrupted", &ended);
    super::actor::observe_ended(&jobs.metrics, &ended);
    let requeued = ended.len() as u64;
    jobs.metrics
        .requeued
        .with_label_values(&["interrupted"])
        .inc_by(requeued);
    if requeued > 0 {
        jobs.cluster
            .publish(crate::cluster::Event::JobsQueued(crate::cluster::Wake::Any))
            .await;
    }
    Ok(requeued)
}

/// Claims up to `limit` jobs of `action` for `worker_id` (each billed its run fee once).
/// With `wait`, a claim that finds none waits until jobs of that action are queued or
/// requeued on any instance, the wait ends, or the process begins to shut down; it then
/// answers what it finds (nothing on timeout).
#[tracing::instrument(level = "debug", skip_all, fields(worker_id = %worker_id, action = %action))]
pub async fn claim(
    jobs: &Jobs,
    worker_id: String,
    action: crate::domain::JobAction,
    limit: u32,
    wait: Option<std::time::Duration>,
    wanted: super::StillWanted,
) -> Result<Vec<training_job::Model>, JobError> {
    let deadline = wait.map(|w| tokio::time::Instant::now() + w);
    let signal = jobs.cluster.jobs_signal(action);
    let stopping = jobs.cluster.stopping().clone();
    loop {
        // A draining instance hands out nothing: its claimants back off (503 with
        // Retry-After) instead of asking again at once, as an empty answer would have them.
        if stopping.is_cancelled() {
            return Err(JobError::Draining);
        }
        // Registered before looking, so a job queued meanwhile still wakes this claim.
        let woken = signal.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        if !wanted() {
            return Ok(Vec::new());
        }
        // Its own task: a claim that took jobs runs to its end (fees, or the jobs handed back)
        // even when the claimant hangs up and its request is dropped.
        let claim = tokio::spawn(crate::context::carry({
            let (jobs, worker_id, wanted) = (jobs.clone(), worker_id.clone(), wanted.clone());
            async move { super::claims::claim_once(&jobs, &worker_id, action, limit, &wanted).await }
        }));
        let claimed = claim
            .await
            .map_err(|err| JobError::Queue(super::QueueError::Task(err)))??;
        let Some(deadline) = deadline.filter(|_| claimed.is_empty()) else {
            return Ok(claimed);
        };
        // A claimant that leaves while waiting is noticed within a second.
        let left = async {
            loop {
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                if !wanted() {
                    break;
                }
            }
        };
        tokio::select! {
            _ = &mut woken => {}
            _ = tokio::time::sleep_until(deadline) => return Ok(claimed),
            _ = stopping.cancelled() => return Err(JobError::Draining),
            _ = left => return Ok(claimed),
        }
    }
}

/// The queue as an operator sees it.
pub struct QueueOverview {
    /// `(action, status, jobs)`.
    pub counts: Vec<(String, String, i64)>,
    /// The oldest queued job's age per action.
    pub oldest_queued: Vec<(String, chrono::Duration)>,
    /// Held jobs (running or stopping), by worker.
    pub held: Vec<training_job::Model>,
    /// Held jobs whose last sign of life is older than the stale threshold.
    pub stale: Vec<training_job::Model>,
    pub stale_after: chrono::Duration,
}

/// How many held jobs the overview lists.
const HELD_SHOWN: u64 = 500;

#[tracing::instrument(level = "debug", skip_all)]
pub async fn queue_overview(jobs: &Jobs) -> Result<QueueOverview, JobError> {
    let now = chrono::Utc::now();
    let stale_after = jobs.stale_after;
    let counts = repo::counts_by_action_status(&jobs.db).await?;
    let oldest_queued = repo::oldest_queued(&jobs.db)
        .await?
        .into_iter()
        .map(|(action, at)| (action, now - at))
        .collect();
    let held = repo::held_jobs(&jobs.db, HELD_SHOWN).await?;
    let stale = held
        .iter()
        .filter(|job| {
            job.heartbeat_at
                .or(job.claimed_at)
                .is_some_and(|seen| now - seen > stale_after)
        })
        .cloned()
        .collect();
    Ok(QueueOverview {
        counts,
        oldest_queued,
        held,
        stale,
        stale_after,
    })
}

/// The organization's job (another organization's is "not found").
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id, job_id = %job_id))]
pub async fn job_of_org(
    jobs: &Jobs,
    org_id: &OrgId,
    job_id: &JobId,
) -> Result<training_job::Model, JobError> {
    job_of_orgs(jobs, std::slice::from_ref(org_id), job_id).await
}

/// A job of one of `orgs` (another organization's is "not found").
#[tracing::instrument(level = "debug", skip_all, fields(job_id = %job_id))]
pub async fn job_of_orgs(
    jobs: &Jobs,
    orgs: &[OrgId],
    job_id: &JobId,
) -> Result<training_job::Model, JobError> {
    repo::find_job(&jobs.db, job_id)
        .await?
        .filter(|job| orgs.contains(&job.org_id))
        .ok_or(JobError::NotFound)
}

/// A job as its worker reads it, whichever organization's.
#[tracing::instrument(level = "debug", skip_all, fields(job_id = %job_id))]
pub async fn job_for_worker(jobs: &Jobs, job_id: &JobId) -> Result<training_job::Model, JobError> {
    repo::find_job(&jobs.db, job_id).await?.ok_or(JobError::NotFound)
}

/// The claiming worker's free-form progress, which the job's readers see.
#[tracing::instrument(level = "debug", skip_all, fields(job_id = %job_id, worker_id = %worker_id))]
pub async fn set_live_status(
    jobs: &Jobs,
    job_id: &JobId,
    worker_id: &str,
    live_status: &serde_json::Value,
) -> Result<repo::Held, JobError> {
    Ok(repo::set_live_status(&jobs.db, job_id, worker_id, live_status).await?)
}

/// A job's dependencies and dependents, with their states.
#[tracing::instrument(level = "debug", skip_all, fields(job_id = %job_id))]
pub async fn pipeline_view(jobs: &Jobs, job_id: &JobId) -> Result<repo::PipelineView, JobError> {
    Ok(repo::pipeline_view(&jobs.db, job_id).await?)
}

/// Jobs of a pipeline the console draws at most.
pub const PIPELINE_DRAWN: u64 = 200;

/// The pipeline `job_id` is in, as the console draws it: its first [`PIPELINE_DRAWN`] jobs
/// (oldest first), the edges between them (`(job, depends on)`), and whether it has more.
#[tracing::instrument(level = "debug", skip_all, fields(job_id = %job_id))]
pub async fn pipeline_graph(jobs: &Jobs, job_id: &JobId) -> Result<repo::PipelineGraph, JobError> {
    Ok(repo::pipeline_graph(&jobs.db, job_id, PIPELINE_DRAWN).await?)
}

/// A page of the organization's jobs, newest first, and whether more follow.
#[tracing::instrument(level = "debug", skip_all)]
pub async fn jobs_page(
    jobs: &Jobs,
    org_ids: &[crate::domain::OrgId],
    filter: &repo::JobFilter,
    limit: u64,
) -> Result<(Vec<training_job::Model>, Option<crate::paging::Keyset>), JobError> {
    let mut page = repo::list_jobs(&jobs.db, org_ids, filter, limit + 1).await?;
    let more = page.len() as u64 > limit;
    page.truncate(limit as usize);
    let next = more
        .then(|| page.last())
        .flatten()
        .map(|last| crate::paging::Keyset::new(last.created_at, last.id.as_str()));
    Ok((page, next))
}
