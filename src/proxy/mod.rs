//! The recording proxy: `POST /v1/chat/completions`. Point an OpenAI SDK at `<keel>/v1`
//! with the keel API key and three headers; keel forwards the (redacted) body to the chosen
//! provider with the caller's provider key, answers the provider's response unchanged (a
//! stream frame by frame, as it arrives), and records the call as a trace afterwards.

pub mod cache;
pub mod redact;
pub mod sse;

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::web::Bytes;
use actix_web::{web, HttpRequest, HttpResponse};
use chrono::Utc;
use entities::trace;
use futures_util::Stream;
use sea_orm::EntityTrait;
use serde_json::Value;

use crate::auth::keys;
use crate::error::{ApiError, ApiResult};
use crate::http::extract::RawBody;
use crate::state::AppState;
use crate::traces::writer::TraceWriter;
use cache::KeyOwner;
use redact::Redactor;
use sse::{CompletionAssembler, SseParser};

pub const PROVIDERS: &[&str] = &["openai", "anthropic", "openrouter", "google"];

const PROVIDER_HEADER: &str = "x-service-provider";
const PROVIDER_KEY_HEADER: &str = "x-service-provider-key";
const PROJECT_HEADER: &str = "x-service-project-id";
const RECORD_HEADER: &str = "x-service-record";

/// Request headers that travel upstream (besides the provider's `Authorization`). Nothing
/// of keel's, and no other credential, does.
const FORWARDED_REQUEST_HEADERS: &[&str] = &[
    "accept",
    "user-agent",
    "openai-organization",
    "openai-project",
    "openai-beta",
    "anthropic-version",
    "anthropic-beta",
    "http-referer",
    "x-title",
];

/// Response headers that describe one hop, not the answer.
const HOP_HEADERS: &[&str] = &[
    "connection",
    "keep-alive",
    "transfer-encoding",
    "content-length",
    "te",
    "trailer",
    "upgrade",
    "proxy-authenticate",
];

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(crate::http::resource("/v1/chat/completions").route(web::post().to(chat_completions)));
}

/// The providers: the client that calls them and each one's chat-completions endpoint,
/// parsed once at startup (a URL parse per call costs more than the rest of the request's
/// building).
///
/// Each HTTP worker calls through a client of its own ([`Upstreams::for_worker`]): a
/// pooled connection is served by a task on the worker that opened it, so a client shared
/// by the workers sends about half the calls through another worker's thread, two thread
/// wake-ups (there and back) per proxied call.
#[derive(Clone)]
pub struct Upstreams {
    client: reqwest::Client,
    /// `<base>/chat/completions` of each of [`PROVIDERS`], in that order.
    endpoints: std::sync::Arc<[reqwest::Url]>,
    connect_timeout: Duration,
    read_timeout: Duration,
}

impl Upstreams {
    /// Pooled, with a connect and a per-read timeout (no total timeout: a long stream is
    /// fine as long as it keeps talking). Redirects are not followed: a proxy answers the
    /// provider's 3xx as it is, like any other status.
    pub fn new(settings: &crate::config::Settings) -> anyhow::Result<Self> {
        let connect_timeout = Duration::from_millis(settings.proxy.connect_timeout_ms);
        let read_timeout = Duration::from_secs(settings.proxy.read_timeout_secs);
        let client = Self::client(connect_timeout, read_timeout)?;
        let p = &settings.providers;
        let endpoints = PROVIDERS
            .iter()
            .map(|provider| {
                let base = match *provider {
                    "anthropic" => &p.anthropic_url,
                    "openrouter" => &p.openrouter_url,
                    "google" => &p.google_url,
                    _ => &p.openai_url,
                };
                let endpoint = format!("{}/chat/completions", base.trim_end_matches('/'));
                reqwest::Url::parse(&endpoint)
                    .map_err(|e| anyhow::anyhow!("the {provider} base URL {base:?} is not a URL: {e}"))
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Self {
            client,
            endpoints,
            connect_timeout,
            read_timeout,
        })
    }

    fn client(connect_timeout: Duration, read_timeout: Duration) -> reqwest::Result<reqwest::Client> {
        reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            .read_timeout(read_timeout)
            .pool_max_idle_per_host(256)
            .tcp_nodelay(true)
            .redirect(reqwest::redirect::Policy::none())
            .build()
    }

    /// The same upstreams through a client (and connection pool) of their own, for one HTTP
    /// worker. The settings were proven by [`Upstreams::new`]; should a second build fail
    /// all the same, the worker shares this client.
    pub fn for_worker(&self) -> Self {
        match Self::client(self.connect_timeout, self.read_timeout) {
            Ok(client) => Self {
                client,
                ..self.clone()
            },
            Err(err) => {
                tracing::warn!(error = %err, "a worker's upstream client failed to build; it shares the first one");
                self.clone()
            }
        }
    }

    fn post(&self, provider: usize) -> reqwest::RequestBuilder {
        self.client.post(self.endpoints[provider].clone())
    }
}

fn header<'a>(req: &'a HttpRequest, name: &str) -> Option<&'a str> {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

fn missing(name: &str) -> ApiError {
    ApiError::BadRequest(format!("missing required header {name}"))
}

/// The keel API key of the call and its organization.
async fn authenticate(state: &AppState, req: &HttpRequest) -> ApiResult<(String, KeyOwner)> {
    let unauthorized = || {
        ApiError::Unauthorized("a valid keel API key is required (Authorization: Bearer keel_sk_...)".into())
    };
    let token = header(req, "authorization")
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
        .filter(|t| keys::looks_like_api_key(t))
        .ok_or_else(unauthorized)?;
    let hash = keys::hash_api_key(token);
    if let Some(owner) = state.proxy_cache.keys.get(&hash) {
        return Ok((token.to_owned(), owner));
    }
    let key = crate::auth::repo::active_api_key(&state.db, &hash)
        .await?
        .ok_or_else(unauthorized)?;
    let owner = KeyOwner {
        key_id: key.id,
        org_id: key.org_id,
    };
    state.proxy_cache.keys.insert(hash, owner.clone());
    Ok((token.to_owned(), owner))
}

/// The recording project: it must be the caller's organization's (404 otherwise; never created).
async fn recording_project(state: &AppState, org_id: &str, raw: &str) -> ApiResult<String> {
    let not_found = || ApiError::NotFound("project not found in the caller's organization".into());
    let project_id = uuid::Uuid::parse_str(raw)
        .map_err(|_| not_found())?
        .hyphenated()
        .to_string();
    let owner = match state.proxy_cache.projects.get(&project_id) {
        Some(owner) => owner,
        None => {
            let project = entities::project::Entity::find_by_id(project_id.clone())
                .one(&state.db)
                .await?
                .ok_or_else(not_found)?;
            state
                .proxy_cache
                .projects
                .insert(project_id.clone(), project.org_id.clone());
            project.org_id
        }
    };
    if owner == org_id {
        Ok(project_id)
    } else {
        Err(not_found())
    }
}

/// What a trace needs from the request; completed when the call ends.
struct TraceDraft {
    org_id: String,
    project_id: String,
    provider: &'static str,
    model: Option<String>,
    /// The body as forwarded (already redacted); made text on the writer's task.
    request: Bytes,
    stream: bool,
    started: Instant,
}

impl TraceDraft {
    fn finish(self, ending: Ending, response: Option<StoredResponse>) -> trace::Model {
        let usage = |key: &str| {
            response
                .as_ref()
                .and_then(|r| r.fields.get("usage"))
                .and_then(|u| u.get(key))
                .and_then(Value::as_i64)
        };
        let millis = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        trace::Model {
            // Time-ordered (UUIDv7): a batch of traces appends to the primary-key index
            // instead of landing on a random page of it per row.
            id: uuid::Uuid::now_v7().to_string(),
            org_id: self.org_id,
            project_id: self.project_id,
            provider: self.provider.to_owned(),
            model: self.model,
            request: String::from_utf8_lossy(&self.request).into_owned(),
            prompt_tokens: usage("prompt_tokens"),
            completion_tokens: usage("completion_tokens"),
            total_tokens: usage("total_tokens"),
            response: response.map(|r| r.text),
            status_code: i32::from(ending.status),
            stream: self.stream,
            complete: ending.complete,
            latency_ms: millis(ending.latency),
            ttfb_ms: ending.first_byte.map(millis),
            error: ending.error,
            created_at: ending.at,
        }
    }
}

/// A response as it is stored: its (redacted) JSON text, and a value holding at least its
/// top-level `usage`.
struct StoredResponse {
    text: String,
    fields: Value,
}

/// How a call ended, taken when it ends (the trace itself is built later).
struct Ending {
    status: u16,
    first_byte: Option<Duration>,
    latency: Duration,
    complete: bool,
    error: Option<String>,
    at: chrono::DateTime<Utc>,
}

/// The provider's answer as it was received.
enum Reply {
    Nothing,
    /// A JSON body (parsed, if it is JSON, by the trace writer).
    Body(Bytes),
    /// A stream, assembled into one `chat.completion`.
    Assembled(Value),
}

/// Everything needed to record a call once it ends.
struct Recording {
    draft: TraceDraft,
    writer: TraceWriter,
    secrets: [String; 2],
}

impl Recording {
    fn record(
        self,
        status: u16,
        reply: Reply,
        first_byte: Option<Duration>,
        complete: bool,
        error: Option<String>,
    ) {
        let ending = Ending {
            status,
            first_byte,
            latency: self.draft.started.elapsed(),
            complete,
            error,
            at: Utc::now(),
        };
        let Self {
            draft,
            writer,
            secrets,
        } = self;
        writer.record_pending(Box::new(move || {
            let redactor = Redactor::new(&[secrets[0].as_str(), secrets[1].as_str()]);
            let redacted = |mut value: Value| {
                redactor.redact(&mut value);
                StoredResponse {
                    text: value.to_string(),
                    fields: value,
                }
            };
            let response = match reply {
                Reply::Nothing => None,
                // A JSON answer with nothing to redact is stored as it came.
                Reply::Body(bytes) => match redactor.scan(&bytes) {
                    None => None,
                    Some(scan) if scan.needs_redaction => {
                        serde_json::from_slice::<Value>(&bytes).ok().map(redacted)
                    }
                    Some(scan) => String::from_utf8(Vec::from(bytes))
                        .ok()
                        .map(|text| StoredResponse {
                            text,
                            fields: scan.head,
                        }),
                },
                Reply::Assembled(value) => Some(redacted(value)),
            };
            draft.finish(ending, response)
        }));
    }
}

#[derive(utoipa::OpenApi)]
#[openapi(paths(chat_completions))]
pub struct Doc;

#[utoipa::path(post, path = "/v1/chat/completions", tag = "proxy", security(("bearer" = [])),
    params(
        ("X-Service-Provider" = String, Header, description = "openai, anthropic, openrouter or google"),
        ("X-Service-Provider-Key" = String, Header, description = "Your provider key, sent upstream as its bearer token; never stored"),
        ("X-Service-Project-Id" = Option<String>, Header, description = "Project to record into; required unless X-Service-Record is false"),
        ("X-Service-Record" = Option<String>, Header, description = "false: proxy without recording"),
    ),
    request_body(content = Object, description = "An OpenAI-compatible chat completion request"),
    responses(
        (status = 200, description = "The provider's answer, unchanged (JSON, or an SSE stream relayed frame by frame)"),
        (status = 400, description = "A required header is missing or the body is not a JSON object", body = crate::error::ErrorBody),
        (status = 401, description = "No valid keel API key", body = crate::error::ErrorBody),
        (status = 404, description = "The project is not the caller's organization's", body = crate::error::ErrorBody),
        (status = 502, description = "The provider is unreachable", body = crate::error::ErrorBody),
        (status = 504, description = "The provider timed out", body = crate::error::ErrorBody),
    ))]
pub async fn chat_completions(
    req: HttpRequest,
    state: web::Data<AppState>,
    upstreams: web::Data<Upstreams>,
    body: RawBody,
) -> ApiResult<HttpResponse> {
    let started = Instant::now();
    let (keel_key, owner) = authenticate(&state, &req).await?;
    let provider_name = header(&req, PROVIDER_HEADER).ok_or_else(|| missing("X-Service-Provider"))?;
    let provider_index = PROVIDERS
        .iter()
        .position(|p| p.eq_ignore_ascii_case(provider_name))
        .ok_or_else(|| {
            ApiError::BadRequest(format!(
                "header X-Service-Provider must be one of {}",
                PROVIDERS.join(", ")
            ))
        })?;
    let provider = PROVIDERS[provider_index];
    let provider_key = header(&req, PROVIDER_KEY_HEADER).ok_or_else(|| missing("X-Service-Provider-Key"))?;
    let record = !header(&req, RECORD_HEADER).is_some_and(|v| v.eq_ignore_ascii_case("false"));
    let project_id = if record {
        let raw = header(&req, PROJECT_HEADER).ok_or_else(|| missing("X-Service-Project-Id"))?;
        Some(recording_project(&state, &owner.org_id, raw).await?)
    } else {
        None
    };

    let not_an_object = || ApiError::BadRequest("the request body must be a JSON object".into());
    let redactor = Redactor::new(&[&keel_key, provider_key]);
    let scan = redactor
        .scan(&body.0)
        .filter(|scan| scan.object)
        .ok_or_else(not_an_object)?;
    // A body with nothing to redact travels as it came; otherwise it is parsed, redacted
    // and re-serialized. Either way `request` holds its (redacted) model and stream fields.
    let (upstream_body, request) = if scan.needs_redaction {
        let mut request: Value = serde_json::from_slice(&body.0).map_err(|_| not_an_object())?;
        redactor.redact(&mut request);
        let bytes = serde_json::to_vec(&request).map_err(anyhow::Error::from)?;
        (Bytes::from(bytes), request)
    } else {
        (body.0, scan.head)
    };
    let stream = request.get("stream").and_then(Value::as_bool) == Some(true);

    let recording = project_id.map(|project_id| Recording {
        draft: TraceDraft {
            org_id: owner.org_id.clone(),
            project_id,
            provider,
            model: request
                .get("model")
                .and_then(Value::as_str)
                .map(|m| m.chars().take(200).collect()),
            // The forwarded body: the caller's bytes, or their redacted re-serialization.
            request: upstream_body.clone(),
            stream,
            started,
        },
        writer: state.traces.clone(),
        secrets: [keel_key.clone(), provider_key.to_owned()],
    });

    let mut upstream = upstreams
        .post(provider_index)
        .bearer_auth(provider_key)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(upstream_body);
    for name in FORWARDED_REQUEST_HEADERS {
        if let Some(value) = req.headers().get(*name) {
            upstream = upstream.header(*name, value.as_bytes());
        }
    }
    let response = match upstream.send().await {
        Ok(response) => response,
        Err(err) => {
            let (status, detail) = upstream_failure(&err, provider);
            if let Some(recording) = recording {
                recording.record(status.as_u16(), Reply::Nothing, None, false, Some(detail.clone()));
            }
            return Err(ApiError::Status(status, detail));
        }
    };
    let first_byte = started.elapsed();
    let status = StatusCode::from_u16(response.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut reply = HttpResponse::build(status);
    for (name, value) in response.headers() {
        if HOP_HEADERS.contains(&name.as_str()) {
            continue;
        }
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_str().as_bytes()),
            HeaderValue::from_bytes(value.as_bytes()),
        ) {
            reply.append_header((name, value));
        }
    }
    let is_event_stream = response
        .headers()
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));

    if stream && status.is_success() && is_event_stream {
        let relay = Relay {
            upstream: Box::pin(response.bytes_stream()),
            parser: SseParser::default(),
            assembler: CompletionAssembler::default(),
            recording,
            status: status.as_u16(),
            first_byte,
            finished: false,
        };
        return Ok(reply.streaming(relay));
    }

    match response.bytes().await {
        Ok(bytes) => {
            if let Some(recording) = recording {
                let error = (!status.is_success()).then(|| format!("upstream answered {status}"));
                recording.record(
                    status.as_u16(),
                    Reply::Body(bytes.clone()),
                    Some(first_byte),
                    true,
                    error,
                );
            }
            Ok(reply.body(bytes))
        }
        Err(err) => {
            let (status, detail) = upstream_failure(&err, provider);
            if let Some(recording) = recording {
                recording.record(
                    status.as_u16(),
                    Reply::Nothing,
                    Some(first_byte),
                    false,
                    Some(detail.clone()),
                );
            }
            Err(ApiError::Status(status, detail))
        }
    }
}

/// 504 when the provider stayed silent too long, else 502; the detail names no credential.
fn upstream_failure(err: &reqwest::Error, provider: &str) -> (StatusCode, String) {
    let status = if err.is_timeout() {
        StatusCode::GATEWAY_TIMEOUT
    } else {
        StatusCode::BAD_GATEWAY
    };
    (
        status,
        crate::http::describe_call_failure(err, &format!("upstream {provider}")),
    )
}

/// A provider's SSE stream passed to the client chunk by chunk, as it arrives (the client's
/// pace pulls it: backpressure), read on the side to assemble the trace. Dropped before its
/// end (the client went away), it drops the upstream call and records what it saw,
/// marked incomplete.
struct Relay {
    upstream: Pin<Box<dyn Stream<Item = reqwest::Result<Bytes>>>>,
    parser: SseParser,
    assembler: CompletionAssembler,
    recording: Option<Recording>,
    status: u16,
    first_byte: Duration,
    finished: bool,
}

impl Relay {
    fn record(&mut self, complete: bool, error: Option<String>) {
        self.finished = true;
        if let Some(recording) = self.recording.take() {
            let assembler = &mut self.assembler;
            self.parser.finish(&mut |data| assembler.on_data(data));
            let error = error.or_else(|| self.assembler.error().map(|e| format!("upstream error: {e}")));
            let complete = complete && self.assembler.is_done();
            recording.record(
                self.status,
                Reply::Assembled(self.assembler.completion()),
                Some(self.first_byte),
                complete,
                error,
            );
        }
    }
}

impl Stream for Relay {
    type Item = reqwest::Result<Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        match this.upstream.as_mut().poll_next(cx) {
            Poll::Ready(Some(Ok(bytes))) => {
                if this.recording.is_some() {
                    let assembler = &mut this.assembler;
                    this.parser.push(&bytes, &mut |data| assembler.on_data(data));
                }
                Poll::Ready(Some(Ok(bytes)))
            }
            Poll::Ready(Some(Err(err))) => {
                this.record(
                    false,
                    Some(format!(
                        "upstream stream broke: {}",
                        upstream_failure(&err, "provider").1
                    )),
                );
                Poll::Ready(Some(Err(err)))
            }
            Poll::Ready(None) => {
                this.record(true, None);
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if !self.finished {
            self.record(
                false,
                Some("the client disconnected before the stream ended".into()),
            );
        }
    }
}
