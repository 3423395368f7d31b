//! Flash: the control plane's internal endpoints. It mirrors environments (published to the
//! hub), managed runs and their checkpoints into keel, records product events, and asks
//! keel to provision hub repositories for environments still waiting for one.

pub mod dto;
pub mod routes;
