//! The OpenAPI schemas of core types that answers and bodies carry as they are. The core knows
//! no OpenAPI, so each is described here under the same name; a test checks each mirror
//! against the core type's own names.

#![allow(dead_code)]

use serde::Serialize;
use utoipa::ToSchema;

/// A member's role in an organization.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Owner,
    Member,
}

/// What a training job does.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobAction {
    Tracer,
    Draft,
    Optimize,
    Training,
}

/// Where a training job stands.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    Queued,
    Scheduled,
    Running,
    Stopping,
    Succeeded,
    Blocked,
    UserStopped,
    Failed,
}

/// An event a webhook endpoint may subscribe to (`*`: every one).
#[derive(Serialize, ToSchema)]
pub enum WebhookEventName {
    #[serde(rename = "*")]
    All,
    #[serde(rename = "billing.topup.succeeded")]
    TopupSucceeded,
    #[serde(rename = "billing.topup.failed")]
    TopupFailed,
    #[serde(rename = "billing.auto_topup.succeeded")]
    AutoTopupSucceeded,
    #[serde(rename = "billing.auto_topup.failed")]
    AutoTopupFailed,
    #[serde(rename = "billing.auto_topup.limit_reached")]
    AutoTopupLimitReached,
    #[serde(rename = "billing.balance.low")]
    BalanceLow,
    #[serde(rename = "billing.credit.expiring")]
    CreditExpiring,
    #[serde(rename = "billing.credit.expired")]
    CreditExpired,
    #[serde(rename = "job.succeeded")]
    JobSucceeded,
    #[serde(rename = "job.failed")]
    JobFailed,
    #[serde(rename = "job.blocked")]
    JobBlocked,
    #[serde(rename = "job.user_stopped")]
    JobUserStopped,
    #[serde(rename = "webhook.test")]
    WebhookTest,
}

/// Where a webhook delivery stands.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum DeliveryStatus {
    Pending,
    Succeeded,
    Failed,
}

/// A trace export's record shape.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Records,
    Prompts,
    Raw,
    /// OTLP/JSON `ExportTraceServiceRequest`s (a page's spans, one per trace).
    #[serde(rename = "otlp-json")]
    OtlpJson,
}

/// What a stale sweep did.
#[derive(Serialize, ToSchema)]
pub struct SweepCounts {
    pub requeued: u64,
    pub failed: u64,
    pub stopped: u64,
}

#[cfg(test)]
mod tests {
    use keel_core::domain::JobAction as CoreAction;
    use keel_core::traces::export::Format as CoreFormat;

    fn names<T: serde::Serialize>(values: &[T]) -> Vec<String> {
        values
            .iter()
            .map(|v| {
                serde_json::to_value(v)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default()
            })
            .collect()
    }

    #[test]
    fn each_mirror_names_what_the_core_type_serializes() {
        use super::*;
        assert_eq!(
            names(&[Role::Owner, Role::Member]),
            names(&[keel_core::auth::Role::Owner, keel_core::auth::Role::Member])
        );
        assert_eq!(
            names(&[
                JobAction::Tracer,
                JobAction::Draft,
                JobAction::Optimize,
                JobAction::Training
            ]),
            names(&CoreAction::ALL)
        );
        assert_eq!(
            names(&[
                JobStatus::Queued,
                JobStatus::Scheduled,
                JobStatus::Running,
                JobStatus::Stopping,
                JobStatus::Succeeded,
                JobStatus::Blocked,
                JobStatus::UserStopped,
                JobStatus::Failed
            ]),
            keel_core::domain::JobStatus::ALL
                .map(|s| s.as_str().to_owned())
                .to_vec()
        );
        assert_eq!(
            names(&[Format::Records, Format::Prompts, Format::Raw, Format::OtlpJson]),
            names(&[
                CoreFormat::Records,
                CoreFormat::Prompts,
                CoreFormat::Raw,
                CoreFormat::OtlpJson
            ])
        );
        let counts = serde_json::to_value(keel_core::queue::repo::SweepCounts::default()).unwrap_or_default();
        let mirror = serde_json::to_value(SweepCounts {
            requeued: 0,
            failed: 0,
            stopped: 0,
        })
        .unwrap_or_default();
        assert_eq!(counts, mirror);
        let events = names(&[
            WebhookEventName::TopupSucceeded,
            WebhookEventName::TopupFailed,
            WebhookEventName::AutoTopupSucceeded,
            WebhookEventName::AutoTopupFailed,
            WebhookEventName::AutoTopupLimitReached,
            WebhookEventName::BalanceLow,
            WebhookEventName::CreditExpiring,
            WebhookEventName::CreditExpired,
            WebhookEventName::JobSucceeded,
            WebhookEventName::JobFailed,
            WebhookEventName::JobBlocked,
            WebhookEventName::JobUserStopped,
            WebhookEventName::WebhookTest,
        ]);
        assert_eq!(events, keel_core::webhooks::EVENT_TYPES);
        assert_eq!(names(&[WebhookEventName::All]), [keel_core::webhooks::ALL_EVENTS]);
        assert_eq!(
            names(&[
                DeliveryStatus::Pending,
                DeliveryStatus::Succeeded,
                DeliveryStatus::Failed
            ]),
            [
                keel_core::webhooks::repo::PENDING,
                keel_core::webhooks::repo::SUCCEEDED,
                keel_core::webhooks::repo::FAILED
            ]
        );
    }
}
