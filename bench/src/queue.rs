//! `keel bench queue`: enqueue N jobs over HTTP, then workers claim in batches and report
//! `succeeded` for each; enqueue/s, end-to-end jobs/s and claim latency, against a
//! baseline of one job per claim and one report per transaction.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use entities::training_job;
use futures_util::future::join_all;
use sea_orm::{ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter};
use serde_json::{json, Value};

use crate::common::{
    bench_settings, default_workers, http_ceiling, millis, run_load, BenchDb, Connection, LoadRequest,
    BENCH_INTERNAL_KEY,
};
use keel::startup::Application;
use keel_core::billing::ledger::{EntryKind, LedgerOp};

pub struct QueueBench {
    pub postgres_url: Option<String>,
    pub jobs: usize,
    pub workers: usize,
    pub concurrency: usize,
    /// Only the batched mode (no baseline runs).
    pub skip_baseline: bool,
    /// Only PostgreSQL (when a URL is given).
    pub skip_sqlite: bool,
    /// A Python with keel_worker installed: runs of Python worker processes too.
    pub python: Option<std::path::PathBuf>,
    pub python_workers: usize,
}

fn log_row(row: &Row) {
    eprintln!(
        "{} {}: enqueue {:?}/s (batches: {:?}), end-to-end {:.0} jobs/s, claim p50 {} ms p99 {} ms",
        row.database,
        row.mode,
        row.enqueue_per_second,
        row.batch_per_second,
        row.jobs_per_second,
        opt_millis(row.claim_p50),
        opt_millis(row.claim_p99)
    );
}

struct Row {
    database: &'static str,
    mode: &'static str,
    /// One job per POST (the Rust runs only).
    enqueue_per_second: Option<f64>,
    /// Jobs/s through `POST /api/training/jobs/batch` (batched mode only).
    batch_per_second: Option<f64>,
    jobs_per_second: f64,
    /// Measured by the Rust workers only.
    claim_p50: Option<Duration>,
    claim_p99: Option<Duration>,
    succeeded: u64,
}

fn opt_millis(d: Option<Duration>) -> String {
    d.map_or("-".into(), |d| millis(d).to_string())
}

pub async fn run(bench: QueueBench) -> anyhow::Result<()> {
    let mut databases: Vec<(&'static str, Option<&str>)> = Vec::new();
    if !(bench.skip_sqlite && bench.postgres_url.is_some()) {
        databases.push(("SQLite", None));
    }
    if let Some(url) = &bench.postgres_url {
        databases.push(("PostgreSQL", Some(url.as_str())));
    }
    let mut rows = Vec::new();
    for (database, admin_url) in databases {
        for (mode, claim_limit, max_batch) in [
            ("batched claims (100) + group-committed reports", 100, 512),
            ("baseline: 1 job per claim, 1 report per txn", 1, 1),
        ] {
            if bench.skip_baseline && claim_limit == 1 {
                continue;
            }
            let row = run_one(&bench, database, admin_url, mode, claim_limit, max_batch).await?;
            log_row(&row);
            rows.push(row);
        }
        if let Some(python) = &bench.python {
            for (script_mode, mode) in [
                (
                    "library",
                    "Python: keel_worker library (concurrency 1 per process)",
                ),
                (
                    "naive1",
                    "Python baseline: naive loop, claim 1 (the library's claim size), 1 report per job",
                ),
                (
                    "naive",
                    "Python baseline: naive loop, claim 100, 1 report per job",
                ),
            ] {
                let row = run_python(&bench, python, database, admin_url, script_mode, mode).await?;
                log_row(&row);
                rows.push(row);
            }
        }
    }
    // Every job costs at least one report request: report-shaped requests, as many in
    // flight as the workers keep, to a handler that does nothing bound jobs/s here.
    let body = json!({"job_id": uuid::Uuid::new_v4().to_string(), "worker_id": "bench-worker-0"});
    let in_flight = bench.workers * 100;
    let _ = http_ceiling(default_workers(), in_flight, bench.jobs / 10, body.clone()).await?;
    let ceiling = http_ceiling(default_workers(), in_flight, bench.jobs, body).await?;
    eprintln!("HTTP ceiling: {:.0} requests/s", ceiling.per_second());
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "| database | mode | enqueue/s (1 per POST) | enqueue/s (batches of {BATCH}) | end-to-end jobs/s | claim p50 ms | claim p99 ms | succeeded |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|---|---|")?;
    for r in rows {
        writeln!(
            out,
            "| {} | {} | {} | {} | {:.0} | {} | {} | {} |",
            r.database,
            r.mode,
            r.enqueue_per_second.map_or("-".into(), |e| format!("{e:.0}")),
            r.batch_per_second.map_or("-".into(), |b| format!("{b:.0}")),
            r.jobs_per_second,
            opt_millis(r.claim_p50),
            opt_millis(r.claim_p99),
            r.succeeded
        )?;
    }
    writeln!(
        out,
        "| none | HTTP ceiling: report-shaped requests/s to a do-nothing actix handler ({in_flight} in flight) | - | - | {:.0} | - | - | - |",
        ceiling.per_second()
    )?;
    Ok(())
}

/// keel on a fresh database (no sweep timer), with one organization funded for every job's
/// run fee.
pub(crate) struct QueueApp {
    db: BenchDb,
    state: keel::state::AppState,
    handle: actix_web::dev::ServerHandle,
    server: actix_web::rt::task::JoinHandle<anyhow::Result<()>>,
    pub(crate) tenant: crate::common::Tenant,
    pub(crate) addr: SocketAddr,
}

impl QueueApp {
    pub(crate) async fn start(
        bench: &QueueBench,
        admin_url: Option<&str>,
        max_batch: usize,
    ) -> anyhow::Result<Self> {
        let db = BenchDb::create(admin_url).await?;
        let mut settings = bench_settings(&db.url)?;
        settings.billing.max_batch = max_batch;
        settings.queue.sweep_interval_secs = 0;
        let fee_cents = settings.billing.flat_run_fee_cents;
        let app = Application::build(settings).await?;
        let addr = SocketAddr::from(([127, 0, 0, 1], app.port()));
        let state = app.state().clone();
        let handle = app.handle();
        let server = actix_web::rt::spawn(app.run_until_stopped());
        let tenant = crate::common::Tenant::create(&state.db).await?;
        let funding = LedgerOp::credit(
            EntryKind::Topup,
            keel_core::domain::Cents(fee_cents.get() * bench.jobs as i64).micros(),
            Some(keel_core::domain::IdempotencyKey::payment("bench-funding")),
            "bench funding",
        );
        keel_core::fixtures::submit_to_ledger(&state.billing, &tenant.org_id, funding)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(Self {
            db,
            state,
            handle,
            server,
            tenant,
            addr,
        })
    }

    /// Jobs in `status`.
    pub(crate) async fn count(&self, status: &str) -> anyhow::Result<u64> {
        Ok(training_job::Entity::find()
            .filter(training_job::Column::Status.eq(status))
            .count(&self.state.db)
            .await?)
    }

    pub(crate) async fn stop(self) {
        self.handle.stop(true).await;
        let _ = self.server.await;
        self.db.drop_now().await;
    }
}

async fn run_one(
    bench: &QueueBench,
    database: &'static str,
    admin_url: Option<&str>,
    mode: &'static str,
    claim_limit: usize,
    max_batch: usize,
) -> anyhow::Result<Row> {
    let app = QueueApp::start(bench, admin_url, max_batch).await?;
    let (addr, tenant) = (app.addr, &app.tenant);
    let enqueue = LoadRequest::json("/api/training/jobs", &tenant.key, &[])?
        .with_body(json!({"action": "tracer", "projectId": tenant.project_id}).to_string());
    let enqueued = run_load(addr, bench.concurrency, bench.jobs, move |_| enqueue.clone()).await;
    if enqueued.ok != bench.jobs {
        anyhow::bail!("only {} of {} jobs were enqueued", enqueued.ok, bench.jobs);
    }

    let (claim_latencies, elapsed) = run_workers(addr, bench.workers, claim_limit, bench.jobs).await?;
    let succeeded = app.count("succeeded").await?;
    if succeeded != bench.jobs as u64 {
        anyhow::bail!("{succeeded} of {} jobs succeeded", bench.jobs);
    }
    // The same number of jobs again, through the bulk route, in the batched mode.
    let batch_per_second = match claim_limit > 1 {
        true => Some(enqueue_in_batches(addr, tenant, bench).await?),
        false => None,
    };
    let queued = app.count("queued").await?;
    if batch_per_second.is_some() && queued != (bench.jobs / BATCH * BATCH) as u64 {
        anyhow::bail!(
            "{queued} jobs queued by the batches, not {}",
            bench.jobs / BATCH * BATCH
        );
    }
    app.stop().await;
    let percentile = |p: f64| {
        let idx = ((claim_latencies.len().max(1) - 1) as f64 * p).round() as usize;
        claim_latencies.get(idx).copied().unwrap_or_default()
    };
    Ok(Row {
        database,
        mode,
        enqueue_per_second: Some(enqueued.per_second()),
        batch_per_second,
        jobs_per_second: bench.jobs as f64 / elapsed.as_secs_f64(),
        claim_p50: Some(percentile(0.5)),
        claim_p99: Some(percentile(0.99)),
        succeeded,
    })
}

/// Python worker processes (`bench/python_worker.py`, `library` or `naive`) against keel
/// with `bench.jobs` queued through the bulk route: jobs/s from their start to the last
/// job's success.
async fn run_python(
    bench: &QueueBench,
    python: &std::path::Path,
    database: &'static str,
    admin_url: Option<&str>,
    script_mode: &str,
    mode: &'static str,
) -> anyhow::Result<Row> {
    let app = QueueApp::start(bench, admin_url, 512).await?;
    let (addr, tenant) = (app.addr, &app.tenant);
    let port = addr.port();
    let batch_per_second = enqueue_in_batches(addr, tenant, bench).await?;
    let total = (bench.jobs / BATCH * BATCH).max(BATCH) as u64;

    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("python_worker.py");
    let url = format!("http://127.0.0.1:{port}");
    let started = Instant::now();
    let mut children = Vec::new();
    for w in 0..bench.python_workers {
        children.push(
            std::process::Command::new(python)
                .arg(&script)
                .args([
                    script_mode,
                    &url,
                    BENCH_INTERNAL_KEY,
                    &format!("py-{script_mode}-{w}"),
                ])
                .spawn()?,
        );
    }
    let succeeded = loop {
        let succeeded = app.count("succeeded").await?;
        if succeeded >= total {
            break succeeded;
        }
        if started.elapsed() > Duration::from_secs(600) {
            anyhow::bail!("{succeeded} of {total} jobs succeeded after 10 minutes");
        }
        if let Some(w) = children
            .iter_mut()
            .position(|c| c.try_wait().ok().flatten().is_some())
        {
            anyhow::bail!("python worker {w} exited early");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let elapsed = started.elapsed();
    // SIGTERM, then wait for them to hand back and exit: off the runtime, which serves them
    // meanwhile (a blocking wait here would stall keel under its own workers).
    tokio::task::spawn_blocking(move || {
        for child in &children {
            let _ = std::process::Command::new("kill")
                .arg(child.id().to_string())
                .status();
        }
        for mut child in children {
            let _ = child.wait();
        }
    })
    .await?;
    app.stop().await;
    Ok(Row {
        database,
        mode,
        enqueue_per_second: None,
        batch_per_second: Some(batch_per_second),
        jobs_per_second: total as f64 / elapsed.as_secs_f64(),
        claim_p50: None,
        claim_p99: None,
        succeeded,
    })
}

/// Jobs per `POST /api/training/jobs/batch`.
const BATCH: usize = 1000;
/// Batches in flight at once.
const BATCHES_IN_FLIGHT: usize = 4;

/// Enqueues `bench.jobs` (rounded down to whole batches) through the bulk route; answers
/// jobs per second.
async fn enqueue_in_batches(
    addr: SocketAddr,
    tenant: &crate::common::Tenant,
    bench: &QueueBench,
) -> anyhow::Result<f64> {
    let batches = (bench.jobs / BATCH).max(1);
    let items = vec![json!({"action": "tracer", "projectId": tenant.project_id}); BATCH];
    let request = LoadRequest::json("/api/training/jobs/batch", &tenant.key, &[])?
        .with_body(json!({"jobs": items}).to_string());
    let sent = run_load(addr, BATCHES_IN_FLIGHT, batches, move |_| request.clone()).await;
    if sent.ok != batches {
        anyhow::bail!("only {} of {batches} batches were enqueued", sent.ok);
    }
    Ok(sent.per_second() * BATCH as f64)
}

/// Workers on a runtime of their own: claim, then report every claimed job succeeded.
async fn run_workers(
    addr: SocketAddr,
    workers: usize,
    claim_limit: usize,
    total: usize,
) -> anyhow::Result<(Vec<Duration>, Duration)> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::spawn(move || {
        let result = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map(|rt| rt.block_on(drive_workers(addr, workers, claim_limit, total)));
        let _ = tx.send(result);
    });
    rx.await
        .map_err(|_| anyhow::anyhow!("the worker runtime died"))?
        .map_err(anyhow::Error::from)?
}

/// Each worker keeps one connection for its claims and one per job of a claim for the
/// reports, which it sends all at once.
async fn drive_workers(
    addr: SocketAddr,
    workers: usize,
    claim_limit: usize,
    total: usize,
) -> anyhow::Result<(Vec<Duration>, Duration)> {
    let done = Arc::new(AtomicUsize::new(0));
    let claim_path = "/api/training/internal/jobs/claim";
    let report = LoadRequest::json("/api/training/internal/jobs/succeeded", BENCH_INTERNAL_KEY, &[])?;
    let started = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..workers {
        let done = done.clone();
        let worker_id = format!("bench-worker-{w}");
        let claim = LoadRequest::json(claim_path, BENCH_INTERNAL_KEY, &[])?
            .with_body(json!({"worker_id": worker_id, "action": "tracer", "limit": claim_limit}).to_string());
        let report = report.clone();
        tasks.push(tokio::spawn(async move {
            let mut claims = Connection::new(addr);
            let mut reports: Vec<Connection> = (0..claim_limit).map(|_| Connection::new(addr)).collect();
            let mut latencies = Vec::new();
            while done.load(Ordering::Relaxed) < total {
                let sent = Instant::now();
                let (status, body) = claims
                    .send(&claim)
                    .await
                    .ok_or_else(|| anyhow::anyhow!("a claim got no answer"))?;
                if !status.is_success() {
                    anyhow::bail!("a claim was refused: {status}");
                }
                latencies.push(sent.elapsed());
                let claimed: Value = serde_json::from_slice(&body)?;
                let jobs = claimed["jobs"].as_array().cloned().unwrap_or_default();
                if jobs.is_empty() {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                let sends = jobs.iter().zip(reports.iter_mut()).map(|(job, connection)| {
                    let request = report
                        .with_body(json!({"job_id": job["job_id"], "worker_id": worker_id}).to_string());
                    async move { connection.send(&request).await }
                });
                for answer in join_all(sends).await {
                    if !answer.is_some_and(|(status, _)| status.is_success()) {
                        anyhow::bail!("a succeeded report was refused");
                    }
                }
                done.fetch_add(jobs.len(), Ordering::Relaxed);
            }
            Ok::<_, anyhow::Error>(latencies)
        }));
    }
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await??);
    }
    let elapsed = started.elapsed();
    latencies.sort_unstable();
    Ok((latencies, elapsed))
}
