//! The recording proxy: `POST /v1/chat/completions`. Point an OpenAI SDK at `<keel>/v1`
//! with the keel API key and three headers; keel forwards the (redacted) body to the chosen
//! provider with the caller's provider key, answers the provider's response unchanged (a
//! stream frame by frame, as it arrives), and records the call as a trace afterwards.

pub mod meter;
pub mod redact;
pub mod relay;
pub mod sse;
mod stuck;
pub use crate::upstream;
pub mod usage;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::web::Bytes;
use actix_web::{web, HttpRequest, HttpResponse};
use chrono::Utc;
use entities::trace;
use futures_util::Stream;
use serde_json::Value;

use crate::error::{ApiError, ApiResult, Code};
use crate::http::extract::DeferredBody;
use crate::http::CallFailure;
use crate::state::AppState;
use keel_core::auth::keys;
use keel_core::domain::{OrgId, ProjectId, TraceId};
use keel_core::proxy::cache::KeyOwner;
use keel_core::traces::writer::TraceWriter;
use redact::Redactor;
use sse::{CompletionAssembler, SseParser};
use upstream::Answer;
pub use upstream::{UpstreamConfig, Upstreams};

pub use keel_core::domain::PROVIDERS;

// Header names are made once: a lookup by a `&str` name makes (and, for a name that is not
// a standard header, allocates) a `HeaderName` on every call.
static PROVIDER_HEADER: HeaderName = HeaderName::from_static("x-service-provider");
static PROVIDER_KEY_HEADER: HeaderName = HeaderName::from_static("x-service-provider-key");
static PROJECT_HEADER: HeaderName = HeaderName::from_static("x-service-project-id");
static RECORD_HEADER: HeaderName = HeaderName::from_static("x-service-record");

/// Request headers that travel upstream (besides the provider's `Authorization` and the
/// body's `Content-Type`), as actix names them and as the upstream client does. Nothing of
/// keel's, and no other credential, does.
static FORWARDED_REQUEST_HEADERS: [(HeaderName, http::HeaderName); 9] = {
    const fn both(name: &'static str) -> (HeaderName, http::HeaderName) {
        (HeaderName::from_static(name), http::HeaderName::from_static(name))
    }
    [
        both("accept"),
        both("user-agent"),
        both("openai-organization"),
        both("openai-project"),
        both("openai-beta"),
        both("anthropic-version"),
        both("anthropic-beta"),
        both("http-referer"),
        both("x-title"),
    ]
};

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

fn header<'a>(req: &'a HttpRequest, name: &HeaderName) -> Option<&'a str> {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
}

fn missing(name: &str) -> ApiError {
    ApiError::Coded(Code::MissingHeader, format!("missing required header {name}"))
}

/// The provider named by `X-Service-Provider` (its index in [`PROVIDERS`]) and the caller's
/// key for it (`X-Service-Provider-Key`); 400 naming the header that is missing or wrong.
fn provider_of(req: &HttpRequest) -> ApiResult<(usize, &str)> {
    let name = header(req, &PROVIDER_HEADER).ok_or_else(|| missing("X-Service-Provider"))?;
    let index = PROVIDERS
        .iter()
        .position(|p| p.eq_ignore_ascii_case(name))
        .ok_or_else(|| {
            ApiError::Coded(
                Code::InvalidHeader,
                format!(
                    "header X-Service-Provider must be one of {}",
                    PROVIDERS.join(", ")
                ),
            )
        })?;
    let key = header(req, &PROVIDER_KEY_HEADER).ok_or_else(|| missing("X-Service-Provider-Key"))?;
    Ok((index, key))
}

/// What travels upstream besides the body: the provider key as the bearer token and the
/// caller's headers of [`FORWARDED_REQUEST_HEADERS`]; nothing of keel's.
fn upstream_headers(req: &HttpRequest, provider_key: &str, headers: &mut http::HeaderMap) -> ApiResult<()> {
    let mut authorization = http::HeaderValue::try_from(format!("Bearer {provider_key}")).map_err(|_| {
        ApiError::Coded(
            Code::InvalidHeader,
            "header X-Service-Provider-Key is not a valid header value".into(),
        )
    })?;
    authorization.set_sensitive(true);
    headers.insert(http::header::AUTHORIZATION, authorization);
    for (name, upstream_name) in &FORWARDED_REQUEST_HEADERS {
        if let Some(value) = req.headers().get(name) {
            if let Ok(value) = http::HeaderValue::from_bytes(value.as_bytes()) {
                headers.insert(upstream_name.clone(), value);
            }
        }
    }
    // The provider sees the request's trace (when keel's spans are exported).
    crate::telemetry::otlp::inject_current(headers);
    Ok(())
}

/// The caller's answer as the provider's head has it: its status and headers (not the
/// hop-by-hop ones).
fn relayed_head(head: &http::response::Parts) -> (StatusCode, actix_web::HttpResponseBuilder) {
    let status = StatusCode::from_u16(head.status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let mut reply = HttpResponse::build(status);
    for (name, value) in &head.headers {
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
    (status, reply)
}

/// The keel API key of the call and its organization.
async fn authenticate<'r>(state: &AppState, req: &'r HttpRequest) -> ApiResult<(&'r str, Arc<KeyOwner>)> {
    let unauthorized = || {
        ApiError::Coded(
            Code::InvalidApiKey,
            "a valid keel API key is required (Authorization: Bearer keel_sk_...)".into(),
        )
    };
    let token = header(req, &actix_web::http::header::AUTHORIZATION)
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
        .filter(|t| keys::looks_like_api_key(t))
        .ok_or_else(unauthorized)?;
    let digest = keys::api_key_digest(token);
    let load = || async {
        let key = keel_core::auth::service::api_key_by_hash(&state.db, &hex::encode(digest)).await?;
        Ok::<_, sea_orm::DbErr>(key.map(|key| {
            Arc::new(KeyOwner {
                settings: keel_core::keys::KeySettings::of(&key),
                key_id: key.id,
                org_id: key.org_id,
            })
        }))
    };
    let owner = state
        .proxy_cache
        .keys
        .get_or_load(&digest, load)
        .await
        .map_err(ApiError::database)?
        .ok_or_else(unauthorized)?;
    crate::telemetry::note_api_key(req, owner.key_id.as_str(), owner.org_id.as_str());
    // A key held by the cache may have expired since it was read.
    if owner.settings.expires_at.is_some() && owner.settings.expired(Utc::now()) {
        return Err(unauthorized());
    }
    if !owner.settings.scopes.inference {
        return Err(ApiError::Coded(
            Code::ScopeNotAllowed,
            "this API key's scopes do not include inference (the proxy and the relay)".into(),
        ));
    }
    Ok((token, owner))
}

/// Lets the call through the key's `models` list and limits (every key's call is counted);
/// a stream's permit is held until it ends.
async fn admit(
    state: &AppState,
    owner: &KeyOwner,
    model: keel_core::keys::service::CallModel<'_>,
    stream: bool,
) -> ApiResult<Option<keel_core::keys::StreamPermit>> {
    use keel_core::keys::service::{admit, Denied};
    let now = Utc::now();
    if owner.settings.is_plain() {
        state.limiter.usage().request(&owner.key_id, now);
        return Ok(None);
    }
    admit(&state.limiter, &owner.key_id, &owner.settings, model, stream, now)
        .await
        .map_err(|denied| match denied {
            Denied::ModelNotAllowed(_) | Denied::ModelUnknown => {
                ApiError::Coded(Code::ModelNotAllowed, denied.to_string())
            }
            Denied::Limited(limited) => {
                if let keel_core::keys::limiter::Limited::Refused(refusal) = &limited {
                    state.metrics.limited(refusal.limit);
                }
                limited.into()
            }
        })
}

/// 400 for a JSON body that names a top-level member twice: keel would check one `model`
/// and the provider might run the other.
fn refuse_duplicate(scan: &redact::Scan) -> ApiResult<()> {
    match &scan.duplicate {
        Some(name) => Err(ApiError::BadRequest(format!(
            "the request body names {:?} twice; a JSON body's top-level names must be unique",
            name.chars().take(100).collect::<String>()
        ))),
        None => Ok(()),
    }
}

/// A key with a `models` list: every model of OpenRouter's fallback list (`models`) must be
/// on it too (403 `model_not_allowed`), as the provider may run any of them.
fn fallbacks_allowed(owner: &KeyOwner, request: &Value) -> ApiResult<()> {
    if owner.settings.models.is_none() {
        return Ok(());
    }
    let Some(fallbacks) = request.get("models") else {
        return Ok(());
    };
    let names: Vec<&str> = match fallbacks.as_array() {
        Some(items) => items.iter().map(|m| m.as_str().unwrap_or_default()).collect(),
        None => vec![""],
    };
    match names.iter().find(|name| !owner.settings.allows_model(name)) {
        Some(name) => Err(ApiError::Coded(
            Code::ModelNotAllowed,
            format!(
                "this API key may not call model {:?} (named in `models`)",
                name.chars().take(200).collect::<String>()
            ),
        )),
        None => Ok(()),
    }
}

/// The recording project: it must be the caller's organization's (404 otherwise; never created).
async fn recording_project(state: &AppState, org_id: &OrgId, raw: &str) -> ApiResult<ProjectId> {
    let not_found = || {
        ApiError::Coded(
            Code::ProjectNotFound,
            "project not found in the caller's organization".into(),
        )
    };
    let project_id = ProjectId::parse(raw).map_err(|_| not_found())?;
    let load = || async { keel_core::projects::service::owner_of(&state.db, &project_id).await };
    let owner = state
        .proxy_cache
        .projects
        .get_or_load(&project_id, load)
        .await
        .map_err(ApiError::database)?
        .ok_or_else(not_found)?;
    if owner == *org_id {
        Ok(project_id)
    } else {
        Err(not_found())
    }
}

/// What a trace needs from the request; completed when the call ends.
struct TraceDraft {
    /// Chosen when the call starts (the request's log line names it).
    id: TraceId,
    org_id: OrgId,
    project_id: ProjectId,
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
        // A stream whose provider sent no usage: estimated from the text, and said so.
        let estimated = match (&response, usage("prompt_tokens")) {
            (Some(r), None) if self.stream => Some(usage::estimate(&self.request, &r.fields)),
            _ => None,
        };
        let (prompt_tokens, completion_tokens, total_tokens) = match estimated {
            Some((prompt, completion)) => (Some(prompt), Some(completion), Some(prompt + completion)),
            None => (
                usage("prompt_tokens"),
                usage("completion_tokens"),
                usage("total_tokens"),
            ),
        };
        // What the trace is found and shown by, from what is stored (redacted), read without
        // building either text as a value.
        let indexed =
            keel_core::traces::search::index_text(&self.request, response.as_ref().map(|r| r.text.as_str()));
        trace::Model {
            id: self.id,
            org_id: self.org_id,
            project_id: self.project_id,
            provider: self.provider.to_owned(),
            model: self.model,
            request: String::from_utf8_lossy(&self.request).into_owned(),
            prompt_tokens,
            completion_tokens,
            total_tokens,
            usage_estimated: estimated.is_some(),
            response: response.map(|r| r.text),
            status_code: i32::from(ending.status),
            stream: self.stream,
            complete: ending.complete,
            latency_ms: millis(ending.latency),
            ttfb_ms: ending.first_byte.map(millis),
            error: ending.error,
            created_at: ending.at,
            search_text: Some(indexed.search_text),
            preview_input: indexed.preview_input,
            preview_output: indexed.preview_output,
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
    /// Where the call's tokens are counted for its key (`tokensPerDay`, today's usage).
    meter: meter::Meter,
    /// The provider's usage was counted on the call's path as its answer ended; the trace
    /// writer counts only an estimate (a stream without usage), or, for a key without a
    /// `tokensPerDay` to hold, a JSON answer's usage off the path.
    counted: bool,
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
        let mut ending = Ending {
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
            meter,
            counted,
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
            let body = matches!(reply, Reply::Body(_));
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
            // An answer that is an error object, whatever its status, is the trace's error
            // (its `error` read by the scan that stores it: `Scan::HEAD`).
            if body && ending.error.is_none() {
                if let Some(error) = response
                    .as_ref()
                    .and_then(|r| r.fields.get("error"))
                    .and_then(upstream_error)
                {
                    ending.error = Some(error);
                    ending.complete = false;
                }
            }
            let trace = draft.finish(ending, response);
            if !counted || trace.usage_estimated {
                meter.count(trace.prompt_tokens.unwrap_or(0) + trace.completion_tokens.unwrap_or(0));
            }
            trace
        }));
    }
}

/// The providers the proxy relays to (the schema of `X-Service-Provider`; any letter case).
#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
#[allow(dead_code)]
enum ProviderHeader {
    Openai,
    Anthropic,
    Openrouter,
    Google,
}

/// Proxy a chat completion
///
/// OpenAI-compatible: relays the request to the provider named by `X-Service-Provider` with the
/// caller's own provider key, and answers the provider's status, headers and body unchanged
/// (streams unbuffered). The exchange is recorded, redacted, into the project of `X-Service-Project-Id`
/// unless `X-Service-Record: false`.
#[utoipa::path(post, path = "/v1/chat/completions", tag = "proxy", security(("apiKey" = [])),
    params(
        ("X-Service-Provider" = inline(ProviderHeader), Header, description = "openai, anthropic, openrouter or google"),
        ("X-Service-Provider-Key" = String, Header, min_length = 1, description = "Your provider key, sent upstream as its bearer token; never stored"),
        ("X-Service-Project-Id" = String, Header, format = Uuid, description = "Project to record into (a project of the key's organization); may be left out only with `X-Service-Record: false`"),
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
    body: DeferredBody,
) -> HttpResponse {
    // Errors keel answers itself carry OpenAI's shape beside `detail` (the SDKs show it).
    proxy_chat(req, state, upstreams, body)
        .await
        .unwrap_or_else(|err| err.openai_response())
}

async fn proxy_chat(
    req: HttpRequest,
    state: web::Data<AppState>,
    upstreams: web::Data<Upstreams>,
    body: DeferredBody,
) -> ApiResult<HttpResponse> {
    let started = Instant::now();
    let (keel_key, owner) = authenticate(&state, &req).await?;
    let (provider_index, provider_key) = provider_of(&req)?;
    let provider = PROVIDERS[provider_index];
    let record = !header(&req, &RECORD_HEADER).is_some_and(|v| v.eq_ignore_ascii_case("false"));
    let project_id = if record {
        let raw = header(&req, &PROJECT_HEADER).ok_or_else(|| missing("X-Service-Project-Id"))?;
        Some(recording_project(&state, &owner.org_id, raw).await?)
    } else {
        None
    };
    // Read only now: a caller without a valid key or project waited for nothing.
    let body = body.read().await?;

    let not_an_object = || ApiError::BadRequest("the request body must be a JSON object".into());
    let redactor = Redactor::new(&[keel_key, provider_key]);
    let scan = redactor
        .scan(&body)
        .filter(|scan| scan.object)
        .ok_or_else(not_an_object)?;
    refuse_duplicate(&scan)?;
    // A body with nothing to redact travels as it came; otherwise it is parsed, redacted
    // and re-serialized. Either way `request` holds its (redacted) model and stream fields.
    let (upstream_body, request) = if scan.needs_redaction {
        let mut request: Value = serde_json::from_slice(&body).map_err(|_| not_an_object())?;
        redactor.redact(&mut request);
        let bytes = serde_json::to_vec(&request).map_err(anyhow::Error::from)?;
        (Bytes::from(bytes), request)
    } else {
        (body, scan.head)
    };
    let stream = request.get("stream").and_then(Value::as_bool) == Some(true);
    let model = request.get("model").and_then(Value::as_str);
    fallbacks_allowed(&owner, &request)?;
    let permit = admit(
        &state,
        &owner,
        model.map_or(
            keel_core::keys::service::CallModel::Unnamed,
            keel_core::keys::service::CallModel::Named,
        ),
        stream,
    )
    .await?;
    // Every streamed call asks the provider for its usage (most SDK streams do not), so the
    // trace has its tokens; when the client did not ask, the usage chunk is taken out of
    // what it receives, which is then what the provider would have sent it.
    let client_asked_usage =
        request.get("stream_options").and_then(|o| o.get("include_usage")) == Some(&Value::Bool(true));
    let strip_usage = stream && !client_asked_usage;
    let (upstream_body, forwarded) = if strip_usage {
        (asking_for_usage(&upstream_body, &request)?, upstream_body)
    } else {
        (upstream_body.clone(), upstream_body)
    };

    let meter = meter::Meter::new(state.limiter.usage().clone(), owner.clone());
    // A key with a day's tokens to hold has a JSON answer's usage read on the path (else
    // the trace writer reads it, off the path); unrecorded calls are read on the path.
    let json_on_path = owner.settings.limits.tokens_per_day.is_some() || project_id.is_none();
    let recording = project_id.map(|project_id| Recording {
        draft: TraceDraft {
            // Time-ordered (UUIDv7): a batch of traces appends to the primary-key index
            // instead of landing on a random page of it per row.
            id: TraceId::time_ordered(),
            org_id: owner.org_id.clone(),
            project_id,
            provider,
            // A NUL (`\u0000` in the JSON) as U+FFFD: PostgreSQL's text cannot hold it.
            model: request.get("model").and_then(Value::as_str).map(|m| {
                m.chars()
                    .take(200)
                    .map(|c| if c == '\0' { '\u{fffd}' } else { c })
                    .collect()
            }),
            // The caller's bytes, or their redacted re-serialization (without the usage
            // request keel adds).
            request: forwarded,
            stream,
            started,
        },
        writer: state.traces.clone(),
        secrets: [keel_key.to_owned(), provider_key.to_owned()],
        meter: meter.clone(),
        counted: json_on_path,
    });
    if let Some(recording) = &recording {
        crate::telemetry::note_trace(&req, recording.draft.id.as_str());
    }

    let mut upstream = http::Request::new(http_body_util::Full::new(upstream_body));
    *upstream.method_mut() = http::Method::POST;
    *upstream.uri_mut() = upstreams.endpoint(provider_index).clone();
    let headers = upstream.headers_mut();
    upstream_headers(&req, provider_key, headers)?;
    headers.insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    let sent_at = Instant::now();
    let Answer {
        head,
        body: upstream_body,
    } = match upstreams.send(upstream).await {
        Ok(answer) => answer,
        Err(err) => {
            state.metrics.upstream_error(provider_index, None);
            let (code, detail) = upstream_failure(err, provider);
            if let Some(recording) = recording {
                recording.record(
                    code.status().as_u16(),
                    Reply::Nothing,
                    None,
                    false,
                    Some(detail.clone()),
                );
            }
            return Err(ApiError::Coded(code, detail));
        }
    };
    let first_byte = started.elapsed();
    let (status, mut reply) = relayed_head(&head);
    state
        .metrics
        .upstream_error(provider_index, Some(status.as_u16()));
    let content_type = head
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    // Media types are case-insensitive (`Text/Event-Stream`).
    let is_event_stream = content_type
        .split(';')
        .next()
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("text/event-stream"));

    // Any successful answer to a streamed request goes out as it arrives, whatever its
    // content type says: an event stream is read for the trace, anything else kept up to a
    // bound.
    if stream && status.is_success() {
        // A stream's provider part is its time to headers; keel's is what came before.
        state
            .metrics
            .proxied(provider_index, sent_at.elapsed(), started.elapsed());
        let relay = Relay {
            upstream: upstream_body,
            parser: SseParser::default(),
            assembler: CompletionAssembler::default(),
            sse: is_event_stream,
            strip_usage: strip_usage && is_event_stream,
            pending: bytes::BytesMut::new(),
            other: (!is_event_stream).then(|| OtherBody {
                content_type: content_type.chars().take(100).collect(),
                kept: Vec::new(),
            }),
            recording: recording.map(|r| Recording { counted: true, ..r }),
            meter: Some(meter),
            status: status.as_u16(),
            first_byte,
            finished: false,
            abort: None,
            client: None,
            stuck: None,
            failures: StreamFailures {
                metrics: state.metrics.clone(),
                provider: provider_index,
                request_id: request_id_of(&req),
                line: None,
            },
            _permit: permit,
        };
        let mut relay = relay;
        let line = crate::telemetry::DeferredLine::default();
        reply.extensions_mut().insert(line.clone());
        relay.failures.line = Some(line);
        relay.client = crate::http::client::ClientPresence::of(&req).watch();
        let write_timeout = state.settings.proxy.client_write_timeout_secs;
        if write_timeout > 0 {
            relay.stuck = relay
                .client
                .as_ref()
                .map(|c| stuck::watch(c.closer(), Duration::from_secs(write_timeout)));
        }
        return Ok(reply.streaming(relay));
    }

    let collected = upstream_body.collect().await;
    state
        .metrics
        .proxied(provider_index, sent_at.elapsed(), started.elapsed());
    match collected {
        Ok(bytes) => {
            if json_on_path {
                if let Some(tokens) = meter::tokens_in_json(&bytes) {
                    meter.count(tokens);
                }
            }
            if let Some(recording) = recording {
                // A 200 with an error body (a streamed request answered in JSON, say) is
                // found on the writer's task, off this path (`Recording::record`).
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
            state.metrics.upstream_error(provider_index, None);
            let (code, detail) = upstream_failure(err, provider);
            if let Some(recording) = recording {
                recording.record(
                    code.status().as_u16(),
                    Reply::Nothing,
                    Some(first_byte),
                    false,
                    Some(detail.clone()),
                );
            }
            Err(ApiError::Coded(code, detail))
        }
    }
}

/// `body` (a streamed request's JSON object) asking the provider for its usage:
/// `"stream_options": {"include_usage": true}` put first when the body has no
/// `stream_options` (its bytes otherwise as they are), else set in a re-serialization.
fn asking_for_usage(body: &Bytes, request: &Value) -> ApiResult<Bytes> {
    const ASK: &[u8] = br#""stream_options":{"include_usage":true},"#;
    if request.get("stream_options").is_none() {
        if let Some(open) = body.iter().position(|b| *b == b'{') {
            let mut asked = Vec::with_capacity(body.len() + ASK.len());
            asked.extend_from_slice(&body[..=open]);
            asked.extend_from_slice(ASK);
            asked.extend_from_slice(&body[open + 1..]);
            return Ok(Bytes::from(asked));
        }
    }
    let mut value: Value = serde_json::from_slice(body)
        .map_err(|_| ApiError::BadRequest("the request body must be a JSON object".into()))?;
    if let Some(object) = value.as_object_mut() {
        let options = object
            .entry("stream_options")
            .or_insert_with(|| Value::Object(serde_json::Map::new()));
        if !options.is_object() {
            *options = Value::Object(serde_json::Map::new());
        }
        options["include_usage"] = Value::Bool(true);
    }
    Ok(Bytes::from(
        serde_json::to_vec(&value).map_err(anyhow::Error::from)?,
    ))
}

/// `upstream error: <message>` when a JSON answer is an object with an `error` member.
fn error_in_body(bytes: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct WithError {
        error: Option<Value>,
    }
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace())?;
    if *first != b'{' {
        return None;
    }
    upstream_error(&serde_json::from_slice::<WithError>(bytes).ok()?.error?)
}

/// `upstream error: <message>` of a provider's `error` member (`None` when it is null).
fn upstream_error(error: &Value) -> Option<String> {
    if error.is_null() {
        return None;
    }
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .map_or_else(|| error.to_string(), str::to_owned);
    Some(format!(
        "upstream error: {}",
        message.chars().take(500).collect::<String>()
    ))
}

/// 504 when the provider stayed silent too long, else 502. The detail names the provider
/// only: where keel reaches it (an internal address, a proxy) is the operator's to know, and
/// is in the log line of the failure.
fn upstream_failure(err: CallFailure, provider: &str) -> (Code, String) {
    let code = match err {
        CallFailure::Timeout => Code::UpstreamTimeout,
        CallFailure::Unreachable | CallFailure::Failed => Code::UpstreamUnreachable,
    };
    (code, err.describe(&format!("upstream {provider}")))
}

/// A provider's answer to a streamed request passed to the client chunk by chunk, as it
/// arrives (the client's pace pulls it: backpressure). An event stream is read on the side
/// to assemble the trace. Dropped before its end (the client went away), it drops the
/// upstream call and records what it saw, marked incomplete.
///
/// When the provider's stream fails in its middle (cut, however it was delimited, or silent
/// past the read timeout), the client gets one OpenAI-shaped error event and then an aborted
/// body (never `[DONE]`, never a clean end), so every client raises; the provider's own
/// frames are never altered, and the trace stores the cause.
struct Relay {
    upstream: upstream::Body,
    parser: SseParser,
    assembler: CompletionAssembler,
    /// The answer is an event stream (read for the trace).
    sse: bool,
    /// keel asked for the usage chunk the client did not: it is taken out of the stream.
    strip_usage: bool,
    /// While stripping: the bytes of an event not yet whole (sent once it is).
    pending: bytes::BytesMut,
    /// The answer is anything else: what is kept of it.
    other: Option<OtherBody>,
    recording: Option<Recording>,
    /// Where the stream's tokens are counted when it ends (taken then).
    meter: Option<meter::Meter>,
    status: u16,
    first_byte: Duration,
    finished: bool,
    /// Set once a failure's error event was sent: the body is aborted once the event has
    /// had time to leave (actix drops its unsent buffer when a body fails).
    abort: Option<(CallFailure, Pin<Box<tokio::time::Sleep>>)>,
    /// The client's connection, watched while the provider is silent.
    client: Option<crate::http::client::ClientWatch>,
    /// Whether the client takes what it is given (`proxy.client_write_timeout_secs`).
    stuck: Option<std::sync::Arc<stuck::Watch>>,
    failures: StreamFailures,
    /// The stream's place under its key's `concurrentStreams`, given back when it ends.
    _permit: Option<keel_core::keys::StreamPermit>,
}

/// A non-event-stream answer to a streamed request: its content type and its first
/// [`KEPT_OTHER_BYTES`] bytes, for the trace.
struct OtherBody {
    content_type: String,
    kept: Vec<u8>,
}

/// How long the error event of a failed stream has to leave before the body is aborted.
const ABORT_AFTER: Duration = Duration::from_millis(50);

/// Of an answer to a streamed request that is not an event stream, this much is kept for
/// the trace (the client gets all of it, as it arrives).
const KEPT_OTHER_BYTES: usize = 1 << 20;

/// Where a stream's failure is counted and said.
struct StreamFailures {
    metrics: keel_core::metrics::Metrics,
    provider: usize,
    request_id: String,
    /// The request's log line, written when the stream ends (saying how).
    line: Option<crate::telemetry::DeferredLine>,
}

/// keel's request id of `req` (the one its log lines carry).
fn request_id_of(req: &HttpRequest) -> String {
    actix_web::HttpMessage::extensions(req)
        .get::<tracing_actix_web::RequestId>()
        .map(ToString::to_string)
        .unwrap_or_default()
}

impl Relay {
    fn record(&mut self, complete: bool, error: Option<String>) {
        self.finished = true;
        if let Some(line) = self.failures.line.take() {
            line.log(self.status, error.as_deref());
        }
        if self.other.is_none() {
            let assembler = &mut self.assembler;
            self.parser.finish(&mut |data| assembler.on_data(data));
        }
        // Counted before the stream's end reaches the client.
        if let Some(meter) = self.meter.take() {
            let tokens = match &self.other {
                Some(other) => meter::tokens_in_json(&other.kept),
                None => self.assembler.usage().and_then(meter::tokens_of),
            };
            if let Some(tokens) = tokens {
                meter.count(tokens);
            }
        }
        if let Some(recording) = self.recording.take() {
            if let Some(other) = self.other.take() {
                let bytes = Bytes::from(other.kept);
                let error = error.or_else(|| error_in_body(&bytes)).or_else(|| {
                    serde_json::from_slice::<serde::de::IgnoredAny>(&bytes)
                        .is_err()
                        .then(|| {
                            format!(
                                "the provider answered a streamed request with {:?}, not an event stream",
                                other.content_type
                            )
                        })
                });
                let complete = complete && error.is_none();
                recording.record(
                    self.status,
                    Reply::Body(bytes),
                    Some(self.first_byte),
                    complete,
                    error,
                );
                return;
            }
            let error = error.or_else(|| self.assembler.error().map(|e| format!("upstream error: {e}")));
            // An error frame, even one followed by `[DONE]`, is no complete answer.
            let complete = complete && self.assembler.is_done() && error.is_none();
            recording.record(
                self.status,
                Reply::Assembled(self.assembler.completion()),
                Some(self.first_byte),
                complete,
                error,
            );
        }
    }

    /// The provider's stream failed (`cause`): recorded, counted and logged; the client gets
    /// an error event now and an aborted body at the next poll.
    fn fail(&mut self, failure: CallFailure, cause: String) -> Poll<Option<Result<Bytes, CallFailure>>> {
        // An event the provider left unfinished is ended first, so the error event is one
        // of its own (a partial frame was already sent as it came).
        let partial = self.parser.has_partial();
        self.record(false, Some(cause.clone()));
        self.failures.metrics.stream_error(self.failures.provider);
        tracing::warn!(
            provider = PROVIDERS[self.failures.provider],
            request_id = %self.failures.request_id,
            cause = %cause,
            "a proxied stream failed in its middle; the client got an error event"
        );
        if !self.sse {
            return Poll::Ready(Some(Err(failure)));
        }
        self.abort = Some((failure, Box::pin(tokio::time::sleep(ABORT_AFTER))));
        let event = serde_json::json!({"error": {
            "message": cause,
            "type": "upstream_error",
            "code": Code::StreamInterrupted,
        }});
        let mut frame = Vec::with_capacity(200);
        if partial {
            frame.extend_from_slice(b"\n\n");
        }
        frame.extend_from_slice(b"data: ");
        frame.extend_from_slice(event.to_string().as_bytes());
        frame.extend_from_slice(b"\n\n");
        Poll::Ready(Some(Ok(Bytes::from(frame))))
    }
}

impl Stream for Relay {
    type Item = Result<Bytes, CallFailure>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Some((failure, after)) = &mut this.abort {
            // Pending meanwhile: actix writes out what it holds (the error event).
            ready!(after.as_mut().poll(cx));
            let failure = *failure;
            this.abort = None;
            return Poll::Ready(Some(Err(failure)));
        }
        if this.finished {
            return Poll::Ready(None);
        }
        if let Some(stuck) = &this.stuck {
            stuck.polled();
        }
        loop {
            match Pin::new(&mut this.upstream).poll_next(cx) {
                Poll::Ready(Some(Ok(bytes))) => {
                    if let Some(other) = &mut this.other {
                        let room = KEPT_OTHER_BYTES.saturating_sub(other.kept.len());
                        other.kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
                    } else {
                        // Read whether recorded or not: its end (`[DONE]`, a finish reason)
                        // tells a whole stream from a cut one, and its usage is counted.
                        let assembler = &mut this.assembler;
                        this.parser.push(&bytes, &mut |data| assembler.on_data(data));
                    }
                    let bytes = match this.strip_usage {
                        true => sse::without_usage_chunks(&mut this.pending, bytes),
                        false => bytes,
                    };
                    // Nothing to send yet (an event not whole, or only the usage chunk).
                    if bytes.is_empty() {
                        continue;
                    }
                    if let Some(stuck) = &this.stuck {
                        stuck.handed();
                    }
                    return Poll::Ready(Some(Ok(bytes)));
                }
                Poll::Ready(Some(Err(err))) => {
                    let cause = match err {
                        CallFailure::Timeout => {
                            format!("the provider's stream stalled: {}", err.describe("the provider"))
                        }
                        _ => "the provider's stream broke off in its middle".to_owned(),
                    };
                    return this.fail(err, cause);
                }
                Poll::Ready(None) => {
                    // A body that ended cleanly, but an event stream that never said `[DONE]`
                    // nor why it finished, nor sent an error: cut (a close-delimited body's
                    // end looks like any other).
                    if this.sse
                        && !this.assembler.is_done()
                        && !this.assembler.finished()
                        && this.assembler.error().is_none()
                    {
                        return this.fail(
                            CallFailure::Failed,
                            "the provider's stream ended before [DONE] and without a finish_reason"
                                .to_owned(),
                        );
                    }
                    this.record(true, None);
                    // What is left of an unfinished last event goes out as it came.
                    if !this.pending.is_empty() {
                        return Poll::Ready(Some(Ok(this.pending.split().freeze())));
                    }
                    return Poll::Ready(None);
                }
                Poll::Pending => {
                    // The provider is silent: a client that left is noticed now, not at the
                    // next write, and the provider's call is dropped with this stream.
                    if this.client.as_mut().is_some_and(|c| c.poll_gone(cx)) {
                        this.record(
                            false,
                            Some("the client disconnected before the stream ended".into()),
                        );
                        this.client = None;
                        return Poll::Ready(Some(Err(CallFailure::Failed)));
                    }
                    return Poll::Pending;
                }
            }
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if !self.finished {
            let cause = match &self.stuck {
                Some(stuck) if stuck.tripped() => format!(
                    "the client stopped reading for {} s; its connection and the provider's call were ended",
                    stuck.timeout().as_secs()
                ),
                _ => "the client disconnected before the stream ended".into(),
            };
            self.record(false, Some(cause));
        }
    }
}
