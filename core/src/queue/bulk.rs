//! What people do with many jobs at once in the console: a sorted, counted listing, and a stop
//! or retry of a selection (rows picked, or everything a filter keeps).

use entities::training_job;

use super::repo::{self, JobFilter, JobSort};
use super::{JobError, Jobs};
use crate::domain::{JobId, JobStatus, OrgId};

/// At most this many jobs in one stop or retry of a selection.
pub const MAX_ACTED_AT_ONCE: usize = super::service::MAX_RETRIED_AT_ONCE;

/// A page of jobs with what the page says about all of them.
pub struct Listing {
    pub jobs: Vec<training_job::Model>,
    /// How many jobs the filter keeps (every page).
    pub total: u64,
    /// How many the filter keeps in each status, its statuses set aside (zero ones left out).
    pub by_status: Vec<(JobStatus, u64)>,
}

/// The jobs of `org_ids` that `filter` keeps, in `sort`'s order, `limit` from `offset`,
/// with their total and their counts per status.
#[tracing::instrument(level = "debug", skip_all)]
pub async fn listing(
    jobs: &Jobs,
    org_ids: &[OrgId],
    filter: &JobFilter,
    sort: JobSort,
    offset: u64,
    limit: u64,
) -> Result<Listing, JobError> {
    let by_status = repo::status_counts(&jobs.db, org_ids, filter).await?;
    let total = match filter.status.is_empty() {
        true => by_status.iter().map(|(_, n)| n).sum(),
        false => by_status
            .iter()
            .filter(|(s, _)| filter.status.contains(s))
            .map(|(_, n)| n)
            .sum(),
    };
    let page = match offset < total {
        true => repo::sorted_jobs(&jobs.db, org_ids, filter, sort, offset, limit).await?,
        false => Vec::new(),
    };
    Ok(Listing {
        jobs: page,
        total,
        by_status,
    })
}

/// What a stop or retry of many acts on.
pub enum Selection {
    /// These jobs (ids of other organizations' jobs are left out).
    Ids(Vec<JobId>),
    /// Every job the filter keeps (the newest [`MAX_ACTED_AT_ONCE`]).
    Matching(JobFilter),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BulkAction {
    Stop,
    Retry,
}

impl BulkAction {
    /// The statuses the action changes (any other is left alone).
    pub fn acts_on(self) -> &'static [JobStatus] {
        match self {
            BulkAction::Stop => &[
                JobStatus::Queued,
                JobStatus::Scheduled,
                JobStatus::Waiting,
                JobStatus::Running,
            ],
            BulkAction::Retry => &[JobStatus::Failed, JobStatus::Blocked, JobStatus::UserStopped],
        }
    }
}

/// A selection as found: its jobs (at most [`MAX_ACTED_AT_ONCE`]) and how many of them the
/// action would change.
pub struct Selected {
    pub ids: Vec<JobId>,
    pub actionable: usize,
    /// More jobs matched than one action takes.
    pub capped: bool,
}

/// Finds the organization's jobs of `selection` and counts those `action` would change.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn select(
    jobs: &Jobs,
    org_id: &OrgId,
    selection: &Selection,
    action: BulkAction,
) -> Result<Selected, JobError> {
    let orgs = std::slice::from_ref(org_id);
    let (found, capped) = match selection {
        Selection::Ids(ids) => {
            let mut ids = ids.clone();
            ids.sort_unstable_by(|a, b| a.as_str().cmp(b.as_str()));
            ids.dedup();
            let capped = ids.len() > MAX_ACTED_AT_ONCE;
            ids.truncate(MAX_ACTED_AT_ONCE);
            (repo::statuses_of(&jobs.db, orgs, &ids).await?, capped)
        }
        Selection::Matching(filter) => {
            let ids = repo::job_ids_matching(&jobs.db, orgs, filter, MAX_ACTED_AT_ONCE as u64 + 1).await?;
            let capped = ids.len() > MAX_ACTED_AT_ONCE;
            let ids = &ids[..ids.len().min(MAX_ACTED_AT_ONCE)];
            (repo::statuses_of(&jobs.db, orgs, ids).await?, capped)
        }
    };
    let actionable = found
        .iter()
        .filter(|(_, status)| action.acts_on().contains(status))
        .count();
    Ok(Selected {
        ids: found.into_iter().map(|(id, _)| id).collect(),
        actionable,
        capped,
    })
}

/// What a stop or retry of many did: `changed` jobs changed, `left` left alone (their state
/// was not one the action changes, by the time it ran).
pub struct Acted {
    pub changed: usize,
    pub left: usize,
}

/// Stops or retries the organization's jobs of `selection` (at most [`MAX_ACTED_AT_ONCE`]),
/// each by the rules of one (a queued job ends, a running one is asked to stop; a failed,
/// blocked or user-stopped one is queued again), in one guarded statement per change.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id, action = ?action))]
pub async fn act(
    jobs: &Jobs,
    org_id: &OrgId,
    selection: &Selection,
    action: BulkAction,
    reason: Option<&str>,
) -> Result<Acted, JobError> {
    let selected = select(jobs, org_id, selection, action).await?;
    let changed = match action {
        BulkAction::Stop => {
            let (changed, settled) = repo::stop_jobs(&jobs.db, &selected.ids, reason).await?;
            super::logged::settled(&settled);
            changed
        }
        BulkAction::Retry => {
            let retried = repo::retry_jobs(&jobs.db, &selected.ids).await?;
            super::logged::settled(&retried.settled);
            super::service::queued_again(jobs, &retried.retried).await;
            retried.retried
        }
    };
    tracing::info!(target: "keel_event", event = "jobs.acted_on", org_id = %org_id, action = ?action, selected = selected.ids.len(), changed = changed.len(), "jobs stopped or retried together");
    Ok(Acted {
        changed: changed.len(),
        left: selected.ids.len() - changed.len(),
    })
}
