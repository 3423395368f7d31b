//! Serving: who may call an adapter (`POST /api/serving/authorize`), undeploying an
//! organization's adapters (`POST /api/serving/teardown`) and sampling through the serving
//! layer (`POST /api/sample`).
//!
//! The serving layer (`serving.url`, OpenAI-compatible, e.g. `http://host:port/v1`) is
//! called with the first internal key: `POST <base>/chat/completions` to sample and
//! `DELETE <base>/adapters/{adapter_id}` to undeploy (see docs/DECISIONS.md, record 43).

pub mod dto;
pub mod routes;
