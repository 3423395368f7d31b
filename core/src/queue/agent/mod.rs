//! Agent logs, agent account usage and optimizer timelines.

pub mod repo;
