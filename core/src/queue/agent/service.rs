//! Agent logs, agent account usage and optimizer timelines, as the API and the workers
//! write and read them.

use entities::agent_log;
use sea_orm::DatabaseConnection;
use serde_json::Value;

use super::repo;
use crate::domain::OrgId;
use crate::queue::JobError;

/// Who wrote a log line: a member through the API, or a worker with the internal key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogSource {
    Api,
    Internal,
}

impl LogSource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Api => "api",
            Self::Internal => "internal",
        }
    }
}

/// Stores a log line; answers its id. A worker names the organization, which must exist.
pub async fn write_log(
    db: &DatabaseConnection,
    org_id: &OrgId,
    content: &str,
    job_id: Option<&str>,
    source: LogSource,
) -> Result<String, JobError> {
    if source == LogSource::Internal && !crate::orgs::repo::org_exists(db, org_id).await? {
        return Err(JobError::OrgNotFound);
    }
    Ok(repo::insert_log(db, org_id, content, job_id, source.as_str()).await?)
}

/// The organization's newest log lines, newest first.
pub async fn newest_logs(
    db: &DatabaseConnection,
    org_id: &OrgId,
    limit: u64,
) -> Result<Vec<agent_log::Model>, JobError> {
    Ok(repo::newest_logs(db, org_id, limit).await?)
}

/// Keeps an agent account's latest usage report (members beyond the named ones as sent).
pub async fn record_usage(
    db: &DatabaseConnection,
    account_label: &str,
    report: &Value,
) -> Result<(), JobError> {
    Ok(repo::upsert_usage(db, account_label, report).await?)
}

/// Replaces the organization's optimizer timelines by id, in one transaction.
pub async fn sync_timelines(
    db: &DatabaseConnection,
    org_id: &OrgId,
    job_id: Option<&str>,
    timelines: &[(String, Value)],
) -> Result<(), JobError> {
    if !crate::orgs::repo::org_exists(db, org_id).await? {
        return Err(JobError::OrgNotFound);
    }
    Ok(repo::replace_timelines(db, org_id, job_id, timelines).await?)
}
