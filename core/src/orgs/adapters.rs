//! Adapter ownership look-ups for the hot paths (metering, serving authorization).
//! Found adapters are cached for a short time; a change on any instance invalidates
//! them everywhere at once (`cluster`). Callers that miss the same adapter at once share one
//! look-up (`LoadCache`).

use std::time::Duration;

use sea_orm::ConnectionTrait;

use crate::cache::LoadCache;
use crate::domain::OrgId;
use crate::metrics::Metrics;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterInfo {
    pub adapter_id: String,
    pub org_id: OrgId,
    pub base_model: String,
    pub live: bool,
}

#[derive(Clone)]
pub struct AdapterDirectory {
    cache: LoadCache<String, AdapterInfo>,
}

impl AdapterDirectory {
    pub fn new(ttl: Duration, metrics: &Metrics) -> Self {
        Self {
            cache: LoadCache::new(ttl, metrics.cache_loads("adapters")),
        }
    }

    pub async fn get(
        &self,
        db: &impl ConnectionTrait,
        adapter_id: &str,
    ) -> Result<Option<AdapterInfo>, std::sync::Arc<sea_orm::DbErr>> {
        let load = || async {
            let found = super::repo::find_adapter(db, adapter_id).await?;
            Ok::<_, sea_orm::DbErr>(found.map(|a| AdapterInfo {
                adapter_id: a.id,
                org_id: a.org_id,
                base_model: a.base_model,
                live: a.live,
            }))
        };
        self.cache.get_or_load(&adapter_id.to_owned(), load).await
    }

    pub fn invalidate(&self, adapter_id: &str) {
        self.cache.forget(adapter_id.to_owned());
    }

    pub fn clear(&self) {
        self.cache.clear();
    }

    /// Forgets every adapter of an organization (it was deleted).
    pub fn invalidate_org(&self, org_id: &OrgId) {
        let org_id = org_id.to_owned();
        self.cache.forget_where(move |_, info| info.org_id == org_id);
    }
}

impl crate::cluster::Subscriber for AdapterDirectory {
    fn apply(&self, event: &crate::cluster::Event) {
        use crate::cluster::Event;
        match event {
            Event::OrgChanged(id) => self.invalidate_org(id),
            Event::AdapterChanged(id) => self.invalidate(id),
            Event::KeyChanged(_) | Event::JobsQueued(_) | Event::Outbox => {}
        }
    }

    fn clear(&self) {
        AdapterDirectory::clear(self);
    }
}
