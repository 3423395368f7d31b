//! `keel-bench export`: a whole project's traces (100,000 by default) exported by
//! `keel traces export --all` (as records, and as openai-chat lines) and, frozen as a
//! dataset, by `keel datasets export`, each from a fresh `keel serve` process, both the built
//! binary: the time, the rate, and the peak RSS of the server and of the CLI, against the
//! simplest baseline measured in the same run (reading the same rows straight from the
//! database, in pages of the same size, in this process). The dataset's build (its
//! `POST /api/datasets`) is timed apart.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use chrono::Utc;
use entities::trace;
use serde_json::json;

use crate::common::{keel_exe, proc_kib, BenchDb, Process};

pub struct ExportBench {
    pub postgres_url: Option<String>,
    pub traces: usize,
    pub skip_sqlite: bool,
}

const CHUNK: usize = 500;
const PAGE: u64 = 1000;

pub async fn run(bench: ExportBench) -> anyhow::Result<()> {
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
        "{} traces in one project (request ~250 B, response ~450 B), exported as records in pages of {PAGE}.\n",
        bench.traces
    )?;
    writeln!(
        out,
        "| database | what | time s | lines/s | keel peak RSS MiB | CLI peak RSS MiB |"
    )?;
    writeln!(out, "|---|---|---|---|---|---|")?;
    for (database, admin_url) in databases {
        let result = run_one(&bench, admin_url).await?;
        writeln!(
            out,
            "| {database} | baseline: the rows read from the database in pages | {:.2} | {:.0} | | |",
            result.baseline.as_secs_f64(),
            bench.traces as f64 / result.baseline.as_secs_f64()
        )?;
        for run in &result.runs {
            writeln!(
                out,
                "| {database} | {} | {:.2} | {:.0} | {:.1} (idle {:.1}) | {:.1} |",
                run.what,
                run.time.as_secs_f64(),
                run.lines as f64 / run.time.as_secs_f64(),
                mib(run.server_peak),
                mib(run.server_idle),
                mib(run.cli_peak)
            )?;
            if run.lines != bench.traces {
                anyhow::bail!("{}: {} lines of {} traces", run.what, run.lines, bench.traces);
            }
        }
        writeln!(
            out,
            "| {database} | the dataset's build (`POST /api/datasets`, every trace) | {:.2} | {:.0} | {:.1} | |",
            result.build.as_secs_f64(),
            bench.traces as f64 / result.build.as_secs_f64(),
            mib(result.build_peak)
        )?;
    }
    Ok(())
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

struct Measured {
    baseline: Duration,
    runs: Vec<Run>,
    build: Duration,
    build_peak: u64,
}

/// One export by the command line from a fresh server.
struct Run {
    what: &'static str,
    time: Duration,
    lines: usize,
    server_idle: u64,
    server_peak: u64,
    cli_peak: u64,
}

async fn run_one(bench: &ExportBench, admin_url: Option<&str>) -> anyhow::Result<Measured> {
    let db = BenchDb::create(admin_url).await?;
    let conn = crate::common::migrated(&db).await?;
    let tenant = crate::common::Tenant::create(&conn).await?;
    let now = Utc::now();
    for chunk in (0..bench.traces).collect::<Vec<_>>().chunks(CHUNK) {
        let rows: Vec<trace::Model> = chunk
            .iter()
            .map(|&i| trace::Model {
                id: keel_core::domain::TraceId::time_ordered(),
                org_id: tenant.org_id.clone(),
                project_id: tenant.project_id.clone(),
                provider: "openai".into(),
                model: Some("gpt-4o-mini".into()),
                request: json!({"model": "gpt-4o-mini", "messages": [
                    {"role": "system", "content": "You are a support assistant for Acme. Answer briefly and politely."},
                    {"role": "user", "content": format!("Customer question number {i}: where is my order and when does it arrive?")}
                ]})
                .to_string(),
                response: Some(
                    json!({"id": format!("chatcmpl-{i}"), "object": "chat.completion", "model": "gpt-4o-mini",
                        "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant",
                            "content": "Your order left our warehouse yesterday and should arrive within two to three business days. You will get a tracking link by email."}}],
                        "usage": {"prompt_tokens": 41, "completion_tokens": 29, "total_tokens": 70}})
                    .to_string(),
                ),
                status_code: 200,
                stream: false,
                complete: true,
                latency_ms: 420,
                ttfb_ms: Some(180),
                prompt_tokens: Some(41),
                completion_tokens: Some(29),
                total_tokens: Some(70),
                usage_estimated: false,
                error: None,
                created_at: now - chrono::Duration::milliseconds((bench.traces - i) as i64),
                search_text: Some(format!(
                    "customer question number {i} where is my order and when does it arrive your order left our warehouse yesterday"
                )),
                preview_input: Some(format!("Customer question number {i}: where is my order and when does it arrive?")),
                preview_output: Some("Your order left our warehouse yesterday and should arrive within two to three business days.".into()),
            })
            .collect();
        keel_core::fixtures::insert_traces(&conn, &rows).await?;
    }

    // Baseline: the same rows straight from the database, page by page, in this process.
    let started = Instant::now();
    let mut filter = keel_core::traces::TraceFilter::default();
    let mut read = 0;
    loop {
        let page = keel_core::fixtures::export_page(&conn, &tenant.project_id, &filter, PAGE).await?;
        read += page.len();
        match page.last() {
            Some(last) if page.len() as u64 == PAGE => {
                filter.before = Some((last.created_at, last.id.clone()))
            }
            _ => break,
        }
    }
    let baseline = started.elapsed();
    anyhow::ensure!(read == bench.traces, "the baseline read {read} traces");
    conn.close().await?;

    let project = tenant.project_id.as_str();
    let mut runs = Vec::new();
    for (what, format) in [
        ("`keel traces export --all --format records`", "records"),
        ("`keel traces export --all --format openai-chat`", "openai-chat"),
    ] {
        let args = [
            "traces",
            "export",
            "--all",
            "--project",
            project,
            "--format",
            format,
        ];
        runs.push(measure(what, &db.url, &tenant.key, &args).await?);
    }

    // The dataset is built by one server; its export is measured from a fresh one.
    let (build, build_peak, dataset) = {
        let server = Process::keel_serve(&db.url, &[]).await?;
        let started = Instant::now();
        let created: serde_json::Value = reqwest::Client::new()
            .post(format!("{}/api/datasets", server.base))
            .bearer_auth(&tenant.key)
            .json(&json!({"projectId": project, "name": "bench", "filter": {}}))
            .send()
            .await?
            .error_for_status()?
            .json()
            .await?;
        let build = started.elapsed();
        let peak = proc_kib(&server.pid().to_string(), "VmHWM:").unwrap_or(0);
        let id = created["datasetId"].as_str().unwrap_or_default().to_owned();
        (build, peak, id)
    };
    let args = [
        "datasets",
        "export",
        "--dataset",
        dataset.as_str(),
        "--split",
        "all",
    ];
    runs.push(
        measure(
            "`keel datasets export` (openai-chat, the version's digest checked)",
            &db.url,
            &tenant.key,
            &args,
        )
        .await?,
    );
    db.drop_now().await;
    Ok(Measured {
        baseline,
        runs,
        build,
        build_peak,
    })
}

/// `keel <args> --out FILE` against a fresh `keel serve`: its time, lines and both peaks.
async fn measure(what: &'static str, db_url: &str, key: &str, args: &[&str]) -> anyhow::Result<Run> {
    let server = Process::keel_serve(db_url, &[]).await?;
    let base = server.base.clone();
    let server_pid = server.pid();
    let server_idle = proc_kib(&server_pid.to_string(), "VmRSS:").unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("keel-export-bench-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir)?;
    let out = dir.join("train.jsonl");
    let started = Instant::now();
    let mut cli = Command::new(keel_exe()?)
        .args(args)
        .arg("--out")
        .arg(&out)
        .env("KEEL_URL", &base)
        .env("KEEL_API_KEY", key)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let cli_pid = cli.id();
    let (mut cli_peak, mut server_peak) = (0, 0);
    let status = loop {
        if let Some(kib) = proc_kib(&cli_pid.to_string(), "VmHWM:") {
            cli_peak = cli_peak.max(kib);
        }
        if let Some(kib) = proc_kib(&server_pid.to_string(), "VmHWM:") {
            server_peak = server_peak.max(kib);
        }
        if let Some(status) = cli.try_wait()? {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let time = started.elapsed();
    anyhow::ensure!(status.success(), "{what} failed: {status}");
    let lines = std::io::BufRead::lines(std::io::BufReader::new(std::fs::File::open(&out)?)).count();
    let _ = std::fs::remove_dir_all(&dir);
    drop(server);
    Ok(Run {
        what,
        time,
        lines,
        server_idle,
        server_peak,
        cli_peak,
    })
}
