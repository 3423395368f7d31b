//! The machine contract: what /openapi.json promises (credentials, shared answers, examples,
//! summaries), `Allow` on 405, `{detail}` 404s under /api, the browsable /docs, and strings a
//! database refuses (NUL) answered 422 or stored, never 500, on either database.

use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::TestRunner;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use keel_core::webhooks::destination::url_pattern;

use crate::helpers::*;

/// The placeholder ids of the document's examples (src/openapi/examples.rs).
const EXAMPLE_ORG: &str = "0b6f5f0e-4c1a-4a44-9d5c-2f1c3e0a7b11";
const EXAMPLE_PROJECT: &str = "5d0c8e2a-9f61-4b7e-8f3a-1c2d3e4f5a6b";

async fn document(app: &TestApp) -> Value {
    json_of(
        app.request(Method::GET, "/openapi.json", None)
            .send()
            .await
            .unwrap(),
        StatusCode::OK,
    )
    .await
}

/// Every operation of the document: (method, path, operation).
fn operations(doc: &Value) -> Vec<(String, String, Value)> {
    let mut all = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            all.push((method.clone(), path.clone(), operation.clone()));
        }
    }
    all
}

fn schemes(operation: &Value) -> Vec<String> {
    operation["security"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|requirement| requirement.as_object().unwrap().keys().cloned())
        .collect()
}

#[actix_web::test]
async fn every_operation_says_what_it_does_who_may_call_it_and_how_it_fails() {
    let app = spawn_app().await;
    let doc = document(&app).await;
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(doc["info"]["version"], "0.1.0");
    let kinds = ["internalKey", "apiKey", "session"];
    for kind in kinds {
        let scheme = &doc["components"]["securitySchemes"][kind];
        assert_eq!(
            (scheme["type"].as_str(), scheme["scheme"].as_str()),
            (Some("http"), Some("bearer"))
        );
    }
    for (method, path, operation) in operations(&doc) {
        let what = format!("{method} {path}");
        assert!(
            operation["summary"].as_str().is_some_and(|s| !s.is_empty()),
            "{what}: summary"
        );
        assert!(
            operation["description"].as_str().is_some_and(|s| s.len() > 20),
            "{what}: description"
        );
        let taken = schemes(&operation);
        assert!(
            taken.iter().all(|s| kinds.contains(&s.as_str())),
            "{what}: {taken:?}"
        );
        let answers = operation["responses"].as_object().unwrap();
        if !taken.is_empty() {
            assert!(answers.contains_key("401"), "{what}: 401");
            if taken.len() < 3 {
                assert!(answers.contains_key("403"), "{what}: 403");
            }
        }
        let has_input = operation.get("requestBody").is_some()
            || operation["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|p| p["in"] == "query" || p["in"] == "path");
        if has_input {
            assert!(answers.contains_key("422"), "{what}: 422");
        }
        if let Some(body) = operation.get("requestBody") {
            assert!(
                body["content"]["application/json"]["example"].is_object(),
                "{what}: an example body"
            );
        }
    }
    // Who may call what, as CONTRACT §2 and §6 say.
    let op = |method: &str, path: &str| doc["paths"][path][method].clone();
    assert_eq!(schemes(&op("post", "/api/sample")), ["internalKey"]);
    assert_eq!(
        schemes(&op("post", "/api/training/internal/jobs/claim")),
        ["internalKey"]
    );
    assert_eq!(schemes(&op("get", "/api/billing")), ["apiKey", "session"]);
    assert_eq!(schemes(&op("post", "/api/api-keys")), ["session"]);
    assert_eq!(schemes(&op("post", "/v1/chat/completions")), ["apiKey"]);
    assert_eq!(schemes(&op("get", "/api/auth/verify")), kinds);
    assert!(schemes(&op("get", "/healthz")).is_empty());

    // A 422's `loc` holds names and indexes; the job bodies are told apart by `action`.
    let schemas = &doc["components"]["schemas"];
    let loc_item = &schemas["LocItem"]["oneOf"];
    let loc_types: Vec<&str> = loc_item
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["type"].as_str().unwrap())
        .collect();
    assert_eq!(loc_types, ["string", "integer"]);
    let jobs = &schemas["JobCreateBody"];
    assert_eq!(jobs["discriminator"]["propertyName"], "action");
    for (action, variant) in [
        ("tracer", "TracerJob"),
        ("draft", "DraftJob"),
        ("optimize", "OptimizeJob"),
        ("training", "TrainingJob"),
    ] {
        assert_eq!(
            jobs["discriminator"]["mapping"][action],
            format!("#/components/schemas/{variant}")
        );
        assert_eq!(schemas[variant]["properties"]["action"]["enum"], json!([action]));
        assert!(schemas[variant]["required"]
            .as_array()
            .unwrap()
            .contains(&json!("action")));
    }
    // Bounds validation enforces are in the document: the slug pattern, the alternatives.
    let slug = &schemas["FlashEnvironmentRefBody"]["properties"]["slug"]["pattern"];
    assert!(slug.as_str().unwrap().starts_with("^[a-z0-9]"));
    assert_eq!(schemas["ServingUsageBody"]["anyOf"].as_array().unwrap().len(), 2);
    assert_eq!(
        schemas["ProjectCreateBody"]["properties"]["description"]["pattern"],
        "^[^\\u0000]*$"
    );
    // Operations that create link to those that read them.
    let links = &op("post", "/api/projects")["responses"]["201"]["links"];
    assert_eq!(links["GetProject"]["operationId"], "get_project");
}

#[actix_web::test]
async fn the_document_examples_are_accepted() {
    let app = spawn_app().await;
    let doc = document(&app).await;
    let org = app.create_org("Acme").await;
    // The project example, sent as it is, creates a project.
    let example =
        &doc["paths"]["/api/projects"]["post"]["requestBody"]["content"]["application/json"]["example"];
    let created = json_of(
        app.post("/api/projects", &org.api_key, example).await,
        StatusCode::CREATED,
    )
    .await;
    assert_eq!(created["name"], example["name"]);
    // The training job example, once its project is the caller's, is queued.
    let mut job = doc["paths"]["/api/training/jobs"]["post"]["requestBody"]["content"]["application/json"]
        ["example"]
        .clone();
    job["projectId"] = created["id"].clone();
    let queued = json_of(
        app.post("/api/training/jobs", &org.api_key, &job).await,
        StatusCode::ACCEPTED,
    )
    .await;
    assert_eq!(queued["action"], "training");
}

#[actix_web::test]
async fn unsupported_methods_name_the_allowed_ones_and_unknown_api_paths_are_detail_404s() {
    let app = spawn_app().await;
    for (method, path, allow) in [
        (Method::PUT, "/api/projects", "GET, POST"),
        (Method::DELETE, "/healthz", "GET"),
        (Method::GET, "/api/billing/topup", "POST"),
        (Method::PATCH, "/api/internal/adapters/acme/bot", "PUT, DELETE"),
    ] {
        let response = app
            .request(method.clone(), path, Some(INTERNAL_KEY))
            .send()
            .await
            .unwrap();
        assert_eq!(
            response.status(),
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path}"
        );
        assert_eq!(response.headers()["allow"], allow, "{method} {path}");
        let body: Value = response.json().await.unwrap();
        assert_eq!(
            body,
            json!({"detail": "Method Not Allowed", "code": "method_not_allowed"})
        );
    }
    for path in [
        "/api/nope",
        "/api/billing/nope",
        "/api/training/internal/nope/deeper",
    ] {
        let response = app
            .request(Method::GET, path, Some(INTERNAL_KEY))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{path}");
        assert_eq!(
            response.json::<Value>().await.unwrap(),
            json!({"detail": "Not Found", "code": "not_found"})
        );
    }
    // Any other path under /v1 is the provider's (relayed); without a keel API key it is 401
    // in OpenAI's shape.
    let relayed = app
        .request(Method::GET, "/v1/nope-yet", Some(INTERNAL_KEY))
        .send()
        .await
        .unwrap();
    assert_eq!(relayed.status(), StatusCode::UNAUTHORIZED);
    let body: Value = relayed.json().await.unwrap();
    assert_eq!(body["error"]["type"], "authentication_error");
    assert_eq!(body["detail"], body["error"]["message"]);
}

#[actix_web::test]
async fn docs_are_swagger_ui_served_by_keel_itself() {
    let app = spawn_app().await;
    let bare = no_redirects().get(app.url("/docs")).send().await.unwrap();
    assert_eq!(bare.status(), StatusCode::PERMANENT_REDIRECT);
    assert_eq!(bare.headers()["location"], "/docs/");

    let page = app.request(Method::GET, "/docs/", None).send().await.unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    assert!(page.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    let csp = page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(csp.starts_with("default-src 'self'"), "{csp}");
    let html = page.text().await.unwrap();
    assert!(html.contains("swagger-ui"));
    // Everything the page loads comes from keel: no absolute URL in a src or href.
    let mut assets = Vec::new();
    for attribute in ["src=\"", "href=\""] {
        for piece in html.split(attribute).skip(1) {
            let target = &piece[..piece.find('"').unwrap()];
            assert!(!target.contains("://") && !target.starts_with("//"), "{target}");
            assets.push(target.trim_start_matches("./").to_owned());
        }
    }
    assert!(assets.iter().any(|a| a.ends_with(".js")), "{assets:?}");
    for asset in &assets {
        let response = app
            .request(Method::GET, &format!("/docs/{asset}"), None)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{asset}");
    }
    let settings = app
        .request(Method::GET, "/docs/swagger-initializer.js", None)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(settings.contains("/openapi.json"), "{settings}");
    // No call to the public validator either.
    assert!(
        settings.contains("\"validatorUrl\": \"none\"") || settings.contains("validatorUrl\":\"none"),
        "{settings}"
    );
    assert!(!settings.contains("://"), "{settings}");
    let missing = app
        .request(Method::GET, "/docs/nope.js", None)
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
}

#[actix_web::test]
async fn nul_in_a_typed_string_is_a_422_naming_the_field() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    let nul = "bad\u{0}name";
    for (path, token, body, loc) in [
        (
            "/api/projects",
            org.api_key.as_str(),
            json!({"name": nul}),
            json!(["body", "name"]),
        ),
        (
            "/api/agent-logs",
            org.api_key.as_str(),
            json!({"content": nul}),
            json!(["body", "content"]),
        ),
        (
            "/api/evals/runs",
            org.api_key.as_str(),
            json!({"project_id": project, "suite_name": nul, "environment_reference": "acme/support/env"}),
            json!(["body", "suite_name"]),
        ),
        (
            "/api/evals/runs",
            org.api_key.as_str(),
            json!({"project_id": project, "suite_name": "s", "environment_reference": "acme/support/env",
                   "cases": [{"input": "fine"}, {"input": nul}]}),
            json!(["body", "cases", 1, "input"]),
        ),
        (
            "/api/training/secrets",
            org.api_key.as_str(),
            json!({"secrets": {"TOKEN": nul}}),
            json!(["body", "secrets", "TOKEN"]),
        ),
    ] {
        let issues = validation_issues(app.post(path, token, &body).await).await;
        assert!(
            issues
                .iter()
                .any(|i| i["loc"] == loc && i["type"] == "string_pattern_mismatch"),
            "{path}: {issues:?}"
        );
    }
    // In the query too.
    let listed = app
        .request(Method::GET, "/api/projects?orgId=a%00b", Some(&org.member_token))
        .send()
        .await
        .unwrap();
    let issues = validation_issues(listed).await;
    assert_eq!(issues[0]["loc"], json!(["query", "orgId"]));
    // Nothing was stored.
    let projects = json_of(app.get("/api/projects", &org.api_key).await, StatusCode::OK).await;
    assert_eq!(projects.as_array().unwrap().len(), 1);
}

#[actix_web::test]
async fn nul_in_free_form_json_is_stored_and_returned_as_sent() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    let config = json!({"prompt": "a\u{0}b", "nested": [{"k\u{0}ey": "\u{1}\u{0}"}]});
    let run = json_of(
        app.post(
            "/api/runs",
            &org.api_key,
            &json!({"projectId": project, "config": config}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    let run_id = run["runId"].as_str().unwrap();
    let updated = json_of(
        app.request(Method::PATCH, &format!("/api/runs/{run_id}"), Some(&org.api_key))
            .json(&json!({"metrics": {"note": "x\u{0}y"}}))
            .send()
            .await
            .unwrap(),
        StatusCode::OK,
    )
    .await;
    assert_eq!(updated["metrics"], json!({"note": "x\u{0}y"}));
    assert_eq!(updated["config"], config);
}

/// Strings of NUL and other control characters, with some text around them.
fn hostile_strings(count: usize) -> Vec<String> {
    let strategy =
        proptest::string::string_regex("[a-z]{0,2}[\\x00-\\x1f\\x7f]{1,4}\\x00[a-z\\x00-\\x1f]{0,3}")
            .unwrap();
    let mut runner = TestRunner::deterministic();
    (0..count)
        .map(|_| strategy.new_tree(&mut runner).unwrap().current())
        .collect()
}

/// Every path to a string in `value`.
fn string_paths(value: &Value, path: &mut Vec<Value>, into: &mut Vec<Vec<Value>>) {
    match value {
        Value::String(_) => into.push(path.clone()),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                path.push(json!(i));
                string_paths(item, path, into);
                path.pop();
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                path.push(json!(key));
                string_paths(item, path, into);
                path.pop();
            }
        }
        _ => {}
    }
}

fn set(value: &mut Value, path: &[Value], to: Value) {
    let mut current = value;
    for segment in path {
        current = match segment {
            Value::String(key) => &mut current[key.as_str()],
            Value::Number(i) => &mut current[i.as_u64().unwrap() as usize],
            _ => unreachable!(),
        };
    }
    *current = to;
}

/// Replaces the examples' placeholder ids with this organization's and project's.
fn localize(value: &mut Value, org: &str, project: &str) {
    match value {
        Value::String(s) if s == EXAMPLE_ORG => *s = org.to_owned(),
        Value::String(s) if s == EXAMPLE_PROJECT => *s = project.to_owned(),
        Value::Array(items) => items.iter_mut().for_each(|v| localize(v, org, project)),
        Value::Object(map) => map.values_mut().for_each(|v| localize(v, org, project)),
        _ => {}
    }
}

#[actix_web::test]
async fn no_body_answers_5xx_for_nul_or_control_characters_in_any_string() {
    let app = spawn_app().await;
    let doc = document(&app).await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    let hostile = hostile_strings(3);
    let mut sent = 0;
    for (method, path, operation) in operations(&doc) {
        let Some(example) = operation.pointer("/requestBody/content/application~1json/example") else {
            continue;
        };
        let taken = schemes(&operation);
        let token = if taken.iter().any(|s| s == "internalKey") {
            INTERNAL_KEY.to_owned()
        } else if taken.iter().any(|s| s == "apiKey") {
            org.api_key.clone()
        } else {
            org.owner_token.clone()
        };
        let concrete = path
            .replace("{org_id}", &org.org_id)
            .replace("{adapter_id}", "acme/support-bot")
            .replace("{user_id}", "user-2")
            .replace(['{', '}'], "");
        let mut base = example.clone();
        localize(&mut base, &org.org_id, &project);
        let mut paths = Vec::new();
        string_paths(&base, &mut Vec::new(), &mut paths);
        for (i, string_path) in paths.iter().enumerate() {
            let mut body = base.clone();
            set(&mut body, string_path, json!(hostile[i % hostile.len()]));
            let response = app
                .request(method.to_uppercase().parse().unwrap(), &concrete, Some(&token))
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = response.status();
            let answer: Value = response.json().await.unwrap_or(Value::Null);
            // The sample route's documented 500 is the serving layer's (none configured here).
            let sample_failure = path == "/api/sample" && answer["error"] == "serving_not_configured";
            assert!(
                !status.is_server_error() || sample_failure,
                "{method} {path} with {body}: {status} {answer}"
            );
            sent += 1;
        }
    }
    assert!(sent > 100, "only {sent} bodies sent");
}

/// Every `$ref` in the document names something it holds: a reference to a missing component
/// makes a generated client fail, and keel's own bound checks of that operation's query or
/// body (compiled from the document) would not compile, so would check nothing.
#[actix_web::test]
async fn every_reference_in_the_document_resolves() {
    fn refs<'a>(value: &'a Value, found: &mut Vec<&'a str>) {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(target)) = map.get("$ref") {
                    found.push(target);
                }
                map.values().for_each(|v| refs(v, found));
            }
            Value::Array(items) => items.iter().for_each(|v| refs(v, found)),
            _ => {}
        }
    }
    let app = spawn_app().await;
    let doc = app.openapi().await;
    let mut found = Vec::new();
    refs(&doc, &mut found);
    assert!(found.len() > 50, "the document has references");
    let missing: Vec<&&str> = found
        .iter()
        .filter(|target| {
            let pointer = target.trim_start_matches('#');
            doc.pointer(pointer).is_none()
        })
        .collect();
    assert!(missing.is_empty(), "references to nothing: {missing:?}");
}

/// What the document lets a generator send, keel takes: a destination keel calls is
/// `https://` unless this instance allows `http://` (a schema-valid `http://` URL refused
/// would be the document lying), and a project change must name a field (an empty one is
/// 422, so the document says `minProperties: 1` and the body is required).
#[actix_web::test]
async fn the_document_says_what_this_instance_takes_of_destinations_and_changes() {
    let urls = [
        "/components/schemas/EndpointCreateBody/properties/url/pattern",
        "/components/schemas/EndpointPatchBody/properties/url/pattern",
        "/components/schemas/OtlpExportBody/properties/endpoint/pattern",
    ];
    let strict = spawn_app().await;
    let doc = strict.openapi().await;
    for url in urls {
        assert_eq!(doc.pointer(url), Some(&json!(url_pattern(false))), "{url}");
    }
    assert_eq!(
        doc["components"]["schemas"]["ProjectPatchBody"]["minProperties"],
        json!(1)
    );
    assert!(
        doc["components"]["schemas"]["ProjectPatchBody"]
            .get("maxProperties")
            .is_none(),
        "both fields may change at once"
    );
    let patch = &doc["paths"]["/api/projects/{project_id}"]["patch"]["requestBody"];
    assert_eq!(patch["required"], json!(true), "{patch}");
    assert_eq!(
        patch["content"]["application/json"]["schema"]["$ref"],
        json!("#/components/schemas/ProjectPatchBody")
    );
    // The strict instance refuses what its document refuses, and an empty change.
    let org = strict.create_org("Documented").await;
    let project = strict.create_project(&org, "doc-destinations").await;
    for (body, field) in [
        (
            json!({"otlpExport": {"endpoint": "http://collector.example.com:4318"}}),
            "otlpExport",
        ),
        (json!({}), "traceRetentionDays"),
    ] {
        let refused = strict
            .request(
                Method::PATCH,
                &format!("/api/projects/{project}"),
                Some(&org.owner_token),
            )
            .json(&body)
            .send()
            .await
            .unwrap();
        let detail = json_of(refused, StatusCode::UNPROCESSABLE_ENTITY).await;
        assert_eq!(detail["detail"][0]["loc"][1], json!(field), "{detail}");
    }

    let lenient = spawn_app_with(|s| s.webhooks.allow_http = true).await;
    let doc = lenient.openapi().await;
    for url in urls {
        assert_eq!(doc.pointer(url), Some(&json!(url_pattern(true))), "{url}");
    }
}
