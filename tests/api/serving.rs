//! Serving: authorize (ownership rules), teardown through the serving layer, sample.

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::fakes::{closed_port_url, FakeJson, Reply};
use crate::helpers::*;

const AUTHORIZE: &str = "/api/serving/authorize";
const BASE_MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

async fn put_adapter(app: &TestApp, org: &TestOrg, adapter_id: &str, live: bool) {
    let response = app
        .put(
            &format!("/api/internal/adapters/{adapter_id}"),
            INTERNAL_KEY,
            &json!({"orgId": org.org_id, "baseModel": BASE_MODEL, "live": live}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
}

async fn authorize(app: &TestApp, api_key: &str, adapter_id: &str) -> reqwest::Response {
    app.post(
        AUTHORIZE,
        INTERNAL_KEY,
        &json!({"apiKey": api_key, "adapterId": adapter_id}),
    )
    .await
}

#[actix_web::test]
async fn authorize_requires_the_keys_organization_to_own_the_adapter() {
    let app = spawn_app().await;
    let (acme, globex) = (app.create_org("Acme").await, app.create_org("Globex").await);
    put_adapter(&app, &acme, "acme/support-bot", true).await;

    let ok = json_of(
        authorize(&app, &acme.api_key, "acme/support-bot").await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        ok,
        json!({"orgId": acme.org_id, "adapterId": "acme/support-bot", "baseModel": BASE_MODEL})
    );
    // A valid key alone is not enough on a shared endpoint.
    assert_error(
        authorize(&app, &globex.api_key, "acme/support-bot").await,
        StatusCode::FORBIDDEN,
    )
    .await;
    assert_error(
        authorize(&app, &acme.api_key, "acme/unknown").await,
        StatusCode::NOT_FOUND,
    )
    .await;
    // A priced base model: any valid key, billed to the caller.
    for org in [&acme, &globex] {
        let body = json_of(authorize(&app, &org.api_key, BASE_MODEL).await, StatusCode::OK).await;
        assert_eq!(body["orgId"], json!(org.org_id));
        assert_eq!(body["baseModel"], BASE_MODEL);
    }
    // Unpriced model ids are not served without an adapter.
    assert_error(
        authorize(&app, &acme.api_key, "gpt-unknown").await,
        StatusCode::NOT_FOUND,
    )
    .await;
}

/// A key of `org` with `settings` (its secret).
async fn key_with(app: &TestApp, org: &TestOrg, settings: Value) -> String {
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
    created["key"].as_str().unwrap().to_owned()
}

#[actix_web::test]
async fn authorize_holds_a_keys_models_and_request_limits() {
    let app = spawn_app().await;
    let acme = app.create_org("Acme").await;
    put_adapter(&app, &acme, "acme/support-bot", true).await;
    // Limited to another model: neither the base model nor an adapter on it.
    let mini = key_with(&app, &acme, json!({"models": ["gpt-4o-mini"]})).await;
    for model in [BASE_MODEL, "acme/support-bot"] {
        let refused = authorize(&app, &mini, model).await;
        assert_eq!(refused.status(), StatusCode::FORBIDDEN, "{model}");
        let body: Value = refused.json().await.unwrap();
        assert_eq!(body["code"], "model_not_allowed", "{body}");
        assert!(body["detail"].is_string());
    }
    // The adapter's id, or its base model, allows it.
    for listed in ["acme/support-bot", BASE_MODEL] {
        let key = key_with(&app, &acme, json!({"models": [listed]})).await;
        assert_eq!(
            authorize(&app, &key, "acme/support-bot").await.status(),
            StatusCode::OK,
            "{listed}"
        );
    }
    // requestsPerMinute: 10 pass, the 11th is 429 with Retry-After in the /api body.
    let limited = key_with(&app, &acme, json!({"limits": {"requestsPerMinute": 10}})).await;
    for n in 1..=10 {
        assert_eq!(
            authorize(&app, &limited, BASE_MODEL).await.status(),
            StatusCode::OK,
            "call {n}"
        );
    }
    let refused = authorize(&app, &limited, BASE_MODEL).await;
    assert_eq!(refused.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["code"], "rate_limit_exceeded", "{body}");
}

#[actix_web::test]
async fn authorize_rejects_invalid_and_revoked_keys_and_non_internal_callers() {
    let app = spawn_app().await;
    let acme = app.create_org("Acme").await;
    for bad in [
        "keel_sk_0000000000000000000000000000000000000000",
        "not-a-key",
        &acme.owner_token,
    ] {
        assert_error(authorize(&app, bad, BASE_MODEL).await, StatusCode::UNAUTHORIZED).await;
    }
    let revoked = app
        .delete(
            &format!("/api/internal/api-keys/{}", acme.api_key_id),
            INTERNAL_KEY,
        )
        .await;
    assert_eq!(revoked.status(), StatusCode::OK);
    assert_error(
        authorize(&app, &acme.api_key, BASE_MODEL).await,
        StatusCode::UNAUTHORIZED,
    )
    .await;

    let fresh = app.create_org("Globex").await;
    let body = json!({"apiKey": fresh.api_key, "adapterId": BASE_MODEL});
    // Only the serving layer (internal key) may ask.
    assert_error(
        app.post(AUTHORIZE, &fresh.api_key, &body).await,
        StatusCode::FORBIDDEN,
    )
    .await;
    let anonymous = app
        .request(Method::POST, AUTHORIZE, None)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous.status(), StatusCode::UNAUTHORIZED);
    let issues = validation_issues(
        app.post(AUTHORIZE, INTERNAL_KEY, &json!({"apiKey": fresh.api_key}))
            .await,
    )
    .await;
    assert_eq!(issues[0]["loc"], json!(["body", "adapterId"]));
    assert_eq!(issues[0]["type"], "missing");
}

fn serving_fake() -> (FakeJson, String) {
    FakeJson::start(|call| match (call.method.as_str(), call.path.as_str()) {
        ("DELETE", "/v1/adapters/acme/bad-bot") => Reply::Json(500, json!({"error": "gpu node down"})),
        ("DELETE", "/v1/adapters/acme/gone-bot") => Reply::Json(404, json!({"error": "not deployed"})),
        ("DELETE", _) => Reply::Json(200, json!({"undeployed": 2})),
        ("POST", "/v1/chat/completions") => match call.body["model"].as_str() {
            Some("acme/slow-bot") => Reply::Hang,
            Some("acme/broken-bot") => Reply::Json(503, json!({"error": "overloaded"})),
            _ => Reply::Json(
                200,
                serde_json::from_str(include_str!("../fixtures/chat/completion_plain.json")).unwrap(),
            ),
        },
        _ => Reply::Json(404, json!({})),
    })
}

#[actix_web::test]
async fn teardown_undeploys_each_live_adapter_best_effort_and_owner_only() {
    let (serving, url) = serving_fake();
    let app = spawn_app_with(|s| s.serving.url = format!("{url}/v1")).await;
    let (acme, globex) = (app.create_org("Acme").await, app.create_org("Globex").await);
    put_adapter(&app, &acme, "acme/support-bot", true).await;
    put_adapter(&app, &acme, "acme/bad-bot", true).await;
    put_adapter(&app, &acme, "acme/gone-bot", true).await;
    put_adapter(&app, &acme, "acme/idle-bot", false).await;
    put_adapter(&app, &globex, "globex/bot", true).await;
    let body = json!({"orgId": acme.org_id});

    for token in [&acme.member_token, &acme.api_key, &globex.owner_token] {
        assert_error(
            app.post("/api/serving/teardown", token, &body).await,
            StatusCode::FORBIDDEN,
        )
        .await;
    }
    assert!(serving.calls().is_empty());

    let report = json_of(
        app.post("/api/serving/teardown", &acme.owner_token, &body).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        report,
        json!({
            "undeployed": 2,
            "failed": 1,
            "adapters": {"acme/support-bot": 2, "acme/bad-bot": 0, "acme/gone-bot": 0}
        })
    );
    let calls = serving.calls();
    let mut paths: Vec<&str> = calls.iter().map(|c| c.path.as_str()).collect();
    paths.sort_unstable();
    assert_eq!(
        paths,
        [
            "/v1/adapters/acme/bad-bot",
            "/v1/adapters/acme/gone-bot",
            "/v1/adapters/acme/support-bot"
        ]
    );
    assert!(calls
        .iter()
        .all(|c| c.method == "DELETE" && c.authorization.as_deref() == Some("Bearer test-internal-key")));

    // Undeployed adapters are no longer live; the failed one is tried again.
    let again = json_of(
        app.post("/api/serving/teardown", &acme.owner_token, &body).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        again,
        json!({"undeployed": 0, "failed": 1, "adapters": {"acme/bad-bot": 0}})
    );
    // Another organization's adapter was never touched.
    assert!(serving.calls().iter().all(|c| !c.path.contains("globex")));
}

#[actix_web::test]
async fn teardown_without_a_serving_layer_is_503_unless_nothing_is_live() {
    let app = spawn_app().await;
    let acme = app.create_org("Acme").await;
    let body = json!({"orgId": acme.org_id});
    let empty = json_of(
        app.post("/api/serving/teardown", &acme.owner_token, &body).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(empty, json!({"undeployed": 0, "failed": 0, "adapters": {}}));
    put_adapter(&app, &acme, "acme/support-bot", true).await;
    assert_error(
        app.post("/api/serving/teardown", &acme.owner_token, &body).await,
        StatusCode::SERVICE_UNAVAILABLE,
    )
    .await;
}

#[actix_web::test]
async fn sample_is_for_the_internal_key_and_reaches_any_served_model() {
    let (serving, url) = serving_fake();
    let app = spawn_app_with(|s| s.serving.url = format!("{url}/v1/")).await;
    let (acme, globex) = (app.create_org("Acme").await, app.create_org("Globex").await);
    put_adapter(&app, &acme, "acme/support-bot", true).await;
    put_adapter(&app, &globex, "globex/helper", true).await;
    let request = json!({
        "model": "acme/support-bot",
        "messages": [{"role": "user", "content": "Capital of France?"}],
        "max_tokens": 16,
        "temperature": 0.2
    });

    let answer = json_of(
        app.post("/api/sample", INTERNAL_KEY, &request).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(answer["output"], "Paris is the capital of France.");
    assert_eq!(answer["model"], "gpt-4o-mini-2024-07-18");
    assert_eq!(answer["usage"]["total_tokens"], 32);
    let call = serving.calls().pop().unwrap();
    assert_eq!(
        (call.method.as_str(), call.path.as_str()),
        ("POST", "/v1/chat/completions")
    );
    assert_eq!(call.authorization.as_deref(), Some("Bearer test-internal-key"));
    // The serving layer is told whose adapter it is.
    assert_eq!(call.headers.get("x-org-id"), Some(&acme.org_id));
    assert_eq!(call.body["model"], "acme/support-bot");
    assert_eq!(call.body["max_tokens"], 16);
    assert_eq!(call.body["messages"][0]["content"], "Capital of France?");

    // Any organization's adapter, and a priced base model (for no organization).
    let mut other = request.clone();
    other["model"] = json!("globex/helper");
    assert_eq!(
        app.post("/api/sample", INTERNAL_KEY, &other).await.status(),
        StatusCode::OK
    );
    assert_eq!(
        serving.calls().pop().unwrap().headers.get("x-org-id"),
        Some(&globex.org_id)
    );
    let mut base = request.clone();
    base["model"] = json!(BASE_MODEL);
    assert_eq!(
        app.post("/api/sample", INTERNAL_KEY, &base).await.status(),
        StatusCode::OK
    );
    assert_eq!(serving.calls().pop().unwrap().headers.get("x-org-id"), None);
    let mut unknown = request.clone();
    unknown["model"] = json!("acme/nope");
    assert_error(
        app.post("/api/sample", INTERNAL_KEY, &unknown).await,
        StatusCode::NOT_FOUND,
    )
    .await;

    // A user credential is 403, even for the user's own adapter, and nothing is called.
    let before = serving.calls().len();
    for token in [&acme.api_key, &acme.member_token, &acme.owner_token] {
        assert_error(
            app.post("/api/sample", token, &request).await,
            StatusCode::FORBIDDEN,
        )
        .await;
    }
    assert_eq!(serving.calls().len(), before);
    assert_error(
        app.post("/api/sample", "not-a-key", &request).await,
        StatusCode::UNAUTHORIZED,
    )
    .await;

    for (body, field) in [
        (json!({"model": BASE_MODEL, "messages": []}), "messages"),
        (
            json!({"model": BASE_MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": 3}),
            "temperature",
        ),
        (
            json!({"model": BASE_MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 0}),
            "max_tokens",
        ),
        (json!({"messages": [{"role": "user", "content": "x"}]}), "model"),
    ] {
        let issues = validation_issues(app.post("/api/sample", INTERNAL_KEY, &body).await).await;
        assert_eq!(issues[0]["loc"], json!(["body", field]), "{body}");
    }
}

async fn sample_error(app: &TestApp, model: &str) -> Value {
    let request = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
    json_of(
        app.post("/api/sample", INTERNAL_KEY, &request).await,
        StatusCode::INTERNAL_SERVER_ERROR,
    )
    .await
}

#[actix_web::test]
async fn sample_failures_are_500_sample_errors_and_never_hang() {
    let (_serving, url) = serving_fake();
    let app = spawn_app_with(|s| {
        s.serving.url = format!("{url}/v1");
        s.serving.timeout_ms = 300;
    })
    .await;
    let acme = app.create_org("Acme").await;
    put_adapter(&app, &acme, "acme/slow-bot", true).await;
    put_adapter(&app, &acme, "acme/broken-bot", true).await;

    let slow = sample_error(&app, "acme/slow-bot").await;
    assert_eq!(slow["error"], "serving_timeout");
    assert!(slow["detail"].as_str().unwrap().contains("in time"));
    let broken = sample_error(&app, "acme/broken-bot").await;
    assert_eq!(broken["error"], "serving_error");
    assert!(broken["detail"].as_str().unwrap().contains("503"), "{broken}");

    let unreachable = spawn_app_with(|s| s.serving.url = closed_port_url()).await;
    assert_eq!(
        sample_error(&unreachable, BASE_MODEL).await["error"],
        "serving_unreachable"
    );

    let unconfigured = spawn_app().await;
    let body = sample_error(&unconfigured, BASE_MODEL).await;
    assert_eq!(body["error"], "serving_not_configured");
    assert!(body["detail"].is_string());
}
