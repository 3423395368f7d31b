//! Bodies and views of the webhook routes.

use chrono::{DateTime, Utc};
use entities::{webhook_delivery_attempt, webhook_endpoint};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::http::validate::{Checks, Validate};
use keel_core::domain::EventType;
use keel_core::domain::OrgId;
use keel_core::webhooks::{is_known_event, service};

fn check_events(c: &mut Checks, events: &[String]) {
    for (i, event) in events.iter().enumerate() {
        if !is_known_event(event) {
            c.fail_item(
                "events",
                i,
                "enum",
                format!(
                    "unknown event {event:?}; one of: *, {}",
                    EventType::ALL.map(EventType::as_str).join(", ")
                ),
            );
        }
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EndpointCreateBody {
    /// The organization; with an API key it may be omitted (the key's own).
    #[schema(value_type = Option<String>, min_length = 1, max_length = 100)]
    #[serde(default, deserialize_with = "OrgId::optional")]
    pub org_id: Option<OrgId>,
    #[schema(min_length = 10, max_length = 2000)]
    pub url: String,
    /// Event names, or `"*"` for every event.
    #[schema(value_type = Vec<crate::schemas::WebhookEventName>, min_items = 1, max_items = 16)]
    pub events: Vec<String>,
    #[schema(max_length = 500)]
    pub description: Option<String>,
}

impl Validate for EndpointCreateBody {
    fn validate(&self, c: &mut Checks) {
        check_events(c, &self.events);
    }
}

crate::org_scoped!(EndpointCreateBody);

/// A change to an endpoint: only the fields given change (`description: null` clears it).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EndpointPatchBody {
    #[schema(min_length = 10, max_length = 2000)]
    pub url: Option<String>,
    #[schema(value_type = Option<Vec<crate::schemas::WebhookEventName>>, min_items = 1, max_items = 16)]
    pub events: Option<Vec<String>>,
    /// `null` clears it.
    #[serde(default, deserialize_with = "crate::http::extract::present")]
    #[schema(value_type = Option<String>, max_length = 500)]
    pub description: Option<Option<String>>,
    /// false stops deliveries to it; true sends them again (and clears `disabledReason`).
    pub enabled: Option<bool>,
}

impl Validate for EndpointPatchBody {
    fn validate(&self, c: &mut Checks) {
        if let Some(events) = &self.events {
            check_events(c, events);
        }
    }
}

/// An endpoint, as its organization's members read it (never its secret).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointView {
    pub endpoint_id: String,
    pub org_id: String,
    pub url: String,
    #[schema(value_type = Vec<crate::schemas::WebhookEventName>)]
    pub events: Vec<String>,
    pub description: Option<String>,
    pub enabled: bool,
    /// Why keel disabled it (its deliveries kept failing), if it did.
    pub disabled_reason: Option<String>,
    /// Until then the secret it replaced still signs beside the new one.
    pub previous_secret_until: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<webhook_endpoint::Model> for EndpointView {
    fn from(e: webhook_endpoint::Model) -> Self {
        let now = Utc::now();
        let previous_secret_until = service::previous_secrets(&e, now).first().map(|s| s.until);
        Self {
            events: service::events_of(&e),
            endpoint_id: e.id,
            org_id: e.org_id.into(),
            url: e.url,
            description: e.description,
            enabled: e.enabled,
            disabled_reason: e.disabled_reason,
            previous_secret_until,
            created_at: e.created_at,
            updated_at: e.updated_at,
        }
    }
}

/// A new endpoint, with its secret: shown this once.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointCreated {
    #[serde(flatten)]
    pub endpoint: EndpointView,
    /// `whsec_` and base64: the key of the Standard Webhooks signatures. Not shown again.
    pub secret: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EndpointList {
    pub endpoints: Vec<EndpointView>,
}

/// A rotated secret: the new one (shown once); the old one signs beside it for 24 hours.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RotatedSecret {
    pub secret: String,
    pub previous_secret_until: DateTime<Utc>,
}

/// One try at a delivery.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryAttemptView {
    pub attempt: i32,
    pub attempted_at: DateTime<Utc>,
    /// The answer's status; null when none came (the error says why).
    pub status_code: Option<i32>,
    pub latency_ms: i32,
    /// The first 1 KiB of the answer's body.
    pub response: Option<String>,
    pub error: Option<String>,
}

impl From<webhook_delivery_attempt::Model> for DeliveryAttemptView {
    fn from(a: webhook_delivery_attempt::Model) -> Self {
        Self {
            attempt: a.attempt,
            attempted_at: a.attempted_at,
            status_code: a.status_code,
            latency_ms: a.latency_ms,
            response: a.response,
            error: a.error,
        }
    }
}

/// An event on its way to an endpoint.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryView {
    pub delivery_id: String,
    /// The `webhook-id` header and the body's `id`: the same on every attempt.
    pub event_id: String,
    pub endpoint_id: String,
    #[serde(rename = "type")]
    pub event_type: String,
    #[schema(value_type = crate::schemas::DeliveryStatus)]
    pub status: keel_core::domain::DeliveryStatus,
    /// When the next attempt is due (pending only).
    pub next_attempt_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub attempts: Vec<DeliveryAttemptView>,
}

impl From<service::DeliveryLog> for DeliveryView {
    fn from(log: service::DeliveryLog) -> Self {
        let d = log.delivery;
        Self {
            next_attempt_at: d
                .next_attempt_at
                .filter(|_| d.status == keel_core::domain::DeliveryStatus::Pending),
            delivery_id: d.id,
            event_id: d.event_id,
            endpoint_id: d.endpoint_id,
            event_type: log.event_type,
            status: d.status,
            created_at: d.created_at,
            attempts: log.attempts.into_iter().map(DeliveryAttemptView::from).collect(),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryPage {
    pub deliveries: Vec<DeliveryView>,
    /// Pass as `cursor` for the next page; null at the end.
    pub next_cursor: Option<String>,
}
