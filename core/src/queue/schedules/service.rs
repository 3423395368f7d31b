//! Schedule flows (create, read, change, delete, run now) and the tick loop every instance
//! runs.

use chrono::{DateTime, Utc};
use entities::{training_job, training_schedule};
use sea_orm::{DbErr, TransactionTrait};
use tokio_util::sync::CancellationToken;

use super::cadence::{self, Cadence};
use super::{
    repo, CatchUp, JobTemplate, NewSchedule, Schedule, ScheduleChange, ScheduleError, Schedules,
    MAX_SCHEDULES_PER_ORG, MAX_TICKS_A_PASS, TICKS_KEPT,
};
use crate::domain::{OrgId, ScheduleId};
use crate::queue::repo::{insert_jobs, insert_keyed, Inserted, NewJob};
use crate::queue::service::{create_job, Created};
use crate::queue::JobError;

/// Next ticks a schedule's view shows, and jobs.
const SHOWN: usize = 5;

/// The job template's project and dataset must be the organization's (404 otherwise, as for
/// a job's create).
async fn check_template(s: &Schedules, org_id: &OrgId, template: &JobTemplate) -> Result<(), ScheduleError> {
    let db = &s.jobs.db;
    crate::projects::repo::find_in_orgs(db, &template.project_id, std::slice::from_ref(org_id))
        .await?
        .ok_or(JobError::ProjectNotFound { index: None })?;
    if let Some((id, version)) = &template.dataset {
        match crate::datasets::service::pin(db, org_id, id, *version).await {
            Ok(_) => {}
            Err(crate::datasets::DatasetError::Database(err)) => return Err(err.into()),
            Err(_) => return Err(JobError::DatasetNotFound { index: None }.into()),
        }
    }
    Ok(())
}

/// The tick after `after` (not before the last enqueued one), if enabled.
fn next_tick(
    cadence: &Cadence,
    enabled: bool,
    after: DateTime<Utc>,
    last: Option<DateTime<Utc>>,
) -> Option<DateTime<Utc>> {
    let after = last.map_or(after, |last| last.max(after));
    enabled.then(|| cadence.next_after(after)).flatten()
}

async fn shown(s: &Schedules, row: training_schedule::Model) -> Result<Schedule, ScheduleError> {
    let upcoming = match (row.next_run_at, Cadence::parse(&row.cron, &row.timezone)) {
        (Some(next), Ok(cadence)) => {
            let mut ticks = vec![next];
            ticks.extend(cadence.upcoming(next, SHOWN - 1));
            ticks
        }
        _ => Vec::new(),
    };
    let recent_jobs = repo::recent_jobs(&s.jobs.db, &row.id, SHOWN as u64).await?;
    Ok(Schedule {
        row,
        upcoming,
        recent_jobs,
    })
}

/// Creates a schedule; its first tick is the first after now.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %new.org_id))]
pub async fn create(s: &Schedules, new: NewSchedule) -> Result<Schedule, ScheduleError> {
    let cadence = Cadence::parse(&new.cron, &new.timezone)?;
    check_template(s, &new.org_id, &new.template).await?;
    // The count and the insert under the organization's lock: creates at once never pass
    // the limit.
    let txn = s.jobs.db.begin().await?;
    repo::lock_org_creates(&txn, &new.org_id).await?;
    if repo::count_in_org(&txn, &new.org_id).await? >= MAX_SCHEDULES_PER_ORG {
        return Err(ScheduleError::LimitReached);
    }
    let now = Utc::now();
    let row = training_schedule::Model {
        id: ScheduleId::generate(),
        org_id: new.org_id,
        project_id: new.template.project_id.clone(),
        name: new.name,
        next_run_at: next_tick(&cadence, new.enabled, now, None),
        cron: new.cron,
        timezone: new.timezone,
        job: new.job_body.to_string(),
        template: serde_json::to_string(&new.template).map_err(|e| DbErr::Custom(e.to_string()))?,
        enabled: new.enabled,
        catch_up: new.catch_up.as_str().to_owned(),
        last_tick_at: None,
        created_at: now,
        updated_at: now,
    };
    repo::insert(&txn, row.clone()).await?;
    txn.commit().await?;
    tracing::info!(
        target: "keel_event",
        event = "schedule.created",
        org_id = %row.org_id,
        schedule_id = %row.id,
        cron = %row.cron,
        timezone = %row.timezone,
        enabled = row.enabled,
        "schedule created"
    );
    s.wake.notify_one();
    shown(s, row).await
}

/// The schedules of `orgs`, oldest first.
pub async fn list(s: &Schedules, orgs: &[OrgId]) -> Result<Vec<Schedule>, ScheduleError> {
    let mut schedules = Vec::new();
    for row in repo::list(&s.jobs.db, orgs).await? {
        schedules.push(shown(s, row).await?);
    }
    Ok(schedules)
}

async fn find(
    s: &Schedules,
    orgs: &[OrgId],
    id: &ScheduleId,
) -> Result<training_schedule::Model, ScheduleError> {
    repo::find_in_orgs(&s.jobs.db, id, orgs)
        .await?
        .ok_or(ScheduleError::NotFound)
}

pub async fn get(s: &Schedules, orgs: &[OrgId], id: &ScheduleId) -> Result<Schedule, ScheduleError> {
    let row = find(s, orgs, id).await?;
    shown(s, row).await
}

/// Changes the fields given. A new cron, zone or `enabled: true` sets the next tick to the
/// first after now (ticks while it was disabled are not caught up); `enabled: false` clears it.
#[tracing::instrument(level = "debug", skip_all, fields(schedule_id = %id))]
pub async fn update(
    s: &Schedules,
    orgs: &[OrgId],
    id: &ScheduleId,
    change: ScheduleChange,
) -> Result<Schedule, ScheduleError> {
    let mut row = find(s, orgs, id).await?;
    let retimed = change.cron.as_ref().is_some_and(|c| *c != row.cron)
        || change.timezone.as_ref().is_some_and(|z| *z != row.timezone)
        || change.enabled.is_some_and(|e| e != row.enabled);
    if let Some(name) = change.name {
        row.name = name;
    }
    if let Some(cron) = change.cron {
        row.cron = cron;
    }
    if let Some(timezone) = change.timezone {
        row.timezone = timezone;
    }
    let cadence = Cadence::parse(&row.cron, &row.timezone)?;
    if let Some((body, job_org, template)) = change.job {
        if job_org.is_some_and(|org| org != row.org_id) {
            return Err(ScheduleError::JobOrgMismatch);
        }
        check_template(s, &row.org_id, &template).await?;
        row.project_id = template.project_id.clone();
        row.job = body.to_string();
        row.template = serde_json::to_string(&template).map_err(|e| DbErr::Custom(e.to_string()))?;
    }
    if let Some(enabled) = change.enabled {
        row.enabled = enabled;
    }
    if let Some(catch_up) = change.catch_up {
        row.catch_up = catch_up.as_str().to_owned();
    }
    let now = Utc::now();
    if retimed {
        row.next_run_at = next_tick(&cadence, row.enabled, now, row.last_tick_at);
    }
    row.updated_at = now;
    repo::save(&s.jobs.db, row.clone(), retimed).await?;
    tracing::info!(
        target: "keel_event",
        event = "schedule.updated",
        org_id = %row.org_id,
        schedule_id = %row.id,
        enabled = row.enabled,
        "schedule changed"
    );
    s.wake.notify_one();
    shown(s, row).await
}

/// Deletes a schedule: no tick of it enqueues again; its jobs stay as they are.
pub async fn delete(s: &Schedules, orgs: &[OrgId], id: &ScheduleId) -> Result<(), ScheduleError> {
    let row = find(s, orgs, id).await?;
    repo::delete(&s.jobs.db, id).await?;
    tracing::info!(target: "keel_event", event = "schedule.deleted", org_id = %row.org_id, schedule_id = %row.id, "schedule deleted");
    Ok(())
}

/// One job of the schedule now, outside its ticks (a disabled schedule too): as a job's
/// create makes it, with the schedule's id and no tick.
pub async fn run_now(s: &Schedules, orgs: &[OrgId], id: &ScheduleId) -> Result<Created, ScheduleError> {
    let row = find(s, orgs, id).await?;
    let template: JobTemplate =
        serde_json::from_str(&row.template).map_err(|e| DbErr::Custom(e.to_string()))?;
    let created = create_job(&s.jobs, template.new_job(&row.org_id, &row.id, None)).await?;
    if let Created::New(job) | Created::Existing(job) = &created {
        if matches!(created, Created::New(_)) {
            s.jobs.metrics.schedule_enqueued("run_now", 1);
        }
        tracing::info!(
            target: "keel_event",
            event = "schedule.run_now",
            org_id = %row.org_id,
            schedule_id = %row.id,
            job_id = %job.id,
            "schedule run by hand"
        );
    }
    Ok(created)
}

/// Enqueues every due tick: each due schedule in its own transaction. Answers the jobs made.
pub async fn pass(s: &Schedules, now: DateTime<Utc>) -> Result<usize, DbErr> {
    let mut made = 0;
    for id in repo::due_ids(&s.jobs.db, now, 500).await? {
        match tick(s, &id, now).await {
            Ok(n) => made += n,
            Err(err) => {
                tracing::warn!(schedule_id = %id, error = %err, "a schedule's tick failed; the next pass tries it again")
            }
        }
    }
    Ok(made)
}

/// Why a tick's job cannot be made at all (the schedule goes on to its next tick).
enum Unmakeable {
    Template(String),
    Project,
    Dataset,
}

impl Unmakeable {
    fn reason(&self) -> &str {
        match self {
            Self::Template(reason) => reason,
            Self::Project => "its project is gone",
            Self::Dataset => "its dataset (or the version it names) is gone",
        }
    }
}

/// The tick's job, its dataset pinned now (the latest version unless one is named).
async fn tick_job(
    db: &impl sea_orm::ConnectionTrait,
    row: &training_schedule::Model,
    at: DateTime<Utc>,
) -> Result<Result<NewJob, Unmakeable>, DbErr> {
    let template: JobTemplate = match serde_json::from_str(&row.template) {
        Ok(template) => template,
        Err(err) => return Ok(Err(Unmakeable::Template(err.to_string()))),
    };
    if crate::projects::repo::find_in_orgs(db, &template.project_id, std::slice::from_ref(&row.org_id))
        .await?
        .is_none()
    {
        return Ok(Err(Unmakeable::Project));
    }
    let mut job = template.new_job(&row.org_id, &row.id, Some(at));
    if let Some(dataset) = job.dataset.as_mut() {
        match crate::datasets::service::pin(db, &row.org_id, &dataset.id, dataset.version).await {
            Ok(pinned) => dataset.pinned = Some(pinned),
            Err(crate::datasets::DatasetError::Database(err)) => return Err(err),
            Err(_) => return Ok(Err(Unmakeable::Dataset)),
        }
    }
    Ok(Ok(job))
}

/// One due schedule: its due ticks' rows and jobs, and its next tick, in one transaction
/// (nothing of it stays if any part fails, or if another instance moved the schedule on).
async fn tick(s: &Schedules, id: &ScheduleId, now: DateTime<Utc>) -> Result<usize, DbErr> {
    let txn = s.jobs.db.begin().await?;
    let Some(row) = repo::lock_due(&txn, id, now).await? else {
        return Ok(0);
    };
    let Some(from) = row.next_run_at else {
        return Ok(0);
    };
    let cadence = match Cadence::parse(&row.cron, &row.timezone) {
        Ok(cadence) => cadence,
        Err(err) => {
            // Checked when set: only a zone dropped from a later zone database gets here.
            tracing::error!(target: "keel_event", event = "schedule.tick_failed", org_id = %row.org_id, schedule_id = %row.id, error = %err, "a schedule's cron or zone no longer reads: it stops until changed");
            repo::advance(&txn, id, from, None, None).await?;
            txn.commit().await?;
            return Ok(0);
        }
    };
    let catch_up = CatchUp::parse(&row.catch_up).unwrap_or_default();
    let due = cadence::due_ticks(
        &cadence,
        from,
        now,
        s.grace,
        catch_up == CatchUp::Latest,
        MAX_TICKS_A_PASS,
    );
    let mut made: Vec<(training_job::Model, bool, DateTime<Utc>)> = Vec::new();
    // Logged once committed (a rolled-back pass made nothing to tell).
    let mut unmade: Vec<(DateTime<Utc>, Unmakeable)> = Vec::new();
    for at in due.ticks.iter().copied() {
        if !repo::insert_tick(&txn, id, at).await? {
            continue;
        }
        let job = match tick_job(&txn, &row, at).await? {
            Ok(job) => job,
            Err(why) => {
                unmade.push((at, why));
                continue;
            }
        };
        let (job, new) = match job.unique_key.is_some() {
            true => match insert_keyed(&txn, job).await? {
                Inserted::New(job) => (job, true),
                Inserted::Unique(job) | Inserted::Replayed(job) => (job, false),
                Inserted::KeyReused => continue,
            },
            false => match insert_jobs(&txn, vec![job]).await.pop() {
                Some(inserted) => (inserted?, true),
                None => continue,
            },
        };
        repo::set_tick_job(&txn, id, at, &job.id).await?;
        made.push((job, new, at));
    }
    if !repo::advance(&txn, id, from, due.next, due.ticks.last().copied()).await? {
        // Another pass moved it on first: this one leaves nothing.
        return Ok(0);
    }
    repo::prune_ticks(&txn, id, TICKS_KEPT).await?;
    txn.commit().await?;
    for (at, why) in &unmade {
        tracing::warn!(target: "keel_event", event = "schedule.tick_failed", org_id = %row.org_id, schedule_id = %row.id, tick = %at, reason = why.reason(), "a schedule's tick enqueued nothing");
    }
    if due.missed > 0 {
        tracing::warn!(
            target: "keel_event",
            event = "schedule.missed",
            org_id = %row.org_id,
            schedule_id = %row.id,
            missed = due.missed,
            since = %from,
            catch_up = catch_up.as_str(),
            "ticks came and went while no instance ran"
        );
    }
    let new: Vec<training_job::Model> = made
        .iter()
        .filter(|(_, new, _)| *new)
        .map(|(job, ..)| job.clone())
        .collect();
    for (job, new, at) in &made {
        let trigger = match due.catch_up && due.ticks.first() == Some(at) {
            true => "catch_up",
            false => "tick",
        };
        if *new {
            s.jobs.metrics.schedule_enqueued(trigger, 1);
        }
        tracing::info!(
            target: "keel_event",
            event = "schedule.enqueued",
            org_id = %row.org_id,
            schedule_id = %row.id,
            job_id = %job.id,
            tick = %at,
            lag_ms = (Utc::now() - *at).num_milliseconds(),
            new_job = *new,
            trigger,
            "schedule tick enqueued"
        );
    }
    crate::queue::logged::created(&new, false);
    crate::queue::service::wake_if_queued(&s.jobs, &new).await;
    Ok(new.len())
}

/// Until `stop`: a pass, then a sleep until the earliest next tick (at most the poll
/// interval, and cut short when a schedule here is created or changed).
pub async fn run(s: Schedules, stop: CancellationToken) {
    loop {
        if let Err(err) = pass(&s, Utc::now()).await {
            tracing::warn!(error = %err, "schedules: looking for due ticks failed; it runs again");
        }
        let wait = match repo::next_due(&s.jobs.db).await {
            Ok(Some(next)) => (next - Utc::now()).to_std().unwrap_or_default().min(s.poll),
            _ => s.poll,
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = s.wake.notified() => {}
            () = tokio::time::sleep(wait) => {}
        }
    }
}
