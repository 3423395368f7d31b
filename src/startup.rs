//! Building and running the HTTP application.

use std::net::TcpListener;

use actix_web::dev::{Server, ServerHandle, Service};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::{web, App, HttpMessage, HttpServer};
use actix_web_prom::PrometheusMetricsBuilder;
use sea_orm::DatabaseConnection;
use tracing_actix_web::{RequestId, TracingLogger};

use crate::config::Settings;
use crate::state::AppState;
use crate::{auth, database, http, routes};

pub struct Application {
    port: u16,
    server: Server,
    state: AppState,
}

impl Application {
    /// Connects to the database, applies migrations and binds the listener
    /// (port 0 picks a free port).
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let db = database::connect(&settings.database).await?;
        database::migrate(&settings.database, &db).await?;
        let addr = settings.listen_addr()?;
        let listener = TcpListener::bind(addr).map_err(|e| {
            anyhow::anyhow!(
                "cannot bind {addr} (server.listen {}): {e}",
                settings.server.listen
            )
        })?;
        Self::with_listener(settings, db, listener)
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
        let state = AppState::new(db, settings)?;
        let registry = prometheus::Registry::new();
        state
            .traces
            .metrics
            .register(&registry)
            .map_err(|e| anyhow::anyhow!("metrics: {e}"))?;
        registry
            .register(Box::new(crate::telemetry::dropped_lines_counter().clone()))
            .map_err(|e| anyhow::anyhow!("metrics: {e}"))?;
        let prometheus = PrometheusMetricsBuilder::new("keel")
            .registry(registry.clone())
            .mask_unmatched_patterns("UNKNOWN")
            .build()
            .map_err(|e| anyhow::anyhow!("metrics: {e}"))?;
        let doc = web::Data::new(crate::system::OpenApiJson::build(&state.settings));
        let data = web::Data::new(state.clone());
        let registry = web::Data::new(registry);
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .app_data(web::Data::new(data.upstreams.for_worker()))
                .app_data(doc.clone())
                .app_data(registry.clone())
                .configure(routes::configure)
                .default_service(web::to(http::not_found))
                .wrap(actix_web::middleware::from_fn(auth::authenticate))
                .wrap(prometheus.clone())
                .wrap_fn(|req, srv| {
                    let request_id = req.extensions().get::<RequestId>().copied();
                    let response = srv.call(req);
                    async move {
                        let mut response = response.await?;
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
        .workers(workers)
        .shutdown_timeout(shutdown_timeout)
        .disable_signals()
        .listen(listener)?
        .run();
        Ok(Self { port, server, state })
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
        self.state.shutdown().await;
        Ok(())
    }

    /// Serves until SIGINT or SIGTERM: stops accepting, lets in-flight requests finish
    /// (up to `server.shutdown_timeout_secs`), then drains background work.
    pub async fn run_until_signalled(self) -> anyhow::Result<()> {
        let handle = self.handle();
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("shutdown requested; finishing in-flight requests");
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
