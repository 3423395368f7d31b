//! HTTP plumbing shared by every domain: extractors, bounds checks, JSON fallbacks.

pub mod client;
pub mod deadline;
pub mod extract;
pub mod metrics;
pub mod schemas;
pub mod validate;

use actix_web::http::header;
use actix_web::{web, HttpResponse, Resource};

use crate::error::{Code, ErrorBody};

/// A resource whose other methods answer 405 with a JSON `detail` and an `Allow` header
/// naming `methods` (lowercase, as the route table writes them).
pub fn resource(path: &str, methods: &[&str]) -> Resource {
    let allow = methods
        .iter()
        .map(|m| m.to_ascii_uppercase())
        .collect::<Vec<_>>()
        .join(", ");
    web::resource(path).default_service(web::to(move || {
        let allow = allow.clone();
        async move {
            HttpResponse::MethodNotAllowed()
                .insert_header((header::ALLOW, allow))
                .json(ErrorBody::new(Code::MethodNotAllowed, "Method Not Allowed"))
        }
    }))
}

/// Every path no route matches.
pub async fn not_found() -> HttpResponse {
    HttpResponse::NotFound().json(ErrorBody::new(Code::NotFound, "Not Found"))
}

pub use keel_core::peer::{causes, CallFailure, PeerError};
