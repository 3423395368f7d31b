//! Recorded calls pushed, as they happen, to a project's OTLP/HTTP endpoint (Phoenix,
//! Langfuse, any OpenTelemetry collector): one span a trace, the same span the `otlp-json`
//! export writes (`traces::otlp`), sent as protobuf in batches. The trace writer puts each
//! trace of an exporting project in an outbox in the transaction that writes the trace; the
//! exporter task sends what waits, project by project, leasing each batch, and backs a
//! failing project off (the outbox is in the database: a dead endpoint costs no memory).

mod encode;
pub mod exporter;
pub(crate) mod repo;
pub mod service;

use std::collections::BTreeMap;
use std::sync::Arc;

use sea_orm::DatabaseConnection;

use crate::config::OtlpPushSettings;
use crate::metrics::Metrics;
use crate::secrets::SecretBox;
use crate::webhooks::destination;

/// What the push's flows need: the database, the secrets' box (headers are sealed), the
/// destination rules (the webhooks'), its settings and the metrics.
#[derive(Clone)]
pub struct Push {
    pub db: DatabaseConnection,
    pub secret_box: Option<SecretBox>,
    pub rules: destination::Rules,
    pub settings: Arc<OtlpPushSettings>,
    pub metrics: Metrics,
}

impl Push {
    pub fn new(
        db: DatabaseConnection,
        secret_box: Option<SecretBox>,
        webhooks: &crate::config::WebhookSettings,
        settings: &OtlpPushSettings,
        metrics: Metrics,
    ) -> Self {
        Self {
            db,
            secret_box,
            rules: destination::Rules {
                allow_http: webhooks.allow_http,
                allow_private_destinations: webhooks.allow_private_destinations,
            },
            settings: Arc::new(settings.clone()),
            metrics,
        }
    }
}

/// Where a project's calls are to go: an endpoint as `OTEL_EXPORTER_OTLP_ENDPOINT` takes it
/// (a base URL; `/v1/traces` is appended unless it ends so) and headers sent with each push.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    pub endpoint: String,
    pub headers: BTreeMap<String, String>,
}

/// A project's push as people may see it: never a header's value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportView {
    /// The URL spans are posted to.
    pub url: String,
    pub header_names: Vec<String>,
    pub last_error: Option<String>,
    pub last_error_at: Option<chrono::DateTime<chrono::Utc>>,
    pub last_exported_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Traces waiting to be pushed.
    pub pending: u64,
}

/// Headers a destination may carry at most, and their sizes.
pub const MAX_HEADERS: usize = 20;
pub const MAX_HEADER_NAME: usize = 100;
pub const MAX_HEADER_VALUE: usize = 4096;

/// Why a push flow did not happen.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    /// The endpoint is not one keel may call (the webhooks' destination rules).
    #[error(transparent)]
    Destination(#[from] destination::Refused),
    /// A header keel cannot send (`name` names it).
    #[error("header {name}: {reason}")]
    Header { name: String, reason: &'static str },
    #[error("OTLP export headers need secrets.encryption_key or KEEL_SESSION_SECRET to be configured")]
    SecretsUnconfigured,
    #[error("sealing a secret failed")]
    Sealing(#[source] anyhow::Error),
    #[error(transparent)]
    Database(#[from] sea_orm::DbErr),
}

/// The URL spans go to for `endpoint`: `/v1/traces` appended to its path unless it ends so.
pub fn traces_url(endpoint: &str) -> Result<url::Url, destination::Refused> {
    let mut url =
        url::Url::parse(endpoint.trim()).map_err(|e| destination::Refused::Invalid(e.to_string()))?;
    let path = url.path().trim_end_matches('/').to_owned();
    match path.ends_with("/v1/traces") {
        true => url.set_path(&path),
        false => url.set_path(&format!("{path}/v1/traces")),
    }
    Ok(url)
}

/// Whether `name: value` is a header keel can send (`Some(reason)` when not).
pub fn header_problem(name: &str, value: &str) -> Option<&'static str> {
    if name.is_empty() || name.len() > MAX_HEADER_NAME {
        return Some("a header name has 1 to 100 characters");
    }
    if value.len() > MAX_HEADER_VALUE {
        return Some("a header value has at most 4096 characters");
    }
    if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
        return Some("not a valid header name");
    }
    if reqwest::header::HeaderValue::from_str(value).is_err() {
        return Some("not a valid header value (control characters or non-ASCII)");
    }
    let lower = name.to_ascii_lowercase();
    if matches!(
        lower.as_str(),
        "content-type" | "content-length" | "host" | "transfer-encoding" | "connection"
    ) {
        return Some("keel sets this header itself");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_traces_path_is_appended_unless_it_is_there() {
        for (endpoint, url) in [
            ("https://collector.example", "https://collector.example/v1/traces"),
            (
                "https://collector.example/",
                "https://collector.example/v1/traces",
            ),
            (
                "https://cloud.langfuse.com/api/public/otel",
                "https://cloud.langfuse.com/api/public/otel/v1/traces",
            ),
            (
                "https://phoenix.example/v1/traces",
                "https://phoenix.example/v1/traces",
            ),
            (
                "https://phoenix.example/v1/traces/",
                "https://phoenix.example/v1/traces",
            ),
        ] {
            assert_eq!(traces_url(endpoint).unwrap().as_str(), url, "{endpoint}");
        }
        assert!(traces_url("not a url").is_err());
    }

    #[test]
    fn headers_keel_cannot_send_are_named() {
        assert_eq!(header_problem("Authorization", "Basic abc"), None);
        assert!(header_problem("bad name", "x").is_some());
        assert!(header_problem("x-key", "line\nbreak").is_some());
        assert!(header_problem("Content-Type", "text/plain").is_some());
        assert!(header_problem("", "x").is_some());
    }
}
