//! HTTP plumbing shared by every domain: extractors, bounds checks, JSON fallbacks.

pub mod extract;
pub mod validate;

use actix_web::{web, HttpResponse, Resource};

use crate::error::ErrorBody;

/// A resource whose unsupported methods answer 405 with a JSON `detail`.
pub fn resource(path: &str) -> Resource {
    web::resource(path).default_service(web::to(method_not_allowed))
}

async fn method_not_allowed() -> HttpResponse {
    HttpResponse::MethodNotAllowed().json(ErrorBody {
        detail: "Method Not Allowed".into(),
    })
}

/// Every path no route matches.
pub async fn not_found() -> HttpResponse {
    HttpResponse::NotFound().json(ErrorBody {
        detail: "Not Found".into(),
    })
}
