//! The job state machine: every way a job's status changes, the statuses it may change
//! from, and the status it changes to. The queue's guarded updates take their `WHERE status
//! IN (…)` and their new status from this table and nowhere else, so a transition that is
//! not here cannot happen, on any instance.

use crate::JobStatus::{
    self, Blocked, Cancelled, Failed, Queued, Running, Scheduled, Stopping, Succeeded, UserStopped, Waiting,
};

/// What happens to a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobEvent {
    /// Created to run now.
    Create,
    /// Created to run later (`runAt` in the future).
    Schedule,
    /// A scheduled job came due (its time, or its retry's backoff, passed).
    Promote,
    /// A worker claimed it.
    Claim,
    /// Its worker says it still works on it (or publishes its live status): no change.
    Heartbeat,
    /// Its worker reports it succeeded.
    Succeed,
    /// Its worker reports it failed (for good, or with no attempts left).
    Fail,
    /// Its worker reports a retryable failure and attempts are left: scheduled after a backoff.
    FailRetryable,
    /// Its worker reports it blocked.
    Block,
    /// Its worker confirms the stop its user asked for.
    ConfirmStop,
    /// A user stops a job that is not running yet.
    StopWaiting,
    /// A user stops a running job: its worker hears it at its next heartbeat.
    StopRunning,
    /// A user or operator retries a job that ended without success.
    Retry,
    /// A stopping job whose worker went silent ends stopped.
    StaleStopping,
    /// A running job whose worker went silent goes back to the queue (attempts left).
    StaleRequeue,
    /// A running job whose worker went silent fails (no attempts left).
    StaleFail,
    /// Its worker restarted and handed it back.
    Interrupted,
    /// Claimed, but its organization cannot pay the run fee.
    BlockForFunds,
    /// Its organization was credited after it was blocked for funds.
    RequeueOnCredit,
    /// Claimed, but its fee could not be settled now or its claimant left: back to the queue.
    Release,
    /// Created with dependencies that have not all succeeded yet.
    CreateWaiting,
    /// The last of its dependencies succeeded: queued.
    DependenciesMet,
    /// The last of its dependencies succeeded, and its `runAt` is ahead: scheduled.
    DependenciesMetLater,
    /// One of its dependencies ended without success (or was cancelled itself).
    DependencyBroke,
    /// The dependency that cancelled it was retried: it waits again.
    DependencyRetried,
    /// A user retries a job (stopped while it waited) whose dependencies have not all
    /// succeeded: it waits for them again.
    RetryWaiting,
}

impl JobEvent {
    pub const ALL: [Self; 26] = [
        Self::Create,
        Self::Schedule,
        Self::Promote,
        Self::Claim,
        Self::Heartbeat,
        Self::Succeed,
        Self::Fail,
        Self::FailRetryable,
        Self::Block,
        Self::ConfirmStop,
        Self::StopWaiting,
        Self::StopRunning,
        Self::Retry,
        Self::StaleStopping,
        Self::StaleRequeue,
        Self::StaleFail,
        Self::Interrupted,
        Self::BlockForFunds,
        Self::RequeueOnCredit,
        Self::Release,
        Self::CreateWaiting,
        Self::DependenciesMet,
        Self::DependenciesMetLater,
        Self::DependencyBroke,
        Self::DependencyRetried,
        Self::RetryWaiting,
    ];

    /// The statuses the event applies to (none: it makes a new job).
    pub const fn from(self) -> &'static [JobStatus] {
        const HELD: &[JobStatus] = &[Running, Stopping];
        match self {
            Self::Create | Self::Schedule | Self::CreateWaiting => &[],
            Self::Promote => &[Scheduled],
            Self::Claim => &[Queued],
            Self::Heartbeat
            | Self::Succeed
            | Self::Fail
            | Self::Block
            | Self::ConfirmStop
            | Self::Interrupted => HELD,
            // A stop asked while a retryable failure is reported wins: the job is not retried.
            Self::FailRetryable => &[Running],
            Self::StopWaiting => &[Queued, Scheduled, Waiting],
            Self::StopRunning => &[Running],
            // Not a cancelled job: it runs again when the dependency that cancelled it does.
            Self::Retry | Self::RetryWaiting => &[Failed, Blocked, UserStopped],
            Self::StaleStopping => &[Stopping],
            Self::StaleRequeue | Self::StaleFail | Self::BlockForFunds | Self::Release => &[Running],
            // Only a job blocked at its claim (marked so); one its worker blocked stays.
            Self::RequeueOnCredit => &[Blocked],
            Self::DependenciesMet | Self::DependenciesMetLater | Self::DependencyBroke => &[Waiting],
            Self::DependencyRetried => &[Cancelled],
        }
    }

    /// The status the event leaves the job in (none: it keeps its status).
    pub const fn to(self) -> Option<JobStatus> {
        Some(match self {
            Self::Heartbeat => return None,
            Self::Create
            | Self::Retry
            | Self::StaleRequeue
            | Self::Interrupted
            | Self::RequeueOnCredit
            | Self::Release => Queued,
            Self::Schedule | Self::FailRetryable => Scheduled,
            Self::Promote | Self::DependenciesMet => Queued,
            Self::CreateWaiting | Self::DependencyRetried | Self::RetryWaiting => Waiting,
            Self::DependenciesMetLater => Scheduled,
            Self::DependencyBroke => Cancelled,
            Self::Claim => Running,
            Self::Succeed => Succeeded,
            Self::Fail | Self::StaleFail => Failed,
            Self::Block | Self::BlockForFunds => Blocked,
            Self::ConfirmStop | Self::StopWaiting | Self::StaleStopping => UserStopped,
            Self::StopRunning => Stopping,
        })
    }

    /// Whether the event applies to a job in `status`.
    pub fn applies_to(self, status: JobStatus) -> bool {
        self.from().contains(&status)
    }

    /// The status a job in `status` has after the event, if the event applies to it.
    pub fn next(self, status: JobStatus) -> Option<JobStatus> {
        self.applies_to(status).then(|| self.to().unwrap_or(status))
    }

    /// The event a worker's terminal report of `status` is (none: no report ends a job so).
    pub fn of_report(status: JobStatus, retryable: bool) -> Option<Self> {
        match status {
            Succeeded => Some(Self::Succeed),
            Failed if retryable => Some(Self::FailRetryable),
            Failed => Some(Self::Fail),
            Blocked => Some(Self::Block),
            UserStopped => Some(Self::ConfirmStop),
            _ => None,
        }
    }

    /// As logs and tests name it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Create => "create",
            Self::Schedule => "schedule",
            Self::Promote => "promote",
            Self::Claim => "claim",
            Self::Heartbeat => "heartbeat",
            Self::Succeed => "succeed",
            Self::Fail => "fail",
            Self::FailRetryable => "fail_retryable",
            Self::Block => "block",
            Self::ConfirmStop => "confirm_stop",
            Self::StopWaiting => "stop_waiting",
            Self::StopRunning => "stop_running",
            Self::Retry => "retry",
            Self::StaleStopping => "stale_stopping",
            Self::StaleRequeue => "stale_requeue",
            Self::StaleFail => "stale_fail",
            Self::Interrupted => "interrupted",
            Self::BlockForFunds => "block_for_funds",
            Self::RequeueOnCredit => "requeue_on_credit",
            Self::Release => "release",
            Self::CreateWaiting => "create_waiting",
            Self::DependenciesMet => "dependencies_met",
            Self::DependenciesMetLater => "dependencies_met_later",
            Self::DependencyBroke => "dependency_broke",
            Self::DependencyRetried => "dependency_retried",
            Self::RetryWaiting => "retry_waiting",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_event_is_listed_once() {
        let mut names: Vec<&str> = JobEvent::ALL.iter().map(|e| e.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), JobEvent::ALL.len());
    }

    #[test]
    fn terminal_statuses_leave_only_by_a_retry_or_a_credit() {
        for status in [Succeeded, Failed, Blocked, UserStopped, Cancelled] {
            let leaving: Vec<JobEvent> = JobEvent::ALL
                .into_iter()
                .filter(|e| e.applies_to(status))
                .collect();
            let expected: &[JobEvent] = match status {
                Succeeded => &[],
                Blocked => &[JobEvent::Retry, JobEvent::RequeueOnCredit, JobEvent::RetryWaiting],
                Cancelled => &[JobEvent::DependencyRetried],
                _ => &[JobEvent::Retry, JobEvent::RetryWaiting],
            };
            assert_eq!(leaving, expected, "{status:?}");
        }
    }

    #[test]
    fn only_a_claim_makes_a_job_running_and_only_held_jobs_end_by_report() {
        for event in JobEvent::ALL {
            if event.to() == Some(Running) {
                assert_eq!(event, JobEvent::Claim);
            }
        }
        for (status, retryable) in [
            (Succeeded, false),
            (Failed, false),
            (Failed, true),
            (Blocked, false),
            (UserStopped, false),
        ] {
            let event = JobEvent::of_report(status, retryable).unwrap();
            assert!(
                event.from().iter().all(|s| matches!(s, Running | Stopping)),
                "{event:?}"
            );
            assert_eq!(
                event.next(Running),
                Some(if retryable { Scheduled } else { status })
            );
        }
        assert_eq!(JobEvent::of_report(Running, false), None);
        assert_eq!(JobEvent::Heartbeat.next(Stopping), Some(Stopping));
        assert_eq!(JobEvent::Heartbeat.next(Queued), None);
    }

    #[test]
    fn a_waiting_job_leaves_only_by_its_dependencies_or_a_stop() {
        let leaving: Vec<JobEvent> = JobEvent::ALL
            .into_iter()
            .filter(|e| e.applies_to(Waiting))
            .collect();
        assert_eq!(
            leaving,
            [
                JobEvent::StopWaiting,
                JobEvent::DependenciesMet,
                JobEvent::DependenciesMetLater,
                JobEvent::DependencyBroke,
            ]
        );
        assert!(!JobEvent::Claim.applies_to(Waiting));
        assert!(!JobEvent::Retry.applies_to(Cancelled));
        assert_eq!(JobEvent::StopWaiting.next(Waiting), Some(UserStopped));
        assert_eq!(JobEvent::DependencyBroke.next(Waiting), Some(Cancelled));
        assert_eq!(JobEvent::DependencyRetried.next(Cancelled), Some(Waiting));
    }
}
