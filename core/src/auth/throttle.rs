//! Wrong sign-in credentials per client address: at most 10 a minute (a burst of 10, one more
//! every 6 s); past that the address waits, and nothing it sends is looked at meanwhile, so
//! credentials cannot be guessed at the speed of a loop. Signing in with a right one counts
//! for nothing. Per instance, by the connection's peer address (a `Forwarded` header is the
//! client's to write, so it is not trusted for this).

use std::collections::HashMap;
use std::net::IpAddr;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

/// Attempts a client address may make in a burst, and the pace after it.
const BURST: u32 = 10;
const EVERY: Duration = Duration::from_secs(6);

#[derive(Clone)]
pub struct SignInThrottle {
    limiter: Arc<DefaultKeyedRateLimiter<IpAddr>>,
    /// Addresses past their pace, until when.
    waiting: Arc<Mutex<HashMap<IpAddr, Instant>>>,
}

impl Default for SignInThrottle {
    fn default() -> Self {
        let quota = Quota::with_period(EVERY)
            .unwrap_or_else(|| Quota::per_minute(NonZeroU32::MIN))
            .allow_burst(NonZeroU32::new(BURST).unwrap_or(NonZeroU32::MIN));
        Self {
            limiter: Arc::new(RateLimiter::keyed(quota)),
            waiting: Arc::default(),
        }
    }
}

impl SignInThrottle {
    fn waiting(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, Instant>> {
        self.waiting
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Seconds `client` must still wait before an attempt is looked at (none: go on).
    pub fn wait_of(&self, client: IpAddr) -> Option<u64> {
        let now = Instant::now();
        let mut waiting = self.waiting();
        waiting.retain(|_, until| *until > now);
        waiting
            .get(&client)
            .map(|until| until.duration_since(now).as_secs_f64().ceil().max(1.0) as u64)
    }

    /// A wrong credential from `client`: past its pace, it waits (answers how long).
    pub fn failed(&self, client: IpAddr) -> Option<u64> {
        if self.limiter.len() > 10_000 {
            // Addresses back to a full burst are forgotten (the map stays small).
            self.limiter.retain_recent();
        }
        let not_until = self.limiter.check_key(&client).err()?;
        let wait = not_until.wait_time_from(DefaultClock::default().now());
        self.waiting().insert(client, Instant::now() + wait);
        Some(wait.as_secs_f64().ceil().max(1.0) as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ten_wrong_ones_pass_then_the_address_waits_and_others_do_not() {
        let throttle = SignInThrottle::default();
        let one: IpAddr = "192.0.2.1".parse().unwrap();
        for _ in 0..BURST {
            assert_eq!(throttle.wait_of(one), None);
            assert_eq!(throttle.failed(one), None);
        }
        let wait = throttle.failed(one).unwrap();
        assert!((1..=6).contains(&wait), "{wait}");
        assert!(throttle.wait_of(one).is_some_and(|w| (1..=6).contains(&w)));
        let other: IpAddr = "192.0.2.2".parse().unwrap();
        assert_eq!(throttle.wait_of(other), None);
        assert_eq!(throttle.failed(other), None);
    }
}
