//! Layered settings: embedded defaults → `config/default.toml` → `config/<profile>.toml`
//! → the named `KEEL_*` variables → `KEEL__SECTION__KEY` variables.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use figment::providers::{Env, Format, Toml};
use figment::Figment;
use serde::{Deserialize, Deserializer};

use crate::domain::Cents;

/// The shipped defaults, compiled in so the binary runs from any directory.
const DEFAULTS: &str = include_str!("../../config/default.toml");

/// Named variables of the contract and the key each one sets.
const NAMED_VARS: &[(&str, &str)] = &[
    ("KEEL_DATABASE_URL", "database.url"),
    ("KEEL_LISTEN", "server.listen"),
    ("KEEL_INTERNAL_KEYS", "auth.internal_keys"),
    ("KEEL_SESSION_SECRET", "auth.session_secret"),
    ("KEEL_PROVIDER_OPENAI_URL", "providers.openai_url"),
    ("KEEL_PROVIDER_ANTHROPIC_URL", "providers.anthropic_url"),
    ("KEEL_PROVIDER_OPENROUTER_URL", "providers.openrouter_url"),
    ("KEEL_PROVIDER_GOOGLE_URL", "providers.google_url"),
    ("KEEL_PAYMENTS", "payments.mode"),
    ("KEEL_STRIPE_API_URL", "payments.stripe_api_url"),
    ("KEEL_STRIPE_SECRET_KEY", "payments.stripe_secret_key"),
    ("KEEL_STRIPE_WEBHOOK_SECRET", "payments.stripe_webhook_secret"),
    ("KEEL_SERVING_URL", "serving.url"),
    ("KEEL_HUB_URL", "hub.url"),
    ("KEEL_HUB_TOKEN", "hub.token"),
    ("KEEL_TRACKER_URL", "tracker.url"),
    ("KEEL_TRACKER_API_KEY", "tracker.api_key"),
];

#[derive(Debug, Clone, Deserialize)]
pub struct Settings {
    pub server: ServerSettings,
    pub database: DatabaseSettings,
    pub auth: AuthSettings,
    pub telemetry: TelemetrySettings,
    pub providers: ProviderSettings,
    pub payments: PaymentSettings,
    pub serving: ServiceEndpoint,
    pub hub: HubSettings,
    pub tracker: TrackerSettings,
    pub billing: BillingSettings,
    pub pricing: PricingSettings,
    pub queue: QueueSettings,
    pub flash: FlashSettings,
    pub proxy: ProxySettings,
    pub traces: TraceSettings,
    pub secrets: SecretsSettings,
    pub console: ConsoleSettings,
    pub webhooks: WebhookSettings,
    pub otlp_push: OtlpPushSettings,
}

/// Recorded calls pushed to projects' OTLP/HTTP endpoints (`[otlp_push]`); the destinations
/// follow `[webhooks]`' rules.
#[derive(Debug, Clone, Deserialize)]
pub struct OtlpPushSettings {
    /// This instance sends what waits (default true; every instance may, sharing the work).
    pub exporter: bool,
    /// Spans in one request at most (1..=512)...
    pub batch_spans: usize,
    /// ...and how often the exporter looks for what waits, in milliseconds (a batch goes at
    /// once when this many have queued here since its last look).
    pub interval_ms: u64,
    /// A push that takes longer fails, in seconds.
    pub timeout_secs: u64,
    /// A batch being sent is its exporter's for this long (seconds); one left by an instance
    /// that died is sent again after it.
    pub lease_secs: u64,
    /// After a failed push the project's next waits 1 s, doubling up to this (seconds).
    pub max_backoff_secs: u64,
    /// After a failed push, the project's traces that have waited longer than this (hours)
    /// are dropped and counted.
    pub drop_after_hours: u64,
}

/// Outbound webhooks (`[webhooks]`).
#[derive(Debug, Clone, Deserialize)]
pub struct WebhookSettings {
    /// Endpoints may be `http://` (default false: `https://` only).
    pub allow_http: bool,
    /// Endpoints may be at loopback, private, link-local and other non-public addresses
    /// (default false).
    pub allow_private_destinations: bool,
    /// This instance sends due deliveries (default true; every instance may).
    pub dispatcher: bool,
    /// Endpoints an organization may have (default 20).
    pub max_endpoints_per_org: u64,
    /// An HTTP(S) proxy deliveries go through (default none: direct). keel never takes one
    /// from the environment; with this set it resolves and checks each destination itself
    /// before asking the proxy.
    pub proxy_url: String,
}

#[derive(Clone, Deserialize)]
pub struct SecretsSettings {
    /// 64 hex characters (AES-256); empty: derived from the session secret.
    pub encryption_key: String,
}

impl std::fmt::Debug for SecretsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretsSettings")
            .field("encryption_key", &(!self.encryption_key.is_empty()))
            .finish()
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct ServerSettings {
    /// `HOST:PORT`, `localhost:PORT` or a bare `PORT` (which the environment hands over as a
    /// number).
    #[serde(deserialize_with = "string_or_number")]
    pub listen: String,
    pub max_body_bytes: usize,
    pub shutdown_grace_secs: u64,
    pub shutdown_timeout_secs: u64,
    pub workers: usize,
    /// Connections the kernel may hold for keel before it accepts them (capped by
    /// `net.core.somaxconn`).
    pub backlog: u32,
    /// Seconds an idle client connection stays open for its next request (0: closed after
    /// each answer).
    pub keep_alive_secs: u64,
    /// Seconds a request's whole body may take to arrive after its head (408 after; 0: no
    /// bound).
    pub body_timeout_secs: u64,
}

#[derive(Debug, Clone, Deserialize)]
pub struct DatabaseSettings {
    pub url: String,
    pub max_connections: u32,
    pub sqlite_busy_timeout_ms: u64,
    /// SQLite only: the write-ahead log's length, in pages, past which a commit copies it
    /// back into the database file (`PRAGMA wal_autocheckpoint`).
    pub sqlite_wal_autocheckpoint_pages: u32,
    pub acquire_timeout_secs: u64,
    pub connect_timeout_secs: u64,
    pub lock_timeout_ms: u64,
    pub statement_timeout_ms: u64,
    pub idle_in_transaction_timeout_ms: u64,
}

#[derive(Clone, Deserialize)]
pub struct AuthSettings {
    #[serde(deserialize_with = "comma_list")]
    pub internal_keys: Vec<String>,
    pub session_secret: String,
    pub session_ttl_secs: i64,
}

impl std::fmt::Debug for AuthSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthSettings")
            .field(
                "internal_keys",
                &format!("{} configured", self.internal_keys.len()),
            )
            .field("session_secret", &(!self.session_secret.is_empty()))
            .field("session_ttl_secs", &self.session_ttl_secs)
            .finish()
    }
}

/// The web console under `/console`.
#[derive(Debug, Clone, Deserialize)]
pub struct ConsoleSettings {
    /// When the session cookie is marked `Secure`.
    pub secure_cookies: SecureCookies,
    /// How long a console sign-in lasts, in seconds (a session token's own expiry ends it sooner).
    pub session_ttl_secs: i64,
    /// How often the job pages refresh themselves, in seconds.
    pub refresh_secs: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SecureCookies {
    /// When the request came over https (as the connection or a trusted proxy's headers say).
    Auto,
    Always,
    Never,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Pretty,
    Json,
}

#[derive(Debug, Clone, Deserialize)]
pub struct TelemetrySettings {
    pub format: LogFormat,
    pub level: String,
    /// Lines buffered for the log writer thread before new ones are dropped (and counted).
    pub buffered_lines: usize,
    /// Where keel's own spans go over OTLP/HTTP protobuf: a base URL as in
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` (`/v1/traces` is appended unless it ends so). `None` (or
    /// empty): nothing is exported.
    #[serde(default)]
    pub otlp_endpoint: Option<String>,
}

impl TelemetrySettings {
    /// The OTLP traces URL, if one is configured: the base with `/v1/traces` appended unless
    /// it already ends so. Errors name a value that is no http(s) URL.
    pub fn otlp_traces_url(&self) -> Result<Option<String>, String> {
        let Some(endpoint) = self
            .otlp_endpoint
            .as_deref()
            .map(str::trim)
            .filter(|e| !e.is_empty())
        else {
            return Ok(None);
        };
        let parsed = url::Url::parse(endpoint)
            .map_err(|e| format!("telemetry.otlp_endpoint {endpoint:?} is not a URL: {e}"))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(format!(
                "telemetry.otlp_endpoint {endpoint:?} must be an http or https URL"
            ));
        }
        let base = endpoint.trim_end_matches('/');
        Ok(Some(match base.ends_with("/v1/traces") {
            true => base.to_owned(),
            false => format!("{base}/v1/traces"),
        }))
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct ProviderSettings {
    pub openai_url: String,
    pub anthropic_url: String,
    pub openrouter_url: String,
    pub google_url: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PaymentsMode {
    Simulated,
    Stripe,
}

#[derive(Clone, Deserialize)]
pub struct PaymentSettings {
    pub mode: PaymentsMode,
    pub stripe_api_url: String,
    pub stripe_secret_key: String,
    pub stripe_webhook_secret: String,
    pub reconcile_interval_secs: u64,
    pub reconcile_min_age_secs: u64,
}

impl std::fmt::Debug for PaymentSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PaymentSettings")
            .field("mode", &self.mode)
            .field("stripe_api_url", &self.stripe_api_url)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct ServiceEndpoint {
    pub url: String,
    /// Longest wait for one call to the serving layer (sample, undeploy), in milliseconds.
    pub timeout_ms: u64,
}

#[derive(Clone, Deserialize)]
pub struct HubSettings {
    pub url: String,
    pub token: String,
    /// Hub repository of environments published without `hubRepo`.
    pub default_repo: String,
    pub timeout_ms: u64,
    /// First retry delay of an organization whose provisioning failed; doubles per failure.
    pub backoff_base_secs: u64,
    pub backoff_max_secs: u64,
    /// How long one pass holds an environment it is provisioning (other instances skip it).
    pub lease_secs: u64,
}

impl std::fmt::Debug for HubSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubSettings")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

#[derive(Clone, Deserialize)]
pub struct TrackerSettings {
    pub url: String,
    pub api_key: String,
    /// Longest wait for one tracker run read, in milliseconds.
    pub timeout_ms: u64,
}

impl std::fmt::Debug for TrackerSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrackerSettings")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct BillingSettings {
    pub flat_run_fee_cents: Cents,
    pub starter_credit_cents: Cents,
    pub serving_markup_percent: i64,
    #[serde(default)]
    pub promo_codes: BTreeMap<String, Cents>,
    pub max_batch: usize,
    /// Grouped ledger transactions committing at once (PostgreSQL; SQLite commits one).
    pub groups_in_flight: usize,
    pub actor_idle_secs: u64,
    pub stall_after_secs: u64,
    pub adapter_cache_ttl_ms: u64,
    /// `billing.balance.low` is sent when a balance falls under this, for organizations
    /// without an auto top-up threshold of their own.
    pub low_balance_cents: Cents,
    /// Credit grants' default priorities (lower is drawn first): starter credit, promo codes
    /// and manual grants...
    pub promotional_priority: i32,
    /// ...and top-ups, auto top-ups, refunds and migrated balances.
    pub paid_priority: i32,
    /// Days until starter credit expires (0: never).
    pub starter_credit_expires_days: u32,
    /// Days until a promo code's credit expires, by code (absent: never).
    #[serde(default)]
    pub promo_expires_days: BTreeMap<String, u32>,
    /// How often each instance expires lapsed grants, in seconds.
    pub expiry_sweep_secs: u64,
}

#[derive(Debug, Clone, Deserialize)]
pub struct PricingSettings {
    #[serde(default)]
    pub models: BTreeMap<String, ModelPrice>,
}

pub use crate::domain::ModelPrice;

#[derive(Debug, Clone, Deserialize)]
pub struct QueueSettings {
    pub stale_after_secs: u64,
    pub max_attempts: u32,
    pub sweep_interval_secs: u64,
    pub max_claim_wait_secs: u64,
    /// A retryable failure's first wait before the next attempt, in seconds; each further
    /// attempt doubles it (±20% jitter)...
    pub retry_backoff_base_secs: u64,
    /// ...up to this.
    pub retry_backoff_max_secs: u64,
    /// Running jobs an organization may hold at once unless an operator set its own cap;
    /// 0: no cap.
    pub max_running_per_org: u32,
    /// A job blocked at its claim for want of funds is queued again at the organization's
    /// next credit.
    pub requeue_blocked_on_credit: bool,
    /// Claim statements of one action in flight at once per instance (PostgreSQL; 1..=64):
    /// claims arriving while all are busy join the next one.
    pub claims_in_flight: usize,
    /// Cron schedules: each instance looks for due ticks at most this far apart, in
    /// milliseconds (a new or changed schedule wakes this instance's look at once).
    pub schedule_poll_ms: u64,
    /// A tick enqueued at most this long after its time is on time; an older one was missed
    /// (no instance ran then) and follows its schedule's `catchUp`, in seconds.
    pub schedule_grace_secs: u64,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ProxySettings {
    /// Longest wait to connect to a provider, in milliseconds.
    pub connect_timeout_ms: u64,
    /// Longest silence from a provider (from the call's start to its headers, or while
    /// waiting for the next chunk of its body) before the call is abandoned (504 before the
    /// headers; a stream ends without its last chunk), in seconds.
    pub read_timeout_secs: u64,
    /// How long a verified API key or a project's organization is remembered, in milliseconds.
    pub auth_cache_ttl_ms: u64,
    /// How long a connection to a provider may sit idle and still be reused, in milliseconds:
    /// shorter than the providers' own keep-alive timeout, so that keel never sends a call
    /// on a connection the provider is closing (the call would fail with 502).
    pub pool_idle_timeout_ms: u64,
    /// Longest a streamed answer waits for its client to take the next bytes (a client that
    /// stopped reading) before both the client's connection and the provider's call end, in
    /// seconds; 0: no bound.
    pub client_write_timeout_secs: u64,
}

#[derive(Debug, Clone, Deserialize)]
pub struct TraceSettings {
    /// The trace writer inserts when it holds this many traces (at most 500, a batch's
    /// largest size; more acts as 500)...
    pub flush_rows: usize,
    /// ...or when its oldest trace has waited this long, in milliseconds.
    pub flush_ms: u64,
    /// Under load, a batch starts at most this often (milliseconds from the previous
    /// batch's start) and takes everything queued by then; 0 writes each batch as soon as it
    /// reaches `flush_rows`.
    pub batch_interval_ms: u64,
    /// Traces waiting to be written at most; beyond it new traces are dropped and counted
    /// (`keel_traces_dropped_total`) rather than slow the proxy down.
    pub queue_capacity: usize,
    /// A page of a trace export ends once its records reach this many bytes (its
    /// `nextCursor` goes on from there); a selection past it is refused.
    pub export_max_page_bytes: usize,
    /// How often each instance deletes the traces older than their project's
    /// `traceRetentionDays`, in seconds.
    pub retention_sweep_secs: u64,
    /// Whether this instance runs the search indexer: it enters newly written traces' words
    /// in the search index (PostgreSQL's `search` column, instances sharing the work; SQLite's
    /// FTS5 table), and gives traces recorded before keel kept their words those words.
    pub search_indexer: bool,
}

#[derive(Debug, Clone, Deserialize)]
pub struct FlashSettings {
    pub event_allowlist: Vec<String>,
}

/// A string, or a number taken as its digits (`KEEL_LISTEN=8080`).
fn string_or_number<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum StringOrNumber {
        String(String),
        Number(u64),
    }
    Ok(match StringOrNumber::deserialize(d)? {
        StringOrNumber::String(s) => s,
        StringOrNumber::Number(n) => n.to_string(),
    })
}

/// Accepts `["a", "b"]` or `"a,b"` (as environment variables carry it).
fn comma_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum ListOrString {
        List(Vec<String>),
        String(String),
    }
    let items = match ListOrString::deserialize(d)? {
        ListOrString::List(items) => items,
        ListOrString::String(s) => s.split(',').map(str::to_owned).collect(),
    };
    Ok(items
        .into_iter()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect())
}

/// Whether `key` (dotted, lower case) is a setting of the shipped defaults or an entry of
/// one of their open tables (promo codes, model prices).
fn is_known_setting(key: &str) -> bool {
    let defaults = Figment::from(Toml::string(DEFAULTS));
    if defaults.find_value(key).is_ok() {
        return true;
    }
    ["billing.promo_codes.", "pricing.models."]
        .iter()
        .any(|open| key.strip_prefix(open).is_some_and(|rest| !rest.is_empty()))
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("configuration: {0}")]
    Load(#[from] Box<figment::Error>),
    #[error("configuration: {key} = {value:?} is not valid: {reason}")]
    Invalid {
        key: &'static str,
        value: String,
        reason: String,
    },
}

impl Settings {
    /// Loads settings from the config directory (`KEEL_CONFIG_DIR`, else `./config`),
    /// the `KEEL_PROFILE` profile file and the environment.
    pub fn load() -> Result<Self, ConfigError> {
        let dir = std::env::var_os("KEEL_CONFIG_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("config"));
        let mut figment = Figment::from(Toml::string(DEFAULTS)).merge(Toml::file(dir.join("default.toml")));
        if let Ok(profile) = std::env::var("KEEL_PROFILE") {
            if !profile.is_empty() {
                figment = figment.merge(Toml::file(dir.join(format!("{profile}.toml"))));
            }
        }
        let names: Vec<&str> = NAMED_VARS.iter().map(|(var, _)| *var).collect();
        figment = figment
            .merge(
                Env::raw()
                    .only(&names)
                    .map(|var| {
                        NAMED_VARS
                            .iter()
                            .find(|(name, _)| var.as_str().eq_ignore_ascii_case(name))
                            .map(|(_, key)| (*key).into())
                            .unwrap_or_else(|| var.into())
                    })
                    // Values stay strings: a URL or key must never be parsed as TOML.
                    .lowercase(false),
            )
            .merge(Env::prefixed("KEEL__").split("__"));
        Self::from_figment(figment)
    }

    /// The compiled-in defaults alone (tests start from these).
    pub fn defaults() -> Result<Self, ConfigError> {
        Self::from_figment(Figment::from(Toml::string(DEFAULTS)))
    }

    fn from_figment(figment: Figment) -> Result<Self, ConfigError> {
        let settings: Settings = figment.extract().map_err(Box::new)?;
        settings.validate()?;
        Ok(settings)
    }

    /// Checks what would otherwise fail later, so start-up stops with one clear line.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key: &'static str, value: &str, reason: &str| ConfigError::Invalid {
            key,
            value: value.to_owned(),
            reason: reason.to_owned(),
        };
        self.listen_addr()?;
        if let Err(reason) = self.telemetry.otlp_traces_url() {
            let value = self.telemetry.otlp_endpoint.clone().unwrap_or_default();
            return Err(invalid("telemetry.otlp_endpoint", &value, &reason));
        }
        let db = &self.database.url;
        if !(db.starts_with("sqlite:") || db.starts_with("postgres://") || db.starts_with("postgresql://")) {
            return Err(invalid(
                "database.url",
                db,
                "expected sqlite://... or postgres://...",
            ));
        }
        let urls = [
            ("providers.openai_url", &self.providers.openai_url),
            ("providers.anthropic_url", &self.providers.anthropic_url),
            ("providers.openrouter_url", &self.providers.openrouter_url),
            ("providers.google_url", &self.providers.google_url),
            ("payments.stripe_api_url", &self.payments.stripe_api_url),
            ("serving.url", &self.serving.url),
            ("hub.url", &self.hub.url),
            ("tracker.url", &self.tracker.url),
            ("webhooks.proxy_url", &self.webhooks.proxy_url),
        ];
        for (key, value) in urls {
            if !value.is_empty() {
                let parsed = url::Url::parse(value).map_err(|e| invalid(key, value, &e.to_string()))?;
                if !matches!(parsed.scheme(), "http" | "https") {
                    return Err(invalid(key, value, "expected an http(s) URL"));
                }
            }
        }
        if self.payments.mode == PaymentsMode::Stripe && self.payments.stripe_secret_key.is_empty() {
            return Err(invalid(
                "payments.stripe_secret_key",
                "",
                "KEEL_STRIPE_SECRET_KEY is required when KEEL_PAYMENTS=stripe",
            ));
        }
        if self.console.session_ttl_secs <= 0 || self.console.refresh_secs == 0 {
            return Err(invalid(
                "console.session_ttl_secs",
                &self.console.session_ttl_secs.to_string(),
                "console.session_ttl_secs and console.refresh_secs must be positive",
            ));
        }
        if self.auth.session_ttl_secs <= 0 {
            return Err(invalid(
                "auth.session_ttl_secs",
                &self.auth.session_ttl_secs.to_string(),
                "must be positive",
            ));
        }
        let push = &self.otlp_push;
        for (key, value, range) in [
            ("otlp_push.batch_spans", push.batch_spans as u64, 1..=512),
            ("otlp_push.interval_ms", push.interval_ms, 1..=60_000),
            ("otlp_push.timeout_secs", push.timeout_secs, 1..=300),
            ("otlp_push.lease_secs", push.lease_secs, 1..=3600),
            ("otlp_push.max_backoff_secs", push.max_backoff_secs, 1..=86_400),
            ("otlp_push.drop_after_hours", push.drop_after_hours, 1..=8760),
        ] {
            if !range.contains(&value) {
                let reason = format!("must be within {}..={}", range.start(), range.end());
                return Err(invalid(key, &value.to_string(), &reason));
            }
        }
        for (key, value, range) in [
            ("queue.schedule_poll_ms", self.queue.schedule_poll_ms, 10..=60_000),
            (
                "queue.schedule_grace_secs",
                self.queue.schedule_grace_secs,
                1..=86_400,
            ),
        ] {
            if !range.contains(&value) {
                let reason = format!("must be within {}..={}", range.start(), range.end());
                return Err(invalid(key, &value.to_string(), &reason));
            }
        }
        if !(1..=64).contains(&self.queue.claims_in_flight) {
            return Err(invalid(
                "queue.claims_in_flight",
                &self.queue.claims_in_flight.to_string(),
                "must be within 1..=64",
            ));
        }
        if !(0..=1000).contains(&self.billing.serving_markup_percent) {
            return Err(invalid(
                "billing.serving_markup_percent",
                &self.billing.serving_markup_percent.to_string(),
                "must be within 0..=1000",
            ));
        }
        if !self.secrets.encryption_key.is_empty()
            && hex::decode(&self.secrets.encryption_key).map_or(true, |k| k.len() != 32)
        {
            return Err(invalid(
                "secrets.encryption_key",
                "(hidden)",
                "expected 64 hex characters",
            ));
        }
        for (key, value) in [
            ("serving.timeout_ms", self.serving.timeout_ms),
            ("hub.timeout_ms", self.hub.timeout_ms),
            ("tracker.timeout_ms", self.tracker.timeout_ms),
            ("hub.backoff_base_secs", self.hub.backoff_base_secs),
            ("hub.lease_secs", self.hub.lease_secs),
        ] {
            if value == 0 {
                return Err(invalid(key, "0", "must be positive"));
            }
        }
        for (key, value) in [
            ("proxy.connect_timeout_ms", self.proxy.connect_timeout_ms),
            ("proxy.read_timeout_secs", self.proxy.read_timeout_secs),
            ("proxy.pool_idle_timeout_ms", self.proxy.pool_idle_timeout_ms),
            (
                "database.sqlite_wal_autocheckpoint_pages",
                u64::from(self.database.sqlite_wal_autocheckpoint_pages),
            ),
            ("traces.flush_ms", self.traces.flush_ms),
            ("traces.flush_rows", self.traces.flush_rows as u64),
            ("traces.queue_capacity", self.traces.queue_capacity as u64),
        ] {
            if value == 0 {
                return Err(invalid(key, "0", "must be positive"));
            }
        }
        if self.hub.backoff_max_secs < self.hub.backoff_base_secs {
            return Err(invalid(
                "hub.backoff_max_secs",
                &self.hub.backoff_max_secs.to_string(),
                "must be at least hub.backoff_base_secs",
            ));
        }
        if self.hub.default_repo.trim().is_empty() {
            return Err(invalid("hub.default_repo", "", "must not be empty"));
        }
        if self.queue.max_attempts == 0 {
            return Err(invalid("queue.max_attempts", "0", "must be at least 1"));
        }
        if self.queue.retry_backoff_max_secs < self.queue.retry_backoff_base_secs {
            return Err(invalid(
                "queue.retry_backoff_max_secs",
                &self.queue.retry_backoff_max_secs.to_string(),
                "must be at least queue.retry_backoff_base_secs",
            ));
        }
        Ok(())
    }

    /// `server.listen` as an address: `HOST:PORT` (a name such as `localhost` is resolved),
    /// or a bare `PORT` on 127.0.0.1.
    pub fn listen_addr(&self) -> Result<SocketAddr, ConfigError> {
        use std::net::ToSocketAddrs;
        let listen = self.server.listen.trim();
        let invalid = |reason: String| ConfigError::Invalid {
            key: "server.listen",
            value: self.server.listen.clone(),
            reason,
        };
        if let Ok(port) = listen.parse::<u16>() {
            return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
        }
        if let Ok(addr) = listen.parse() {
            return Ok(addr);
        }
        let mut addrs = listen
            .to_socket_addrs()
            .map_err(|e| invalid(format!("expected HOST:PORT or PORT ({e})")))?
            .collect::<Vec<_>>();
        // `localhost` may resolve to ::1 first; IPv4 is what clients of 127.0.0.1 expect.
        addrs.sort_by_key(|a| !a.is_ipv4());
        addrs
            .into_iter()
            .next()
            .ok_or_else(|| invalid("the name resolves to no address".into()))
    }

    /// What an operator should know before the first request: missing credentials (the
    /// routes that need them will refuse), `KEEL__` variables that name no setting, a
    /// `KEEL_PROFILE` without its file, a `KEEL_CONFIG_DIR` that does not exist.
    pub fn startup_warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if self.auth.internal_keys.is_empty() {
            warnings.push(
                "no internal key is set (KEEL_INTERNAL_KEYS): operator and worker routes will answer 401"
                    .into(),
            );
        }
        if self.auth.session_secret.is_empty() {
            warnings.push(
                "no session secret is set (KEEL_SESSION_SECRET): session tokens will be refused and console sign-ins end at restart"
                    .into(),
            );
        }
        let dir = std::env::var_os("KEEL_CONFIG_DIR").map(PathBuf::from);
        if let Some(dir) = &dir {
            if !dir.is_dir() {
                warnings.push(format!(
                    "KEEL_CONFIG_DIR={} does not exist: only the built-in defaults and the environment apply",
                    dir.display()
                ));
            }
        }
        if let Ok(profile) = std::env::var("KEEL_PROFILE") {
            let file = dir
                .unwrap_or_else(|| PathBuf::from("config"))
                .join(format!("{profile}.toml"));
            if !profile.is_empty() && !file.is_file() {
                warnings.push(format!(
                    "KEEL_PROFILE={profile} names no file ({} does not exist)",
                    file.display()
                ));
            }
        }
        for (var, _) in std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v))) {
            if let Some(path) = var.strip_prefix("KEEL__") {
                let key = path.to_lowercase().replace("__", ".");
                if !is_known_setting(&key) {
                    warnings.push(format!("{var} names no known setting ({key}); it is ignored"));
                }
            }
        }
        warnings
    }

    pub fn is_sqlite(&self) -> bool {
        self.database.url.starts_with("sqlite:")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_otlp_endpoint_is_a_base_url_with_v1_traces_appended_once() {
        let url = |endpoint: Option<&str>| {
            TelemetrySettings {
                format: LogFormat::Json,
                level: "info".into(),
                buffered_lines: 1,
                otlp_endpoint: endpoint.map(str::to_owned),
            }
            .otlp_traces_url()
        };
        assert_eq!(url(None), Ok(None));
        assert_eq!(url(Some("  ")), Ok(None));
        assert_eq!(
            url(Some("http://collector:4318")),
            Ok(Some("http://collector:4318/v1/traces".into()))
        );
        assert_eq!(
            url(Some("https://cloud.langfuse.com/api/public/otel/")),
            Ok(Some(
                "https://cloud.langfuse.com/api/public/otel/v1/traces".into()
            ))
        );
        assert_eq!(
            url(Some("http://collector:4318/v1/traces")),
            Ok(Some("http://collector:4318/v1/traces".into()))
        );
        assert!(url(Some("collector:4318")).is_err());
        assert!(url(Some("ftp://collector/x")).is_err());
    }

    #[test]
    fn shipped_defaults_load_and_validate() {
        let settings = Settings::defaults().expect("defaults load");
        assert_eq!(settings.server.listen, "127.0.0.1:8080");
        assert_eq!(settings.database.url, "sqlite://keel.db?mode=rwc");
        assert!(settings.auth.internal_keys.is_empty());
        assert_eq!(settings.billing.promo_codes.get("WELCOME10"), Some(&Cents(1000)));
        assert_eq!(settings.billing.serving_markup_percent, 20);
        assert!(settings
            .pricing
            .models
            .contains_key("meta-llama/Llama-3.1-8B-Instruct"));
    }

    #[test]
    fn listen_accepts_a_bare_port_and_localhost() {
        let listen = |value: &str| {
            let figment = Figment::from(Toml::string(DEFAULTS))
                .merge(figment::providers::Serialized::default("server.listen", value));
            Settings::from_figment(figment).map(|s| s.listen_addr().map(|a| a.to_string()))
        };
        assert_eq!(
            listen("9000").expect("loads").expect("an address"),
            "127.0.0.1:9000"
        );
        assert_eq!(
            listen("localhost:9001").expect("loads").expect("an address"),
            "127.0.0.1:9001"
        );
        assert_eq!(
            listen("0.0.0.0:80").expect("loads").expect("an address"),
            "0.0.0.0:80"
        );
        assert!(listen("no port here").is_err());
        // As the environment hands a bare port over: a number.
        let figment = Figment::from(Toml::string(DEFAULTS))
            .merge(figment::providers::Serialized::default("server.listen", 9002));
        let settings = Settings::from_figment(figment).expect("a number loads");
        assert_eq!(
            settings.listen_addr().expect("an address").to_string(),
            "127.0.0.1:9002"
        );
    }

    #[test]
    fn settings_are_known_by_their_dotted_keys() {
        assert!(is_known_setting("server.listen"));
        assert!(is_known_setting("queue.max_claim_wait_secs"));
        assert!(is_known_setting("billing.promo_codes.SPRING"));
        assert!(!is_known_setting("server.lisen"));
        assert!(!is_known_setting("nothing"));
    }

    #[test]
    fn internal_keys_accept_a_comma_separated_string() {
        let figment = Figment::from(Toml::string(DEFAULTS)).merge(figment::providers::Serialized::default(
            "auth.internal_keys",
            " a, b ,,c",
        ));
        let settings = Settings::from_figment(figment).expect("loads");
        assert_eq!(settings.auth.internal_keys, vec!["a", "b", "c"]);
    }

    #[test]
    fn stripe_mode_without_a_secret_is_rejected() {
        let figment = Figment::from(Toml::string(DEFAULTS))
            .merge(figment::providers::Serialized::default("payments.mode", "stripe"));
        let err = Settings::from_figment(figment).expect_err("must fail");
        assert!(err.to_string().contains("KEEL_STRIPE_SECRET_KEY"));
    }

    #[test]
    fn an_unparsable_url_is_rejected() {
        let figment = Figment::from(Toml::string(DEFAULTS)).merge(figment::providers::Serialized::default(
            "serving.url",
            "not a url",
        ));
        assert!(Settings::from_figment(figment).is_err());
    }

    #[test]
    fn prices_load_exactly_and_a_bad_one_is_rejected() {
        let priced = |price: &str| {
            Figment::from(Toml::string(DEFAULTS)).merge(Toml::string(&format!(
                "[pricing.models.m]\ninput_per_mtok_cents = {price}\noutput_per_mtok_cents = 1\n"
            )))
        };
        let settings = Settings::from_figment(priced("0.15")).expect("loads");
        assert_eq!(
            settings.pricing.models["m"].input_per_mtok_cents,
            crate::domain::TokenPrice::parse("0.15").expect("a price")
        );
        for bad in ["-1.0", "0.0000001", "\"ten\""] {
            assert!(Settings::from_figment(priced(bad)).is_err(), "{bad}");
        }
    }
}
