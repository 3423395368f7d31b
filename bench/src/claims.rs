//! `keel-bench claims`: one-job claims per second from concurrent claimers, with the
//! database one network hop away (a proxy adding a fixed delay each way, [`crate::delay`]),
//! from one keel instance and from two sharing the database. A claim that holds something
//! across round trips (a lock, an instance's turn) makes every claim behind it wait out
//! those round trips; one that holds nothing lets claims overlap them.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use serde_json::json;

use crate::common::BENCH_INTERNAL_KEY;
use crate::fleet::{keel_binary, Fleet};

pub struct ClaimsBench {
    pub postgres_url: String,
    pub keel: Option<PathBuf>,
    pub delays_ms: Vec<u64>,
    pub claimers: usize,
    /// Each instance gets `claimers` (else they are spread over the instances).
    pub per_instance: bool,
    pub seconds: u64,
    pub orgs: usize,
    pub rounds: usize,
    /// The run fee keel charges each claimed job (none: keel's default).
    pub run_fee_cents: Option<u64>,
}

struct Row {
    delay_ms: u64,
    instances: usize,
    /// Claimers in all.
    claimers: usize,
    claims_per_second: Vec<f64>,
    failures: u64,
}

pub async fn run(bench: ClaimsBench) -> anyhow::Result<()> {
    let exe = keel_binary(bench.keel.clone())?;
    // The admin URL's `host:port` (postgres://user@host:port/db), which the proxy stands for.
    let host_port = bench
        .postgres_url
        .split_once("://")
        .map(|(_, rest)| rest)
        .and_then(|rest| rest.split('/').next())
        .map(|authority| {
            authority
                .rsplit_once('@')
                .map_or(authority, |(_, hp)| hp)
                .to_owned()
        })
        .ok_or_else(|| anyhow::anyhow!("a PostgreSQL URL like postgres://user@host:port/db"))?;
    let host_port = match host_port.contains(':') {
        true => host_port,
        false => format!("{host_port}:5432"),
    };
    let upstream: std::net::SocketAddr = tokio::net::lookup_host(host_port.as_str())
        .await?
        .next()
        .ok_or_else(|| anyhow::anyhow!("no address for {host_port}"))?;
    let mut rows = Vec::new();
    for &delay_ms in &bench.delays_ms {
        let proxy = crate::delay::start(upstream, Duration::from_millis(delay_ms)).await?;
        for instances in [1, 2] {
            let mut row = Row {
                delay_ms,
                instances,
                claimers: match bench.per_instance {
                    true => bench.claimers * instances,
                    false => bench.claimers,
                },
                claims_per_second: Vec::new(),
                failures: 0,
            };
            for round in 0..bench.rounds {
                let through_proxy = |url: &str| url.replacen(&host_port, &proxy.to_string(), 1);
                let fee = bench.run_fee_cents.map(|cents| cents.to_string());
                let envs: Vec<(&str, &str)> = fee
                    .as_deref()
                    .map(|fee| vec![("KEEL__BILLING__FLAT_RUN_FEE_CENTS", fee)])
                    .unwrap_or_default();
                let fleet = Fleet::start_with(
                    &bench.postgres_url,
                    &exe,
                    instances,
                    bench.orgs,
                    through_proxy,
                    &envs,
                )
                .await?;
                // Enough for the whole window at a rate well above the goal's.
                fleet.enqueue(20_000).await?;
                let (rate, failures) =
                    claim_for(&fleet, row.claimers, Duration::from_secs(bench.seconds)).await;
                eprintln!(
                    "delay {delay_ms} ms, {instances} instance(s), round {}: {rate:.1} claims/s ({failures} failed)",
                    round + 1
                );
                row.claims_per_second.push(rate);
                row.failures += failures;
                fleet.stop().await;
            }
            rows.push(row);
        }
    }
    println!(
        "| delay each way | instances | claimers in all | one-job claims/s (each round) | median | failed calls |"
    );
    println!("|---|---|---|---|---|---|");
    for row in &rows {
        println!(
            "| {} ms | {} | {} | {} | {:.1} | {} |",
            row.delay_ms,
            row.instances,
            row.claimers,
            row.claims_per_second
                .iter()
                .map(|r| format!("{r:.1}"))
                .collect::<Vec<_>>()
                .join(" / "),
            median(&row.claims_per_second),
            row.failures
        );
    }
    for &delay_ms in &bench.delays_ms {
        let of = |n: usize| {
            rows.iter()
                .find(|r| r.delay_ms == delay_ms && r.instances == n)
                .map_or(0.0, |r| median(&r.claims_per_second))
        };
        println!(
            "\n{delay_ms} ms each way: two instances give {:.2}x one instance.",
            of(2) / of(1).max(f64::MIN_POSITIVE)
        );
    }
    Ok(())
}

pub fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// `claimers` loops of one-job claims, spread over the instances, for `window`: claims per
/// second that handed a job, and the calls that failed.
async fn claim_for(fleet: &Fleet, claimers: usize, window: Duration) -> (f64, u64) {
    let claimed = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(claimers)
        .build()
        .unwrap_or_default();
    // A warm-up second: connections opened, plans cached.
    let warm_until = Instant::now() + Duration::from_secs(1);
    let until = warm_until + window;
    let loops = (0..claimers).map(|i| {
        let (http, claimed, failed) = (http.clone(), claimed.clone(), failed.clone());
        let url = format!("{}/api/training/internal/jobs/claim", fleet.base(i));
        async move {
            let body = json!({"worker_id": format!("claimer-{i}"), "action": "tracer", "limit": 1});
            while Instant::now() < until {
                let answer = http
                    .post(&url)
                    .bearer_auth(BENCH_INTERNAL_KEY)
                    .json(&body)
                    .send()
                    .await;
                let jobs = match answer {
                    Ok(answer) if answer.status().is_success() => answer
                        .json::<serde_json::Value>()
                        .await
                        .ok()
                        .and_then(|v| v["jobs"].as_array().map(Vec::len))
                        .unwrap_or(0),
                    _ => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        0
                    }
                };
                if Instant::now() >= warm_until {
                    claimed.fetch_add(jobs as u64, Ordering::Relaxed);
                }
            }
        }
    });
    join_all(loops).await;
    (
        claimed.load(Ordering::Relaxed) as f64 / window.as_secs_f64(),
        failed.load(Ordering::Relaxed),
    )
}
