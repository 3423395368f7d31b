//! A key's limits, held across instances by the database:
//!
//! - `requestsPerMinute`: a token bucket (capacity a minute's requests, refilled
//!   continuously) in one row per key. An instance draws requests from it by compare-and-set
//!   and spends them locally: one at a time up to 1,199 a minute (every call draws, so the
//!   key is never over its limit); a tenth of a second's worth at a time above (the next
//!   batch drawn as soon as one is begun, so no call waits for the database), kept at most a
//!   second.
//! - `tokensPerDay`: the day's tokens in the database plus those counted here that the read
//!   may not include (pending, being written, or written since; see [`UsageBook`]); read
//!   again at least every second, and at every call past half the limit.
//! - `concurrentStreams`: each instance's open streams of the key in a row it refreshes; a
//!   stream opens if the live rows' total stays within the limit.
//!
//! On SQLite (one instance) the bucket and the open streams are kept in memory: exact, and
//! no write competes with the ledger's and the trace writer's for SQLite's one writer.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use chrono::{DateTime, NaiveDate, Utc};
use sea_orm::{DatabaseConnection, DbErr};

use super::{day_text, repo, LimitKind, Limits, UsageBook};
use crate::domain::ApiKeyId;

/// Requests drawn ahead are spent within this, or dropped.
const LEASE_TTL: Duration = Duration::from_secs(1);
/// The day's tokens read from the database are trusted this long (below half the limit).
const TOKENS_TTL: Duration = Duration::from_secs(1);
/// How often this instance's stream rows are refreshed.
const STREAMS_REFRESH: Duration = Duration::from_secs(10);

/// A call a limit refused, and when to try again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    pub limit: LimitKind,
    /// Seconds (at least 1) until the call could pass.
    pub retry_after_secs: u64,
}

impl Refusal {
    pub fn message(&self) -> String {
        match self.limit {
            LimitKind::RequestsPerMinute => "this API key is over its requestsPerMinute limit".into(),
            LimitKind::TokensPerDay => "this API key used its tokensPerDay limit for today (UTC)".into(),
            LimitKind::ConcurrentStreams => {
                "this API key has as many streams open as its concurrentStreams limit".into()
            }
        }
    }
}

/// Why a call was not admitted.
#[derive(Debug, thiserror::Error)]
pub enum Limited {
    #[error("{}", .0.message())]
    Refused(Refusal),
    #[error(transparent)]
    Database(#[from] DbErr),
}

/// Requests drawn from a key's bucket and not yet spent on this instance.
struct Lease {
    state: tokio::sync::Mutex<LeaseState>,
    refilling: AtomicBool,
}

struct LeaseState {
    tokens: u64,
    rpm: u32,
    expires: Instant,
}

/// The day's tokens of a key as last read.
#[derive(Clone)]
struct TokensSeen {
    day: NaiveDate,
    tokens: i64,
    /// The usage book's mark taken before the read ([`UsageBook::mark`]).
    mark: i64,
    read: Instant,
    /// A read is in flight.
    refreshing: Arc<AtomicBool>,
}

struct Inner {
    db: DatabaseConnection,
    /// Whether other instances share the database (PostgreSQL): the requests' buckets and the
    /// open streams are then kept in it; on SQLite (one instance) in memory.
    shared: bool,
    /// This process's name in the stream rows.
    instance: String,
    usage: UsageBook,
    leases: Mutex<HashMap<ApiKeyId, Arc<Lease>>>,
    tokens: Mutex<HashMap<ApiKeyId, TokensSeen>>,
    /// One instance's buckets: level in millionths of a request, and when (Unix µs).
    buckets: Mutex<HashMap<ApiKeyId, (i64, i64)>>,
    /// One instance's open streams by key.
    streams: Mutex<HashMap<ApiKeyId, u32>>,
}

/// The limits of every key, as this instance enforces them.
#[derive(Clone)]
pub struct Limiter {
    inner: Arc<Inner>,
}

/// Requests drawn at once for a key of `rpm`: a tenth of a second's worth, 1 to 1,000.
pub fn batch(rpm: u32) -> u64 {
    u64::from(rpm / 600).clamp(1, 1000)
}

fn unix_us(at: DateTime<Utc>) -> i64 {
    at.timestamp_micros()
}

/// Whole seconds (at least 1) of a wait in microseconds, for `Retry-After`.
fn retry_secs(wait_us: i64) -> u64 {
    u64::try_from(wait_us).unwrap_or(0).div_ceil(1_000_000).max(1)
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Seconds from `now` to the next UTC midnight (at least 1).
fn until_tomorrow(now: DateTime<Utc>) -> u64 {
    let tomorrow = (now.date_naive() + chrono::Days::new(1))
        .and_hms_opt(0, 0, 0)
        .map(|t| t.and_utc())
        .unwrap_or(now);
    u64::try_from((tomorrow - now).num_seconds()).unwrap_or(0).max(1)
}

impl Limiter {
    pub fn new(db: DatabaseConnection, usage: UsageBook) -> Self {
        Self {
            inner: Arc::new(Inner {
                shared: db.get_database_backend() == sea_orm::DbBackend::Postgres,
                buckets: Mutex::new(HashMap::new()),
                streams: Mutex::new(HashMap::new()),
                db,
                instance: uuid::Uuid::new_v4().to_string(),
                usage,
                leases: Mutex::new(HashMap::new()),
                tokens: Mutex::new(HashMap::new()),
            }),
        }
    }

    pub fn usage(&self) -> &UsageBook {
        &self.inner.usage
    }

    /// Admits one call of a key under its `requestsPerMinute` and `tokensPerDay`, and counts
    /// it (a refused call counts for nothing).
    pub async fn admit(&self, key_id: &ApiKeyId, limits: &Limits, now: DateTime<Utc>) -> Result<(), Limited> {
        if let Some(limit) = limits.tokens_per_day {
            let used = self.tokens_today(key_id, limit, now).await?;
            if u64::try_from(used).unwrap_or(0) >= limit {
                return Err(Limited::Refused(Refusal {
                    limit: LimitKind::TokensPerDay,
                    retry_after_secs: until_tomorrow(now),
                }));
            }
        }
        if let Some(rpm) = limits.requests_per_minute {
            self.take_request(key_id, rpm, now).await?;
        }
        self.inner.usage.request(key_id, now);
        Ok(())
    }

    /// The key's tokens today: the database's as last read, and those counted here since.
    /// Below half the limit a read older than a second is refreshed in the background (one
    /// read at a time; calls meanwhile use the last one); past half, or on a new day, each
    /// call reads.
    async fn tokens_today(&self, key_id: &ApiKeyId, limit: u64, now: DateTime<Utc>) -> Result<i64, DbErr> {
        let day = now.date_naive();
        let half = i64::try_from(limit / 2).unwrap_or(i64::MAX);
        let seen = lock(&self.inner.tokens)
            .get(key_id)
            .filter(|seen| seen.day == day)
            .cloned();
        let seen = seen.map(|seen| {
            let used = seen.tokens + self.inner.usage.tokens_beyond(key_id, day, seen.mark);
            (seen, used)
        });
        if let Some((seen, used)) = seen.filter(|(_, used)| *used < half) {
            if seen.read.elapsed() >= TOKENS_TTL && !seen.refreshing.swap(true, Ordering::AcqRel) {
                let (limiter, key_id) = (self.clone(), key_id.clone());
                tokio::spawn(async move {
                    if let Err(err) = limiter.read_tokens(&key_id, day).await {
                        tracing::warn!(error = %err, key_id = %key_id, "could not read an API key's tokens today");
                    }
                    seen.refreshing.store(false, Ordering::Release);
                });
            }
            return Ok(used);
        }
        let (tokens, mark) = self.read_tokens(key_id, day).await?;
        Ok(tokens + self.inner.usage.tokens_beyond(key_id, day, mark))
    }

    /// Reads the key's tokens on `day` from the database; answers them and the usage book's
    /// mark taken before the read.
    async fn read_tokens(&self, key_id: &ApiKeyId, day: NaiveDate) -> Result<(i64, i64), DbErr> {
        let mark = self.inner.usage.mark(key_id, day);
        let (_, tokens) = repo::usage_on(&self.inner.db, key_id, &day_text(day)).await?;
        lock(&self.inner.tokens).insert(
            key_id.clone(),
            TokensSeen {
                day,
                tokens,
                mark,
                read: Instant::now(),
                refreshing: Arc::new(AtomicBool::new(false)),
            },
        );
        Ok((tokens, mark))
    }

    fn lease(&self, key_id: &ApiKeyId) -> Arc<Lease> {
        lock(&self.inner.leases)
            .entry(key_id.clone())
            .or_insert_with(|| {
                Arc::new(Lease {
                    state: tokio::sync::Mutex::new(LeaseState {
                        tokens: 0,
                        rpm: 0,
                        expires: Instant::now(),
                    }),
                    refilling: AtomicBool::new(false),
                })
            })
            .clone()
    }

    /// One instance's bucket, in memory: exact, and free of writes.
    fn take_local(&self, key_id: &ApiKeyId, rpm: u32, now: DateTime<Utc>) -> Result<(), Limited> {
        let now_us = unix_us(now);
        let mut buckets = lock(&self.inner.buckets);
        let capacity = i64::from(rpm) * repo::MICRO;
        let (level, updated_us) = buckets.entry(key_id.clone()).or_insert((capacity, now_us));
        let current = repo::level_at(*level, *updated_us, now_us, rpm);
        if current < repo::MICRO {
            return Err(Limited::Refused(Refusal {
                limit: LimitKind::RequestsPerMinute,
                retry_after_secs: retry_secs(repo::wait_us(current, rpm)),
            }));
        }
        *level = current - repo::MICRO;
        *updated_us = now_us.max(*updated_us);
        Ok(())
    }

    async fn take_request(&self, key_id: &ApiKeyId, rpm: u32, now: DateTime<Utc>) -> Result<(), Limited> {
        if !self.inner.shared {
            return self.take_local(key_id, rpm, now);
        }
        let lease = self.lease(key_id);
        let size = batch(rpm);
        let mut state = lease.state.lock().await;
        if state.rpm != rpm || state.expires <= Instant::now() {
            state.tokens = 0;
            state.rpm = rpm;
        }
        if state.tokens == 0 {
            let draw = repo::draw(&self.inner.db, key_id, rpm, size, unix_us(now)).await?;
            if draw.granted == 0 {
                return Err(Limited::Refused(Refusal {
                    limit: LimitKind::RequestsPerMinute,
                    retry_after_secs: retry_secs(draw.wait_us),
                }));
            }
            state.tokens = draw.granted;
            state.expires = Instant::now() + LEASE_TTL;
        }
        state.tokens -= 1;
        // Draw the next batch as soon as this one is begun (large limits only): a slow
        // database then has a whole batch's time before a call waits for it.
        if size > 1 && state.tokens < size && !lease.refilling.swap(true, Ordering::AcqRel) {
            let (limiter, key_id, lease) = (self.clone(), key_id.clone(), lease.clone());
            tokio::spawn(async move {
                let drawn = repo::draw(&limiter.inner.db, &key_id, rpm, size, unix_us(Utc::now())).await;
                if let Ok(draw) = drawn {
                    let mut state = lease.state.lock().await;
                    if state.rpm == rpm && draw.granted > 0 {
                        if state.expires <= Instant::now() {
                            state.tokens = 0;
                        }
                        state.tokens += draw.granted;
                        state.expires = Instant::now() + LEASE_TTL;
                    }
                }
                lease.refilling.store(false, Ordering::Release);
            });
        }
        Ok(())
    }

    /// Opens a stream of a key under its `concurrentStreams`; the permit closes it when
    /// dropped.
    pub async fn open_stream(&self, key_id: &ApiKeyId, limit: u32) -> Result<StreamPermit, Limited> {
        let refused = Limited::Refused(Refusal {
            limit: LimitKind::ConcurrentStreams,
            retry_after_secs: 1,
        });
        if !self.inner.shared {
            let mut streams = lock(&self.inner.streams);
            let open = streams.entry(key_id.clone()).or_insert(0);
            if *open >= limit {
                return Err(refused);
            }
            *open += 1;
        } else if !repo::open_stream(&self.inner.db, key_id, &self.inner.instance, limit, Utc::now()).await? {
            return Err(refused);
        }
        Ok(StreamPermit {
            limiter: self.clone(),
            key_id: key_id.clone(),
        })
    }

    /// Forgets what this instance drew or read for a key (its settings changed).
    pub fn forget(&self, key_id: &ApiKeyId) {
        lock(&self.inner.leases).remove(key_id);
        lock(&self.inner.tokens).remove(key_id);
    }

    /// Refreshes this instance's stream rows until `stop`.
    pub async fn run(self, stop: tokio_util::sync::CancellationToken) {
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                () = tokio::time::sleep(STREAMS_REFRESH) => {
                    if let Err(err) = repo::refresh_streams(&self.inner.db, &self.inner.instance, Utc::now()).await {
                        tracing::warn!(error = %err, "could not refresh this instance's open streams");
                    }
                }
            }
        }
    }
}

/// An open stream of a key, counted against its `concurrentStreams` until dropped.
pub struct StreamPermit {
    limiter: Limiter,
    key_id: ApiKeyId,
}

impl Drop for StreamPermit {
    fn drop(&mut self) {
        if !self.limiter.inner.shared {
            let mut streams = lock(&self.limiter.inner.streams);
            if let Some(open) = streams.get_mut(&self.key_id) {
                *open = open.saturating_sub(1);
            }
            return;
        }
        let (inner, key_id) = (self.limiter.inner.clone(), self.key_id.clone());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if let Err(err) = repo::close_stream(&inner.db, &key_id, &inner.instance).await {
                    tracing::warn!(error = %err, key_id = %key_id, "could not close a stream's count; it lapses with the instance's row");
                }
            });
        }
    }
}

impl crate::cluster::Subscriber for Limiter {
    fn apply(&self, event: &crate::cluster::Event) {
        if let crate::cluster::Event::KeyChanged(key_id) = event {
            self.forget(key_id);
        }
    }

    fn clear(&self) {
        lock(&self.inner.leases).clear();
        lock(&self.inner.tokens).clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_limits_draw_one_request_at_a_time() {
        assert_eq!(batch(1), 1);
        assert_eq!(batch(1199), 1);
        assert_eq!(batch(6000), 10);
        assert_eq!(batch(u32::MAX), 1000);
    }

    #[test]
    fn the_day_ends_at_utc_midnight() {
        let now = chrono::TimeZone::with_ymd_and_hms(&Utc, 2026, 11, 27, 23, 59, 30).unwrap();
        assert_eq!(until_tomorrow(now), 30);
    }
}
