//! Bodies and views of the API key routes.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::http::extract::present;
use crate::http::validate::{Checks, Validate};
use keel_core::keys::service::KeyUse;
use keel_core::keys::{KeySettings, Limits, Scopes, SettingsChange};

/// Where a key may be used: `inference` (the proxy, the relay, serving authorize) or `api`
/// (every other route, the console included).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    Inference,
    Api,
}

fn scopes_of(list: &[Scope]) -> Scopes {
    Scopes {
        inference: list.contains(&Scope::Inference),
        api: list.contains(&Scope::Api),
    }
}

/// `T` from a JSON object only: serde's derive also reads a struct from an array of its
/// fields in order, which the schema (an object) does not allow.
fn object<'de, D, T>(de: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    match Option::<serde_json::Map<String, serde_json::Value>>::deserialize(de)? {
        None => Ok(None),
        Some(map) => serde_json::from_value(serde_json::Value::Object(map))
            .map(Some)
            .map_err(serde::de::Error::custom),
    }
}

/// As [`object`], for a field where `null` clears (`present`).
fn present_object<'de, D, T>(de: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    object(de).map(Some)
}

/// A key's limits; each absent (or null) is no limit.
#[derive(Debug, Clone, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LimitsBody {
    /// Calls through the proxy and relay a minute (a token bucket: a minute's worth at once,
    /// refilled continuously).
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u32>, minimum = 1, maximum = 1_000_000)]
    pub requests_per_minute: Option<Option<u32>>,
    /// Prompt and completion tokens of recorded calls since 00:00 UTC.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u64>, minimum = 1, maximum = 1_000_000_000_000u64)]
    pub tokens_per_day: Option<Option<u64>>,
    /// Streamed calls open at once.
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<u32>, minimum = 1, maximum = 10_000)]
    pub concurrent_streams: Option<Option<u32>>,
}

/// A new key's name and settings; every field is optional (an empty body is a key that can
/// do everything its organization can, as keys always could).
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateKeyBody {
    #[schema(min_length = 1, max_length = 200)]
    pub name: Option<String>,
    #[serde(default, deserialize_with = "object")]
    pub limits: Option<LimitsBody>,
    /// Default: both.
    #[schema(min_items = 1, max_items = 2)]
    pub scopes: Option<Vec<Scope>>,
    /// Exact model names the key may call through the proxy and relay; absent: any.
    #[schema(min_items = 1, max_items = 100, value_type = Option<Vec<ModelName>>)]
    pub models: Option<Vec<String>>,
    /// When the key stops working; in the future.
    pub expires_at: Option<DateTime<Utc>>,
}

/// A model's exact name (1 to 200 characters).
pub struct ModelName;

impl utoipa::PartialSchema for ModelName {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .min_length(Some(1))
            .max_length(Some(200))
            .into()
    }
}

impl ToSchema for ModelName {}

impl Validate for CreateKeyBody {
    fn validate(&self, _c: &mut Checks) {}
}

impl CreateKeyBody {
    pub fn settings(&self) -> KeySettings {
        let limits = self.limits.clone().unwrap_or_default();
        KeySettings {
            limits: Limits {
                requests_per_minute: limits.requests_per_minute.flatten(),
                tokens_per_day: limits.tokens_per_day.flatten(),
                concurrent_streams: limits.concurrent_streams.flatten(),
            },
            scopes: self.scopes.as_deref().map_or(Scopes::ALL, scopes_of),
            models: self.models.clone(),
            expires_at: self.expires_at,
        }
    }
}

/// A change to a key: only the fields given change; `null` clears one (no limit, any model,
/// never expires; scopes back to both). In `limits`, each limit given changes alone.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PatchKeyBody {
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<String>, min_length = 1, max_length = 200)]
    pub name: Option<Option<String>>,
    #[serde(default, deserialize_with = "present_object")]
    #[schema(value_type = Option<LimitsBody>)]
    pub limits: Option<Option<LimitsBody>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<Vec<Scope>>, min_items = 1, max_items = 2)]
    pub scopes: Option<Option<Vec<Scope>>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<Vec<ModelName>>, min_items = 1, max_items = 100)]
    pub models: Option<Option<Vec<String>>>,
    #[serde(default, deserialize_with = "present")]
    #[schema(value_type = Option<DateTime<Utc>>)]
    pub expires_at: Option<Option<DateTime<Utc>>>,
}

impl Validate for PatchKeyBody {
    fn validate(&self, _c: &mut Checks) {}
}

impl PatchKeyBody {
    pub fn change(&self) -> SettingsChange {
        let (rpm, tokens, streams) = match &self.limits {
            None => (None, None, None),
            Some(None) => (Some(None), Some(None), Some(None)),
            Some(Some(limits)) => (
                limits.requests_per_minute,
                limits.tokens_per_day,
                limits.concurrent_streams,
            ),
        };
        SettingsChange {
            name: self.name.clone(),
            requests_per_minute: rpm,
            tokens_per_day: tokens,
            concurrent_streams: streams,
            scopes: self
                .scopes
                .as_ref()
                .map(|s| s.as_deref().map_or(Scopes::ALL, scopes_of)),
            models: self.models.clone(),
            expires_at: self.expires_at,
        }
    }
}

/// A key's limits as set (null: none).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LimitsView {
    pub requests_per_minute: Option<u32>,
    pub tokens_per_day: Option<u64>,
    pub concurrent_streams: Option<u32>,
}

/// What a key used today (UTC), as every instance has written it (about once a second).
#[derive(Debug, Serialize, ToSchema)]
pub struct UsageToday {
    pub requests: i64,
    pub tokens: i64,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApiKeyView {
    pub api_key_id: String,
    pub org_id: String,
    pub name: Option<String>,
    /// The first characters of the key, for recognizing it.
    pub prefix: String,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
    pub limits: LimitsView,
    pub scopes: Vec<Scope>,
    /// null: any model.
    pub models: Option<Vec<String>>,
    pub expires_at: Option<DateTime<Utc>>,
    /// Written at most once a minute per key and instance.
    pub last_used_at: Option<DateTime<Utc>>,
    pub usage_today: UsageToday,
}

impl From<KeyUse> for ApiKeyView {
    fn from(k: KeyUse) -> Self {
        let KeyUse {
            key,
            settings,
            requests_today,
            tokens_today,
            ..
        } = k;
        let mut scopes = Vec::with_capacity(2);
        if settings.scopes.inference {
            scopes.push(Scope::Inference);
        }
        if settings.scopes.api {
            scopes.push(Scope::Api);
        }
        Self {
            api_key_id: key.id.into(),
            org_id: key.org_id.into(),
            name: key.name,
            prefix: key.prefix,
            created_at: key.created_at,
            revoked_at: key.revoked_at,
            limits: LimitsView {
                requests_per_minute: settings.limits.requests_per_minute,
                tokens_per_day: settings.limits.tokens_per_day,
                concurrent_streams: settings.limits.concurrent_streams,
            },
            scopes,
            models: settings.models,
            expires_at: settings.expires_at,
            last_used_at: key.last_used_at,
            usage_today: UsageToday {
                requests: requests_today,
                tokens: tokens_today,
            },
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ApiKeyList {
    pub keys: Vec<ApiKeyView>,
}

crate::org_scoped!(unnamed: CreateKeyBody, PatchKeyBody);
