//! Organizations, members, API keys and adapters.

pub mod adapters;
pub(crate) mod repo;
pub mod service;

/// Why an organization flow did not happen.
#[derive(Debug, thiserror::Error)]
pub enum OrgError {
    #[error("organization not found")]
    OrgNotFound,
    #[error("adapter not found")]
    AdapterNotFound,
    #[error("organization slug '{0}' is taken")]
    SlugTaken(String),
    #[error("could not find a free organization slug")]
    NoFreeSlug,
    #[error(transparent)]
    Database(#[from] sea_orm::DbErr),
}
