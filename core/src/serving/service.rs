//! Serving flows: who may call a model, tearing an organization's adapters down, sampling.

use std::collections::BTreeMap;

use futures_util::{stream, StreamExt};
use serde_json::{json, Value};

use super::client::SampleFailure;
use super::{Sample, Sampled, Serving, ServingError, TeardownReport};
use crate::auth::{keys, repo as auth_repo};
use crate::domain::OrgId;
use crate::orgs::repo as orgs_repo;
use crate::peer::PeerError;

/// Undeploys in flight at once during a teardown.
const TEARDOWN_CONCURRENCY: usize = 8;

/// What a caller of `org_id` may do with `model`: an adapter it owns, or a priced base model.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn resolve_model(serving: &Serving, org_id: &OrgId, model: &str) -> Result<String, ServingError> {
    match serving.adapters.get(&serving.db, model).await? {
        Some(adapter) if adapter.org_id == org_id => Ok(adapter.base_model),
        Some(_) => Err(ServingError::NotOwner),
        None if serving.priced(model) => Ok(model.to_owned()),
        None => Err(ServingError::UnknownModel),
    }
}

/// The organization a user API key may bill for `model`, and the model's base.
#[tracing::instrument(level = "debug", skip_all)]
pub async fn authorize(
    serving: &Serving,
    api_key: &str,
    model: &str,
) -> Result<(OrgId, String), ServingError> {
    let key = if keys::looks_like_api_key(api_key) {
        auth_repo::active_api_key(&serving.db, &keys::hash_api_key(api_key)).await?
    } else {
        None
    };
    let key = key.ok_or(ServingError::InvalidApiKey)?;
    let settings = crate::keys::KeySettings::of(&key);
    if !settings.scopes.inference {
        return Err(ServingError::ScopeNotAllowed);
    }
    let base_model = resolve_model(serving, &key.org_id, model).await?;
    // The key's `models` list allows an adapter by its id or by its base model.
    if settings.models.is_some() && !settings.allows_model(model) && !settings.allows_model(&base_model) {
        return Err(ServingError::ModelNotAllowed(model.chars().take(200).collect()));
    }
    // Its requests and tokens are the key's as a proxied call's are (the model checked above).
    let now = chrono::Utc::now();
    crate::keys::service::admit(
        &serving.limiter,
        &key.id,
        &settings,
        crate::keys::service::CallModel::NoModel,
        false,
        now,
    )
    .await
    .map_err(|denied| match denied {
        crate::keys::service::Denied::Limited(limited) => ServingError::Limited(limited),
        other => ServingError::ModelNotAllowed(other.to_string()),
    })?;
    Ok((key.org_id, base_model))
}

/// Undeploys every live adapter of the organization, [`TEARDOWN_CONCURRENCY`] at a time; an
/// adapter whose undeploy fails stays live, so a retry tries it again.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn teardown(serving: &Serving, org_id: &OrgId) -> Result<TeardownReport, ServingError> {
    let live = orgs_repo::live_adapter_ids(&serving.db, org_id).await?;
    let mut report = TeardownReport {
        undeployed: 0,
        failed: 0,
        adapters: BTreeMap::new(),
    };
    if live.is_empty() {
        return Ok(report);
    }
    let layer = serving.layer.as_ref().ok_or(ServingError::NotConfigured)?;
    let outcomes: Vec<(String, Result<u64, PeerError>)> = stream::iter(live)
        .map(|id| async move {
            let outcome = layer.undeploy(&id).await;
            (id, outcome)
        })
        .buffer_unordered(TEARDOWN_CONCURRENCY)
        .collect()
        .await;
    for (id, outcome) in outcomes {
        match outcome {
            Ok(count) => {
                orgs_repo::mark_undeployed(&serving.db, org_id, &id).await?;
                serving
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
#[tracing::instrument(level = "debug", skip_all)]
pub async fn sample_target(serving: &Serving, model: &str) -> Result<Option<OrgId>, ServingError> {
    match serving.adapters.get(&serving.db, model).await? {
        Some(adapter) => Ok(Some(adapter.org_id)),
        None if serving.priced(model) => Ok(None),
        None => Err(ServingError::UnknownModel),
    }
}

/// Samples `model` through the serving layer, for the adapter's organization if any.
#[tracing::instrument(level = "debug", skip_all)]
pub async fn sample(serving: &Serving, org_id: Option<&str>, body: Sample) -> Result<Sampled, SampleFailure> {
    let Some(layer) = &serving.layer else {
        return Err(SampleFailure::NotConfigured);
    };
    let mut request = json!({ "model": body.model, "messages": body.messages, "stream": false });
    if let Some(max_tokens) = body.max_tokens {
        request["max_tokens"] = json!(max_tokens);
    }
    if let Some(temperature) = body.temperature {
        request["temperature"] = json!(temperature);
    }
    let reply = layer.complete(org_id, &request).await?;
    let output = text_of(reply.pointer("/choices/0/message/content"));
    let model = reply
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or(&body.model)
        .to_owned();
    Ok(Sampled {
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
