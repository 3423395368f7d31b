//! Trace listing and export (API and CLI), the writer's metrics and its drain at shutdown;
//! eval uploads.

use std::process::Command;

use keel_core::domain::{OrgId, ProjectId, TraceId};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::fakes::FakeProvider;
use crate::helpers::*;
use crate::proxy::{chat, proxy_app, raw_traces, sdk_request};

/// Records five traces: a lone user turn, a conversation with a system prompt, a tool call,
/// a multimodal reply and an upstream error (no pair).
/// A tool-calling request, as the SDK sends one with `tools=[...]`.
pub fn tool_call() -> Value {
    let mut body = chat("gpt-tool", "Weather in Paris?");
    body["tools"] = weather_tool();
    body["parallel_tool_calls"] = json!(false);
    body
}

pub fn weather_tool() -> Value {
    json!([{"type": "function", "function": {"name": "get_weather", "description": "Today's weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}])
}

pub async fn record_five(app: &TestApp, org: &TestOrg, project: &str) {
    let conversation = json!({"model": "gpt-plain", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Capital of France?"},
    ]});
    for body in [
        chat("gpt-plain", "Capital of France?"),
        conversation,
        tool_call(),
        chat("gpt-multimodal", "Describe the picture"),
        chat("gpt-401", "hi"),
    ] {
        let response = sdk_request(app, org, Some(project), &body).send().await.unwrap();
        assert!(response.status() == StatusCode::OK || response.status() == StatusCode::UNAUTHORIZED);
        // One at a time, so "newest" is well defined.
        raw_traces(app, org, project, 0).await;
        actix_web::rt::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    raw_traces(app, org, project, 5).await;
}

async fn export(app: &TestApp, org: &TestOrg, query: &str) -> Value {
    json_of(
        app.get(&format!("/api/traces/export?{query}"), &org.api_key)
            .await,
        StatusCode::OK,
    )
    .await
}

#[actix_web::test]
async fn export_converts_each_shape_and_skips_traces_without_a_pair() {
    let (app, _provider) = proxy_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    record_five(&app, &org, &project).await;

    let records = export(&app, &org, &format!("project_id={project}")).await;
    assert_eq!(records["projectId"], json!(project));
    assert_eq!(records["format"], "records");
    assert_eq!(
        (records["count"].as_u64(), records["skipped"].as_u64()),
        (Some(4), Some(1))
    );
    let rows = records["records"].as_array().unwrap();
    let by_input = |input: &str| {
        rows.iter()
            .find(|r| r["input"] == input)
            .unwrap_or_else(|| panic!("{input}: {rows:?}"))
    };
    assert_eq!(
        by_input("Capital of France?")["output"],
        "Paris is the capital of France."
    );
    assert_eq!(
        by_input("system: Be brief.\nuser: Hi\nassistant: Hello!\nuser: Capital of France?")["output"],
        "Paris is the capital of France."
    );
    let tool = &by_input("Weather in Paris?")["output"]["messages"][0];
    assert_eq!(tool["role"], "assistant");
    assert!(!tool["tool_calls"].as_array().unwrap().is_empty());
    assert_eq!(
        by_input("Describe the picture")["output"],
        "The image shows a red bicycle leaning on a wall."
    );
    assert!(rows.iter().all(|r| r.as_object().unwrap().len() == 2));

    let prompts = export(&app, &org, &format!("project_id={project}&format=prompts")).await;
    assert_eq!(prompts["count"], 4);
    assert!(prompts["records"].as_array().unwrap().iter().all(|r| r
        .as_object()
        .unwrap()
        .keys()
        .eq(["input"])));
    let raw = export(&app, &org, &format!("project_id={project}&format=raw")).await;
    assert_eq!(
        (raw["count"].as_u64(), raw["skipped"].as_u64()),
        (Some(5), Some(0))
    );

    // Newest first: the two newest are the error and the multimodal reply.
    let newest = export(&app, &org, &format!("project_id={project}&limit=2")).await;
    assert_eq!(
        (newest["count"].as_u64(), newest["skipped"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(newest["records"][0]["input"], "Describe the picture");

    let other = app.create_org("Globex").await;
    let response = app
        .get(
            &format!("/api/traces/export?project_id={project}"),
            &other.api_key,
        )
        .await;
    assert_error(response, StatusCode::NOT_FOUND).await;
    for (query, field) in [
        (format!("project_id={project}&limit=0"), "limit"),
        (format!("project_id={project}&limit=1001"), "limit"),
        (format!("project_id={project}&format=csv"), "format"),
        ("limit=5".to_owned(), "project_id"),
    ] {
        let issues = validation_issues(
            app.get(&format!("/api/traces/export?{query}"), &org.api_key)
                .await,
        )
        .await;
        assert_eq!(issues[0]["loc"], json!(["query", field]), "{query}");
    }
}

#[actix_web::test]
async fn a_selection_exports_exactly_the_selected_traces() {
    let (app, _provider) = proxy_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    record_five(&app, &org, &project).await;
    let raw = raw_traces(&app, &org, &project, 5).await;
    let id_of = |model: &str| {
        raw.iter().find(|t| t["model"] == model).unwrap()["id"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let unknown = uuid::Uuid::new_v4().to_string();
    let selection =
        json!({"traceIds": [id_of("gpt-tool"), id_of("gpt-401"), unknown, id_of("gpt-multimodal")]});
    let body = json_of(
        app.post("/api/traces/export", &org.api_key, &selection).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        (
            body["count"].as_u64(),
            body["skipped"].as_u64(),
            body["notFound"].as_u64()
        ),
        (Some(2), Some(1), Some(1))
    );
    assert_eq!(body["projectId"], json!(project));
    assert_eq!(body["records"][0]["input"], "Weather in Paris?");
    assert_eq!(body["records"][1]["input"], "Describe the picture");
    let mut raw_selection = selection.clone();
    raw_selection["format"] = json!("raw");
    let body = json_of(
        app.post("/api/traces/export", &org.api_key, &raw_selection).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(body["count"], 3);

    let other = app.create_org("Globex").await;
    let theirs = json_of(
        app.post("/api/traces/export", &other.api_key, &selection).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        (theirs["count"].as_u64(), theirs["notFound"].as_u64()),
        (Some(0), Some(4))
    );
    for (body, loc) in [
        (json!({"traceIds": []}), json!(["body", "traceIds"])),
        (json!({"traceIds": ["nope"]}), json!(["body", "traceIds", 0])),
        (
            json!({"traceIds": [unknown], "format": "csv"}),
            json!(["body", "format"]),
        ),
    ] {
        let issues = validation_issues(app.post("/api/traces/export", &org.api_key, &body).await).await;
        assert_eq!(issues[0]["loc"], loc, "{body}");
    }
}

#[actix_web::test]
async fn trace_projects_count_each_projects_traces() {
    let (app, _provider) = proxy_app().await;
    let org = app.create_org("Acme").await;
    let (support, sales) = (
        app.create_project(&org, "Support").await,
        app.create_project(&org, "Sales").await,
    );
    app.create_project(&org, "Empty").await;
    for _ in 0..2 {
        sdk_request(&app, &org, Some(&support), &chat("gpt-plain", "hi"))
            .send()
            .await
            .unwrap();
    }
    sdk_request(&app, &org, Some(&sales), &chat("gpt-plain", "hi"))
        .send()
        .await
        .unwrap();
    raw_traces(&app, &org, &support, 2).await;
    raw_traces(&app, &org, &sales, 1).await;
    for token in [&org.api_key, &org.member_token] {
        let body = json_of(app.get("/api/traces/projects", token).await, StatusCode::OK).await;
        let projects = body["projects"].as_array().unwrap();
        assert_eq!(projects.len(), 2);
        assert_eq!(projects[0]["projectId"], json!(sales), "most recent first");
        assert_eq!(
            (projects[0]["name"].as_str(), projects[0]["traceCount"].as_i64()),
            (Some("Sales"), Some(1))
        );
        assert_eq!(
            (projects[1]["name"].as_str(), projects[1]["traceCount"].as_i64()),
            (Some("Support"), Some(2))
        );
        assert!(projects[1]["lastTraceAt"].is_string());
    }
    let other = app.create_org("Globex").await;
    let body = json_of(
        app.get("/api/traces/projects", &other.api_key).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(body["projects"], json!([]));
    let metrics = app.metrics_text().await;
    assert!(metrics.contains("keel_traces_written_total 3"), "{metrics}");
    assert!(metrics.contains("keel_traces_dropped_total 0"), "{metrics}");
    assert!(metrics.contains("keel_trace_batches_written_total "), "{metrics}");
}

#[actix_web::test]
async fn the_writer_drains_at_shutdown() {
    let (provider_fake, url) = FakeProvider::start();
    let _keep = provider_fake;
    let app = spawn_app_with(|s| {
        s.providers.openai_url = url;
        // Never flushes on its own within the test: only the shutdown drain writes.
        s.traces.flush_ms = 600_000;
        s.traces.flush_rows = 10_000;
    })
    .await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    for _ in 0..3 {
        let response = sdk_request(&app, &org, Some(&project), &chat("gpt-plain", "hi"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    actix_web::rt::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(
        count_traces(&app.db_url).await == 0,
        "nothing is written before a flush"
    );
    app.stop().await;
    assert!(
        eventually(|| async { count_traces(&app.db_url).await == 3 }).await,
        "the shutdown drain wrote every trace"
    );
}

#[actix_web::test]
async fn a_backlog_is_written_whole_and_a_drain_behind_it_waits_for_it() {
    // 300 traces handed over before the writer runs: the batch that reaches `flush_rows`
    // takes the queued backlog along (one batch), stopping at the drain request that
    // follows it, which is answered only once all 300 are in the database.
    let (app, writer, trace) = own_writer(2, 1000, 0).await;
    for i in 0..300 {
        writer.record_pending(trace(format!("backlog-{i}")));
    }
    writer.drain().await;
    // Checked before anything else awaits: the drain answered after the write, not before.
    assert_eq!(writer.metrics.written.get(), 300);
    assert_eq!(writer.metrics.dropped.get(), 0);
    assert_eq!(count_traces(&app.db_url).await, 300);
}

#[actix_web::test]
async fn under_load_a_batch_waits_for_its_interval_and_takes_everything_queued() {
    // Batches of 2, at most one every 2 s: the first is written at once; the four traces
    // queued right after it fill two batches' worth but wait for the interval, then go in
    // one batch.
    let (app, writer, trace) = own_writer(2, 1000, 2_000).await;
    writer.record_pending(trace("first-0".into()));
    writer.record_pending(trace("first-1".into()));
    assert!(
        eventually(|| async { writer.metrics.written.get() == 2 }).await,
        "the first full batch is written at once"
    );
    for i in 0..4 {
        writer.record_pending(trace(format!("paced-{i}")));
    }
    actix_web::rt::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(
        writer.metrics.written.get(),
        2,
        "a full batch waits for its interval"
    );
    assert!(
        eventually(|| async { writer.metrics.written.get() == 6 }).await,
        "then it is written"
    );
    assert_eq!(
        writer.metrics.batches.get(),
        2,
        "the four waiting traces went in one batch"
    );
    assert_eq!(count_traces(&app.db_url).await, 6);
}

#[actix_web::test]
async fn a_full_queue_drops_and_counts_the_overflow_and_takes_traces_again_once_written() {
    // Capacity 5, and the writer never flushes on its own: the 6th to 8th traces find the
    // queue full. They are counted as dropped, the 5 queued ones are all
    // written, and once they are the queue takes traces again.
    let (app, writer, trace) = own_writer(100, 5, 0).await;
    for i in 0..8 {
        writer.record_pending(trace(format!("overflow-{i}")));
    }
    assert_eq!(writer.metrics.recorded.get(), 5);
    assert_eq!(writer.metrics.dropped.get(), 3);
    writer.drain().await;
    assert_eq!(writer.metrics.written.get(), 5);
    assert_eq!(count_traces(&app.db_url).await, 5);
    for i in 8..10 {
        writer.record_pending(trace(format!("overflow-{i}")));
    }
    writer.drain().await;
    assert_eq!(writer.metrics.dropped.get(), 3);
    assert_eq!(writer.metrics.written.get(), 7);
    assert_eq!(count_traces(&app.db_url).await, 7);
}

#[actix_web::test]
async fn a_writer_that_dies_answers_drains_and_refuses_traces() {
    // A trace whose finishing panics ends the writer task. The drain behind it (the one a
    // shutdown waits on) is still answered, and later traces are counted as dropped rather
    // than queued for a writer that will never write them.
    let (_app, writer, trace) = own_writer(100, 1000, 0).await;
    writer.record_pending(trace("before".into()));
    writer.record_pending(Box::new(|| panic!("a trace that cannot be finished")));
    let drained = actix_web::rt::time::timeout(std::time::Duration::from_secs(10), writer.drain()).await;
    assert!(drained.is_ok(), "the drain was answered");
    assert_eq!(writer.metrics.written.get(), 0);
    writer.record_pending(trace("after".into()));
    assert_eq!(writer.metrics.recorded.get(), 2);
    assert_eq!(writer.metrics.dropped.get(), 1);
    let again = actix_web::rt::time::timeout(std::time::Duration::from_secs(10), writer.drain()).await;
    assert!(again.is_ok(), "a later drain answers at once");
}

#[actix_web::test]
async fn a_deleted_organizations_traces_are_dropped_and_counted_and_everyone_elses_written() {
    // As reported: organization A's call and D's, then D deleted within the writer's batch
    // window. The batch fails D's foreign key; A's trace must still be written.
    let (provider_fake, url) = FakeProvider::start();
    let _keep = provider_fake;
    let app = spawn_app_with(|s| {
        s.providers.openai_url = url;
        s.traces.flush_ms = 3_000;
        s.traces.flush_rows = 10_000;
    })
    .await;
    let acme = app.create_org("Acme").await;
    let doomed = app.create_org("Doomed").await;
    let acme_project = app.create_project(&acme, "Support").await;
    let doomed_project = app.create_project(&doomed, "Support").await;
    for (org, project) in [
        (&acme, &acme_project),
        (&doomed, &doomed_project),
        (&acme, &acme_project),
    ] {
        let response = sdk_request(&app, org, Some(project), &chat("gpt-plain", "hi"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    app.delete_org(&doomed).await;
    assert_eq!(
        count_traces(&app.db_url).await,
        0,
        "still within the batch window"
    );
    raw_traces(&app, &acme, &acme_project, 2).await;
    let metrics = app.metrics_text().await;
    assert!(metrics.contains("keel_traces_written_total 2"), "{metrics}");
    assert!(metrics.contains("keel_traces_refused_total 1"), "{metrics}");
    assert!(
        metrics.contains("keel_traces_write_failures_total 0"),
        "{metrics}"
    );
    assert_eq!(count_traces(&app.db_url).await, 2);
}

#[actix_web::test]
async fn a_refused_batch_is_split_until_only_the_refused_rows_are_left() {
    // 100 traces, every tenth of a project deleted meanwhile: 90 written, 10 refused.
    let (app, writer, trace) = own_writer(1_000, 1_000, 0).await;
    let doomed = app.create_org("Doomed").await;
    let doomed_project = app.create_project(&doomed, "Gone").await;
    for i in 0..100 {
        if i % 10 == 3 {
            writer.record_pending(pending_trace(
                format!("doomed-{i}"),
                &doomed.org_id,
                &doomed_project,
            ));
        } else {
            writer.record_pending(trace(format!("kept-{i}")));
        }
    }
    app.delete_org(&doomed).await;
    writer.drain().await;
    assert_eq!(writer.metrics.written.get(), 90);
    assert_eq!(writer.metrics.refused.get(), 10);
    assert_eq!(writer.metrics.write_failures.get(), 0);
    assert_eq!(count_traces(&app.db_url).await, 90);
}

#[actix_web::test]
async fn a_value_the_database_cannot_hold_costs_only_its_own_trace() {
    // A NUL in a trace's text (PostgreSQL's text refuses it; SQLite keeps it): refused like a
    // constraint's row and split out of its batch, not retried and lost with the whole batch.
    let (app, writer, trace) = own_writer(1_000, 1_000, 0).await;
    for i in 0..10 {
        let pending = trace(format!("kept-{i}"));
        writer.record_pending(if i == 4 {
            Box::new(move || entities::trace::Model {
                request: "{\"content\":\"nul \u{0} inside\"}".into(),
                ..pending()
            })
        } else {
            pending
        });
    }
    writer.drain().await;
    assert_eq!(writer.metrics.write_failures.get(), 0);
    assert_eq!(writer.metrics.written.get() + writer.metrics.refused.get(), 10);
    assert!(writer.metrics.written.get() >= 9);
    if postgres() {
        assert_eq!(writer.metrics.refused.get(), 1, "only the NUL's trace is refused");
    }
    assert_eq!(count_traces(&app.db_url).await, writer.metrics.written.get());
}

#[actix_web::test]
async fn deleting_an_organization_deletes_its_written_traces_and_no_one_elses() {
    let (app, writer, trace) = own_writer(1_000, 1_000, 0).await;
    let doomed = app.create_org("Doomed").await;
    let first = app.create_project(&doomed, "First").await;
    let second = app.create_project(&doomed, "Second").await;
    for i in 0..3 {
        writer.record_pending(trace(format!("kept-{i}")));
        for project in [&first, &second] {
            writer.record_pending(pending_trace(
                format!("doomed-{project}-{i}"),
                &doomed.org_id,
                project,
            ));
        }
    }
    writer.drain().await;
    assert_eq!(writer.metrics.written.get(), 9);
    assert_eq!(count_traces(&app.db_url).await, 9);
    app.delete_org(&doomed).await;
    assert_eq!(
        count_traces(&app.db_url).await,
        3,
        "the other organization's traces stay"
    );
}

#[actix_web::test]
async fn a_trace_is_written_exactly_as_it_was_whatever_it_holds() {
    // What a recorded call may carry into any field: the characters a text encoding escapes or
    // reads as its own (tab, newline, CR, backslash, `\N`, a `\.` line), quotes, other control
    // characters, any script; empty text that is not NULL; every NULL; the integers' extremes.
    let (app, writer, _) = own_writer(1_000, 1_000, 0).await;
    let org = app.create_org("Hostile").await;
    let project = app.create_project(&org, "Everything").await;
    let hostile =
        "tab\there\nnewline\r\nCRLF \\ \\\\ \\N \\t\n\\.\n'quote' \"dq\" \u{7}\u{1b}[31m héllo ✓ 😀 \u{202e}";
    let created_at = |nanos| chrono::DateTime::from_timestamp(1_764_000_000, nanos).unwrap();
    let full = entities::trace::Model {
        id: TraceId::parse("00000000-0000-4000-8000-00000000a001").unwrap(),
        org_id: OrgId::parse(&org.org_id).unwrap(),
        project_id: ProjectId::parse(&project).unwrap(),
        provider: "openai".into(),
        model: Some("\\N".into()),
        request: format!("{{\"content\":{}}}", json!(hostile)),
        response: Some(hostile.into()),
        status_code: i32::MAX,
        stream: true,
        complete: false,
        latency_ms: i64::MAX,
        ttfb_ms: Some(i64::MIN),
        prompt_tokens: Some(0),
        completion_tokens: Some(-1),
        total_tokens: Some(1),
        usage_estimated: false,
        error: Some(format!("{hostile}\n\\.")),
        created_at: created_at(123_456_789),
        search_text: Some("every word".into()),
        preview_input: Some("every".into()),
        preview_output: Some("word".into()),
    };
    let empty = entities::trace::Model {
        id: TraceId::parse("00000000-0000-4000-8000-00000000a002").unwrap(),
        org_id: OrgId::parse(&org.org_id).unwrap(),
        project_id: ProjectId::parse(&project).unwrap(),
        provider: String::new(),
        model: Some(String::new()),
        request: String::new(),
        response: None,
        status_code: 0,
        stream: false,
        complete: true,
        latency_ms: 0,
        ttfb_ms: None,
        prompt_tokens: None,
        completion_tokens: None,
        total_tokens: None,
        usage_estimated: false,
        error: None,
        created_at: created_at(0),
        search_text: None,
        preview_input: None,
        preview_output: None,
    };
    for trace in [&full, &empty] {
        let trace = trace.clone();
        writer.record_pending(Box::new(move || trace));
    }
    writer.drain().await;
    assert_eq!(writer.metrics.written.get(), 2);
    assert_eq!(writer.metrics.write_failures.get(), 0);

    use sea_orm::EntityTrait;
    let db = sea_orm::Database::connect(app.db_url.as_str()).await.unwrap();
    for expected in [full, empty] {
        let stored = entities::trace::Entity::find_by_id(expected.id.clone())
            .one(&db)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{} was not written", expected.id));
        // Microseconds, the coarser of the two databases' precisions.
        assert_eq!(
            stored.created_at.timestamp_micros(),
            expected.created_at.timestamp_micros()
        );
        assert_eq!(
            entities::trace::Model {
                created_at: expected.created_at,
                ..stored
            },
            expected
        );
    }
    db.close().await.ok();
}

/// An app, a trace writer the test starts itself on the app's database, and a maker of
/// finished traces for it (in one project of one organization).
async fn own_writer(
    flush_rows: usize,
    capacity: usize,
    batch_interval_ms: u64,
) -> (
    TestApp,
    keel_core::traces::writer::TraceWriter,
    impl Fn(String) -> keel_core::traces::writer::PendingTrace,
) {
    // The app's own search indexer would give the test's traces without words their words:
    // these tests read back exactly what they wrote.
    let app = spawn_app_with(|s| s.traces.search_indexer = false).await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    let db = sea_orm::Database::connect(app.db_url.as_str()).await.unwrap();
    let writer = keel_core::traces::writer::TraceWriter::start(
        db,
        &keel_core::config::TraceSettings {
            flush_rows,
            flush_ms: 600_000,
            batch_interval_ms,
            queue_capacity: capacity,
            // The rest (none of it the writer's) as configured by default.
            ..keel_core::config::Settings::defaults().expect("defaults").traces
        },
        keel_core::metrics::Metrics::new().unwrap(),
        &keel_core::tasks::Tasks::default(),
    )
    .unwrap();
    let org_id = org.org_id;
    let trace = move |id| pending_trace(id, &org_id, &project);
    (app, writer, trace)
}

/// The trace id a test's label stands for: a UUID made from the label, the same each time.
fn labelled_id(label: &str) -> TraceId {
    use std::hash::{Hash, Hasher};
    let half = |salt: u8| {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        (salt, label).hash(&mut hasher);
        hasher.finish()
    };
    let id = uuid::Uuid::from_u64_pair(half(0), half(1));
    TraceId::parse(&id.to_string()).unwrap()
}

/// A finished trace handed to a writer started by the test itself; `label` names it.
fn pending_trace(label: String, org_id: &str, project_id: &str) -> keel_core::traces::writer::PendingTrace {
    let (org_id, project_id) = (org_id.to_owned(), project_id.to_owned());
    Box::new(move || entities::trace::Model {
        id: labelled_id(&label),
        org_id: OrgId::parse(&org_id).unwrap(),
        project_id: ProjectId::parse(&project_id).unwrap(),
        provider: "openai".into(),
        model: Some("gpt-plain".into()),
        request: "{}".into(),
        response: None,
        status_code: 200,
        stream: false,
        complete: true,
        latency_ms: 1,
        ttfb_ms: Some(1),
        prompt_tokens: None,
        completion_tokens: None,
        total_tokens: None,
        usage_estimated: false,
        error: None,
        created_at: chrono::Utc::now(),
        search_text: None,
        preview_input: None,
        preview_output: None,
    })
}

async fn count_traces(db_url: &str) -> u64 {
    use sea_orm::{EntityTrait, PaginatorTrait};
    let db = sea_orm::Database::connect(db_url).await.unwrap();
    let count = entities::trace::Entity::find().count(&db).await.unwrap();
    db.close().await.ok();
    count
}

#[actix_web::test]
async fn the_cli_writes_jsonl_through_the_api() {
    let (app, _provider) = proxy_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    record_five(&app, &org, &project).await;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("dataset.jsonl");
    // The CLI runs on a blocking thread, so this test's runtime (which drives the app's
    // background work) keeps running meanwhile.
    let run = |args: Vec<String>, api_key: String| {
        let address = app.address.clone();
        async move {
            actix_web::rt::task::spawn_blocking(move || {
                Command::new(env!("CARGO_BIN_EXE_keel"))
                    .args(args)
                    .env("KEEL_URL", address)
                    .env("KEEL_API_KEY", api_key)
                    .env(
                        "KEEL_CONFIG_DIR",
                        env!("CARGO_MANIFEST_DIR").to_owned() + "/config",
                    )
                    .output()
                    .unwrap()
            })
            .await
            .unwrap()
        }
    };
    let export_args = |format: &str, limit: &str| -> Vec<String> {
        [
            "traces",
            "export",
            "--project",
            project.as_str(),
            "--format",
            format,
            "--limit",
            limit,
            "--out",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .chain([out.display().to_string()])
        .collect()
    };
    let output = run(export_args("records", "1000"), org.api_key.clone()).await;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = std::fs::read_to_string(&out).unwrap();
    let lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 4);
    assert!(lines
        .iter()
        .all(|l| l["input"].is_string() && !l["output"].is_null()));
    assert!(String::from_utf8_lossy(&output.stderr).contains("1 skipped"));
    assert!(
        !String::from_utf8_lossy(&output.stdout).contains("input"),
        "records go to the file"
    );

    let output = run(export_args("prompts", "2"), org.api_key.clone()).await;
    assert!(output.status.success());
    assert_eq!(std::fs::read_to_string(&out).unwrap().lines().count(), 1);
    let bad = run(export_args("csv", "10"), org.api_key.clone()).await;
    assert!(!bad.status.success());
    let args = vec![
        "traces".to_owned(),
        "export".into(),
        "--project".into(),
        project.clone(),
    ];
    let output = run(args, "keel_sk_0000000000000000000000000000000000000000".into()).await;
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("401"));
}

pub fn eval_body(project: &str, cases: Value) -> Value {
    json!({"project_id": project, "suite_name": "smoke", "environment_reference": "acme/support/grader",
        "model": "llama", "cases": cases})
}

#[actix_web::test]
async fn eval_uploads_derive_their_counts() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    let cases = json!([
        {"case_id": "a", "score": 1.0, "success": true},
        {"case_id": "b", "score": 0.5, "success": false, "error": ""},
        {"case_id": "c", "error": "timeout", "latency_ms": 2147483647, "total_tokens": 0},
        {"score": 0.0, "success": true, "metrics": {"bleu": 0.1}},
        {}
    ]);
    let body = json_of(
        app.post("/api/evals/runs", &org.api_key, &eval_body(&project, cases))
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(body["ok"], true);
    assert!(body["eval_run_id"].is_string());
    assert_eq!(
        (
            &body["total_cases"],
            &body["passed_cases"],
            &body["graded_cases"],
            &body["errored_cases"],
            &body["mean_score"]
        ),
        (&json!(5), &json!(2), &json!(3), &json!(1), &json!(0.5))
    );
    let empty = json_of(
        app.post(
            "/api/evals/runs",
            &org.member_token,
            &eval_body(&project, json!([])),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        (
            &empty["total_cases"],
            &empty["graded_cases"],
            &empty["mean_score"]
        ),
        (&json!(0), &json!(0), &Value::Null)
    );
    let mut no_cases = eval_body(&project, json!([]));
    no_cases.as_object_mut().unwrap().remove("cases");
    no_cases["status"] = json!("failed");
    assert_eq!(
        json_of(
            app.post("/api/evals/runs", &org.api_key, &no_cases).await,
            StatusCode::OK
        )
        .await["total_cases"],
        0
    );
    let unscored = json!([{"success": true, "score": null}, {"success": null}]);
    let body = json_of(
        app.post("/api/evals/runs", &org.api_key, &eval_body(&project, unscored))
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        (&body["passed_cases"], &body["graded_cases"], &body["mean_score"]),
        (&json!(1), &json!(0), &Value::Null)
    );

    let db = sea_orm::Database::connect(&app.db_url).await.unwrap();
    use sea_orm::{EntityTrait, PaginatorTrait};
    assert_eq!(entities::eval_run::Entity::find().count(&db).await.unwrap(), 4);
    assert_eq!(entities::eval_case::Entity::find().count(&db).await.unwrap(), 7);
    db.close().await.ok();

    let other = app.create_org("Globex").await;
    let response = app
        .post("/api/evals/runs", &other.api_key, &eval_body(&project, json!([])))
        .await;
    assert_error(response, StatusCode::NOT_FOUND).await;
}

#[actix_web::test]
async fn eval_uploads_enforce_every_bound() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    let good = eval_body(&project, json!([]));
    for (field, value) in [
        ("project_id", json!("")),
        ("suite_name", json!("")),
        ("suite_name", json!("s".repeat(201))),
        ("environment_reference", json!("")),
        ("environment_reference", json!("e".repeat(513))),
        ("model", json!("m".repeat(201))),
        ("status", json!("done")),
        ("started_at", json!("yesterday")),
        ("metadata", json!([1])),
    ] {
        let mut body = good.clone();
        body[field] = value;
        let issues = validation_issues(app.post("/api/evals/runs", &org.api_key, &body).await).await;
        assert_eq!(issues[0]["loc"], json!(["body", field]), "{field}");
    }
    for (case, field) in [
        (json!({"case_id": "c".repeat(201)}), "case_id"),
        (json!({"latency_ms": -1}), "latency_ms"),
        (json!({"total_tokens": 2147483648i64}), "total_tokens"),
        (json!({"score": "high"}), "score"),
    ] {
        let body = eval_body(&project, json!([{}, case]));
        let issues = validation_issues(app.post("/api/evals/runs", &org.api_key, &body).await).await;
        assert_eq!(issues[0]["loc"], json!(["body", "cases", 1, field]), "{field}");
    }
    let too_many = eval_body(&project, Value::Array(vec![json!({}); 5001]));
    let issues = validation_issues(app.post("/api/evals/runs", &org.api_key, &too_many).await).await;
    assert_eq!(issues[0]["loc"], json!(["body", "cases"]));
    let most = eval_body(&project, Value::Array(vec![json!({"score": 1.0}); 5000]));
    let body = json_of(
        app.post("/api/evals/runs", &org.api_key, &most).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        (&body["total_cases"], &body["mean_score"]),
        (&json!(5000), &json!(1.0))
    );
    let mut dated = good.clone();
    dated["started_at"] = json!("2026-11-22T10:00:00Z");
    assert_eq!(
        app.post("/api/evals/runs", &org.api_key, &dated).await.status(),
        StatusCode::OK
    );
}
