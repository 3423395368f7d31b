//! Traces: the recorded chat completions of a project, listed per project and exported as
//! training datasets (`GET /api/traces/export` for a project's newest, `POST` for an explicit
//! selection). Traces are written by [`writer::TraceWriter`].

pub mod cli;
pub mod dto;
pub mod export;
pub mod repo;
pub mod routes;
pub mod service;
pub mod writer;

use actix_web::web;
use utoipa::OpenApi;

use crate::http::resource;

pub const MAX_EXPORT: u64 = 1000;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(resource("/api/traces/projects").route(web::get().to(routes::trace_projects)))
        .service(
            resource("/api/traces/export")
                .route(web::get().to(routes::export_project))
                .route(web::post().to(routes::export_selection)),
        );
}

#[derive(OpenApi)]
#[openapi(paths(routes::trace_projects, routes::export_project, routes::export_selection))]
pub struct Doc;
