//! sea-orm entities: one module per table, data only.

pub mod adapter;
pub mod api_key;
pub mod billing_account;
pub mod ledger_entry;
pub mod membership;
pub mod organization;
pub mod payment;
pub mod project;
pub mod promo_grant;
pub mod serving_usage;
pub mod training_run_cost;
pub mod user;
pub mod webhook_event;
