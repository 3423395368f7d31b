//! Agent logs, agent account usage and optimizer timelines.

pub(crate) mod repo;
pub mod service;
