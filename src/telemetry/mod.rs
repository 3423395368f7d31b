//! Logging: readable in development, one JSON object a line in production. Every line
//! of a request carries its `request_id`; no header (so no credential) is ever recorded,
//! and of a query string only the parameters' names.
//!
//! Lines go to stderr through a background thread with a bounded buffer: a reader that
//! stops reading (a stuck pipe) or is gone (a closed pipe) never blocks or fails a request
//! or the shutdown. A line that cannot be written is dropped and counted
//! (`keel_log_lines_dropped_total`).

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::HttpMessage;
use prometheus::IntCounter;
use tracing::Span;
use tracing_actix_web::{DefaultRootSpanBuilder, RequestId, RootSpanBuilder};
use tracing_appender::non_blocking::{ErrorCounter, NonBlockingBuilder, WorkerGuard};
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

pub mod otlp;

use keel_core::config::{LogFormat, TelemetrySettings};

/// How long the shutdown waits for buffered lines to be written.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(2);

/// Lines lost: dropped with the buffer full, or refused by the output.
struct LostLines {
    buffer_full: ErrorCounter,
    refused: Arc<AtomicU64>,
}

static LOST: OnceLock<LostLines> = OnceLock::new();

/// What `keel_log_lines_dropped_total` shows; brought up to date at each scrape.
/// (Made once; an error only for a malformed name, which start-up reports when registering.)
pub fn dropped_lines_counter() -> Result<&'static IntCounter, &'static prometheus::Error> {
    static COUNTER: OnceLock<prometheus::Result<IntCounter>> = OnceLock::new();
    COUNTER
        .get_or_init(|| {
            IntCounter::new(
                "keel_log_lines_dropped_total",
                "Log lines dropped because the log output was not taking them (full buffer, closed pipe)",
            )
        })
        .as_ref()
}

/// Brings `keel_log_lines_dropped_total` up to the lines lost so far.
pub fn refresh_metrics() {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    let Some(lost) = LOST.get() else { return };
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let total = lost.buffer_full.dropped_lines() as u64 + lost.refused.load(Ordering::Relaxed);
    let Ok(counter) = dropped_lines_counter() else {
        return;
    };
    let shown = counter.get();
    if total > shown {
        counter.inc_by(total - shown);
    }
}

/// stderr that counts a failed write and reports success, so the writer thread goes on.
struct Stderr {
    refused: Arc<AtomicU64>,
}

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if std::io::stderr().write_all(buf).is_err() {
            self.refused.fetch_add(1, Ordering::Relaxed);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

/// Written lines, flushed at [`Logs::flush`] or when dropped.
pub struct Logs(
    Option<WorkerGuard>,
    Option<opentelemetry_sdk::trace::SdkTracerProvider>,
);

impl Logs {
    /// Writes what is buffered, waiting at most [`FLUSH_TIMEOUT`]: an output that takes
    /// nothing does not hold the exit.
    pub fn flush(mut self) {
        if let Some(provider) = self.1.take() {
            // The last spans go out (the exporter has a runtime of its own), bounded by its
            // timeout.
            if let Err(err) = provider.shutdown() {
                tracing::warn!(error = %err, "exporting the last spans failed");
            }
        }
        if let Some(guard) = self.0.take() {
            let (done, wait) = std::sync::mpsc::channel();
            let spawned = std::thread::Builder::new()
                .name("keel-log-flush".into())
                .spawn(move || {
                    drop(guard);
                    let _ = done.send(());
                });
            if spawned.is_ok() {
                let _ = wait.recv_timeout(FLUSH_TIMEOUT);
            }
        }
    }
}

/// Installs the subscriber; a second call (tests, CLI sub-commands) keeps the first.
pub fn init(settings: &TelemetrySettings) -> Logs {
    if LOST.get().is_some() {
        return Logs(None, None);
    }
    let refused = Arc::new(AtomicU64::new(0));
    let (writer, guard) = NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(settings.buffered_lines.max(1))
        .thread_name("keel-log-writer")
        .finish(Stderr {
            refused: refused.clone(),
        });
    let lost = LostLines {
        buffer_full: writer.error_counter(),
        refused,
    };
    if LOST.set(lost).is_err() {
        return Logs(None, None);
    }
    // actix's HTTP/1 dispatcher logs a client's malformed request at ERROR (the client's
    // fault, not keel's), and a response stream's failure without its cause (the proxy logs
    // its own line, naming it): left out unless RUST_LOG names actix_http itself.
    let directives = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| settings.level.clone());
    let directives = match directives.contains("actix_http") {
        true => directives,
        false => format!("{directives},actix_http::h1::dispatcher=off"),
    };
    // sea-orm's span per statement is for the exported traces; the log names statements only
    // when RUST_LOG asks for sea_orm.
    let directives = match directives.contains("sea_orm") {
        true => directives,
        false => format!("{directives},sea_orm::database=warn"),
    };
    let filter = EnvFilter::try_new(&directives).unwrap_or_else(|_| EnvFilter::new(&settings.level));
    let lines = tracing_subscriber::fmt::layer()
        .with_writer(writer)
        // Colour codes only for a person at a terminal, never into a file or a pipe.
        .with_ansi(std::io::stderr().is_terminal())
        // A request is its one line (written when answered), not its span's close too.
        .with_span_events(FmtSpan::NONE);
    let lines: Box<dyn Layer<Registry> + Send + Sync> = match settings.format {
        LogFormat::Json => lines.json().flatten_event(true).with_filter(filter).boxed(),
        LogFormat::Pretty => lines.compact().with_filter(filter).boxed(),
    };
    // keel's spans go out whatever the log's filter: keel's at debug (the services'), the
    // database statements' at info.
    let (exported, provider) = match settings.otlp_traces_url() {
        Ok(Some(url)) => match otlp::provider(&url) {
            Ok((provider, tracer)) => {
                let targets = tracing_subscriber::filter::Targets::new()
                    .with_target("keel", tracing::Level::DEBUG)
                    .with_target("keel_core", tracing::Level::DEBUG)
                    .with_target("sea_orm::database", tracing::Level::INFO);
                let layer = tracing_opentelemetry::layer()
                    .with_tracer(tracer)
                    .with_filter(targets)
                    .boxed();
                otlp::EXPORTING.store(true, std::sync::atomic::Ordering::Relaxed);
                (Some(layer), Some((provider, url)))
            }
            Err(err) => {
                let _ = writeln!(std::io::stderr(), "keel: OTLP export to {url} not started: {err}");
                (None, None)
            }
        },
        _ => (None, None),
    };
    let mut layers = vec![lines];
    layers.extend(exported);
    let _ = tracing_subscriber::registry().with(layers).try_init();
    if let Some((_, url)) = &provider {
        tracing::info!(endpoint = %url, "keel's spans are exported over OTLP");
        keel_core::context::set_propagation(keel_core::context::Propagation {
            current: otlp::current_traceparent,
            continue_from: otlp::continue_from,
        });
    }
    Logs(Some(guard), provider.map(|(provider, _)| provider))
}

/// Query parameters whose values are logged; every other value is left out.
const LOGGED_QUERY_VALUES: &[&str] = &["limit", "format", "status", "since", "until", "orgId", "org_id"];

/// A request's path, and of its query the parameters' names (the values of
/// [`LOGGED_QUERY_VALUES`] only): a credential passed as `?key=...` never reaches a log.
pub fn loggable_target(path: &str, query: &str) -> String {
    let mut target = path.to_owned();
    for (i, (name, value)) in form_urlencoded::parse(query.as_bytes()).enumerate() {
        target.push(if i == 0 { '?' } else { '&' });
        // A name could itself be a credential (`?keel_sk_...`): only short plain names show.
        let plain = name.len() <= 32
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
        if !plain {
            target.push_str("[redacted]");
            continue;
        }
        target.push_str(&name);
        if LOGGED_QUERY_VALUES.contains(&name.as_ref()) {
            target.push('=');
            target.extend(form_urlencoded::byte_serialize(value.as_bytes()));
        }
    }
    target
}

/// The path a request's log line names instead of its route pattern (the relay's, whose
/// route is `/v1/{tail:.*}`), already without secrets and query.
pub struct LoggedPath(pub String);

/// A request's `info` line, written when it is answered, or, for a proxied stream, when
/// its body ends (with how it ended).
#[derive(Debug, Clone)]
pub struct RequestLine {
    method: String,
    route: String,
    path: String,
    request_id: String,
    ids: RequestIds,
    started: std::time::Instant,
}

impl RequestLine {
    /// Writes the line; `stream_error`: why a streamed body ended early.
    pub fn log(&self, status: u16, stream_error: Option<&str>) {
        log_request(
            &Line {
                method: &self.method,
                route: &self.route,
                path: &self.path,
                request_id: &self.request_id,
                ids: &self.ids,
                started: self.started,
            },
            status,
            stream_error,
        );
    }
}

/// What a request's line is written from.
struct Line<'a> {
    method: &'a str,
    route: &'a str,
    path: &'a str,
    request_id: &'a str,
    ids: &'a RequestIds,
    started: std::time::Instant,
}

/// A request's line: its fields (JSON in production, `key=value` in text); the ids only
/// where known.
fn log_request(line: &Line<'_>, status: u16, stream_error: Option<&str>) {
    let latency_ms = (line.started.elapsed().as_secs_f64() * 10_000.0).round() / 10.0;
    let ids = line.ids;
    tracing::info!(
        target: "keel::request",
        method = line.method,
        path = line.path,
        route = line.route,
        status,
        latency_ms,
        request_id = line.request_id,
        org_id = ids.org_id.as_deref(),
        api_key_id = ids.api_key_id.as_deref(),
        job_id = ids.job_id.as_deref(),
        trace_id = ids.trace_id.as_deref(),
        worker_id = ids.worker_id.as_deref(),
        stream_error,
        "request"
    );
}

/// The ids a request's line names where known, each set by whoever learns it: the
/// credential's middleware (the API key and its organization), the organization's
/// extractor, a JSON body's top-level `worker_id` / `job_id`, the proxy (its trace); the
/// path's own (`{org_id}`, `{job_id}`, `{trace_id}`) are read when the line is written.
/// Never a secret: an API key's id, not the key.
#[derive(Debug, Clone, Default)]
pub struct RequestIds {
    pub org_id: Option<String>,
    pub api_key_id: Option<String>,
    pub job_id: Option<String>,
    pub trace_id: Option<String>,
    pub worker_id: Option<String>,
}

impl RequestIds {
    /// `value` as a logged id: printable ASCII without spaces or quotes, at most 128
    /// characters (ids come from clients too: a line is never forged or flooded by one);
    /// anything else is `[unprintable]`.
    fn id(value: &str) -> String {
        let plain = !value.is_empty()
            && value.len() <= 128
            && value
                .bytes()
                .all(|b| b.is_ascii_graphic() && !matches!(b, b'"' | b'\\' | b'='));
        match plain {
            true => value.to_owned(),
            false => "[unprintable]".to_owned(),
        }
    }

    /// Sets the ids not known yet from the route's path parameters.
    fn fill_from_path(&mut self, params: &actix_web::dev::Path<actix_web::dev::Url>) {
        for (name, value) in params.iter() {
            let slot = match name {
                "org_id" | "org" => &mut self.org_id,
                "job_id" | "job" => &mut self.job_id,
                "trace_id" | "trace" => &mut self.trace_id,
                _ => continue,
            };
            if slot.is_none() {
                *slot = Some(Self::id(value));
            }
        }
    }
}

/// Notes ids of the request's line (nothing when request lines are not written).
pub fn note_ids(req: &actix_web::HttpRequest, note: impl FnOnce(&mut RequestIds)) {
    if let Some(ids) = req.extensions_mut().get_mut::<RequestIds>() {
        note(ids);
    }
}

/// Notes the organization a request acts in.
pub fn note_org(req: &actix_web::HttpRequest, org_id: &str) {
    note_ids(req, |ids| ids.org_id = Some(RequestIds::id(org_id)));
}

/// Notes the API key (its id) that made a request, and its organization.
pub fn note_api_key(req: &actix_web::HttpRequest, api_key_id: &str, org_id: &str) {
    note_ids(req, |ids| {
        ids.api_key_id = Some(RequestIds::id(api_key_id));
        ids.org_id = Some(RequestIds::id(org_id));
    });
}

/// Notes the trace a proxied call records.
pub fn note_trace(req: &actix_web::HttpRequest, trace_id: &str) {
    note_ids(req, |ids| ids.trace_id = Some(RequestIds::id(trace_id)));
}

/// Whether this request's line is written (its ids are worth noting).
pub fn writes_request_line(req: &actix_web::HttpRequest) -> bool {
    req.extensions().get::<RequestIds>().is_some()
}

/// Notes the worker and job a request's body names (`http::extract::top_level_ids`).
pub fn note_worker_and_job(req: &actix_web::HttpRequest, worker_id: Option<&str>, job_id: Option<&str>) {
    note_ids(req, |ids| {
        if let Some(worker_id) = worker_id {
            ids.worker_id = Some(RequestIds::id(worker_id));
        }
        if let Some(job_id) = job_id {
            ids.job_id = Some(RequestIds::id(job_id));
        }
    });
}

/// A request's concrete path as logged: a segment that looks like a credential (an API key,
/// a session token) is `[redacted]`.
fn loggable_path(path: &str) -> std::borrow::Cow<'_, str> {
    let secret = |segment: &str| {
        keel_core::auth::keys::looks_like_api_key(segment)
            || keel_core::auth::session::looks_like_jwt(segment)
    };
    if !path.split('/').any(secret) {
        return std::borrow::Cow::Borrowed(path);
    }
    std::borrow::Cow::Owned(
        path.split('/')
            .map(|segment| match secret(segment) {
                true => "[redacted]",
                false => segment,
            })
            .collect::<Vec<_>>()
            .join("/"),
    )
}

/// Put on a streamed response whose body writes the request's line itself when it ends
/// (the line then says whether the stream failed); filled with the line when answered.
#[derive(Clone, Default)]
pub struct DeferredLine(std::sync::Arc<std::sync::OnceLock<RequestLine>>);

impl DeferredLine {
    fn set(&self, line: RequestLine) {
        let _ = self.0.set(line);
    }

    /// Writes the request's line (if request lines are written at all).
    pub fn log(&self, status: u16, stream_error: Option<&str>) {
        if let Some(line) = self.0.get() {
            line.log(status, stream_error);
        }
    }
}

/// When a request started (for its one `info` line).
#[derive(Clone, Copy)]
struct Started(std::time::Instant);

/// Each request's root span, at `info`: its request id (what the lines logged inside it
/// show), and while spans are exported its method, route and the caller's `traceparent` as its
/// parent. Its close is not a line: a request is its one line, written when it is answered.
/// At `debug` a line at its start adds the path (query names only), client and user agent.
pub struct RootSpan;

impl RootSpanBuilder for RootSpan {
    fn on_request_start(request: &ServiceRequest) -> Span {
        if !tracing::enabled!(target: "keel::request", tracing::Level::INFO) {
            return Span::none();
        }
        {
            let mut extensions = request.extensions_mut();
            extensions.insert(Started(std::time::Instant::now()));
            extensions.insert(RequestIds::default());
        }
        let request_id = request
            .extensions()
            .get::<RequestId>()
            .map(ToString::to_string)
            .unwrap_or_default();
        let route = request.match_pattern();
        let route = route.as_deref().unwrap_or("default");
        if tracing::enabled!(target: "keel::request", tracing::Level::DEBUG) {
            let connection = request.connection_info();
            tracing::debug!(
                target: "keel::request",
                request_id = %request_id,
                http.target = %loggable_target(request.path(), request.query_string()),
                http.client_ip = connection.realip_remote_addr().unwrap_or(""),
                http.user_agent = request
                    .headers()
                    .get("user-agent")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or(""),
                "request started"
            );
        }
        let span = tracing::info_span!(
            target: "keel::request",
            "request",
            request_id = %request_id,
            http.method = tracing::field::Empty,
            http.route = tracing::field::Empty,
            otel.name = tracing::field::Empty,
            otel.kind = tracing::field::Empty,
            http.status_code = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
            exception.message = tracing::field::Empty,
            exception.details = tracing::field::Empty,
        );
        // What an exported span needs (the log's lines have it in the request line already).
        if otlp::EXPORTING.load(std::sync::atomic::Ordering::Relaxed) {
            span.record("http.method", request.method().as_str());
            span.record("http.route", route);
            span.record("otel.name", format!("{} {route}", request.method()));
            span.record("otel.kind", "server");
            otlp::continue_trace(&span, request.headers());
        }
        span
    }

    fn on_request_end<B: MessageBody>(span: Span, outcome: &Result<ServiceResponse<B>, actix_web::Error>) {
        if let Ok(response) = outcome {
            let request = response.request();
            let extensions = request.extensions();
            if let Some(Started(at)) = extensions.get::<Started>().copied() {
                let request_id = extensions.get::<RequestId>().map(ToString::to_string);
                let request_id = request_id.as_deref().unwrap_or("-");
                let route = request.match_pattern();
                let route = route.as_deref().unwrap_or("(no route)");
                let concrete = loggable_path(request.path());
                let path = extensions
                    .get::<LoggedPath>()
                    .map_or(concrete.as_ref(), |p| p.0.as_str());
                let method = request.method().as_str();
                let mut ids = extensions.get::<RequestIds>().cloned().unwrap_or_default();
                ids.fill_from_path(request.match_info());
                let line = Line {
                    method,
                    route,
                    path,
                    request_id,
                    ids: &ids,
                    started: at,
                };
                // A proxied stream says how it ended, in a line of its own when it ends (only
                // then is the line kept: every other request's is written from borrowed parts).
                match response.response().extensions().get::<DeferredLine>() {
                    Some(deferred) => deferred.set(RequestLine {
                        method: method.to_owned(),
                        route: route.to_owned(),
                        path: path.to_owned(),
                        request_id: request_id.to_owned(),
                        ids: ids.clone(),
                        started: at,
                    }),
                    None => log_request(&line, response.status().as_u16(), None),
                }
            }
        }
        DefaultRootSpanBuilder::on_request_end(span, outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_logged_target_keeps_names_and_allowlisted_values_only() {
        assert_eq!(loggable_target("/api/projects", ""), "/api/projects");
        assert_eq!(
            loggable_target("/v1/models", "key=keel_sk_abc&limit=5&orgId=o-1"),
            "/v1/models?key&limit=5&orgId=o-1"
        );
        assert_eq!(
            loggable_target("/x", "keel_sk_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789&a=%20b"),
            "/x?[redacted]&a"
        );
        assert_eq!(loggable_target("/x", "limit=a%20b"), "/x?limit=a+b");
    }

    #[test]
    fn a_logged_path_has_its_credentials_redacted_and_ids_are_plain() {
        assert_eq!(loggable_path("/api/training/jobs/j-1"), "/api/training/jobs/j-1");
        assert_eq!(
            loggable_path("/v1/keel_sk_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789/models"),
            "/v1/[redacted]/models"
        );
        assert_eq!(RequestIds::id("w-1.a:b"), "w-1.a:b");
        // A client's id that would forge or flood a line is not written as sent.
        assert_eq!(RequestIds::id("w\n2026 INFO forged"), "[unprintable]");
        assert_eq!(RequestIds::id("a\"b"), "[unprintable]");
        assert_eq!(RequestIds::id(&"x".repeat(129)), "[unprintable]");
        assert_eq!(RequestIds::id(""), "[unprintable]");
    }
}
