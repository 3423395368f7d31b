//! The console's own state: sessions (one per sign-in), the one-time views of new API keys'
//! secrets, and the events an organization's pages show.

pub(crate) mod repo;
pub mod service;

pub use repo::REVEAL_SECS;
