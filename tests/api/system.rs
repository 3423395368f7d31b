use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::*;

#[actix_web::test]
async fn healthz_reports_the_database() {
    let app = spawn_app().await;
    let response = app.request(Method::GET, "/healthz", None).send().await.unwrap();
    assert!(response.headers().contains_key("x-request-id"));
    assert_eq!(
        json_of(response, StatusCode::OK).await,
        json!({"ok": true, "database": true})
    );
}

#[actix_web::test]
async fn metrics_count_requests_by_route_and_status_for_the_internal_key() {
    let app = spawn_app().await;
    app.request(Method::GET, "/healthz", None).send().await.unwrap();
    app.request(Method::GET, "/api/projects", None)
        .send()
        .await
        .unwrap();
    let response = app.get("/metrics", INTERNAL_KEY).await;
    assert_eq!(response.status(), StatusCode::OK);
    let text = response.text().await.unwrap();
    assert!(
        text.contains(r#"keel_http_requests_total{endpoint="/healthz",method="GET",status="200"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"endpoint="/api/projects",method="GET",status="401""#),
        "{text}"
    );
    assert!(
        text.contains("keel_http_requests_duration_seconds_bucket"),
        "{text}"
    );
}

/// Raw HTTP/1.1 requests on one connection (pipelined), the answers read to the end.
async fn pipelined(app: &TestApp, requests: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = app.address.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream.write_all(requests.as_bytes()).await.unwrap();
    let mut answers = Vec::new();
    let _ = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        stream.read_to_end(&mut answers),
    )
    .await;
    String::from_utf8_lossy(&answers).into_owned()
}

#[actix_web::test]
async fn invented_methods_and_paths_add_no_metric_series() {
    let app = spawn_app().await;
    // One of each kind first, so every series the flood below could touch exists.
    let mut requests = String::from("M0000000 /x HTTP/1.1\r\nHost: a\r\n\r\n");
    requests.push_str("GET /nowhere-0 HTTP/1.1\r\nHost: a\r\n\r\n");
    pipelined(
        &app,
        &(requests + "GET /healthz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"),
    )
    .await;
    // A first scrape makes /metrics' own series.
    app.get("/metrics", INTERNAL_KEY).await;
    let before = app.metrics_text().await;
    let series = |text: &str| text.lines().filter(|l| l.starts_with("keel_http_")).count();

    let mut flood = String::new();
    for i in 1..300 {
        flood.push_str(&format!("M{i:07} /x{i} HTTP/1.1\r\nHost: a\r\n\r\n"));
        flood.push_str(&format!("GET /nowhere-{i}/x HTTP/1.1\r\nHost: a\r\n\r\n"));
    }
    flood.push_str("GET /healthz HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    let answers = pipelined(&app, &flood).await;
    assert_eq!(
        answers.matches("HTTP/1.1 404").count() + answers.matches("HTTP/1.1 405").count(),
        598,
        "{}",
        &answers[..answers.len().min(2000)]
    );

    let after = app.metrics_text().await;
    assert_eq!(series(&before), series(&after), "new series:\n{after}");
    assert!(!after.contains("M0000"), "an invented method became a label");
    assert!(!after.contains("nowhere"), "an unmatched path became a label");
    assert!(
        after.contains(r#"keel_http_requests_total{endpoint="other",method="other",status="404"} 300"#),
        "{after}"
    );
}

#[actix_web::test]
async fn every_queue_series_exists_from_start_and_ledger_operations_are_timed() {
    let app = spawn_app().await;
    let text = app.metrics_text().await;
    for action in ["tracer", "draft", "optimize", "training"] {
        for status in [
            "queued",
            "running",
            "stopping",
            "succeeded",
            "blocked",
            "user_stopped",
            "failed",
        ] {
            let series = format!(r#"keel_queue_jobs{{action="{action}",status="{status}"}}"#);
            assert_eq!(metric(&text, &series), 0.0, "{series}");
        }
        assert_eq!(
            metric(
                &text,
                &format!(r#"keel_queue_oldest_queued_seconds{{action="{action}"}}"#)
            ),
            0.0
        );
    }
    assert_eq!(metric(&text, "keel_ledger_operation_seconds_count"), 0.0);

    let org = app.create_org("Timed").await;
    app.fund(&org, 500).await;
    let text = app.metrics_text().await;
    assert!(
        metric(&text, "keel_ledger_operation_seconds_count") >= 1.0,
        "{text}"
    );
    assert!(metric(&text, "keel_ledger_operation_seconds_sum") > 0.0, "{text}");
    // Still every series after a scrape that found jobs in none of them.
    assert_eq!(
        metric(&text, r#"keel_queue_jobs{action="draft",status="failed"}"#),
        0.0
    );
}

/// Sends `head` and then `body` on a fresh connection, keeps it open, and answers the first
/// response's status line and how long it took (None: no answer within `wait`).
async fn first_answer(
    app: &TestApp,
    head: &str,
    body: &[u8],
    wait: std::time::Duration,
) -> Option<(String, std::time::Duration)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = app.address.trim_start_matches("http://");
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let started = std::time::Instant::now();
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    let mut answer = vec![0u8; 4096];
    let n = tokio::time::timeout(wait, stream.read(&mut answer))
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&answer[..n]).into_owned();
    Some((text.lines().next().unwrap_or("").to_owned(), started.elapsed()))
}

#[actix_web::test]
async fn a_body_that_does_not_arrive_in_time_is_answered_408() {
    let app = spawn_app_with(|s| s.server.body_timeout_secs = 1).await;
    let org = app.create_org("Slow").await;
    let wait = std::time::Duration::from_secs(6);
    let heads = [
        format!("POST /api/projects HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n", org.api_key),
        format!("POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {}\r\nX-Service-Provider: openai\r\nX-Service-Provider-Key: sk-x\r\nX-Service-Record: false\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n", org.api_key),
        format!("POST /v1/embeddings HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {}\r\nX-Service-Provider: openai\r\nX-Service-Provider-Key: sk-x\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n", org.api_key),
        "POST /api/billing/webhook HTTP/1.1\r\nHost: a\r\nStripe-Signature: t=1,v1=00\r\nContent-Length: 1000000\r\n\r\n".to_owned(),
    ];
    for head in heads {
        let (status, took) = first_answer(&app, &head, b"{\"name\": ", wait)
            .await
            .unwrap_or_else(|| panic!("no answer to a trickled body: {head}"));
        assert!(status.starts_with("HTTP/1.1 408"), "{status} for {head}");
        assert!(took >= std::time::Duration::from_millis(900), "{took:?}");
    }
}

#[actix_web::test]
async fn routes_with_their_own_credential_refuse_before_reading_the_body() {
    // A long body deadline: only a refusal from the headers answers within the wait.
    let app = spawn_app().await;
    let wait = std::time::Duration::from_secs(3);
    let cases = [
        ("POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nX-Service-Provider: openai\r\nX-Service-Provider-Key: sk-x\r\nContent-Length: 1000000\r\n\r\n", "401"),
        ("POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer keel_sk_nothing\r\nContent-Length: 1000000\r\n\r\n", "401"),
        ("POST /v1/embeddings HTTP/1.1\r\nHost: a\r\nContent-Length: 1000000\r\n\r\n", "401"),
        ("PUT /v1/files/x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", "401"),
        ("POST /api/billing/webhook HTTP/1.1\r\nHost: a\r\nContent-Length: 1000000\r\n\r\n", "400"),
        ("POST /api/projects HTTP/1.1\r\nHost: a\r\nContent-Length: 1000000\r\n\r\n", "401"),
    ];
    for (head, expected) in cases {
        let (status, _) = first_answer(&app, head, b"{", wait)
            .await
            .unwrap_or_else(|| panic!("waited for the body instead of refusing: {head}"));
        assert!(
            status.starts_with(&format!("HTTP/1.1 {expected}")),
            "{status} for {head}"
        );
    }
}

#[actix_web::test]
async fn an_org_id_the_schema_accepts_is_never_refused_as_blank_and_one_it_refuses_is_422() {
    let app = spawn_app().await;
    let doc = app.openapi().await;
    // Every orgId of the document carries the one pattern (or, where the service reads it as
    // a UUID, the UUID pattern).
    let mut patterns = Vec::new();
    fn walk(value: &Value, into: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                if map.get("name") == Some(&json!("orgId")) {
                    into.push(map["schema"]["pattern"].as_str().unwrap_or("none").to_owned());
                }
                if let Some(schema) = map.get("properties").and_then(|p| p.get("orgId")) {
                    into.push(schema["pattern"].as_str().unwrap_or("none").to_owned());
                }
                map.values().for_each(|v| walk(v, into));
            }
            Value::Array(items) => items.iter().for_each(|v| walk(v, into)),
            _ => {}
        }
    }
    // What clients send: the paths and their components (the `webhooks` section describes
    // what keel sends, where an orgId is keel's own).
    walk(&doc["paths"], &mut patterns);
    walk(&doc["components"], &mut patterns);
    assert!(patterns.len() > 20, "{patterns:?}");
    assert!(
        patterns
            .iter()
            .all(|p| p == keel::openapi::ORG_ID || p == keel::http::schemas::UUID),
        "{patterns:?}"
    );
    assert!(patterns.iter().filter(|p| *p == keel::openapi::ORG_ID).count() > 20);
    let pattern = regex::Regex::new(keel::openapi::ORG_ID).unwrap();

    let org = app.create_org("Acme").await;
    let encode = |c: char| form_urlencoded::byte_serialize(c.to_string().as_bytes()).collect::<String>();
    for c in (0u32..0x3100).filter_map(char::from_u32).filter(|c| *c != '\0') {
        let blank = c.is_whitespace();
        assert_eq!(pattern.is_match(&format!("{c}{c}")), !blank, "{c:?}");
        if blank || matches!(c, 'a' | '\u{1c}' | '\u{feff}' | '\u{200b}') {
            let status = app
                .get(&format!("/api/billing?orgId={}", encode(c)), &org.api_key)
                .await
                .status();
            // Blank: refused as the schema refuses it; any other: another organization's.
            let expected = if blank {
                StatusCode::UNPROCESSABLE_ENTITY
            } else {
                StatusCode::FORBIDDEN
            };
            assert_eq!(status, expected, "{c:?}");
        }
    }
    // An optional filter: empty is absent (the pattern allows it), whitespace is refused.
    for path in ["/api/projects", "/api/api-keys", "/api/traces/projects"] {
        let empty = app.get(&format!("{path}?orgId="), &org.api_key).await.status();
        assert_eq!(empty, StatusCode::OK, "{path}");
        let blank = app.get(&format!("{path}?orgId=%20"), &org.api_key).await.status();
        assert!(blank.is_client_error(), "{path}: {blank}");
    }
    assert!(pattern.is_match(""));
}

#[actix_web::test]
async fn during_a_database_outage_requests_fail_fast_and_recover() {
    if !postgres_or_skip() {
        return;
    }
    let db = TestDb::new().await;
    // The app reaches its database through the proxy only.
    let proxy = crate::fakes::CuttableProxy::start("127.0.0.1:5432".parse().unwrap()).await;
    let url = db
        .url
        .replacen("127.0.0.1:5432", &format!("127.0.0.1:{}", proxy.port), 1);
    assert_ne!(url, db.url, "the test database is on 127.0.0.1:5432");
    let mut settings = test_settings(&url);
    assert_eq!(settings.database.acquire_timeout_secs, 2, "the default");
    settings.database.max_connections = 4;
    let app = spawn_on(db, settings).await;
    let org = app.create_org("Outage").await;
    assert_eq!(
        app.get("/api/projects", &org.api_key).await.status(),
        StatusCode::OK
    );

    proxy.cut();
    let http = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(10))
        .build()
        .unwrap();
    for round in 0..3 {
        let started = std::time::Instant::now();
        let health = http
            .get(app.url("/healthz"))
            .send()
            .await
            .expect("healthz answers");
        assert_eq!(health.status(), StatusCode::SERVICE_UNAVAILABLE, "round {round}");
        assert!(
            started.elapsed() < std::time::Duration::from_millis(1_800),
            "healthz took {:?}",
            started.elapsed()
        );
        let started = std::time::Instant::now();
        let listed = http
            .get(app.url("/api/projects"))
            .bearer_auth(&org.api_key)
            .send()
            .await
            .expect("a request answers during the outage");
        assert_eq!(listed.status(), StatusCode::SERVICE_UNAVAILABLE, "round {round}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(4),
            "took {:?}",
            started.elapsed()
        );
        // The proxy and the relay answer as every route does: 503 `unavailable`, in
        // OpenAI's shape (the key is not in their cache, so its look-up needs the database).
        for (method, path) in [
            (Method::POST, "/v1/chat/completions"),
            (Method::POST, "/v1/embeddings"),
        ] {
            let started = std::time::Instant::now();
            let answer = http
                .request(method, app.url(path))
                .bearer_auth(&org.api_key)
                .header("X-Service-Provider", "openai")
                .header("X-Service-Provider-Key", "sk-test")
                .header("X-Service-Record", "false")
                .json(&json!({"model": "gpt-4o-mini", "messages": [], "input": "hi"}))
                .send()
                .await
                .expect("the proxy answers during the outage");
            assert_eq!(
                answer.status(),
                StatusCode::SERVICE_UNAVAILABLE,
                "{path}, round {round}"
            );
            assert!(
                started.elapsed() < std::time::Duration::from_secs(4),
                "{path} took {:?}",
                started.elapsed()
            );
            let body: Value = answer.json().await.unwrap();
            assert_eq!(body["code"], "unavailable", "{body}");
            assert_eq!(body["error"]["code"], "unavailable", "{body}");
        }
    }

    proxy.restore().await;
    assert!(
        eventually(|| async { app.get("/api/projects", &org.api_key).await.status() == StatusCode::OK })
            .await,
        "serves again once the database is back"
    );
    assert_eq!(
        app.request(Method::GET, "/healthz", None)
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
}

/// Every route keel serves, as (method, OpenAPI path).
const ROUTES: &[(&str, &str)] = &[
    ("get", "/healthz"),
    ("get", "/openapi.json"),
    ("get", "/metrics"),
    ("get", "/api/auth/verify"),
    ("post", "/api/internal/orgs"),
    ("delete", "/api/internal/orgs/{org_id}"),
    ("put", "/api/internal/orgs/{org_id}/members/{user_id}"),
    ("post", "/api/internal/orgs/{org_id}/api-keys"),
    ("delete", "/api/internal/api-keys/{api_key_id}"),
    ("put", "/api/internal/adapters/{adapter_id}"),
    ("delete", "/api/internal/adapters/{adapter_id}"),
    ("get", "/api/api-keys"),
    ("post", "/api/api-keys"),
    ("patch", "/api/api-keys/{api_key_id}"),
    ("delete", "/api/api-keys/{api_key_id}"),
    ("get", "/api/projects"),
    ("post", "/api/projects"),
    ("get", "/api/projects/{project_id}"),
    ("patch", "/api/projects/{project_id}"),
    ("get", "/api/billing"),
    ("post", "/api/billing/setup-intent"),
    ("post", "/api/billing/payment-method"),
    ("delete", "/api/billing/payment-method"),
    ("delete", "/api/billing/customer"),
    ("post", "/api/billing/topup"),
    ("put", "/api/billing/auto-topup"),
    ("post", "/api/billing/starter-credit"),
    ("post", "/api/billing/promo-code"),
    ("post", "/api/billing/webhook"),
    ("post", "/api/billing/debit"),
    ("post", "/api/billing/serving-usage"),
    ("post", "/api/billing/training-usage"),
    ("post", "/api/billing/training-usage/precheck"),
    ("post", "/api/billing/training-usage/internal"),
    ("post", "/api/billing/training-cost"),
    ("post", "/api/agent-logs"),
    ("post", "/api/training/jobs"),
    ("get", "/api/training/jobs"),
    ("get", "/api/training/jobs/{job_id}"),
    ("post", "/api/training/jobs/{job_id}/stop"),
    ("post", "/api/training/secrets"),
    ("post", "/api/training/internal/jobs/claim"),
    ("get", "/api/training/internal/jobs/{job_id}"),
    ("post", "/api/training/internal/jobs/succeeded"),
    ("post", "/api/training/internal/jobs/blocked"),
    ("post", "/api/training/internal/jobs/user-stopped"),
    ("post", "/api/training/internal/jobs/failed"),
    ("post", "/api/training/internal/jobs/heartbeat"),
    ("post", "/api/training/internal/jobs/live-status"),
    ("post", "/api/training/internal/jobs/requeue-stale"),
    ("post", "/api/training/internal/jobs/requeue-interrupted"),
    ("post", "/api/training/internal/agent-usage"),
    ("post", "/api/training/internal/optimizer-timelines/sync"),
    ("get", "/api/training/internal/agent-logs"),
    ("post", "/api/training/internal/agent-logs"),
    ("post", "/api/runs"),
    ("patch", "/api/runs/{run_id}"),
    ("post", "/api/runs/{run_id}/tracker"),
    ("post", "/api/runs/internal/checkpoints"),
    ("get", "/api/runs/internal/checkpoints"),
    ("get", "/api/tracker"),
    ("post", "/api/sample"),
    ("post", "/api/serving/authorize"),
    ("post", "/api/serving/teardown"),
    ("post", "/api/flash/projects/validate/internal"),
    ("post", "/api/flash/environments/hub/provision/internal"),
    ("post", "/api/flash/environments/internal"),
    ("delete", "/api/flash/environments/internal"),
    ("post", "/api/flash/environments/validate/internal"),
    ("post", "/api/flash/environments/use/internal"),
    ("post", "/api/flash/runs/internal"),
    ("post", "/api/flash/runs/checkpoints/internal"),
    ("post", "/api/flash/events/internal"),
    ("post", "/v1/chat/completions"),
    ("get", "/api/traces/projects"),
    ("get", "/api/traces/export"),
    ("post", "/api/traces/export"),
    ("get", "/api/traces"),
    ("post", "/api/traces/tags"),
    ("get", "/api/traces/{trace_id}"),
    ("post", "/api/traces/{trace_id}/tags"),
    ("put", "/api/traces/{trace_id}/scores/{name}"),
    ("delete", "/api/traces/{trace_id}/scores/{name}"),
    ("post", "/api/evals/runs"),
];

#[actix_web::test]
async fn openapi_documents_every_route_with_its_bounds() {
    let app = spawn_app().await;
    let doc: Value = json_of(
        app.request(Method::GET, "/openapi.json", None)
            .send()
            .await
            .unwrap(),
        StatusCode::OK,
    )
    .await;
    assert!(doc["openapi"].as_str().unwrap().starts_with("3.1"));
    assert_eq!(doc["info"]["version"], "0.1.0");
    for (method, path) in ROUTES {
        assert!(
            doc["paths"][path][method].is_object(),
            "{method} {path} is missing from /openapi.json"
        );
        // And the route is really served (anything but a 404 "Not Found" for the route itself).
        let concrete = path
            .replace("{org_id}", &uuid::Uuid::new_v4().to_string())
            .replace("{project_id}", &uuid::Uuid::new_v4().to_string())
            .replace(['{', '}'], "");
        let response = app
            .request(
                method.to_uppercase().parse().unwrap(),
                &concrete,
                Some(INTERNAL_KEY),
            )
            .send()
            .await
            .unwrap();
        assert_ne!(
            response.status(),
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path}"
        );
        if response.status() == StatusCode::NOT_FOUND {
            let body: Value = response.json().await.unwrap();
            assert_ne!(body["detail"], "Not Found", "{method} {path} is not routed");
        }
    }
    let schemas = &doc["components"]["schemas"];
    assert_eq!(
        schemas["ProjectCreateBody"]["properties"]["name"]["maxLength"],
        200
    );
    assert_eq!(schemas["ProjectCreateBody"]["properties"]["name"]["minLength"], 1);
    assert_eq!(schemas["CreateOrgBody"]["additionalProperties"], false);
    assert!(doc["components"]["securitySchemes"]["internalKey"].is_object());
}

/// The kernel may hold `server.backlog` connections for keel before it accepts them (std's
/// `TcpListener::bind` asks for 128: a burst of clients beyond that lost their handshakes and
/// retried a second later). A listening socket's queue bound is the Send-Q column of `ss`.
#[actix_web::test]
async fn the_listener_queues_as_many_connections_as_configured() {
    fn accept_queue_bound(port: &str) -> u32 {
        let out = std::process::Command::new("ss")
            .args(["-Hltn", &format!("sport = :{port}")])
            .output()
            .expect("ss (iproute2) runs");
        let listing = String::from_utf8(out.stdout).unwrap();
        let line = listing.lines().next().expect("keel's listening socket");
        line.split_whitespace().nth(2).unwrap().parse().unwrap()
    }
    let somaxconn: u32 = std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .unwrap()
        .trim()
        .parse()
        .unwrap();

    let configured = spawn_app_with(|settings| settings.server.backlog = 1000).await;
    let port = configured.address.rsplit(':').next().unwrap();
    assert_eq!(accept_queue_bound(port), 1000.min(somaxconn));

    let default = spawn_app().await;
    let port = default.address.rsplit(':').next().unwrap();
    assert_eq!(accept_queue_bound(port), 4096.min(somaxconn));
}

#[actix_web::test]
async fn sqlite_copies_its_write_ahead_log_back_once_it_passes_the_configured_pages() {
    if postgres() {
        return; // A SQLite setting.
    }
    let app = spawn_app_with(|s| s.database.sqlite_wal_autocheckpoint_pages = 16).await;
    // Each organization is a commit of a few pages: hundreds of pages of log in all, which
    // SQLite's default (1,000 pages) would keep.
    for i in 0..100 {
        app.create_org(&format!("Org {i}")).await;
    }
    // A second connection asks for a checkpoint; its answer's `log` is the frames in the log
    // now (since the app's connection last restarted it).
    let db = sea_orm::Database::connect(app.db_url.as_str()).await.unwrap();
    let row = sea_orm::ConnectionTrait::query_one_raw(
        &db,
        sea_orm::Statement::from_string(sea_orm::DbBackend::Sqlite, "PRAGMA wal_checkpoint(PASSIVE)"),
    )
    .await
    .unwrap()
    .unwrap();
    let log: i32 = row.try_get_by_index(1).unwrap();
    db.close().await.ok();
    assert!(
        (0..=64).contains(&log),
        "{log} frames in the log: checkpoints every 16 pages leave at most a commit more"
    );
}

/// Whether a second request, sent after `idle` on the connection that carried a first one, is
/// answered (else keel closed the connection meanwhile).
async fn answered_after_idle(app: &TestApp, idle: std::time::Duration) -> bool {
    use std::io::{Read, Write};
    let address = app.address.trim_start_matches("http://").to_owned();
    tokio::task::spawn_blocking(move || {
        let mut client = std::net::TcpStream::connect(address).unwrap();
        client
            .set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let request = b"GET /healthz HTTP/1.1\r\nHost: keel\r\n\r\n";
        let mut answer = [0u8; 1024];
        client.write_all(request).unwrap();
        let read = client.read(&mut answer).unwrap();
        assert!(answer[..read].starts_with(b"HTTP/1.1 200"));
        std::thread::sleep(idle);
        // A closed connection fails the write, or reads its end (0 bytes) or a reset.
        client.write_all(request).is_ok()
            && client
                .read(&mut answer)
                .is_ok_and(|read| answer[..read].starts_with(b"HTTP/1.1 200"))
    })
    .await
    .unwrap()
}

#[actix_web::test]
async fn an_idle_client_connection_stays_open_for_the_configured_keep_alive() {
    use std::time::Duration;
    // Beyond actix-web's own 5 s (keel's default, 75 s, outlasts a balancer's idle timeout)...
    let long = spawn_app_with(|s| s.server.keep_alive_secs = 30).await;
    assert!(answered_after_idle(&long, Duration::from_secs(6)).await);
    // ...and below it.
    let short = spawn_app_with(|s| s.server.keep_alive_secs = 1).await;
    assert!(!answered_after_idle(&short, Duration::from_millis(2500)).await);
}

#[actix_web::test]
async fn every_operation_documents_the_answers_of_an_outage_and_of_a_slow_body() {
    let app = spawn_app().await;
    let doc = app.openapi().await;
    let mut checked = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let responses = operation["responses"].as_object().unwrap();
            assert!(responses.contains_key("503"), "{method} {path}");
            if operation.get("requestBody").is_some() {
                assert!(responses.contains_key("408"), "{method} {path}");
                checked += 1;
            }
        }
    }
    assert!(checked > 30, "{checked}");
}
