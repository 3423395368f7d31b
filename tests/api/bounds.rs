//! One source for every bound: walking /openapi.json, each bounded field of each JSON body is
//! sent at and past its bounds (string lengths, patterns with whitespace-only values, numeric
//! ranges, list sizes). The document, judged by a JSON Schema validator, is the oracle: a
//! value the schema accepts is never refused for that field, and one it refuses is always
//! refused as a 422 naming the field.

use reqwest::{Method, StatusCode};
use serde_json::{json, Map, Value};

use crate::helpers::{spawn_app, TestApp, TestOrg, INTERNAL_KEY};

/// The schema of a `$ref` or an inline schema.
fn resolve<'a>(doc: &'a Value, schema: &'a Value) -> &'a Value {
    match schema.get("$ref").and_then(Value::as_str) {
        Some(reference) => doc
            .pointer(reference.trim_start_matches('#'))
            .map_or(schema, |target| resolve(doc, target)),
        None => schema,
    }
}

/// Whether `value` is valid against `schema` inside the document (its `$ref`s resolved).
fn schema_accepts(doc: &Value, schema: &Value, value: &Value) -> bool {
    let mut root = schema.clone();
    if let Value::Object(map) = &mut root {
        map.insert("components".into(), doc["components"].clone());
        map.insert(
            "$schema".into(),
            json!("https://json-schema.org/draft/2020-12/schema"),
        );
    }
    jsonschema::options()
        .build(&root)
        .expect("the document's schema compiles")
        .is_valid(value)
}

/// The object schema a body's example takes: its component, or the variant its tag names.
fn object_schema<'a>(doc: &'a Value, schema: &'a Value, example: &Value) -> Option<&'a Value> {
    let schema = resolve(doc, schema);
    if let Some(variants) = schema.get("oneOf").and_then(Value::as_array) {
        return variants
            .iter()
            .map(|v| resolve(doc, v))
            .find(|v| schema_accepts(doc, v, example));
    }
    schema.get("properties").map(|_| schema)
}

/// Values at and past the bounds of a property's schema.
fn probes(doc: &Value, schema: &Value, sample: Option<&Value>) -> Vec<Value> {
    let schema = resolve(doc, schema);
    let mut values = Vec::new();
    let alternatives: Vec<&Value> = match schema.get("oneOf").or_else(|| schema.get("anyOf")) {
        Some(Value::Array(items)) => items.iter().map(|s| resolve(doc, s)).collect(),
        _ => vec![schema],
    };
    for schema in alternatives {
        let text = |n: u64| Value::from("a".repeat(n as usize));
        if let Some(min) = schema.get("minLength").and_then(Value::as_u64) {
            values.extend([text(min), text(min.saturating_sub(1))]);
        }
        if let Some(max) = schema.get("maxLength").and_then(Value::as_u64) {
            values.extend([text(max), text(max + 1)]);
        }
        if schema.get("pattern").is_some() {
            values.extend([json!("   "), json!("\u{3000}\t"), json!("a\u{0}b"), json!("ok-1")]);
        }
        for key in ["minimum", "maximum"] {
            if let Some(bound) = schema.get(key).and_then(Value::as_f64) {
                let integer = schema["type"] == "integer"
                    || schema["type"]
                        .as_array()
                        .is_some_and(|t| t.contains(&json!("integer")));
                let step = if integer { 1.0 } else { 0.5 };
                for v in [bound - step, bound, bound + step] {
                    values.push(if integer { json!(v as i64) } else { json!(v) });
                }
            }
        }
        if let Some(item) = sample.and_then(Value::as_array).and_then(|a| a.first()) {
            for key in ["minItems", "maxItems"] {
                if let Some(bound) = schema.get(key).and_then(Value::as_u64) {
                    for n in [bound.saturating_sub(1), bound, bound + 1] {
                        values.push(Value::Array(vec![item.clone(); n as usize]));
                    }
                }
            }
        }
    }
    values.dedup();
    values
}

/// Whether a 422 answer names `field` (or something inside it).
fn refuses(detail: &Value, field: &str) -> bool {
    detail.as_array().into_iter().flatten().any(|issue| {
        issue["loc"]
            .as_array()
            .is_some_and(|loc| loc.len() >= 2 && loc[0] == "body" && loc[1] == field)
    })
}

struct Caller<'a> {
    token: &'a str,
    org: &'a TestOrg,
}

impl Caller<'_> {
    /// The credentials an operation names: the owner's session first (the organization is
    /// checked after the body), then the internal key, then the API key.
    fn candidates<'a>(operation: &Value, org: &'a TestOrg) -> Vec<Caller<'a>> {
        let schemes: Vec<&str> = operation["security"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_object().and_then(|o| o.keys().next()).map(String::as_str))
            .collect();
        [
            ("session", org.owner_token.as_str()),
            ("internalKey", INTERNAL_KEY),
            ("apiKey", org.api_key.as_str()),
        ]
        .into_iter()
        .filter(|(scheme, _)| schemes.contains(scheme))
        .map(|(_, token)| Caller { token, org })
        .collect()
    }
}

/// Calls an operation of the document: its path parameters filled (the caller's organization,
/// else a random UUID), `query` and `body` as given.
async fn send(
    app: &TestApp,
    method: &str,
    path: &str,
    caller: &Caller<'_>,
    query: Option<&Map<String, Value>>,
    body: &Value,
) -> (StatusCode, Value) {
    let mut url = path
        .split('/')
        .map(|segment| match segment {
            "{org_id}" => caller.org.org_id.clone(),
            s if s.starts_with('{') => uuid::Uuid::new_v4().to_string(),
            s => s.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("/");
    if let Some(query) = query {
        url = format!("{url}?{}", query_of(query));
    }
    let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
    let mut request = app
        .request(method, &url, Some(caller.token))
        .header("X-Org-Id", caller.org.org_id.as_str());
    if !body.is_null() {
        request = request.json(body);
    }
    let response = request.send().await.unwrap();
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

/// The first credential of the operation's security that its own example gets past.
async fn caller_for<'a>(
    app: &TestApp,
    method: &str,
    path: &str,
    operation: &Value,
    org: &'a TestOrg,
    query: Option<&Map<String, Value>>,
    body: &Value,
) -> Option<Caller<'a>> {
    for candidate in Caller::candidates(operation, org) {
        let (_, answer) = send(app, method, path, &candidate, query, body).await;
        let refused = [
            "unauthenticated",
            "forbidden",
            "internal_key_required",
            "owner_required",
            "not_a_member",
            "other_organization",
        ]
        .contains(&answer["code"].as_str().unwrap_or_default());
        if !refused {
            return Some(candidate);
        }
    }
    None
}

#[actix_web::test]
async fn a_value_the_schema_accepts_is_never_refused_and_one_it_refuses_always_is() {
    let app = spawn_app().await;
    let org = app.create_org("Bounds").await;
    let doc = app.openapi().await;
    let mut probed = 0;
    let mut fields = 0;
    let mut mismatches = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let content = &operation["requestBody"]["content"]["application/json"];
            let (Some(schema), Some(example)) = (content.get("schema"), content.get("example")) else {
                continue;
            };
            // The processor's webhook checks its signature before its body.
            if path == "/api/billing/webhook" {
                continue;
            }
            let Some(object) = object_schema(&doc, schema, example) else {
                continue;
            };
            let mut base: Map<String, Value> = example.as_object().cloned().unwrap_or_default();
            for key in ["orgId", "org_id"] {
                if base.contains_key(key) {
                    base.insert(key.into(), json!(org.org_id));
                }
            }
            let caller = caller_for(
                &app,
                method,
                path,
                operation,
                &org,
                None,
                &Value::Object(base.clone()),
            )
            .await;
            let Some(caller) = caller else {
                mismatches.push(format!("{method} {path}: no credential of its security passes"));
                continue;
            };
            for (field, property) in object["properties"].as_object().unwrap() {
                let values = probes(&doc, property, base.get(field));
                if values.is_empty() {
                    continue;
                }
                fields += 1;
                for value in values {
                    let accepted = schema_accepts(&doc, property, &value);
                    let mut body = base.clone();
                    body.insert(field.clone(), value.clone());
                    let (status, answer) =
                        send(&app, method, path, &caller, None, &Value::Object(body)).await;
                    probed += 1;
                    let refused =
                        status == StatusCode::UNPROCESSABLE_ENTITY && refuses(&answer["detail"], field);
                    if accepted == refused || status.is_server_error() {
                        mismatches.push(format!(
                            "{method} {path} {field}={}: schema {} it, the service answered {status} {answer}",
                            serde_json::to_string(&value).unwrap().chars().take(60).collect::<String>(),
                            if accepted { "accepts" } else { "refuses" },
                        ));
                    }
                }
            }
        }
    }
    assert!(fields > 40, "only {fields} bounded fields found");
    assert!(probed > 200, "only {probed} values sent");
    assert!(
        mismatches.is_empty(),
        "{} of {probed}:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}

/// A query string of `params` (a list value repeats its name).
fn query_of(params: &Map<String, Value>) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    for (name, value) in params {
        let values = match value {
            Value::Array(items) => items.clone(),
            other => vec![other.clone()],
        };
        for value in values {
            let text = match value {
                Value::String(s) => s,
                other => other.to_string(),
            };
            query.append_pair(name, &text);
        }
    }
    query.finish()
}

#[actix_web::test]
async fn a_query_parameter_the_schema_accepts_is_never_refused_and_one_it_refuses_always_is() {
    let app = spawn_app().await;
    let org = app.create_org("Query bounds").await;
    let doc = app.openapi().await;
    let (mut fields, mut probed, mut mismatches) = (0, 0, Vec::new());
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let parameters: Vec<&Value> = operation["parameters"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|p| p["in"] == "query")
                .collect();
            if parameters.is_empty() {
                continue;
            }
            let body = operation["requestBody"]["content"]["application/json"]["example"].clone();
            // Required parameters at a value of the right shape.
            let mut base = Map::new();
            for parameter in parameters.iter().filter(|p| p["required"] == true) {
                let name = parameter["name"].as_str().unwrap();
                let schema = resolve(&doc, &parameter["schema"]);
                let value = match name {
                    "orgId" | "org_id" => json!(org.org_id),
                    _ if schema["format"] == "uuid" => json!(uuid::Uuid::new_v4().to_string()),
                    _ if schema["type"] == "array" => json!(["x"]),
                    _ if schema["type"] == "integer" => json!(1),
                    _ => json!("x"),
                };
                base.insert(name.to_owned(), value);
            }
            let caller = caller_for(&app, method, path, operation, &org, Some(&base), &body).await;
            let Some(caller) = caller else {
                mismatches.push(format!("{method} {path}: no credential of its security passes"));
                continue;
            };
            for parameter in &parameters {
                let name = parameter["name"].as_str().unwrap();
                let sample = base.get(name).cloned().unwrap_or_else(|| json!(["x"]));
                let values = probes(&doc, &parameter["schema"], Some(&sample));
                if values.is_empty() {
                    continue;
                }
                fields += 1;
                for value in values {
                    // A query carries text: a value is what its text reads as.
                    let accepted = schema_accepts(&doc, &parameter["schema"], &value);
                    let mut params = base.clone();
                    params.insert(name.to_owned(), value.clone());
                    let (status, answer) = send(&app, method, path, &caller, Some(&params), &body).await;
                    probed += 1;
                    let refused = status == StatusCode::UNPROCESSABLE_ENTITY
                        && answer["detail"].as_array().into_iter().flatten().any(|issue| {
                            issue["loc"]
                                .as_array()
                                .is_some_and(|loc| loc.len() >= 2 && loc[0] == "query" && loc[1] == name)
                        });
                    // A key's foreign organization is 403 before any bound (CONTRACT §2).
                    let foreign = answer["code"] == "other_organization";
                    if (accepted == refused && !foreign) || status.is_server_error() {
                        mismatches.push(format!(
                            "{method} {path}?{name}={}: schema {} it, the service answered {status} {answer}",
                            serde_json::to_string(&value)
                                .unwrap()
                                .chars()
                                .take(60)
                                .collect::<String>(),
                            if accepted { "accepts" } else { "refuses" },
                        ));
                    }
                }
            }
        }
    }
    assert!(fields > 10, "only {fields} bounded parameters found");
    assert!(probed > 50, "only {probed} values sent");
    assert!(
        mismatches.is_empty(),
        "{} of {probed}:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}

#[actix_web::test]
async fn a_nul_is_refused_wherever_the_schema_types_a_string_and_kept_in_free_form_json() {
    let app = spawn_app().await;
    let org = app.create_org("Nul").await;
    let cases = [
        // Inside a nullable choice of integer, number or string.
        (
            "/api/training/internal/agent-usage",
            INTERNAL_KEY.to_owned(),
            json!({"account_label": "codex-1", "primary_resets_at": "a\u{0}b"}),
            vec![json!("body"), json!("primary_resets_at")],
        ),
        // Inside an item of a list of objects.
        (
            "/api/evals/runs",
            org.api_key.clone(),
            json!({"project_id": uuid::Uuid::new_v4(), "suite_name": "s", "environment_reference": "e",
                   "cases": [{"case_id": "ok"}, {"case_id": "a\u{0}b"}]}),
            vec![json!("body"), json!("cases"), json!(1), json!("case_id")],
        ),
    ];
    for (path, token, body, loc) in cases {
        let response = app.post(path, &token, &body).await;
        assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY, "{path}");
        let answer: Value = response.json().await.unwrap();
        assert_eq!(answer["detail"][0]["loc"], json!(loc), "{answer}");
        assert_eq!(answer["detail"][0]["type"], "string_pattern_mismatch", "{answer}");
    }
    // A key of a typed map (a job's input).
    let project = app.create_project(&org, "Nul keys").await;
    let response = app
        .post(
            "/api/training/jobs",
            &org.api_key,
            &json!({"action": "draft", "projectId": project, "input": {"a\u{0}b": 1}}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(
        answer["detail"][0]["loc"],
        json!(["body", "input", "a\u{0}b"]),
        "{answer}"
    );
    // Free-form JSON is stored as JSON text, where a NUL stays an escape: accepted.
    let run = app
        .post(
            "/api/runs",
            &org.api_key,
            &json!({"projectId": project, "config": {"note": "a\u{0}b"}}),
        )
        .await;
    assert_eq!(run.status(), StatusCode::OK);
}

/// Issue 38, item 2: an id is parsed once where it enters. A body's id its type refuses is
/// answered with the other fields' issues beside it; a path, a worker's report or a key that
/// names no id keel gave out is "not found" (as an unknown id), never a query with text in it.
#[actix_web::test]
async fn an_id_that_is_none_is_refused_where_it_enters_with_every_other_issue() {
    let app = spawn_app().await;
    let org = app.create_org("Ids").await;
    let project = app.create_project(&org, "Ids").await;

    // Two fields wrong at once: the refused id and a name over its bound, both listed.
    let response = app
        .post(
            "/api/runs",
            &org.api_key,
            &json!({"projectId": "not-a-uuid", "name": "n".repeat(201)}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let answer: Value = response.json().await.unwrap();
    let issues: Vec<(Value, Value)> = answer["detail"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["loc"].clone(), i["type"].clone()))
        .collect();
    assert!(
        issues.contains(&(json!(["body", "projectId"]), json!("uuid_parsing"))),
        "{answer}"
    );
    assert!(
        issues.contains(&(json!(["body", "name"]), json!("string_too_long"))),
        "{answer}"
    );
    // Any UUID spelling is the same project.
    let shouted = project.to_uppercase().replace('-', "");
    let response = app
        .post("/api/runs", &org.api_key, &json!({"projectId": shouted}))
        .await;
    assert_eq!(
        response.status(),
        StatusCode::OK,
        "{}",
        response.text().await.unwrap()
    );

    // An organization id of whitespace alone names none: refused, never trimmed to "".
    let response = app
        .post(
            "/api/projects",
            &org.api_key,
            &json!({"name": "P", "orgId": " \t"}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["detail"][0]["loc"], json!(["body", "orgId"]), "{answer}");
    assert_eq!(answer["detail"][0]["type"], "string_pattern_mismatch", "{answer}");

    // Not ids keel gave out: 404, as for ids it does not know.
    for path in [
        "/api/training/jobs/not-a-job",
        "/api/projects/00000000-0000-4000-8000-000000000000",
    ] {
        let response = app.get(path, &org.api_key).await;
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{path}");
    }
    let response = app.delete("/api/internal/api-keys/not-a-key", INTERNAL_KEY).await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let response = app
        .post(
            "/api/training/internal/jobs/failed",
            INTERNAL_KEY,
            &json!({"job_id": "not-a-job", "worker_id": "w1", "error": "boom"}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let response = app
        .get("/api/training/internal/jobs/not-a-job", INTERNAL_KEY)
        .await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
}
