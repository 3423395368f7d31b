//! Connecting to SQLite (embedded default) or PostgreSQL, and applying migrations.

use std::time::Duration;

use migration::{Migrator, MigratorTrait};
use sea_orm::sqlx::sqlite::{SqliteJournalMode, SqliteSynchronous};
use sea_orm::{ConnectOptions, ConnectionTrait, Database, DatabaseConnection, DbBackend, Statement};

use crate::config::DatabaseSettings;

/// The advisory lock instances take while they migrate (any fixed number; "keel").
const MIGRATION_LOCK: i64 = 0x6b65_656c;

pub async fn connect(settings: &DatabaseSettings) -> anyhow::Result<DatabaseConnection> {
    let options = pool_options(settings, true);
    open(settings, options).await
}

/// Said once the HTTP workers are stopping (`Application` does, at the signal): from then on every pooled
/// PostgreSQL connection is pinged before it is handed out, and one that fails is replaced.
///
/// A connection belongs to the runtime that opened it, and the HTTP workers each run their
/// own: once they stop, the connections they opened fail ("A Tokio 1.x context was found,
/// but it is being shutdown"), and the trace writer's last batch, the ledger's and the
/// queue's last writes would get them from the pool (issue 36: acknowledged traces lost at
/// SIGTERM). In steady operation nothing is pinged.
#[derive(Clone, Default)]
pub struct WorkersStopped(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl WorkersStopped {
    pub fn set(&self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// [`connect`] for the server: its pool checks connections once the workers have stopped.
pub async fn connect_serving(
    settings: &DatabaseSettings,
) -> anyhow::Result<(DatabaseConnection, WorkersStopped)> {
    let mut options = pool_options(settings, true);
    let stopped = WorkersStopped::default();
    let flag = stopped.0.clone();
    options.map_sqlx_postgres_before_acquire(move |conn, _| {
        let check = flag.load(std::sync::atomic::Ordering::SeqCst);
        Box::pin(async move {
            use sea_orm::sqlx::Connection;
            Ok(!check || conn.ping().await.is_ok())
        })
    });
    Ok((open(settings, options).await?, stopped))
}

/// The pool's options; `timeouts`: PostgreSQL's lock, statement and idle-in-transaction
/// bounds on every connection (migrations run without them: an index build may be long).
fn pool_options(settings: &DatabaseSettings, timeouts: bool) -> ConnectOptions {
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
        .connect_timeout(Duration::from_secs(settings.connect_timeout_secs.max(1)))
        // A connection in steady use goes out unpinged (a ping is one more round trip on
        // every checkout); one idle long enough to have been dropped is pinged first.
        .test_before_acquire_if_idle_for(Duration::from_secs(10))
        .sqlx_logging(false);
    if sqlite {
        let busy = Duration::from_millis(settings.sqlite_busy_timeout_ms);
        let checkpoint_pages = settings.sqlite_wal_autocheckpoint_pages.to_string();
        options.map_sqlx_sqlite_opts(move |o| {
            o.journal_mode(SqliteJournalMode::Wal)
                .pragma("wal_autocheckpoint", checkpoint_pages.clone())
                // FULL: an acknowledged write survives a power loss.
                .synchronous(SqliteSynchronous::Full)
                .busy_timeout(busy)
                .foreign_keys(true)
                .create_if_missing(true)
        });
    } else if timeouts {
        let bounds = [
            ("lock_timeout", settings.lock_timeout_ms),
            ("statement_timeout", settings.statement_timeout_ms),
            (
                "idle_in_transaction_session_timeout",
                settings.idle_in_transaction_timeout_ms,
            ),
        ]
        .map(|(name, ms)| (name, format!("{ms}ms")));
        options.map_sqlx_postgres_opts(move |o| o.options(bounds.clone()).application_name("keel"));
    } else {
        options.map_sqlx_postgres_opts(|o| o.application_name("keel-migrate"));
    }
    options
}

async fn open(settings: &DatabaseSettings, options: ConnectOptions) -> anyhow::Result<DatabaseConnection> {
    let shown = describe_url(&settings.url);
    if !settings.url.starts_with("sqlite:") {
        reachable(
            &settings.url,
            Duration::from_secs(settings.connect_timeout_secs.max(1)),
        )
        .await?;
    }
    Database::connect(options)
        .await
        .map_err(|e| anyhow::anyhow!("cannot connect to the database {shown}: {e}"))
}

/// Fails within `within` when nothing answers at the URL's host and port, naming them
/// (the pool itself would retry silently until its acquire timeout).
async fn reachable(url: &str, within: Duration) -> anyhow::Result<()> {
    let parsed = url::Url::parse(url).map_err(|e| anyhow::anyhow!("database.url is not a URL: {e}"))?;
    let host = parsed.host_str().unwrap_or("localhost").to_owned();
    let port = parsed.port().unwrap_or(5432);
    if host.starts_with('/') || host.is_empty() {
        return Ok(());
    }
    match tokio::time::timeout(within, tokio::net::TcpStream::connect((host.as_str(), port))).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(err)) => Err(anyhow::anyhow!("cannot reach PostgreSQL at {host}:{port}: {err}")),
        Err(_) => Err(anyhow::anyhow!(
            "cannot reach PostgreSQL at {host}:{port}: no answer within {} s",
            within.as_secs()
        )),
    }
}

/// The database URL as it may be shown: no user name or password, no query.
pub fn describe_url(url: &str) -> String {
    if let Some(path) = url.strip_prefix("sqlite:") {
        let path = path.trim_start_matches("//");
        return format!("sqlite {}", path.split('?').next().unwrap_or(path));
    }
    match url::Url::parse(url) {
        Ok(parsed) => format!(
            "postgres {}:{}{}",
            parsed.host_str().unwrap_or("localhost"),
            parsed.port().unwrap_or(5432),
            parsed.path()
        ),
        Err(_) => "(unparsable database URL)".into(),
    }
}

/// Applies pending migrations. On PostgreSQL under an advisory lock on a connection of its
/// own, so instances started together take turns: the first migrates, the others wait, then
/// find the schema current. SQLite has one instance and needs no lock, but its migrations run
/// on one connection of their own: spread over a pool's connections, one statement did not
/// see what the one before it changed (a dropped index was "already there" to the next).
pub async fn migrate(settings: &DatabaseSettings, db: &DatabaseConnection) -> anyhow::Result<()> {
    if db.get_database_backend() != DbBackend::Postgres {
        // An in-memory database is the pool's own: another connection would see another.
        if settings.url.contains(":memory:") || settings.url.contains("mode=memory") {
            return migrate_up(db).await;
        }
        let mut options = pool_options(settings, false);
        options.max_connections(1).min_connections(1);
        let own = open(settings, options).await?;
        let migrated = migrate_up(&own).await;
        let _ = own.close().await;
        return migrated;
    }
    let mut options = pool_options(settings, false);
    options.max_connections(4).min_connections(1);
    let own = open(settings, options).await?;
    let pool = own.get_postgres_connection_pool();
    let mut lock = pool
        .acquire()
        .await
        .map_err(|e| anyhow::anyhow!("migrations: no connection for the lock: {e}"))?;
    sea_orm::sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(MIGRATION_LOCK)
        .execute(&mut *lock)
        .await
        .map_err(|e| anyhow::anyhow!("migrations: cannot take the migration lock: {e}"))?;
    let migrated = migrate_up(&own).await;
    let _ = sea_orm::sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(MIGRATION_LOCK)
        .execute(&mut *lock)
        .await;
    drop(lock);
    let _ = own.close().await;
    migrated
}

pub async fn migrate_up(db: &DatabaseConnection) -> anyhow::Result<()> {
    Migrator::up(db, None)
        .await
        .map_err(|e| anyhow::anyhow!("migrations failed: {e}"))
}

/// Runs one statement on PostgreSQL (no-op elsewhere); for `NOTIFY` and the like.
pub async fn execute_pg(
    db: &DatabaseConnection,
    sql: &str,
    values: Vec<sea_orm::Value>,
) -> Result<(), sea_orm::DbErr> {
    if db.get_database_backend() != DbBackend::Postgres {
        return Ok(());
    }
    db.execute_raw(Statement::from_sql_and_values(DbBackend::Postgres, sql, values))
        .await
        .map(drop)
}
