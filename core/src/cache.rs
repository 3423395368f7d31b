//! A time-to-live cache for look-ups on hot paths (adapter owners, API keys, projects), on
//! moka: entries expire after the TTL; callers that miss the same key at once share one load
//! (the first caller's; the others wait for its answer) instead of each asking the database;
//! every instance forgets at once when told (`cluster`).

use std::future::Future;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus::IntCounter;

/// Entries kept at most; beyond it moka evicts the least likely to be used again.
const MAX_ENTRIES: u64 = 100_000;

#[derive(Clone)]
pub struct LoadCache<K, V> {
    entries: moka::future::Cache<K, V>,
    /// Bumped by every forget: a load that began before one is not kept (see `get_or_load`).
    forgets: Arc<AtomicU64>,
    /// Loads run (`keel_cache_loads_total`): callers that shared one count once.
    loads: IntCounter,
}

impl<K, V> LoadCache<K, V>
where
    K: Eq + Hash + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    pub fn new(ttl: Duration, loads: IntCounter) -> Self {
        Self {
            entries: moka::future::Cache::builder()
                .max_capacity(MAX_ENTRIES)
                .time_to_live(ttl)
                .support_invalidation_closures()
                .build(),
            forgets: Arc::new(AtomicU64::new(0)),
            loads,
        }
    }

    /// The value of `key`: remembered, or what `load()` finds. Every caller missing `key`
    /// while a load of it runs waits for that load instead of running its own (a cold cache
    /// under load, an expiry, or a forget would otherwise send every caller to the database
    /// at once). Nothing found (`Ok(None)`) and errors are not remembered; the waiters get
    /// them too.
    ///
    /// A load that began before a forget may have read what the forget was about (a key
    /// since revoked): its caller and the waiters get it, as calls concurrent with the
    /// revocation, but it is not kept.
    pub async fn get_or_load<E, Fut>(&self, key: &K, load: impl FnOnce() -> Fut) -> Result<Option<V>, Arc<E>>
    where
        K: Clone,
        E: Send + Sync + 'static,
        Fut: Future<Output = Result<Option<V>, E>>,
    {
        // Boxed, and the load made inside: the caller's future (a request handler's, kept
        // for the whole call) then holds a pointer, not moka's futures (over a kilobyte),
        // and the memory is freed once the look-up is answered.
        Box::pin(self.look_up(key, load)).await
    }

    async fn look_up<E, Fut>(&self, key: &K, load: impl FnOnce() -> Fut) -> Result<Option<V>, Arc<E>>
    where
        K: Clone,
        E: Send + Sync + 'static,
        Fut: Future<Output = Result<Option<V>, E>>,
    {
        if let Some(value) = self.entries.get(key).await {
            return Ok(Some(value));
        }
        let forgets = self.forgets.load(Ordering::Acquire);
        let loaded = self
            .entries
            .try_get_with(key.clone(), async {
                self.loads.inc();
                match load().await {
                    Ok(Some(value)) => Ok(value),
                    Ok(None) => Err(None),
                    Err(err) => Err(Some(Arc::new(err))),
                }
            })
            .await;
        if self.forgets.load(Ordering::Acquire) != forgets {
            // Dropped without counting as a forget itself: the loads running beside it keep
            // theirs unless a forget of their own came.
            let key = key.clone();
            let _ = self
                .entries
                .invalidate_entries_if(move |stored, _| *stored == key);
        }
        match loaded {
            Ok(value) => Ok(Some(value)),
            Err(missing) => match missing.as_ref() {
                None => Ok(None),
                Some(err) => Err(err.clone()),
            },
        }
    }

    /// Forgets every entry whose key and value match. Synchronous (moka checks the predicate
    /// on every read until its housekeeping has removed what matches), so a caller dropped
    /// mid-way (a hung-up client's handler) cannot leave a forget half done.
    pub fn forget_where(&self, matches: impl Fn(&K, &V) -> bool + Send + Sync + 'static) {
        self.forgets.fetch_add(1, Ordering::AcqRel);
        // Only fails when the cache was built without closures, which `new` never does.
        let _ = self.entries.invalidate_entries_if(matches);
    }

    /// Forgets every entry.
    pub fn clear(&self) {
        self.forgets.fetch_add(1, Ordering::AcqRel);
        self.entries.invalidate_all();
    }

    /// Forgets one entry.
    pub fn forget(&self, key: K) {
        self.forget_where(move |stored, _| *stored == key);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    fn cache() -> LoadCache<String, String> {
        LoadCache::new(Duration::from_secs(60), counter())
    }

    fn counter() -> IntCounter {
        IntCounter::new("loads", "loads").unwrap()
    }

    #[tokio::test]
    async fn callers_missing_one_key_at_once_share_one_load() {
        let cache = cache();
        let runs = AtomicUsize::new(0);
        let (release, released) = tokio::sync::watch::channel(false);
        let load = || {
            let mut released = released.clone();
            let runs = &runs;
            move || async move {
                runs.fetch_add(1, Ordering::SeqCst);
                let _ = released.wait_for(|r| *r).await;
                Ok::<_, ()>(Some("org".to_owned()))
            }
        };
        let key = "k".to_owned();
        let callers: Vec<_> = (0..50).map(|_| cache.get_or_load(&key, load())).collect();
        let all = futures_util::future::join_all(callers);
        let opened = async {
            tokio::task::yield_now().await;
            let _ = release.send(true);
        };
        let (answers, ()) = tokio::join!(all, opened);
        assert!(answers
            .iter()
            .all(|a| a.as_ref().ok() == Some(&Some("org".to_owned()))));
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(cache.loads.get(), 1);
        // Remembered: no load at all now.
        let again = cache.get_or_load(&"k".to_owned(), load()).await;
        assert_eq!(again.ok(), Some(Some("org".to_owned())));
        assert_eq!(runs.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn nothing_found_and_errors_are_not_remembered() {
        let cache = cache();
        let none = cache
            .get_or_load(&"k".to_owned(), || async { Ok::<_, ()>(None) })
            .await;
        assert_eq!(none.ok(), Some(None));
        let failed = cache
            .get_or_load(&"k".to_owned(), || async { Err::<Option<String>, _>("down") })
            .await;
        assert_eq!(failed.err().as_deref(), Some(&"down"));
        let found = cache
            .get_or_load(&"k".to_owned(), || async { Ok::<_, ()>(Some("v".to_owned())) })
            .await;
        assert_eq!(found.ok(), Some(Some("v".to_owned())));
        assert_eq!(cache.loads.get(), 3);
    }

    #[tokio::test]
    async fn a_load_that_began_before_a_forget_is_not_kept() {
        let cache = cache();
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        // The load reads "active" (the database before a revocation) and is held there...
        let key = "k".to_owned();
        let stale = cache.get_or_load(&key, || async {
            let _ = released.await;
            Ok::<_, ()>(Some("active".to_owned()))
        });
        let revoke = async {
            tokio::task::yield_now().await;
            // ...while the revocation commits and is applied; then the load finishes.
            cache.forget_where(|_, value| value == "active");
            let _ = release.send(());
        };
        let (answer, ()) = tokio::join!(stale, revoke);
        assert_eq!(answer.ok(), Some(Some("active".to_owned())));
        // The next caller loads afresh and sees the revocation.
        let next = cache
            .get_or_load(&"k".to_owned(), || async { Ok::<_, ()>(None) })
            .await;
        assert_eq!(next.ok(), Some(None));
    }

    #[tokio::test]
    async fn forgets_reach_remembered_entries_at_once() {
        let cache = cache();
        for (key, value) in [("a", "org1"), ("b", "org2"), ("c", "org1")] {
            let _ = cache
                .get_or_load(&key.to_owned(), move || async move {
                    Ok::<_, ()>(Some(value.to_owned()))
                })
                .await;
        }
        cache.forget_where(|_, org| org == "org1");
        cache.forget("b".to_owned());
        for key in ["a", "b", "c"] {
            let reloaded = cache
                .get_or_load(&key.to_owned(), || async { Ok::<_, ()>(Some("new".to_owned())) })
                .await;
            assert_eq!(reloaded.ok(), Some(Some("new".to_owned())), "{key}");
        }
        cache.clear();
        let after_clear = cache
            .get_or_load(&"a".to_owned(), || async { Ok::<_, ()>(None) })
            .await;
        assert_eq!(after_clear.ok(), Some(None));
    }
}
