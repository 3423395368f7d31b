//! Adapter ownership look-ups for the hot paths (metering, serving authorization).
//! Found adapters are cached for a short time; a change on any instance invalidates
//! them everywhere at once (`cluster`).

use std::time::Duration;

use sea_orm::{ConnectionTrait, DbErr};

use crate::cache::TtlCache;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterInfo {
    pub adapter_id: String,
    pub org_id: String,
    pub base_model: String,
    pub live: bool,
}

#[derive(Clone)]
pub struct AdapterDirectory {
    cache: TtlCache<String, AdapterInfo>,
}

impl AdapterDirectory {
    pub fn new(ttl: Duration) -> Self {
        Self {
            cache: TtlCache::new(ttl),
        }
    }

    pub async fn get(
        &self,
        db: &impl ConnectionTrait,
        adapter_id: &str,
    ) -> Result<Option<AdapterInfo>, DbErr> {
        if let Some(info) = self.cache.get(&adapter_id.to_owned()) {
            return Ok(Some(info));
        }
        let found = super::repo::find_adapter(db, adapter_id)
            .await?
            .map(|a| AdapterInfo {
                adapter_id: a.id,
                org_id: a.org_id,
                base_model: a.base_model,
                live: a.live,
            });
        if let Some(info) = &found {
            self.cache.insert(adapter_id.to_owned(), info.clone());
        }
        Ok(found)
    }

    pub fn invalidate(&self, adapter_id: &str) {
        self.cache.forget(&adapter_id.to_owned());
    }

    pub fn clear(&self) {
        self.cache.clear();
    }

    /// Forgets every adapter of an organization (it was deleted).
    pub fn invalidate_org(&self, org_id: &str) {
        self.cache.forget_where(|info| info.org_id == org_id);
    }
}
