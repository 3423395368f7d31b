//! PostgreSQL: each organization's account as this process last committed it, with the
//! row version (`xmin`) that commit left, so the next batch can be written by one guarded
//! statement instead of a locking transaction (docs/ARCHITECTURE.md, "Actors").

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use entities::billing_account;

use super::grants::Grant;
use crate::domain::OrgId;

/// Entries older than [`AccountCache::TTL`] are not used: the version is a transaction
/// id, so a stale entry must never live long enough for the id to come round again.
#[derive(Default)]
pub struct AccountCache {
    /// Each account with its active grants (every change of a grant changes its account
    /// row, so the row's version vouches for both).
    accounts: Mutex<HashMap<OrgId, Cached>>,
}

struct Cached {
    account: billing_account::Model,
    grants: Vec<Grant>,
    version: String,
    at: Instant,
}

impl AccountCache {
    const TTL: Duration = Duration::from_secs(30);
    const MAX: usize = 10_000;

    pub(super) fn get(&self, org_id: &OrgId) -> Option<(billing_account::Model, Vec<Grant>, String)> {
        let accounts = self.accounts.lock().unwrap_or_else(|p| p.into_inner());
        let cached = accounts.get(org_id)?;
        (cached.at.elapsed() < Self::TTL).then(|| {
            (
                cached.account.clone(),
                cached.grants.clone(),
                cached.version.clone(),
            )
        })
    }

    pub(super) fn put(&self, account: billing_account::Model, grants: Vec<Grant>, version: String) {
        let mut accounts = self.accounts.lock().unwrap_or_else(|p| p.into_inner());
        if accounts.len() >= Self::MAX {
            accounts.retain(|_, cached| cached.at.elapsed() < Self::TTL);
            if accounts.len() >= Self::MAX {
                accounts.clear();
            }
        }
        let at = Instant::now();
        accounts.insert(
            account.org_id.clone(),
            Cached {
                account,
                grants,
                version,
                at,
            },
        );
    }

    pub(super) fn forget(&self, org_id: &OrgId) {
        let mut accounts = self.accounts.lock().unwrap_or_else(|p| p.into_inner());
        accounts.remove(org_id);
    }
}
