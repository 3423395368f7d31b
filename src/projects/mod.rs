//! `GET/POST /api/projects`, `GET /api/projects/{project_id}`.

pub mod dto;
pub mod routes;
