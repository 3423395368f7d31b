//! What the proxy looks up on every call, remembered for a short time: which organization an
//! API key (by its hash) and a project belong to. Revoking a key forgets it at once on every
//! instance (`cluster`); the TTL bounds what a lost notification could leave. Calls that miss
//! the same entry at once share one look-up (`LoadCache`).

use std::sync::Arc;
use std::time::Duration;

use crate::cache::LoadCache;
use crate::domain::{ApiKeyId, OrgId, ProjectId};
use crate::metrics::Metrics;

/// A verified API key: its id and organization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyOwner {
    pub key_id: ApiKeyId,
    pub org_id: OrgId,
    /// Its scopes, models, expiry and limits.
    pub settings: crate::keys::KeySettings,
}

#[derive(Clone)]
pub struct ProxyCache {
    /// SHA-256 of the key (the bytes, not their hex) → its owner.
    pub keys: LoadCache<[u8; 32], Arc<KeyOwner>>,
    /// Project id → its organization.
    pub projects: LoadCache<ProjectId, OrgId>,
}

impl ProxyCache {
    pub fn new(ttl: Duration, metrics: &Metrics) -> Self {
        Self {
            keys: LoadCache::new(ttl, metrics.cache_loads("api_keys")),
            projects: LoadCache::new(ttl, metrics.cache_loads("projects")),
        }
    }

    pub fn forget_key(&self, key_id: &ApiKeyId) {
        let key_id = key_id.clone();
        self.keys.forget_where(move |_, owner| owner.key_id == key_id);
    }

    pub fn clear(&self) {
        self.keys.clear();
        self.projects.clear();
    }

    pub fn forget_org(&self, org_id: &OrgId) {
        let org = org_id.clone();
        self.keys.forget_where(move |_, owner| owner.org_id == org);
        let org = org_id.clone();
        self.projects.forget_where(move |_, owner| *owner == org);
    }
}

impl crate::cluster::Subscriber for ProxyCache {
    fn apply(&self, event: &crate::cluster::Event) {
        use crate::cluster::Event;
        match event {
            Event::KeyChanged(id) => self.forget_key(id),
            Event::OrgChanged(id) => self.forget_org(id),
            Event::AdapterChanged(_) | Event::JobsQueued(_) | Event::Outbox => {}
        }
    }

    fn clear(&self) {
        ProxyCache::clear(self);
    }
}
