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

/// The longest request target (path and query) keel reads, as nginx's default request line.
/// Past 64 KiB the HTTP layer itself refuses the request line before keel sees it (400 or
/// 431 without a body: actix-http's own answer).
pub const MAX_TARGET_BYTES: usize = 16 * 1024;

/// 414 with the JSON error body for a request whose path and query are longer than
/// [`MAX_TARGET_BYTES`], before any route or credential is looked at.
pub async fn target_length(
    req: actix_web::dev::ServiceRequest,
    next: actix_web::middleware::Next<impl actix_web::body::MessageBody + 'static>,
) -> Result<
    actix_web::dev::ServiceResponse<actix_web::body::EitherBody<impl actix_web::body::MessageBody>>,
    actix_web::Error,
> {
    let length = req.uri().path_and_query().map_or(0, |pq| pq.as_str().len());
    if length > MAX_TARGET_BYTES {
        let reply = HttpResponse::UriTooLong()
            .insert_header((header::CONNECTION, "close"))
            .json(ErrorBody::new(
                Code::UriTooLong,
                format!(
                    "the request's path and query are {length} bytes; keel reads at most {MAX_TARGET_BYTES}"
                ),
            ));
        return Ok(req.into_response(reply).map_into_right_body());
    }
    Ok(next.call(req).await?.map_into_left_body())
}

pub use keel_core::peer::{CallFailure, PeerError};
