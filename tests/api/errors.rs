//! Every error keel produces carries a stable machine `code` beside `detail` (the same value
//! under `/v1`, in OpenAI's `error.code`); every code is one row of one table, listed in
//! /openapi.json (the `ErrorCode` enum) and in the README.

use keel::error::Code;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::{spawn_app, INTERNAL_KEY};

async fn error_of(response: reqwest::Response, status: StatusCode) -> Value {
    assert_eq!(response.status(), status);
    response.json().await.expect("a JSON error body")
}

#[actix_web::test]
async fn each_kind_of_error_answers_its_own_code_beside_an_unchanged_detail() {
    let app = spawn_app().await;
    let org = app.create_org("Codes").await;

    let unauthenticated = error_of(app.get("/api/projects", "").await, StatusCode::UNAUTHORIZED).await;
    assert_eq!(unauthenticated["code"], "unauthenticated");
    assert_eq!(unauthenticated["detail"], "missing or invalid credentials");

    let internal_only = error_of(
        app.post("/api/internal/orgs", &org.api_key, &json!({})).await,
        StatusCode::FORBIDDEN,
    )
    .await;
    assert_eq!(internal_only["code"], "internal_key_required");

    let invalid = error_of(
        app.post("/api/projects", &org.api_key, &json!({"name": 5})).await,
        StatusCode::UNPROCESSABLE_ENTITY,
    )
    .await;
    assert_eq!(invalid["code"], "validation_failed");
    assert!(invalid["detail"].is_array(), "{invalid}");

    let short = error_of(
        app.post("/api/billing/debit", &org.api_key, &json!({"orgId": org.org_id}))
            .await,
        StatusCode::PAYMENT_REQUIRED,
    )
    .await;
    assert_eq!(short["code"], "insufficient_balance");
    assert!(
        short["detail"]
            .as_str()
            .unwrap()
            .starts_with("insufficient balance"),
        "{short}"
    );

    let slug = json!({"name": "Same", "slug": "same"});
    assert_eq!(
        app.post("/api/projects", &org.api_key, &slug).await.status(),
        StatusCode::CREATED
    );
    let taken = error_of(
        app.post("/api/projects", &org.api_key, &slug).await,
        StatusCode::CONFLICT,
    )
    .await;
    assert_eq!(taken["code"], "slug_taken");
    assert_eq!(
        taken["detail"],
        "a project with slug 'same' already exists in this organization"
    );

    let job = error_of(
        app.get(
            &format!("/api/training/jobs/{}", uuid::Uuid::new_v4()),
            &org.api_key,
        )
        .await,
        StatusCode::NOT_FOUND,
    )
    .await;
    assert_eq!(
        (job["code"].as_str(), job["detail"].as_str()),
        (Some("job_not_found"), Some("job not found"))
    );

    let nowhere = error_of(app.get("/api/nowhere", &org.api_key).await, StatusCode::NOT_FOUND).await;
    assert_eq!(nowhere["code"], "not_found");
    let wrong_method = error_of(
        app.delete("/api/projects", &org.api_key).await,
        StatusCode::METHOD_NOT_ALLOWED,
    )
    .await;
    assert_eq!(wrong_method["code"], "method_not_allowed");

    let foreign = error_of(
        app.post(
            "/api/projects",
            &org.api_key,
            &json!({"name": "X", "orgId": uuid::Uuid::new_v4()}),
        )
        .await,
        StatusCode::FORBIDDEN,
    )
    .await;
    assert_eq!(foreign["code"], "other_organization");
}

#[actix_web::test]
async fn under_v1_the_openai_error_code_is_the_same_code() {
    let app = spawn_app().await;
    let org = app.create_org("Proxy codes").await;
    let missing = error_of(
        app.post(
            "/v1/chat/completions",
            &org.api_key,
            &json!({"model": "m", "messages": []}),
        )
        .await,
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert_eq!(missing["code"], "missing_header");
    assert_eq!(missing["error"]["code"], "missing_header");
    assert_eq!(missing["error"]["type"], "invalid_request_error");
    assert_eq!(missing["detail"], missing["error"]["message"]);

    let unknown_key = error_of(
        app.request(Method::POST, "/v1/chat/completions", Some("keel_sk_nonsense"))
            .header("X-Service-Provider", "openai")
            .header("X-Service-Provider-Key", "sk-test")
            .header("X-Project-Id", uuid::Uuid::new_v4().to_string())
            .json(&json!({"model": "m", "messages": []}))
            .send()
            .await
            .unwrap(),
        StatusCode::UNAUTHORIZED,
    )
    .await;
    assert_eq!(unknown_key["code"], "invalid_api_key");
    assert_eq!(unknown_key["error"]["code"], "invalid_api_key");
    assert_eq!(unknown_key["error"]["type"], "authentication_error");
}

#[actix_web::test]
async fn every_code_is_in_the_document_and_the_readme_and_every_error_body_requires_one() {
    let app = spawn_app().await;
    let doc = app.openapi().await;
    let schemas = &doc["components"]["schemas"];
    let listed: Vec<&str> = schemas["ErrorCode"]["enum"]
        .as_array()
        .expect("an ErrorCode enum")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let table: Vec<&str> = Code::ALL.iter().map(|c| c.as_str()).collect();
    assert_eq!(listed, table);
    for body in ["ErrorBody", "ValidationErrorBody"] {
        let required = schemas[body]["required"].as_array().expect("required fields");
        assert!(required.contains(&json!("code")), "{body}: {required:?}");
    }
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    for code in Code::ALL {
        let row = format!("| `{}` | {} |", code.as_str(), code.status().as_u16());
        assert!(readme.contains(&row), "README lacks the row {row}");
    }
    let _ = INTERNAL_KEY;
}

#[actix_web::test]
async fn a_request_target_past_16_kib_is_414_with_the_json_error_body() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let long = "x".repeat(20 * 1024);
    for path in [
        format!("/api/projects?orgId={long}"),
        format!("/v1/models/{long}"),
        format!("/console/login?next={long}"),
    ] {
        let response = app.get(&path, &org.api_key).await;
        assert_eq!(response.status(), StatusCode::URI_TOO_LONG, "{}", &path[..20]);
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["code"], "uri_too_long", "{body}");
        assert!(body["detail"].as_str().unwrap().contains("16384"), "{body}");
    }
    // Just under the bound is read as usual.
    let fits = format!("/api/projects?x={}", "x".repeat(16 * 1024 - 40));
    assert_ne!(
        app.get(&fits, &org.api_key).await.status(),
        StatusCode::URI_TOO_LONG
    );
}

/// The README's commands can be run as they stand: every shell variable a block uses is set
/// before (in that block or an earlier one), the promo code is redeemed once, and headers are
/// spelled as keel reads them.
#[test]
fn the_readme_commands_use_only_what_they_set() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in readme.lines() {
        match (&mut current, line.trim_start()) {
            (None, "```sh") => current = Some(String::new()),
            (Some(block), "```") => {
                blocks.push(std::mem::take(block));
                current = None;
            }
            (Some(block), _) => {
                block.push_str(line);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    assert!(blocks.len() >= 3, "the README's shell blocks");
    let set = regex::Regex::new(r"(?m)(?:^|\s|export\s+)([A-Z_][A-Z0-9_]*)=").unwrap();
    let used = regex::Regex::new(r"\$\{?([A-Z_][A-Z0-9_]*)").unwrap();
    // Set by the shell, or placeholders the text says to fill in.
    let mut defined: std::collections::HashSet<String> =
        ["PWD", "HOME", "PATH"].into_iter().map(str::to_owned).collect();
    for block in &blocks {
        let code: String = block
            .lines()
            .map(|l| l.split(" # ").next().unwrap_or(l))
            .collect::<Vec<_>>()
            .join("\n");
        for found in set.captures_iter(&code) {
            defined.insert(found[1].to_owned());
        }
        for found in used.captures_iter(&code) {
            assert!(
                defined.contains(&found[1]),
                "the README uses ${} before setting it:\n{block}",
                &found[1]
            );
        }
    }
    let redeemed = blocks
        .iter()
        .map(|b| b.matches("WELCOME10").count())
        .sum::<usize>();
    assert!(
        redeemed <= 1,
        "WELCOME10 is redeemed {redeemed} times (the second is a 409)"
    );
    assert!(
        !readme.contains("X-Project-Id"),
        "the header is X-Service-Project-Id"
    );
}
