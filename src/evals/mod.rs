//! `POST /api/evals/runs`: an eval run uploaded in one piece; keel derives its counts and
//! mean score from the cases and stores the run with its cases.

pub mod dto;
pub mod routes;
