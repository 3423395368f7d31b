//! keel's core: the domain's types, the repositories (queries), the ledger and queue
//! actors, payments, the trace writer, cluster events and the services that hold the flows.
//!
//! It knows no HTTP server: nothing here depends on actix-web, utoipa, askama or the
//! console. The web crate (`keel`) extracts a request, calls one service function and maps
//! the service's error to a status and a code. Dependencies point one way: web → core.
#![forbid(unsafe_code)]

pub mod auth;
pub mod billing;
pub mod cache;
pub mod cluster;
pub mod config;
pub mod console;
pub mod context;
pub mod database;
pub mod datasets;
pub use keel_domain as domain;
pub mod evals;
pub mod flash;
pub mod keys;
pub mod metrics;
pub mod operator;
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

pub use start::{Core, Readiness};

/// What tests and benchmarks write (and read) directly, below the services: rows in bulk,
/// keys and projects without the services' checks. Only with the `fixtures` feature; the
/// web crate cannot name a repository.
#[cfg(feature = "fixtures")]
pub mod fixtures {
    pub use crate::billing::repo::account;
    pub use crate::keys::repo::insert as insert_key;
    pub use crate::orgs::repo::upsert_adapter;
    pub use crate::projects::repo::insert as insert_project;
    pub use crate::queue::repo::insert_jobs;
    pub use crate::traces::repo::{export_page, insert_traces, oldest_unindexed};

    /// Submits an operation to the organization's ledger as a flow would (a benchmark's
    /// funding, without a payment).
    pub async fn submit_to_ledger(
        billing: &crate::billing::Billing,
        org_id: &crate::domain::OrgId,
        op: crate::billing::ledger::LedgerOp,
    ) -> Result<crate::billing::ledger::Outcome, crate::billing::ledger::LedgerError> {
        billing.ledger.submit(org_id, op).await
    }
}
