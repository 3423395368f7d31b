//! Outbound webhooks (issue 41), the parts that stand alone: the events an endpoint may
//! subscribe to, Standard Webhooks signing and secrets, which destinations keel refuses to
//! call, and the retry schedule. Endpoints, the transactional outbox and the dispatcher
//! build on them.

pub mod destination;
pub mod schedule;
pub mod signing;

/// Every event an endpoint may subscribe to (`"*"`: all of them).
pub const EVENT_TYPES: [&str; 13] = [
    "billing.topup.succeeded",
    "billing.topup.failed",
    "billing.auto_topup.succeeded",
    "billing.auto_topup.failed",
    "billing.auto_topup.limit_reached",
    "billing.balance.low",
    "billing.credit.expiring",
    "billing.credit.expired",
    "job.succeeded",
    "job.failed",
    "job.blocked",
    "job.user_stopped",
    "webhook.test",
];

/// Subscribes to every event.
pub const ALL_EVENTS: &str = "*";

/// Whether `name` may stand in an endpoint's `events`.
pub fn is_known_event(name: &str) -> bool {
    name == ALL_EVENTS || EVENT_TYPES.contains(&name)
}

/// Whether an endpoint subscribed to `events` receives `event_type`.
pub fn subscribed(events: &[String], event_type: &str) -> bool {
    events.iter().any(|e| e == ALL_EVENTS || e == event_type)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wildcard_subscribes_to_every_event_and_names_are_exact() {
        assert!(is_known_event("*") && is_known_event("job.failed"));
        assert!(!is_known_event("job.*") && !is_known_event("Job.failed") && !is_known_event(""));
        let all = vec!["*".to_owned()];
        assert!(EVENT_TYPES.iter().all(|e| subscribed(&all, e)));
        let some = vec!["job.failed".to_owned(), "webhook.test".to_owned()];
        assert!(subscribed(&some, "job.failed") && !subscribed(&some, "job.succeeded"));
    }
}
