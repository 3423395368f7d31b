//! What the benchmarks share: throw-away databases, settings, and a lean HTTP/1.1 load
//! generator.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{self, HeaderName, HeaderValue};
use hyper::StatusCode;
use hyper_util::rt::TokioIo;

use sea_orm::{ConnectionTrait, Database, DatabaseConnection};

use keel_core::config::Settings;

/// The accept queue of the fakes and the do-nothing servers, as keel's default: the streams
/// bench opens thousands of connections at once.
pub const BACKLOG: u32 = 4096;

pub const BENCH_INTERNAL_KEY: &str = "bench-internal-key";

/// A throw-away database: a SQLite file in a temporary directory, or a fresh PostgreSQL
/// database created from an admin URL and dropped afterwards.
pub struct BenchDb {
    pub url: String,
    postgres: Option<(String, String)>,
    dir: Option<std::path::PathBuf>,
}

impl BenchDb {
    pub async fn create(postgres_admin_url: Option<&str>) -> anyhow::Result<Self> {
        let tag = uuid::Uuid::new_v4().simple().to_string();
        match postgres_admin_url {
            Some(admin_url) => {
                let name = format!("keel_bench_{tag}");
                let admin = Database::connect(admin_url).await?;
                admin
                    .execute_unprepared(&format!("CREATE DATABASE \"{name}\""))
                    .await?;
                admin.close().await?;
                let (base, _) = admin_url
                    .rsplit_once('/')
                    .ok_or_else(|| anyhow::anyhow!("the PostgreSQL URL needs a database path"))?;
                Ok(Self {
                    url: format!("{base}/{name}"),
                    postgres: Some((admin_url.to_owned(), name)),
                    dir: None,
                })
            }
            None => {
                let dir = std::env::temp_dir().join(format!("keel-bench-{tag}"));
                std::fs::create_dir_all(&dir)?;
                Ok(Self {
                    url: format!("sqlite://{}?mode=rwc", dir.join("keel.db").display()),
                    postgres: None,
                    dir: Some(dir),
                })
            }
        }
    }

    pub async fn drop_now(self) {
        if let Some((admin_url, name)) = &self.postgres {
            if let Ok(admin) = Database::connect(admin_url.as_str()).await {
                let _ = admin
                    .execute_unprepared(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                    .await;
                let _ = admin.close().await;
            }
        }
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

pub fn bench_settings(db_url: &str) -> anyhow::Result<Settings> {
    let mut settings = Settings::defaults()?;
    settings.database.url = db_url.to_owned();
    settings.server.listen = "127.0.0.1:0".into();
    settings.auth.internal_keys = vec![BENCH_INTERNAL_KEY.into()];
    Ok(settings)
}

/// The organization a benchmark works in: its id, an API key's secret and a project's id.
pub struct Tenant {
    pub org_id: keel_core::domain::OrgId,
    pub key: String,
    pub project_id: keel_core::domain::ProjectId,
}

impl Tenant {
    /// Creates the organization "bench" with an API key and a project.
    pub async fn create(conn: &DatabaseConnection) -> anyhow::Result<Self> {
        Self::named(conn, "bench").await
    }

    /// Creates the organization `name` with an API key and a project.
    pub async fn named(conn: &DatabaseConnection, name: &str) -> anyhow::Result<Self> {
        let owner = keel_core::domain::UserId::parse("bench-owner")?;
        let org = keel_core::orgs::service::create_org(conn, name, None, &owner, None)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let key =
            keel_core::fixtures::insert_key(conn, &org.org_id, Some("bench"), &Default::default()).await?;
        let project = keel_core::fixtures::insert_project(conn, &org.org_id, "bench", "bench", None).await?;
        Ok(Self {
            org_id: org.org_id,
            key: key.secret,
            project_id: project.id,
        })
    }
}

/// A connection to `db` with keel's migrations applied, for benchmarks that run keel as its
/// own process.
pub async fn migrated(db: &BenchDb) -> anyhow::Result<DatabaseConnection> {
    let settings = bench_settings(&db.url)?;
    let conn = keel_core::database::connect(&settings.database).await?;
    keel_core::Core::prepare(&settings.database, &conn).await?;
    Ok(conn)
}

pub struct LoadResult {
    pub ok: usize,
    pub failed: usize,
    pub elapsed: Duration,
    /// Per-request latencies of the successful requests, sorted.
    pub latencies: Vec<Duration>,
}

impl LoadResult {
    pub fn per_second(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64()
    }

    pub fn percentile(&self, p: f64) -> Duration {
        if self.latencies.is_empty() {
            return Duration::ZERO;
        }
        let idx = ((self.latencies.len() as f64 - 1.0) * p).round() as usize;
        self.latencies[idx.min(self.latencies.len() - 1)]
    }
}

/// One POST of a load: path, headers and body, sent on a kept-alive HTTP/1.1
/// connection of the load generator.
#[derive(Clone)]
pub struct LoadRequest {
    pub path: Arc<str>,
    pub headers: Arc<[(HeaderName, HeaderValue)]>,
    pub body: Bytes,
}

impl LoadRequest {
    /// A JSON POST to `path` with `bearer` as its `Authorization` and any `extra` headers.
    pub fn json(path: &str, bearer: &str, extra: &[(&str, &str)]) -> anyhow::Result<Self> {
        let mut headers = vec![
            (header::CONTENT_TYPE, HeaderValue::from_static("application/json")),
            (
                header::AUTHORIZATION,
                HeaderValue::from_str(&format!("Bearer {bearer}"))?,
            ),
        ];
        for (name, value) in extra {
            headers.push((
                HeaderName::from_bytes(name.as_bytes())?,
                HeaderValue::from_str(value)?,
            ));
        }
        Ok(Self {
            path: path.into(),
            headers: headers.into(),
            body: Bytes::new(),
        })
    }

    /// The same request with another body.
    pub fn with_body(&self, body: impl Into<Bytes>) -> Self {
        Self {
            body: body.into(),
            ..self.clone()
        }
    }
}

/// Sends `total` requests to `addr` with `concurrency` in flight, each in-flight slot on
/// a connection of its own; `make(i)` builds request `i`. The load runs on a runtime of
/// its own (two threads), off the server's threads, and speaks HTTP/1.1 through hyper's
/// connection API with no client pool around it: the load generator shares this
/// machine's two cores with what it measures, so it should cost as little as it can.
pub async fn run_load<F>(addr: SocketAddr, concurrency: usize, total: usize, make: F) -> LoadResult
where
    F: Fn(usize) -> LoadRequest + Send + Sync + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let result = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map(|rt| rt.block_on(drive_load(addr, concurrency, total, make)));
        let _ = tx.send(result);
    });
    match rx.await {
        Ok(Ok(result)) => result,
        _ => LoadResult {
            ok: 0,
            failed: total,
            elapsed: Duration::ZERO,
            latencies: Vec::new(),
        },
    }
}

/// One kept-alive HTTP/1.1 connection of the load generator: opened on first use, and
/// again after it fails.
pub struct Connection {
    addr: SocketAddr,
    host: HeaderValue,
    sender: Option<hyper::client::conn::http1::SendRequest<Full<Bytes>>>,
}

impl Connection {
    pub fn new(addr: SocketAddr) -> Self {
        Self {
            addr,
            host: HeaderValue::from_str(&addr.to_string()).unwrap_or(HeaderValue::from_static("localhost")),
            sender: None,
        }
    }

    /// Sends `request` and reads the whole answer; `None`: no answer (the connection is
    /// dropped, and the next request opens another).
    pub async fn send(&mut self, request: &LoadRequest) -> Option<(StatusCode, Bytes)> {
        let answer = self.try_send(request).await;
        if answer.is_none() {
            self.sender = None;
        }
        answer
    }

    async fn try_send(&mut self, request: &LoadRequest) -> Option<(StatusCode, Bytes)> {
        if self.sender.is_none() {
            let stream = tokio::net::TcpStream::connect(self.addr).await.ok()?;
            stream.set_nodelay(true).ok()?;
            let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .ok()?;
            tokio::spawn(connection);
            self.sender = Some(sender);
        }
        let sender = self.sender.as_mut()?;
        let mut http = hyper::Request::post(&*request.path)
            .body(Full::new(request.body.clone()))
            .ok()?;
        let headers = http.headers_mut();
        headers.insert(header::HOST, self.host.clone());
        for (name, value) in request.headers.iter() {
            headers.insert(name.clone(), value.clone());
        }
        sender.ready().await.ok()?;
        let response = sender.send_request(http).await.ok()?;
        let status = response.status();
        let body = response.into_body().collect().await.ok()?.to_bytes();
        Some((status, body))
    }
}

async fn drive_load<F>(addr: SocketAddr, concurrency: usize, total: usize, make: F) -> LoadResult
where
    F: Fn(usize) -> LoadRequest + Send + Sync + 'static,
{
    let make = Arc::new(make);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let started = Instant::now();
    let mut workers = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let (make, next) = (make.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut failed = 0;
            let mut connection = Connection::new(addr);
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= total {
                    break;
                }
                let sent = Instant::now();
                match connection.send(&make(i)).await {
                    Some((status, _)) if status.is_success() => latencies.push(sent.elapsed()),
                    _ => failed += 1,
                }
            }
            (latencies, failed)
        }));
    }
    let mut latencies = Vec::with_capacity(total);
    let mut failed = 0;
    for worker in workers {
        if let Ok((l, f)) = worker.await {
            latencies.extend(l);
            failed += f;
        }
    }
    let elapsed = started.elapsed();
    latencies.sort_unstable();
    LoadResult {
        ok: latencies.len(),
        failed,
        elapsed,
        latencies,
    }
}

/// The ceiling of this machine for one HTTP request: the same load generator, body and
/// concurrency against an actix-web server with the same number of workers whose only
/// handler parses the JSON body and answers `{"ok": true}` (no keel, no middleware, no
/// database). Nothing served over HTTP on this machine can be faster; each bench prints
/// it beside its own figures.
pub async fn http_ceiling(
    workers: usize,
    concurrency: usize,
    total: usize,
    body: serde_json::Value,
) -> anyhow::Result<LoadResult> {
    use actix_web::{web, App, HttpResponse, HttpServer};
    let listener = keel::startup::listen(([127, 0, 0, 1], 0).into(), BACKLOG)?;
    let port = listener.local_addr()?.port();
    let server = HttpServer::new(|| {
        App::new().route(
            "/",
            web::post().to(|body: web::Json<serde_json::Value>| async move {
                drop(body);
                HttpResponse::Ok().json(serde_json::json!({"ok": true}))
            }),
        )
    })
    .workers(workers)
    .disable_signals()
    .listen(listener)?
    .run();
    let handle = server.handle();
    let running = actix_web::rt::spawn(server);
    let request = LoadRequest::json("/", "ceiling", &[])?.with_body(serde_json::to_vec(&body)?);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let result = run_load(addr, concurrency, total, move |_| request.clone()).await;
    handle.stop(true).await;
    let _ = running.await;
    Ok(result)
}

/// The HTTP workers keel itself runs with (`server.workers = 0`: one per core).
pub fn default_workers() -> usize {
    std::thread::available_parallelism().map_or(2, usize::from)
}

pub fn millis(d: Duration) -> String {
    format!("{:.2}", d.as_secs_f64() * 1000.0)
}

/// A process a benchmark started and talks HTTP to at `base` (`keel serve`, the streams'
/// bare relay); stopped when dropped: SIGTERM, as an operator stops keel (and on which a
/// process run under `valgrind --trace-children=yes` writes its profile), then SIGKILL if it
/// is still there after 10 s.
pub struct Process {
    child: std::process::Child,
    pub base: String,
}

impl Process {
    /// `keel serve` of the binary built beside this one (`cargo build --release --workspace`
    /// builds both) on `db_url`, with `envs` added, once it answers `/healthz`.
    pub async fn keel_serve(db_url: &str, envs: &[(&str, &str)]) -> anyhow::Result<Self> {
        Self::keel_serve_from(&keel_exe()?, db_url, envs).await
    }

    /// `keel serve` of the binary `exe` (another build's, to compare two) on `db_url`.
    pub async fn keel_serve_from(
        exe: &std::path::Path,
        db_url: &str,
        envs: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut command = std::process::Command::new(exe);
        command
            .arg("serve")
            .env("KEEL_DATABASE_URL", db_url)
            .env("KEEL_LISTEN", port.to_string())
            .env("KEEL_INTERNAL_KEYS", BENCH_INTERNAL_KEY)
            .env("KEEL__SERVER__SHUTDOWN_GRACE_SECS", "0")
            .env("RUST_LOG", "warn")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        // To see what keel did during a run: KEEL_BENCH_KEEL_LOG=<file> appends every
        // instance's log there (at KEEL_BENCH_KEEL_RUST_LOG, else warn).
        if let Ok(path) = std::env::var("KEEL_BENCH_KEEL_LOG") {
            let file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
            command.stderr(file.try_clone()?).stdout(file);
            if let Ok(filter) = std::env::var("KEEL_BENCH_KEEL_RUST_LOG") {
                command.env("RUST_LOG", filter);
            }
        }
        for (name, value) in envs {
            command.env(name, value);
        }
        let mut process = Self::new(command.spawn()?);
        process.base = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        for _ in 0..600 {
            let health = http.get(format!("{}/healthz", process.base)).send().await;
            if health.is_ok_and(|r| r.status().is_success()) {
                return Ok(process);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        anyhow::bail!("keel serve did not become ready")
    }

    /// `child`, its base URL still to be learnt.
    pub fn new(child: std::process::Child) -> Self {
        Self {
            child,
            base: String::new(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let child = &mut self.child;
        let terminated = std::process::Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .is_ok_and(|status| status.success());
        if terminated {
            for _ in 0..200 {
                if child.try_wait().is_ok_and(|status| status.is_some()) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// The `keel` binary beside this one.
pub fn keel_exe() -> anyhow::Result<std::path::PathBuf> {
    let exe = std::env::current_exe()?.with_file_name("keel");
    anyhow::ensure!(
        exe.exists(),
        "{} is missing: cargo build --release --workspace builds it",
        exe.display()
    );
    Ok(exe)
}

/// A size field of `/proc/<pid>/status` (`VmRSS:`, `VmHWM:`) in KiB; `pid` may be `self`.
pub fn proc_kib(pid: &str, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The command name and the CPU clock ticks of a `/proc/.../stat` line: utime, stime, and the
/// reaped children's cutime and cstime (fields 14 to 17; the fields after the command name,
/// which may hold spaces, start at field 3). A tick is 10 ms (Linux's `USER_HZ`).
fn stat_ticks(stat: &str) -> Option<(&str, [u64; 4])> {
    let (head, rest) = stat.rsplit_once(')')?;
    let comm = head.split_once('(')?.1;
    let mut fields = rest.split_whitespace().skip(11);
    let mut ticks = [0; 4];
    for tick in &mut ticks {
        *tick = fields.next()?.parse().ok()?;
    }
    Some((comm, ticks))
}

/// The command name and the CPU time (utime + stime) of a `/proc/.../stat` line.
pub fn stat_cpu(stat: &str) -> Option<(&str, Duration)> {
    let (comm, [utime, stime, ..]) = stat_ticks(stat)?;
    Some((comm, Duration::from_millis((utime + stime) * 10)))
}

/// CPU time PostgreSQL's server processes on this machine have used so far: every process
/// named `postgres`, its own time and that of its children it has reaped (`cutime`, `cstime`:
/// the postmaster collects the time of the backends that have exited). A difference of two
/// readings is the server's CPU between them, backends that came and went included.
pub fn postgres_cpu() -> Duration {
    let ticks: u64 = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            let (comm, ticks) = stat_ticks(&stat)?;
            (comm == "postgres").then(|| ticks.iter().sum::<u64>())
        })
        .sum();
    Duration::from_millis(ticks * 10)
}

/// CPU time a process has used so far (every thread); `pid` may be `self`.
pub fn proc_cpu(pid: &str) -> Duration {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat_cpu(&stat).map(|(_, cpu)| cpu))
        .unwrap_or_default()
}
