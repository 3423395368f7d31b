//! Building and running the HTTP application.

use std::net::TcpListener;
use std::time::Duration;

use actix_web::dev::{Server, ServerHandle, Service};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::{web, App, HttpMessage, HttpServer};
use sea_orm::DatabaseConnection;
use tracing_actix_web::{RequestId, TracingLogger};

use crate::config::Settings;
use crate::state::AppState;
use crate::{auth, database, http, routes};

pub struct Application {
    port: u16,
    server: Server,
    state: AppState,
    /// How long the process keeps answering (with `Connection: close`) after a signal.
    grace: Duration,
    /// Told once the HTTP workers are gone, before background work drains.
    workers_stopped: database::WorkersStopped,
}

impl Application {
    /// Connects to the database, applies migrations and binds the listener
    /// (port 0 picks a free port).
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let (db, workers_stopped) = database::connect_serving(&settings.database).await?;
        database::migrate(&settings.database, &db).await?;
        let addr = settings.listen_addr()?;
        let listener = listen(addr, settings.server.backlog).map_err(|e| {
            anyhow::anyhow!(
                "cannot bind {addr} (server.listen {}): {e}",
                settings.server.listen
            )
        })?;
        let mut app = Self::with_listener(settings, db, listener)?;
        app.workers_stopped = workers_stopped;
        Ok(app)
    }

    pub fn with_listener(
        settings: Settings,
        db: DatabaseConnection,
        listener: TcpListener,
    ) -> anyhow::Result<Self> {
        let port = listener.local_addr()?.port();
        let workers = match settings.server.workers {
            0 => std::thread::available_parallelism().map_or(2, usize::from),
            n => n,
        };
        let shutdown_timeout = settings.server.shutdown_timeout_secs;
        let keep_alive = match settings.server.keep_alive_secs {
            0 => actix_web::http::KeepAlive::Disabled,
            secs => actix_web::http::KeepAlive::Timeout(std::time::Duration::from_secs(secs)),
        };
        let grace = Duration::from_secs(settings.server.shutdown_grace_secs);
        let state = AppState::new(db, settings)?;
        state.cluster.start_listener(&state.settings.database.url);
        tokio::spawn(crate::billing::service::run_reconciler(state.clone()));
        let registry = prometheus::Registry::new();
        state
            .traces
            .metrics
            .register(&registry)
            .map_err(|e| anyhow::anyhow!("metrics: {e}"))?;
        state
            .cluster
            .register(&registry)
            .map_err(|e| anyhow::anyhow!("metrics: {e}"))?;
        state
            .metrics
            .register(&registry)
            .map_err(|e| anyhow::anyhow!("metrics: {e}"))?;
        registry
            .register(Box::new(crate::telemetry::dropped_lines_counter().clone()))
            .map_err(|e| anyhow::anyhow!("metrics: {e}"))?;
        let http_metrics = web::Data::new(http::metrics::HttpMetrics::new());
        http_metrics
            .register(&registry)
            .map_err(|e| anyhow::anyhow!("metrics: {e}"))?;
        let doc = web::Data::new(crate::system::OpenApiJson::build(&state.settings));
        let data = web::Data::new(state.clone());
        let registry = web::Data::new(registry);
        let stopping = state.cluster.stopping().clone();
        let server = HttpServer::new(move || {
            let stopping = stopping.clone();
            App::new()
                .app_data(data.clone())
                .app_data(web::Data::new(data.upstreams.for_worker()))
                .app_data(doc.clone())
                .app_data(registry.clone())
                .app_data(http_metrics.clone())
                .configure(routes::configure)
                .default_service(web::to(http::not_found))
                .wrap(actix_web::middleware::from_fn(auth::authenticate))
                .wrap(actix_web::middleware::from_fn(http::deadline::body_deadline))
                .wrap(actix_web::middleware::from_fn(
                    http::metrics::HttpMetrics::middleware,
                ))
                .wrap_fn(move |req, srv| {
                    let request_id = req.extensions().get::<RequestId>().copied();
                    let draining = stopping.clone();
                    let response = srv.call(req);
                    async move {
                        let mut response = response.await?;
                        if draining.is_cancelled() {
                            // Shutting down: the client opens its next connection elsewhere
                            // (or here, while the grace period lasts) instead of sending on
                            // one that is about to close.
                            response
                                .response_mut()
                                .head_mut()
                                .set_connection_type(actix_web::http::ConnectionType::Close);
                        }
                        // A proxied provider's own request id is relayed unchanged.
                        let relayed = response.headers().contains_key("x-request-id");
                        if let Some(id) = request_id
                            .and_then(|id| HeaderValue::from_str(&id.to_string()).ok())
                            .filter(|_| !relayed)
                        {
                            response
                                .headers_mut()
                                .insert(HeaderName::from_static("x-request-id"), id);
                        }
                        Ok(response)
                    }
                })
                .wrap(TracingLogger::<crate::telemetry::RootSpan>::new())
        })
        .on_connect(http::client::record_socket)
        .workers(workers)
        // Every write goes out at once: with Nagle's algorithm a streamed chunk written while
        // the previous one is unacknowledged waits for the client's (delayed) ACK.
        .tcp_nodelay(true)
        .keep_alive(keep_alive)
        .shutdown_timeout(shutdown_timeout)
        .disable_signals()
        .listen(listener)?
        .run();
        Ok(Self {
            port,
            server,
            state,
            grace,
            workers_stopped: database::WorkersStopped::default(),
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    pub fn handle(&self) -> ServerHandle {
        self.server.handle()
    }

    /// Serves until the server is stopped (by [`Application::run_until_signalled`] or a
    /// handle), then stops background work after it drains.
    pub async fn run_until_stopped(self) -> anyhow::Result<()> {
        self.server.await?;
        self.workers_stopped.set();
        self.state.shutdown().await;
        Ok(())
    }

    /// Serves until SIGINT or SIGTERM, then shuts down without leaving a request it
    /// accepted unanswered: reports not ready (`/healthz` 503) and ends waiting claims at
    /// once, keeps answering for `server.shutdown_grace_secs` with `Connection: close`,
    /// then stops accepting, lets in-flight requests finish (up to
    /// `server.shutdown_timeout_secs`) and drains background work.
    pub async fn run_until_signalled(self) -> anyhow::Result<()> {
        let handle = self.handle();
        let stopping = self.state.cluster.stopping().clone();
        let grace = self.grace;
        let workers_stopping = self.workers_stopped.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            // From now on the HTTP workers may stop at any moment, and the connections they
            // opened with them: every connection is checked before it is used.
            workers_stopping.set();
            tracing::info!(
                grace_secs = grace.as_secs(),
                "shutdown requested; not ready, answering with Connection: close"
            );
            stopping.cancel();
            // A second signal (Ctrl-C again) skips the rest of the grace period.
            tokio::select! {
                _ = tokio::time::sleep(grace) => {}
                _ = wait_for_signal() => {}
            }
            tracing::info!("no longer accepting; finishing in-flight requests");
            handle.stop(true).await;
        });
        self.run_until_stopped().await
    }
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {},
                    _ = term.recv() => {},
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Raises this process's soft limit of open files to its hard limit; answers the new limit.
/// Every connection is a descriptor, a proxied stream two (the client's and the provider's),
/// and the soft limit is often 1,024 (systemd's default) while the hard one is far higher:
/// left alone, keel would refuse connections past about 500 open streams.
pub fn raise_open_files_limit() -> std::io::Result<u64> {
    rlimit::increase_nofile_limit(u64::MAX)
}

/// A listener with an accept queue of `backlog` (keel's: `server.backlog`). std's
/// `TcpListener::bind` always asks for 128: a thousand streams opened at once overflowed it,
/// and the kernel dropped the handshakes beyond it, which the clients retried a second later.
pub fn listen(addr: std::net::SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    // As std does: a restarted keel binds its port while the old connections linger.
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(i32::try_from(backlog).unwrap_or(i32::MAX))?;
    Ok(socket.into())
}
