//! Prepaid billing: balances, payments, metering and idempotent charges.

pub mod dto;
pub mod export;
pub mod routes;
pub use keel_core::billing::{actor, auto_topup, charges, ledger, payments, repo, service, webhook};
