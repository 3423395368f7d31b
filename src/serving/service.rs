//! Serving flows: who may call a model, tearing an organization's adapters down, sampling.

use std::collections::BTreeMap;

use futures_util::{stream, StreamExt};
use serde_json::{json, Value};

use super::client::{SampleFailure, ServingLayer};
use super::dto::{SampleRequest, SampleResponse, TeardownReport};
use crate::auth::{keys, repo as auth_repo};
use crate::error::{ApiError, ApiResult};
use crate::http::PeerError;
use crate::orgs::repo as orgs_repo;
use crate::state::AppState;

/// Undeploys in flight at once during a teardown.
const TEARDOWN_CONCURRENCY: usize = 8;

/// What a caller of `org_id` may do with `model`: an adapter it owns, or a priced base model.
pub async fn resolve_model(state: &AppState, org_id: &str, model: &str) -> ApiResult<String> {
    match state.adapters.get(&state.db, model).await? {
        Some(adapter) if adapter.org_id == org_id => Ok(adapter.base_model),
        Some(_) => Err(ApiError::Forbidden(
            "the API key's organization does not own this adapter".into(),
        )),
        None if state.settings.pricing.models.contains_key(model) => Ok(model.to_owned()),
        None => Err(ApiError::not_found("adapter")),
    }
}

/// The organization a user API key may bill for `model`, and the model's base.
pub async fn authorize(state: &AppState, api_key: &str, model: &str) -> ApiResult<(String, String)> {
    let key = if keys::looks_like_api_key(api_key) {
        auth_repo::active_api_key(&state.db, &keys::hash_api_key(api_key)).await?
    } else {
        None
    };
    let key = key.ok_or_else(|| ApiError::Unauthorized("invalid API key".into()))?;
    let base_model = resolve_model(state, &key.org_id, model).await?;
    Ok((key.org_id, base_model))
}

/// Undeploys every live adapter of the organization, [`TEARDOWN_CONCURRENCY`] at a time; an
/// adapter whose undeploy fails stays live, so a retry tries it again.
pub async fn teardown(state: &AppState, org_id: &str) -> ApiResult<TeardownReport> {
    let live = orgs_repo::live_adapter_ids(&state.db, org_id).await?;
    let mut report = TeardownReport {
        undeployed: 0,
        failed: 0,
        adapters: BTreeMap::new(),
    };
    if live.is_empty() {
        return Ok(report);
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
                orgs_repo::mark_undeployed(&state.db, org_id, &id).await?;
                state
                    .cluster
                    .publish(crate::cluster::Event::AdapterChanged(id.clone()))
                    .await;
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
    Ok(report)
}

/// Whom sampling `model` is for: the owning organization of an adapter, none for a priced
/// base model; 404 for anything else.
pub async fn sample_target(state: &AppState, model: &str) -> ApiResult<Option<String>> {
    match state.adapters.get(&state.db, model).await? {
        Some(adapter) => Ok(Some(adapter.org_id)),
        None if state.settings.pricing.models.contains_key(model) => Ok(None),
        None => Err(ApiError::not_found("adapter")),
    }
}

/// Samples `model` through the serving layer, for the adapter's organization if any.
pub async fn sample(
    state: &AppState,
    org_id: Option<&str>,
    body: SampleRequest,
) -> Result<SampleResponse, SampleFailure> {
    let Some(serving) = ServingLayer::of(state) else {
        return Err(SampleFailure::NotConfigured);
    };
    let mut request = json!({ "model": body.model, "messages": body.messages, "stream": false });
    if let Some(max_tokens) = body.max_tokens {
        request["max_tokens"] = json!(max_tokens);
    }
    if let Some(temperature) = body.temperature {
        request["temperature"] = json!(temperature);
    }
    let reply = serving.complete(org_id, &request).await?;
    let output = text_of(reply.pointer("/choices/0/message/content"));
    let model = reply
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or(&body.model)
        .to_owned();
    Ok(SampleResponse {
        model,
        output,
        usage: reply.get("usage").cloned().unwrap_or(Value::Null),
    })
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
