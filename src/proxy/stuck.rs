//! Streamed answers whose client stopped reading. actix polls a response body for more only
//! once it has written what it has, so a stream whose client keeps its connection open and
//! reads nothing is simply never polled again, holding the provider's call (which goes on
//! generating, and billing) for as long as the client likes. Each stream with bytes on
//! their way says since when; one sweeper per HTTP worker looks every second and, past
//! `proxy.client_write_timeout_secs`, shuts the client's connection down: actix's blocked
//! write fails, the stream is dropped, and with it the provider's call.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Weak};
use std::time::{Duration, Instant};

use crate::http::client::ClientCloser;

static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

fn now_ms() -> u64 {
    // 0 means "nothing on its way": the clock starts at 1.
    EPOCH.elapsed().as_millis() as u64 + 1
}

/// One stream's side of the watch.
pub struct Watch {
    /// When the stream last handed bytes over without being asked for more since (0: it
    /// has been asked since).
    handed_at: AtomicU64,
    /// The sweeper ended it.
    tripped: AtomicBool,
    closer: ClientCloser,
    timeout: Duration,
}

impl Watch {
    /// Bytes handed to actix: the clock runs until the next poll.
    pub fn handed(&self) {
        self.handed_at.store(now_ms(), Ordering::Relaxed);
    }

    /// Polled again: the client took what it was given.
    pub fn polled(&self) {
        self.handed_at.store(0, Ordering::Relaxed);
    }

    /// Whether the sweeper ended the stream.
    pub fn tripped(&self) -> bool {
        self.tripped.load(Ordering::Relaxed)
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn stuck(&self, now: u64) -> bool {
        let at = self.handed_at.load(Ordering::Relaxed);
        at != 0 && now.saturating_sub(at) > self.timeout.as_millis() as u64
    }
}

thread_local! {
    /// This worker's watched streams; the sweeper runs while there are any.
    static WATCHED: RefCell<Option<Vec<Weak<Watch>>>> = const { RefCell::new(None) };
}

/// Watches a stream (on the current HTTP worker).
pub fn watch(closer: ClientCloser, timeout: Duration) -> Arc<Watch> {
    let watch = Arc::new(Watch {
        handed_at: AtomicU64::new(0),
        tripped: AtomicBool::new(false),
        closer,
        timeout,
    });
    let start = WATCHED.with(|watched| {
        let mut watched = watched.borrow_mut();
        let start = watched.is_none();
        watched.get_or_insert_with(Vec::new).push(Arc::downgrade(&watch));
        start
    });
    if start {
        actix_web::rt::spawn(sweep());
    }
    watch
}

async fn sweep() {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = now_ms();
        let done = WATCHED.with(|watched| {
            let mut watched = watched.borrow_mut();
            let Some(list) = watched.as_mut() else {
                return true;
            };
            list.retain(|weak| match weak.upgrade() {
                None => false,
                Some(watch) => {
                    if watch.stuck(now) && !watch.tripped.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            timeout_secs = watch.timeout.as_secs(),
                            "a streaming client stopped reading; its connection and the provider's call end"
                        );
                        watch.closer.close();
                    }
                    true
                }
            });
            if list.is_empty() {
                *watched = None;
                return true;
            }
            false
        });
        if done {
            return;
        }
    }
}
