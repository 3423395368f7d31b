//! Issue 58: a project pushes its recorded calls to an OTLP/HTTP endpoint as they happen,
//! one span a trace (the `otlp-json` export's), as protobuf, decoded here with the protocol's
//! own generated types (opentelemetry-proto): every span arrives, with keel's trace ids, the
//! model, the tokens and the messages, through a receiver that fails for a while and through a
//! kill -9 in the middle of a batch.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::fakes::{Call, FakeJson, Reply};
use crate::helpers::*;
use crate::proxy::{proxy_app_with, raw_traces};
use crate::traces::record_five;

/// Langfuse's header: `Basic base64(public_key:secret_key)`.
const BASIC: &str = "Basic cGstbGYtcHVibGljOnNrLWxmLXNlY3JldA==";

/// keel pushing fast: a look every 100 ms, the shortest backoff, local receivers allowed.
fn pushing(settings: &mut keel_core::config::Settings) {
    settings.otlp_push.interval_ms = 100;
    settings.otlp_push.max_backoff_secs = 1;
    settings.webhooks.allow_http = true;
    settings.webhooks.allow_private_destinations = true;
}

pub async fn patch(app: &TestApp, path: &str, token: &str, body: &Value) -> reqwest::Response {
    app.request(Method::PATCH, path, Some(token))
        .json(body)
        .send()
        .await
        .unwrap()
}

/// The spans of the pushes a receiver answered 2xx, by trace id (hex), and the requests.
fn received(calls: &[Call], accepted: impl Fn(usize) -> bool) -> HashMap<String, Span> {
    let mut spans = HashMap::new();
    for (i, call) in calls.iter().enumerate() {
        if !accepted(i) {
            continue;
        }
        let request = ExportTraceServiceRequest::decode(call.raw.as_slice()).expect("OTLP protobuf");
        for resource in request.resource_spans {
            for scope in resource.scope_spans {
                for span in scope.spans {
                    spans.insert(hex::encode(&span.trace_id), span);
                }
            }
        }
    }
    spans
}

fn attribute(span: &Span, key: &str) -> Option<Any> {
    span.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.clone())
        .and_then(|v| v.value)
}

fn text(span: &Span, key: &str) -> String {
    match attribute(span, key) {
        Some(Any::StringValue(text)) => text,
        other => panic!("{key}: {other:?}"),
    }
}

async fn wait_for(what: &str, mut check: impl FnMut() -> bool) {
    for _ in 0..300 {
        if check() {
            return;
        }
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("waited 15 s for {what}");
}

#[actix_web::test]
async fn recorded_calls_reach_an_otlp_receiver_as_the_exports_spans() {
    let (receiver, receiver_url) = FakeJson::start(|_| Reply::Empty(200));
    let (app, _provider) = proxy_app_with(pushing).await;
    let org = app.create_org("Pushed").await;
    let project = app.create_project(&org, "Support").await;
    let path = format!("/api/projects/{project}");
    let destination = json!({"otlpExport": {"endpoint": format!("{receiver_url}/api/public/otel"),
        "headers": {"Authorization": BASIC}}});

    // Only an owner's session says where a project's calls go; anyone else's body that
    // carries it is refused whole (its retention is not changed either).
    for token in [&org.member_token, &org.api_key] {
        let mut body = destination.clone();
        body["traceRetentionDays"] = json!(7);
        let refused = patch(&app, &path, token, &body).await;
        assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    }
    let view = json_of(app.get(&path, &org.api_key).await, StatusCode::OK).await;
    assert_eq!(view["traceRetentionDays"], Value::Null);
    assert_eq!(view["otlpExport"], Value::Null);

    let set = patch(&app, &path, &org.owner_token, &destination).await;
    assert_eq!(set.status(), StatusCode::OK);
    let text_of_view = set.text().await.unwrap();
    assert!(
        !text_of_view.contains("cGstbGYtcHVibGlj"),
        "a header's value shown: {text_of_view}"
    );
    let view: Value = serde_json::from_str(&text_of_view).unwrap();
    assert_eq!(
        view["otlpExport"]["endpoint"],
        format!("{receiver_url}/api/public/otel/v1/traces")
    );
    assert_eq!(view["otlpExport"]["headerNames"], json!(["Authorization"]));
    // A member still changes the retention alone, and reads the push's names, not values.
    let retained = patch(&app, &path, &org.member_token, &json!({"traceRetentionDays": 30})).await;
    let retained = json_of(retained, StatusCode::OK).await;
    assert_eq!(retained["traceRetentionDays"], 30);
    assert_eq!(retained["otlpExport"]["headerNames"], json!(["Authorization"]));
    let listed = json_of(app.get("/api/projects", &org.api_key).await, StatusCode::OK).await;
    assert_eq!(
        listed[0]["otlpExport"]["endpoint"],
        view["otlpExport"]["endpoint"]
    );

    record_five(&app, &org, &project).await;
    let traces = raw_traces(&app, &org, &project, 5).await;
    let ids: HashSet<String> = traces
        .iter()
        .map(|t| t["id"].as_str().unwrap().replace('-', ""))
        .collect();
    wait_for("five pushed spans", || {
        received(&receiver.calls(), |_| true).len() == 5
    })
    .await;
    let calls = receiver.calls();
    for call in &calls {
        assert_eq!(call.path, "/api/public/otel/v1/traces");
        assert_eq!(
            call.headers.get("content-type").map(String::as_str),
            Some("application/x-protobuf")
        );
        assert_eq!(call.authorization.as_deref(), Some(BASIC));
    }
    let spans = received(&calls, |_| true);
    assert_eq!(
        spans.keys().cloned().collect::<HashSet<_>>(),
        ids,
        "one span a trace, keel's ids"
    );

    // Each span is the otlp-json export's: same ids and attributes.
    let exported = json_of(
        app.get(
            &format!("/api/traces/export?project_id={project}&format=otlp-json"),
            &org.api_key,
        )
        .await,
        StatusCode::OK,
    )
    .await;
    let exported_spans = exported["records"][0]["resourceSpans"][0]["scopeSpans"][0]["spans"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(exported_spans.len(), 5);
    for json_span in &exported_spans {
        let id = json_span["traceId"].as_str().unwrap();
        let span = &spans[id];
        assert_eq!(hex::encode(&span.span_id), json_span["spanId"].as_str().unwrap());
        assert_eq!(span.name, json_span["name"].as_str().unwrap());
        assert_eq!(
            span.end_time_unix_nano.to_string(),
            json_span["endTimeUnixNano"].as_str().unwrap()
        );
        for attribute_json in json_span["attributes"].as_array().unwrap() {
            let key = attribute_json["key"].as_str().unwrap();
            let pushed = attribute(span, key).unwrap_or_else(|| panic!("{key} missing"));
            let value = &attribute_json["value"];
            match pushed {
                Any::StringValue(text) => assert_eq!(value["stringValue"], text, "{key}"),
                Any::IntValue(n) => assert_eq!(value["intValue"], n.to_string(), "{key}"),
                Any::DoubleValue(x) => assert_eq!(value["doubleValue"], x, "{key}"),
                Any::ArrayValue(a) => assert_eq!(
                    value["arrayValue"]["values"].as_array().map(Vec::len),
                    Some(a.values.len()),
                    "{key}"
                ),
                other => panic!("{key}: {other:?}"),
            }
        }
    }
    // What a team reads in Phoenix or Langfuse: the model, the tokens, the messages.
    let plain = spans
        .values()
        .find(|s| {
            text(s, "gen_ai.request.model") == "gpt-plain"
                && text(s, "gen_ai.input.messages").contains("Capital of France?")
                && !text(s, "gen_ai.input.messages").contains("Be brief")
        })
        .expect("the plain call's span");
    let input: Value = serde_json::from_str(&text(plain, "gen_ai.input.messages")).unwrap();
    assert_eq!(input[0]["parts"][0]["content"], "Capital of France?");
    let output: Value = serde_json::from_str(&text(plain, "gen_ai.output.messages")).unwrap();
    assert_eq!(output[0]["role"], "assistant");
    assert!(matches!(attribute(plain, "gen_ai.usage.input_tokens"), Some(Any::IntValue(n)) if n > 0));
    assert!(matches!(attribute(plain, "gen_ai.usage.output_tokens"), Some(Any::IntValue(n)) if n > 0));
    // The failed call is a span too, with an error status.
    assert!(spans
        .values()
        .any(|s| s.status.as_ref().is_some_and(|st| st.code == 2)));

    let metrics = app.get("/metrics", INTERNAL_KEY).await.text().await.unwrap();
    assert_eq!(
        metric(&metrics, "keel_otlp_export_spans_total{outcome=\"exported\"}"),
        5.0
    );
    assert_eq!(metric(&metrics, "keel_otlp_export_lag_seconds"), 0.0);
    let view = json_of(app.get(&path, &org.api_key).await, StatusCode::OK).await;
    assert_eq!(view["otlpExport"]["pending"], 0);
    assert!(view["otlpExport"]["lastExportedAt"].is_string());

    // `headers: null` (the schema allows it) is no headers.
    let plain = json_of(
        patch(
            &app,
            &path,
            &org.owner_token,
            &json!({"otlpExport": {"endpoint": receiver_url.clone(), "headers": null}}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(plain["otlpExport"]["headerNames"], json!([]));

    // Turned off: nothing more is pushed.
    let off = json_of(
        patch(&app, &path, &org.owner_token, &json!({"otlpExport": null})).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(off["otlpExport"], Value::Null);
    assert_eq!(off["traceRetentionDays"], 30);
    let before = receiver.calls().len();
    record_five(&app, &org, &project).await;
    actix_web::rt::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.calls().len(), before);
}

/// A receiver that fails (503, with a hostile body) for its first answers: keel backs off,
/// shows the last error, and every span arrives once the receiver takes them.
#[actix_web::test]
async fn a_failing_receiver_is_retried_until_every_span_is_in() {
    let failing = Arc::new(AtomicUsize::new(3));
    let answers = failing.clone();
    let (receiver, receiver_url) = FakeJson::start(move |_| {
        match answers
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            true => Reply::Json(503, json!({"error": "\u{1b}[31mcollector down\r\n<script>"})),
            false => Reply::Empty(200),
        }
    });
    let (app, _provider) = proxy_app_with(pushing).await;
    let org = app.create_org("Retried").await;
    let project = app.create_project(&org, "Support").await;
    let path = format!("/api/projects/{project}");
    let set = patch(
        &app,
        &path,
        &org.owner_token,
        &json!({"otlpExport": {"endpoint": receiver_url.clone()}}),
    )
    .await;
    assert_eq!(set.status(), StatusCode::OK);
    record_five(&app, &org, &project).await;
    let traces = raw_traces(&app, &org, &project, 5).await;
    let ids: HashSet<String> = traces
        .iter()
        .map(|t| t["id"].as_str().unwrap().replace('-', ""))
        .collect();
    // The error is shown while it lasts, as text without control characters.
    let mut seen_error = None;
    for _ in 0..100 {
        let view = json_of(app.get(&path, &org.api_key).await, StatusCode::OK).await;
        if let Some(error) = view["otlpExport"]["lastError"].as_str() {
            seen_error = Some(error.to_owned());
            break;
        }
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
    let error = seen_error.expect("the failure shown");
    assert!(
        error.contains("503") && error.contains("collector down"),
        "{error}"
    );
    assert!(!error.chars().any(char::is_control), "{error:?}");
    // The project's settings in the console show where it pushes and the last error, escaped.
    let console = crate::console::Console::sign_in(&app, &org.api_key).await;
    let page = console
        .page(&format!("/console/o/{}/projects/{project}/traces", org.org_id))
        .await;
    assert!(page.contains(&format!("{receiver_url}/v1/traces")), "{page}");
    assert!(
        page.contains("collector down") && page.contains("&#60;script&#62;"),
        "{page}"
    );
    assert!(!page.contains("<script>\""), "{page}");
    wait_for("every span accepted", || {
        let calls = receiver.calls();
        received(&calls, |i| i >= 3).len() == 5
    })
    .await;
    let calls = receiver.calls();
    assert_eq!(
        received(&calls, |i| i >= 3)
            .keys()
            .cloned()
            .collect::<HashSet<_>>(),
        ids
    );
    // Backed off: three failures took more than one look (100 ms) each after the first.
    assert!(calls.len() >= 4);
    let metrics = app.get("/metrics", INTERNAL_KEY).await.text().await.unwrap();
    assert!(metric(&metrics, "keel_otlp_export_spans_total{outcome=\"failed\"}") >= 3.0);
    assert_eq!(
        metric(&metrics, "keel_otlp_export_spans_total{outcome=\"exported\"}"),
        5.0
    );
    let view = json_of(app.get(&path, &org.api_key).await, StatusCode::OK).await;
    assert_eq!(view["otlpExport"]["pending"], 0);
}

/// Destinations follow the webhooks' rules; headers keel cannot send are refused by name.
#[actix_web::test]
async fn destinations_and_headers_keel_will_not_use_are_422_naming_them() {
    let app = spawn_app().await;
    let org = app.create_org("Refused").await;
    let project = app.create_project(&org, "Support").await;
    let path = format!("/api/projects/{project}");
    for (body, loc) in [
        (
            json!({"otlpExport": {"endpoint": "http://collector.example.com"}}),
            json!(["body", "otlpExport", "endpoint"]),
        ),
        (
            json!({"otlpExport": {"endpoint": "https://127.0.0.1:4318"}}),
            json!(["body", "otlpExport", "endpoint"]),
        ),
        (
            json!({"otlpExport": {"endpoint": "https://user:pw@collector.example.com"}}),
            json!(["body", "otlpExport", "endpoint"]),
        ),
        (
            json!({"otlpExport": {"endpoint": "https://collector.example.com", "headers": {"bad name": "x"}}}),
            json!(["body", "otlpExport", "headers", "bad name"]),
        ),
        (
            json!({"otlpExport": {"endpoint": "https://collector.example.com", "headers": {"x-key": "a\nb"}}}),
            json!(["body", "otlpExport", "headers", "x-key"]),
        ),
        (
            json!({"otlpExport": {"headers": {}}}),
            json!(["body", "otlpExport", "endpoint"]),
        ),
        (
            json!({"otlpExport": {"endpoint": "https://c.example.com", "other": 1}}),
            json!(["body", "otlpExport", "other"]),
        ),
    ] {
        let refused = patch(&app, &path, &org.owner_token, &body).await;
        let detail = json_of(refused, StatusCode::UNPROCESSABLE_ENTITY).await;
        let locs: Vec<&Value> = detail["detail"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| &d["loc"])
            .collect();
        assert!(locs.contains(&&loc), "{body}: {detail}");
    }
    // An https endpoint of a public host is taken (nothing is sent until a call is recorded).
    let taken = patch(
        &app,
        &path,
        &org.owner_token,
        &json!({"otlpExport": {"endpoint": "https://collector.example.com/", "headers": {"x-api-key": "k"}}}),
    )
    .await;
    let view = json_of(taken, StatusCode::OK).await;
    assert_eq!(
        view["otlpExport"]["endpoint"],
        "https://collector.example.com/v1/traces"
    );
    // Another organization's project is 404, for its owner too.
    let other = app.create_org("Other").await;
    let foreign = patch(&app, &path, &other.owner_token, &json!({"otlpExport": null})).await;
    assert_eq!(foreign.status(), StatusCode::NOT_FOUND);
    // A change names something to change.
    let empty = patch(&app, &path, &org.owner_token, &json!({})).await;
    assert_eq!(empty.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let same = json_of(app.get(&path, &org.api_key).await, StatusCode::OK).await;
    assert_eq!(same["otlpExport"]["headerNames"], json!(["x-api-key"]));
}

/// keel killed with SIGKILL while a batch is on its way: what was leased goes again once the
/// lease lapses, after the restart; every span arrives (at least once).
#[actix_web::test]
async fn a_batch_cut_by_kill_9_is_pushed_after_the_restart() {
    let hanging = Arc::new(AtomicBool::new(true));
    let hang = hanging.clone();
    let (receiver, receiver_url) = FakeJson::start(move |_| match hang.load(Ordering::SeqCst) {
        true => Reply::Hang,
        false => Reply::Empty(200),
    });
    let (provider, provider_url) = crate::fakes::FakeProvider::start();
    let _ = provider;
    let db = TestDb::new().await;
    let openai = format!("{provider_url}/openai/v1");
    let envs = [
        ("KEEL_PROVIDER_OPENAI_URL", openai.as_str()),
        ("KEEL__WEBHOOKS__ALLOW_HTTP", "true"),
        ("KEEL__WEBHOOKS__ALLOW_PRIVATE_DESTINATIONS", "true"),
        ("KEEL__OTLP_PUSH__INTERVAL_MS", "100"),
        ("KEEL__OTLP_PUSH__LEASE_SECS", "2"),
        ("KEEL__OTLP_PUSH__TIMEOUT_SECS", "20"),
        ("KEEL__TRACES__FLUSH_MS", "20"),
    ];
    let mut instance = crate::chaos::Instance::started(&db.url, &envs).await;
    let http = reqwest::Client::new();
    let (org_id, key) = org_with_key(&http, &instance.base, "killed").await;
    let owner = session_token("owner-killed");
    let project: Value = http
        .post(instance.url("/api/projects"))
        .bearer_auth(&key)
        .json(&json!({"name": "p"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let project = project["id"].as_str().unwrap().to_owned();
    let set = http
        .patch(instance.url(&format!("/api/projects/{project}")))
        .bearer_auth(&owner)
        .header("X-Org-Id", &org_id)
        .json(&json!({"otlpExport": {"endpoint": receiver_url}}))
        .send()
        .await
        .unwrap();
    assert_eq!(set.status(), StatusCode::OK, "{}", set.text().await.unwrap());
    for i in 0..8 {
        let answer = http
            .post(instance.url("/v1/chat/completions"))
            .bearer_auth(&key)
            .header("X-Service-Provider", "openai")
            .header("X-Service-Provider-Key", "sk-provider")
            .header("X-Service-Project-Id", &project)
            .json(&json!({"model": "gpt-plain", "messages": [{"role": "user", "content": format!("call {i}")}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
    }
    // The batch is on its way (the receiver holds it), then keel dies.
    wait_for("a push in flight", || !receiver.calls().is_empty()).await;
    let in_flight = received(&receiver.calls(), |_| true).len();
    assert!(in_flight > 0);
    instance.kill9();
    hanging.store(false, Ordering::SeqCst);
    instance.restart(&[]).await;
    wait_for("all eight spans after the restart", || {
        let calls = receiver.calls();
        // The first (hung) request was never answered: count what came after it.
        received(&calls, |i| i > 0).len() == 8
    })
    .await;
    let traces: Value = http
        .get(instance.url(&format!("/api/traces?projectId={project}&limit=50")))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: HashSet<String> = traces["traces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["traceId"].as_str().unwrap().replace('-', ""))
        .collect();
    assert_eq!(ids.len(), 8);
    assert_eq!(
        received(&receiver.calls(), |i| i > 0)
            .keys()
            .cloned()
            .collect::<HashSet<_>>(),
        ids
    );
}
