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

/// A failed outbound call (serving layer, hub, tracker, provider) in words fit for an answer
/// or a log: it names the peer, never a URL or a credential.
pub fn describe_call_failure(err: &reqwest::Error, peer: &str) -> String {
    describe_failure(err.is_timeout(), err.is_connect(), peer)
}

/// [`describe_call_failure`] from what is known of the failure: it timed out, or no
/// connection could be made, or neither.
pub fn describe_failure(timeout: bool, connect: bool, peer: &str) -> String {
    if timeout {
        format!("{peer} did not answer in time")
    } else if connect {
        format!("{peer} is unreachable")
    } else {
        format!("calling {peer} failed")
    }
}
