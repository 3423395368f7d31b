//! The bare relay `proxy --streams` measures beside keel: the same HTTP stack as keel's proxy
//! (an actix-web server with one worker per core, `TCP_NODELAY`, keel's listen backlog; a
//! hyper-util client per worker, pooled) and nothing else: no key check, no redaction, no
//! parsing, no trace, no log, no metrics. It passes a `POST /v1/chat/completions` body to the
//! upstream and the upstream's answer back as it arrives. What a stream costs through it is what
//! any relay on this stack pays on this machine; keel's figures beyond it are keel's own
//! work. It runs as a process of its own (`keel-bench relay --upstream URL`, hidden), as keel
//! does, so its RSS and CPU are its own.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use actix_web::http::StatusCode;
use actix_web::{web, App, HttpResponse, HttpServer};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::common::Process;

/// One worker's way to the upstream.
struct Upstream {
    client: Client<HttpConnector, Full<Bytes>>,
    endpoint: hyper::Uri,
}

impl Upstream {
    /// As keel's proxy builds its per-worker client (`keel::proxy::UpstreamConfig::for_worker`).
    fn for_worker(endpoint: hyper::Uri) -> Self {
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(256)
            .build(http);
        Self { client, endpoint }
    }
}

async fn relay(body: web::Bytes, upstream: web::Data<Upstream>) -> HttpResponse {
    let mut request = hyper::Request::new(Full::new(body));
    *request.method_mut() = hyper::Method::POST;
    *request.uri_mut() = upstream.endpoint.clone();
    request.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("application/json"),
    );
    let Ok(response) = upstream.client.request(request).await else {
        return HttpResponse::BadGateway().finish();
    };
    let (head, body) = response.into_parts();
    let mut reply =
        HttpResponse::build(StatusCode::from_u16(head.status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY));
    if let Some(content_type) = head
        .headers
        .get(hyper::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    {
        reply.content_type(content_type);
    }
    reply.streaming(body.into_data_stream())
}

/// Serves the bare relay to `upstream` (a base URL ending in `/v1`) on a port of its own,
/// printed on stdout once it listens; runs until stopped (SIGTERM).
pub async fn serve(upstream: &str) -> anyhow::Result<()> {
    keel::startup::raise_open_files_limit()?;
    let endpoint: hyper::Uri = format!("{}/chat/completions", upstream.trim_end_matches('/')).parse()?;
    let listener = keel::startup::listen(([127, 0, 0, 1], 0).into(), crate::common::BACKLOG)?;
    let port = listener.local_addr()?.port();
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
    let server = HttpServer::new(move || {
        App::new()
            .app_data(web::Data::new(Upstream::for_worker(endpoint.clone())))
            .route("/v1/chat/completions", web::post().to(relay))
    })
    .workers(workers)
    .tcp_nodelay(true)
    .disable_signals()
    .listen(listener)?
    .run();
    println!("{port}");
    server.await?;
    Ok(())
}

/// Starts a bare relay process (this binary's hidden `relay` command) to `upstream`.
pub async fn start(upstream: &str) -> anyhow::Result<Process> {
    let mut child = Command::new(std::env::current_exe()?)
        .args(["relay", "--upstream", upstream])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let stdout = child.stdout.take();
    let mut process = Process::new(child);
    // Its first line is its port, once it listens.
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        if let Some(stdout) = stdout {
            let _ = BufReader::new(stdout).read_line(&mut line);
        }
        line
    })
    .await?;
    let port: u16 = line
        .trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("the bare relay did not start (it said {line:?})"))?;
    process.base = format!("http://127.0.0.1:{port}");
    Ok(process)
}
