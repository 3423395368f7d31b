//! Logging: readable in development, one JSON object a line in production. Every line
//! of a request carries its `request_id`; no header (so no credential) is ever recorded.

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
