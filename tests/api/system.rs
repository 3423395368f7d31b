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
    ("delete", "/api/api-keys/{api_key_id}"),
    ("get", "/api/projects"),
    ("post", "/api/projects"),
    ("get", "/api/projects/{project_id}"),
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
