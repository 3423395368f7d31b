//! When a failed delivery is tried again: 5 s, 5 min, 30 min, 2 h, 5 h, 10 h and 10 h after
//! the attempts before it, each ±10%, then no more (the delivery has failed). Eight attempts
//! in all, spread over about 28 hours (Svix's schedule).

use std::time::Duration;

use rand::Rng;

/// The waits after the first attempt, the second, ... (before jitter).
pub const RETRY_AFTER: [Duration; 7] = [
    Duration::from_secs(5),
    Duration::from_secs(5 * 60),
    Duration::from_secs(30 * 60),
    Duration::from_secs(2 * 3600),
    Duration::from_secs(5 * 3600),
    Duration::from_secs(10 * 3600),
    Duration::from_secs(10 * 3600),
];

/// How long to wait after attempt number `attempts` (1 for the first) failed, with ±10%
/// jitter; None once every retry is spent.
pub fn next_retry(attempts: u32) -> Option<Duration> {
    let base = RETRY_AFTER.get(usize::try_from(attempts).ok()?.checked_sub(1)?)?;
    Some(base.mul_f64(rand::rng().random_range(0.9..=1.1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seven_retries_within_ten_percent_then_none() {
        for (i, base) in RETRY_AFTER.iter().enumerate() {
            for _ in 0..50 {
                let wait = next_retry(i as u32 + 1).unwrap();
                assert!(
                    wait >= base.mul_f64(0.9) && wait <= base.mul_f64(1.1),
                    "{i}: {wait:?}"
                );
            }
        }
        assert_eq!(next_retry(8), None);
        assert_eq!(next_retry(0), None);
    }
}
