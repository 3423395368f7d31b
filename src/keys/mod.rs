//! API keys of an organization, as its members see them: owners create keys with their
//! settings (scopes, models, expiry, limits), change and revoke them; members list them with
//! what each used today. Never a secret after creation.

pub mod dto;
pub mod routes;
