//! Every other call under `/v1` (embeddings, models, responses, completions, moderations,
//! images, audio, files, batches, whatever a provider offers), relayed to the chosen
//! provider: the same method, path and query after the provider's base, the caller's
//! provider key as the bearer token, a JSON body redacted of both keys (multipart and binary
//! bodies as they came), and the provider's answer unchanged, streamed as it arrives. These
//! calls are not recorded and need no project.

use std::time::Instant;

use actix_web::web::Bytes;
use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::Value;

use super::redact::{self, Redactor};
use super::upstream::Answer;
use super::{
    authenticate, fallbacks_allowed, provider_of, refuse_duplicate, relayed_head, upstream_failure,
    upstream_headers, Upstreams, PROVIDERS,
};
use crate::error::{ApiError, ApiResult};
use crate::http::extract::DeferredBody;
use crate::state::AppState;

/// The relay; errors keel answers itself carry OpenAI's error shape.
pub async fn relay(
    req: HttpRequest,
    state: web::Data<AppState>,
    upstreams: web::Data<Upstreams>,
    body: DeferredBody,
) -> HttpResponse {
    relay_call(&req, &state, &upstreams, body)
        .await
        .unwrap_or_else(|err| err.openai_response())
}

async fn relay_call(
    req: &HttpRequest,
    state: &AppState,
    upstreams: &Upstreams,
    body: DeferredBody,
) -> ApiResult<HttpResponse> {
    let started = Instant::now();
    let (keel_key, owner) = authenticate(state, req).await?;
    let (provider_index, provider_key) = provider_of(req)?;
    refuse_dot_segments(req.uri().path())?;
    // Read only now: a caller without a valid key waited for nothing.
    let body = body.read().await?;

    // Neither key travels in the URL either: a path segment holding one has it replaced, a
    // query parameter holding one is dropped.
    let secrets = [keel_key, provider_key];
    let tail = req.path().strip_prefix("/v1").unwrap_or(req.path());
    let tail = without_secrets_in_path(tail, &secrets);
    // The request's log line names this path (the route is only `/v1/{tail}`).
    actix_web::HttpMessage::extensions_mut(req).insert(crate::telemetry::LoggedPath(format!("/v1{tail}")));
    let query = without_secrets_in_query(req.query_string(), &secrets);
    let uri = upstreams.relay_uri(provider_index, &tail, &query)?;
    let content_type = req.headers().get(actix_web::http::header::CONTENT_TYPE);
    let is_json = content_type
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or("").trim().to_ascii_lowercase())
        .is_some_and(|v| v == "application/json" || v.ends_with("+json"));
    let redactor = Redactor::new(&[keel_key, provider_key]);
    let scan = (is_json && !body.is_empty())
        .then(|| redactor.scan(&body))
        .flatten();
    if let Some(scan) = &scan {
        refuse_duplicate(scan)?;
        fallbacks_allowed(&owner, &scan.head)?;
    }
    // The model and stream flag of a JSON body, read only for a key whose settings ask.
    let facts = match owner.settings.is_plain() {
        true => CallFacts::runs_model(req.method()),
        false => CallFacts::of(req.method(), scan.as_ref()),
    };
    let permit = super::admit(state, &owner, facts.model(), facts.stream).await?;
    let body = if is_json && !body.is_empty() {
        redacted(&body, &redactor, scan.as_ref())
    } else {
        body
    };

    let method = http::Method::from_bytes(req.method().as_str().as_bytes())
        .map_err(|_| ApiError::BadRequest("unsupported method".into()))?;
    let mut upstream = http::Request::new(http_body_util::Full::new(body));
    *upstream.method_mut() = method;
    *upstream.uri_mut() = uri;
    let headers = upstream.headers_mut();
    upstream_headers(req, provider_key, headers)?;
    // The caller's own content type (a multipart body's boundary with it).
    if let Some(value) = content_type.and_then(|v| http::HeaderValue::from_bytes(v.as_bytes()).ok()) {
        headers.insert(http::header::CONTENT_TYPE, value);
    }

    let sent_at = Instant::now();
    let Answer { head, body } = match upstreams.send(upstream).await {
        Ok(answer) => answer,
        Err(err) => {
            state.metrics.upstream_error(provider_index, None);
            let (code, detail) = upstream_failure(err, PROVIDERS[provider_index]);
            return Err(ApiError::Coded(code, detail));
        }
    };
    state
        .metrics
        .upstream_error(provider_index, Some(head.status.as_u16()));
    state
        .metrics
        .proxied(provider_index, sent_at.elapsed(), started.elapsed());
    let (status, mut reply) = relayed_head(&head);
    // Streamed as it arrives (a hang-up drops it, and with it the provider's call); a
    // successful answer to a call that runs a model has its tokens counted when it ends, and
    // a stream's place under its key's `concurrentStreams` is given back then.
    let meter = (status.is_success() && facts.runs_model)
        .then(|| super::meter::Meter::new(state.limiter.usage().clone(), owner.clone()));
    let answer_type = head
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    Ok(reply.streaming(super::meter::Metered::new(body, answer_type, meter, permit)))
}

/// What a relayed call's key settings need to know of it.
#[derive(Debug, Default)]
struct CallFacts {
    /// Whether the call can run a model: anything but a read.
    runs_model: bool,
    model: Option<String>,
    stream: bool,
}

impl CallFacts {
    /// Whether a call of `method` can run a model: anything but a read.
    fn runs_model(method: &actix_web::http::Method) -> Self {
        use actix_web::http::Method;
        Self {
            runs_model: !matches!(
                *method,
                Method::GET | Method::HEAD | Method::DELETE | Method::OPTIONS
            ),
            ..Self::default()
        }
    }

    /// From a JSON body's scan (its top-level `model` and `stream`), if it has one.
    fn of(method: &actix_web::http::Method, scan: Option<&redact::Scan>) -> Self {
        let runs_model = Self::runs_model(method).runs_model;
        let head = scan.map(|scan| &scan.head);
        Self {
            runs_model,
            model: head
                .and_then(|h| h.get("model"))
                .and_then(Value::as_str)
                .map(str::to_owned),
            stream: head.and_then(|h| h.get("stream")).and_then(Value::as_bool) == Some(true),
        }
    }

    fn model(&self) -> keel_core::keys::service::CallModel<'_> {
        use keel_core::keys::service::CallModel;
        match (&self.model, self.runs_model) {
            (Some(model), _) => CallModel::Named(model),
            (None, true) => CallModel::Unnamed,
            (None, false) => CallModel::NoModel,
        }
    }
}

/// Whether `text`, or its percent-decoding, holds one of `secrets`.
fn holds_secret(text: &str, secrets: &[&str]) -> bool {
    let decoded = percent_encoding::percent_decode_str(text).decode_utf8_lossy();
    secrets
        .iter()
        .filter(|s| !s.is_empty())
        .any(|s| text.contains(s) || decoded.contains(s))
}

/// `path` with each segment that holds a secret (as is or percent-encoded) replaced by the
/// segment decoded, the secret replaced by `[redacted]`, and encoded again.
fn without_secrets_in_path<'p>(path: &'p str, secrets: &[&str]) -> std::borrow::Cow<'p, str> {
    if !holds_secret(path, secrets) {
        return std::borrow::Cow::Borrowed(path);
    }
    let segments: Vec<String> = path
        .split('/')
        .map(|segment| {
            if !holds_secret(segment, secrets) {
                return segment.to_owned();
            }
            let mut decoded = percent_encoding::percent_decode_str(segment)
                .decode_utf8_lossy()
                .into_owned();
            for secret in secrets.iter().filter(|s| !s.is_empty()) {
                decoded = decoded.replace(secret, super::redact::REDACTED);
            }
            percent_encoding::utf8_percent_encode(&decoded, percent_encoding::NON_ALPHANUMERIC).to_string()
        })
        .collect();
    std::borrow::Cow::Owned(segments.join("/"))
}

/// `query` without the parameters whose name or value holds a secret (the others as they
/// came, in order).
fn without_secrets_in_query<'q>(query: &'q str, secrets: &[&str]) -> std::borrow::Cow<'q, str> {
    if !holds_secret(&query.replace('+', " "), secrets) && !holds_secret(query, secrets) {
        return std::borrow::Cow::Borrowed(query);
    }
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| !holds_secret(pair, secrets) && !holds_secret(&pair.replace('+', " "), secrets))
        .collect();
    std::borrow::Cow::Owned(kept.join("&"))
}

/// 400 for a path with a `.` or `..` segment, as written or percent-encoded: the provider's
/// server could resolve it to a path outside the API.
fn refuse_dot_segments(path: &str) -> ApiResult<()> {
    let dot = path.split('/').any(|segment| {
        let decoded = percent_encoding::percent_decode_str(segment).decode_utf8_lossy();
        decoded == "." || decoded == ".."
    });
    match dot {
        true => Err(ApiError::BadRequest(
            "the path must not hold `.` or `..` segments".into(),
        )),
        false => Ok(()),
    }
}

/// A JSON body with both keys replaced wherever they appear (`scan`: the body's, if it is
/// JSON); one that holds neither, or is not JSON at all, travels as it came.
fn redacted(body: &Bytes, redactor: &Redactor, scan: Option<&redact::Scan>) -> Bytes {
    let as_text = || {
        std::str::from_utf8(body)
            .ok()
            .and_then(|text| redactor.redact_text(text))
            .map(Bytes::from)
    };
    match scan {
        Some(scan) if !scan.needs_redaction => body.clone(),
        Some(_) => match serde_json::from_slice::<Value>(body) {
            Ok(mut value) => {
                redactor.redact(&mut value);
                serde_json::to_vec(&value)
                    .map(Bytes::from)
                    .unwrap_or_else(|_| body.clone())
            }
            Err(_) => as_text().unwrap_or_else(|| body.clone()),
        },
        // Labelled JSON but not JSON: the keys are still taken out of its text.
        None => as_text().unwrap_or_else(|| body.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEEL: &str = "keel_sk_AbCdEfGhIjKlMnOp0123456789";
    const PROVIDER: &str = "sk-proj-Zy+Xw/Vu";

    #[test]
    fn keys_leave_paths_and_queries() {
        let secrets = [KEEL, PROVIDER];
        assert_eq!(without_secrets_in_path("/models", &secrets), "/models");
        assert_eq!(
            without_secrets_in_path(&format!("/{KEEL}/x"), &secrets),
            "/%5Bredacted%5D/x"
        );
        assert_eq!(
            without_secrets_in_path("/files/sk%2Dproj%2DZy%2BXw%2FVu", &secrets),
            "/files/%5Bredacted%5D"
        );
        assert_eq!(
            without_secrets_in_query("limit=3&after=x", &secrets),
            "limit=3&after=x"
        );
        assert_eq!(
            without_secrets_in_query(&format!("key={KEEL}&limit=3"), &secrets),
            "limit=3"
        );
        assert_eq!(
            without_secrets_in_query("limit=3&api_key=sk-proj-Zy%2BXw%2FVu", &secrets),
            "limit=3"
        );
    }
}
