//! Building and running the HTTP application.

use std::net::TcpListener;
use std::time::Duration;

use actix_web::dev::{Server, ServerHandle, Service};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::{web, App, HttpMessage, HttpServer};
use sea_orm::DatabaseConnection;
use tracing_actix_web::{RequestId, TracingLogger};

use crate::state::AppState;
use crate::{auth, http, routes};
use keel_core::config::Settings;
use keel_core::database;

pub struct Application {
    port: u16,
    server: Server,
    state: AppState,
    /// How long the process keeps answering (with `Connection: close`) after a signal.
    grace: Duration,
    /// Told once the HTTP workers are gone, before background work drains.
    workers_stopped: database::WorkersStopped,
    /// The listening socket (a second descriptor of it): at shutdown the connections still
    /// waiting in its queue are answered from it before it closes.
    listener: Option<TcpListener>,
}

impl Application {
    /// Connects to the database, applies migrations and binds the listener
    /// (port 0 picks a free port).
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        crate::openapi::install_components();
        let (db, workers_stopped) = database::connect_serving(&settings.database).await?;
        keel_core::Core::prepare(&settings.database, &db).await?;
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
        let own_listener = listener.try_clone().ok();
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
            .register(Box::new(
                crate::telemetry::dropped_lines_counter()
                    .map_err(|e| anyhow::anyhow!("metrics: {e}"))?
                    .clone(),
            ))
            .map_err(|e| anyhow::anyhow!("metrics: {e}"))?;
        let http_metrics =
            web::Data::new(http::metrics::HttpMetrics::new().map_err(|e| anyhow::anyhow!("metrics: {e}"))?);
        http_metrics
            .register(&registry)
            .map_err(|e| anyhow::anyhow!("metrics: {e}"))?;
        let doc = web::Data::new(crate::openapi::served(&state.settings));
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
                .wrap(actix_web::middleware::from_fn(http::target_length))
                .wrap(actix_web::middleware::from_fn(
                    http::metrics::HttpMetrics::middleware,
                ))
                .wrap_fn(move |req, srv| {
                    let request_id = req.extensions().get::<RequestId>().copied();
                    let draining = stopping.clone();
                    // The request's id goes with the work it causes (a webhook event's row,
                    // a ledger commit's failure).
                    let response = keel_core::context::with_request_id(
                        request_id.map(|id| id.to_string()).unwrap_or_default().into(),
                        srv.call(req),
                    );
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
                        // keel's own id, the one it logs, is always `x-keel-request-id`; it
                        // is `x-request-id` too unless a proxied provider's own id is there,
                        // which is relayed unchanged.
                        let relayed = response.headers().contains_key("x-request-id");
                        if let Some(id) =
                            request_id.and_then(|id| HeaderValue::from_str(&id.to_string()).ok())
                        {
                            let headers = response.headers_mut();
                            if !relayed {
                                headers.insert(HeaderName::from_static("x-request-id"), id.clone());
                            }
                            headers.insert(HeaderName::from_static("x-keel-request-id"), id);
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
            listener: own_listener,
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
    /// then stops accepting, answers the connections still queued on the listener with 503,
    /// lets in-flight requests finish (up to `server.shutdown_timeout_secs`) and drains
    /// background work.
    pub async fn run_until_signalled(mut self) -> anyhow::Result<()> {
        let handle = self.handle();
        let listener = self.listener.take();
        let stopping = self.state.cluster.stopping().clone();
        let grace = self.grace;
        let workers_stopping = self.workers_stopped.clone();
        // Registered here, before anything waits on the runtime: a signal that comes before
        // the task below first runs is still caught (not left to its default, which kills).
        let mut signals = Signals::install();
        let stopping_task = tokio::spawn(async move {
            signals.recv().await;
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
                _ = signals.recv() => {}
            }
            tracing::info!("no longer accepting; finishing in-flight requests");
            // Accepting stops first, while the workers still take the connections the
            // acceptor handed them (a stopping worker drops those)...
            handle.pause().await;
            tokio::time::sleep(Duration::from_millis(50)).await;
            let stopped = tokio::spawn(async move { handle.stop(true).await });
            // ...then the connections left in the listener's queue, whose requests may
            // already be there, get a 503 instead of a reset when it closes.
            if let Some(listener) = listener {
                answer_queued(listener).await;
            }
            let _ = stopped.await;
        });
        let signalled = self.state.cluster.stopping().clone();
        self.server.await?;
        // Stopped by the signal: its queued connections are answered before the process
        // goes on to exit. Stopped otherwise: no signal will come.
        if signalled.is_cancelled() {
            let _ = stopping_task.await;
        } else {
            stopping_task.abort();
        }
        self.workers_stopped.set();
        self.state.shutdown().await;
        Ok(())
    }
}

/// Accepts every connection waiting in `listener`'s queue and answers each request with
/// 503 and `Connection: close` (the client retries elsewhere), then closes the listener.
async fn answer_queued(listener: TcpListener) {
    let mut answering = tokio::task::JoinSet::new();
    if listener.set_nonblocking(true).is_ok() {
        // Rounds a few milliseconds apart until two in a row find the queue empty (clients
        // told to go elsewhere stop arriving), a second at most; the listener closes right
        // after the last round's empty look, so only a connection that completes its
        // handshake within those microseconds is still reset by the kernel.
        let until = tokio::time::Instant::now() + Duration::from_secs(1);
        let mut quiet = 0;
        loop {
            let mut accepted = false;
            while let Ok((stream, _)) = listener.accept() {
                accepted = true;
                let stream = stream
                    .set_nonblocking(true)
                    .and_then(|()| tokio::net::TcpStream::from_std(stream));
                if let Ok(stream) = stream {
                    answering.spawn(answer_unavailable(stream));
                }
            }
            quiet = if accepted { 0 } else { quiet + 1 };
            if quiet >= 2 || tokio::time::Instant::now() >= until {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    drop(listener);
    if !answering.is_empty() {
        tracing::info!(
            connections = answering.len(),
            "answered queued connections with 503"
        );
    }
    let _ = tokio::time::timeout(Duration::from_secs(3), answering.join_all()).await;
}

/// Reads one request's head (a second at most), answers 503, and closes the connection
/// once the client has sent what it had (closing over unread bytes would reset it).
async fn answer_unavailable(mut stream: tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 4096];
    let read_head = async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 64 * 1024 {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
        true
    };
    if !matches!(
        tokio::time::timeout(Duration::from_secs(1), read_head).await,
        Ok(true)
    ) {
        return;
    }
    let body = r#"{"detail":"shutting down; retry","code":"unavailable"}"#;
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    if stream.write_all(answer.as_bytes()).await.is_err() {
        return;
    }
    let _ = stream.shutdown().await;
    let drain = async { while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {} };
    let _ = tokio::time::timeout(Duration::from_secs(1), drain).await;
}

/// SIGTERM and SIGINT, caught from the moment they are installed.
struct Signals {
    #[cfg(unix)]
    term: Option<tokio::signal::unix::Signal>,
    #[cfg(unix)]
    int: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn install() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            Self {
                term: signal(SignalKind::terminate()).ok(),
                int: signal(SignalKind::interrupt()).ok(),
            }
        }
        #[cfg(not(unix))]
        Self {}
    }

    /// The next signal.
    async fn recv(&mut self) {
        #[cfg(unix)]
        {
            async fn next(signal: &mut Option<tokio::signal::unix::Signal>) {
                match signal {
                    Some(signal) => {
                        signal.recv().await;
                    }
                    None => std::future::pending().await,
                }
            }
            tokio::select! {
                _ = next(&mut self.term) => {},
                _ = next(&mut self.int) => {},
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
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
