//! The events keel announces to webhook endpoints (CONTRACT §8): their names are spelled
//! here once; an endpoint's subscription, the outbox, the schema and the emitters use these.

use serde::{Serialize, Serializer};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventType {
    TopupSucceeded,
    TopupFailed,
    AutoTopupSucceeded,
    AutoTopupFailed,
    AutoTopupLimitReached,
    BalanceLow,
    CreditExpiring,
    CreditExpired,
    JobSucceeded,
    JobFailed,
    JobBlocked,
    JobUserStopped,
    JobCancelled,
    DatasetVersionCreated,
    WebhookTest,
}

impl EventType {
    /// Every event, in the order the schema lists them.
    pub const ALL: [Self; 15] = [
        Self::TopupSucceeded,
        Self::TopupFailed,
        Self::AutoTopupSucceeded,
        Self::AutoTopupFailed,
        Self::AutoTopupLimitReached,
        Self::BalanceLow,
        Self::CreditExpiring,
        Self::CreditExpired,
        Self::JobSucceeded,
        Self::JobFailed,
        Self::JobBlocked,
        Self::JobUserStopped,
        Self::JobCancelled,
        Self::DatasetVersionCreated,
        Self::WebhookTest,
    ];

    /// What an endpoint's `events` names to receive every event.
    pub const EVERY: &'static str = "*";

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::TopupSucceeded => "billing.topup.succeeded",
            Self::TopupFailed => "billing.topup.failed",
            Self::AutoTopupSucceeded => "billing.auto_topup.succeeded",
            Self::AutoTopupFailed => "billing.auto_topup.failed",
            Self::AutoTopupLimitReached => "billing.auto_topup.limit_reached",
            Self::BalanceLow => "billing.balance.low",
            Self::CreditExpiring => "billing.credit.expiring",
            Self::CreditExpired => "billing.credit.expired",
            Self::JobSucceeded => "job.succeeded",
            Self::JobFailed => "job.failed",
            Self::JobBlocked => "job.blocked",
            Self::JobUserStopped => "job.user_stopped",
            Self::JobCancelled => "job.cancelled",
            Self::DatasetVersionCreated => "dataset.version_created",
            Self::WebhookTest => "webhook.test",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.as_str() == name)
    }

    /// Whether an endpoint subscribed to `events` (names, or `*`) receives this event.
    pub fn subscribed_by(self, events: &[String]) -> bool {
        events.iter().any(|e| e == Self::EVERY || e == self.as_str())
    }
}

impl std::fmt::Display for EventType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for EventType {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::EventType;

    #[test]
    fn every_name_parses_back_and_names_are_distinct() {
        let mut names = std::collections::BTreeSet::new();
        for event in EventType::ALL {
            assert_eq!(EventType::parse(event.as_str()), Some(event));
            assert!(names.insert(event.as_str()), "{event} twice");
        }
        assert_eq!(EventType::parse("*"), None);
        assert_eq!(EventType::parse("job.started"), None);
    }

    #[test]
    fn a_subscription_names_the_event_or_every_event() {
        let named = vec!["job.failed".to_owned()];
        assert!(EventType::JobFailed.subscribed_by(&named));
        assert!(!EventType::JobSucceeded.subscribed_by(&named));
        assert!(EventType::JobSucceeded.subscribed_by(&["*".to_owned()]));
        assert!(!EventType::JobSucceeded.subscribed_by(&[]));
    }
}

/// Where one event's delivery to one endpoint stands.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Hash,
    serde::Serialize,
    serde::Deserialize,
    sea_orm::EnumIter,
    sea_orm::DeriveActiveEnum,
)]
#[serde(rename_all = "lowercase")]
#[sea_orm(rs_type = "String", db_type = "Text")]
pub enum DeliveryStatus {
    /// Due at `next_attempt_at` (or being sent).
    #[sea_orm(string_value = "pending")]
    Pending,
    #[sea_orm(string_value = "succeeded")]
    Succeeded,
    /// Every attempt failed; an operator or member may send it again.
    #[sea_orm(string_value = "failed")]
    Failed,
}

impl DeliveryStatus {
    pub const ALL: [Self; 3] = [Self::Pending, Self::Succeeded, Self::Failed];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == text)
    }
}
