//! Every other `/v1` call of the OpenAI SDK relayed to the provider: JSON (redacted),
//! streams, multipart uploads, GETs with a query; errors in OpenAI's shape; nothing recorded.

use std::time::Duration;

use futures_util::StreamExt;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::fakes::{closed_port_url, fixture};
use crate::helpers::*;
use crate::proxy::{proxy_app, PROVIDER_KEY};

fn v1(app: &TestApp, org: &TestOrg, method: Method, path: &str) -> reqwest::RequestBuilder {
    app.request(method, path, Some(&org.api_key))
        .header("X-Service-Provider", "openai")
        .header("X-Service-Provider-Key", PROVIDER_KEY)
        .header("user-agent", "OpenAI/Python 1.54.0")
}

#[actix_web::test]
async fn embeddings_models_streams_and_uploads_reach_the_provider_and_nothing_is_recorded() {
    let (app, provider) = proxy_app().await;
    let org = app.create_org("Acme").await;

    // JSON: relayed to <base>/embeddings, the keel key taken out of the body.
    let embedded = v1(&app, &org, Method::POST, "/v1/embeddings")
        .json(&json!({"model": "text-embedding-3-small", "input": format!("my key is {}", org.api_key)}))
        .send()
        .await
        .unwrap();
    assert_eq!(embedded.status(), StatusCode::OK);
    let body: Value = embedded.json().await.unwrap();
    assert_eq!(body["data"][0]["embedding"], json!([0.0023, -0.0093, 0.0158]));

    // A GET with a query, as client.models.list() sends it.
    let models = v1(&app, &org, Method::GET, "/v1/models?limit=2")
        .send()
        .await
        .unwrap();
    assert_eq!(models.status(), StatusCode::OK);
    assert_eq!(
        models.headers()["x-request-id"],
        "req_models",
        "the provider's headers come back"
    );
    // ...and keel's own id beside it, the one keel logs.
    let keel_id = models.headers()["x-keel-request-id"].to_str().unwrap();
    assert!(uuid::Uuid::parse_str(keel_id).is_ok(), "{keel_id}");
    let listed: Value = models.json().await.unwrap();
    assert_eq!(listed["data"][0]["id"], "gpt-4o-mini");

    // A streamed responses call: the provider's bytes, unchanged.
    let streamed = v1(&app, &org, Method::POST, "/v1/responses")
        .json(&json!({"model": "stream-plain", "input": "hi", "stream": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(streamed.status(), StatusCode::OK);
    assert!(streamed.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    assert_eq!(
        streamed.bytes().await.unwrap(),
        fixture("stream_plain_with_usage.sse")
    );

    // A multipart upload travels byte for byte, boundary included.
    let boundary = "----keelBoundary7MA4YWxkTrZu0gW";
    let mut upload = Vec::new();
    upload.extend_from_slice(
        format!("--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nfine-tune\r\n")
            .as_bytes(),
    );
    upload.extend_from_slice(
        format!("--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"train.jsonl\"\r\nContent-Type: application/octet-stream\r\n\r\n").as_bytes(),
    );
    upload.extend_from_slice(b"{\"messages\": []}\n\x00\xff\xfe binary tail");
    upload.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    let uploaded = v1(&app, &org, Method::POST, "/v1/files")
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(upload.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(uploaded.status(), StatusCode::OK);

    let calls = provider.calls();
    let embeddings = calls
        .iter()
        .find(|c| c.path == "/openai/v1/embeddings")
        .expect("embeddings relayed");
    assert_eq!(embeddings.method, "POST");
    assert_eq!(embeddings.body["input"], "my key is [redacted]");
    assert_eq!(
        embeddings.authorization.as_deref(),
        Some(format!("Bearer {PROVIDER_KEY}").as_str())
    );
    let listed = calls
        .iter()
        .find(|c| c.path == "/openai/v1/models")
        .expect("models relayed");
    assert_eq!(
        (listed.method.as_str(), listed.query.as_str()),
        ("GET", "limit=2")
    );
    assert!(calls.iter().any(|c| c.path == "/openai/v1/responses"));
    let file = calls
        .iter()
        .find(|c| c.path == "/openai/v1/files")
        .expect("upload relayed");
    assert_eq!(file.raw, upload, "multipart untouched");
    assert_eq!(
        file.headers["content-type"],
        format!("multipart/form-data; boundary={boundary}")
    );
    for call in &calls {
        for (name, value) in &call.headers {
            assert!(
                !value.contains(&org.api_key),
                "the keel key never travels upstream ({name})"
            );
            assert!(
                !name.starts_with("x-service-"),
                "keel's own headers stay here ({name})"
            );
        }
    }

    // Not recorded: the trace writer was never handed anything.
    let metrics = app.metrics_text().await;
    assert!(metrics.contains("keel_traces_recorded_total 0"), "{metrics}");
}

#[actix_web::test]
async fn errors_keel_answers_under_v1_are_openai_shaped_and_say_what_to_do() {
    let (app, _provider) = proxy_app().await;
    let org = app.create_org("Acme").await;
    let error_of = |response: reqwest::Response, status: StatusCode| async move {
        assert_eq!(response.status(), status);
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["detail"], body["error"]["message"], "{body}");
        assert!(body["error"]["param"].is_null());
        body
    };
    let no_provider = app
        .request(Method::POST, "/v1/embeddings", Some(&org.api_key))
        .header("X-Service-Provider-Key", PROVIDER_KEY)
        .json(&json!({"model": "m", "input": "x"}))
        .send()
        .await
        .unwrap();
    let body = error_of(no_provider, StatusCode::BAD_REQUEST).await;
    assert!(
        body["detail"].as_str().unwrap().contains("X-Service-Provider"),
        "{body}"
    );
    assert_eq!(body["error"]["code"], "missing_header");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    let no_key = app
        .request(Method::GET, "/v1/models", Some(&org.api_key))
        .header("X-Service-Provider", "openai")
        .send()
        .await
        .unwrap();
    let body = error_of(no_key, StatusCode::BAD_REQUEST).await;
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("X-Service-Provider-Key"),
        "{body}"
    );
    let no_keel_key = app
        .request(Method::GET, "/v1/models", None)
        .header("X-Service-Provider", "openai")
        .header("X-Service-Provider-Key", PROVIDER_KEY)
        .send()
        .await
        .unwrap();
    let body = error_of(no_keel_key, StatusCode::UNAUTHORIZED).await;
    assert_eq!(body["error"]["type"], "authentication_error");
    // Chat completions answer the same shape.
    let chat_without_project = v1(&app, &org, Method::POST, "/v1/chat/completions")
        .json(&json!({"model": "gpt-plain", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    let body = error_of(chat_without_project, StatusCode::BAD_REQUEST).await;
    assert!(body["detail"].as_str().unwrap().contains("X-Service-Project-Id"));

    // An unreachable provider: which provider and why, never where keel reaches it, never a key.
    let unreachable_base = format!("{}/v1", closed_port_url());
    let down = spawn_app_with(|s| s.providers.openai_url = unreachable_base.clone()).await;
    let org = down.create_org("Acme").await;
    let failed = v1(&down, &org, Method::POST, "/v1/embeddings")
        .json(&json!({"model": "m", "input": "x"}))
        .send()
        .await
        .unwrap();
    let body = error_of(failed, StatusCode::BAD_GATEWAY).await;
    let message = body["detail"].as_str().unwrap();
    assert!(
        message.contains("openai") && message.contains("unreachable") && !message.contains(&unreachable_base),
        "{message}"
    );
    assert!(!message.contains(PROVIDER_KEY) && !message.contains(&org.api_key));
}

#[actix_web::test]
async fn a_client_that_hangs_up_cancels_the_relayed_call() {
    let (app, provider) = proxy_app().await;
    let org = app.create_org("Acme").await;
    let response = v1(&app, &org, Method::POST, "/v1/responses")
        .json(&json!({"model": "stream-endless", "input": "hi", "stream": true}))
        .send()
        .await
        .unwrap();
    let mut body = response.bytes_stream();
    let first = body.next().await.expect("a first chunk").unwrap();
    assert!(String::from_utf8_lossy(&first).contains("tick0"));
    drop(body);
    let cancelled = provider.cancelled.clone();
    assert!(
        eventually(|| {
            let cancelled = cancelled.clone();
            async move { cancelled.load(std::sync::atomic::Ordering::SeqCst) }
        })
        .await,
        "the provider's stream was dropped"
    );
    actix_web::rt::time::sleep(Duration::from_millis(10)).await;
}

#[actix_web::test]
async fn keys_in_a_relayed_url_never_reach_the_provider() {
    let (app, provider) = proxy_app().await;
    let org = app.create_org("Acme").await;
    let key = org.api_key.clone();
    for path in [
        format!("/v1/models?key={key}"),
        format!("/v1/models?limit=2&api_key={PROVIDER_KEY}&after=m"),
        format!("/v1/{key}/x"),
        format!("/v1/files/{}", key.replace('_', "%5F")),
    ] {
        // Whatever the provider makes of the path, the call reached it.
        let _ = v1(&app, &org, Method::GET, &path).send().await.unwrap();
    }
    let calls = provider.calls();
    assert_eq!(calls.len(), 4, "{calls:?}");
    for call in &calls {
        let url = format!("{}?{}", call.path, call.query);
        assert!(!url.contains(&key) && !url.contains(PROVIDER_KEY), "{url}");
        assert!(!url.contains(&key.replace('_', "%5F")), "{url}");
    }
    assert_eq!(calls[0].query, "");
    assert_eq!(calls[1].query, "limit=2&after=m");
    assert_eq!(calls[2].path, "/openai/v1/%5Bredacted%5D/x");
    assert_eq!(calls[3].path, "/openai/v1/files/%5Bredacted%5D");
}

/// A request written by hand on a connection of its own, its path exactly as given (a
/// client would resolve `..` before sending); answers the status line's code and the body.
async fn raw_request(app: &TestApp, org: &TestOrg, method: &str, path: &str, body: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = app
        .url("")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: {address}\r\nauthorization: Bearer {}\r\nx-service-provider: openai\r\n\
         x-service-provider-key: {PROVIDER_KEY}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        org.api_key,
        body.len()
    );
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.unwrap();
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    (status, body)
}

#[actix_web::test]
async fn dot_segments_and_duplicate_keys_are_refused_before_the_provider_is_called() {
    let (app, provider) = proxy_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "dupes").await;
    for path in [
        "/v1/../../secret/x",
        "/v1/files/../../admin",
        "/v1/./models",
        "/v1/%2e%2e/%2E%2E/secret",
        "/v1/files/%2e/x",
    ] {
        let (status, body) = raw_request(&app, &org, "GET", path, "").await;
        assert_eq!(status, 400, "{path}: {body}");
        assert!(body.contains("segments"), "{path}: {body}");
    }
    // A file name with dots that is not a dot segment is relayed.
    let (status, _) = raw_request(&app, &org, "GET", "/v1/files/train..jsonl", "").await;
    assert_ne!(status, 400);

    // A duplicate top-level key: the allow-list would check one `model`, the provider run
    // the other. Refused on the proxy and the relay, for every key.
    let duplicated =
        r#"{"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "model": "gpt-4o"}"#;
    let calls_before = provider.calls().len();
    let (status, body) = raw_request(&app, &org, "POST", "/v1/embeddings", duplicated).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("twice"), "{body}");
    let proxied = app
        .request(Method::POST, "/v1/chat/completions", Some(&org.api_key))
        .header("X-Service-Provider", "openai")
        .header("X-Service-Provider-Key", PROVIDER_KEY)
        .header("X-Service-Project-Id", &project)
        .header("content-type", "application/json")
        .body(duplicated)
        .send()
        .await
        .unwrap();
    assert_eq!(proxied.status(), StatusCode::BAD_REQUEST);
    let body: Value = proxied.json().await.unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    assert_eq!(
        provider.calls().len(),
        calls_before,
        "the provider was not called"
    );

    // OpenRouter's fallback list is held to a key's models too.
    let limited = json_of(
        app.post(
            &format!("/api/api-keys?orgId={}", org.org_id),
            &org.owner_token,
            &json!({"models": ["gpt-4o-mini", "meta-llama/llama-3.1-8b-instruct"]}),
        )
        .await,
        StatusCode::CREATED,
    )
    .await["key"]
        .as_str()
        .unwrap()
        .to_owned();
    let caller = org.with_key(&limited);
    let fallback = |models: Value| {
        let body = json!({"model": "gpt-4o-mini", "models": models, "messages": [{"role": "user", "content": "hi"}]});
        crate::proxy::sdk_request_via(&app, &caller, Some(&project), "openrouter", &body).send()
    };
    let refused = fallback(json!([
        "meta-llama/llama-3.1-8b-instruct",
        "anthropic/claude-3.5-sonnet"
    ]))
    .await
    .unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["code"], "model_not_allowed", "{body}");
    assert!(body["detail"].as_str().unwrap().contains("claude"), "{body}");
    let allowed = fallback(json!(["meta-llama/llama-3.1-8b-instruct"]))
        .await
        .unwrap();
    assert_eq!(allowed.status(), StatusCode::OK);
    // On the relay as well.
    let relayed = app
        .request(Method::POST, "/v1/completions", Some(&limited))
        .header("X-Service-Provider", "openrouter")
        .header("X-Service-Provider-Key", PROVIDER_KEY)
        .json(&json!({"model": "gpt-4o-mini", "models": ["x-ai/grok"], "prompt": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(relayed.status(), StatusCode::FORBIDDEN);
}
