//! Logging: readable in development, one JSON object a line in production. Every line
//! of a request carries its `request_id`; no header (so no credential) is ever recorded.

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use tracing::Span;
use tracing_actix_web::{DefaultRootSpanBuilder, RootSpanBuilder};
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, TelemetrySettings};

pub fn init(settings: &TelemetrySettings) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&settings.level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // One line when a request's span closes, with its duration.
        .with_span_events(FmtSpan::CLOSE);
    // `try_init`: a second call (tests, CLI sub-commands) keeps the first subscriber.
    let _ = match settings.format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Pretty => builder.compact().try_init(),
    };
}

/// Each request's root span as tracing-actix-web's default builds it, made only when it
/// would be recorded. The default computes its fields (the matched route, the client's
/// address, the user agent) for every request, logged or not: about 7,000 instructions a
/// proxied call at `warn` (docs/BENCHMARKS.md, "Sixth session").
pub struct RootSpan;

impl RootSpanBuilder for RootSpan {
    fn on_request_start(request: &ServiceRequest) -> Span {
        if tracing::enabled!(target: "tracing_actix_web::root_span_builder", tracing::Level::INFO) {
            DefaultRootSpanBuilder::on_request_start(request)
        } else {
            Span::none()
        }
    }

    fn on_request_end<B: MessageBody>(span: Span, outcome: &Result<ServiceResponse<B>, actix_web::Error>) {
        DefaultRootSpanBuilder::on_request_end(span, outcome);
    }
}
