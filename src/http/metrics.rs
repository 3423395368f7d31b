//! `keel_http_requests_total` and `keel_http_requests_duration_seconds`: every request by
//! route pattern, method and status. Every label value comes from a closed set, whatever a
//! client sends: the route table's patterns (anything unmatched is `other`), the methods HTTP
//! defines for keel's routes (any other is `other`), and the status codes HTTP names (any
//! other a relayed provider invents is `other`). A client inventing a method or a path per
//! request therefore never adds a series (issue 36: 100,000 invented methods once grew
//! /metrics to 153 MB).

use std::time::Instant;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::{Method, StatusCode};
use actix_web::middleware::Next;
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

/// The method label's values.
pub const METHODS: [&str; 8] = [
    "GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "other",
];

/// The label of anything outside a closed set.
pub const OTHER: &str = "other";

#[derive(Clone)]
pub struct HttpMetrics {
    requests: IntCounterVec,
    seconds: HistogramVec,
    /// Answers by status class, every class present from start-up (an alert's ratio has
    /// its series before the first error).
    classes: IntCounterVec,
}

/// `keel_http_responses_total`'s classes.
const CLASSES: [&str; 5] = ["1xx", "2xx", "3xx", "4xx", "5xx"];

impl HttpMetrics {
    /// Fails only on a malformed name or label set.
    pub fn new() -> prometheus::Result<Self> {
        let labels = &["endpoint", "method", "status"];
        let requests = IntCounterVec::new(
            Opts::new(
                "keel_http_requests_total",
                "HTTP requests by route pattern, method and status",
            ),
            labels,
        )?;
        let seconds = HistogramVec::new(
            HistogramOpts::new(
                "keel_http_requests_duration_seconds",
                "Time from a request's arrival to its answer's head, by route pattern, method and status",
            ),
            labels,
        )?;
        let classes = IntCounterVec::new(
            Opts::new(
                "keel_http_responses_total",
                "HTTP answers by status class (1xx to 5xx), each class present from start-up",
            ),
            &["class"],
        )?;
        for class in CLASSES {
            classes.with_label_values(&[class]);
        }
        Ok(Self {
            requests,
            seconds,
            classes,
        })
    }

    pub fn register(&self, registry: &Registry) -> prometheus::Result<()> {
        registry.register(Box::new(self.requests.clone()))?;
        registry.register(Box::new(self.classes.clone()))?;
        registry.register(Box::new(self.seconds.clone()))
    }

    fn observe(&self, endpoint: &str, method: &Method, status: StatusCode, started: Instant) {
        let labels = [endpoint, method_label(method), status_label(&status)];
        self.requests.with_label_values(&labels).inc();
        let class = (status.as_u16() / 100).clamp(1, 5) as usize - 1;
        self.classes.with_label_values(&[CLASSES[class]]).inc();
        self.seconds
            .with_label_values(&labels)
            .observe(started.elapsed().as_secs_f64());
    }

    /// The middleware: counts and times every request once its answer's head is ready.
    pub async fn middleware(
        req: ServiceRequest,
        next: Next<impl MessageBody + 'static>,
    ) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
        let started = Instant::now();
        let metrics = req.app_data::<actix_web::web::Data<HttpMetrics>>().cloned();
        let method = req.method().clone();
        let response = next.call(req).await;
        if let Some(metrics) = metrics {
            let (pattern, status) = match &response {
                Ok(res) => (res.request().match_pattern(), res.status()),
                Err(err) => (None, err.as_response_error().status_code()),
            };
            metrics.observe(pattern.as_deref().unwrap_or(OTHER), &method, status, started);
        }
        response
    }
}

/// A method's label: one of [`METHODS`].
pub fn method_label(method: &Method) -> &'static str {
    METHODS
        .iter()
        .find(|known| **known == method.as_str())
        .copied()
        .unwrap_or(OTHER)
}

/// A status's label: its code when HTTP names it, else `other`.
pub fn status_label(status: &StatusCode) -> &str {
    if status.canonical_reason().is_some() {
        status.as_str()
    } else {
        OTHER
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_come_from_closed_sets() {
        assert_eq!(method_label(&Method::GET), "GET");
        assert_eq!(method_label(&Method::from_bytes(b"M0000001").unwrap()), "other");
        assert_eq!(method_label(&Method::from_bytes(b"PROPFIND").unwrap()), "other");
        assert_eq!(status_label(&StatusCode::NOT_FOUND), "404");
        assert_eq!(status_label(&StatusCode::from_u16(599).unwrap()), "other");
        assert_eq!(status_label(&StatusCode::from_u16(999).unwrap()), "other");
    }
}
