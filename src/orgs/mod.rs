//! Organizations: the operator's routes (internal key: organizations, members, API keys,
//! adapters) and members' self-service API keys (owners create and revoke, members list;
//! never the secret after creation).

pub mod dto;
pub mod routes;

pub use dto::SLUG_RE;
