//! keel: the backend of an organization-scoped model-training platform.

pub mod auth;
pub mod billing;
pub mod cli;
pub mod console;
pub mod docs;
pub mod error;
pub mod evals;
pub mod flash;
pub mod http;
pub mod keys;
pub mod metrics;
pub mod openapi;
pub mod orgs;
pub mod projects;
pub mod proxy;
pub mod queue;
pub mod routes;
pub mod runs;
pub mod schemas;
pub mod serving;
pub mod startup;
pub mod state;
pub mod system;
pub mod telemetry;
pub mod traces;
pub mod upstream;
pub mod webhooks;

// The core's modules that the web crate uses as they are, under their usual paths.
pub use keel_core::{cache, cluster, config, database, domain};
