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

/// A trace export's record shape.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Records,
    Prompts,
    Raw,
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
            names(&[Format::Records, Format::Prompts, Format::Raw]),
            names(&[CoreFormat::Records, CoreFormat::Prompts, CoreFormat::Raw])
        );
        let counts = serde_json::to_value(keel_core::queue::repo::SweepCounts::default()).unwrap_or_default();
        let mirror = serde_json::to_value(SweepCounts {
            requeued: 0,
            failed: 0,
            stopped: 0,
        })
        .unwrap_or_default();
        assert_eq!(counts, mirror);
    }
}
