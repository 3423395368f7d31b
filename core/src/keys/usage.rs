//! What each key used, counted in memory on every call and added to the database about once
//! a second (`api_key_usage`), never a write per call; `lastUsedAt` is written at most once a
//! minute per key and instance.

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

    /// Tokens of `key_id` on `day` counted here and not yet written.
    pub fn pending_tokens(&self, key_id: &ApiKeyId, day: &str) -> i64 {
        self.lock()
            .pending
            .get(&(key_id.clone(), day.to_owned()))
            .map_or(0, |c| c.tokens)
    }

    /// Adds what was counted to the database, and writes `lastUsedAt` of the keys used since
    /// (at most once a minute each). Counts that could not be written are kept for the next
    /// flush.
    pub async fn flush(&self, db: &DatabaseConnection) {
        let (pending, touches) = {
            let mut book = self.lock();
            let pending = std::mem::take(&mut book.pending);
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
            (pending, due)
        };
        let mut failed = Vec::new();
        for ((key, day), counts) in pending {
            if let Err(err) = repo::add_usage(db, &key, &day, counts.requests, counts.tokens).await {
                // A key deleted meanwhile refuses its row: nothing to keep.
                if err.sql_err().is_none() {
                    tracing::warn!(error = %err, key_id = %key, "could not write an API key's usage; kept for the next flush");
                    failed.push(((key, day), counts));
                }
            }
        }
        for (key, at) in touches {
            if let Err(err) = repo::touch(db, &key, at).await {
                tracing::warn!(error = %err, key_id = %key, "could not write an API key's last use");
            }
        }
        if !failed.is_empty() {
            let mut book = self.lock();
            for (slot, counts) in failed {
                let entry = book.pending.entry(slot).or_default();
                entry.requests += counts.requests;
                entry.tokens += counts.tokens;
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
