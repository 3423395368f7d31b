//! `keel-bench search`: full-text search of traces on PostgreSQL (issue 44). A project of
//! 1,000,000 traces (30 words each from a 5,000-word vocabulary; one word in every other
//! trace, a rare one in one of 10,000) is searched through the list's own query, `q` of the
//! rare and the common word together, and each alone: p50 and p95 of warm runs, once all is
//! indexed and again with an unindexed tail. Beside it, in the same run, the trace writer's
//! insert throughput (its statements, 256 rows each) into a database with the search column
//! and its indexes, against one without them, interleaved: with the search indexer paused
//! (then timed catching up) and with it running beside the writer.

use std::io::Write;
use std::time::{Duration, Instant};

use chrono::Utc;
use entities::trace;
use sea_orm::{ConnectionTrait, DatabaseConnection};

use crate::common::{migrated, BenchDb, Tenant};

pub struct SearchBench {
    pub postgres_url: String,
    pub traces: usize,
    pub writes: usize,
    pub rounds: usize,
    pub queries: usize,
    /// Traces written after the index is built and left unindexed for the last searches.
    pub tail: usize,
    /// Steady writer rates (traces/s) at which the indexer's lag is sampled...
    pub paced_rates: Vec<u64>,
    /// ...each for this many seconds.
    pub paced_secs: u64,
}

const RARE: &str = "zyxwvut";
const COMMON: &str = "order";
const VOCABULARY: usize = 5_000;

/// A cheap deterministic generator (xorshift), so every run searches the same text.
struct Words(u64);

impl Words {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn word(&mut self) -> String {
        format!("w{}", self.next() % VOCABULARY as u64)
    }
}

fn trace_of(tenant: &Tenant, i: usize, words: &mut Words) -> trace::Model {
    let mut text: Vec<String> = (0..30).map(|_| words.word()).collect();
    if i.is_multiple_of(2) {
        text[3] = COMMON.into();
    }
    // Every rare trace also holds the common word.
    if i % 10_000 == 8 {
        text[11] = RARE.into();
    }
    let question = text[..20].join(" ");
    let answer = text[20..].join(" ");
    let request =
        serde_json::json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": question}]});
    let response = serde_json::json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}]});
    let indexed = keel_core::traces::search::index(&request, Some(&response));
    trace::Model {
        id: keel_core::domain::TraceId::time_ordered(),
        org_id: tenant.org_id.clone(),
        project_id: tenant.project_id.clone(),
        provider: "openai".into(),
        model: Some("gpt-4o-mini".into()),
        request: request.to_string(),
        response: Some(response.to_string()),
        status_code: 200,
        stream: false,
        complete: true,
        latency_ms: 300,
        ttfb_ms: Some(100),
        prompt_tokens: Some(40),
        completion_tokens: Some(15),
        total_tokens: Some(55),
        usage_estimated: false,
        error: None,
        created_at: Utc::now(),
        search_text: Some(indexed.search_text),
        preview_input: indexed.preview_input,
        preview_output: indexed.preview_output,
    }
}

/// Inserts `n` traces in the writer's batches; answers the time taken.
async fn write(
    conn: &DatabaseConnection,
    tenant: &Tenant,
    n: usize,
    words: &mut Words,
) -> anyhow::Result<Duration> {
    let rows: Vec<trace::Model> = (0..n).map(|i| trace_of(tenant, i, words)).collect();
    let started = Instant::now();
    for batch in rows.chunks(256) {
        keel_core::fixtures::insert_traces(conn, batch).await?;
    }
    Ok(started.elapsed())
}

/// The `p` percentile of `sorted` in milliseconds (0 of none).
fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let at = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[at].as_secs_f64() * 1000.0
}

/// Until the search indexer has reached every trace; answers how long that took.
async fn indexed(conn: &DatabaseConnection) -> anyhow::Result<Duration> {
    let started = Instant::now();
    while keel_core::fixtures::oldest_unindexed(conn).await?.is_some() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(started.elapsed())
}

/// The writer at steady rates below its full speed (a batch of 256 at each tick), the indexer
/// running: how far behind the indexer is, sampled every 100 ms.
async fn paced(
    out: &mut impl Write,
    conn: &DatabaseConnection,
    tenant: &Tenant,
    bench: &SearchBench,
    words: &mut Words,
) -> anyhow::Result<()> {
    writeln!(
        out,
        "| rate, traces/s | written | seconds | index lag p50 ms | p99 ms | max ms |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|")?;
    for &rate in &bench.paced_rates {
        let stop = tokio_util::sync::CancellationToken::new();
        let counter = prometheus::IntCounter::new("indexed", "traces indexed")?;
        let indexer = tokio::spawn(keel_core::traces::indexer::run(
            conn.clone(),
            counter,
            stop.clone(),
        ));
        let sampling = stop.child_token();
        let sampler = {
            let (conn, sampling) = (conn.clone(), sampling.clone());
            tokio::spawn(async move {
                let mut lags = Vec::new();
                while !sampling.is_cancelled() {
                    if let Ok(oldest) = keel_core::fixtures::oldest_unindexed(&conn).await {
                        let lag = oldest.map_or(0, |at| (Utc::now() - at).num_milliseconds().max(0));
                        lags.push(Duration::from_millis(lag as u64));
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                lags
            })
        };
        let total = (rate * bench.paced_secs) as usize;
        let tick = Duration::from_secs_f64(256.0 / rate as f64);
        let mut ticks = tokio::time::interval(tick);
        let started = Instant::now();
        for from in (0..total).step_by(256) {
            ticks.tick().await;
            // Made at its tick: a trace's time is when the writer got it.
            let batch: Vec<trace::Model> = (from..(from + 256).min(total))
                .map(|i| trace_of(tenant, i, words))
                .collect();
            keel_core::fixtures::insert_traces(conn, &batch).await?;
        }
        let seconds = started.elapsed().as_secs_f64();
        indexed(conn).await?;
        sampling.cancel();
        let mut lags = sampler.await?;
        stop.cancel();
        indexer.await?;
        lags.sort();
        let max = lags.last().map_or(0.0, |d| d.as_secs_f64() * 1000.0);
        writeln!(
            out,
            "| {rate} | {total} | {seconds:.1} | {:.0} | {:.0} | {max:.0} |",
            percentile(&lags, 0.5),
            percentile(&lags, 0.99),
        )?;
        eprintln!("paced {rate}/s: lag max {max:.0} ms");
    }
    writeln!(out)?;
    Ok(())
}

/// A table of each query's first page: matches, p50 and p95 of `runs` warm runs.
async fn search_table(
    out: &mut impl Write,
    conn: &DatabaseConnection,
    tenant: &Tenant,
    queries: &[String],
    runs: usize,
) -> anyhow::Result<()> {
    writeln!(out, "| q | matches (first page of 50) | p50 ms | p95 ms | runs |")?;
    writeln!(out, "|---|---|---|---|---|")?;
    for q in queries {
        let (found, p50, p95) = search(conn, tenant, q, runs).await?;
        writeln!(out, "| `{q}` | {found} | {p50:.1} | {p95:.1} | {runs} |")?;
    }
    Ok(())
}

/// The first page of `q`'s matches, `runs` warm times: (matches on the page, p50, p95 ms).
async fn search(
    conn: &DatabaseConnection,
    tenant: &Tenant,
    q: &str,
    runs: usize,
) -> anyhow::Result<(usize, f64, f64)> {
    let orgs = vec![tenant.org_id.clone()];
    let filter = keel_core::traces::TraceFilter {
        search: Some(keel_core::traces::search::Query::parse(q)),
        ..Default::default()
    };
    let mut times = Vec::with_capacity(runs);
    let mut found = 0;
    for run in 0..runs + 5 {
        let started = Instant::now();
        let page = keel_core::traces::browse::list(conn, &orgs, &tenant.project_id, filter.clone(), None, 50)
            .await?;
        // The first few warm the cache.
        if run >= 5 {
            times.push(started.elapsed());
        }
        found = page.traces.len();
    }
    times.sort();
    Ok((found, percentile(&times, 0.5), percentile(&times, 0.95)))
}

pub async fn run(bench: SearchBench) -> anyhow::Result<()> {
    let admin = Some(bench.postgres_url.as_str());
    let mut out = std::io::stdout().lock();

    // The writer into a database with the search column, its GIN index and the unindexed
    // tail's index, against one without the three, interleaved. The indexer's work is
    // measured apart (paused while the writer writes, then timed catching up) and together
    // (running beside the writer, as every instance runs it).
    let (with_db, without_db) = (BenchDb::create(admin).await?, BenchDb::create(admin).await?);
    let (with, without) = (migrated(&with_db).await?, migrated(&without_db).await?);
    without
        .execute_unprepared(
            "DROP INDEX idx_traces_search; DROP INDEX idx_traces_unindexed; \
             ALTER TABLE traces DROP COLUMN search",
        )
        .await?;
    let (with_tenant, without_tenant) = (Tenant::create(&with).await?, Tenant::create(&without).await?);
    let indexed_total = prometheus::IntCounter::new("indexed", "traces indexed")?;
    let mut words = Words(0x9e37_79b9_7f4a_7c15);
    writeln!(
        out,
        "| round | without the index, traces/s | with, indexer paused | with / without | indexer catching up, traces/s | with, indexer running | with / without | indexer done after the writer, ms |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|---|---|")?;
    let rate = |d: Duration| bench.writes as f64 / d.as_secs_f64();
    let mut rates: [Vec<f64>; 4] = Default::default();
    for round in 1..=bench.rounds {
        let without_rate = rate(write(&without, &without_tenant, bench.writes, &mut words).await?);
        let paused = rate(write(&with, &with_tenant, bench.writes, &mut words).await?);
        let started = Instant::now();
        let caught = keel_core::traces::indexer::catch_up(&with, &indexed_total).await?;
        let catching_up = caught as f64 / started.elapsed().as_secs_f64();
        let stop = tokio_util::sync::CancellationToken::new();
        let indexer = tokio::spawn(keel_core::traces::indexer::run(
            with.clone(),
            indexed_total.clone(),
            stop.clone(),
        ));
        let running = rate(write(&with, &with_tenant, bench.writes, &mut words).await?);
        let behind = indexed(&with).await?;
        stop.cancel();
        indexer.await?;
        writeln!(
            out,
            "| {round} | {without_rate:.0} | {paused:.0} | {:.0}% | {catching_up:.0} | {running:.0} | {:.0}% | {:.0} |",
            100.0 * paused / without_rate,
            100.0 * running / without_rate,
            behind.as_secs_f64() * 1000.0
        )?;
        eprintln!(
            "writer round {round}: without {without_rate:.0}/s, paused {paused:.0}/s, running {running:.0}/s"
        );
        for (all, one) in rates.iter_mut().zip([without_rate, paused, catching_up, running]) {
            all.push(one);
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    let [without_rate, paused, catching_up, running] = rates.map(|v| mean(&v));
    writeln!(
        out,
        "| **mean** | {without_rate:.0} | {paused:.0} | {:.0}% | {catching_up:.0} | {running:.0} | {:.0}% | |\n",
        100.0 * paused / without_rate,
        100.0 * running / without_rate,
    )?;
    paced(&mut out, &with, &with_tenant, &bench, &mut words).await?;
    with.close().await.ok();
    without.close().await.ok();
    with_db.drop_now().await;
    without_db.drop_now().await;

    // A million traces, indexed, searched; then searched again with an unindexed tail.
    let db = BenchDb::create(admin).await?;
    let conn = migrated(&db).await?;
    let tenant = Tenant::create(&conn).await?;
    let started = Instant::now();
    let mut words = Words(0x2545_f491_4f6c_dd1d);
    let mut done = 0;
    let write_all = |from: usize, to: usize, words: &mut Words| {
        (from..to)
            .map(|i| trace_of(&tenant, i, words))
            .collect::<Vec<_>>()
    };
    while done < bench.traces {
        let n = (bench.traces - done).min(10_000);
        for batch in write_all(done, done + n, &mut words).chunks(256) {
            keel_core::fixtures::insert_traces(&conn, batch).await?;
        }
        done += n;
        if done.is_multiple_of(100_000) {
            eprintln!("{done} traces written ({:.0} s)", started.elapsed().as_secs_f64());
        }
    }
    let written = started.elapsed();
    let counter = prometheus::IntCounter::new("indexed", "traces indexed")?;
    let started = Instant::now();
    keel_core::traces::indexer::catch_up(&conn, &counter).await?;
    let indexing = started.elapsed();
    conn.execute_unprepared("ANALYZE traces").await?;
    writeln!(
        out,
        "{} traces in one project, written in {:.0} s, then indexed in {:.0} s ({:.0} traces/s).\n",
        bench.traces,
        written.as_secs_f64(),
        indexing.as_secs_f64(),
        counter.get() as f64 / indexing.as_secs_f64()
    )?;
    let queries = [
        format!("{RARE} {COMMON}"),
        RARE.to_owned(),
        COMMON.to_owned(),
        format!("\"{COMMON} w1\""),
    ];
    search_table(&mut out, &conn, &tenant, &queries, bench.queries).await?;
    // A tail the indexer has not reached (its batches never run here): the writer's traces
    // of about a second at full speed.
    let tail = bench.tail;
    for batch in write_all(done, done + tail, &mut words).chunks(256) {
        keel_core::fixtures::insert_traces(&conn, batch).await?;
    }
    writeln!(
        out,
        "\nThe same searches with {tail} more traces written and not yet indexed:\n"
    )?;
    search_table(&mut out, &conn, &tenant, &queries, bench.queries).await?;
    conn.close().await.ok();
    db.drop_now().await;
    Ok(())
}
