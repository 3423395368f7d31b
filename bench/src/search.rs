//! `keel-bench search`: full-text search of traces on PostgreSQL (issue 44). A project of
//! 1,000,000 traces (30 words each from a 5,000-word vocabulary; one word in every other
//! trace, a rare one in one of 10,000) is searched through the list's own query, `q` of the
//! rare and the common word together, and each alone: p50 and p95 of warm runs. Beside it, in
//! the same run, the trace writer's insert throughput (its statements, 256 rows each) into a
//! database with the search column and its GIN index, against one without them, interleaved.

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
    let indexed = keel::traces::search::index(&request, Some(&response));
    trace::Model {
        id: keel::domain::TraceId::time_ordered(),
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
        keel::traces::repo::insert_traces(conn, batch).await?;
    }
    Ok(started.elapsed())
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    let at = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[at].as_secs_f64() * 1000.0
}

pub async fn run(bench: SearchBench) -> anyhow::Result<()> {
    let admin = Some(bench.postgres_url.as_str());
    let mut out = std::io::stdout().lock();

    // The writer with the index against without, interleaved.
    let (with_db, without_db) = (BenchDb::create(admin).await?, BenchDb::create(admin).await?);
    let (with, without) = (migrated(&with_db).await?, migrated(&without_db).await?);
    without
        .execute_unprepared("DROP INDEX idx_traces_search; ALTER TABLE traces DROP COLUMN search")
        .await?;
    let (with_tenant, without_tenant) = (Tenant::create(&with).await?, Tenant::create(&without).await?);
    let mut words = Words(0x9e37_79b9_7f4a_7c15);
    writeln!(
        out,
        "| round | writer traces/s, with the search index | without | with / without |"
    )?;
    writeln!(out, "|---|---|---|---|")?;
    let (mut with_rates, mut without_rates) = (Vec::new(), Vec::new());
    for round in 1..=bench.rounds {
        let a = write(&with, &with_tenant, bench.writes, &mut words).await?;
        let b = write(&without, &without_tenant, bench.writes, &mut words).await?;
        let (ra, rb) = (
            bench.writes as f64 / a.as_secs_f64(),
            bench.writes as f64 / b.as_secs_f64(),
        );
        writeln!(out, "| {round} | {ra:.0} | {rb:.0} | {:.0}% |", 100.0 * ra / rb)?;
        eprintln!("writer round {round}: with {ra:.0}/s, without {rb:.0}/s");
        with_rates.push(ra);
        without_rates.push(rb);
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    writeln!(
        out,
        "| **mean** | {:.0} | {:.0} | {:.0}% |\n",
        mean(&with_rates),
        mean(&without_rates),
        100.0 * mean(&with_rates) / mean(&without_rates)
    )?;
    with.close().await.ok();
    without.close().await.ok();
    with_db.drop_now().await;
    without_db.drop_now().await;

    // A million traces, searched.
    let db = BenchDb::create(admin).await?;
    let conn = migrated(&db).await?;
    let tenant = Tenant::create(&conn).await?;
    let started = Instant::now();
    let mut words = Words(0x2545_f491_4f6c_dd1d);
    let mut done = 0;
    while done < bench.traces {
        let n = (bench.traces - done).min(10_000);
        let rows: Vec<trace::Model> = (done..done + n)
            .map(|i| trace_of(&tenant, i, &mut words))
            .collect();
        for batch in rows.chunks(256) {
            keel::traces::repo::insert_traces(&conn, batch).await?;
        }
        done += n;
        if done.is_multiple_of(100_000) {
            eprintln!("{done} traces written ({:.0} s)", started.elapsed().as_secs_f64());
        }
    }
    conn.execute_unprepared("ANALYZE traces").await?;
    writeln!(
        out,
        "{} traces in one project, written in {:.0} s.\n",
        bench.traces,
        started.elapsed().as_secs_f64()
    )?;
    writeln!(out, "| q | matches (first page of 50) | p50 ms | p95 ms | runs |")?;
    writeln!(out, "|---|---|---|---|---|")?;
    let orgs = vec![tenant.org_id.clone()];
    for q in [
        format!("{RARE} {COMMON}"),
        RARE.to_owned(),
        COMMON.to_owned(),
        format!("\"{COMMON} w1\""),
    ] {
        let filter = keel::traces::repo::TraceFilter {
            search: Some(keel::traces::search::Query::parse(&q)),
            ..Default::default()
        };
        let mut times = Vec::with_capacity(bench.queries);
        let mut found = 0;
        for run in 0..bench.queries + 5 {
            let started = Instant::now();
            let page = keel::traces::browse::list(&conn, &orgs, &tenant.project_id, filter.clone(), None, 50)
                .await?;
            // The first few warm the cache.
            if run >= 5 {
                times.push(started.elapsed());
            }
            found = page.traces.len();
        }
        times.sort();
        writeln!(
            out,
            "| `{q}` | {found} | {:.1} | {:.1} | {} |",
            percentile(&times, 0.5),
            percentile(&times, 0.95),
            times.len()
        )?;
    }
    conn.close().await.ok();
    db.drop_now().await;
    Ok(())
}
