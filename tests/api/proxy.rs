//! The recording proxy, driven as the OpenAI SDK drives it (JSON and SSE), against a fake
//! provider that records what it received.

use std::time::Duration;

use futures_util::StreamExt;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::fakes::{closed_port_url, fixture, FakeProvider};
use crate::helpers::*;

pub const PROVIDER_KEY: &str = "sk-proj-provider-secret-0123456789";

/// An app whose four providers all point at one fake, under a path per provider.
pub async fn proxy_app() -> (TestApp, FakeProvider) {
    proxy_app_with(|_| {}).await
}

/// [`proxy_app`] with more settings of the test's own.
pub async fn proxy_app_with(
    configure: impl FnOnce(&mut keel_core::config::Settings),
) -> (TestApp, FakeProvider) {
    let (provider, url) = FakeProvider::start();
    let app = spawn_app_with(|s| {
        s.providers.openai_url = format!("{url}/openai/v1");
        s.providers.anthropic_url = format!("{url}/anthropic/v1");
        s.providers.openrouter_url = format!("{url}/openrouter/api/v1");
        s.providers.google_url = format!("{url}/google/v1beta/openai");
        s.traces.flush_ms = 20;
        s.proxy.read_timeout_secs = 1;
        configure(s);
    })
    .await;
    (app, provider)
}

/// A chat completion request as the OpenAI SDK sends it to `base_url=<keel>/v1`.
pub fn sdk_request(
    app: &TestApp,
    org: &TestOrg,
    project: Option<&str>,
    body: &Value,
) -> reqwest::RequestBuilder {
    sdk_request_via(app, org, project, "openai", body)
}

pub fn sdk_request_via(
    app: &TestApp,
    org: &TestOrg,
    project: Option<&str>,
    provider: &str,
    body: &Value,
) -> reqwest::RequestBuilder {
    let mut request = app
        .request(Method::POST, "/v1/chat/completions", Some(&org.api_key))
        .header("X-Service-Provider", provider)
        .header("X-Service-Provider-Key", PROVIDER_KEY)
        .header("user-agent", "OpenAI/Python 1.54.0")
        .header("x-stainless-lang", "python")
        .json(body);
    if let Some(project) = project {
        request = request.header("X-Service-Project-Id", project);
    }
    request
}

pub fn chat(model: &str, content: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": content}]})
}

/// A streamed chat completion sent as the SDK sends it; its body read as bytes arrive.
async fn open_stream(
    app: &TestApp,
    org: &TestOrg,
    project: &str,
    model: &str,
    content: &str,
) -> impl futures_util::Stream<Item = reqwest::Result<actix_web::web::Bytes>> + use<> {
    let mut body = chat(model, content);
    body["stream"] = json!(true);
    sdk_request(app, org, Some(project), &body)
        .send()
        .await
        .unwrap()
        .bytes_stream()
}

/// The project's traces as stored (`raw`), once `count` of them are written.
pub async fn raw_traces(app: &TestApp, org: &TestOrg, project: &str, count: usize) -> Vec<Value> {
    let path = format!("/api/traces/export?project_id={project}&format=raw");
    for _ in 0..200 {
        let body: Value = app.get(&path, &org.api_key).await.json().await.unwrap();
        let records = body["records"].as_array().cloned().unwrap_or_default();
        if records.len() >= count {
            return records;
        }
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{count} traces expected in project {project}");
}

#[actix_web::test]
async fn keys_in_member_names_and_secrets_inside_json_strings_never_travel_or_are_stored() {
    let (app, provider) = proxy_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    let arguments = json!({"password": "hunter22", "api_key": "sk-live-other", "city": "Paris"}).to_string();
    let body = json!({
        "model": "gpt-plain",
        "metadata": {org.api_key.as_str(): 1, PROVIDER_KEY: "x"},
        "messages": [
            {"role": "user", "content": "Log me in"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "login", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": json!({"session_token": "s3cr3t", "ok": true}).to_string()},
            {"role": "user", "content": "{this is not json}"},
        ],
    });
    let response = sdk_request(&app, &org, Some(&project), &body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);

    let call = provider.calls().pop().unwrap();
    let traces = raw_traces(&app, &org, &project, 1).await;
    let stored = traces[0]["request"].clone();
    for (place, request) in [("upstream", &call.body), ("trace", &stored)] {
        let text = request.to_string();
        for secret in [
            org.api_key.as_str(),
            PROVIDER_KEY,
            "hunter22",
            "sk-live-other",
            "s3cr3t",
        ] {
            assert!(!text.contains(secret), "{secret} reached the {place}: {text}");
        }
        assert_eq!(request["metadata"], json!({"[redacted]": "x"}), "{place}");
        let arguments: Value = serde_json::from_str(
            request["messages"][1]["tool_calls"][0]["function"]["arguments"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            arguments,
            json!({"password": "[redacted]", "api_key": "[redacted]", "city": "Paris"}),
            "{place}"
        );
        let tool: Value = serde_json::from_str(request["messages"][2]["content"].as_str().unwrap()).unwrap();
        assert_eq!(
            tool,
            json!({"session_token": "[redacted]", "ok": true}),
            "{place}"
        );
        assert_eq!(request["messages"][3]["content"], "{this is not json}", "{place}");
    }
}

#[actix_web::test]
async fn a_json_call_is_forwarded_redacted_relayed_unchanged_and_recorded() {
    let (app, provider) = proxy_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    let body = json!({
        "model": "gpt-plain",
        "max_tokens": 32,
        "api_key": "should-not-travel",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": format!("my keel key is {} and provider key {PROVIDER_KEY}", org.api_key)},
        ],
        "tools": [{"type": "function", "function": {"name": "login", "parameters": {
            "type": "object", "properties": {"token": {"type": "string"}}, "required": ["token"]}}}],
    });
    let response = sdk_request(&app, &org, Some(&project), &body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["x-request-id"], "req_fake_1");
    assert_eq!(response.headers()["openai-processing-ms"], "7");
    assert_eq!(
        response.bytes().await.unwrap().as_ref(),
        fixture("completion_plain.json").as_slice()
    );

    let call = provider.calls().pop().unwrap();
    assert_eq!(call.path, "/openai/v1/chat/completions");
    assert_eq!(
        call.authorization.as_deref(),
        Some(format!("Bearer {PROVIDER_KEY}").as_str())
    );
    assert_eq!(
        call.headers.get("user-agent").map(String::as_str),
        Some("OpenAI/Python 1.54.0")
    );
    for (name, value) in &call.headers {
        assert!(
            !name.starts_with("x-service"),
            "keel header {name} travelled upstream"
        );
        assert!(!value.contains(&org.api_key), "keel key travelled in {name}");
    }
    let sent = call.body.to_string();
    assert!(
        !sent.contains(&org.api_key) && !sent.contains(PROVIDER_KEY),
        "{sent}"
    );
    assert_eq!(call.body["api_key"], "[redacted]");
    assert_eq!(call.body["max_tokens"], 32);
    assert_eq!(
        call.body["messages"][1]["content"],
        "my keel key is [redacted] and provider key [redacted]"
    );
    assert_eq!(
        call.body["tools"], body["tools"],
        "a JSON-Schema property named token is kept"
    );

    let traces = raw_traces(&app, &org, &project, 1).await;
    let trace = &traces[0];
    assert_eq!(trace["provider"], "openai");
    assert_eq!(trace["model"], "gpt-plain");
    assert_eq!(trace["statusCode"], 200);
    assert_eq!(trace["stream"], false);
    assert_eq!(trace["complete"], true);
    assert_eq!(
        trace["usage"],
        json!({"prompt_tokens": 24, "completion_tokens": 8, "total_tokens": 32})
    );
    assert_eq!(trace["response"]["usage"]["completion_tokens"], 8);
    assert_eq!(trace["request"]["max_tokens"], 32);
    assert!(trace["latencyMs"].as_i64().unwrap() >= 0);
    let stored = trace.to_string();
    assert!(!stored.contains(&org.api_key) && !stored.contains(PROVIDER_KEY));
}

#[actix_web::test]
async fn a_model_name_holding_nul_is_recorded_and_so_are_the_calls_around_it() {
    // `"model": "gpt\u0000evil"` decodes to a NUL, which PostgreSQL's text refuses: it must
    // cost neither its own trace nor those written in the same batch.
    let (app, _provider) = proxy_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    for model in ["gpt-plain", "gpt\u{0}evil", "gpt-plain"] {
        let response = sdk_request(&app, &org, Some(&project), &chat(model, "hi"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
    }
    let traces = raw_traces(&app, &org, &project, 3).await;
    let mut models: Vec<&str> = traces.iter().map(|t| t["model"].as_str().unwrap()).collect();
    models.sort_unstable();
    assert_eq!(models, ["gpt-plain", "gpt-plain", "gpt\u{fffd}evil"]);
}

#[actix_web::test]
async fn responses_reach_the_caller_unchanged_but_are_stored_redacted() {
    let (app, _provider) = proxy_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    let response = sdk_request(&app, &org, Some(&project), &chat("gpt-leaky", "hi"))
        .send()
        .await
        .unwrap();
    let answer: Value = json_of(response, StatusCode::OK).await;
    assert_eq!(
        answer["choices"][0]["message"]["content"],
        format!("your key is {PROVIDER_KEY}")
    );
    assert_eq!(answer["session_token"], "tok_live_abcdef");
    let trace = &raw_traces(&app, &org, &project, 1).await[0];
    let stored = &trace["response"];
    assert_eq!(
        stored["choices"][0]["message"]["content"],
        "your key is [redacted]"
    );
    assert_eq!(stored["session_token"], "[redacted]");
    assert_eq!(stored["usage"]["completion_tokens"], 6);
    assert_eq!(trace["usage"]["total_tokens"], 11);
    assert!(!trace.to_string().contains(PROVIDER_KEY));
}

#[actix_web::test]
async fn header_and_project_errors_are_as_the_spec_says() {
    let (app, provider) = proxy_app().await;
    let (org, other) = (app.create_org("Acme").await, app.create_org("Globex").await);
    let project = app.create_project(&org, "Support").await;
    let theirs = app.create_project(&other, "Theirs").await;
    let body = chat("gpt-plain", "hi");

    let detail = assert_error(
        sdk_request(&app, &org, None, &body).send().await.unwrap(),
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert!(detail.contains("X-Service-Project-Id"), "{detail}");
    for (drop, name) in [
        ("X-Service-Provider", "X-Service-Provider"),
        ("X-Service-Provider-Key", "X-Service-Provider-Key"),
    ] {
        let mut request = app
            .request(Method::POST, "/v1/chat/completions", Some(&org.api_key))
            .header("X-Service-Project-Id", &project)
            .json(&body);
        for (header, value) in [
            ("X-Service-Provider", "openai"),
            ("X-Service-Provider-Key", PROVIDER_KEY),
        ] {
            if header != drop {
                request = request.header(header, value);
            }
        }
        let detail = assert_error(request.send().await.unwrap(), StatusCode::BAD_REQUEST).await;
        assert!(detail.contains(name), "{detail}");
    }
    let unknown = sdk_request_via(&app, &org, Some(&project), "acme-ai", &body);
    assert_error(unknown.send().await.unwrap(), StatusCode::BAD_REQUEST).await;
    for bad_project in [
        theirs.as_str(),
        "not-a-uuid",
        "6f1c7c3e-0000-4000-8000-000000000000",
    ] {
        let response = sdk_request(&app, &org, Some(bad_project), &body)
            .send()
            .await
            .unwrap();
        assert_error(response, StatusCode::NOT_FOUND).await;
    }
    // Recording never creates a project.
    let projects = json_of(app.get("/api/projects", &org.api_key).await, StatusCode::OK).await;
    assert_eq!(projects.as_array().unwrap().len(), 1);
    // Credentials: none, a session, an unknown key.
    let anonymous = app
        .request(Method::POST, "/v1/chat/completions", None)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    for token in [
        org.owner_token.as_str(),
        "keel_sk_0000000000000000000000000000000000000000",
    ] {
        let response = app
            .request(Method::POST, "/v1/chat/completions", Some(token))
            .header("X-Service-Provider", "openai")
            .header("X-Service-Provider-Key", PROVIDER_KEY)
            .header("X-Service-Project-Id", &project)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    }
    let not_json = sdk_request(&app, &org, Some(&project), &body).body("not json");
    assert_error(not_json.send().await.unwrap(), StatusCode::BAD_REQUEST).await;
    assert!(provider.calls().is_empty(), "nothing rejected went upstream");

    // X-Service-Record: false proxies without the project header and records nothing.
    let unrecorded = sdk_request(&app, &org, None, &chat("gpt-plain", "off the record"))
        .header("X-Service-Record", "false")
        .send()
        .await
        .unwrap();
    assert_eq!(unrecorded.status(), StatusCode::OK);
    let recorded = sdk_request(&app, &org, Some(&project), &chat("gpt-plain", "on the record"))
        .send()
        .await
        .unwrap();
    assert_eq!(recorded.status(), StatusCode::OK);
    let traces = raw_traces(&app, &org, &project, 1).await;
    actix_web::rt::time::sleep(Duration::from_millis(100)).await;
    let traces_later = raw_traces(&app, &org, &project, 1).await;
    assert_eq!((traces.len(), traces_later.len()), (1, 1));
    assert_eq!(traces[0]["request"]["messages"][0]["content"], "on the record");
}

#[actix_web::test]
async fn each_provider_goes_to_its_own_base() {
    let (app, provider) = proxy_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    for (name, path) in [
        ("openai", "/openai/v1/chat/completions"),
        ("anthropic", "/anthropic/v1/chat/completions"),
        ("openrouter", "/openrouter/api/v1/chat/completions"),
        ("Google", "/google/v1beta/openai/chat/completions"),
    ] {
        let response = sdk_request_via(&app, &org, Some(&project), name, &chat("gpt-plain", "hi"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{name}");
        assert_eq!(provider.calls().pop().unwrap().path, path);
    }
    let traces = raw_traces(&app, &org, &project, 4).await;
    let mut providers: Vec<&str> = traces.iter().map(|t| t["provider"].as_str().unwrap()).collect();
    providers.sort_unstable();
    assert_eq!(providers, ["anthropic", "google", "openai", "openrouter"]);
}

#[actix_web::test]
async fn upstream_errors_are_relayed_and_stored_and_failures_are_502_or_504() {
    let (app, _provider) = proxy_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    let response = sdk_request(&app, &org, Some(&project), &chat("gpt-401", "hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        response.bytes().await.unwrap().as_ref(),
        fixture("error_401.json").as_slice()
    );
    let traces = raw_traces(&app, &org, &project, 1).await;
    assert_eq!(traces[0]["statusCode"], 401);
    assert_eq!(
        traces[0]["response"]["error"]["code"],
        json!(serde_json::from_slice::<Value>(&fixture("error_401.json")).unwrap()["error"]["code"])
    );

    let slow = sdk_request(&app, &org, Some(&project), &chat("gpt-slow", "hi"))
        .send()
        .await
        .unwrap();
    let detail = assert_error(slow, StatusCode::GATEWAY_TIMEOUT).await;
    assert!(!detail.contains(PROVIDER_KEY));

    let unreachable = spawn_app_with(|s| s.providers.openai_url = closed_port_url()).await;
    let org = unreachable.create_org("Acme").await;
    let project = unreachable.create_project(&org, "Support").await;
    let response = sdk_request(&unreachable, &org, Some(&project), &chat("gpt-plain", "hi"))
        .send()
        .await
        .unwrap();
    let detail = assert_error(response, StatusCode::BAD_GATEWAY).await;
    assert!(detail.contains("unreachable"), "{detail}");
}

#[actix_web::test]
async fn an_upstream_redirect_is_relayed_not_followed() {
    // A 3xx is the provider's answer like any other status: the caller gets it as it was
    // (status, Location, body) and keel does not call the new location on its own (with the
    // provider key).
    let (app, provider) = proxy_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let response = client
        .post(app.url("/v1/chat/completions"))
        .bearer_auth(&org.api_key)
        .header("X-Service-Provider", "openai")
        .header("X-Service-Provider-Key", PROVIDER_KEY)
        .header("X-Service-Project-Id", &project)
        .json(&chat("gpt-moved", "hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TEMPORARY_REDIRECT);
    assert_eq!(response.headers()["location"], "/moved/v1/chat/completions");
    assert_eq!(
        response.text().await.unwrap(),
        r#"{"error":{"message":"moved","type":"invalid_request_error"}}"#
    );
    let calls = provider.calls();
    assert_eq!(calls.len(), 1, "the redirect was not followed");
    assert_eq!(calls[0].path, "/openai/v1/chat/completions");
    let traces = raw_traces(&app, &org, &project, 1).await;
    assert_eq!(traces[0]["statusCode"], 307);
}

/// The data payloads of SSE events, as a client reads them.
fn sse_events(text: &str) -> Vec<String> {
    text.replace("\r\n", "\n")
        .split("\n\n")
        .filter_map(|event| {
            let data: Vec<&str> = event
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            (!data.is_empty()).then(|| data.join("\n"))
        })
        .collect()
}

#[actix_web::test]
async fn streams_are_relayed_frame_for_frame_and_recorded_assembled() {
    let (app, _provider) = proxy_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    for (model, file) in [
        ("stream-plain", "stream_plain_with_usage.sse"),
        ("stream-tools", "stream_two_tool_calls_no_usage.sse"),
        ("stream-crlf", "stream_router_comments_crlf.sse"),
    ] {
        let mut body = chat(model, "stream please");
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let response = sdk_request(&app, &org, Some(&project), &body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert!(response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream"));
        let bytes = response.bytes().await.unwrap();
        assert_eq!(
            bytes.as_ref(),
            fixture(file).as_slice(),
            "{model}: bytes relayed unchanged"
        );
        let events = sse_events(std::str::from_utf8(&bytes).unwrap());
        assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    }
    let traces = raw_traces(&app, &org, &project, 3).await;
    let by_model = |model: &str| traces.iter().find(|t| t["model"] == model).unwrap().clone();
    let plain = by_model("stream-plain");
    assert_eq!(
        (plain["stream"].as_bool(), plain["complete"].as_bool()),
        (Some(true), Some(true))
    );
    assert_eq!(plain["response"]["object"], "chat.completion");
    assert!(!plain["response"]["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .is_empty());
    assert!(plain["usage"]["total_tokens"].as_i64().unwrap() > 0);
    assert!(plain["ttfbMs"].is_i64());
    let tools = by_model("stream-tools");
    assert_eq!(
        tools["response"]["choices"][0]["message"]["tool_calls"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    // No usage from the provider: estimated from the text, and marked so.
    assert!(tools["usage"]["total_tokens"].as_i64().unwrap() > 0);
    assert_eq!(tools["usageEstimated"], true);
    assert_eq!(plain["usageEstimated"], false);
    assert!(by_model("stream-crlf")["usage"]["total_tokens"].as_i64().unwrap() > 0);
}

#[actix_web::test]
async fn the_first_frame_arrives_before_the_upstream_finishes() {
    let (app, provider) = proxy_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    let mut stream = open_stream(&app, &org, &project, "stream-gated", "hi").await;
    let mut received = Vec::new();
    // The upstream holds everything after its first frame until we let it go: a proxy that
    // buffered would never hand us that frame (the wait times out instead of hanging).
    while !received.windows(2).any(|w| w == b"\n\n") {
        let chunk = tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("the first frame arrived while the upstream was still open")
            .unwrap()
            .unwrap();
        received.extend_from_slice(&chunk);
    }
    let first = sse_events(&String::from_utf8(received.clone()).unwrap());
    assert_eq!(first.len(), 1);
    assert!(
        raw_traces(&app, &org, &project, 0).await.is_empty(),
        "no trace before the stream ends"
    );
    provider.gate.add_permits(1);
    while let Some(chunk) = stream.next().await {
        received.extend_from_slice(&chunk.unwrap());
    }
    // The client did not ask for usage: the provider's stream without its usage chunk
    // (keel asked for it, for the trace).
    let fixture = String::from_utf8(fixture("stream_plain_with_usage.sse")).unwrap();
    let unasked: String = fixture
        .split_inclusive("\n\n")
        .filter(|event| !event.contains("\"choices\":[]"))
        .collect();
    assert_eq!(String::from_utf8(received).unwrap(), unasked);
    let traces = raw_traces(&app, &org, &project, 1).await;
    assert_eq!(traces[0]["complete"], true);
    assert_eq!(
        traces[0]["usage"]["total_tokens"], 32,
        "the usage chunk was read for the trace"
    );
}

#[actix_web::test]
async fn a_stream_that_falls_silent_past_the_read_timeout_ends_and_keeps_a_partial_trace() {
    // The provider sends its first frame and then nothing (the gate stays shut) for longer
    // than the read timeout (1 s here): keel gives up on it, ends the client's stream
    // without its end, and records what it saw, incomplete, with the reason.
    let (app, _provider) = proxy_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    let mut stream = open_stream(&app, &org, &project, "stream-gated", "hi").await;
    let mut received = Vec::new();
    let mut broke = false;
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("keel ended the silent stream within its read timeout")
    {
        match chunk {
            Ok(chunk) => received.extend_from_slice(&chunk),
            Err(_) => {
                broke = true;
                break;
            }
        }
    }
    assert!(broke, "the client saw the stream end without its last chunk");
    // The provider's one frame, then keel's error event naming the stall.
    let events = sse_events(&String::from_utf8(received).unwrap());
    assert_eq!(events.len(), 2, "{events:?}");
    let event: Value = serde_json::from_str(&events[1]).unwrap();
    assert_eq!(event["error"]["code"], "stream_interrupted");
    let traces = raw_traces(&app, &org, &project, 1).await;
    assert_eq!(traces[0]["complete"], false);
    assert_eq!(traces[0]["statusCode"], 200);
    let error = traces[0]["error"].as_str().unwrap();
    assert!(
        error.contains("stalled") && error.contains("did not answer in time"),
        "{error}"
    );
}

#[actix_web::test]
async fn a_client_that_hangs_up_cancels_the_upstream_and_keeps_a_partial_trace() {
    let (app, provider) = proxy_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    let mut stream = open_stream(&app, &org, &project, "stream-endless", "go on").await;
    let mut received = Vec::new();
    while sse_events(&String::from_utf8_lossy(&received)).len() < 3 {
        received.extend_from_slice(&stream.next().await.unwrap().unwrap());
    }
    drop(stream);
    let cancelled = provider.cancelled.clone();
    assert!(
        eventually(|| {
            let cancelled = cancelled.clone();
            async move { cancelled.load(std::sync::atomic::Ordering::SeqCst) }
        })
        .await,
        "the upstream call was cancelled"
    );
    let traces = raw_traces(&app, &org, &project, 1).await;
    assert_eq!(traces[0]["complete"], false);
    assert!(traces[0]["response"]["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .starts_with("tick0 tick1 tick2"));
    assert!(traces[0]["error"].as_str().unwrap().contains("disconnected"));
}

/// Streamed chunks leave keel as they come: the connections it accepts have Nagle's algorithm
/// off. With it on, a chunk written while the previous one is still unacknowledged waits for
/// the client's delayed ACK (up to 40 ms on Linux): one stream's chunks bunch up.
#[actix_web::test]
async fn keel_writes_on_its_connections_with_nagle_off() {
    use std::io::{Read, Write};
    use std::os::fd::BorrowedFd;

    let app = spawn_app().await;
    let port: u16 = app.address.rsplit(':').next().unwrap().parse().unwrap();
    let nodelay = tokio::task::spawn_blocking(move || {
        let mut client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        // Answered: keel has accepted the connection and set it up.
        client
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: keel\r\n\r\n")
            .unwrap();
        let mut head = [0u8; 12];
        client.read_exact(&mut head).unwrap();
        assert_eq!(&head, b"HTTP/1.1 200");
        // keel's end of this connection (this process serves it): its socket's inode from
        // /proc/net/tcp (local port keel's, remote port the client's), then its descriptor.
        let client_port = client.local_addr().unwrap().port();
        let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap();
        let inode = tcp
            .lines()
            .skip(1)
            .find_map(|line| {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let port_of = |address: &str| u16::from_str_radix(address.rsplit(':').next()?, 16).ok();
                (port_of(fields[1]) == Some(port) && port_of(fields[2]) == Some(client_port))
                    .then(|| fields[9].to_owned())
            })
            .expect("keel's side of the connection is in /proc/net/tcp");
        let fd: i32 = std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .find(|entry| {
                std::fs::read_link(entry.path())
                    .is_ok_and(|target| target.to_string_lossy() == format!("socket:[{inode}]"))
            })
            .and_then(|entry| entry.file_name().to_str()?.parse().ok())
            .expect("keel's socket among this process's descriptors");
        // SAFETY: the descriptor stays open while it is borrowed: keel keeps the connection
        // (kept alive, the client still holds its end) for the length of this call.
        let socket = unsafe { BorrowedFd::borrow_raw(fd) };
        let nodelay = socket2::SockRef::from(&socket).tcp_nodelay().unwrap();
        drop(client);
        nodelay
    })
    .await
    .unwrap();
    assert!(nodelay, "keel's accepted connection has TCP_NODELAY set");
}

/// A provider whose keep-alive ends just as a connection's second request arrives: it
/// answers the first request on each connection, then closes the connection unanswered when
/// the next request comes (a server whose idle timer fires as the request does). Answers its
/// base URL and how many connections it accepted.
fn provider_closing_idle_connections() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    let accepted = std::sync::Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            count.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || {
                // The request's head, then as many body bytes as it announces.
                let mut request = Vec::new();
                let mut byte = [0u8; 1];
                while !request.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
                    request.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&request).to_lowercase();
                let length = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                let mut body = vec![0u8; length];
                let _ = stream.read_exact(&mut body);
                let answer = r#"{"id":"chatcmpl-1","object":"chat.completion","model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}]}"#;
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{answer}",
                    answer.len()
                );
                // The next request on this connection is met by the close.
                let _ = stream.read(&mut byte);
            });
        }
    });
    (base, accepted)
}

#[actix_web::test]
async fn a_provider_connection_idle_past_the_pool_timeout_is_not_reused() {
    // Reused after the provider's keep-alive ran out, a connection is closed under the call
    // (502 to the caller, for a call the provider never saw); keel opens a new one instead.
    let (base, accepted) = provider_closing_idle_connections();
    let app = spawn_app_with(|s| {
        s.providers.openai_url = base.clone();
        s.proxy.pool_idle_timeout_ms = 200;
    })
    .await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    // One client connection to keel, so both calls are served by the same HTTP worker (and
    // its pool of provider connections).
    let first = sdk_request(&app, &org, Some(&project), &chat("gpt-4o-mini", "hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    first.bytes().await.unwrap();
    actix_web::rt::time::sleep(Duration::from_millis(600)).await;
    let second = sdk_request(&app, &org, Some(&project), &chat("gpt-4o-mini", "again"))
        .send()
        .await
        .unwrap();
    assert_eq!(second.status(), StatusCode::OK, "not sent on the idle connection");
    assert_eq!(
        accepted.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "a connection of its own"
    );
}

#[actix_web::test]
async fn calls_that_miss_the_cache_at_once_share_one_look_up() {
    let (app, _provider) = proxy_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    let loads =
        |text: &str, cache: &str| metric(text, &format!("keel_cache_loads_total{{cache=\"{cache}\"}}"));
    let before = app.metrics_text().await;

    // On PostgreSQL the key's table is locked, so every call's look-up is in flight at once
    // (on SQLite the calls merely arrive together).
    let lock = if postgres() {
        use sea_orm::{ConnectionTrait, TransactionTrait};
        let db = sea_orm::Database::connect(app.db_url.as_str()).await.unwrap();
        let txn = db.begin().await.unwrap();
        txn.execute_unprepared("LOCK TABLE api_keys IN ACCESS EXCLUSIVE MODE")
            .await
            .unwrap();
        Some((db, txn))
    } else {
        None
    };
    let calls: Vec<_> = (0..40)
        .map(|i| {
            let call = sdk_request(
                &app,
                &org,
                Some(&project),
                &chat("gpt-4o-mini", &format!("hi {i}")),
            )
            .send();
            actix_web::rt::spawn(call)
        })
        .collect();
    if let Some((db, txn)) = lock {
        actix_web::rt::time::sleep(Duration::from_millis(500)).await;
        txn.commit().await.unwrap();
        db.close().await.ok();
    }
    for call in calls {
        assert_eq!(call.await.unwrap().unwrap().status(), StatusCode::OK);
    }

    let after = app.metrics_text().await;
    for cache in ["api_keys", "projects"] {
        assert_eq!(
            loads(&after, cache) - loads(&before, cache),
            1.0,
            "{cache}:\n{after}"
        );
    }
    // Remembered: the next call looks nothing up.
    let next = sdk_request(&app, &org, Some(&project), &chat("gpt-4o-mini", "again"))
        .send()
        .await
        .unwrap();
    assert_eq!(next.status(), StatusCode::OK);
    let last = app.metrics_text().await;
    assert_eq!(loads(&last, "api_keys"), loads(&after, "api_keys"));
    assert_eq!(loads(&last, "adapters"), 0.0);
}
