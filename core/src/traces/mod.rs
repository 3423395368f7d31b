//! Traces: the recorded calls of a project, written in batches and exported as datasets.

pub mod browse;
pub mod export;
pub mod indexer;
pub mod marks;
pub mod otlp;
pub mod push;
pub(crate) mod repo;
pub mod retention;
pub mod search;
pub mod service;
pub mod settings;
pub mod writer;

pub use repo::{ListedTrace, ProjectTraces, TraceFilter};

/// `ok` when a trace is complete, without an error, and answered 2xx; else `error`.
pub fn status_of(status_code: i32, complete: bool, error: Option<&str>) -> &'static str {
    match (200..300).contains(&status_code) && complete && error.is_none() {
        true => "ok",
        false => "error",
    }
}

/// Why an export did not happen.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("project not found")]
    ProjectNotFound,
    #[error("trace not found")]
    TraceNotFound,
    /// A trace would hold more than 20 tags (or scores).
    #[error("trace {trace_id} would hold more than 20 {what}")]
    TooManyMarks {
        trace_id: crate::domain::TraceId,
        what: &'static str,
    },
    /// A selection's records pass `traces.export_max_page_bytes`: it has no cursor to go on
    /// with, so the caller selects fewer.
    #[error(
        "the selected traces' records pass {max_bytes} bytes (traces.export_max_page_bytes): select fewer"
    )]
    SelectionTooLarge { max_bytes: usize },
    #[error("writing a record failed")]
    Serialize(#[from] serde_json::Error),
    #[error(transparent)]
    Database(#[from] sea_orm::DbErr),
}
