//! What every handler can reach.

use std::sync::Arc;

use sea_orm::DatabaseConnection;

use crate::auth::keys::InternalKeys;
use crate::auth::session::SessionKeys;
use crate::config::Settings;

#[derive(Clone)]
pub struct AppState {
    pub db: DatabaseConnection,
    pub settings: Arc<Settings>,
    pub internal_keys: InternalKeys,
    pub session_keys: Option<SessionKeys>,
}

impl AppState {
    pub fn new(db: DatabaseConnection, settings: Settings) -> Self {
        Self {
            internal_keys: InternalKeys::new(&settings.auth.internal_keys),
            session_keys: SessionKeys::new(&settings.auth.session_secret),
            settings: Arc::new(settings),
            db,
        }
    }
}

impl AppState {
    /// Stops background work after it drains, then closes the database pool.
    pub async fn shutdown(&self) {
        if let Err(err) = self.db.clone().close().await {
            tracing::warn!(error = %err, "closing the database pool");
        }
    }
}
