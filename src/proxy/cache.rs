//! What the proxy looks up on every call, remembered for a short time: which organization an
//! API key (by its hash) and a project belong to. Revoking a key forgets it at once on every
//! instance (`cluster`); the TTL bounds what a lost notification could leave.

use std::sync::Arc;
use std::time::Duration;

use crate::cache::TtlCache;

/// A verified API key: its id and organization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyOwner {
    pub key_id: String,
    pub org_id: String,
}

#[derive(Clone)]
pub struct ProxyCache {
    /// SHA-256 of the key (the bytes, not their hex) → its owner.
    pub keys: TtlCache<[u8; 32], Arc<KeyOwner>>,
    /// Project id → its organization.
    pub projects: TtlCache<String, String>,
}

impl ProxyCache {
    pub fn new(ttl: Duration) -> Self {
        Self {
            keys: TtlCache::new(ttl),
            projects: TtlCache::new(ttl),
        }
    }

    pub fn forget_key(&self, key_id: &str) {
        self.keys.forget_where(|owner| owner.key_id == key_id);
    }

    pub fn clear(&self) {
        self.keys.clear();
        self.projects.clear();
    }

    pub fn forget_org(&self, org_id: &str) {
        self.keys.forget_where(|owner| owner.org_id == org_id);
        self.projects.forget_where(|org| org == org_id);
    }
}
