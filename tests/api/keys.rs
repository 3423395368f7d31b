//! API keys people can hand out safely (issue 43): settings on a key (limits, scopes, models,
//! expiry), enforced on the proxy and the relay before any provider is called, on the JSON API,
//! serving authorize and the console; last use; two instances sharing the limits.

use std::time::Duration;

use futures_util::StreamExt;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::*;
use crate::proxy::{chat, proxy_app, sdk_request, PROVIDER_KEY};

/// A key of `org` made by its owner with `settings`: (id, secret).
pub async fn key_with(app: &TestApp, org: &TestOrg, settings: Value) -> (String, String) {
    let created = json_of(
        app.post(
            &format!("/api/api-keys?orgId={}", org.org_id),
            &org.owner_token,
            &settings,
        )
        .await,
        StatusCode::CREATED,
    )
    .await;
    (
        created["apiKeyId"].as_str().unwrap().to_owned(),
        created["key"].as_str().unwrap().to_owned(),
    )
}

async fn key_view(app: &TestApp, org: &TestOrg, key_id: &str) -> Value {
    let list = json_of(
        app.get(&format!("/api/api-keys?orgId={}", org.org_id), &org.owner_token)
            .await,
        StatusCode::OK,
    )
    .await;
    list["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["apiKeyId"] == key_id)
        .cloned()
        .expect("the key is listed")
}

async fn patch_key(
    app: &TestApp,
    org: &TestOrg,
    key_id: &str,
    token: &str,
    body: &Value,
) -> reqwest::Response {
    app.request(
        Method::PATCH,
        &format!("/api/api-keys/{key_id}?orgId={}", org.org_id),
        Some(token),
    )
    .json(body)
    .send()
    .await
    .unwrap()
}

fn relay(app: &TestApp, key: &str, method: Method, path: &str) -> reqwest::RequestBuilder {
    app.request(method, path, Some(key))
        .header("X-Service-Provider", "openai")
        .header("X-Service-Provider-Key", PROVIDER_KEY)
}

/// The OpenAI-shaped error of a proxied or relayed call: (status, error.type, error.code).
async fn openai_error(response: reqwest::Response) -> (StatusCode, String, String, Option<String>) {
    let status = response.status();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let body: Value = response.json().await.unwrap();
    (
        status,
        body["error"]["type"].as_str().unwrap_or_default().to_owned(),
        body["error"]["code"].as_str().unwrap_or_default().to_owned(),
        retry_after,
    )
}

#[actix_web::test]
async fn settings_round_trip_change_one_by_one_and_clear_with_null() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let expires = (chrono::Utc::now() + chrono::Duration::days(30)).to_rfc3339();
    let (key_id, _) = key_with(
        &app,
        &org,
        json!({"name": "eval harness", "limits": {"requestsPerMinute": 60, "tokensPerDay": 100000, "concurrentStreams": 2},
               "scopes": ["inference"], "models": ["gpt-4o-mini", "gpt-4o"], "expiresAt": expires}),
    )
    .await;
    let view = key_view(&app, &org, &key_id).await;
    assert_eq!(view["name"], "eval harness");
    assert_eq!(
        view["limits"],
        json!({"requestsPerMinute": 60, "tokensPerDay": 100000, "concurrentStreams": 2})
    );
    assert_eq!(view["scopes"], json!(["inference"]));
    assert_eq!(view["models"], json!(["gpt-4o-mini", "gpt-4o"]));
    assert!(view["expiresAt"].is_string());
    assert_eq!(view["lastUsedAt"], Value::Null);
    assert_eq!(view["usageToday"], json!({"requests": 0, "tokens": 0}));

    // One limit changes alone; the others stay.
    let changed = json_of(
        patch_key(
            &app,
            &org,
            &key_id,
            &org.owner_token,
            &json!({"limits": {"requestsPerMinute": 10}}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        changed["limits"],
        json!({"requestsPerMinute": 10, "tokensPerDay": 100000, "concurrentStreams": 2})
    );
    let changed = json_of(
        patch_key(
            &app,
            &org,
            &key_id,
            &org.owner_token,
            &json!({"limits": {"tokensPerDay": null}}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        changed["limits"],
        json!({"requestsPerMinute": 10, "tokensPerDay": null, "concurrentStreams": 2})
    );
    // null clears: no limits, scopes back to both, any model, never expires.
    let cleared = json_of(
        patch_key(
            &app,
            &org,
            &key_id,
            &org.owner_token,
            &json!({"limits": null, "scopes": null, "models": null, "expiresAt": null, "name": null}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        cleared["limits"],
        json!({"requestsPerMinute": null, "tokensPerDay": null, "concurrentStreams": null})
    );
    assert_eq!(cleared["scopes"], json!(["inference", "api"]));
    assert_eq!(cleared["models"], Value::Null);
    assert_eq!(cleared["expiresAt"], Value::Null);
    assert_eq!(cleared["name"], Value::Null);

    // A key made with no settings behaves as keys always did, and shows so.
    let plain = key_view(&app, &org, &org.api_key_id).await;
    assert_eq!(plain["scopes"], json!(["inference", "api"]));
    assert_eq!(plain["models"], Value::Null);

    // Only an owner's session changes a key; another organization's key is 404.
    let other = app.create_org("Globex").await;
    assert_error(
        patch_key(&app, &org, &key_id, &org.member_token, &json!({"name": "x"})).await,
        StatusCode::FORBIDDEN,
    )
    .await;
    assert_error(
        patch_key(&app, &org, &key_id, &org.api_key, &json!({"name": "x"})).await,
        StatusCode::FORBIDDEN,
    )
    .await;
    let foreign = app
        .request(
            Method::PATCH,
            &format!("/api/api-keys/{}?orgId={}", other.api_key_id, org.org_id),
            Some(&org.owner_token),
        )
        .json(&json!({"name": "mine now"}))
        .send()
        .await
        .unwrap();
    assert_error(foreign, StatusCode::NOT_FOUND).await;
    // A revoked key cannot be changed.
    app.request(
        Method::DELETE,
        &format!("/api/api-keys/{key_id}?orgId={}", org.org_id),
        Some(&org.owner_token),
    )
    .send()
    .await
    .unwrap();
    assert_error(
        patch_key(&app, &org, &key_id, &org.owner_token, &json!({"name": "x"})).await,
        StatusCode::NOT_FOUND,
    )
    .await;
}

#[actix_web::test]
async fn bad_settings_are_422() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let past = (chrono::Utc::now() - chrono::Duration::minutes(1)).to_rfc3339();
    let bad = [
        json!({"scopes": ["inference", "admin"]}),
        json!({"scopes": []}),
        json!({"limits": {"requestsPerMinute": 0}}),
        json!({"limits": {"concurrentStreams": -1}}),
        json!({"limits": {"tokensPerDay": "many"}}),
        json!({"limits": {"perHour": 5}}),
        // An array is no object, whatever serde would make of it.
        json!({"limits": [5, null, null]}),
        json!({"limits": [null, null]}),
        json!({"models": []}),
        json!({"models": [""]}),
        json!({"expiresAt": past}),
        json!({"expiresAt": "tomorrow"}),
        json!({"colour": "blue"}),
    ];
    for body in &bad {
        let response = app
            .post(
                &format!("/api/api-keys?orgId={}", org.org_id),
                &org.owner_token,
                body,
            )
            .await;
        assert_eq!(
            response.status(),
            StatusCode::UNPROCESSABLE_ENTITY,
            "create {body}"
        );
        let issues = validation_issues(response).await;
        assert!(!issues.is_empty(), "{body}");
        let patched = patch_key(&app, &org, &org.api_key_id, &org.owner_token, body).await;
        assert_eq!(patched.status(), StatusCode::UNPROCESSABLE_ENTITY, "patch {body}");
    }
    // The past expiry names its field.
    let response = app
        .post(
            &format!("/api/api-keys?orgId={}", org.org_id),
            &org.owner_token,
            &json!({"expiresAt": past}),
        )
        .await;
    let issues = validation_issues(response).await;
    assert_eq!(issues[0]["loc"], json!(["body", "expiresAt"]));
}

#[actix_web::test]
async fn scopes_hold_on_the_json_api_the_proxy_the_relay_serving_and_the_console() {
    let (app, _provider) = proxy_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "scoped").await;
    let (_, inference) = key_with(&app, &org, json!({"scopes": ["inference"]})).await;
    let (_, api) = key_with(&app, &org, json!({"scopes": ["api"]})).await;

    // inference only: the proxy and the relay, not the JSON API (403 scope_not_allowed).
    let proxied = sdk_request(
        &app,
        &org.with_key(&inference),
        Some(&project),
        &chat("gpt-4o-mini", "hi"),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(proxied.status(), StatusCode::OK);
    let relayed = relay(&app, &inference, Method::GET, "/v1/models")
        .send()
        .await
        .unwrap();
    assert_eq!(relayed.status(), StatusCode::OK);
    let listed = app.get("/api/projects", &inference).await;
    assert_eq!(listed.status(), StatusCode::FORBIDDEN);
    let body: Value = listed.json().await.unwrap();
    assert_eq!(body["code"], "scope_not_allowed");
    assert_eq!(
        app.get("/api/auth/verify", &inference).await.status(),
        StatusCode::FORBIDDEN
    );

    // api only: the JSON API, not the proxy, the relay or serving authorize (403).
    assert_eq!(app.get("/api/projects", &api).await.status(), StatusCode::OK);
    let (status, kind, code, _) = openai_error(
        sdk_request(
            &app,
            &org.with_key(&api),
            Some(&project),
            &chat("gpt-4o-mini", "hi"),
        )
        .send()
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(
        (status, kind.as_str(), code.as_str()),
        (StatusCode::FORBIDDEN, "permission_error", "scope_not_allowed")
    );
    let (status, _, code, _) = openai_error(
        relay(&app, &api, Method::POST, "/v1/embeddings")
            .json(&json!({"model": "text-embedding-3-small", "input": "x"}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (status, code.as_str()),
        (StatusCode::FORBIDDEN, "scope_not_allowed")
    );
    let authorize = |key: String| {
        let app = &app;
        async move {
            app.post(
                "/api/serving/authorize",
                INTERNAL_KEY,
                &json!({"apiKey": key, "adapterId": "meta-llama/Llama-3.1-8B-Instruct"}),
            )
            .await
        }
    };
    assert_eq!(authorize(api.clone()).await.status(), StatusCode::FORBIDDEN);
    assert_ne!(authorize(inference.clone()).await.status(), StatusCode::FORBIDDEN);

    // The console takes the api scope only.
    let signin = |key: String| {
        let app = &app;
        async move {
            no_redirects()
                .post(app.url("/console/login"))
                .form(&[("credential", key.as_str())])
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    assert_eq!(signin(inference).await, StatusCode::UNAUTHORIZED);
    assert!(signin(api).await.is_redirection());
}

#[actix_web::test]
async fn an_expired_key_is_401_everywhere() {
    let (app, provider) = proxy_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "expiring").await;
    let soon = (chrono::Utc::now() + chrono::Duration::milliseconds(1500)).to_rfc3339();
    let (key_id, key) = key_with(&app, &org, json!({"expiresAt": soon})).await;
    // Works until then (and is cached by the proxy meanwhile).
    let ok = sdk_request(
        &app,
        &org.with_key(&key),
        Some(&project),
        &chat("gpt-4o-mini", "hi"),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    assert_eq!(app.get("/api/projects", &key).await.status(), StatusCode::OK);
    actix_web::rt::time::sleep(Duration::from_millis(1700)).await;
    let calls_before = provider.calls().len();

    let (status, kind, _, _) = openai_error(
        sdk_request(
            &app,
            &org.with_key(&key),
            Some(&project),
            &chat("gpt-4o-mini", "hi"),
        )
        .send()
        .await
        .unwrap(),
    )
    .await;
    assert_eq!(
        (status, kind.as_str()),
        (StatusCode::UNAUTHORIZED, "authentication_error")
    );
    let relayed = relay(&app, &key, Method::GET, "/v1/models").send().await.unwrap();
    assert_eq!(relayed.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(provider.calls().len(), calls_before, "no provider was called");
    assert_eq!(
        app.get("/api/projects", &key).await.status(),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        app.get("/api/auth/verify", &key).await.status(),
        StatusCode::UNAUTHORIZED
    );
    let authorized = app
        .post(
            "/api/serving/authorize",
            INTERNAL_KEY,
            &json!({"apiKey": key, "adapterId": "meta-llama/Llama-3.1-8B-Instruct"}),
        )
        .await;
    assert_eq!(authorized.status(), StatusCode::UNAUTHORIZED);
    let signin = no_redirects()
        .post(app.url("/console/login"))
        .form(&[("credential", key.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(signin.status(), StatusCode::UNAUTHORIZED);
    // Giving it a new expiry in the future brings it back.
    let later = (chrono::Utc::now() + chrono::Duration::days(1)).to_rfc3339();
    json_of(
        patch_key(
            &app,
            &org,
            &key_id,
            &org.owner_token,
            &json!({"expiresAt": later}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(app.get("/api/projects", &key).await.status(), StatusCode::OK);
}

#[actix_web::test]
async fn a_model_list_admits_only_its_models_on_the_proxy_and_the_relay() {
    let (app, provider) = proxy_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "models").await;
    let (key_id, key) = key_with(
        &app,
        &org,
        json!({"models": ["gpt-4o-mini", "text-embedding-3-small"]}),
    )
    .await;
    let caller = org.with_key(&key);
    let ok = sdk_request(&app, &caller, Some(&project), &chat("gpt-4o-mini", "hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), StatusCode::OK);
    let before = provider.calls().len();
    let (status, kind, code, _) = openai_error(
        sdk_request(&app, &caller, Some(&project), &chat("gpt-4o", "hi"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (status, kind.as_str(), code.as_str()),
        (StatusCode::FORBIDDEN, "permission_error", "model_not_allowed")
    );
    // The relay: a JSON body's model is checked; a read runs no model; a call that would run
    // one without naming it is refused.
    let embedded = relay(&app, &key, Method::POST, "/v1/embeddings")
        .json(&json!({"model": "text-embedding-3-small", "input": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(embedded.status(), StatusCode::OK);
    let other = relay(&app, &key, Method::POST, "/v1/embeddings")
        .json(&json!({"model": "text-embedding-3-large", "input": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(openai_error(other).await.2, "model_not_allowed");
    let unnamed = relay(&app, &key, Method::POST, "/v1/batches")
        .json(&json!({"input_file_id": "file-1", "endpoint": "/v1/chat/completions"}))
        .send()
        .await
        .unwrap();
    assert_eq!(unnamed.status(), StatusCode::FORBIDDEN);
    assert_eq!(
        relay(&app, &key, Method::GET, "/v1/models")
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    // Refused calls never reached the provider (the embeddings and the models list did).
    assert_eq!(provider.calls().len(), before + 2);
    // Cleared, any model goes.
    json_of(
        patch_key(&app, &org, &key_id, &org.owner_token, &json!({"models": null})).await,
        StatusCode::OK,
    )
    .await;
    let any = sdk_request(&app, &caller, Some(&project), &chat("gpt-4o", "hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(any.status(), StatusCode::OK);
}

#[actix_web::test]
async fn requests_per_minute_is_a_shared_bucket_over_the_proxy_and_the_relay() {
    let (app, provider) = proxy_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "limited").await;
    let (_, key) = key_with(&app, &org, json!({"limits": {"requestsPerMinute": 3}})).await;
    let caller = org.with_key(&key);
    for _ in 0..2 {
        let ok = sdk_request(&app, &caller, Some(&project), &chat("gpt-4o-mini", "hi"))
            .send()
            .await
            .unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
    }
    let relayed = relay(&app, &key, Method::GET, "/v1/models").send().await.unwrap();
    assert_eq!(relayed.status(), StatusCode::OK);
    let before = provider.calls().len();
    let (status, kind, code, retry_after) = openai_error(
        sdk_request(&app, &caller, Some(&project), &chat("gpt-4o-mini", "hi"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(
        (status, kind.as_str(), code.as_str()),
        (
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_exceeded",
            "rate_limit_exceeded"
        )
    );
    // One request refills in 20 s (3 a minute).
    let retry_after: u64 = retry_after.expect("Retry-After").parse().unwrap();
    assert!((1..=20).contains(&retry_after), "{retry_after}");
    let (status, ..) = openai_error(relay(&app, &key, Method::GET, "/v1/models").send().await.unwrap()).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(provider.calls().len(), before, "refused calls reach no provider");
    // The organization's other keys are not limited by this one.
    let free = sdk_request(&app, &org, Some(&project), &chat("gpt-4o-mini", "hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(free.status(), StatusCode::OK);
    let metrics = app.metrics_text().await;
    assert_eq!(
        metric(
            &metrics,
            "keel_proxy_limited_total{limit=\"requests_per_minute\"}"
        ),
        2.0
    );
    assert_eq!(
        metric(&metrics, "keel_proxy_limited_total{limit=\"tokens_per_day\"}"),
        0.0
    );
}

#[actix_web::test]
async fn tokens_per_day_counts_recorded_tokens_and_last_use_is_shown() {
    let (app, _provider) = proxy_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "tokens").await;
    // The fake's plain completion uses 32 tokens: two calls pass 40.
    let (key_id, key) = key_with(&app, &org, json!({"limits": {"tokensPerDay": 40}})).await;
    let caller = org.with_key(&key);
    let first = sdk_request(&app, &caller, Some(&project), &chat("gpt-4o-mini", "hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), StatusCode::OK);
    // The first call's tokens are counted as its answer ends; a call that starts under the
    // limit completes (and takes the key past it).
    let mut passed = 1;
    let refused = loop {
        let response = sdk_request(&app, &caller, Some(&project), &chat("gpt-4o-mini", "hi"))
            .send()
            .await
            .unwrap();
        if response.status() != StatusCode::OK {
            break response;
        }
        passed += 1;
        assert!(passed <= 2, "a third call passed a limit of 40 tokens");
        actix_web::rt::time::sleep(Duration::from_millis(100)).await;
    };
    let (status, kind, _, retry_after) = openai_error(refused).await;
    assert_eq!(
        (status, kind.as_str()),
        (StatusCode::TOO_MANY_REQUESTS, "rate_limit_exceeded")
    );
    assert!(retry_after.unwrap().parse::<u64>().unwrap() <= 86_400);
    assert!(
        eventually(|| async {
            let view = key_view(&app, &org, &key_id).await;
            view["usageToday"]["tokens"].as_i64() == Some(32 * passed)
                && view["usageToday"]["requests"].as_i64() == Some(passed)
                && view["lastUsedAt"].is_string()
        })
        .await,
        "{}",
        key_view(&app, &org, &key_id).await
    );
    let metrics = app.metrics_text().await;
    assert_eq!(
        metric(&metrics, "keel_proxy_limited_total{limit=\"tokens_per_day\"}"),
        1.0
    );
    // The day's tokens are used: the relay is refused too, once they are written (a limit
    // read then adds nothing counted here), and a refused call counts for nothing.
    let first_use = key_view(&app, &org, &key_id).await["lastUsedAt"].clone();
    let models = relay(&app, &key, Method::GET, "/v1/models").send().await.unwrap();
    let (status, kind, _, _) = openai_error(models).await;
    assert_eq!(
        (status, kind.as_str()),
        (StatusCode::TOO_MANY_REQUESTS, "rate_limit_exceeded")
    );
    // Raising the limit lets it through again at once.
    json_of(
        patch_key(
            &app,
            &org,
            &key_id,
            &org.owner_token,
            &json!({"limits": {"tokensPerDay": 1000}}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    let again = relay(&app, &key, Method::GET, "/v1/models").send().await.unwrap();
    assert_eq!(again.status(), StatusCode::OK);
    // Last use is written at most once a minute per key and instance: later calls within the
    // minute (counted, once the next second's flush has run) leave it as it was.
    assert!(
        eventually(|| async {
            key_view(&app, &org, &key_id).await["usageToday"]["requests"].as_i64() == Some(passed + 1)
        })
        .await
    );
    assert_eq!(key_view(&app, &org, &key_id).await["lastUsedAt"], first_use);
    assert_eq!(
        metric(
            &app.metrics_text().await,
            "keel_proxy_limited_total{limit=\"tokens_per_day\"}"
        ),
        2.0
    );
}

#[actix_web::test]
async fn tokens_per_day_counts_each_call_as_its_answer_ends_recorded_or_not_proxied_or_relayed() {
    let (app, _provider) = proxy_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "tokens").await;
    // A limit of 40 and calls of 32 tokens: back to back, the second passes (32 < 40) and
    // the third is refused, whatever the calls are.
    for recorded in [false, true] {
        let (_, key) = key_with(&app, &org, json!({"limits": {"tokensPerDay": 40}})).await;
        let caller = org.with_key(&key);
        let send = || {
            let request = sdk_request(&app, &caller, Some(&project), &chat("gpt-4o-mini", "hi"));
            match recorded {
                true => request.send(),
                false => request.header("X-Service-Record", "false").send(),
            }
        };
        for n in 1..=2 {
            let response = send().await.unwrap();
            assert_eq!(response.status(), StatusCode::OK, "recorded {recorded}: call {n}");
            response.text().await.unwrap();
        }
        let (status, kind, _, _) = openai_error(send().await.unwrap()).await;
        assert_eq!(
            (status, kind.as_str()),
            (StatusCode::TOO_MANY_REQUESTS, "rate_limit_exceeded"),
            "recorded {recorded}: the third call"
        );
    }
    // An unrecorded stream is counted from its usage chunk (which keel asked for and takes
    // out of what the client gets), read as it passes.
    let (stream_key_id, stream_key) = key_with(&app, &org, json!({"limits": {"tokensPerDay": 40}})).await;
    let caller = org.with_key(&stream_key);
    let mut body = chat("stream-plain", "hi");
    body["stream"] = json!(true);
    let stream = || {
        sdk_request(&app, &caller, None, &body)
            .header("X-Service-Record", "false")
            .send()
    };
    for n in 1..=2 {
        let response = stream().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "stream {n}");
        let text = response.text().await.unwrap();
        assert!(
            text.contains("[DONE]") && !text.contains("\"choices\":[]"),
            "{text}"
        );
    }
    assert_eq!(stream().await.unwrap().status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(
        eventually(|| async {
            key_view(&app, &org, &stream_key_id).await["usageToday"]["tokens"].as_i64() == Some(64)
        })
        .await
    );

    // Relayed: embeddings count `usage.prompt_tokens` (8), responses `input_tokens` +
    // `output_tokens` (25 as JSON; 12 streamed).
    let (relay_key_id, relay_key) = key_with(&app, &org, json!({"limits": {"tokensPerDay": 40}})).await;
    let embed = || {
        relay(&app, &relay_key, Method::POST, "/v1/embeddings")
            .json(&json!({"model": "text-embedding-3-small", "input": "hi"}))
            .send()
    };
    let respond = |stream: bool| {
        relay(&app, &relay_key, Method::POST, "/v1/responses")
            .json(&json!({"model": "gpt-4o-mini", "input": "hi", "stream": stream}))
            .send()
    };
    assert_eq!(embed().await.unwrap().status(), StatusCode::OK);
    let streamed = respond(true).await.unwrap();
    assert_eq!(streamed.status(), StatusCode::OK);
    assert!(streamed.text().await.unwrap().contains("response.completed"));
    assert_eq!(respond(false).await.unwrap().status(), StatusCode::OK);
    // 8 + 12 + 25 = 45 of 40: the next relayed call is refused.
    let (status, _, _, _) = openai_error(embed().await.unwrap()).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    assert!(
        eventually(|| async {
            key_view(&app, &org, &relay_key_id).await["usageToday"]["tokens"].as_i64() == Some(45)
        })
        .await,
        "{}",
        key_view(&app, &org, &relay_key_id).await
    );
}

#[actix_web::test]
async fn concurrent_streams_are_counted_until_they_end() {
    let (app, _provider) = proxy_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "streams").await;
    let (_, key) = key_with(&app, &org, json!({"limits": {"concurrentStreams": 1}})).await;
    let caller = org.with_key(&key);
    let streamed = |model: &str| {
        let mut body = chat(model, "count");
        body["stream"] = json!(true);
        sdk_request(&app, &caller, Some(&project), &body).send()
    };
    let open = streamed("stream-endless").await.unwrap();
    assert_eq!(open.status(), StatusCode::OK);
    let mut open = open.bytes_stream();
    assert!(open.next().await.unwrap().is_ok());
    let (status, kind, _, retry_after) = openai_error(streamed("stream-plain").await.unwrap()).await;
    assert_eq!(
        (status, kind.as_str()),
        (StatusCode::TOO_MANY_REQUESTS, "rate_limit_exceeded")
    );
    assert_eq!(retry_after.as_deref(), Some("1"));
    // A call that is not a stream is not counted.
    let plain = sdk_request(&app, &caller, Some(&project), &chat("gpt-4o-mini", "hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(plain.status(), StatusCode::OK);
    // The stream ends (the client leaves): its place is given back.
    drop(open);
    assert!(
        eventually(|| async {
            let response = streamed("stream-plain").await.unwrap();
            response.status() == StatusCode::OK && response.bytes().await.is_ok()
        })
        .await
    );
    let metrics = app.metrics_text().await;
    assert!(metric(&metrics, "keel_proxy_limited_total{limit=\"concurrent_streams\"}") >= 1.0);
}

#[actix_web::test]
async fn two_instances_share_a_keys_limits() {
    if !postgres_or_skip() {
        return;
    }
    let (_provider, url) = crate::fakes::FakeProvider::start();
    let to_fake = move |s: &mut keel_core::config::Settings| {
        s.providers.openai_url = format!("{url}/openai/v1");
        s.traces.flush_ms = 20;
    };
    let first = spawn_app_with(to_fake.clone()).await;
    let mut settings = test_settings(&first.db_url);
    to_fake(&mut settings);
    let second = spawn_on(TestDb::reuse(&first.db_url), settings).await;
    let org = first.create_org("Acme").await;
    let project = first.create_project(&org, "shared").await;
    let (_, key) = key_with(
        &first,
        &org,
        json!({"limits": {"requestsPerMinute": 5, "concurrentStreams": 1}}),
    )
    .await;
    let caller = org.with_key(&key);

    // Twenty calls alternating between the instances, four at a time: five pass.
    let mut calls = Vec::new();
    for i in 0..20 {
        let app = if i % 2 == 0 { &first } else { &second };
        calls.push(sdk_request(app, &caller, Some(&project), &chat("gpt-4o-mini", "hi")).send());
    }
    let mut passed = 0;
    for chunk in calls.chunks_mut(4) {
        for call in chunk {
            let response = call.await.unwrap();
            match response.status() {
                StatusCode::OK => passed += 1,
                StatusCode::TOO_MANY_REQUESTS => {}
                other => panic!("{other}"),
            }
        }
    }
    // At most one call per instance over the limit (this bucket hands out one at a time: none).
    assert!(
        (5..=7).contains(&passed),
        "{passed} calls passed a limit of 5 a minute"
    );

    // A stream open on one instance counts on the other.
    let (_, streamer) = key_with(&first, &org, json!({"limits": {"concurrentStreams": 1}})).await;
    let streamer = org.with_key(&streamer);
    let mut body = chat("stream-endless", "count");
    body["stream"] = json!(true);
    let open = sdk_request(&first, &streamer, Some(&project), &body)
        .send()
        .await
        .unwrap();
    assert_eq!(open.status(), StatusCode::OK);
    let mut open = open.bytes_stream();
    assert!(open.next().await.unwrap().is_ok());
    let other = sdk_request(&second, &streamer, Some(&project), &body)
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), StatusCode::TOO_MANY_REQUESTS);
    drop(open);
    second.stop().await;
}

#[actix_web::test]
async fn the_console_creates_and_edits_a_keys_settings_and_shows_its_use_against_them() {
    use crate::console::{org_path, Console};
    let (app, _provider) = proxy_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "console").await;
    let owner = Console::sign_in(&app, &org.owner_token).await;
    let created = owner
        .post(
            &org_path(&org, "/keys"),
            &[
                ("name", "harness"),
                ("requestsPerMinute", "5"),
                ("tokensPerDay", "1000"),
                ("concurrentStreams", ""),
                ("scopes-shown", "1"),
                ("scope", "inference"),
                ("models", "gpt-4o-mini, gpt-4o"),
                ("expiresOn", "2031-01-31T12:30"),
            ],
        )
        .await;
    assert_eq!(created.status(), StatusCode::SEE_OTHER);
    let shown_at = created.headers()["location"].to_str().unwrap().to_owned();
    let html = owner.page(&shown_at).await;
    let secret = html
        .split("id=\"new-key\" class=\"secret\">")
        .nth(1)
        .and_then(|rest| rest.split('<').next())
        .expect("the new key")
        .to_owned();
    let list = json_of(app.get("/api/api-keys", &org.owner_token).await, StatusCode::OK).await;
    let key = list["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["name"] == "harness")
        .cloned()
        .unwrap();
    assert_eq!(
        key["limits"],
        json!({"requestsPerMinute": 5, "tokensPerDay": 1000, "concurrentStreams": null})
    );
    assert_eq!(key["scopes"], json!(["inference"]));
    assert_eq!(key["models"], json!(["gpt-4o-mini", "gpt-4o"]));
    assert_eq!(key["expiresAt"], "2031-01-31T12:30:00Z");
    let key_id = key["apiKeyId"].as_str().unwrap().to_owned();

    // A call with it: the page shows today's use against the limits, and the last use.
    let call = sdk_request(
        &app,
        &org.with_key(&secret),
        Some(&project),
        &chat("gpt-4o-mini", "hi"),
    )
    .send()
    .await
    .unwrap();
    assert_eq!(call.status(), StatusCode::OK);
    assert!(
        eventually(|| async {
            let view = key_view(&app, &org, &key_id).await;
            view["usageToday"]["tokens"] == 32 && view["lastUsedAt"].is_string()
        })
        .await
    );
    let html = owner.page(&org_path(&org, "/keys")).await;
    let row = html
        .split(&format!("data-key=\"{key_id}\""))
        .nth(1)
        .and_then(|rest| rest.split("</tr>").next())
        .unwrap()
        .to_owned();
    assert!(row.contains("at most 5 a minute"), "{row}");
    assert!(row.contains("32 <span class=\"muted\">of 1,000</span>"), "{row}");
    assert!(row.contains("gpt-4o-mini, gpt-4o"), "{row}");
    assert!(!row.contains("<td class=\"last-used\">—</td>"), "{row}");

    // Edited: the empty fields clear theirs.
    let edited = owner
        .post(
            &org_path(&org, &format!("/keys/{key_id}/edit")),
            &[
                ("name", "harness"),
                ("requestsPerMinute", "10"),
                ("tokensPerDay", ""),
                ("scopes-shown", "1"),
                ("scope", "inference"),
                ("scope", "api"),
                ("models", ""),
                ("expiresOn", ""),
            ],
        )
        .await;
    assert_eq!(edited.status(), StatusCode::SEE_OTHER);
    let view = key_view(&app, &org, &key_id).await;
    assert_eq!(
        view["limits"],
        json!({"requestsPerMinute": 10, "tokensPerDay": null, "concurrentStreams": null})
    );
    assert_eq!(view["scopes"], json!(["inference", "api"]));
    assert_eq!(view["models"], Value::Null);
    assert_eq!(view["expiresAt"], Value::Null);
    // A bad setting is said on the page, and changes nothing.
    let page = owner
        .submit(
            &org_path(&org, &format!("/keys/{key_id}/edit")),
            &[
                ("requestsPerMinute", "0"),
                ("scopes-shown", "1"),
                ("scope", "api"),
            ],
        )
        .await;
    assert!(
        page.contains("flash error") && page.contains("requestsPerMinute"),
        "the refusal is shown"
    );
    assert_eq!(
        key_view(&app, &org, &key_id).await["limits"]["requestsPerMinute"],
        10
    );
    // A member sees the page but no forms.
    let member = Console::sign_in(&app, &org.member_token).await;
    let html = member.page(&org_path(&org, "/keys")).await;
    assert!(!html.contains("/edit\""), "a member gets no edit form");
}
