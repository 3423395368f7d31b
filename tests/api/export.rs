//! Datasets of any size: the export walked page by page with a cursor (while traces keep
//! arriving), its filters, and `keel traces export --all`, `--resume` and `openai-chat`.

use std::collections::HashSet;
use std::process::Command;

use chrono::{Duration as Span, Utc};
use keel_core::domain::{OrgId, ProjectId, TraceId};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::*;

/// A stored trace of `project`: a lone turn answered in text, or an error answer.
pub fn trace(
    id: String,
    org: &TestOrg,
    project: &str,
    model: &str,
    status: i32,
    at: chrono::DateTime<Utc>,
) -> entities::trace::Model {
    let response = (status == 200).then(|| {
        json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": format!("answer {id}")}}]})
            .to_string()
    });
    entities::trace::Model {
        request: json!({"model": model, "messages": [{"role": "user", "content": format!("question {id}")}]})
            .to_string(),
        id: TraceId::parse(&id).unwrap(),
        org_id: OrgId::parse(&org.org_id).unwrap(),
        project_id: ProjectId::parse(project).unwrap(),
        provider: "openai".into(),
        model: Some(model.into()),
        response,
        status_code: status,
        stream: false,
        complete: true,
        latency_ms: 1,
        ttfb_ms: Some(1),
        prompt_tokens: Some(3),
        completion_tokens: Some(2),
        total_tokens: Some(5),
        usage_estimated: false,
        error: None,
        created_at: at,
        // As the writer indexes them: keel's words.
        search_text: Some(
            keel_core::traces::search::words(&format!("question {id} answer {id}"))
                .collect::<Vec<_>>()
                .join(" "),
        ),
        preview_input: Some(format!("question {id}")),
        preview_output: None,
    }
}

/// `n` traces, three to a timestamp (ties broken by id), oldest `n` ms before `newest`;
/// every fifth a 500 of model `m-err`, the rest 200s of model `m-ok`. Answers their ids.
async fn seed(
    app: &TestApp,
    org: &TestOrg,
    project: &str,
    n: usize,
    newest: chrono::DateTime<Utc>,
) -> Vec<String> {
    use chrono::SubsecRound;
    // Whole milliseconds: the same instant on both databases (PostgreSQL keeps microseconds).
    let newest = newest.trunc_subsecs(3);
    let db = sea_orm::Database::connect(app.db_url.as_str()).await.unwrap();
    let mut ids = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(500) {
        let rows: Vec<_> = chunk
            .iter()
            .map(|i| {
                let id = uuid::Uuid::new_v4().to_string();
                ids.push(id.clone());
                let at = newest - Span::milliseconds((i / 3) as i64);
                let (model, status) = if i % 5 == 0 { ("m-err", 500) } else { ("m-ok", 200) };
                trace(id, org, project, model, status, at)
            })
            .collect();
        keel_core::fixtures::insert_traces(&db, &rows).await.unwrap();
    }
    db.close().await.ok();
    ids
}

async fn page(app: &TestApp, org: &TestOrg, query: &str) -> Value {
    json_of(
        app.get(&format!("/api/traces/export?{query}"), &org.api_key)
            .await,
        StatusCode::OK,
    )
    .await
}

#[actix_web::test]
async fn a_cursor_walks_every_trace_once_while_new_ones_arrive() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    let newest = Utc::now() - Span::seconds(60);
    let seeded: HashSet<String> = seed(&app, &org, &project, 2_500, newest)
        .await
        .into_iter()
        .collect();

    let mut seen = Vec::new();
    let mut skipped = 0;
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut query = format!("project_id={project}&format=raw&limit=300");
        if let Some(cursor) = &cursor {
            query.push_str(&format!("&cursor={cursor}"));
        }
        let body = page(&app, &org, &query).await;
        pages += 1;
        skipped += body["skipped"].as_u64().unwrap();
        let records = body["records"].as_array().unwrap();
        assert_eq!(body["count"], records.len());
        seen.extend(records.iter().map(|r| r["id"].as_str().unwrap().to_owned()));
        // Traces keep arriving while the walk goes on.
        seed(&app, &org, &project, 7, Utc::now()).await;
        match body["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    assert_eq!(pages, 9, "2,500 traces in pages of 300");
    assert_eq!(skipped, 0, "raw skips nothing");
    let distinct: HashSet<String> = seen.iter().cloned().collect();
    assert_eq!(distinct.len(), seen.len(), "no trace twice");
    assert_eq!(
        distinct, seeded,
        "every trace of the walk's start, and only those"
    );

    // records skip the 500s page by page, and count them.
    let first = page(&app, &org, &format!("project_id={project}&limit=10")).await;
    assert_eq!(
        first["count"].as_u64().unwrap() + first["skipped"].as_u64().unwrap(),
        10
    );
    assert!(first["nextCursor"].is_string());
}

#[actix_web::test]
async fn filters_narrow_the_walk_and_bad_ones_are_422() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    let newest = chrono::SubsecRound::trunc_subsecs(Utc::now() - Span::seconds(60), 3);
    seed(&app, &org, &project, 100, newest).await;
    let count = |query: String| {
        let app = &app;
        let org = &org;
        let project = &project;
        async move {
            let body = page(app, org, &format!("project_id={project}&format=raw&{query}")).await;
            body["records"].as_array().unwrap().len()
        }
    };
    assert_eq!(count("status=error".into()).await, 20);
    assert_eq!(count("status=ok".into()).await, 80);
    assert_eq!(count("model=m-err".into()).await, 20);
    assert_eq!(count("model=nope".into()).await, 0);
    // The newest 30 traces are 10 timestamps (three to each), the newest one ms apart.
    let since = (newest - Span::milliseconds(9)).to_rfc3339_opts(chrono::SecondsFormat::Nanos, true);
    assert_eq!(count(format!("since={}", urlencode(&since))).await, 30);
    assert_eq!(count(format!("until={}", urlencode(&since))).await, 70);

    let issues = |query: String| {
        let app = &app;
        let org = &org;
        let project = &project;
        async move {
            validation_issues(
                app.get(
                    &format!("/api/traces/export?project_id={project}&{query}"),
                    &org.api_key,
                )
                .await,
            )
            .await
        }
    };
    let bad = issues("cursor=not-a-cursor".into()).await;
    assert_eq!(bad[0]["loc"], json!(["query", "cursor"]));
    // A well-formed hex string that is not a cursor of ours.
    let bad = issues("cursor=1795000000-123-0192f0c47e1a7c3b8d2e1f2a3b4c5d6e".into()).await;
    assert_eq!(bad[0]["loc"], json!(["query", "cursor"]));
    let bad = issues("since=yesterday".into()).await;
    assert_eq!(bad[0]["loc"], json!(["query", "since"]));
    let bad = issues("status=fine".into()).await;
    assert_eq!(bad[0]["loc"], json!(["query", "status"]));

    // The selection form takes the same filters.
    let all: Vec<String> = page(&app, &org, &format!("project_id={project}&format=raw&limit=10")).await
        ["records"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].as_str().unwrap().to_owned())
        .collect();
    let selected = json_of(
        app.post(
            "/api/traces/export",
            &org.api_key,
            &json!({"traceIds": all, "format": "raw", "status": "error"}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert!(selected["records"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["statusCode"] == 500));
    assert!(!selected["records"].as_array().unwrap().is_empty());
    assert_eq!(selected["nextCursor"], Value::Null);
}

fn urlencode(value: &str) -> String {
    url::form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

/// Runs the `keel` binary on a blocking thread (this test's runtime drives the app).
pub(crate) async fn keel(args: Vec<String>, envs: Vec<(&'static str, String)>) -> std::process::Output {
    actix_web::rt::task::spawn_blocking(move || {
        let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
        command.args(args).env(
            "KEEL_CONFIG_DIR",
            env!("CARGO_MANIFEST_DIR").to_owned() + "/config",
        );
        for (k, v) in envs {
            command.env(k, v);
        }
        command.output().unwrap()
    })
    .await
    .unwrap()
}

pub(crate) fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

/// A keel in front of keel that fails every export page after the first `pages`.
fn failing_after(target: String, pages: usize) -> String {
    use actix_web::{web, HttpRequest, HttpResponse};
    let served = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    crate::fakes::serve(move |cfg: &mut web::ServiceConfig| {
        let (target, served) = (target.clone(), served.clone());
        cfg.default_service(web::to(move |req: HttpRequest| {
            let (target, served) = (target.clone(), served.clone());
            async move {
                if served.fetch_add(1, std::sync::atomic::Ordering::SeqCst) >= pages {
                    return HttpResponse::ServiceUnavailable().json(json!({"detail": "maintenance"}));
                }
                let url = format!("{target}{}?{}", req.path(), req.query_string());
                let auth = req
                    .headers()
                    .get("authorization")
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .to_owned();
                let body = reqwest::Client::new()
                    .get(url)
                    .header("authorization", auth)
                    .send()
                    .await
                    .unwrap()
                    .bytes()
                    .await
                    .unwrap();
                HttpResponse::Ok().content_type("application/json").body(body)
            }
        }));
    })
}

#[actix_web::test]
async fn the_cli_exports_everything_and_resumes_an_interrupted_export() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    seed(&app, &org, &project, 1_000, Utc::now() - Span::seconds(60)).await;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("train.jsonl");
    std::fs::write(&out, "the previous dataset\n").unwrap();
    let export = |extra: &[&str]| {
        let mut list = args(&[
            "traces",
            "export",
            "--project",
            &project,
            "--all",
            "--limit",
            "150",
            "--format",
            "raw",
        ]);
        list.extend(args(&["--out", out.to_str().unwrap()]));
        list.extend(args(extra));
        list
    };

    // The server goes away after three pages: the export fails, saying why, and the
    // existing file is as it was.
    let flaky = failing_after(app.address.clone(), 3);
    let failed = keel(
        export(&[]),
        vec![("KEEL_URL", flaky), ("KEEL_API_KEY", org.api_key.clone())],
    )
    .await;
    assert!(!failed.status.success());
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert!(
        stderr.contains("503") && stderr.contains("maintenance"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "the previous dataset\n");

    // --resume goes on from the last page written.
    let resumed = keel(
        export(&["--resume"]),
        vec![
            ("KEEL_URL", app.address.clone()),
            ("KEEL_API_KEY", org.api_key.clone()),
        ],
    )
    .await;
    assert!(
        resumed.status.success(),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    let text = std::fs::read_to_string(&out).unwrap();
    let ids: Vec<String> = text
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(ids.len(), 1_000);
    assert_eq!(ids.iter().collect::<HashSet<_>>().len(), 1_000, "no line twice");
    assert!(!dir.path().join("train.jsonl.part").exists());
    assert!(!dir.path().join("train.jsonl.cursor").exists());
    assert!(String::from_utf8_lossy(&resumed.stderr).contains("exported 1000 records (format raw)"));

    // A bad key fails at once, and leaves the file.
    let refused = keel(
        export(&[]),
        vec![
            ("KEEL_URL", app.address.clone()),
            ("KEEL_API_KEY", "keel_sk_nope".into()),
        ],
    )
    .await;
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("401"));
    assert_eq!(std::fs::read_to_string(&out).unwrap(), text);

    // Filters pass through: only the errors, walked whole.
    let errors = dir.path().join("errors.jsonl");
    let filtered = keel(
        args(&[
            "traces",
            "export",
            "--project",
            &project,
            "--all",
            "--limit",
            "50",
            "--format",
            "raw",
            "--model",
            "m-err",
            "--out",
            errors.to_str().unwrap(),
        ]),
        vec![
            ("KEEL_URL", app.address.clone()),
            ("KEEL_API_KEY", org.api_key.clone()),
        ],
    )
    .await;
    assert!(filtered.status.success());
    assert_eq!(std::fs::read_to_string(&errors).unwrap().lines().count(), 200);
}

#[actix_web::test]
async fn openai_chat_lines_keep_the_conversation_and_tool_calls() {
    let (app, _provider) = crate::proxy::proxy_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    crate::traces::record_five(&app, &org, &project).await;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("train.jsonl");
    let output = keel(
        args(&[
            "traces",
            "export",
            "--project",
            &project,
            "--all",
            "--format",
            "openai-chat",
            "--out",
            out.to_str().unwrap(),
        ]),
        vec![
            ("KEEL_URL", app.address.clone()),
            ("KEEL_API_KEY", org.api_key.clone()),
        ],
    )
    .await;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("1 skipped"),
        "the 401 has no pair"
    );
    let lines: Vec<Value> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    check_openai_chat_lines(&lines);
}

/// What `traces::record_five`'s calls give as `openai-chat` lines (any order): OpenAI's chat
/// fine-tuning format, one line for each call with an answer (the 401 has none), the
/// conversation kept whole, the tool call kept with its tools.
pub(crate) fn check_openai_chat_lines(lines: &[Value]) {
    assert_eq!(lines.len(), 4);
    for line in lines {
        let messages = line["messages"].as_array().unwrap();
        assert_eq!(messages.last().unwrap()["role"], "assistant");
        if !messages.last().unwrap()["tool_calls"].is_array() {
            assert_eq!(line.as_object().unwrap().len(), 1, "only messages: {line}");
        }
    }
    let lone = lines
        .iter()
        .find(|l| l["messages"][0]["content"] == "Capital of France?")
        .expect("the lone turn");
    assert_eq!(lone["messages"].as_array().unwrap().len(), 2);
    assert_eq!(lone["messages"][1]["content"], "Paris is the capital of France.");
    let conversation = lines
        .iter()
        .find(|l| l["messages"][0]["role"] == "system")
        .expect("the conversation");
    assert_eq!(conversation["messages"].as_array().unwrap().len(), 5);
    assert_eq!(conversation["messages"][0]["content"], "Be brief.");
    let tool = lines
        .iter()
        .find(|l| l["messages"][1]["tool_calls"].is_array())
        .expect("the tool call");
    assert_eq!(tool["messages"][0]["content"], "Weather in Paris?");
    // The functions' schemas stay with the example, as OpenAI's fine-tuning format takes them.
    assert_eq!(tool["tools"], crate::traces::weather_tool());
    assert_eq!(tool["parallel_tool_calls"], false);
}

#[actix_web::test]
async fn a_page_ends_at_its_byte_bound_and_the_walk_still_gives_every_trace_once() {
    // Records of about 1.2 KB each (raw): a bound of 5,000 bytes ends a page after 4 or 5.
    let app = spawn_app_with(|s| s.traces.export_max_page_bytes = 5_000).await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    let db = sea_orm::Database::connect(app.db_url.as_str()).await.unwrap();
    let newest = Utc::now() - Span::seconds(60);
    let rows: Vec<_> = (0..23)
        .map(|i| {
            let mut t = trace(
                uuid::Uuid::new_v4().to_string(),
                &org,
                &project,
                "m",
                200,
                newest - Span::seconds(i),
            );
            t.request = json!({"model": "m", "messages": [{"role": "user", "content": "x".repeat(1_000)}]})
                .to_string();
            t
        })
        .collect();
    keel_core::fixtures::insert_traces(&db, &rows).await.unwrap();
    let seeded: HashSet<String> = rows.iter().map(|t| t.id.to_string()).collect();

    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let mut query = format!("project_id={project}&format=raw&limit=1000");
        if let Some(cursor) = &cursor {
            query.push_str(&format!("&cursor={cursor}"));
        }
        let response = app
            .get(&format!("/api/traces/export?{query}"), &org.api_key)
            .await;
        assert_eq!(response.status(), StatusCode::OK);
        let bytes = response.bytes().await.unwrap();
        let body: Value = serde_json::from_slice(&bytes).unwrap();
        let records = body["records"].as_array().unwrap();
        assert_eq!(body["count"], records.len());
        assert!(!records.is_empty());
        // A page passes its bound by at most its last record.
        assert!(bytes.len() < 5_000 + 1_600, "{} bytes", bytes.len());
        pages += 1;
        seen.extend(records.iter().map(|r| r["id"].as_str().unwrap().to_owned()));
        match body["nextCursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => break,
        }
    }
    assert!(
        pages >= 5,
        "{pages} pages for 23 records of 1.2 KB under 5,000 bytes"
    );
    let distinct: HashSet<String> = seen.iter().cloned().collect();
    assert_eq!(distinct.len(), seen.len(), "no trace twice");
    assert_eq!(distinct, seeded);

    // A selection past the bound has no cursor to go on with: 422, select fewer.
    let ids: Vec<&String> = seeded.iter().collect();
    let refused = app
        .post(
            "/api/traces/export",
            &org.api_key,
            &json!({"traceIds": ids, "format": "raw"}),
        )
        .await;
    let issues = validation_issues(refused).await;
    assert_eq!(issues[0]["loc"], json!(["body", "traceIds"]), "{issues:?}");
    let fewer = app
        .post(
            "/api/traces/export",
            &org.api_key,
            &json!({"traceIds": &ids[..3], "format": "raw"}),
        )
        .await;
    let body = json_of(fewer, StatusCode::OK).await;
    assert_eq!(body["count"], 3);
    assert_eq!(body["notFound"], 0);
    assert_eq!(body["projectId"], json!(project));
}

#[actix_web::test]
async fn an_interrupted_export_says_how_to_resume() {
    // A server that hands out the first page and then never answers.
    let (app_fake, url) = crate::fakes::FakeJson::start(|call| {
        if call.query.contains("cursor=") {
            crate::fakes::Reply::Hang
        } else {
            crate::fakes::Reply::Json(
                200,
                json!({"projectId": "p", "format": "raw", "count": 1, "skipped": 0,
                       "nextCursor": "1795000000-123456789-0192f0c47e1a7c3b8d2e1f2a3b4c5d6e",
                       "records": [{"id": "t1"}]}),
            )
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("train.jsonl");
    let child = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args([
            "traces",
            "export",
            "--project",
            "p",
            "--all",
            "--format",
            "raw",
            "--out",
        ])
        .arg(&out)
        .env("KEEL_URL", &url)
        .env("KEEL_API_KEY", "keel_sk_test")
        .env(
            "KEEL_CONFIG_DIR",
            env!("CARGO_MANIFEST_DIR").to_owned() + "/config",
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    for _ in 0..100 {
        if app_fake.calls().len() >= 2 {
            break;
        }
        actix_web::rt::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert!(app_fake.calls().len() >= 2, "the export waits on its second page");
    assert!(Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .unwrap()
        .success());
    let output = actix_web::rt::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("interrupted") && stderr.contains("--resume"),
        "{stderr}"
    );
    // What it said is there: the first page and its checkpoint.
    assert_eq!(
        std::fs::read_to_string(dir.path().join("train.jsonl.part")).unwrap(),
        "{\"id\":\"t1\"}\n"
    );
    assert!(dir.path().join("train.jsonl.cursor").exists());
    assert!(!out.exists());
}
