//! What a request hands to the work it causes: its request id (a task-local the HTTP layer
//! sets around each request) and its `tracing` span. Work spawned onto another task or
//! handed to an actor takes a [`Cause`] along, so a failure logged there names the request
//! that caused it (and, exported, belongs to its trace).

use std::future::Future;
use std::sync::Arc;

use tracing::Instrument;

tokio::task_local! {
    static REQUEST_ID: Arc<str>;
}

/// Runs `work` as the request `request_id`'s.
pub async fn with_request_id<F: Future>(request_id: Arc<str>, work: F) -> F::Output {
    REQUEST_ID.scope(request_id, work).await
}

/// The id of the request this work is for, if any.
pub fn request_id() -> Option<Arc<str>> {
    REQUEST_ID.try_with(Arc::clone).ok()
}

/// The request (its id and span) that caused some work.
#[derive(Debug, Clone)]
pub struct Cause {
    pub request_id: Option<Arc<str>>,
    pub span: tracing::Span,
}

impl Default for Cause {
    /// No request (background work).
    fn default() -> Self {
        Self {
            request_id: None,
            span: tracing::Span::none(),
        }
    }
}

impl Cause {
    /// The current request's, as the caller sees it.
    pub fn current() -> Self {
        Self {
            request_id: request_id(),
            span: tracing::Span::current(),
        }
    }

    pub fn request_id(&self) -> Option<&str> {
        self.request_id.as_deref()
    }
}

/// `work` carrying the current request's id and span, for `tokio::spawn`.
pub fn carry<F: Future>(work: F) -> impl Future<Output = F::Output> {
    let cause = Cause::current();
    async move {
        let work = work.instrument(cause.span);
        match cause.request_id {
            Some(id) => REQUEST_ID.scope(id, work).await,
            None => work.await,
        }
    }
}

/// W3C trace context across work handed on, when keel's spans are exported (the front that
/// exports installs it; the core knows no exporter).
#[derive(Debug, Clone, Copy)]
pub struct Propagation {
    /// The current span's `traceparent`.
    pub current: fn() -> Option<String>,
    /// Makes a span continue the trace of a `traceparent`.
    pub continue_from: fn(&tracing::Span, &str),
}

static PROPAGATION: std::sync::OnceLock<Propagation> = std::sync::OnceLock::new();

/// Installs the trace propagation (once per process).
pub fn set_propagation(propagation: Propagation) {
    let _ = PROPAGATION.set(propagation);
}

/// The current span's `traceparent`, when spans are exported.
pub fn traceparent() -> Option<String> {
    PROPAGATION.get().and_then(|p| (p.current)())
}

/// Makes `span` continue the trace of `traceparent`, when spans are exported.
pub fn continue_from(span: &tracing::Span, traceparent: &str) {
    if let Some(propagation) = PROPAGATION.get() {
        (propagation.continue_from)(span, traceparent);
    }
}
