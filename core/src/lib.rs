//! keel's core: the domain's types, the repositories (queries), the ledger and queue
//! actors, payments, the trace writer, cluster events and the services that hold the flows.
//!
//! It knows no HTTP server: nothing here depends on actix-web, utoipa, askama or the
//! console. The web crate (`keel`) extracts a request, calls one service function and maps
//! the service's error to a status and a code. Dependencies point one way: web → core.

pub mod auth;
pub mod billing;
pub mod cache;
pub mod cluster;
pub mod config;
pub mod console_store;
pub mod database;
pub use keel_domain as domain;
pub mod evals;
pub mod flash;
pub mod keys;
pub mod metrics;
pub mod orgs;
pub mod paging;
pub mod peer;
pub mod projects;
pub mod proxy;
pub mod queue;
pub mod runs;
pub mod secrets;
pub mod serving;
mod start;
pub mod tasks;
pub mod traces;
pub mod webhooks;

pub use start::Core;
