//! The OpenAPI schemas of core types that answers and bodies carry as they are. The core knows
//! no OpenAPI, so each is described here under the same name; a test checks each mirror
//! against the core type's own names.

#![allow(dead_code)]

use keel_core::domain::EventType;
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
    /// Waits for the jobs it depends on (`dependsOn`).
    Waiting,
    /// A job it depends on ended without success.
    Cancelled,
}

/// An event a webhook endpoint may subscribe to (`*`: every one): the names of
/// [`EventType`], spelled there once.
pub struct WebhookEventName;

impl utoipa::PartialSchema for WebhookEventName {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        let names = std::iter::once(EventType::EVERY).chain(EventType::ALL.iter().map(|e| e.as_str()));
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .description(Some(
                "An event a webhook endpoint may subscribe to (`*`: every one).",
            ))
            .enum_values(Some(names))
            .into()
    }
}

impl ToSchema for WebhookEventName {}

/// Where a webhook delivery stands: the names of
/// [`keel_core::domain::DeliveryStatus`], spelled there once.
pub struct DeliveryStatus;

impl utoipa::PartialSchema for DeliveryStatus {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use keel_core::domain::DeliveryStatus as Status;
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .description(Some("Where a webhook delivery stands."))
            .enum_values(Some(Status::ALL.map(Status::as_str)))
            .into()
    }
}

impl ToSchema for DeliveryStatus {}

/// A trace export's record shape.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Records,
    Prompts,
    Raw,
    /// OpenAI's chat fine-tuning lines (`{messages, tools?, parallel_tool_calls?}`).
    #[serde(rename = "openai-chat")]
    OpenaiChat,
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
                JobStatus::Failed,
                JobStatus::Waiting,
                JobStatus::Cancelled
            ]),
            keel_core::domain::JobStatus::ALL
                .map(|s| s.as_str().to_owned())
                .to_vec()
        );
        assert_eq!(
            names(&[
                Format::Records,
                Format::Prompts,
                Format::Raw,
                Format::OpenaiChat,
                Format::OtlpJson
            ]),
            names(&[
                CoreFormat::Records,
                CoreFormat::Prompts,
                CoreFormat::Raw,
                CoreFormat::OpenaiChat,
                CoreFormat::OtlpJson
            ])
        );
        let counts = serde_json::to_value(keel_core::queue::SweepCounts::default()).unwrap_or_default();
        let mirror = serde_json::to_value(SweepCounts {
            requeued: 0,
            failed: 0,
            stopped: 0,
        })
        .unwrap_or_default();
        assert_eq!(counts, mirror);
    }
}
