//! A small time-to-live cache for look-ups on hot paths (adapter owners, API keys,
//! projects): entries expire after the TTL; every instance forgets at once
//! when told (`cluster`).

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

    /// Forgets every entry.
    pub fn clear(&self) {
        if let Ok(mut entries) = self.entries.write() {
            entries.clear();
        }
    }

    /// Forgets one entry.
    pub fn forget(&self, key: &K) {
        if let Ok(mut entries) = self.entries.write() {
            entries.remove(key);
        }
    }
}
