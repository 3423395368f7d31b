//! Projects of an organization.

pub(crate) mod repo;
pub mod service;

/// Why a project flow did not happen.
#[derive(Debug, thiserror::Error)]
pub enum ProjectError {
    #[error("project not found")]
    NotFound,
    #[error("a project with slug '{0}' already exists in this organization")]
    SlugTaken(String),
    #[error("could not find a free project slug")]
    NoFreeSlug,
    #[error(transparent)]
    Database(#[from] sea_orm::DbErr),
}
