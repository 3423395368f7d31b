//! Serving: who may call an adapter (`POST /api/serving/authorize`), undeploying an
//! organization's adapters (`POST /api/serving/teardown`) and sampling through the serving
//! layer (`POST /api/sample`).
//!
//! The serving layer (`serving.url`, OpenAI-compatible, e.g. `http://host:port/v1`) is
//! called with the first internal key: `POST <base>/chat/completions` to sample and
//! `DELETE <base>/adapters/{adapter_id}` to undeploy (see docs/DECISIONS.md).

pub mod client;
pub mod dto;
pub mod routes;
pub mod service;

use actix_web::web;
use utoipa::OpenApi;

use crate::http::resource;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(resource("/api/serving/authorize").route(web::post().to(routes::authorize)))
        .service(resource("/api/serving/teardown").route(web::post().to(routes::teardown)))
        .service(resource("/api/sample").route(web::post().to(routes::sample)));
}

#[derive(OpenApi)]
#[openapi(paths(routes::authorize, routes::teardown, routes::sample))]
pub struct Doc;
