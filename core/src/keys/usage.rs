//! What each key used, counted in memory on every call and added to the database about once
//! a second (`api_key_usage`), never a write per call; `lastUsedAt` is written at most once a
//! minute per key and instance.
//!
//! A limit adds to a read of the database what this instance counted that the read may not
//! have seen: counts pending, counts being written (until their write finished), and counts
//! whose write finished since the read began. A count is never missed; one written while
//! the read ran may be counted twice, so a limit refuses early, never late.
//!
//! Every call passes here (a key without limits too), so a known key's count is one lookup
//! of its id, with no copy of it and no day written as text: a key's counts are kept by
//! [`NaiveDate`] in short lists of their own (one day, two around midnight).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use chrono::{DateTime, NaiveDate, Utc};
use sea_orm::DatabaseConnection;

use super::{day_text, repo};
use crate::domain::ApiKeyId;

/// How often the counts are added to the database.
pub const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// `lastUsedAt` is written at most this often per key and instance.
pub const TOUCH_EVERY: Duration = Duration::from_secs(60);

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Counts {
    requests: i64,
    tokens: i64,
}

/// One key's use on this instance.
#[derive(Default)]
struct KeyUse {
    /// Counts not yet in the database, by UTC day.
    pending: Vec<(NaiveDate, Counts)>,
    /// Counts taken by a flush whose write has not finished.
    writing: Vec<(NaiveDate, Counts)>,
    /// Tokens whose write finished, by UTC day (today's and yesterday's kept).
    written: Vec<(NaiveDate, i64)>,
    /// The last use seen here, and whether it is written yet.
    used: Option<(DateTime<Utc>, bool)>,
    /// When this instance last wrote the key's `lastUsedAt`.
    touched: Option<Instant>,
}

/// The entry of `day` in `list`, added when missing.
fn on<T: Default>(list: &mut Vec<(NaiveDate, T)>, day: NaiveDate) -> &mut T {
    let at = match list.iter().position(|(d, _)| *d == day) {
        Some(at) => at,
        None => {
            list.push((day, T::default()));
            list.len() - 1
        }
    };
    &mut list[at].1
}

fn get<T: Copy>(list: &[(NaiveDate, T)], day: NaiveDate) -> Option<T> {
    list.iter().find(|(d, _)| *d == day).map(|(_, t)| *t)
}

#[derive(Default)]
struct Book {
    keys: HashMap<ApiKeyId, KeyUse>,
}

impl Book {
    /// `key_id`'s use (a new one when first seen).
    fn key(&mut self, key_id: &ApiKeyId) -> &mut KeyUse {
        self.keys.entry(key_id.clone()).or_default()
    }
}

/// Counts of one key on one day, taken for a write.
type Taken = Vec<((ApiKeyId, NaiveDate), Counts)>;

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
        let key = book.key(key_id);
        on(&mut key.pending, now.date_naive()).requests += 1;
        key.used = Some((now, false));
    }

    /// A call of `key_id` used `tokens` (prompt and completion).
    pub fn tokens(&self, key_id: &ApiKeyId, tokens: i64, at: DateTime<Utc>) {
        if tokens <= 0 {
            return;
        }
        on(&mut self.lock().key(key_id).pending, at.date_naive()).tokens += tokens;
    }

    /// Tokens of `key_id` on `day` this instance has written so far: taken before reading
    /// the database, for [`Self::tokens_beyond`].
    pub fn mark(&self, key_id: &ApiKeyId, day: NaiveDate) -> i64 {
        self.lock()
            .keys
            .get(key_id)
            .and_then(|key| get(&key.written, day))
            .unwrap_or(0)
    }

    /// Tokens of `key_id` on `day` counted here that a read of the database begun after
    /// `mark` may not include: pending, being written, or written since the mark.
    pub fn tokens_beyond(&self, key_id: &ApiKeyId, day: NaiveDate, mark: i64) -> i64 {
        let book = self.lock();
        let Some(key) = book.keys.get(key_id) else {
            return 0;
        };
        let unwritten: i64 = [&key.pending, &key.writing]
            .iter()
            .filter_map(|counts| get(counts, day))
            .map(|c| c.tokens)
            .sum();
        unwritten + get(&key.written, day).map_or(0, |written| written - mark)
    }

    /// Takes the pending counts for a write; they stay counted until [`Self::written`].
    fn take_for_writing(&self, now: DateTime<Utc>) -> Taken {
        let mut book = self.lock();
        let yesterday = (now - chrono::Days::new(1)).date_naive();
        let mut taken = Vec::new();
        for (key_id, key) in &mut book.keys {
            key.written.retain(|(day, _)| *day >= yesterday);
            // Drained, not taken: the list keeps its room for the next calls.
            for (day, counts) in key.pending.drain(..) {
                let entry = on(&mut key.writing, day);
                entry.requests += counts.requests;
                entry.tokens += counts.tokens;
                taken.push(((key_id.clone(), day), counts));
            }
        }
        taken
    }

    /// A write of `counts` taken by [`Self::take_for_writing`] finished; if it failed they
    /// are pending again, for the next flush.
    fn written(&self, (key_id, day): (ApiKeyId, NaiveDate), counts: Counts, done: bool) {
        let mut book = self.lock();
        let key = book.key(&key_id);
        if let Some(at) = key.writing.iter().position(|(d, _)| *d == day) {
            let entry = &mut key.writing[at].1;
            entry.requests -= counts.requests;
            entry.tokens -= counts.tokens;
            if *entry == Counts::default() {
                key.writing.swap_remove(at);
            }
        }
        if done {
            *on(&mut key.written, day) += counts.tokens;
        } else {
            let entry = on(&mut key.pending, day);
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
            let mut due: Vec<(ApiKeyId, DateTime<Utc>)> = Vec::new();
            for (key_id, key) in &mut book.keys {
                let Some((at, false)) = key.used else {
                    continue;
                };
                if key
                    .touched
                    .is_none_or(|touched| now.duration_since(touched) >= TOUCH_EVERY)
                {
                    key.touched = Some(now);
                    key.used = Some((at, true));
                    due.push((key_id.clone(), at));
                }
            }
            due
        };
        for ((key, day), counts) in pending {
            let done = match repo::add_usage(db, &key, &day_text(day), counts.requests, counts.tokens).await {
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

    fn key() -> (ApiKeyId, NaiveDate, DateTime<Utc>) {
        let now = Utc::now();
        (ApiKeyId::generate(), now.date_naive(), now)
    }

    #[test]
    fn counts_being_written_are_never_missed() {
        let (key, day, now) = key();
        let book = UsageBook::default();
        book.tokens(&key, 32, now);
        let mark = book.mark(&key, day);
        assert_eq!(book.tokens_beyond(&key, day, mark), 32);
        // A flush took them and its write has not finished: a read of the database now may
        // not see them, so they still count here.
        let taken = book.take_for_writing(now);
        assert_eq!(book.tokens_beyond(&key, day, mark), 32);
        book.tokens(&key, 8, now);
        assert_eq!(book.tokens_beyond(&key, day, mark), 40);
        // Written: a read begun before the write (at `mark`) still gets them from here; a
        // read begun after does not count them twice.
        let (slot, counts) = taken.into_iter().next().unwrap();
        book.written(slot, counts, true);
        assert_eq!(book.tokens_beyond(&key, day, mark), 40);
        assert_eq!(book.tokens_beyond(&key, day, book.mark(&key, day)), 8);
    }

    #[test]
    fn a_failed_write_is_pending_again() {
        let (key, day, now) = key();
        let book = UsageBook::default();
        book.tokens(&key, 32, now);
        book.request(&key, now);
        let (slot, counts) = book.take_for_writing(now).into_iter().next().unwrap();
        book.written(slot, counts, false);
        assert_eq!(book.tokens_beyond(&key, day, book.mark(&key, day)), 32);
        let again = book.take_for_writing(now);
        assert_eq!(
            again,
            vec![(
                (key.clone(), day),
                Counts {
                    requests: 1,
                    tokens: 32
                }
            )]
        );
        assert_eq!(
            book.lock().keys[&key].writing,
            vec![(
                day,
                Counts {
                    requests: 1,
                    tokens: 32
                }
            )]
        );
    }

    #[test]
    fn written_counts_of_past_days_are_let_go() {
        let (key, _, now) = key();
        let book = UsageBook::default();
        let old = now - chrono::Days::new(2);
        book.tokens(&key, 5, old);
        let (slot, counts) = book.take_for_writing(now).into_iter().next().unwrap();
        book.written(slot, counts, true);
        assert_eq!(book.mark(&key, old.date_naive()), 5);
        book.take_for_writing(now);
        assert_eq!(book.mark(&key, old.date_naive()), 0);
    }
}
