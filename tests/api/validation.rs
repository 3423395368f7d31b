//! FastAPI-shaped errors: 422 with a `detail` list; every other error `{detail: "..."}`.

use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::helpers::*;

async fn post_raw(app: &TestApp, path: &str, token: &str, body: &str) -> reqwest::Response {
    app.request(Method::POST, path, Some(token))
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap()
}

#[actix_web::test]
async fn malformed_json_is_json_invalid() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let issues = validation_issues(post_raw(&app, "/api/projects", &org.api_key, r#"{"name": "#).await).await;
    assert_eq!(issues[0]["type"], "json_invalid");
    assert_eq!(issues[0]["loc"][0], "body");
}

#[actix_web::test]
async fn a_missing_field_is_reported_at_its_location() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let issues = validation_issues(app.post("/api/projects", &org.api_key, &json!({})).await).await;
    assert_eq!(
        issues[0],
        json!({"loc": ["body", "name"], "msg": "Field required", "type": "missing"})
    );
    // No body at all where one is required.
    let empty = app
        .request(Method::POST, "/api/projects", Some(&org.api_key))
        .send()
        .await
        .unwrap();
    let issues = validation_issues(empty).await;
    assert_eq!(issues[0]["loc"], json!(["body"]));
    assert_eq!(issues[0]["type"], "missing");
}

#[actix_web::test]
async fn a_wrong_type_names_the_expected_type() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let issues = validation_issues(
        app.post("/api/projects", &org.api_key, &json!({"name": 42}))
            .await,
    )
    .await;
    assert_eq!(issues[0]["loc"], json!(["body", "name"]));
    assert_eq!(issues[0]["type"], "string_type");
    let issues = validation_issues(app.post("/api/projects", &org.api_key, &json!([1, 2])).await).await;
    assert_eq!(issues[0]["type"], "model_attributes_type");
    assert_eq!(issues[0]["loc"], json!(["body"]));
    let adapter = app
        .put(
            "/api/internal/adapters/a",
            INTERNAL_KEY,
            &json!({"orgId": org.org_id, "baseModel": "m", "live": "yes"}),
        )
        .await;
    let issues = validation_issues(adapter).await;
    assert_eq!(issues[0]["loc"], json!(["body", "live"]));
    assert_eq!(issues[0]["type"], "bool_type");
}

#[actix_web::test]
async fn out_of_bounds_values_report_every_problem() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let body = json!({"name": "x".repeat(201), "slug": "Not A Slug"});
    let issues = validation_issues(app.post("/api/projects", &org.api_key, &body).await).await;
    assert_eq!(issues.len(), 2);
    assert_eq!(issues[0]["loc"], json!(["body", "name"]));
    assert_eq!(issues[0]["type"], "string_too_long");
    assert_eq!(issues[0]["msg"], "String should have at most 200 characters");
    assert_eq!(issues[1]["loc"], json!(["body", "slug"]));
    assert_eq!(issues[1]["type"], "string_pattern_mismatch");
    let empty = validation_issues(
        app.post("/api/projects", &org.api_key, &json!({"name": ""}))
            .await,
    )
    .await;
    assert_eq!(empty[0]["type"], "string_too_short");
}

#[actix_web::test]
async fn unknown_fields_are_rejected_where_the_body_forbids_them() {
    let app = spawn_app().await;
    let issues = validation_issues(
        app.post(
            "/api/internal/orgs",
            INTERNAL_KEY,
            &json!({"name": "Acme", "ownerUserId": "u", "plan": "gold"}),
        )
        .await,
    )
    .await;
    assert_eq!(issues[0]["loc"], json!(["body", "plan"]));
    assert_eq!(issues[0]["type"], "extra_forbidden");
}

#[actix_web::test]
async fn a_bad_path_parameter_is_422() {
    let app = spawn_app().await;
    let issues = validation_issues(
        app.put(
            "/api/internal/orgs/123/members/u",
            INTERNAL_KEY,
            &json!({"role": "member"}),
        )
        .await,
    )
    .await;
    assert_eq!(issues[0]["loc"], json!(["path", "org_id"]));
}

#[actix_web::test]
async fn unknown_routes_wrong_methods_and_oversized_bodies_answer_json() {
    let app = spawn_app_with(|s| s.server.max_body_bytes = 1024).await;
    let org = app.create_org("Acme").await;
    let missing = app.get("/api/nope", &org.api_key).await;
    assert_eq!(assert_error(missing, StatusCode::NOT_FOUND).await, "Not Found");
    let wrong = app.delete("/api/projects", &org.api_key).await;
    assert_eq!(
        assert_error(wrong, StatusCode::METHOD_NOT_ALLOWED).await,
        "Method Not Allowed"
    );
    let big = app
        .post(
            "/api/projects",
            &org.api_key,
            &json!({"name": "x", "description": "y".repeat(4096)}),
        )
        .await;
    assert_error(big, StatusCode::PAYLOAD_TOO_LARGE).await;
    // Chunked (no Content-Length) oversized bodies are refused as well.
    let stream = futures_util::stream::iter(
        (0..8).map(|_| Ok::<_, std::io::Error>(actix_web::web::Bytes::from(vec![b' '; 512]))),
    );
    let chunked = app
        .request(Method::POST, "/api/projects", Some(&org.api_key))
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .unwrap();
    assert_error(chunked, StatusCode::PAYLOAD_TOO_LARGE).await;
}
