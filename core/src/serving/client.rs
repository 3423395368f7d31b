//! The serving layer's API (`serving.url`), called with the first internal key.

use std::time::Duration;

use serde_json::Value;

use crate::config::{AuthSettings, ServiceEndpoint};
use crate::peer::PeerError;

pub const SERVING_LAYER: &str = "the serving layer";

/// The serving layer's small API, called with the first internal key.
#[derive(Clone)]
pub struct ServingLayer {
    http: reqwest::Client,
    base: String,
    key: String,
    timeout: Duration,
}

impl ServingLayer {
    /// `None` when no serving URL or no internal key is configured.
    pub fn new(http: &reqwest::Client, serving: &ServiceEndpoint, auth: &AuthSettings) -> Option<Self> {
        let base = serving.url.trim_end_matches('/');
        let key = auth.internal_keys.first()?;
        (!base.is_empty()).then(|| Self {
            http: http.clone(),
            base: base.to_owned(),
            key: key.clone(),
            timeout: Duration::from_millis(serving.timeout_ms),
        })
    }

    /// Undeploys one adapter: `Ok(deployments undeployed)`; 404 means nothing was deployed.
    pub async fn undeploy(&self, adapter_id: &str) -> Result<u64, PeerError> {
        let response = self
            .http
            .delete(format!("{}/adapters/{adapter_id}", self.base))
            .bearer_auth(&self.key)
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
    pub async fn complete(&self, org_id: Option<&str>, request: &Value) -> Result<Value, SampleFailure> {
        let call = |e| SampleFailure::Call(PeerError::call(SERVING_LAYER, e));
        let mut call_builder = self
            .http
            .post(format!("{}/chat/completions", self.base))
            .bearer_auth(&self.key);
        if let Some(org_id) = org_id {
            call_builder = call_builder.header("x-org-id", org_id);
        }
        let response = call_builder
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
pub enum SampleFailure {
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
