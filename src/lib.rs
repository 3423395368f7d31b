//! keel: the backend of an organization-scoped model-training platform.

pub mod auth;
pub mod bench;
pub mod billing;
pub mod cache;
pub mod cli;
pub mod config;
pub mod console;
pub mod database;
pub mod domain;
pub mod error;
pub mod evals;
pub mod flash;
pub mod http;
pub mod openapi;
pub mod orgs;
pub mod projects;
pub mod proxy;
pub mod queue;
pub mod routes;
pub mod runs;
pub mod serving;
pub mod startup;
pub mod state;
pub mod system;
pub mod telemetry;
pub mod traces;
