//! `keel-bench webhooks`: what the outbox costs the ledger, and how fast the dispatcher sends.
//!
//! 1. Serving-usage charges per second of one hot organization with one subscribed endpoint
//!    (`"*"`) against one with none, in one app, runs interleaved (none then subscribed, then
//!    subscribed then none, ...) so that drift and noise fall on both alike.
//! 2. Deliveries per second: N events committed in one transaction for an endpoint on a local
//!    receiver, until the dispatcher has recorded every one succeeded; beside it the simplest
//!    sender, a plain client POSTing the same number of bodies to the same receiver with the
//!    dispatcher's concurrency (no database, no signing).

use std::io::Write;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use sea_orm::{ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter, TransactionTrait};
use serde_json::json;

use crate::common::{bench_settings, millis, run_load, BenchDb, LoadRequest, BENCH_INTERNAL_KEY};
use keel::startup::Application;

pub struct WebhooksBench {
    pub postgres_url: Option<String>,
    pub requests: usize,
    pub concurrency: usize,
    pub rounds: usize,
    pub deliveries: usize,
    pub skip_sqlite: bool,
}

/// A receiver that answers 204 to every POST (the endpoint's other side).
async fn receiver() -> anyhow::Result<(u16, actix_web::dev::ServerHandle)> {
    use actix_web::{web, App, HttpResponse, HttpServer};
    let listener = keel::startup::listen(([127, 0, 0, 1], 0).into(), 1024)?;
    let port = listener.local_addr()?.port();
    let server = HttpServer::new(|| {
        App::new().default_service(web::to(|body: web::Bytes| async move {
            drop(body);
            HttpResponse::NoContent().finish()
        }))
    })
    .workers(1)
    .disable_signals()
    .listen(listener)?
    .run();
    let handle = server.handle();
    actix_web::rt::spawn(server);
    Ok((port, handle))
}

struct ChargeRow {
    database: &'static str,
    endpoint: &'static str,
    runs: Vec<f64>,
    p99: Vec<f64>,
}

struct DeliveryRow {
    database: &'static str,
    sender: &'static str,
    per_second: f64,
    seconds: f64,
}

pub async fn run(bench: WebhooksBench) -> anyhow::Result<()> {
    let mut databases: Vec<(&'static str, Option<&str>)> = Vec::new();
    if !(bench.skip_sqlite && bench.postgres_url.is_some()) {
        databases.push(("SQLite", None));
    }
    if let Some(url) = &bench.postgres_url {
        databases.push(("PostgreSQL", Some(url.as_str())));
    }
    let (receiver_port, receiver_handle) = receiver().await?;
    let mut charges = Vec::new();
    let mut deliveries = Vec::new();
    for (database, admin_url) in databases {
        let (c, d) = run_on(&bench, database, admin_url, receiver_port).await?;
        charges.extend(c);
        deliveries.extend(d);
    }
    receiver_handle.stop(true).await;

    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "| database | endpoint of the charged organization | charges/s (median of {} runs) | runs | p99 ms (median) |",
        bench.rounds
    )?;
    writeln!(out, "|---|---|---|---|---|")?;
    for r in &charges {
        writeln!(
            out,
            "| {} | {} | {:.0} | {} | {:.2} |",
            r.database,
            r.endpoint,
            median(&r.runs),
            r.runs
                .iter()
                .map(|v| format!("{v:.0}"))
                .collect::<Vec<_>>()
                .join(", "),
            median(&r.p99)
        )?;
    }
    writeln!(out)?;
    writeln!(
        out,
        "| database | sender | deliveries/s | seconds for {} |",
        bench.deliveries
    )?;
    writeln!(out, "|---|---|---|---|")?;
    for r in &deliveries {
        writeln!(
            out,
            "| {} | {} | {:.0} | {:.2} |",
            r.database, r.sender, r.per_second, r.seconds
        )?;
    }
    Ok(())
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
}

async fn run_on(
    bench: &WebhooksBench,
    database: &'static str,
    admin_url: Option<&str>,
    receiver_port: u16,
) -> anyhow::Result<(Vec<ChargeRow>, Vec<DeliveryRow>)> {
    let db = BenchDb::create(admin_url).await?;
    let mut settings = bench_settings(&db.url)?;
    // Endpoint secrets are sealed: a key for them.
    settings.auth.session_secret = "keel-bench-session-secret".into();
    settings.webhooks.allow_http = true;
    settings.webhooks.allow_private_destinations = true;
    settings.billing.starter_credit_cents = keel_core::domain::Cents(100_000_000);
    let app = Application::build(settings).await?;
    let port = app.port();
    let state = app.state().clone();
    let handle = app.handle();
    let server = actix_web::rt::spawn(app.run_until_stopped());
    let hook_url = format!("http://127.0.0.1:{receiver_port}/hook");

    // Two organizations alike (funded, an adapter each); one has an endpoint for every event.
    let mut adapters = Vec::new();
    let mut subscribed_org = None;
    for (i, subscribed) in [(0, false), (1, true)] {
        let org = keel_core::orgs::service::create_org(
            &state.db,
            &format!("bench {i}"),
            None,
            &keel_core::domain::UserId::parse(&format!("bench-owner-{i}"))?,
            None,
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e}"))?;
        keel_core::billing::service::grant_starter_credit(&state.billing, &org.org_id)
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let adapter = format!("bench-adapter-{i}");
        keel_core::fixtures::upsert_adapter(
            &state.db,
            &adapter,
            &org.org_id,
            "meta-llama/Llama-3.1-8B-Instruct",
            Some(true),
        )
        .await?;
        if subscribed {
            let (endpoint, _) = keel_core::webhooks::service::create_endpoint(
                &state.webhooks,
                &org.org_id,
                keel_core::webhooks::service::NewEndpoint {
                    url: hook_url.clone(),
                    events: vec!["*".into()],
                    description: None,
                },
            )
            .await
            .map_err(|e| anyhow::anyhow!("{e}"))?;
            subscribed_org = Some((org.org_id.clone(), endpoint.id));
        }
        adapters.push(adapter);
    }
    let (subscribed_org, endpoint_id) = subscribed_org.ok_or_else(|| anyhow::anyhow!("no subscribed org"))?;

    // 1. Charges, interleaved.
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let request = LoadRequest::json("/api/billing/serving-usage", BENCH_INTERNAL_KEY, &[])?;
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let mut offset = 0;
    let mut load = |adapter: String, total: usize| {
        let (request, tag, start) = (request.clone(), tag.clone(), offset);
        offset += total;
        let make = move |i: usize| {
            let body = json!({"requestId": format!("{tag}-{}", start + i), "adapterId": adapter,
                "promptTokens": 100, "completionTokens": 50});
            request.with_body(body.to_string())
        };
        run_load(addr, bench.concurrency, total, make)
    };
    for adapter in &adapters {
        load(adapter.clone(), bench.requests / 10).await;
    }
    let mut rows = vec![
        ChargeRow {
            database,
            endpoint: "none",
            runs: Vec::new(),
            p99: Vec::new(),
        },
        ChargeRow {
            database,
            endpoint: "one, subscribed to \"*\"",
            runs: Vec::new(),
            p99: Vec::new(),
        },
    ];
    for round in 0..bench.rounds {
        // A, B, then B, A: neither organization always runs second.
        let order: [usize; 2] = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let adapter = &adapters[i];
            let result = load(adapter.clone(), bench.requests).await;
            if result.failed > 0 {
                anyhow::bail!("{} charges failed", result.failed);
            }
            eprintln!(
                "{database} round {round} {}: {:.0}/s p99 {} ms",
                rows[i].endpoint,
                result.per_second(),
                millis(result.percentile(0.99))
            );
            rows[i].runs.push(result.per_second());
            rows[i].p99.push(result.percentile(0.99).as_secs_f64() * 1000.0);
        }
    }

    // 2. Deliveries: N events in one transaction, then until all are recorded succeeded.
    let n = bench.deliveries;
    let announcements: Vec<_> = (0..n)
        .map(|i| keel_core::webhooks::outbox::Announcement {
            org_id: subscribed_org.clone(),
            event_type: keel_core::domain::EventType::WebhookTest,
            data: json!({"endpointId": endpoint_id, "n": i}),
        })
        .collect();
    let before = succeeded(&state.db).await?;
    let started = Instant::now();
    let txn = state.db.begin().await?;
    keel_core::webhooks::outbox::emit(&txn, announcements).await?;
    txn.commit().await?;
    keel_core::webhooks::outbox::signal();
    let deadline = started + Duration::from_secs(600);
    while succeeded(&state.db).await? < before + n as u64 {
        if Instant::now() > deadline {
            anyhow::bail!("the dispatcher did not send {n} deliveries within 10 minutes");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let dispatcher = started.elapsed().as_secs_f64();
    // The simplest sender: the same bodies, the same concurrency, nothing else.
    let client = reqwest::Client::new();
    let body =
        json!({"id": "evt_x", "type": "webhook.test", "data": {"endpointId": endpoint_id}}).to_string();
    let answered = std::sync::atomic::AtomicUsize::new(0);
    let started = Instant::now();
    futures_util::stream::iter(0..n)
        .for_each_concurrent(16, |_| {
            let (client, body, url, answered) = (client.clone(), body.clone(), hook_url.clone(), &answered);
            async move {
                if client
                    .post(url)
                    .body(body)
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success())
                {
                    answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        })
        .await;
    let plain = started.elapsed().as_secs_f64();
    let answered = answered.into_inner();
    if answered != n {
        anyhow::bail!("the plain client had {answered} of {n} answered 2xx");
    }

    handle.stop(true).await;
    let _ = server.await;
    db.drop_now().await;
    Ok((
        rows,
        vec![
            DeliveryRow {
                database,
                sender: "keel's dispatcher (claim, sign, POST, record)",
                per_second: n as f64 / dispatcher,
                seconds: dispatcher,
            },
            DeliveryRow {
                database,
                sender: "baseline: a plain client, 16 at once",
                per_second: n as f64 / plain,
                seconds: plain,
            },
        ],
    ))
}

async fn succeeded(db: &sea_orm::DatabaseConnection) -> anyhow::Result<u64> {
    Ok(entities::webhook_delivery::Entity::find()
        .filter(entities::webhook_delivery::Column::Status.eq("succeeded"))
        .count(db)
        .await?)
}
