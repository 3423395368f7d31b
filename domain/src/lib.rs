//! keel's value types, parsed once at the edge (bodies, queries, paths, credentials) and
//! carried inward, so nothing inside compares or normalizes raw strings; the rows of
//! `entities` are typed with them. A crate of its own so that `entities` (below the core) can
//! use them.
#![forbid(unsafe_code)]

pub mod event;
pub mod idempotency;
pub mod ids;
pub mod job;
pub mod ledger;
pub mod limit;
pub mod money;
pub mod payment;
pub mod status;
pub mod transition;

pub use event::{DeliveryStatus, EventType};
pub use idempotency::IdempotencyKey;
pub use ids::{ApiKeyId, DatasetId, IdError, JobId, OrgId, ProjectId, RunId, ScheduleId, TraceId, UserId};
pub use job::{AttemptOutcome, JobAction, JobStatus};
pub use ledger::{EntryKind, GrantKind};
pub use limit::LimitKind;
pub use money::{Cents, Microcents, ModelPrice, TokenPrice};
pub use payment::PaymentState;
pub use status::{EvalStatus, HubStatus};
pub use transition::JobEvent;

/// The providers the recording proxy forwards to, in the order its metrics index them.
pub const PROVIDERS: &[&str] = &["openai", "anthropic", "openrouter", "google"];
