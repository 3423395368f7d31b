//! Serving: who may call an adapter, undeploying, sampling through the serving layer.

pub mod client;
pub mod service;

use std::collections::BTreeMap;
use std::sync::Arc;

use sea_orm::DatabaseConnection;
use serde_json::{Map, Value};

use crate::cluster::Cluster;
use crate::config::PricingSettings;
use crate::orgs::adapters::AdapterDirectory;

/// What the serving flows need: the database, the adapters' cache, the priced base models,
/// the cluster (to tell every instance an adapter changed) and the serving layer, if one is
/// configured.
#[derive(Clone)]
pub struct Serving {
    pub db: DatabaseConnection,
    pub adapters: AdapterDirectory,
    pub pricing: Arc<PricingSettings>,
    pub cluster: Cluster,
    /// The keys' limits (serving spends the organization's balance as the proxy does).
    pub limiter: crate::keys::Limiter,
    pub layer: Option<client::ServingLayer>,
}

impl Serving {
    /// Whether `model` is a base model with a price.
    pub fn priced(&self, model: &str) -> bool {
        self.pricing.models.contains_key(model)
    }
}

/// A sampling request (`POST /api/sample`).
#[derive(Debug, Clone)]
pub struct Sample {
    pub model: String,
    pub messages: Vec<Map<String, Value>>,
    pub max_tokens: Option<i64>,
    pub temperature: Option<f64>,
}

/// The serving layer's answer to a [`Sample`].
#[derive(Debug, Clone)]
pub struct Sampled {
    pub model: String,
    /// The first choice's text.
    pub output: String,
    pub usage: Value,
}

/// What tearing an organization's adapters down did.
#[derive(Debug, Clone, Default)]
pub struct TeardownReport {
    /// Adapters undeployed (no longer live).
    pub undeployed: u64,
    /// Adapters whose undeploy failed (still live; try again).
    pub failed: u64,
    /// Each live adapter's id to the deployments undeployed for it (0 when it failed).
    pub adapters: BTreeMap<String, u64>,
}

/// Why a serving flow did not happen.
#[derive(Debug, thiserror::Error)]
pub enum ServingError {
    #[error("the API key's organization does not own this adapter")]
    NotOwner,
    /// Neither an adapter nor a priced base model.
    #[error("adapter not found")]
    UnknownModel,
    #[error("invalid API key")]
    InvalidApiKey,
    /// The key's scopes do not hold `inference`.
    #[error("this API key's scopes do not include inference")]
    ScopeNotAllowed,
    /// The key's `models` list names neither the adapter nor its base model.
    #[error("this API key may not call model {0:?}")]
    ModelNotAllowed(String),
    /// A limit of the key refused the call.
    #[error(transparent)]
    Limited(#[from] crate::keys::limiter::Limited),
    #[error("no serving layer is configured (KEEL_SERVING_URL)")]
    NotConfigured,
    #[error(transparent)]
    Database(#[from] sea_orm::DbErr),
    #[error(transparent)]
    CachedDatabase(#[from] Arc<sea_orm::DbErr>),
}
