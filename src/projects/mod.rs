//! `GET/POST /api/projects`, `GET /api/projects/{project_id}`.

pub mod dto;
pub mod routes;
pub use keel_core::projects::{repo, service};
