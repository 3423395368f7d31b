//! Bodies and views of the serving routes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::http::validate::{Checks, Validate};
use keel_core::domain::OrgId;

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
    fn validate(&self, _c: &mut Checks) {}
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServingAuthorized {
    /// The organization to bill: the adapter's owner, or the key's for a base model.
    pub org_id: String,
    pub adapter_id: String,
    pub base_model: String,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServingTeardownBody {
    #[schema(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
}

impl Validate for ServingTeardownBody {
    fn validate(&self, _c: &mut Checks) {}
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

#[derive(Debug, Deserialize, ToSchema)]
pub struct SampleRequest {
    /// A served adapter (of any organization) or a priced base model.
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
    fn validate(&self, _c: &mut Checks) {}
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
    /// The same as `error`, as every error names its code.
    pub code: crate::error::Code,
}

crate::org_scoped!(ServingTeardownBody);
crate::org_scoped!(unnamed: SampleRequest);

impl From<keel_core::serving::TeardownReport> for TeardownReport {
    fn from(r: keel_core::serving::TeardownReport) -> Self {
        Self {
            undeployed: r.undeployed,
            failed: r.failed,
            adapters: r.adapters,
        }
    }
}

impl From<SampleRequest> for keel_core::serving::Sample {
    fn from(body: SampleRequest) -> Self {
        Self {
            model: body.model,
            messages: body.messages,
            max_tokens: body.max_tokens,
            temperature: body.temperature,
        }
    }
}

impl From<keel_core::serving::Sampled> for SampleResponse {
    fn from(s: keel_core::serving::Sampled) -> Self {
        Self {
            model: s.model,
            output: s.output,
            usage: s.usage,
        }
    }
}
