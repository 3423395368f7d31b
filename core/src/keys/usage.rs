//! What each key used, counted in memory on every call and added to the database about once
//! a second (`api_key_usage`), never a write per call; `lastUsedAt` is written at most once a
//! minute per key and instance.
//!
//! A limit adds to a read of the database what this instance counted that the read may not
//! have seen: counts pending, counts being written (until their write finished), and counts
//! whose write finished since the read began. A count is never missed; one written while
//! the read ran may be counted twice, so a limit refuses early, never late.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sea_orm::DatabaseConnection;

use super::{day_of, repo};
use crate::domain::ApiKeyId;

/// How often the counts are added to the database.
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// `lastUsedAt` is written at most this often per key and instance.
pub const TOUCH_EVERY: Duration = Duration::from_secs(60);

#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    requests: i64,
    tokens: i64,
}

#[derive(Default)]
struct Book {
    /// Counts not yet in the database, by key and UTC day.
    pending: HashMap<(ApiKeyId, String), Counts>,
    /// Counts taken by a flush whose write has not finished.
    writing: HashMap<(ApiKeyId, String), Counts>,
    /// Tokens whose write finished, by key and UTC day (today's and yesterday's kept).
    written: HashMap<(ApiKeyId, String), i64>,
    /// The last use of each key seen here, and whether it is written yet.
    used: HashMap<ApiKeyId, (DateTime<Utc>, bool)>,
    /// When this instance last wrote each key's `lastUsedAt`.
    touched: HashMap<ApiKeyId, Instant>,
}

/// The usage counted on this instance and not yet written.
#[derive(Clone, Default)]
pub struct UsageBook {
    book: Arc<Mutex<Book>>,
}

impl UsageBook {
    fn lock(&self) -> MutexGuard<'_, Book> {
        self.book
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A call of `key_id` went through.
    pub fn request(&self, key_id: &ApiKeyId, now: DateTime<Utc>) {
        let mut book = self.lock();
        book.pending
            .entry((key_id.clone(), day_of(now)))
            .or_default()
            .requests += 1;
        book.used.insert(key_id.clone(), (now, false));
    }

    /// A recorded call of `key_id` used `tokens` (prompt and completion).
    pub fn tokens(&self, key_id: &ApiKeyId, tokens: i64, at: DateTime<Utc>) {
        if tokens <= 0 {
            return;
        }
        self.lock()
            .pending
            .entry((key_id.clone(), day_of(at)))
            .or_default()
            .tokens += tokens;
    }

    /// Tokens of `key_id` on `day` this instance has written so far: taken before reading
    /// the database, for [`Self::tokens_beyond`].
    pub fn mark(&self, key_id: &ApiKeyId, day: &str) -> i64 {
        self.lock()
            .written
            .get(&(key_id.clone(), day.to_owned()))
            .copied()
            .unwrap_or(0)
    }

    /// Tokens of `key_id` on `day` counted here that a read of the database begun after
    /// `mark` may not include: pending, being written, or written since the mark.
    pub fn tokens_beyond(&self, key_id: &ApiKeyId, day: &str, mark: i64) -> i64 {
        let book = self.lock();
        let slot = (key_id.clone(), day.to_owned());
        let unwritten: i64 = [&book.pending, &book.writing]
            .iter()
            .filter_map(|counts| counts.get(&slot))
            .map(|c| c.tokens)
            .sum();
        unwritten + book.written.get(&slot).map_or(0, |written| written - mark)
    }

    /// Takes the pending counts for a write; they stay counted until [`Self::written`].
    fn take_for_writing(&self, now: DateTime<Utc>) -> HashMap<(ApiKeyId, String), Counts> {
        let mut book = self.lock();
        let yesterday = day_of(now - chrono::Days::new(1));
        book.written.retain(|(_, day), _| *day >= yesterday);
        let taken = std::mem::take(&mut book.pending);
        for (slot, counts) in &taken {
            let entry = book.writing.entry(slot.clone()).or_default();
            entry.requests += counts.requests;
            entry.tokens += counts.tokens;
        }
        taken
    }

    /// A write of `counts` taken by [`Self::take_for_writing`] finished; if it failed they
    /// are pending again, for the next flush.
    fn written(&self, slot: (ApiKeyId, String), counts: Counts, done: bool) {
        let mut book = self.lock();
        if let Some(entry) = book.writing.get_mut(&slot) {
            entry.requests -= counts.requests;
            entry.tokens -= counts.tokens;
            if entry.requests == 0 && entry.tokens == 0 {
                book.writing.remove(&slot);
            }
        }
        if done {
            *book.written.entry(slot).or_default() += counts.tokens;
        } else {
            let entry = book.pending.entry(slot).or_default();
            entry.requests += counts.requests;
            entry.tokens += counts.tokens;
        }
    }

    /// Adds what was counted to the database, and writes `lastUsedAt` of the keys used since
    /// (at most once a minute each). Counts that could not be written are kept for the next
    /// flush.
    pub async fn flush(&self, db: &DatabaseConnection) {
        let pending = self.take_for_writing(Utc::now());
        let touches = {
            let mut book = self.lock();
            let now = Instant::now();
            let due: Vec<(ApiKeyId, DateTime<Utc>)> = book
                .used
                .iter()
                .filter(|(key, (_, written))| {
                    !written
                        && book
                            .touched
                            .get(*key)
                            .is_none_or(|at| now.duration_since(*at) >= TOUCH_EVERY)
                })
                .map(|(key, (at, _))| (key.clone(), *at))
                .collect();
            for (key, _) in &due {
                book.touched.insert(key.clone(), now);
                if let Some(entry) = book.used.get_mut(key) {
                    entry.1 = true;
                }
            }
            due
        };
        for ((key, day), counts) in pending {
            let done = match repo::add_usage(db, &key, &day, counts.requests, counts.tokens).await {
                Ok(()) => true,
                // A key deleted meanwhile refuses its row: nothing to keep.
                Err(err) if err.sql_err().is_some() => true,
                Err(err) => {
                    tracing::warn!(error = %err, key_id = %key, "could not write an API key's usage; kept for the next flush");
                    false
                }
            };
            self.written((key, day), counts, done);
        }
        for (key, at) in touches {
            if let Err(err) = repo::touch(db, &key, at).await {
                tracing::warn!(error = %err, key_id = %key, "could not write an API key's last use");
            }
        }
    }

    /// Flushes every [`FLUSH_EVERY`] until `stop`, then once more.
    pub async fn run(self, db: DatabaseConnection, stop: tokio_util::sync::CancellationToken) {
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep(FLUSH_EVERY) => self.flush(&db).await,
            }
        }
        self.flush(&db).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> (ApiKeyId, String, DateTime<Utc>) {
        let now = Utc::now();
        (ApiKeyId::generate(), day_of(now), now)
    }

    #[test]
    fn counts_being_written_are_never_missed() {
        let (key, day, now) = key();
        let book = UsageBook::default();
        book.tokens(&key, 32, now);
        let mark = book.mark(&key, &day);
        assert_eq!(book.tokens_beyond(&key, &day, mark), 32);
        // A flush took them and its write has not finished: a read of the database now may
        // not see them, so they still count here.
        let taken = book.take_for_writing(now);
        assert_eq!(book.tokens_beyond(&key, &day, mark), 32);
        book.tokens(&key, 8, now);
        assert_eq!(book.tokens_beyond(&key, &day, mark), 40);
        // Written: a read begun before the write (at `mark`) still gets them from here; a
        // read begun after does not count them twice.
        let (slot, counts) = taken.into_iter().next().unwrap();
        book.written(slot, counts, true);
        assert_eq!(book.tokens_beyond(&key, &day, mark), 40);
        assert_eq!(book.tokens_beyond(&key, &day, book.mark(&key, &day)), 8);
    }

    #[test]
    fn a_failed_write_is_pending_again() {
        let (key, day, now) = key();
        let book = UsageBook::default();
        book.tokens(&key, 32, now);
        book.request(&key, now);
        let (slot, counts) = book.take_for_writing(now).into_iter().next().unwrap();
        book.written(slot, counts, false);
        assert_eq!(book.tokens_beyond(&key, &day, book.mark(&key, &day)), 32);
        let again = book.take_for_writing(now);
        let counts = again.get(&(key.clone(), day.clone())).unwrap();
        assert_eq!((counts.requests, counts.tokens), (1, 32));
        assert!(book.lock().writing.values().all(|c| c.tokens == 32));
    }

    #[test]
    fn written_counts_of_past_days_are_let_go() {
        let (key, _, now) = key();
        let book = UsageBook::default();
        let old = now - chrono::Days::new(2);
        book.tokens(&key, 5, old);
        let (slot, counts) = book.take_for_writing(now).into_iter().next().unwrap();
        book.written(slot, counts, true);
        assert_eq!(book.mark(&key, &day_of(old)), 5);
        book.take_for_writing(now);
        assert_eq!(book.mark(&key, &day_of(old)), 0);
    }
}
