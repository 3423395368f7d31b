//! Outbound webhooks: an organization's endpoints, the events its changes announce (written
//! in the change's transaction: the outbox), and the dispatcher that signs and sends them,
//! at least once, to destinations keel may call.

pub mod destination;
pub mod dispatcher;
pub mod outbox;
pub(crate) mod repo;
pub mod schedule;
pub mod service;
pub mod signing;

use sea_orm::DatabaseConnection;

use crate::metrics::Metrics;
use crate::secrets::SecretBox;

/// What the webhook flows need: the database, the secrets' box (endpoint secrets are sealed
/// like training secrets), the destination rules, the bounds and the metrics.
#[derive(Clone)]
pub struct Webhooks {
    pub db: DatabaseConnection,
    pub secret_box: Option<SecretBox>,
    pub rules: destination::Rules,
    /// Endpoints an organization may have.
    pub max_endpoints_per_org: u64,
    /// The operator's proxy for deliveries (`webhooks.proxy_url`), if any.
    pub proxy_url: Option<String>,
    pub metrics: Metrics,
    /// This instance's test sends take turns (other instances wait on the endpoint's row).
    tests_turn: std::sync::Arc<tokio::sync::Mutex<()>>,
}

impl Webhooks {
    pub fn new(
        db: DatabaseConnection,
        secret_box: Option<SecretBox>,
        settings: &crate::config::WebhookSettings,
        metrics: Metrics,
    ) -> Self {
        Self {
            db,
            secret_box,
            rules: destination::Rules {
                allow_http: settings.allow_http,
                allow_private_destinations: settings.allow_private_destinations,
            },
            max_endpoints_per_org: settings.max_endpoints_per_org,
            proxy_url: Some(settings.proxy_url.clone()).filter(|url| !url.is_empty()),
            metrics,
            tests_turn: Default::default(),
        }
    }
}

/// Why a webhook flow did not happen.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    #[error("{0} not found")]
    NotFound(&'static str),
    #[error(transparent)]
    Destination(#[from] destination::Refused),
    #[error("endpoint secrets need secrets.encryption_key or KEEL_SESSION_SECRET to be configured")]
    SecretsUnconfigured,
    #[error("sealing a secret failed")]
    Sealing(#[source] anyhow::Error),
    /// The organization has `webhooks.max_endpoints_per_org` endpoints already.
    #[error(
        "this organization has {0} webhook endpoints, the most it may have (webhooks.max_endpoints_per_org)"
    )]
    EndpointLimit(u64),
    /// `/test` was asked too often for this endpoint.
    #[error(
        "test deliveries of this endpoint are limited to {} a minute",
        service::TESTS_PER_MINUTE
    )]
    TestsLimited { retry_after_secs: u64 },
    /// A manual retry of a delivery a dispatcher is sending right now.
    #[error("this delivery is being sent right now; retry it once its attempt is recorded")]
    DeliveryInFlight,
    #[error(transparent)]
    Database(#[from] sea_orm::DbErr),
}

/// Subscribes to every event.
pub const ALL_EVENTS: &str = crate::domain::EventType::EVERY;

/// Whether `name` may stand in an endpoint's `events`.
pub fn is_known_event(name: &str) -> bool {
    name == ALL_EVENTS || crate::domain::EventType::parse(name).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wildcard_subscribes_to_every_event_and_names_are_exact() {
        assert!(is_known_event("*") && is_known_event("job.failed"));
        assert!(!is_known_event("job.*") && !is_known_event("Job.failed") && !is_known_event(""));
        assert!(crate::domain::EventType::ALL
            .iter()
            .all(|e| is_known_event(e.as_str())));
        let all = vec!["*".to_owned()];
        assert!(crate::domain::EventType::ALL
            .iter()
            .all(|e| e.subscribed_by(&all)));
        let some = vec!["job.failed".to_owned(), "webhook.test".to_owned()];
        assert!(
            crate::domain::EventType::JobFailed.subscribed_by(&some)
                && !crate::domain::EventType::JobSucceeded.subscribed_by(&some)
        );
    }
}
