//! Outbound webhooks: an organization's endpoints, their deliveries' log and replay.

pub mod dto;
pub mod routes;
