//! `keel bench ledger`: serving-usage charges per second and latency over HTTP, for one
//! hot organization and for many, with group commit and with the naive baseline (one
//! transaction per charge), then a check that every acknowledged charge is committed.

use std::io::Write;
use std::net::SocketAddr;

use entities::serving_usage;
use sea_orm::{EntityTrait, PaginatorTrait};
use serde_json::json;

use crate::common::{
    bench_settings, default_workers, http_ceiling, millis, run_load, BenchDb, LoadRequest, BENCH_INTERNAL_KEY,
};
use keel::startup::Application;
use keel_core::fixtures::upsert_adapter;
use keel_core::orgs::service::create_org;

pub struct LedgerBench {
    pub postgres_url: Option<String>,
    pub requests: usize,
    pub concurrency: usize,
    pub spread_orgs: usize,
    /// Measure group commit only (the baseline is slow on PostgreSQL).
    pub skip_baseline: bool,
    /// With a PostgreSQL URL: measure PostgreSQL only.
    pub skip_sqlite: bool,
    /// Active credit grants each organization holds before the run (0: none made).
    pub grants: usize,
    /// Only the one-organization scenario.
    pub hot_only: bool,
}

struct Row {
    database: &'static str,
    scenario: String,
    mode: &'static str,
    per_second: f64,
    p50: String,
    p99: String,
    ok: usize,
    failed: usize,
    committed: u64,
}

pub async fn run(bench: LedgerBench) -> anyhow::Result<()> {
    let mut databases: Vec<(&'static str, Option<&str>)> = Vec::new();
    if !(bench.skip_sqlite && bench.postgres_url.is_some()) {
        databases.push(("SQLite", None));
    }
    if let Some(url) = &bench.postgres_url {
        databases.push(("PostgreSQL", Some(url.as_str())));
    }
    let mut rows = Vec::new();
    for (database, admin_url) in databases {
        let scenarios: &[usize] = match bench.hot_only {
            true => &[1],
            false => &[1, bench.spread_orgs],
        };
        for &orgs in scenarios {
            for (mode, max_batch) in [("group commit (actor)", 512), ("baseline: 1 txn per charge", 1)] {
                if bench.skip_baseline && max_batch == 1 {
                    continue;
                }
                let row = run_one(&bench, database, admin_url, orgs, mode, max_batch).await?;
                eprintln!(
                    "{database} {} {mode}: {:.0}/s p50 {} ms p99 {} ms",
                    row.scenario, row.per_second, row.p50, row.p99
                );
                rows.push(row);
            }
        }
    }
    // The same requests to a handler that does nothing: this machine's HTTP ceiling.
    let body = json!({"requestId": "r", "adapterId": "a", "promptTokens": 100, "completionTokens": 50});
    let _ = http_ceiling(
        default_workers(),
        bench.concurrency,
        bench.requests / 10,
        body.clone(),
    )
    .await?;
    let ceiling = http_ceiling(default_workers(), bench.concurrency, bench.requests, body).await?;
    eprintln!("HTTP ceiling: {:.0}/s", ceiling.per_second());
    rows.push(Row {
        database: "none",
        scenario: "-".into(),
        mode: "HTTP ceiling: a do-nothing actix handler",
        per_second: ceiling.per_second(),
        p50: millis(ceiling.percentile(0.50)),
        p99: millis(ceiling.percentile(0.99)),
        ok: ceiling.ok,
        failed: ceiling.failed,
        committed: 0,
    });
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "| database | organizations | mode | charges/s | p50 ms | p99 ms | acknowledged | failed | committed |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|---|---|---|")?;
    for r in &rows {
        writeln!(
            out,
            "| {} | {} | {} | {:.0} | {} | {} | {} | {} | {} |",
            r.database, r.scenario, r.mode, r.per_second, r.p50, r.p99, r.ok, r.failed, r.committed
        )?;
    }
    Ok(())
}

async fn run_one(
    bench: &LedgerBench,
    database: &'static str,
    admin_url: Option<&str>,
    orgs: usize,
    mode: &'static str,
    max_batch: usize,
) -> anyhow::Result<Row> {
    let db = BenchDb::create(admin_url).await?;
    let mut settings = bench_settings(&db.url)?;
    settings.billing.max_batch = max_batch;
    let app = Application::build(settings).await?;
    let port = app.port();
    let state = app.state().clone();
    let handle = app.handle();
    let server = actix_web::rt::spawn(app.run_until_stopped());

    let mut adapters = Vec::with_capacity(orgs);
    for i in 0..orgs {
        let org = create_org(
            &state.db,
            &format!("bench {i}"),
            None,
            &keel_core::domain::UserId::parse(&format!("bench-owner-{i}"))?,
            None,
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
        // Grants of 1,000.00 each, expiring on different days (the draw order has work to do).
        for g in 0..bench.grants {
            keel_core::billing::service::manual_grant(
                &state.billing,
                &org.org_id,
                keel_core::billing::service::ManualGrant {
                    amount: keel_core::domain::Cents(100_000),
                    reason: "bench".into(),
                    expires_at: Some(chrono::Utc::now() + chrono::Duration::days(30 + g as i64)),
                    priority: None,
                    key: format!("bench-{g}"),
                    created_by: "bench".into(),
                },
            )
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        }
        let adapter = format!("bench-adapter-{i}");
        upsert_adapter(
            &state.db,
            &adapter,
            &org.org_id,
            "meta-llama/Llama-3.1-8B-Instruct",
            Some(true),
        )
        .await?;
        adapters.push(adapter);
    }
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let request = LoadRequest::json("/api/billing/serving-usage", BENCH_INTERNAL_KEY, &[])?;
    let run_tag = uuid::Uuid::new_v4().simple().to_string();
    let make = move |offset: usize| {
        let request = request.clone();
        let adapters = adapters.clone();
        let run_tag = run_tag.clone();
        move |i: usize| {
            let i = i + offset;
            let body = json!({
                "requestId": format!("{run_tag}-{i}"),
                "adapterId": adapters[i % adapters.len()],
                "promptTokens": 100,
                "completionTokens": 50,
            });
            request.with_body(body.to_string())
        }
    };
    // Warm-up: connections, actors, caches.
    let warmup = bench.requests / 10;
    run_load(addr, bench.concurrency, warmup, make(0)).await;
    let result = run_load(addr, bench.concurrency, bench.requests, make(warmup)).await;

    // Every acknowledged charge must be committed.
    let committed = serving_usage::Entity::find().count(&state.db).await?;
    let acknowledged = (warmup + result.ok) as u64;
    if committed < acknowledged {
        anyhow::bail!("{committed} usage rows committed for {acknowledged} acknowledged charges");
    }
    handle.stop(true).await;
    let _ = server.await;
    db.drop_now().await;
    Ok(Row {
        database,
        scenario: orgs.to_string(),
        mode,
        per_second: result.per_second(),
        p50: millis(result.percentile(0.50)),
        p99: millis(result.percentile(0.99)),
        ok: result.ok,
        failed: result.failed,
        committed: committed - warmup as u64,
    })
}
