//! What an API key may do (issue 43): its scopes, the models it may call, when it expires,
//! and its limits (requests a minute, tokens a day, streams at once), enforced by the proxy
//! and the relay before any provider is called and held across instances by the database.
//! A key with none of these settings behaves as keys always did.

pub mod limiter;
pub(crate) mod repo;
pub mod service;
pub mod usage;

use chrono::{DateTime, Utc};
use entities::api_key;

pub use crate::domain::LimitKind;
pub use limiter::{Limiter, Refusal, StreamPermit};
pub use usage::UsageBook;

/// Where a key may be used: `inference` (the proxy, the relay, and being presented to serving
/// authorize) and `api` (every other route, the console included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scopes {
    pub inference: bool,
    pub api: bool,
}

/// The scope names, as bodies and views spell them.
pub const SCOPE_NAMES: [&str; 2] = ["inference", "api"];

impl Default for Scopes {
    fn default() -> Self {
        Self::ALL
    }
}

impl Scopes {
    pub const ALL: Self = Self {
        inference: true,
        api: true,
    };

    /// Scopes from their names; `None` when one is unknown or none is given.
    pub fn from_names<S: AsRef<str>>(names: &[S]) -> Option<Self> {
        let mut scopes = Self {
            inference: false,
            api: false,
        };
        for name in names {
            match name.as_ref() {
                "inference" => scopes.inference = true,
                "api" => scopes.api = true,
                _ => return None,
            }
        }
        (scopes.inference || scopes.api).then_some(scopes)
    }

    /// As stored (`api,inference`); a stored value keel cannot read grants nothing.
    pub fn parse(stored: &str) -> Self {
        let names: Vec<&str> = stored
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        Self::from_names(&names).unwrap_or(Self {
            inference: false,
            api: false,
        })
    }

    pub fn encode(self) -> String {
        self.names().join(",")
    }

    /// The names held, `api` first (the stored order).
    pub fn names(self) -> Vec<&'static str> {
        let mut names = Vec::with_capacity(2);
        if self.api {
            names.push("api");
        }
        if self.inference {
            names.push("inference");
        }
        names
    }
}

/// A key's limits; `None` is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub requests_per_minute: Option<u32>,
    pub tokens_per_day: Option<u64>,
    pub concurrent_streams: Option<u32>,
}

impl Limits {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// Everything a key's settings say, read once from its row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySettings {
    pub limits: Limits,
    pub scopes: Scopes,
    /// The models it may call through the proxy and relay; `None` is any.
    pub models: Option<Vec<String>>,
    pub expires_at: Option<DateTime<Utc>>,
}

impl Default for KeySettings {
    fn default() -> Self {
        Self {
            limits: Limits::default(),
            scopes: Scopes::ALL,
            models: None,
            expires_at: None,
        }
    }
}

impl KeySettings {
    pub fn of(key: &api_key::Model) -> Self {
        let positive = |n: Option<i64>| n.and_then(|n| u64::try_from(n).ok());
        Self {
            limits: Limits {
                requests_per_minute: key.requests_per_minute.and_then(|n| u32::try_from(n).ok()),
                tokens_per_day: positive(key.tokens_per_day),
                concurrent_streams: key.concurrent_streams.and_then(|n| u32::try_from(n).ok()),
            },
            scopes: Scopes::parse(&key.scopes),
            models: key
                .models
                .as_deref()
                .map(|text| serde_json::from_str::<Vec<String>>(text).unwrap_or_default()),
            expires_at: key.expires_at,
        }
    }

    /// Whether the key asks for nothing beyond what every key can do (the proxy's fast path).
    pub fn is_plain(&self) -> bool {
        *self == Self::default()
    }

    pub fn expired(&self, now: DateTime<Utc>) -> bool {
        self.expires_at.is_some_and(|at| at <= now)
    }

    /// A new key's settings are whole: an expiry, if any, lies ahead.
    pub fn check_new(&self, now: DateTime<Utc>) -> Result<(), KeyError> {
        match self.expires_at {
            Some(at) if at <= now => Err(KeyError::ExpiryInPast),
            _ => Ok(()),
        }
    }

    /// Whether the key may call `model` (exact names).
    pub fn allows_model(&self, model: &str) -> bool {
        self.models
            .as_ref()
            .is_none_or(|models| models.iter().any(|m| m == model))
    }
}

/// A change to a key's settings: `None` keeps a field, `Some(None)` clears it (no limit, any
/// model, never expires; scopes back to both), `Some(Some(_))` sets it. Limits change one by
/// one (JSON merge patch): `limits: null` clears them all.
#[derive(Debug, Clone, Default)]
pub struct SettingsChange {
    pub name: Option<Option<String>>,
    pub requests_per_minute: Option<Option<u32>>,
    pub tokens_per_day: Option<Option<u64>>,
    pub concurrent_streams: Option<Option<u32>>,
    pub scopes: Option<Scopes>,
    pub models: Option<Option<Vec<String>>>,
    pub expires_at: Option<Option<DateTime<Utc>>>,
}

/// Why a key flow did not happen.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("API key not found")]
    NotFound,
    #[error("organization not found")]
    OrgNotFound,
    /// `expiresAt` must lie in the future.
    #[error("expiresAt must be in the future")]
    ExpiryInPast,
    #[error(transparent)]
    Database(#[from] sea_orm::DbErr),
}

/// The UTC day `at` falls in, as usage rows name it.
pub fn day_of(at: DateTime<Utc>) -> String {
    day_text(at.date_naive())
}

/// A day as usage rows name it (`2026-11-28`).
pub fn day_text(day: chrono::NaiveDate) -> String {
    day.format("%Y-%m-%d").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_day_is_written_as_its_date() {
        for (at, day) in [
            ("2026-11-28T23:59:59Z", "2026-11-28"),
            ("2027-01-01T00:00:00Z", "2027-01-01"),
            ("0999-03-09T12:00:00Z", "0999-03-09"),
        ] {
            let at: DateTime<Utc> = at.parse().unwrap();
            assert_eq!(day_of(at), day);
            assert_eq!(day_of(at), at.format("%Y-%m-%d").to_string());
        }
    }

    #[test]
    fn scopes_round_trip_and_refuse_unknown_or_empty_lists() {
        assert_eq!(Scopes::parse(&Scopes::ALL.encode()), Scopes::ALL);
        let inference = Scopes::from_names(&["inference"]).unwrap();
        assert!(inference.inference && !inference.api);
        assert_eq!(Scopes::parse(&inference.encode()), inference);
        assert_eq!(Scopes::from_names(&["inference", "admin"]), None);
        assert_eq!(Scopes::from_names::<&str>(&[]), None);
        assert_eq!(
            Scopes::parse("garbage"),
            Scopes {
                inference: false,
                api: false
            }
        );
    }

    #[test]
    fn a_model_list_allows_exact_names_only() {
        let settings = KeySettings {
            models: Some(vec!["gpt-4o-mini".into()]),
            ..KeySettings::default()
        };
        assert!(settings.allows_model("gpt-4o-mini"));
        assert!(!settings.allows_model("gpt-4o"));
        assert!(!settings.allows_model("GPT-4O-MINI"));
        assert!(KeySettings::default().allows_model("anything"));
        assert!(KeySettings::default().is_plain());
        assert!(!settings.is_plain());
    }
}
