//! Streams that fail (issue 37): cut however their body was delimited, stalled, errors in
//! the stream, odd content types. A failure is visible to the client (an OpenAI-shaped error
//! event, then an aborted body), to the operator (metric, log) and in the trace, and a broken
//! stream is never training data.

use std::time::Duration;

use futures_util::StreamExt;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::fakes::RawProvider;
use crate::helpers::*;
use crate::proxy::{raw_traces, sdk_request};

async fn raw_app(read_timeout_secs: u64) -> (TestApp, RawProvider) {
    let (provider, url) = RawProvider::start();
    let app = spawn_app_with(|s| {
        s.providers.openai_url = format!("{url}/v1");
        s.traces.flush_ms = 20;
        s.proxy.read_timeout_secs = read_timeout_secs;
    })
    .await;
    (app, provider)
}

/// A streamed call of `model`: the bytes that arrived, and whether the body ended cleanly.
async fn streamed(app: &TestApp, org: &TestOrg, project: &str, model: &str) -> (String, bool) {
    let body = json!({"model": model, "stream": true, "messages": [{"role": "user", "content": "count"}]});
    let response = sdk_request(app, org, Some(project), &body).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK, "{model}");
    let mut stream = response.bytes_stream();
    let mut received = Vec::new();
    let mut clean = true;
    while let Some(chunk) = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("the stream ends")
    {
        match chunk {
            Ok(bytes) => received.extend_from_slice(&bytes),
            Err(_) => {
                clean = false;
                break;
            }
        }
    }
    (String::from_utf8(received).unwrap(), clean)
}

fn frames(text: &str) -> Vec<String> {
    text.split("\n\n")
        .filter(|f| !f.trim().is_empty())
        .map(str::to_owned)
        .collect()
}

#[actix_web::test]
async fn a_cut_stream_ends_with_an_error_event_and_an_aborted_body_and_is_recorded_broken() {
    let (app, _provider) = raw_app(30).await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    let three: String = ["tok0 ", "tok1 ", "tok2 "]
        .iter()
        .map(|t| crate::fakes::chunk_frame(t))
        .collect();
    for model in ["cut-close", "cut-chunked", "cut-sized"] {
        let (text, clean) = streamed(&app, &org, &project, model).await;
        assert!(!clean, "{model}: the body was aborted, not ended: {text:?}");
        assert!(
            text.starts_with(&three),
            "{model}: the provider's frames as they came: {text:?}"
        );
        assert!(!text.contains("data: [DONE]"), "{model}");
        let last = frames(&text).pop().unwrap();
        let event: Value = serde_json::from_str(last.strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(event["error"]["code"], "stream_interrupted", "{model}");
        assert_eq!(event["error"]["type"], "upstream_error");
        assert!(event["error"]["message"].as_str().unwrap().contains("provider"));
    }
    let traces = raw_traces(&app, &org, &project, 3).await;
    for trace in &traces {
        assert_eq!(trace["complete"], false, "{trace}");
        let error = trace["error"].as_str().unwrap();
        assert!(
            error.contains("broke off") || error.contains("ended before [DONE]"),
            "{error}"
        );
        assert_eq!(
            trace["response"]["choices"][0]["message"]["content"],
            "tok0 tok1 tok2 "
        );
    }
    let metrics = app.metrics_text().await;
    assert_eq!(
        metric(
            &metrics,
            r#"keel_proxy_upstream_errors_total{class="stream",provider="openai"}"#
        ),
        3.0
    );

    // Never training data: the formats skip them, status=ok leaves them out, raw keeps them.
    for format in ["records", "prompts"] {
        let body = json_of(
            app.get(
                &format!("/api/traces/export?project_id={project}&format={format}"),
                &org.api_key,
            )
            .await,
            StatusCode::OK,
        )
        .await;
        assert_eq!(
            (body["count"].as_u64(), body["skipped"].as_u64()),
            (Some(0), Some(3)),
            "{format}"
        );
    }
    let ok = json_of(
        app.get(
            &format!("/api/traces/export?project_id={project}&format=raw&status=ok"),
            &org.api_key,
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(ok["count"], 0);
    let broken = json_of(
        app.get(
            &format!("/api/traces/export?project_id={project}&format=raw&status=error"),
            &org.api_key,
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(broken["count"], 3);
}

#[actix_web::test]
async fn a_stall_errors_in_band_and_odd_answers_are_told_apart() {
    let (app, provider) = raw_app(1).await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;

    // Silent past the read timeout: the error event names the stall.
    let (text, clean) = streamed(&app, &org, &project, "silent").await;
    assert!(!clean);
    assert!(text.contains("stalled"), "{text}");

    // The provider's own error frame then [DONE]: relayed as it came, recorded as an error.
    let (text, clean) = streamed(&app, &org, &project, "error-frame").await;
    assert!(clean && text.ends_with("data: [DONE]\n\n"), "{text}");
    assert!(!text.contains("stream_interrupted"));

    // A whole stream under `Text/Event-Stream`: an event stream all the same.
    let (text, clean) = streamed(&app, &org, &project, "odd-case").await;
    assert!(clean && text.contains("[DONE]"));
    // No content type, or NDJSON: relayed as they came, never training data.
    for model in ["no-type", "ndjson"] {
        let (text, clean) = streamed(&app, &org, &project, model).await;
        assert!(clean && text.contains("tok2"), "{model}");
    }
    // A JSON error answering a streamed request.
    let body = json!({"model": "json-error", "stream": true, "messages": [{"role": "user", "content": "x"}]});
    let answered = sdk_request(&app, &org, Some(&project), &body)
        .send()
        .await
        .unwrap();
    assert_eq!(answered.status(), StatusCode::OK);
    assert!(answered.text().await.unwrap().contains("rate_limit_exceeded"));

    let traces = raw_traces(&app, &org, &project, 6).await;
    let by_model = |model: &str| -> Value {
        let position = provider
            .models
            .lock()
            .unwrap()
            .iter()
            .position(|m| m == model)
            .unwrap();
        // Traces are newest first; calls were made one after another.
        traces[traces.len() - 1 - position].clone()
    };
    let silent = by_model("silent");
    assert_eq!(silent["complete"], false);
    assert!(silent["error"].as_str().unwrap().contains("stalled"), "{silent}");
    let in_band = by_model("error-frame");
    assert_eq!(
        in_band["complete"], false,
        "an error frame then [DONE] is not complete"
    );
    assert!(
        in_band["error"].as_str().unwrap().contains("server had an error"),
        "{in_band}"
    );
    let odd = by_model("odd-case");
    assert_eq!(
        (odd["complete"].clone(), odd["error"].clone()),
        (json!(true), Value::Null),
        "{odd}"
    );
    assert_eq!(
        odd["response"]["choices"][0]["message"]["content"],
        "tok0 tok1 tok2 "
    );
    for model in ["no-type", "ndjson"] {
        let trace = by_model(model);
        assert_eq!(trace["complete"], false, "{model}: {trace}");
        assert!(
            trace["error"].as_str().unwrap().contains("not an event stream"),
            "{model}: {trace}"
        );
    }
    let json_error = by_model("json-error");
    assert!(
        json_error["error"]
            .as_str()
            .unwrap()
            .contains("Rate limit reached"),
        "{json_error}"
    );
}

#[actix_web::test]
async fn a_client_that_leaves_while_the_provider_is_silent_ends_the_call_within_a_second() {
    let (app, provider) = raw_app(300).await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    let body = json!({"model": "silent", "stream": true, "messages": [{"role": "user", "content": "x"}]});
    let response = sdk_request(&app, &org, Some(&project), &body)
        .send()
        .await
        .unwrap();
    let mut stream = response.bytes_stream();
    let first = stream.next().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("tok0"));
    let left = std::time::Instant::now();
    drop(stream);
    let closed = provider.closed_at.clone();
    assert!(
        eventually(|| {
            let closed = closed.clone();
            async move { !closed.lock().unwrap().is_empty() }
        })
        .await,
        "the provider's connection was closed"
    );
    let at = closed.lock().unwrap()[0];
    assert!(
        at.duration_since(left) < Duration::from_secs(1),
        "{:?}",
        at.duration_since(left)
    );
    let traces = raw_traces(&app, &org, &project, 1).await;
    assert!(traces[0]["error"].as_str().unwrap().contains("disconnected"));
}

#[actix_web::test]
async fn every_stream_records_its_usage_and_the_client_sees_what_it_asked_for() {
    let (app, provider) = raw_app(30).await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    let three: String = ["tok0 ", "tok1 ", "tok2 "]
        .iter()
        .map(|t| crate::fakes::chunk_frame(t))
        .collect();

    // The client did not ask for usage: keel asked, and took the usage chunk out.
    let (text, clean) = streamed(&app, &org, &project, "whole").await;
    assert!(clean);
    assert_eq!(
        text,
        three.clone() + crate::fakes::FINISH + "data: [DONE]\n\n",
        "exactly what the provider sends unasked"
    );
    let forwarded = provider.bodies.lock().unwrap()[0].clone();
    assert_eq!(forwarded["stream_options"], json!({"include_usage": true}));

    // The client asked: it gets the usage chunk, and its body travels as it was.
    let body = json!({"model": "whole", "stream": true, "stream_options": {"include_usage": true},
                      "messages": [{"role": "user", "content": "count"}]});
    let asked = sdk_request(&app, &org, Some(&project), &body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        asked,
        three.clone() + crate::fakes::FINISH + crate::fakes::USAGE + "data: [DONE]\n\n"
    );

    // A provider that never says: estimated from the text, and marked so.
    let (_, clean) = streamed(&app, &org, &project, "no-usage").await;
    assert!(clean);

    let traces = raw_traces(&app, &org, &project, 3).await;
    // Newest first: no-usage, asked, whole.
    let (estimated, asked, whole) = (&traces[0], &traces[1], &traces[2]);
    for trace in [whole, asked] {
        assert_eq!(
            trace["usage"],
            json!({"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}),
            "{trace}"
        );
        assert_eq!(trace["usageEstimated"], false);
    }
    assert!(
        whole["request"].get("stream_options").is_none(),
        "the client's request is stored: {whole}"
    );
    assert_eq!(estimated["usageEstimated"], true, "{estimated}");
    let prompt = estimated["usage"]["prompt_tokens"].as_i64().unwrap();
    let completion = estimated["usage"]["completion_tokens"].as_i64().unwrap();
    assert!(prompt > 0 && (3..=12).contains(&completion), "{estimated}");
    assert_eq!(
        estimated["usage"]["total_tokens"].as_i64().unwrap(),
        prompt + completion
    );
    // The token metric counts the streams too.
    let metrics = app.metrics_text().await;
    assert!(
        metric(
            &metrics,
            r#"keel_proxy_tokens_total{kind="completion",model="whole",provider="openai"}"#
        ) >= 8.0
    );
}

#[actix_web::test]
async fn a_client_that_stops_reading_is_let_go_with_the_providers_call() {
    let (provider, url) = RawProvider::start();
    let app = spawn_app_with(|s| {
        s.providers.openai_url = format!("{url}/v1");
        s.traces.flush_ms = 20;
        s.proxy.client_write_timeout_secs = 1;
    })
    .await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    // A client that sends its request and then reads nothing (its window fills).
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let addr: std::net::SocketAddr = app.address.trim_start_matches("http://").parse().unwrap();
    socket.connect(&addr.into()).unwrap();
    let mut client: std::net::TcpStream = socket.into();
    let body = json!({"model": "firehose", "stream": true, "messages": [{"role": "user", "content": "x"}]})
        .to_string();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {}\r\nX-Service-Provider: openai\r\nX-Service-Provider-Key: sk-x\r\nX-Service-Project-Id: {project}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        org.api_key,
        body.len()
    );
    std::io::Write::write_all(&mut client, request.as_bytes()).unwrap();
    let started = std::time::Instant::now();
    let closed = provider.closed_at.clone();
    let mut ended = false;
    for _ in 0..300 {
        if !closed.lock().unwrap().is_empty() {
            ended = true;
            break;
        }
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        ended,
        "the provider's call still runs after {:?}",
        started.elapsed()
    );
    let traces = raw_traces(&app, &org, &project, 1).await;
    let error = traces[0]["error"].as_str().unwrap();
    assert!(error.contains("stopped reading"), "{error}");
    assert_eq!(traces[0]["complete"], false);
    drop(client);
}

#[actix_web::test]
async fn a_json_error_answered_with_200_is_recorded_as_an_error() {
    let (app, _provider) = raw_app(30).await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    let body = json!({"model": "json-error", "messages": [{"role": "user", "content": "x"}]});
    let answered = sdk_request(&app, &org, Some(&project), &body)
        .send()
        .await
        .unwrap();
    assert_eq!(answered.status(), StatusCode::OK);
    assert!(
        answered.text().await.unwrap().contains("rate_limit_exceeded"),
        "relayed as it came"
    );
    let traces = raw_traces(&app, &org, &project, 1).await;
    assert_eq!(traces[0]["complete"], false);
    assert!(
        traces[0]["error"]
            .as_str()
            .unwrap()
            .contains("Rate limit reached"),
        "{}",
        traces[0]
    );
}
