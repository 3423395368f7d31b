//! Adapter ownership look-ups for the hot paths (metering, serving authorization).
//! Found adapters are cached for a short time; writes through this instance invalidate
//! at once, and another instance's re-attribution shows within the TTL.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use entities::adapter;
use sea_orm::{ConnectionTrait, DbErr, EntityTrait};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterInfo {
    pub adapter_id: String,
    pub org_id: String,
    pub base_model: String,
    pub live: bool,
}

#[derive(Clone)]
pub struct AdapterDirectory {
    ttl: Duration,
    cache: Arc<RwLock<HashMap<String, (Instant, AdapterInfo)>>>,
}

impl AdapterDirectory {
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            cache: Arc::new(RwLock::new(HashMap::new())),
        }
    }

    pub async fn get(
        &self,
        db: &impl ConnectionTrait,
        adapter_id: &str,
    ) -> Result<Option<AdapterInfo>, DbErr> {
        if let Ok(cache) = self.cache.read() {
            if let Some((at, info)) = cache.get(adapter_id) {
                if at.elapsed() < self.ttl {
                    return Ok(Some(info.clone()));
                }
            }
        }
        let found = adapter::Entity::find_by_id(adapter_id.to_owned())
            .one(db)
            .await?
            .map(|a| AdapterInfo {
                adapter_id: a.id,
                org_id: a.org_id,
                base_model: a.base_model,
                live: a.live,
            });
        if let (Some(info), Ok(mut cache)) = (&found, self.cache.write()) {
            if cache.len() > 100_000 {
                cache.clear();
            }
            cache.insert(adapter_id.to_owned(), (Instant::now(), info.clone()));
        }
        Ok(found)
    }

    pub fn invalidate(&self, adapter_id: &str) {
        if let Ok(mut cache) = self.cache.write() {
            cache.remove(adapter_id);
        }
    }

    /// Forgets every adapter of an organization (it was deleted).
    pub fn invalidate_org(&self, org_id: &str) {
        if let Ok(mut cache) = self.cache.write() {
            cache.retain(|_, (_, info)| info.org_id != org_id);
        }
    }
}
