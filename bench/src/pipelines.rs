//! `keel-bench pipelines`: what settling a pipeline costs the report path. The same number of
//! claimed jobs is reported `succeeded` twice in one run: jobs nobody waits for (each report
//! one statement on PostgreSQL), and jobs with one waiting dependent each (the report's
//! transaction locks the dependent, reads its dependencies and queues it). Reports/s and
//! latency of each, rounds interleaved.

use std::io::Write;
use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{json, Value};

use crate::common::{millis, run_load, LoadRequest, BENCH_INTERNAL_KEY};
use crate::queue::{QueueApp, QueueBench};

pub struct PipelinesBench {
    pub postgres_url: Option<String>,
    /// Jobs reported per round (each with a dependent in the pipeline rounds).
    pub jobs: usize,
    /// Reports in flight.
    pub concurrency: usize,
    pub rounds: usize,
    pub skip_sqlite: bool,
}

struct Row {
    database: &'static str,
    mode: &'static str,
    round: usize,
    per_second: f64,
    p50: Duration,
    p99: Duration,
    queued_after: u64,
}

const PAIRS_PER_BATCH: usize = 500;
const WORKER: &str = "bench-pipeline-worker";

pub async fn run(bench: PipelinesBench) -> anyhow::Result<()> {
    let mut databases: Vec<(&'static str, Option<&str>)> = Vec::new();
    if !(bench.skip_sqlite && bench.postgres_url.is_some()) {
        databases.push(("SQLite", None));
    }
    if let Some(url) = &bench.postgres_url {
        databases.push(("PostgreSQL", Some(url.as_str())));
    }
    let mut rows = Vec::new();
    for (database, admin_url) in databases {
        for round in 1..=bench.rounds {
            for (mode, dependents) in [
                ("no dependents (baseline)", false),
                ("one waiting dependent each", true),
            ] {
                let row = run_one(&bench, database, admin_url, mode, dependents, round).await?;
                eprintln!(
                    "{database} {mode} round {round}: {:.0} reports/s, p50 {} ms, p99 {} ms",
                    row.per_second,
                    millis(row.p50),
                    millis(row.p99)
                );
                rows.push(row);
            }
        }
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "| database | jobs reported | round | reports/s | p50 ms | p99 ms | dependents queued |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|---|")?;
    for r in rows {
        writeln!(
            out,
            "| {} | {} | {} | {:.0} | {} | {} | {} |",
            r.database,
            r.mode,
            r.round,
            r.per_second,
            millis(r.p50),
            millis(r.p99),
            r.queued_after
        )?;
    }
    Ok(())
}

async fn run_one(
    bench: &PipelinesBench,
    database: &'static str,
    admin_url: Option<&str>,
    mode: &'static str,
    dependents: bool,
    round: usize,
) -> anyhow::Result<Row> {
    let queue = QueueBench {
        postgres_url: None,
        jobs: bench.jobs * 2,
        workers: 1,
        concurrency: bench.concurrency,
        skip_baseline: true,
        skip_sqlite: false,
        python: None,
        python_workers: 0,
    };
    let app = QueueApp::start(&queue, admin_url, 512).await?;
    let (addr, tenant) = (app.addr, &app.tenant);
    // Each tracer job, with a draft job waiting for it (or without).
    let batches = bench.jobs.div_ceil(PAIRS_PER_BATCH);
    for b in 0..batches {
        let mut items = Vec::new();
        for i in 0..PAIRS_PER_BATCH.min(bench.jobs - b * PAIRS_PER_BATCH) {
            items.push(json!({"ref": format!("t{i}"), "action": "tracer", "projectId": tenant.project_id}));
            if dependents {
                items.push(json!({"action": "draft", "projectId": tenant.project_id,
                                  "dependsOn": [format!("ref:t{i}")]}));
            }
        }
        let request = LoadRequest::json("/api/training/jobs/batch", &tenant.key, &[])?
            .with_body(json!({"jobs": items}).to_string());
        let sent = run_load(addr, 1, 1, move |_| request.clone()).await;
        if sent.ok != 1 {
            anyhow::bail!("a batch was refused");
        }
    }
    let ids = claim_all(addr, bench.jobs).await?;
    let report = LoadRequest::json("/api/training/internal/jobs/succeeded", BENCH_INTERNAL_KEY, &[])?;
    let ids = std::sync::Arc::new(ids);
    let bodies = ids.clone();
    let result = run_load(addr, bench.concurrency, ids.len(), move |i| {
        report.with_body(json!({"job_id": bodies[i], "worker_id": WORKER}).to_string())
    })
    .await;
    if result.ok != ids.len() {
        anyhow::bail!("{} of {} reports applied", result.ok, ids.len());
    }
    let queued_after = app.count("queued").await?;
    let expected = if dependents { bench.jobs as u64 } else { 0 };
    if queued_after != expected || app.count("succeeded").await? != bench.jobs as u64 {
        anyhow::bail!("{queued_after} dependents queued, not {expected}");
    }
    app.stop().await;
    Ok(Row {
        database,
        mode,
        round,
        per_second: result.per_second(),
        p50: result.percentile(0.5),
        p99: result.percentile(0.99),
        queued_after,
    })
}

/// Claims every queued tracer job for the one worker (100 a claim); answers their ids.
async fn claim_all(addr: SocketAddr, total: usize) -> anyhow::Result<Vec<String>> {
    let claim = LoadRequest::json("/api/training/internal/jobs/claim", BENCH_INTERNAL_KEY, &[])?
        .with_body(json!({"worker_id": WORKER, "action": "tracer", "limit": 100}).to_string());
    let mut ids = Vec::with_capacity(total);
    let mut connection = crate::common::Connection::new(addr);
    while ids.len() < total {
        let (status, body) = connection
            .send(&claim)
            .await
            .ok_or_else(|| anyhow::anyhow!("a claim got no answer"))?;
        if !status.is_success() {
            anyhow::bail!("a claim was refused: {status}");
        }
        let claimed: Value = serde_json::from_slice(&body)?;
        let jobs = claimed["jobs"].as_array().cloned().unwrap_or_default();
        if jobs.is_empty() {
            anyhow::bail!("{} of {total} jobs claimed, then none", ids.len());
        }
        ids.extend(
            jobs.iter()
                .filter_map(|j| j["job_id"].as_str().map(str::to_owned)),
        );
    }
    Ok(ids)
}
