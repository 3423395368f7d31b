//! What every handler can reach: the core (its flows, actors and loops) and what only the
//! web side needs (cookies, sessions, the console's box, the proxy's providers).

use std::sync::Arc;

use keel_core::auth::keys::InternalKeys;
use keel_core::auth::session::SessionKeys;
use keel_core::config::Settings;
use keel_core::secrets::SecretBox;
use keel_core::Core;
use sea_orm::DatabaseConnection;

#[derive(Clone)]
pub struct AppState {
    /// The core, started; its fields read as the state's own (`state.db`, `state.jobs`).
    pub core: Core,
    pub internal_keys: InternalKeys,
    pub session_keys: Option<SessionKeys>,
    /// Seals a new API key's secret for its one view in the console: the secrets' box, or
    /// one of this process's own when there is none (a single instance without a secret).
    pub console_box: SecretBox,
    /// The recording proxy's providers (each HTTP worker calls them through a client of its
    /// own, made from this).
    pub upstreams: crate::upstream::UpstreamConfig,
    /// Signs the console's session cookies (one key per process when no secret is set).
    pub console_keys: keel_core::auth::cookies::CookieKeys,
    /// Sign-in attempts per client address.
    pub sign_in_throttle: keel_core::auth::throttle::SignInThrottle,
}

impl std::ops::Deref for AppState {
    type Target = Core;

    fn deref(&self) -> &Core {
        &self.core
    }
}

impl AppState {
    /// Starts the core; must run inside an actix system (the ledger has an arbiter).
    pub fn new(db: DatabaseConnection, settings: Settings) -> anyhow::Result<Self> {
        let core = Core::start(db, settings)?;
        let settings = Arc::clone(&core.settings);
        Ok(Self {
            upstreams: crate::upstream::UpstreamConfig::new(&settings, core.tls.clone())?,
            console_box: core.secret_box.clone().unwrap_or_else(SecretBox::ephemeral),
            internal_keys: InternalKeys::new(&settings.auth.internal_keys),
            session_keys: SessionKeys::new(&settings.auth.session_secret),
            console_keys: keel_core::auth::cookies::CookieKeys::new(
                &settings.auth.session_secret,
                settings.console.session_ttl_secs,
            )
            .map_err(|e| anyhow::anyhow!("console cookie keys: {e}"))?,
            sign_in_throttle: keel_core::auth::throttle::SignInThrottle::default(),
            core,
        })
    }

    /// Stops the core's background work after it drains, then closes the database pool
    /// (`Core::shutdown` has the order).
    pub async fn shutdown(&self) {
        self.core.shutdown().await;
    }
}
