//! What the proxy looks up on every call, remembered for a short time: which organization an
//! API key (by its hash) and a project belong to. Revoking a key through this instance forgets
//! it at once; other instances see it within the TTL.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

/// Entries kept at most; the cache starts over beyond it.
const MAX_ENTRIES: usize = 100_000;

#[derive(Clone)]
pub struct TtlCache<K, V> {
    ttl: Duration,
    entries: Arc<RwLock<HashMap<K, (Instant, V)>>>,
}

impl<K: Eq + Hash + Clone, V: Clone> TtlCache<K, V> {
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            entries: Arc::new(RwLock::new(HashMap::new())),
        }
    }

    pub fn get(&self, key: &K) -> Option<V> {
        let entries = self.entries.read().ok()?;
        let (at, value) = entries.get(key)?;
        (at.elapsed() < self.ttl).then(|| value.clone())
    }

    pub fn insert(&self, key: K, value: V) {
        if let Ok(mut entries) = self.entries.write() {
            if entries.len() >= MAX_ENTRIES {
                entries.clear();
            }
            entries.insert(key, (Instant::now(), value));
        }
    }

    /// Forgets every entry whose value matches.
    pub fn forget_where(&self, matches: impl Fn(&V) -> bool) {
        if let Ok(mut entries) = self.entries.write() {
            entries.retain(|_, (_, value)| !matches(value));
        }
    }
}

/// A verified API key: its id and organization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyOwner {
    pub key_id: String,
    pub org_id: String,
}

#[derive(Clone)]
pub struct ProxyCache {
    /// SHA-256 of the key → its owner.
    pub keys: TtlCache<String, KeyOwner>,
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

    pub fn forget_org(&self, org_id: &str) {
        self.keys.forget_where(|owner| owner.org_id == org_id);
        self.projects.forget_where(|org| org == org_id);
    }
}
