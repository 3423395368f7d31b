//! The operator's reads across domains: every organization with its balance, open jobs and
//! last ledger activity. Nothing in a domain depends on this module.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use entities::organization;
use sea_orm::{DatabaseConnection, DbErr};

use crate::domain::{JobStatus, Microcents, OrgId};

/// One organization as the operator's list shows it.
pub struct OrgOverview {
    pub org: organization::Model,
    pub balance: Microcents,
    pub queued: i64,
    /// Running or stopping.
    pub running: i64,
    pub last_activity: Option<DateTime<Utc>>,
}

/// Every organization, by name.
pub async fn organizations(db: &DatabaseConnection) -> Result<Vec<OrgOverview>, DbErr> {
    let balances: HashMap<OrgId, Microcents> =
        crate::billing::repo::balances(db).await?.into_iter().collect();
    let activity: HashMap<OrgId, DateTime<Utc>> = crate::billing::repo::last_ledger_activity(db)
        .await?
        .into_iter()
        .collect();
    let mut open: HashMap<OrgId, (i64, i64)> = HashMap::new();
    for (org, status, count) in crate::queue::repo::open_counts_by_org(db).await? {
        let entry = open.entry(org).or_default();
        match status {
            JobStatus::Queued => entry.0 += count,
            _ => entry.1 += count,
        }
    }
    Ok(crate::orgs::repo::all_orgs(db)
        .await?
        .into_iter()
        .map(|org| {
            let (queued, running) = open.get(&org.id).copied().unwrap_or_default();
            OrgOverview {
                balance: balances.get(&org.id).copied().unwrap_or_default(),
                last_activity: activity.get(&org.id).copied(),
                queued,
                running,
                org,
            }
        })
        .collect())
}
