//! Connecting to SQLite (embedded default) or PostgreSQL, and applying migrations.

use std::time::Duration;

use migration::{Migrator, MigratorTrait};
use sea_orm::sqlx::sqlite::{SqliteJournalMode, SqliteSynchronous};
use sea_orm::{ConnectOptions, Database, DatabaseConnection};

use crate::config::DatabaseSettings;

pub async fn connect(settings: &DatabaseSettings) -> anyhow::Result<DatabaseConnection> {
    let sqlite = settings.url.starts_with("sqlite:");
    let mut options = ConnectOptions::new(settings.url.clone());
    let max = match settings.max_connections {
        // One SQLite connection serializes every write: no SQLITE_BUSY, ever.
        0 if sqlite => 1,
        0 => 16,
        n => n,
    };
    options
        .max_connections(max)
        .min_connections(if sqlite { max } else { 1 })
        .acquire_timeout(Duration::from_secs(settings.acquire_timeout_secs))
        .connect_timeout(Duration::from_secs(10))
        // A connection in steady use goes out unpinged (a ping is one more round trip on
        // every checkout); one idle long enough to have been dropped is pinged first.
        .test_before_acquire_if_idle_for(Duration::from_secs(10))
        .sqlx_logging(false);
    if sqlite {
        let busy = Duration::from_millis(settings.sqlite_busy_timeout_ms);
        options.map_sqlx_sqlite_opts(move |o| {
            o.journal_mode(SqliteJournalMode::Wal)
                // FULL: an acknowledged write survives a power loss.
                .synchronous(SqliteSynchronous::Full)
                .busy_timeout(busy)
                .foreign_keys(true)
                .create_if_missing(true)
        });
    }
    Database::connect(options)
        .await
        .map_err(|e| anyhow::anyhow!("cannot connect to the database: {e}"))
}

pub async fn migrate_up(db: &DatabaseConnection) -> anyhow::Result<()> {
    Migrator::up(db, None)
        .await
        .map_err(|e| anyhow::anyhow!("migrations failed: {e}"))
}
