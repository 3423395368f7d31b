//! keel: the backend of an organization-scoped model-training platform.
// Unsafe only where a client's socket is watched (`http::client`, two calls, each with its
// SAFETY note); nowhere else.
#![deny(unsafe_code)]

pub mod admin;
pub mod auth;
pub mod billing;
pub mod cli;
pub mod console;
pub mod datasets;
pub mod docs;
pub mod error;
pub mod evals;
pub mod flash;
pub mod http;
pub mod keys;
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
