//! sea-orm entities: one module per table, data only.

pub mod adapter;
pub mod agent_log;
pub mod agent_usage;
pub mod api_key;
pub mod billing_account;
pub mod flash_checkpoint;
pub mod flash_environment;
pub mod flash_environment_use;
pub mod flash_run;
pub mod hub_backoff;
pub mod ledger_entry;
pub mod membership;
pub mod optimizer_timeline;
pub mod org_secret;
pub mod organization;
pub mod payment;
pub mod product_event;
pub mod project;
pub mod promo_grant;
pub mod run;
pub mod run_checkpoint;
pub mod serving_usage;
pub mod training_job;
pub mod training_run_cost;
pub mod user;
pub mod webhook_event;
