//! sea-orm entities: one module per table, data only.

pub mod adapter;
pub mod api_key;
pub mod membership;
pub mod organization;
pub mod project;
pub mod user;
