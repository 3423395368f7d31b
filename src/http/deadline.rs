//! The request body's deadline: the whole body must arrive within
//! `server.body_timeout_secs` of its request's head, or the request is answered 408 and its
//! connection closed. actix-web bounds only the head (`client_request_timeout`); without this
//! a client sending a byte every few seconds held a connection, and a descriptor, for ever
//! (issue 36: 1,100 such clients made `accept` fail for everyone).

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::error::PayloadError;
use actix_web::http::{header, ConnectionType};
use actix_web::middleware::Next;
use actix_web::web::Bytes;
use actix_web::{HttpMessage, HttpResponse};
use futures_util::Stream;

use crate::error::{Code, ErrorBody};
use crate::state::AppState;

/// A body stream that ends with an error once its deadline passes.
struct Deadline {
    inner: Payload,
    timer: Pin<Box<tokio::time::Sleep>>,
    expired: Arc<AtomicBool>,
    done: bool,
}

impl Stream for Deadline {
    type Item = Result<Bytes, PayloadError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut self.inner).poll_next(cx) {
            Poll::Ready(None) => {
                self.done = true;
                Poll::Ready(None)
            }
            Poll::Ready(Some(item)) => Poll::Ready(Some(item)),
            Poll::Pending => {
                if self.timer.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.done = true;
                self.expired.store(true, Ordering::Relaxed);
                Poll::Ready(Some(Err(PayloadError::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the request body did not arrive in time",
                )))))
            }
        }
    }
}

/// Whether the request announces a body (a length above 0, or chunks).
fn has_body(req: &ServiceRequest) -> bool {
    let headers = req.headers();
    headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim() != "0")
}

/// The middleware: puts the deadline on every request's body; a request whose body missed
/// it is answered 408 with `Connection: close`, whatever its handler made of the error.
pub async fn body_deadline(
    mut req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, actix_web::Error> {
    let timeout = req
        .app_data::<actix_web::web::Data<AppState>>()
        .map(|state| state.settings.server.body_timeout_secs)
        .unwrap_or(30);
    if timeout == 0 || !has_body(&req) {
        return Ok(next.call(req).await?.map_into_left_body());
    }
    let expired = Arc::new(AtomicBool::new(false));
    let stream = Deadline {
        inner: req.take_payload(),
        timer: Box::pin(tokio::time::sleep(Duration::from_secs(timeout))),
        expired: expired.clone(),
        done: false,
    };
    let boxed: Pin<Box<dyn Stream<Item = Result<Bytes, PayloadError>>>> = Box::pin(stream);
    req.set_payload(Payload::from(boxed));
    let response = next.call(req).await;
    if !expired.load(Ordering::Relaxed) {
        return Ok(response?.map_into_left_body());
    }
    let detail = format!("the request body did not arrive within {timeout} s");
    tracing::info!(timeout_secs = timeout, "request body timed out");
    let mut timed_out = HttpResponse::RequestTimeout().json(ErrorBody::new(Code::RequestTimeout, detail));
    timed_out.head_mut().set_connection_type(ConnectionType::Close);
    Ok(response?.into_response(timed_out).map_into_right_body())
}
