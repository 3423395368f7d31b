//! `keel bench proxy`: the recording proxy's added latency and throughput. A local fake
//! provider answers a fixed chat completion; the same load goes to it directly (the
//! baseline) and through keel with recording on. Added latency = proxied minus direct, at
//! fixed request rates (open loop: requests leave on schedule, whatever came back) and at
//! saturation (closed loop). Memory is the process's resident set (keel, the fake and the
//! load generator share this process).

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::{web, App, HttpResponse, HttpServer};

use crate::common::{
    bench_settings, millis, proc_cpu, proc_kib, run_load, stat_cpu, BenchDb, LoadRequest, LoadResult,
};
use keel::startup::Application;

const COMPLETION: &str = r#"{"id":"chatcmpl-bench","object":"chat.completion","created":1763683200,"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"Paris is the capital of France."},"finish_reason":"stop"}],"usage":{"prompt_tokens":24,"completion_tokens":8,"total_tokens":32}}"#;
const REQUEST: &str = r#"{"model":"gpt-4o-mini","max_tokens":32,"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"What is the capital of France?"}]}"#;

pub struct ProxyBench {
    pub rates: Vec<u32>,
    pub seconds: u64,
    /// The fixed-rate runs' connections at most (requests in flight).
    pub connections: usize,
    pub concurrency: usize,
    pub saturation_requests: usize,
    /// Every measurement this many times, each round interleaving direct, recording on and
    /// recording off.
    pub rounds: usize,
    /// Overrides `traces.flush_rows`.
    pub flush_rows: Option<usize>,
    /// Overrides `traces.flush_ms`.
    pub flush_ms: Option<u64>,
    /// Overrides `traces.batch_interval_ms`.
    pub batch_interval_ms: Option<u64>,
    /// Overrides `server.workers`.
    pub workers: Option<usize>,
    /// Also on PostgreSQL (an admin URL; a scratch database is created and dropped).
    pub postgres_url: Option<String>,
    pub skip_sqlite: bool,
    /// The third phase records through a key with every limit set high instead of recording
    /// off.
    pub key_limits: bool,
    /// `traces.search_indexer`.
    pub search_indexer: bool,
}

/// Starts the fake provider on its own thread (so it never competes with keel's workers for
/// a runtime); answers its base URL and address.
fn start_fake_provider() -> anyhow::Result<(String, SocketAddr)> {
    let listener = keel::startup::listen(([127, 0, 0, 1], 0).into(), crate::common::BACKLOG)?;
    let addr = listener.local_addr()?;
    let port = addr.port();
    std::thread::spawn(move || {
        let system = actix_web::rt::System::new();
        system.block_on(async move {
            let server = HttpServer::new(|| {
                App::new().route(
                    "/v1/chat/completions",
                    // The body is read, as a provider does (an unread body closes the
                    // connection after the answer).
                    web::post().to(|_body: web::Bytes| async {
                        HttpResponse::Ok()
                            .content_type("application/json")
                            .body(COMPLETION)
                    }),
                )
            })
            .workers(1)
            // As a provider's edge does: each write goes out at once.
            .tcp_nodelay(true)
            .disable_signals()
            .listen(listener);
            if let Ok(server) = server {
                let _ = server.run().await;
            }
        });
    });
    Ok((format!("http://127.0.0.1:{port}/v1"), addr))
}

/// CPU time used so far by the threads that write traces: the main thread (the actix system
/// whose arbiter runs the trace writer's task; the bench itself only waits there) and
/// SQLite's worker threads (`sqlx-sqlite-worker-N`, which run every statement).
fn trace_writer_cpu() -> Duration {
    let pid = std::process::id().to_string();
    std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|task| {
            let tid = task.file_name().into_string().ok()?;
            let stat = std::fs::read_to_string(task.path().join("stat")).ok()?;
            let (comm, cpu) = stat_cpu(&stat)?;
            (tid == pid || comm.starts_with("sqlx-sqlite")).then_some(cpu)
        })
        .sum()
}

/// A measured run at `rate`, after a second at the same rate, unmeasured: the client's and
/// keel's connection pools grow to what the rate keeps open before anything is timed
/// (otherwise the first run at a rate pays for opening them and the next ones do not).
async fn measured<F>(load: OpenLoop, label: &'static str, make: F) -> LoadResult
where
    F: Fn() -> reqwest::RequestBuilder + Clone + Send + Sync + 'static,
{
    let warm_up = OpenLoop { seconds: 1, ..load };
    run_at_rate(warm_up, None, make.clone()).await;
    run_at_rate(load, Some(label), make).await
}

/// An open-loop run: `rate` requests a second for `seconds`, each leaving on schedule on
/// one of at most `connections` connections. A request that finds them all busy waits for
/// one (as an SDK's bounded pool makes it), and that wait counts in its latency.
#[derive(Clone, Copy)]
pub struct OpenLoop {
    pub rate: u32,
    pub seconds: u64,
    pub connections: usize,
}

/// The load generator's runtime: one thread, kept for the whole benchmark. A connection
/// lives on the runtime that opened it, so a runtime per run would close the generator's
/// connections at the end of each warm-up, and each measured run would begin by opening
/// them all again.
fn load_runtime() -> Option<&'static tokio::runtime::Runtime> {
    static RUNTIME: std::sync::OnceLock<Option<tokio::runtime::Runtime>> = std::sync::OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .thread_name("keel-bench-load")
                .enable_all()
                .build()
                .ok()
        })
        .as_ref()
}

/// Sends an open-loop run from the load generator's runtime; with a label, reports the
/// run's slow bursts on stderr.
async fn run_at_rate<F>(load: OpenLoop, label: Option<&'static str>, make: F) -> LoadResult
where
    F: Fn() -> reqwest::RequestBuilder + Send + Sync + 'static,
{
    let done = match load_runtime() {
        Some(runtime) => runtime.spawn(drive_at_rate(load, label, make)).await.ok(),
        None => None,
    };
    done.unwrap_or(LoadResult {
        ok: 0,
        failed: 1,
        elapsed: Duration::ZERO,
        latencies: Vec::new(),
    })
}

async fn drive_at_rate<F>(load: OpenLoop, label: Option<&'static str>, make: F) -> LoadResult
where
    F: Fn() -> reqwest::RequestBuilder + Send + Sync + 'static,
{
    let make = Arc::new(make);
    let connections = Arc::new(tokio::sync::Semaphore::new(load.connections.max(1)));
    let total = u64::from(load.rate) * load.seconds;
    let interval = Duration::from_secs_f64(1.0 / f64::from(load.rate.max(1)));
    let started = Instant::now();
    let wall_start = chrono::Utc::now();
    let mut tasks = Vec::with_capacity(total as usize);
    for i in 0..total {
        let due = started + interval.mul_f64(i as f64);
        tokio::time::sleep_until(due.into()).await;
        let request = make();
        let connections = connections.clone();
        tasks.push(tokio::spawn(async move {
            // Timed from here, not from `due`: the runtime's timer wakes the loop up to a
            // millisecond after it, the same for every request and either way.
            let sent = Instant::now();
            // At most `connections` requests in flight, so at most that many connections.
            let _connection = connections
                .acquire_owned()
                .await
                .map_err(|_| "closed".to_owned())?;
            match request.send().await {
                Ok(response) if response.status().is_success() => {
                    let _ = response.bytes().await;
                    Ok((sent - started, sent.elapsed()))
                }
                Ok(response) => Err(format!("status {}", response.status().as_u16())),
                Err(err) => Err(keel_core::peer::causes(&err)),
            }
        }));
    }
    let mut timed = Vec::with_capacity(tasks.len());
    let mut failures: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    for task in tasks {
        match task.await {
            Ok(Ok(sent_and_latency)) => timed.push(sent_and_latency),
            Ok(Err(kind)) => *failures.entry(kind).or_default() += 1,
            Err(_) => *failures.entry("panicked".into()).or_default() += 1,
        }
    }
    let failed = failures.values().sum();
    let elapsed = started.elapsed();
    if let Some(label) = label {
        if !failures.is_empty() {
            eprintln!("  {label}: {failed} failed: {failures:?}");
        }
        report_slow_bursts(label, wall_start, &timed);
    }
    let mut latencies: Vec<Duration> = timed.into_iter().map(|(_, latency)| latency).collect();
    latencies.sort_unstable();
    LoadResult {
        ok: latencies.len(),
        failed,
        elapsed,
        latencies,
    }
}

/// Where a fixed-rate run's tail comes from (on stderr): the requests slower than
/// [`SLOW`], grouped into bursts (sent less than [`SLOW`] apart), the worst bursts with the
/// wall-clock time they started, to be laid beside what else ran then (the trace writer's
/// commits, `strace -tt`, `perf sched`). A tail made of a few bursts is a stall of something
/// all the requests waited for; one spread over the run is a cost every request pays.
const SLOW: Duration = Duration::from_millis(2);

fn report_slow_bursts(
    label: &str,
    wall_start: chrono::DateTime<chrono::Utc>,
    timed: &[(Duration, Duration)],
) {
    let mut slow: Vec<(Duration, Duration)> = timed.iter().copied().filter(|(_, l)| *l > SLOW).collect();
    slow.sort_unstable();
    // (first sent, last sent, requests, slowest)
    let mut bursts: Vec<(Duration, Duration, usize, Duration)> = Vec::new();
    for (sent, latency) in slow.iter().copied() {
        match bursts.last_mut() {
            Some(burst) if sent.saturating_sub(burst.1) < SLOW => {
                burst.1 = sent;
                burst.2 += 1;
                burst.3 = burst.3.max(latency);
            }
            _ => bursts.push((sent, sent, 1, latency)),
        }
    }
    eprintln!(
        "  {label}: {} of {} requests slower than {} ms, in {} bursts",
        slow.len(),
        timed.len(),
        SLOW.as_millis(),
        bursts.len()
    );
    bursts.sort_by_key(|burst| std::cmp::Reverse(burst.2));
    for (first, last, count, slowest) in bursts.iter().take(5) {
        let at = wall_start + chrono::Duration::from_std(*first).unwrap_or_default();
        eprintln!(
            "    at {} (+{:.1} s): {count} requests sent over {:.1} ms, slowest {} ms",
            at.format("%H:%M:%S%.3f"),
            first.as_secs_f64(),
            (*last - *first).as_secs_f64() * 1000.0,
            millis(*slowest),
        );
    }
}

/// A fixed-rate table row: direct, through keel with recording on, and with it off.
fn rate_row(name: &str, d: &LoadResult, p: &LoadResult, u: &LoadResult) -> String {
    format!(
        "| {name} | {} | {} | {} | {} | {} | {} | {}/{} | {} | {} |",
        millis(d.percentile(0.5)),
        millis(d.percentile(0.99)),
        millis(p.percentile(0.5)),
        millis(p.percentile(0.99)),
        added(p.percentile(0.5), d.percentile(0.5)),
        added(p.percentile(0.99), d.percentile(0.99)),
        p.ok,
        p.failed,
        added(u.percentile(0.5), d.percentile(0.5)),
        added(u.percentile(0.99), d.percentile(0.99)),
    )
}

/// The runs as one: their requests together, their percentiles over all of them.
fn pooled(runs: Vec<LoadResult>) -> LoadResult {
    let mut all = LoadResult {
        ok: 0,
        failed: 0,
        elapsed: Duration::ZERO,
        latencies: Vec::new(),
    };
    for run in runs {
        all.ok += run.ok;
        all.failed += run.failed;
        all.elapsed += run.elapsed;
        all.latencies.extend(run.latencies);
    }
    all.latencies.sort_unstable();
    all
}

/// One saturation round's figures (or their medians).
struct Saturation {
    direct: f64,
    /// Until every trace of the phase is written.
    on: f64,
    off: f64,
    /// `on / direct`, of the same round (the median row: the rounds' median ratio).
    ratio: f64,
    /// keel's own CPU per request: the phase's process CPU minus the direct phase's.
    keel_on: f64,
    keel_off: f64,
    /// CPU per trace written.
    writer: f64,
    postgres: f64,
    failed: usize,
}

impl Saturation {
    fn row(&self, name: &str, on_postgres: bool) -> String {
        let postgres = match on_postgres {
            true => format!("{:.1}", self.postgres),
            false => "-".to_owned(),
        };
        format!(
            "| {name} | {:.0} | {:.0} | {:.0} | {:.0}% | {:.1} / {:.1} | {:.1} | {postgres} | {} |",
            self.direct,
            self.on,
            self.off,
            100.0 * self.ratio,
            self.keel_on,
            self.keel_off,
            self.writer,
            self.failed,
        )
    }

    /// Each figure's median over the rounds; failures summed.
    fn median(rounds: &[Self]) -> Self {
        let median = |figure: fn(&Self) -> f64| {
            let mut values: Vec<f64> = rounds.iter().map(figure).collect();
            values.sort_by(f64::total_cmp);
            match values.len() {
                0 => 0.0,
                len if len % 2 == 1 => values[len / 2],
                len => (values[len / 2 - 1] + values[len / 2]) / 2.0,
            }
        };
        Self {
            direct: median(|r| r.direct),
            on: median(|r| r.on),
            off: median(|r| r.off),
            ratio: median(|r| r.ratio),
            keel_on: median(|r| r.keel_on),
            keel_off: median(|r| r.keel_off),
            writer: median(|r| r.writer),
            postgres: median(|r| r.postgres),
            failed: rounds.iter().map(|r| r.failed).sum(),
        }
    }
}

fn added(proxied: Duration, direct: Duration) -> String {
    let delta = proxied.as_secs_f64() - direct.as_secs_f64();
    format!("{:.3}", delta * 1000.0)
}

pub async fn run(bench: ProxyBench) -> anyhow::Result<()> {
    let (provider, provider_addr) = start_fake_provider()?;
    let mut databases: Vec<(&'static str, Option<&str>)> = Vec::new();
    if !(bench.skip_sqlite && bench.postgres_url.is_some()) {
        databases.push(("SQLite", None));
    }
    if let Some(url) = &bench.postgres_url {
        databases.push(("PostgreSQL", Some(url.as_str())));
    }
    for (database, admin_url) in databases {
        let mut out = std::io::stdout().lock();
        writeln!(out, "\n### {database}\n")?;
        drop(out);
        eprintln!("{database}:");
        run_one(&bench, admin_url, &provider, provider_addr).await?;
    }
    Ok(())
}

async fn run_one(
    bench: &ProxyBench,
    admin_url: Option<&str>,
    provider: &str,
    provider_addr: SocketAddr,
) -> anyhow::Result<()> {
    let db = BenchDb::create(admin_url).await?;
    let mut settings = bench_settings(&db.url)?;
    settings.providers.openai_url = provider.to_owned();
    if let Some(rows) = bench.flush_rows {
        settings.traces.flush_rows = rows;
    }
    if let Some(ms) = bench.flush_ms {
        settings.traces.flush_ms = ms;
    }
    if let Some(ms) = bench.batch_interval_ms {
        settings.traces.batch_interval_ms = ms;
    }
    if let Some(workers) = bench.workers {
        settings.server.workers = workers;
    }
    settings.traces.search_indexer = bench.search_indexer;
    eprintln!(
        "server.workers = {}, traces.flush_rows = {}, traces.flush_ms = {}, traces.batch_interval_ms = {}, traces.search_indexer = {}",
        settings.server.workers,
        settings.traces.flush_rows,
        settings.traces.flush_ms,
        settings.traces.batch_interval_ms,
        settings.traces.search_indexer
    );
    let app = Application::build(settings).await?;
    let base = format!("http://127.0.0.1:{}", app.port());
    let keel_addr = SocketAddr::from(([127, 0, 0, 1], app.port()));
    let state = app.state().clone();
    let handle = app.handle();
    let server = actix_web::rt::spawn(app.run_until_stopped());

    let tenant = crate::common::Tenant::create(&state.db).await?;
    // Idle connections are let go well before keel's keep-alive (5 s) would close them: a
    // connection left idle through another phase was otherwise taken again just as keel
    // closed it ("connection closed before message completed", 51 calls of one run).
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(1024)
        .pool_idle_timeout(Duration::from_secs(2))
        .tcp_nodelay(true)
        .build()?;
    let direct = {
        let (client, url) = (client.clone(), format!("{provider}/chat/completions"));
        move || {
            client
                .post(&url)
                .bearer_auth("sk-bench-provider-key")
                .header("content-type", "application/json")
                .body(REQUEST)
        }
    };
    // With --key-limits, a second key of the tenant with every limit set, none ever reached.
    let limited_key = match bench.key_limits {
        true => {
            let settings = keel_core::keys::KeySettings {
                limits: keel_core::keys::Limits {
                    requests_per_minute: Some(1_000_000),
                    tokens_per_day: Some(1_000_000_000_000),
                    concurrent_streams: Some(10_000),
                },
                ..Default::default()
            };
            keel_core::fixtures::insert_key(&state.db, &tenant.org_id, Some("limited"), &settings)
                .await?
                .secret
        }
        false => tenant.key.clone(),
    };
    let third = match bench.key_limits {
        true => "limited key",
        false => "recording off",
    };
    let through_keel = |key: &str, record: bool| {
        let (client, url) = (client.clone(), format!("{base}/v1/chat/completions"));
        let (api_key, project_id) = (key.to_owned(), tenant.project_id.clone());
        move || {
            let request = client
                .post(&url)
                .bearer_auth(&api_key)
                .header("content-type", "application/json")
                .header("x-service-provider", "openai")
                .header("x-service-provider-key", "sk-bench-provider-key")
                .header("x-service-project-id", project_id.as_str())
                .body(REQUEST);
            match record {
                true => request,
                false => request.header("x-service-record", "false"),
            }
        }
    };
    let (proxied, unrecorded) = (
        through_keel(&tenant.key, true),
        through_keel(&limited_key, bench.key_limits),
    );
    let rss_before = proc_kib("self", "VmRSS:").unwrap_or(0);
    // Warm both paths (connections, caches, prepared statements).
    let warm = OpenLoop {
        rate: 200,
        seconds: 1,
        connections: bench.connections,
    };
    run_at_rate(warm, None, direct.clone()).await;
    run_at_rate(warm, None, proxied.clone()).await;
    // Each measured run follows a second at its own rate, unmeasured: the client's and keel's
    // connection pools grow to what the rate keeps open before anything is timed (otherwise
    // the first run at a rate pays for opening them, the next ones do not).

    let mut out = std::io::stdout().lock();
    writeln!(out, "| load | direct p50 ms | direct p99 ms | proxied p50 ms | proxied p99 ms | added p50 ms | added p99 ms | proxied ok/failed | {third}: added p50 ms | added p99 ms |")?;
    writeln!(out, "|---|---|---|---|---|---|---|---|---|---|")?;
    for &rate in &bench.rates {
        let load = OpenLoop {
            rate,
            seconds: bench.seconds,
            connections: bench.connections,
        };
        let mut rounds: [Vec<LoadResult>; 3] = Default::default();
        for round in 1..=bench.rounds {
            let d = measured(load, "direct", direct.clone()).await;
            let p = measured(load, "recording on", proxied.clone()).await;
            let u = measured(load, third, unrecorded.clone()).await;
            let row = rate_row(
                &format!("{rate}/s for {}s, round {round}", bench.seconds),
                &d,
                &p,
                &u,
            );
            eprintln!("{row}");
            writeln!(out, "{row}")?;
            for (all, run) in rounds.iter_mut().zip([d, p, u]) {
                all.push(run);
            }
        }
        if bench.rounds > 1 {
            let [d, p, u] = rounds.map(pooled);
            let name = format!("**{rate}/s, the {} rounds pooled**", bench.rounds);
            writeln!(out, "{}", rate_row(&name, &d, &p, &u))?;
        }
    }
    // Saturation: the same requests from the lean load generator, direct, recording on and
    // recording off in turn, each round.
    let (n, c) = (bench.saturation_requests, bench.concurrency);
    let path = "/v1/chat/completions";
    let direct = LoadRequest::json(path, "sk-bench-provider-key", &[])?.with_body(REQUEST);
    let proxy_headers = [
        ("x-service-provider", "openai"),
        ("x-service-provider-key", "sk-bench-provider-key"),
        ("x-service-project-id", tenant.project_id.as_str()),
    ];
    let proxied = LoadRequest::json(path, &tenant.key, &proxy_headers)?.with_body(REQUEST);
    let mut unrecorded_headers = proxy_headers.to_vec();
    if !bench.key_limits {
        unrecorded_headers.push(("x-service-record", "false"));
    }
    let unrecorded = LoadRequest::json(path, &limited_key, &unrecorded_headers)?.with_body(REQUEST);
    let on_postgres = admin_url.is_some();
    writeln!(out)?;
    writeln!(
        out,
        "| saturation, {c} in flight, {n} requests each | direct requests/s | recording on requests/s (until every trace is written) | {third} requests/s | on / direct | keel's CPU µs/request, on / {third} | trace writer µs/trace | PostgreSQL µs/trace | failed |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|---|---|---|")?;
    let mut rounds = Vec::with_capacity(bench.rounds);
    let (written_before, batches_before) = (
        state.traces.metrics.written.get(),
        state.traces.metrics.batches.get(),
    );
    for round in 1..=bench.rounds {
        let (direct, proxied, unrecorded) = (direct.clone(), proxied.clone(), unrecorded.clone());
        // CPU per request of each phase: the load generator and the fake provider take part
        // in all three, so a proxied phase minus the direct one is keel's own CPU per call.
        let cpu = proc_cpu("self");
        let d = run_load(provider_addr, c, n, move |_| direct.clone()).await;
        let cpu_direct = proc_cpu("self").saturating_sub(cpu);
        let (cpu, writer_cpu, postgres_cpu, written) = (
            proc_cpu("self"),
            trace_writer_cpu(),
            crate::common::postgres_cpu(),
            state.traces.metrics.written.get(),
        );
        // The recording phase lasts until every trace it recorded is written (the drain).
        let started = Instant::now();
        let p = run_load(keel_addr, c, n, move |_| proxied.clone()).await;
        state.traces.drain().await;
        let recording_elapsed = started.elapsed();
        let cpu_recorded = proc_cpu("self").saturating_sub(cpu);
        let writer_cpu = trace_writer_cpu().saturating_sub(writer_cpu);
        let postgres_cpu = crate::common::postgres_cpu().saturating_sub(postgres_cpu);
        let written = state.traces.metrics.written.get() - written;
        let cpu = proc_cpu("self");
        let started = Instant::now();
        let u = run_load(keel_addr, c, n, move |_| unrecorded.clone()).await;
        // A limited key records too: its phase, like the first, lasts until its traces are
        // written.
        if bench.key_limits {
            state.traces.drain().await;
        }
        let third_elapsed = started.elapsed();
        let cpu_unrecorded = proc_cpu("self").saturating_sub(cpu);

        let micros = |cpu: Duration, per: usize| cpu.as_secs_f64() * 1e6 / per.max(1) as f64;
        let baseline = micros(cpu_direct, n);
        let on = p.ok as f64 / recording_elapsed.as_secs_f64();
        let figures = Saturation {
            direct: d.per_second(),
            on,
            off: match bench.key_limits {
                true => u.ok as f64 / third_elapsed.as_secs_f64(),
                false => u.per_second(),
            },
            ratio: on / d.per_second(),
            keel_on: micros(cpu_recorded, n) - baseline,
            keel_off: micros(cpu_unrecorded, n) - baseline,
            writer: micros(writer_cpu, written as usize),
            postgres: micros(postgres_cpu, written as usize),
            failed: d.failed + p.failed + u.failed,
        };
        eprintln!(
            "saturation, round {round}: direct {:.0}/s, recording on {:.0}/s, off {:.0}/s",
            figures.direct, figures.on, figures.off
        );
        writeln!(out, "{}", figures.row(&format!("round {round}"), on_postgres))?;
        rounds.push(figures);
    }
    if bench.rounds > 1 {
        writeln!(
            out,
            "{}",
            Saturation::median(&rounds).row("**median**", on_postgres)
        )?;
    }
    let rss_peak = proc_kib("self", "VmHWM:").unwrap_or(0);
    let (written, batches) = (
        state.traces.metrics.written.get() - written_before,
        state.traces.metrics.batches.get() - batches_before,
    );
    writeln!(out)?;
    writeln!(
        out,
        "Recording at saturation: {written} traces in {batches} batches ({:.1} rows each). The trace writer's figure is its thread's CPU (and SQLite's threads', on SQLite); PostgreSQL's is every `postgres` process's on this machine.",
        written as f64 / batches.max(1) as f64,
    )?;
    writeln!(
        out,
        "Traces written: {}, dropped: {}. Process RSS before load {} MiB, peak {} MiB.",
        state.traces.metrics.written.get(),
        state.traces.metrics.dropped.get(),
        rss_before / 1024,
        rss_peak / 1024
    )?;
    handle.stop(true).await;
    let _ = server.await;
    db.drop_now().await;
    Ok(())
}
