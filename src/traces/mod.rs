//! Traces: the recorded chat completions of a project, listed per project and exported as
//! training datasets (`GET /api/traces/export` for a project's newest, `POST` for an explicit
//! selection). Traces are written by [`writer::TraceWriter`].

pub mod cli;
pub mod dto;
pub mod routes;

pub const MAX_EXPORT: u64 = 1000;
