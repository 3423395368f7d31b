//! `keel bench console`: every console page's server time with a big organization (10,000
//! jobs, 100,000 ledger entries, 50,000 traces by default), one request at a time on a
//! kept-alive connection, against the simplest routes measured in the same run:
//! `GET /healthz` (no database) and `GET /api/billing` (the JSON API's overview).

use std::io::Write;
use std::time::{Duration, Instant};

use chrono::Utc;
use entities::{eval_run, ledger_entry, serving_usage, trace, training_job};
use sea_orm::{ActiveValue::Set, ConnectionTrait, EntityTrait, Statement};

use crate::common::{bench_settings, millis, BenchDb, Tenant, BENCH_INTERNAL_KEY};
use keel::startup::Application;
use keel_core::domain::{EntryKind, JobAction, JobStatus};

pub struct ConsoleBench {
    pub postgres_url: Option<String>,
    pub jobs: usize,
    pub ledger: usize,
    pub traces: usize,
    /// Requests per page.
    pub requests: usize,
    pub skip_sqlite: bool,
}

const CHUNK: usize = 500;

pub async fn run(bench: ConsoleBench) -> anyhow::Result<()> {
    let mut databases: Vec<(&'static str, Option<&str>)> = Vec::new();
    if !(bench.skip_sqlite && bench.postgres_url.is_some()) {
        databases.push(("SQLite", None));
    }
    if let Some(url) = &bench.postgres_url {
        databases.push(("PostgreSQL", Some(url.as_str())));
    }
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "Seeded: {} jobs, {} ledger entries, {} traces in one organization; {} sequential requests per page.\n",
        bench.jobs, bench.ledger, bench.traces, bench.requests
    )?;
    writeln!(out, "| database | page | p50 ms | p99 ms | max ms |")?;
    writeln!(out, "|---|---|---|---|---|")?;
    for (database, admin_url) in databases {
        for (page, p50, p99, max) in run_one(&bench, admin_url).await? {
            writeln!(
                out,
                "| {database} | {page} | {} | {} | {} |",
                millis(p50),
                millis(p99),
                millis(max)
            )?;
        }
    }
    Ok(())
}

async fn run_one(
    bench: &ConsoleBench,
    admin_url: Option<&str>,
) -> anyhow::Result<Vec<(String, Duration, Duration, Duration)>> {
    let db = BenchDb::create(admin_url).await?;
    let settings = bench_settings(&db.url)?;
    let app = Application::build(settings).await?;
    let port = app.port();
    let state = app.state().clone();
    let handle = app.handle();
    let server = actix_web::rt::spawn(app.run_until_stopped());
    let conn = &state.db;

    let tenant = Tenant::create(conn).await?;
    let org_id = tenant.org_id.clone();
    keel_core::fixtures::account(conn, &org_id).await?;
    let started = Instant::now();
    let now = Utc::now();
    let spread =
        |i: usize, n: usize| now - chrono::Duration::seconds((45 * 86_400 * (n - i) / n.max(1)) as i64);

    let kinds = [
        "serving_usage",
        "run_fee",
        "training_run",
        "topup",
        "serving_usage",
    ];
    let mut balance = 0i64;
    let mut entries = Vec::with_capacity(CHUNK);
    for i in 0..bench.ledger {
        let kind = kinds[i % kinds.len()];
        let amount = if kind == "topup" {
            5_000_000_000
        } else {
            -1_234_567
        };
        balance += amount;
        entries.push(ledger_entry::ActiveModel {
            org_id: Set(org_id.clone()),
            kind: Set(EntryKind::parse(kind).unwrap_or(EntryKind::Topup)),
            amount_microcents: Set(keel_core::domain::Microcents(amount)),
            balance_after_microcents: Set(keel_core::domain::Microcents(balance)),
            idempotency_key: Set(Some(format!("bench-{i}"))),
            reason: Set("bench".into()),
            created_at: Set(spread(i, bench.ledger)),
            ..Default::default()
        });
        if entries.len() == CHUNK {
            ledger_entry::Entity::insert_many(std::mem::take(&mut entries))
                .exec(conn)
                .await?;
        }
    }
    if !entries.is_empty() {
        ledger_entry::Entity::insert_many(entries).exec(conn).await?;
    }
    conn.execute_raw(Statement::from_sql_and_values(
        conn.get_database_backend(),
        "UPDATE billing_accounts SET balance_microcents = $1 WHERE org_id = $2",
        [balance.into(), org_id.clone().into()],
    ))
    .await?;

    let statuses = [
        "succeeded",
        "failed",
        "queued",
        "running",
        "user_stopped",
        "succeeded",
    ];
    let actions = ["tracer", "draft", "optimize", "training"];
    let mut job_id = String::new();
    for chunk in (0..bench.jobs).collect::<Vec<_>>().chunks(CHUNK) {
        let rows: Vec<training_job::ActiveModel> = chunk
            .iter()
            .map(|&i| {
                let at = spread(i, bench.jobs);
                let status = statuses[i % statuses.len()];
                let held = status == "running";
                let id = keel_core::domain::JobId::generate();
                job_id = id.to_string();
                training_job::ActiveModel {
                    id: Set(id),
                    org_id: Set(org_id.clone()),
                    project_id: Set(tenant.project_id.clone()),
                    training_task_id: Set(Some(format!("task-{}", i % 100))),
                    action: Set(JobAction::parse(actions[i % actions.len()]).unwrap_or(JobAction::Tracer)),
                    status: Set(JobStatus::parse(status).unwrap_or(JobStatus::Queued)),
                    payload: Set(r#"{"epochs":3}"#.into()),
                    worker_id: Set(held.then(|| format!("worker-{}", i % 8))),
                    attempts: Set(i32::from(held)),
                    stop_requested: Set(false),
                    live_status: Set(None),
                    result: Set(None),
                    error: Set(None),
                    created_at: Set(at),
                    updated_at: Set(at),
                    claimed_at: Set(held.then_some(at)),
                    heartbeat_at: Set(held.then_some(at)),
                    finished_at: Set(None),
                    priority: Set(keel_core::queue::DEFAULT_PRIORITY),
                    scheduled_at: Set(None),
                    queued_at: Set(Some(at)),
                    unique_key: Set(None),
                    idempotency_key: Set(None),
                    request_hash: Set(None),
                    blocked_for_funds: Set(false),
                    has_dependents: Set(false),
                    refusals: Set(0),
                    stop_reason: Set(None),
                    dataset_id: Set(None),
                    dataset: Set(None),
                    schedule_id: Set(None),
                    schedule_tick: Set(None),
                }
            })
            .collect();
        training_job::Entity::insert_many(rows).exec(conn).await?;
    }

    let request = r#"{"model":"gpt-4o-mini","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"What is the capital of France?"}]}"#;
    let response = r#"{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Paris."},"finish_reason":"stop"}],"usage":{"prompt_tokens":24,"completion_tokens":2,"total_tokens":26}}"#;
    let mut trace_id = String::new();
    for chunk in (0..bench.traces).collect::<Vec<_>>().chunks(CHUNK) {
        let rows: Vec<trace::ActiveModel> = chunk
            .iter()
            .map(|&i| {
                let id = keel_core::domain::TraceId::time_ordered();
                trace_id = id.to_string();
                trace::ActiveModel {
                    id: Set(id),
                    org_id: Set(org_id.clone()),
                    project_id: Set(tenant.project_id.clone()),
                    provider: Set("openai".into()),
                    model: Set(Some(["gpt-4o-mini", "gpt-4o", "llama"][i % 3].into())),
                    request: Set(request.into()),
                    response: Set(Some(response.into())),
                    status_code: Set(if i % 50 == 0 { 429 } else { 200 }),
                    stream: Set(i % 2 == 0),
                    complete: Set(true),
                    latency_ms: Set(400 + (i % 300) as i64),
                    ttfb_ms: Set(Some(120)),
                    prompt_tokens: Set(Some(24)),
                    completion_tokens: Set(Some(2)),
                    total_tokens: Set(Some(26)),
                    usage_estimated: Set(false),
                    error: Set(None),
                    created_at: Set(spread(i, bench.traces)),
                    search_text: Set(Some("capital of france paris".into())),
                    preview_input: Set(Some("Capital of France?".into())),
                    preview_output: Set(Some("Paris.".into())),
                }
            })
            .collect();
        trace::Entity::insert_many(rows).exec(conn).await?;
    }
    let usage: Vec<serving_usage::ActiveModel> = (0..2_000)
        .map(|i| serving_usage::ActiveModel {
            request_id: Set(format!("req-{i}")),
            org_id: Set(org_id.clone()),
            adapter_id: Set(None),
            model: Set(["llama", "qwen"][i % 2].into()),
            prompt_tokens: Set(1000),
            completion_tokens: Set(200),
            cost_microcents: Set(keel_core::domain::Microcents(1_000_000)),
            charged_microcents: Set(keel_core::domain::Microcents(1_200_000)),
            created_at: Set(spread(i, 2_000)),
        })
        .collect();
    for chunk in usage.chunks(CHUNK) {
        serving_usage::Entity::insert_many(chunk.to_vec())
            .exec(conn)
            .await?;
    }
    let runs: Vec<eval_run::ActiveModel> = (0..200)
        .map(|i| eval_run::ActiveModel {
            id: Set(uuid::Uuid::new_v4().to_string()),
            org_id: Set(org_id.clone()),
            project_id: Set(tenant.project_id.clone()),
            suite_name: Set(["smoke", "regression"][i % 2].into()),
            environment_reference: Set("acme/support/grader".into()),
            model: Set(Some("llama".into())),
            status: Set(keel_core::domain::EvalStatus::Completed),
            error: Set(None),
            started_at: Set(None),
            metadata: Set(None),
            total_cases: Set(100),
            passed_cases: Set(60 + (i % 30) as i32),
            graded_cases: Set(100),
            errored_cases: Set(0),
            mean_score: Set(Some(0.5 + (i % 40) as f64 / 100.0)),
            created_at: Set(spread(i, 200)),
        })
        .collect();
    eval_run::Entity::insert_many(runs).exec(conn).await?;
    eprintln!("seeded in {:.1} s", started.elapsed().as_secs_f64());

    let base = format!("http://127.0.0.1:{port}");
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(1)
        .build()?;
    let login = |credential: String| {
        let client = client.clone();
        let base = base.clone();
        async move {
            let response = client
                .post(format!("{base}/console/login"))
                .form(&[("credential", credential)])
                .send()
                .await?;
            response
                .headers()
                .get_all(reqwest::header::SET_COOKIE)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .find(|v| v.starts_with("keel_console="))
                .and_then(|v| v.split(';').next())
                .map(str::to_owned)
                .ok_or_else(|| anyhow::anyhow!("the console refused the bench's credential"))
        }
    };
    let member = login(tenant.key.clone()).await?;
    let operator = login(BENCH_INTERNAL_KEY.to_owned()).await?;
    let o = format!("/console/o/{org_id}");
    let p = &tenant.project_id;
    let middle = bench.ledger as i64 / 2;
    let pages: Vec<(String, String, Option<&str>)> = vec![
        ("baseline: GET /healthz".into(), "/healthz".into(), None),
        (
            "baseline: GET /api/billing (JSON)".into(),
            format!("/api/billing?orgId={org_id}"),
            Some("api"),
        ),
        ("overview".into(), o.clone(), Some("member")),
        ("ledger".into(), format!("{o}/ledger"), Some("member")),
        (
            "ledger, kind=run_fee".into(),
            format!("{o}/ledger?kind=run_fee"),
            Some("member"),
        ),
        (
            "ledger, page in the middle".into(),
            format!("{o}/ledger?before={middle}"),
            Some("member"),
        ),
        ("jobs".into(), format!("{o}/jobs"), Some("member")),
        (
            "jobs, status=failed action=draft".into(),
            format!("{o}/jobs?status=failed&action=draft"),
            Some("member"),
        ),
        (
            "jobs, project and task".into(),
            format!("{o}/jobs?project={p}&task=task-7"),
            Some("member"),
        ),
        (
            "jobs, sort=priority page 100".into(),
            format!("{o}/jobs?sort=priority&page=100"),
            Some("member"),
        ),
        ("job".into(), format!("{o}/jobs/{job_id}"), Some("member")),
        ("credits".into(), format!("{o}/credits"), Some("member")),
        ("trace projects".into(), format!("{o}/traces"), Some("member")),
        (
            "project traces".into(),
            format!("{o}/projects/{p}/traces"),
            Some("member"),
        ),
        (
            "project traces, model and status=error".into(),
            format!("{o}/projects/{p}/traces?model=gpt-4o&status=error"),
            Some("member"),
        ),
        ("trace".into(), format!("{o}/traces/{trace_id}"), Some("member")),
        (
            "trace, Newer and Older within model=gpt-4o".into(),
            format!("{o}/traces/{trace_id}?model=gpt-4o"),
            Some("member"),
        ),
        (
            "project traces, minScore=quality:0.5".into(),
            format!("{o}/projects/{p}/traces?minScore=quality:0.5"),
            Some("member"),
        ),
        ("evals".into(), format!("{o}/evals"), Some("member")),
        ("runs".into(), format!("{o}/runs"), Some("member")),
        ("keys and members".into(), format!("{o}/keys"), Some("member")),
        (
            "operator: organizations".into(),
            "/console/orgs".into(),
            Some("operator"),
        ),
        (
            "operator: queue".into(),
            "/console/operator/queue".into(),
            Some("operator"),
        ),
        (
            "operator: failed jobs".into(),
            "/console/operator/failed".into(),
            Some("operator"),
        ),
        (
            "operator: organizations, q=bench".into(),
            "/console/orgs?q=bench".into(),
            Some("operator"),
        ),
        (
            "operator: trace writer".into(),
            "/console/operator/writer".into(),
            Some("operator"),
        ),
    ];
    let mut rows = Vec::new();
    for (name, path, who) in pages {
        let url = format!("{base}{path}");
        let mut latencies = Vec::with_capacity(bench.requests);
        for i in 0..bench.requests + 5 {
            let mut request = client.get(&url);
            request = match who {
                Some("api") => request.bearer_auth(&tenant.key),
                Some("member") => request.header(reqwest::header::COOKIE, &member),
                Some(_) => request.header(reqwest::header::COOKIE, &operator),
                None => request,
            };
            let sent = Instant::now();
            let response = request.send().await?;
            let status = response.status();
            response.bytes().await?;
            let took = sent.elapsed();
            anyhow::ensure!(status.is_success(), "{name}: {status}");
            // The first few warm the statement cache and the connection.
            if i >= 5 {
                latencies.push(took);
            }
        }
        latencies.sort_unstable();
        let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q).round() as usize];
        eprintln!("{name}: p50 {} ms p99 {} ms", millis(at(0.5)), millis(at(0.99)));
        rows.push((name, at(0.5), at(0.99), at(1.0)));
    }
    handle.stop(true).await;
    let _ = server.await;
    db.drop_now().await;
    Ok(rows)
}
