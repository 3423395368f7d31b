//! Serving: who may call an adapter (`POST /api/serving/authorize`), undeploying an
//! organization's adapters (`POST /api/serving/teardown`) and sampling through the serving
//! layer (`POST /api/sample`).
//!
//! The serving layer (`serving.url`, OpenAI-compatible, e.g. `http://host:port/v1`) is
//! called with the first internal key: `POST <base>/chat/completions` to sample and
//! `DELETE <base>/adapters/{adapter_id}` to undeploy (see docs/DECISIONS.md).

use std::collections::BTreeMap;
use std::time::Duration;

use actix_web::{web, HttpResponse};
use entities::adapter;
use futures_util::{stream, StreamExt};
use sea_orm::{ColumnTrait, EntityTrait, QueryFilter, QueryOrder};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use utoipa::{OpenApi, ToSchema};

use crate::auth::{keys, repo as auth_repo, Caller, Internal};
use crate::error::{ApiError, ApiResult, ErrorBody, ValidationErrorBody};
use crate::http::extract::ValidJson;
use crate::http::validate::{Checks, Validate};
use crate::http::{resource, CallFailure, PeerError};

const SERVING_LAYER: &str = "the serving layer";
use crate::state::AppState;

/// Undeploys in flight at once during a teardown.
const TEARDOWN_CONCURRENCY: usize = 8;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(resource("/api/serving/authorize").route(web::post().to(authorize)))
        .service(resource("/api/serving/teardown").route(web::post().to(teardown)))
        .service(resource("/api/sample").route(web::post().to(sample)));
}

#[derive(OpenApi)]
#[openapi(paths(authorize, teardown, sample))]
pub struct Doc;

/// What a caller of `org_id` may do with `model`: an adapter it owns, or a priced base model.
async fn resolve_model(state: &AppState, org_id: &str, model: &str) -> ApiResult<String> {
    match state.adapters.get(&state.db, model).await? {
        Some(adapter) if adapter.org_id == org_id => Ok(adapter.base_model),
        Some(_) => Err(ApiError::Forbidden(
            "the API key's organization does not own this adapter".into(),
        )),
        None if state.settings.pricing.models.contains_key(model) => Ok(model.to_owned()),
        None => Err(ApiError::not_found("adapter")),
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServingAuthorizeBody {
    /// The caller's user API key, as presented to the serving layer.
    #[schema(min_length = 1, max_length = 512)]
    pub api_key: String,
    /// An adapter id or a priced base model id.
    #[schema(min_length = 1, max_length = 512)]
    pub adapter_id: String,
}

impl Validate for ServingAuthorizeBody {
    fn validate(&self, c: &mut Checks) {
        c.str_len("apiKey", &self.api_key, 1, 512);
        c.str_len("adapterId", &self.adapter_id, 1, 512);
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServingAuthorized {
    /// The organization to bill: the adapter's owner, or the key's for a base model.
    pub org_id: String,
    pub adapter_id: String,
    pub base_model: String,
}

#[utoipa::path(post, path = "/api/serving/authorize", tag = "serving", security(("bearer" = [])),
    request_body = ServingAuthorizeBody,
    responses(
        (status = 200, body = ServingAuthorized),
        (status = 401, description = "Invalid API key (or no internal key)", body = ErrorBody),
        (status = 403, description = "The key's organization does not own the adapter", body = ErrorBody),
        (status = 404, description = "Unknown or unattributed adapter", body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn authorize(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<ServingAuthorizeBody>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    let key = if keys::looks_like_api_key(&body.api_key) {
        auth_repo::active_api_key(&state.db, &keys::hash_api_key(&body.api_key)).await?
    } else {
        None
    };
    let key = key.ok_or_else(|| ApiError::Unauthorized("invalid API key".into()))?;
    let base_model = resolve_model(&state, &key.org_id, &body.adapter_id).await?;
    Ok(HttpResponse::Ok().json(ServingAuthorized {
        org_id: key.org_id,
        adapter_id: body.adapter_id,
        base_model,
    }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServingTeardownBody {
    #[schema(min_length = 1, max_length = 100)]
    pub org_id: String,
}

impl Validate for ServingTeardownBody {
    fn validate(&self, c: &mut Checks) {
        c.str_len("orgId", &self.org_id, 1, 100);
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TeardownReport {
    /// Adapters undeployed (no longer live).
    pub undeployed: u64,
    /// Adapters whose undeploy failed (still live; try again).
    pub failed: u64,
    /// Each live adapter's id to the deployments undeployed for it (0 when it failed).
    pub adapters: BTreeMap<String, u64>,
}

#[utoipa::path(post, path = "/api/serving/teardown", tag = "serving", security(("bearer" = [])),
    request_body = ServingTeardownBody,
    responses(
        (status = 200, body = TeardownReport),
        (status = 403, description = "Not an owner's session", body = ErrorBody),
        (status = 503, description = "Live adapters but no serving layer configured", body = ErrorBody),
    ))]
pub async fn teardown(caller: Caller, body: ValidJson<ServingTeardownBody>) -> ApiResult<HttpResponse> {
    let access = caller.owner(Some(&body.0.org_id)).await?;
    let state = caller.state();
    let live: Vec<String> = adapter::Entity::find()
        .filter(adapter::Column::OrgId.eq(&access.org_id))
        .filter(adapter::Column::Live.eq(true))
        .order_by_asc(adapter::Column::Id)
        .all(&state.db)
        .await?
        .into_iter()
        .map(|a| a.id)
        .collect();
    let mut report = TeardownReport {
        undeployed: 0,
        failed: 0,
        adapters: BTreeMap::new(),
    };
    if live.is_empty() {
        return Ok(HttpResponse::Ok().json(report));
    }
    let serving = ServingLayer::of(state)
        .ok_or_else(|| ApiError::Unavailable("no serving layer is configured (KEEL_SERVING_URL)".into()))?;
    let outcomes: Vec<(String, Result<u64, PeerError>)> = stream::iter(live)
        .map(|id| {
            let serving = &serving;
            async move {
                let outcome = serving.undeploy(&id).await;
                (id, outcome)
            }
        })
        .buffer_unordered(TEARDOWN_CONCURRENCY)
        .collect()
        .await;
    for (id, outcome) in outcomes {
        match outcome {
            Ok(count) => {
                adapter::Entity::update_many()
                    .col_expr(adapter::Column::Live, false.into())
                    .col_expr(adapter::Column::UpdatedAt, chrono::Utc::now().into())
                    .filter(adapter::Column::Id.eq(&id))
                    .filter(adapter::Column::OrgId.eq(&access.org_id))
                    .exec(&state.db)
                    .await?;
                state.adapters.invalidate(&id);
                report.undeployed += 1;
                report.adapters.insert(id, count);
            }
            Err(err) => {
                tracing::warn!(adapter = %id, error = &err as &dyn std::error::Error, "undeploy failed; the adapter stays live");
                report.failed += 1;
                report.adapters.insert(id, 0);
            }
        }
    }
    Ok(HttpResponse::Ok().json(report))
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct SampleRequest {
    /// An adapter the caller's organization owns, or a priced base model.
    #[schema(min_length = 1, max_length = 512)]
    pub model: String,
    /// Chat messages, as the OpenAI API takes them.
    #[schema(value_type = Vec<Object>, min_items = 1, max_items = 1000)]
    pub messages: Vec<Map<String, Value>>,
    #[schema(minimum = 1, maximum = 1000000)]
    pub max_tokens: Option<i64>,
    #[schema(minimum = 0.0, maximum = 2.0)]
    pub temperature: Option<f64>,
}

impl Validate for SampleRequest {
    fn validate(&self, c: &mut Checks) {
        c.str_len("model", &self.model, 1, 512);
        c.min_items("messages", self.messages.len(), 1);
        c.max_items("messages", self.messages.len(), 1000);
        c.opt_int_range("max_tokens", self.max_tokens, 1, 1_000_000);
        c.opt_float_range("temperature", self.temperature, 0.0, 2.0);
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SampleResponse {
    pub model: String,
    /// The first choice's text.
    pub output: String,
    /// Token usage as the serving layer reported it (null when it did not).
    #[schema(value_type = Object)]
    pub usage: Value,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SampleErrorResponse {
    /// `serving_not_configured`, `serving_unreachable`, `serving_timeout`, `serving_error`
    /// or `serving_bad_response`.
    pub error: String,
    pub detail: String,
}

#[utoipa::path(post, path = "/api/sample", tag = "serving", security(("bearer" = [])),
    request_body = SampleRequest,
    responses(
        (status = 200, body = SampleResponse),
        (status = 403, description = "The caller's organization does not own the adapter", body = ErrorBody),
        (status = 404, description = "Unknown adapter", body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
        (status = 500, description = "The serving layer failed or timed out", body = SampleErrorResponse),
    ))]
pub async fn sample(caller: Caller, body: ValidJson<SampleRequest>) -> ApiResult<HttpResponse> {
    let body = body.0;
    let access = caller.member(None).await?;
    let state = caller.state();
    resolve_model(state, &access.org_id, &body.model).await?;
    let Some(serving) = ServingLayer::of(state) else {
        return Ok(sample_failed(&SampleFailure::NotConfigured));
    };
    let mut request = json!({ "model": body.model, "messages": body.messages, "stream": false });
    if let Some(max_tokens) = body.max_tokens {
        request["max_tokens"] = json!(max_tokens);
    }
    if let Some(temperature) = body.temperature {
        request["temperature"] = json!(temperature);
    }
    match serving.complete(&access.org_id, &request).await {
        Ok(reply) => {
            let output = text_of(reply.pointer("/choices/0/message/content"));
            let model = reply
                .get("model")
                .and_then(Value::as_str)
                .unwrap_or(&body.model)
                .to_owned();
            Ok(HttpResponse::Ok().json(SampleResponse {
                model,
                output,
                usage: reply.get("usage").cloned().unwrap_or(Value::Null),
            }))
        }
        Err(failure) => {
            tracing::warn!(
                error = &failure as &dyn std::error::Error,
                code = failure.code(),
                "sample failed"
            );
            Ok(sample_failed(&failure))
        }
    }
}

/// A message's text: a string as is; content parts' `text` joined (images left out).
fn text_of(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

fn sample_failed(failure: &SampleFailure) -> HttpResponse {
    HttpResponse::InternalServerError().json(SampleErrorResponse {
        error: failure.code().to_owned(),
        detail: failure.to_string(),
    })
}

/// The serving layer's small API, called with the first internal key.
struct ServingLayer<'a> {
    http: &'a reqwest::Client,
    base: &'a str,
    key: &'a str,
    timeout: Duration,
}

impl<'a> ServingLayer<'a> {
    /// `None` when no serving URL or no internal key is configured.
    fn of(state: &'a AppState) -> Option<Self> {
        let base = state.settings.serving.url.trim_end_matches('/');
        let key = state.settings.auth.internal_keys.first()?;
        (!base.is_empty()).then(|| Self {
            http: &state.http,
            base,
            key,
            timeout: Duration::from_millis(state.settings.serving.timeout_ms),
        })
    }

    /// Undeploys one adapter: `Ok(deployments undeployed)`; 404 means nothing was deployed.
    async fn undeploy(&self, adapter_id: &str) -> Result<u64, PeerError> {
        let response = self
            .http
            .delete(format!("{}/adapters/{adapter_id}", self.base))
            .bearer_auth(self.key)
            .timeout(self.timeout)
            .send()
            .await
            .map_err(|e| PeerError::call(SERVING_LAYER, e))?;
        let status = response.status();
        if status == reqwest::StatusCode::NOT_FOUND {
            return Ok(0);
        }
        if !status.is_success() {
            return Err(PeerError::Status {
                peer: SERVING_LAYER,
                status,
            });
        }
        let body: Value = response.json().await.unwrap_or(Value::Null);
        Ok(body.get("undeployed").and_then(Value::as_u64).unwrap_or(1))
    }

    /// A non-streamed chat completion.
    async fn complete(&self, org_id: &str, request: &Value) -> Result<Value, SampleFailure> {
        let call = |e| SampleFailure::Call(PeerError::call(SERVING_LAYER, e));
        let response = self
            .http
            .post(format!("{}/chat/completions", self.base))
            .bearer_auth(self.key)
            .header("x-org-id", org_id)
            .timeout(self.timeout)
            .json(request)
            .send()
            .await
            .map_err(call)?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(call)?;
        if !status.is_success() {
            let text = String::from_utf8_lossy(&bytes);
            return Err(SampleFailure::Status {
                status,
                excerpt: text.chars().take(500).collect(),
            });
        }
        serde_json::from_slice::<Value>(&bytes)
            .ok()
            .filter(Value::is_object)
            .ok_or(SampleFailure::BadResponse)
    }
}

/// Why a sample failed; [`SampleFailure::code`] is `SampleErrorResponse.error`.
#[derive(Debug, thiserror::Error)]
enum SampleFailure {
    #[error("no serving layer is configured (KEEL_SERVING_URL and an internal key)")]
    NotConfigured,
    #[error(transparent)]
    Call(PeerError),
    #[error("serving layer answered {status}: {excerpt}")]
    Status {
        status: reqwest::StatusCode,
        excerpt: String,
    },
    #[error("serving layer answered a body that is not a JSON object")]
    BadResponse,
}

impl SampleFailure {
    fn code(&self) -> &'static str {
        match self {
            Self::NotConfigured => "serving_not_configured",
            Self::Call(PeerError::Call {
                failure: CallFailure::Timeout,
                ..
            }) => "serving_timeout",
            Self::Call(_) => "serving_unreachable",
            Self::Status { .. } => "serving_error",
            Self::BadResponse => "serving_bad_response",
        }
    }
}
