//! keel's own spans over OTLP/HTTP protobuf (`telemetry.otlp_endpoint`): the request spans,
//! the core's service spans, ledger commits and database statements, batched by the SDK's
//! processor on a thread of its own and sent with keel's reqwest client on a small runtime of
//! its own (the batch thread blocks on each export; none of keel's runtimes is ever the one
//! blocked, and the last batch still goes out while the service's runtime stops). W3C trace
//! context comes in with a request's `traceparent` and goes out to providers and webhook
//! receivers.

use std::sync::{Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Whether keel's spans are exported (`telemetry.otlp_endpoint`).
pub static EXPORTING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// How long one export may take before it counts as failed.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// The most of a collector's answer read.
const MAX_ANSWER: usize = 64 * 1024;

/// The exporter's runtime: made once, never dropped (whichever thread drops the exporter last,
/// the batch thread or an async one, no runtime is torn down inside another).
static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();

/// The exporter's HTTP client: keel's reqwest on a runtime of its own.
#[derive(Debug, Clone)]
pub struct Client {
    http: reqwest::Client,
    runtime: &'static tokio::runtime::Runtime,
}

impl Client {
    fn new() -> anyhow::Result<Self> {
        let runtime = match RUNTIME.get() {
            Some(runtime) => runtime,
            None => {
                let runtime = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .thread_name("keel-otlp")
                    .enable_all()
                    .build()?;
                RUNTIME.get_or_init(|| runtime)
            }
        };
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(EXPORT_TIMEOUT)
            .build()?;
        Ok(Self { http, runtime })
    }
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Client {
    async fn send_bytes(
        &self,
        request: http::Request<bytes::Bytes>,
    ) -> Result<http::Response<bytes::Bytes>, opentelemetry_http::HttpError> {
        let http = self.http.clone();
        let request = reqwest::Request::try_from(request)?;
        let sent = self.runtime.spawn(async move {
            let mut answer = http.execute(request).await?;
            let mut reply = http::Response::builder().status(answer.status());
            let mut body = bytes::BytesMut::new();
            while let Some(chunk) = answer.chunk().await? {
                if body.len() + chunk.len() > MAX_ANSWER {
                    break;
                }
                body.extend_from_slice(&chunk);
            }
            if let Some(headers) = reply.headers_mut() {
                *headers = answer.headers().clone();
            }
            Ok::<_, opentelemetry_http::HttpError>(reply.body(body.freeze())?)
        });
        sent.await?
    }
}

/// When the oldest span not yet exported ended (none: every span handed over went out).
static OLDEST_UNEXPORTED: Mutex<Option<SystemTime>> = Mutex::new(None);

/// How long the oldest span not yet exported has waited (0 when none waits), for
/// `keel_spans_export_lag_seconds`.
pub fn lag_seconds() -> f64 {
    let oldest = *OLDEST_UNEXPORTED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    oldest
        .and_then(|at| SystemTime::now().duration_since(at).ok())
        .map_or(0.0, |lag| lag.as_secs_f64())
}

/// The OTLP exporter, keeping [`OLDEST_UNEXPORTED`]: a batch's oldest span is waiting until
/// an export succeeds (a collector that keeps failing shows a growing lag).
#[derive(Debug)]
struct Measured(opentelemetry_otlp::SpanExporter);

impl SpanExporter for Measured {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        if let Some(oldest) = batch.iter().map(|span| span.end_time).min() {
            let mut waiting = OLDEST_UNEXPORTED
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            *waiting = Some(waiting.map_or(oldest, |known| known.min(oldest)));
        }
        let exported = self.0.export(batch).await;
        if exported.is_ok() {
            *OLDEST_UNEXPORTED
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = None;
        }
        exported
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.0.set_resource(resource);
    }
}

/// The tracer provider exporting to `url` (the full `/v1/traces` URL), and the tracer the
/// tracing layer records with.
pub fn provider(url: &str) -> anyhow::Result<(SdkTracerProvider, opentelemetry_sdk::trace::Tracer)> {
    use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(url)
        .with_timeout(EXPORT_TIMEOUT)
        .with_http_client(Client::new()?)
        .build()?;
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(Measured(exporter))
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name("keel")
                .with_attribute(opentelemetry::KeyValue::new(
                    "service.version",
                    env!("CARGO_PKG_VERSION"),
                ))
                .build(),
        )
        .build();
    let tracer = provider.tracer("keel");
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    Ok((provider, tracer))
}

/// Headers as the propagator reads them.
struct Headers<'a>(&'a actix_web::http::header::HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// Makes `span` (a request's) the child of the caller's `traceparent`, if it sent one.
pub fn continue_trace(span: &tracing::Span, headers: &actix_web::http::header::HeaderMap) {
    if !headers.contains_key("traceparent") {
        return;
    }
    let parent = TraceContextPropagator::new().extract(&Headers(headers));
    let _ = span.set_parent(parent);
}

/// Headers as the propagator writes them.
struct Outgoing<'a>(&'a mut http::HeaderMap);

impl Injector for Outgoing<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(key.as_bytes()),
            http::HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

/// Adds the current span's `traceparent` to an outgoing request's headers (only while spans
/// are exported: otherwise there is no trace to continue).
pub fn inject_current(headers: &mut http::HeaderMap) {
    if !EXPORTING.load(std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let context = tracing::Span::current().context();
    TraceContextPropagator::new().inject_context(&context, &mut Outgoing(headers));
}

/// The current span's W3C `traceparent` (none outside a sampled trace).
pub fn current_traceparent() -> Option<String> {
    let mut headers = http::HeaderMap::new();
    let context = tracing::Span::current().context();
    TraceContextPropagator::new().inject_context(&context, &mut Outgoing(&mut headers));
    headers
        .get("traceparent")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// Makes `span` continue the trace of `traceparent` (kept from the request that caused the
/// work: a webhook event's).
pub fn continue_from(span: &tracing::Span, traceparent: &str) {
    let mut headers = http::HeaderMap::new();
    if let Ok(value) = http::HeaderValue::from_str(traceparent) {
        headers.insert("traceparent", value);
    }
    struct Map<'a>(&'a http::HeaderMap);
    impl Extractor for Map<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.get(key).and_then(|v| v.to_str().ok())
        }
        fn keys(&self) -> Vec<&str> {
            self.0.keys().map(|k| k.as_str()).collect()
        }
    }
    let parent = TraceContextPropagator::new().extract(&Map(&headers));
    let _ = span.set_parent(parent);
}
