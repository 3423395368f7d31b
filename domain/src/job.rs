//! A training job's action and status (CONTRACT §5), as stored and answered.

use sea_orm::{DeriveActiveEnum, EnumIter};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, EnumIter, DeriveActiveEnum)]
#[serde(rename_all = "snake_case")]
#[sea_orm(rs_type = "String", db_type = "Text")]
pub enum JobStatus {
    #[sea_orm(string_value = "queued")]
    Queued,
    /// Due at `scheduled_at` (a `runAt` in the future, or a retry's backoff): queued then.
    #[sea_orm(string_value = "scheduled")]
    Scheduled,
    #[sea_orm(string_value = "running")]
    Running,
    #[sea_orm(string_value = "stopping")]
    Stopping,
    #[sea_orm(string_value = "succeeded")]
    Succeeded,
    #[sea_orm(string_value = "blocked")]
    Blocked,
    #[sea_orm(string_value = "user_stopped")]
    UserStopped,
    #[sea_orm(string_value = "failed")]
    Failed,
    /// Created with `dependsOn`: waits until every job it depends on has succeeded, then
    /// is queued (or scheduled, with a `runAt` ahead). Never claimed, never counted against
    /// a cap or a weight.
    #[sea_orm(string_value = "waiting")]
    Waiting,
    /// A job it depends on ended without success (failed for good, stopped, blocked by its
    /// worker, or cancelled itself): it will not run unless that job is retried.
    #[sea_orm(string_value = "cancelled")]
    Cancelled,
}

impl JobStatus {
    pub const ALL: [Self; 10] = [
        Self::Queued,
        Self::Scheduled,
        Self::Running,
        Self::Stopping,
        Self::Succeeded,
        Self::Blocked,
        Self::UserStopped,
        Self::Failed,
        Self::Waiting,
        Self::Cancelled,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Scheduled => "scheduled",
            Self::Running => "running",
            Self::Stopping => "stopping",
            Self::Succeeded => "succeeded",
            Self::Blocked => "blocked",
            Self::UserStopped => "user_stopped",
            Self::Failed => "failed",
            Self::Waiting => "waiting",
            Self::Cancelled => "cancelled",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }
}

impl PartialEq<JobStatus> for String {
    fn eq(&self, other: &JobStatus) -> bool {
        self == other.as_str()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, EnumIter, DeriveActiveEnum)]
#[serde(rename_all = "snake_case")]
#[sea_orm(rs_type = "String", db_type = "Text")]
pub enum JobAction {
    #[sea_orm(string_value = "tracer")]
    Tracer,
    #[sea_orm(string_value = "draft")]
    Draft,
    #[sea_orm(string_value = "optimize")]
    Optimize,
    #[sea_orm(string_value = "training")]
    Training,
}

impl JobAction {
    pub const ALL: [Self; 4] = [Self::Tracer, Self::Draft, Self::Optimize, Self::Training];
    /// The actions' names, in the order the contract lists them.
    pub const NAMES: [&'static str; 4] = ["tracer", "draft", "optimize", "training"];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Tracer => "tracer",
            Self::Draft => "draft",
            Self::Optimize => "optimize",
            Self::Training => "training",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.as_str() == text)
    }
}

/// How one attempt at a job ended, as its history keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, EnumIter, DeriveActiveEnum)]
#[serde(rename_all = "snake_case")]
#[sea_orm(rs_type = "String", db_type = "Text")]
pub enum AttemptOutcome {
    #[sea_orm(string_value = "succeeded")]
    Succeeded,
    #[sea_orm(string_value = "failed")]
    Failed,
    /// Failed with `retryable: true` and attempts left: scheduled again after a backoff.
    #[sea_orm(string_value = "retried")]
    Retried,
    /// No heartbeat within the stale threshold: the sweep ended it.
    #[sea_orm(string_value = "stale")]
    Stale,
    /// The worker restarted and handed it back (requeue-interrupted).
    #[sea_orm(string_value = "interrupted")]
    Interrupted,
    /// The worker reported it blocked, or the organization could not pay its run fee.
    #[sea_orm(string_value = "blocked")]
    Blocked,
    #[sea_orm(string_value = "user_stopped")]
    UserStopped,
}

impl AttemptOutcome {
    pub const ALL: [Self; 7] = [
        Self::Succeeded,
        Self::Failed,
        Self::Retried,
        Self::Stale,
        Self::Interrupted,
        Self::Blocked,
        Self::UserStopped,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Retried => "retried",
            Self::Stale => "stale",
            Self::Interrupted => "interrupted",
            Self::Blocked => "blocked",
            Self::UserStopped => "user_stopped",
        }
    }

    /// The outcome a worker's terminal report gives its attempt.
    pub const fn of_report(status: JobStatus) -> Self {
        match status {
            JobStatus::Succeeded => Self::Succeeded,
            JobStatus::Blocked => Self::Blocked,
            JobStatus::UserStopped => Self::UserStopped,
            _ => Self::Failed,
        }
    }
}

impl std::fmt::Display for AttemptOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Display for JobStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Display for JobAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_as_stored_and_serialized() {
        for action in JobAction::ALL {
            assert_eq!(JobAction::parse(action.as_str()), Some(action));
            assert_eq!(serde_json::to_value(action).unwrap(), action.as_str());
        }
        assert_eq!(JobAction::ALL.map(JobAction::as_str), JobAction::NAMES);
        for outcome in AttemptOutcome::ALL {
            assert_eq!(serde_json::to_value(outcome).unwrap(), outcome.as_str());
        }
        for status in [
            "queued",
            "scheduled",
            "running",
            "stopping",
            "succeeded",
            "blocked",
            "user_stopped",
            "failed",
            "waiting",
            "cancelled",
        ] {
            let parsed = JobStatus::parse(status).unwrap();
            assert_eq!(parsed.as_str(), status);
            assert_eq!(serde_json::to_value(parsed).unwrap(), status);
        }
        assert_eq!(JobStatus::parse("done"), None);
    }
}
