//! Prepaid billing: balances, payments, metering and idempotent charges.

pub mod dto;
pub mod export;
pub mod routes;
