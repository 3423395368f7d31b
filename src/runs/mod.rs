//! Runs of projects: create, update, link to the experiment tracker; checkpoints (internal);
//! and `GET /api/tracker`, which reads linked runs from the tracker.

pub mod dto;
pub mod routes;
