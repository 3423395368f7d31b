//! PostgreSQL: each organization's account as this process last committed it, with the
//! row version (`xmin`) that commit left, so the next batch can be written by one guarded
//! statement instead of a locking transaction (docs/ARCHITECTURE.md, "Actors").

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use entities::billing_account;

use crate::domain::OrgId;

/// Entries older than [`AccountCache::TTL`] are not used: the version is a transaction
/// id, so a stale entry must never live long enough for the id to come round again.
#[derive(Default)]
pub struct AccountCache {
    accounts: Mutex<HashMap<OrgId, (billing_account::Model, String, Instant)>>,
}

impl AccountCache {
    const TTL: Duration = Duration::from_secs(30);
    const MAX: usize = 10_000;

    pub(super) fn get(&self, org_id: &OrgId) -> Option<(billing_account::Model, String)> {
        let accounts = self.accounts.lock().unwrap_or_else(|p| p.into_inner());
        let (account, version, at) = accounts.get(org_id)?;
        (at.elapsed() < Self::TTL).then(|| (account.clone(), version.clone()))
    }

    pub(super) fn put(&self, account: billing_account::Model, version: String) {
        let mut accounts = self.accounts.lock().unwrap_or_else(|p| p.into_inner());
        if accounts.len() >= Self::MAX {
            accounts.retain(|_, (_, _, at)| at.elapsed() < Self::TTL);
            if accounts.len() >= Self::MAX {
                accounts.clear();
            }
        }
        accounts.insert(account.org_id.clone(), (account, version, Instant::now()));
    }

    pub(super) fn forget(&self, org_id: &OrgId) {
        let mut accounts = self.accounts.lock().unwrap_or_else(|p| p.into_inner());
        accounts.remove(org_id);
    }
}
