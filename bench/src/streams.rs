//! `keel-bench proxy --streams N`: N streamed chat completions open at once against a fake
//! provider that sends 50 chunks 20 ms apart (each stream on its own clock, their phases
//! spread; `--aligned`: one tick for all, the worst case), first straight to the fake (the
//! baseline), then through the bare relay (`crate::relay`: keel's HTTP stack doing none of
//! keel's work, a process of its own), then through a `keel serve` process (the built binary,
//! recording on). Each chunk carries the time the fake sent it (one clock: the fake and the
//! client are this process), so a chunk's delay is when the client read it minus when it left
//! the fake. Reported for the bare relay and for keel: added time to first byte and added
//! delay per chunk (its percentile minus the baseline's), over all chunks and over the chunks
//! sent once all N streams were open (the opening of N streams in one instant delays the
//! first chunks of the early ones: that is the time to first byte's cost, not a relayed
//! chunk's), the process's RSS per open stream (its peak minus its idle RSS, over N), its CPU
//! per chunk, and whether every stream's trace was written assembled.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::{web, App, HttpResponse, HttpServer};
use futures_util::StreamExt;

use crate::common::{millis, proc_cpu, proc_kib, BenchDb, Process};

/// Chunks per stream and the fake's pause between two.
const CHUNKS: usize = 50;
const EVERY: Duration = Duration::from_millis(20);

/// When the fake sends a stream's chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phases {
    /// Each stream on its own 20 ms clock, the streams' phases spread evenly over the 20 ms
    /// (as independent calls to a provider are).
    Spread,
    /// One 20 ms tick for all streams: every open stream gets a chunk at the same instant
    /// (the worst case: N chunks to relay at once, every 20 ms).
    Aligned,
}

/// One chunk of a stream: `n` of [`CHUNKS`] (the last one ends the stream), stamped with
/// when the fake sent it (µs since `epoch`).
fn frame(n: usize, sent: u64) -> web::Bytes {
    let text = if n == CHUNKS {
        format!("data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"t\":{sent},\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"stop\"}}],\"usage\":{{\"prompt_tokens\":9,\"completion_tokens\":50,\"total_tokens\":59}}}}\n\ndata: [DONE]\n\n")
    } else {
        format!("data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"model\":\"m\",\"t\":{sent},\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"word{n} \"}}}}]}}\n\n")
    };
    web::Bytes::from(text)
}

/// The fake's state shared by its handlers.
struct Fake {
    epoch: Instant,
    phases: Phases,
    /// The shared tick ([`Phases::Aligned`]).
    ticks: tokio::sync::broadcast::Sender<u64>,
    /// Streams started so far: the next one's phase ([`Phases::Spread`]).
    started: std::sync::atomic::AtomicU64,
}

impl Fake {
    /// The stream of one call: [`CHUNKS`] + 1 frames, [`EVERY`] apart.
    fn stream(&self) -> futures_util::stream::BoxStream<'static, Result<web::Bytes, actix_web::Error>> {
        let epoch = self.epoch;
        match self.phases {
            Phases::Aligned => {
                let receiver = self.ticks.subscribe();
                futures_util::stream::unfold((receiver, 0usize), move |(mut rx, n)| async move {
                    if n > CHUNKS {
                        return None;
                    }
                    let sent = loop {
                        match rx.recv().await {
                            Ok(at) => break at,
                            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                            Err(_) => return None,
                        }
                    };
                    Some((Ok(frame(n, sent)), (rx, n + 1)))
                })
                .boxed()
            }
            Phases::Spread => {
                // Golden-ratio steps over the 20 ms: any number of streams started in a row
                // lands evenly spread.
                let k = self.started.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let phase = EVERY.mul_f64((k as f64 * 0.618_033_988_75).fract());
                let mut interval = tokio::time::interval_at(tokio::time::Instant::now() + phase, EVERY);
                interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                futures_util::stream::unfold((interval, 0usize), move |(mut interval, n)| async move {
                    if n > CHUNKS {
                        return None;
                    }
                    interval.tick().await;
                    let sent = epoch.elapsed().as_micros() as u64;
                    Some((Ok(frame(n, sent)), (interval, n + 1)))
                })
                .boxed()
            }
        }
    }
}

/// Starts the fake streaming provider on a thread of its own. Answers its base URL.
fn start_fake(epoch: Instant, phases: Phases) -> anyhow::Result<String> {
    let listener = keel::startup::listen(([127, 0, 0, 1], 0).into(), crate::common::BACKLOG)?;
    let port = listener.local_addr()?.port();
    std::thread::spawn(move || {
        let system = actix_web::rt::System::new();
        system.block_on(async move {
            let (ticks, _) = tokio::sync::broadcast::channel::<u64>(256);
            if phases == Phases::Aligned {
                let sender = ticks.clone();
                actix_web::rt::spawn(async move {
                    let mut interval = tokio::time::interval(EVERY);
                    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
                    loop {
                        interval.tick().await;
                        let _ = sender.send(epoch.elapsed().as_micros() as u64);
                    }
                });
            }
            let fake = web::Data::new(Fake {
                epoch,
                phases,
                ticks,
                started: std::sync::atomic::AtomicU64::new(0),
            });
            let server = HttpServer::new(move || {
                App::new().app_data(fake.clone()).route(
                    "/v1/chat/completions",
                    web::post().to(|_body: web::Bytes, fake: web::Data<Fake>| async move {
                        HttpResponse::Ok()
                            .content_type("text/event-stream")
                            .streaming(fake.stream())
                    }),
                )
            })
            .workers(1)
            // As a provider's edge does: each write goes out at once.
            .tcp_nodelay(true)
            .max_connections(100_000)
            .disable_signals()
            .listen(listener);
            if let Ok(server) = server {
                let _ = server.run().await;
            }
        });
    });
    Ok(format!("http://127.0.0.1:{port}/v1"))
}

/// What one run of N streams saw.
struct Seen {
    ttfb: Vec<Duration>,
    chunk_delay: Vec<Duration>,
    /// The delays of the chunks the fake sent once every stream had its answer's head.
    open_delay: Vec<Duration>,
    failed: usize,
    chunks: usize,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Opens `n` streams at once to `url` on a runtime of its own (two threads) and reads them
/// to the end.
fn open_streams(n: usize, url: String, headers: Vec<(&'static str, String)>, epoch: Instant) -> Seen {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(_) => {
            return Seen {
                ttfb: Vec::new(),
                chunk_delay: Vec::new(),
                open_delay: Vec::new(),
                failed: n,
                chunks: 0,
            }
        }
    };
    runtime.block_on(async move {
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .tcp_nodelay(true)
            .timeout(Duration::from_secs(120))
            .build()
            .unwrap_or_default();
        let body = r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"Tell me a story."}]}"#;
        let tasks: Vec<_> = (0..n)
            .map(|_| {
                let mut request = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body);
                for (name, value) in &headers {
                    request = request.header(*name, value);
                }
                tokio::spawn(async move {
                    let sent = Instant::now();
                    let response = request.send().await.ok().filter(|r| r.status().is_success())?;
                    let ttfb = sent.elapsed();
                    let opened = epoch.elapsed().as_micros() as u64;
                    let mut delays = Vec::with_capacity(CHUNKS + 1);
                    let mut body = response.bytes_stream();
                    let mut pending = Vec::new();
                    while let Some(Ok(bytes)) = body.next().await {
                        let now = epoch.elapsed().as_micros() as u64;
                        pending.extend_from_slice(&bytes);
                        while let Some(end) = pending.windows(2).position(|w| w == b"\n\n") {
                            let frame: Vec<u8> = pending.drain(..end + 2).collect();
                            let text = String::from_utf8_lossy(&frame);
                            if let Some(at) = text
                                .split("\"t\":")
                                .nth(1)
                                .and_then(|rest| rest.split(',').next())
                                .and_then(|t| t.parse::<u64>().ok())
                            {
                                delays.push((at, Duration::from_micros(now.saturating_sub(at))));
                            }
                        }
                    }
                    Some((ttfb, opened, delays))
                })
            })
            .collect();
        let mut seen = Seen {
            ttfb: Vec::with_capacity(n),
            chunk_delay: Vec::with_capacity(n * (CHUNKS + 1)),
            open_delay: Vec::new(),
            failed: 0,
            chunks: 0,
        };
        let mut sent_delays = Vec::with_capacity(n * (CHUNKS + 1));
        let mut all_open = 0;
        for task in tasks {
            match task.await {
                Ok(Some((ttfb, opened, delays))) if delays.len() == CHUNKS + 1 => {
                    seen.ttfb.push(ttfb);
                    seen.chunks += delays.len();
                    all_open = all_open.max(opened);
                    sent_delays.extend(delays);
                }
                _ => seen.failed += 1,
            }
        }
        seen.chunk_delay
            .extend(sent_delays.iter().map(|(_, delay)| *delay));
        seen.open_delay.extend(
            sent_delays
                .iter()
                .filter(|(at, _)| *at >= all_open)
                .map(|(_, delay)| *delay),
        );
        seen.ttfb.sort_unstable();
        seen.chunk_delay.sort_unstable();
        seen.open_delay.sort_unstable();
        seen
    })
}

pub async fn run(counts: &[usize], phases: Phases) -> anyhow::Result<()> {
    // This process holds both ends of every direct stream (the client's and the fake's), and
    // the client's and the fake's of every stream through keel: two descriptors per stream.
    let open_files = keel::startup::raise_open_files_limit()?;
    let most = counts.iter().copied().max().unwrap_or(0) as u64;
    let needed = 2 * most + 256;
    if needed > open_files {
        eprintln!(
            "warning: {most} streams need about {needed} open files in this process and in keel; the limit is {open_files} \
             (raise the hard limit, e.g. `prlimit --nofile=65536:65536 keel-bench ...`): streams beyond it fail"
        );
    }
    let epoch = Instant::now();
    let provider = start_fake(epoch, phases)?;
    let db = BenchDb::create(None).await?;
    let conn = crate::common::migrated(&db).await?;
    let tenant = crate::common::Tenant::create(&conn).await?;

    let server = Process::keel_serve(&db.url, &[("KEEL_PROVIDER_OPENAI_URL", &provider)]).await?;
    let bare = crate::relay::start(&provider).await?;

    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "Streams of {} chunks {} ms apart ({}), all opened at once; added = through keel (or the bare relay: the same HTTP stack, none of keel's work) \
         minus straight to the fake, same N; once open = the chunks the fake sent after the last of the N streams had its answer's head.\n",
        CHUNKS + 1,
        EVERY.as_millis(),
        match phases {
            Phases::Spread => "each stream on its own clock, phases spread over the interval",
            Phases::Aligned => "one tick for all streams",
        }
    )?;
    writeln!(out, "| streams | through | TTFB p50 ms direct / through | added TTFB p50 ms | added TTFB p99 ms | chunk delay p99 ms direct / through | added per-chunk p99 ms | once open: chunk delay p99 ms direct / through | once open: added per-chunk p99 ms | RSS KiB per stream | CPU µs per chunk | failed direct / through | traces assembled |")?;
    writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|---|")?;
    let mut recorded = 0u64;
    for &n in counts {
        let direct_url = format!("{provider}/chat/completions");
        let direct =
            tokio::task::spawn_blocking(move || open_streams(n, direct_url, Vec::new(), epoch)).await?;
        let relayed = through(
            n,
            format!("{}/v1/chat/completions", bare.base),
            Vec::new(),
            bare.pid(),
            epoch,
        )
        .await?;
        let headers = vec![
            ("authorization", format!("Bearer {}", tenant.key)),
            ("x-service-provider", "openai".to_owned()),
            ("x-service-provider-key", "sk-bench-provider-key".to_owned()),
            ("x-service-project-id", tenant.project_id.to_string()),
        ];
        let keel = through(
            n,
            format!("{}/v1/chat/completions", server.base),
            headers,
            server.pid(),
            epoch,
        )
        .await?;
        recorded += (n - keel.seen.failed) as u64;
        // Every recorded stream's trace, written and assembled.
        let mut assembled = 0;
        for _ in 0..100 {
            assembled = assembled_traces(&conn, tenant.project_id.as_str()).await?;
            if assembled >= recorded {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        for (name, run, traces) in [
            ("bare relay", &relayed, "-".to_owned()),
            ("keel", &keel, format!("{assembled} of {recorded}")),
        ] {
            writeln!(out, "| {n} | {name} | {} |", row(&direct, run, n, &traces))?;
        }
        out.flush()?;
        let share = |seen: &Seen| 100.0 * seen.open_delay.len() as f64 / seen.chunk_delay.len().max(1) as f64;
        eprintln!(
            "{n} streams: {:.0}% (direct), {:.0}% (bare relay) and {:.0}% (keel) of the chunks were sent once all were open",
            share(&direct),
            share(&relayed.seen),
            share(&keel.seen)
        );
    }
    drop(bare);
    drop(server);
    conn.close().await?;
    db.drop_now().await;
    Ok(())
}

/// N streams through a relay process (keel or the bare relay): what the client saw, and
/// what the process spent.
struct Through {
    seen: Seen,
    /// Peak RSS during the streams minus the RSS before them.
    rss_kib: u64,
    cpu: Duration,
}

async fn through(
    n: usize,
    url: String,
    headers: Vec<(&'static str, String)>,
    pid: u32,
    epoch: Instant,
) -> anyhow::Result<Through> {
    let pid = pid.to_string();
    // The previous run's connections closed, its memory returned.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle = proc_kib(&pid, "VmRSS:").unwrap_or(0);
    let cpu_before = proc_cpu(&pid);
    let peak = Arc::new(Mutex::new(idle));
    let sampling = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let (peak, sampling, pid) = (peak.clone(), sampling.clone(), pid.clone());
        std::thread::spawn(move || {
            while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                let now = proc_kib(&pid, "VmRSS:").unwrap_or(0);
                if let Ok(mut peak) = peak.lock() {
                    *peak = (*peak).max(now);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let seen = tokio::task::spawn_blocking(move || open_streams(n, url, headers, epoch)).await?;
    sampling.store(false, std::sync::atomic::Ordering::Relaxed);
    let _ = sampler.join();
    let cpu = proc_cpu(&pid).saturating_sub(cpu_before);
    let peak = peak.lock().map(|p| *p).unwrap_or(idle);
    Ok(Through {
        seen,
        rss_kib: peak.saturating_sub(idle),
        cpu,
    })
}

/// A table row's cells after `streams | through |`: `run` against `direct`.
fn row(direct: &Seen, run: &Through, n: usize, traces: &str) -> String {
    let seen = &run.seen;
    let ms = |d: Duration| millis(d);
    let added = |through: Duration, direct: Duration| {
        format!("{:.3}", (through.as_secs_f64() - direct.as_secs_f64()) * 1000.0)
    };
    let p = percentile;
    format!(
        "{} / {} | {} | {} | {} / {} | {} | {} / {} | {} | {:.1} | {:.2} | {} / {} | {traces}",
        ms(p(&direct.ttfb, 0.5)),
        ms(p(&seen.ttfb, 0.5)),
        added(p(&seen.ttfb, 0.5), p(&direct.ttfb, 0.5)),
        added(p(&seen.ttfb, 0.99), p(&direct.ttfb, 0.99)),
        ms(p(&direct.chunk_delay, 0.99)),
        ms(p(&seen.chunk_delay, 0.99)),
        added(p(&seen.chunk_delay, 0.99), p(&direct.chunk_delay, 0.99)),
        ms(p(&direct.open_delay, 0.99)),
        ms(p(&seen.open_delay, 0.99)),
        added(p(&seen.open_delay, 0.99), p(&direct.open_delay, 0.99)),
        run.rss_kib as f64 / n.max(1) as f64,
        run.cpu.as_secs_f64() * 1e6 / seen.chunks.max(1) as f64,
        direct.failed,
        seen.failed,
    )
}

/// Traces of the project written complete with an assembled response.
async fn assembled_traces(conn: &sea_orm::DatabaseConnection, project_id: &str) -> anyhow::Result<u64> {
    use sea_orm::{ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter};
    Ok(entities::trace::Entity::find()
        .filter(entities::trace::Column::ProjectId.eq(project_id))
        .filter(entities::trace::Column::Complete.eq(true))
        .filter(entities::trace::Column::Response.is_not_null())
        .count(conn)
        .await?)
}
