//! Datasets: `POST|GET /api/datasets`, one dataset (`GET|PATCH|DELETE`), its versions and
//! their export; the worker's read of its job's dataset; `keel datasets export`.

pub mod cli;
pub mod dto;
pub mod routes;
