//! The `keel serve` process and its log output: a closed or stuck log pipe never blocks a
//! request or the shutdown; lines carry no colour codes off a terminal, no query value
//! that could be a credential, and no warning per request.

use std::io::Read;
use std::process::{Child, ChildStderr, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::*;

/// A `keel serve` child process on a fresh database.
struct Served {
    child: Child,
    base: String,
    client: reqwest::Client,
    _db: TestDb,
}

async fn serve(buffered_lines: usize, log_filter: &str) -> Served {
    serve_with(buffered_lines, log_filter, &[]).await
}

async fn serve_with(buffered_lines: usize, log_filter: &str, envs: &[(&str, &str)]) -> Served {
    let db = TestDb::new().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let child = Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("serve")
        .env("KEEL_DATABASE_URL", &db.url)
        .env("KEEL_LISTEN", format!("127.0.0.1:{port}"))
        .env("KEEL_INTERNAL_KEYS", INTERNAL_KEY)
        .env("KEEL_SESSION_SECRET", SESSION_SECRET)
        .env("KEEL__TELEMETRY__BUFFERED_LINES", buffered_lines.to_string())
        .env("KEEL__SERVER__WORKERS", "2")
        .env("RUST_LOG", log_filter)
        .envs(envs.iter().copied())
        .env(
            "KEEL_CONFIG_DIR",
            env!("CARGO_MANIFEST_DIR").to_owned() + "/config",
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("keel starts");
    let served = Served {
        child,
        base: format!("http://127.0.0.1:{port}"),
        client: reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap(),
        _db: db,
    };
    for _ in 0..600 {
        if let Ok(response) = served.client.get(served.url("/healthz")).send().await {
            if response.status() == StatusCode::OK {
                return served;
            }
        }
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("keel serve did not become ready");
}

impl Served {
    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `n` requests, `concurrency` at a time; every one must be answered 200.
    async fn healthz_many(&self, n: usize, concurrency: usize) {
        use futures_util::StreamExt;
        let statuses: Vec<_> = futures_util::stream::iter(0..n)
            .map(|_| async {
                self.client
                    .get(self.url("/healthz"))
                    .send()
                    .await
                    .map(|r| r.status())
            })
            .buffer_unordered(concurrency)
            .collect()
            .await;
        for status in statuses {
            assert_eq!(status.expect("answered"), StatusCode::OK);
        }
    }

    /// `keel_log_lines_dropped_total` as `/metrics` shows it now.
    async fn dropped_lines(&self) -> f64 {
        let metrics = self
            .client
            .get(self.url("/metrics"))
            .bearer_auth(INTERNAL_KEY)
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        metric(&metrics, "keel_log_lines_dropped_total")
    }

    /// SIGTERM, then the exit must follow within 20 s; answers whether it exited cleanly.
    async fn terminate(mut self) -> bool {
        let signalled = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(signalled.success());
        for _ in 0..400 {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.success();
            }
            actix_web::rt::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        panic!("keel did not stop within 20 s of SIGTERM");
    }
}

/// Reads the child's stderr to the end on a thread of its own.
fn capture(stderr: ChildStderr) -> Arc<Mutex<Vec<u8>>> {
    let captured = Arc::new(Mutex::new(Vec::new()));
    let sink = captured.clone();
    std::thread::spawn(move || {
        let mut stderr = stderr;
        let mut chunk = [0u8; 8192];
        while let Ok(n) = stderr.read(&mut chunk) {
            if n == 0 {
                break;
            }
            sink.lock().unwrap().extend_from_slice(&chunk[..n]);
        }
    });
    captured
}

#[actix_web::test]
async fn a_closed_log_pipe_neither_fails_requests_nor_holds_the_shutdown() {
    // As `keel serve 2>&1 | head`: the reader is gone, every write is refused.
    let mut served = serve(4096, "info").await;
    drop(served.child.stdout.take());
    drop(served.child.stderr.take());
    served.healthz_many(300, 8).await;
    // The writer thread counts each refused line as it comes to it.
    assert!(
        eventually(|| async { served.dropped_lines().await >= 300.0 }).await,
        "every refused line is counted"
    );
    assert!(served.terminate().await, "a clean exit");
}

#[actix_web::test]
async fn a_stuck_log_reader_neither_blocks_requests_nor_holds_the_shutdown() {
    // The reader is alive but never reads: the pipe (64 KiB) and the writer's buffer (64
    // lines) fill up, and later lines are dropped instead of waited for.
    let mut served = serve(64, "info").await;
    let _stuck = served.child.stderr.take();
    served.healthz_many(2_000, 8).await;
    assert!(served.dropped_lines().await > 0.0);
    assert!(served.terminate().await, "a clean exit");
}

#[actix_web::test]
async fn log_lines_carry_no_colour_no_query_values_and_no_per_request_warning() {
    // At debug, a request's span carries its path and the query's names.
    let mut served = serve(4096, "info,keel::request=debug").await;
    let output = capture(served.child.stderr.take().unwrap());
    let secret = "keel_sk_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789";
    let listed = served
        .client
        .get(served.url(&format!("/api/projects?key={secret}&limit=5")))
        .bearer_auth(INTERNAL_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(listed.status(), StatusCode::FORBIDDEN);
    let org = served
        .client
        .post(served.url("/api/internal/orgs"))
        .bearer_auth(INTERNAL_KEY)
        .json(&json!({"name": "Acme", "ownerUserId": "ada"}))
        .send()
        .await
        .unwrap()
        .json::<serde_json::Value>()
        .await
        .unwrap();
    for _ in 0..3 {
        let put = served
            .client
            .put(served.url("/api/internal/adapters/acme/support-bot"))
            .bearer_auth(INTERNAL_KEY)
            .json(&json!({"orgId": org["orgId"], "baseModel": "meta-llama/Llama-3.1-8B-Instruct"}))
            .send()
            .await
            .unwrap();
        assert_eq!(put.status(), StatusCode::OK);
    }
    assert!(served.terminate().await, "a clean exit");
    actix_web::rt::time::sleep(Duration::from_millis(100)).await;
    let text = String::from_utf8_lossy(&output.lock().unwrap()).into_owned();
    assert!(
        text.contains("/api/projects?key&limit=5"),
        "the path and the names are logged: {text}"
    );
    assert!(
        !text.contains(secret),
        "no query value that could be a credential"
    );
    assert!(!text.contains("AbCdEfGh"), "not even a part of it");
    assert!(!text.contains('\u{1b}'), "no colour codes into a pipe: {text}");
    assert!(
        text.contains("/api/internal/adapters/acme/support-bot"),
        "the adapter calls are logged: {text}"
    );
    assert!(!text.contains("WARN"), "no warning on any of these calls: {text}");
}

#[actix_web::test]
async fn at_info_a_request_is_one_short_line() {
    let mut served = serve(4096, "info").await;
    let output = capture(served.child.stderr.take().unwrap());
    let listed = served
        .client
        .get(served.url("/api/projects?key=keel_sk_secret&limit=5"))
        .bearer_auth(INTERNAL_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(listed.status(), StatusCode::FORBIDDEN);
    let request_id = listed.headers()["x-request-id"].to_str().unwrap().to_owned();
    assert!(served.terminate().await, "a clean exit");
    actix_web::rt::time::sleep(Duration::from_millis(100)).await;
    let text = String::from_utf8_lossy(&output.lock().unwrap()).into_owned();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains(&request_id)).collect();
    assert_eq!(lines.len(), 1, "one line for the request: {text}");
    let line = lines[0];
    // Fields as key=value: the method, the concrete path, the route, the status, the time.
    for field in [
        "method=\"GET\"",
        "path=\"/api/projects\"",
        "route=\"/api/projects\"",
        "status=403",
        "latency_ms=",
    ] {
        assert!(line.contains(field), "{field}: {line}");
    }
    assert!(
        !line.contains("keel_sk_secret") && !line.contains("user_agent"),
        "{line}"
    );
    // Start-up said where it serves, on which database (no credentials) and how it charges.
    assert!(text.contains("keel is serving on http://127.0.0.1:"), "{text}");
    assert!(text.contains("payments: simulated"), "{text}");
}

#[actix_web::test]
async fn a_failed_provider_call_is_logged_with_its_cause_and_without_credentials() {
    // The base URL carries user information: it must not reach the log.
    let closed = crate::fakes::closed_port_url();
    let port = closed.rsplit(':').next().unwrap().to_owned();
    let openai = closed.replacen("http://", "http://ops:hunter2@", 1) + "/v1";
    let mut served = serve_with(4096, "info", &[("KEEL_PROVIDER_OPENAI_URL", &openai)]).await;
    let output = capture(served.child.stderr.take().unwrap());
    let (_org_id, key) = org_with_key(&served.client, &served.base, "acme").await;
    let call = served
        .client
        .post(served.url("/v1/chat/completions"))
        .bearer_auth(&key)
        .header("X-Service-Provider", "openai")
        .header("X-Service-Provider-Key", "sk-provider-secret")
        .header("X-Service-Record", "false")
        .json(&json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(call.status(), StatusCode::BAD_GATEWAY);
    let answered = call.text().await.unwrap();
    assert!(
        answered.contains("openai") && !answered.contains("127.0.0.1") && !answered.contains(&port),
        "the detail names the provider, not where keel reaches it: {answered}"
    );
    assert!(!answered.contains("hunter2"), "not its password: {answered}");
    assert!(served.terminate().await, "a clean exit");
    actix_web::rt::time::sleep(Duration::from_millis(100)).await;
    let text = String::from_utf8_lossy(&output.lock().unwrap()).into_owned();
    let line = text
        .lines()
        .find(|l| l.contains("calling the provider failed"))
        .unwrap_or_else(|| panic!("the failure is logged: {text}"));
    assert!(line.contains("WARN"), "{line}");
    assert!(line.contains("Unreachable"), "its kind: {line}");
    assert!(
        line.contains("127.0.0.1") && line.contains(&port),
        "where: {line}"
    );
    assert!(
        line.to_lowercase().contains("connection refused"),
        "its cause: {line}"
    );
    assert!(
        !text.contains("hunter2") && !text.contains("sk-provider-secret"),
        "no credential: {text}"
    );
}

#[actix_web::test]
async fn json_request_lines_are_fields_the_relay_logs_its_path_and_bad_clients_are_no_errors() {
    let (_provider, url) = crate::fakes::FakeProvider::start();
    let openai = format!("{url}/openai/v1");
    let mut served = serve_with(
        4096,
        "info",
        &[
            ("KEEL__TELEMETRY__FORMAT", "json"),
            ("KEEL_PROVIDER_OPENAI_URL", &openai),
        ],
    )
    .await;
    let output = capture(served.child.stderr.take().unwrap());
    let (_org_id, key) = org_with_key(&served.client, &served.base, "acme").await;
    let relayed = served
        .client
        .get(served.url(&format!("/v1/models?limit=2&key={key}")))
        .bearer_auth(&key)
        .header("X-Service-Provider", "openai")
        .header("X-Service-Provider-Key", "sk-provider-secret")
        .send()
        .await
        .unwrap();
    assert_eq!(relayed.status(), StatusCode::OK);
    let relayed_id = relayed.headers()["x-keel-request-id"]
        .to_str()
        .unwrap()
        .to_owned();
    // A docs asset (a route with a tail) and a malformed request from a client.
    let docs = served.client.get(served.url("/docs/")).send().await.unwrap();
    assert!(docs.status().is_success() || docs.status().is_redirection());
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = tokio::net::TcpStream::connect(served.base.trim_start_matches("http://"))
            .await
            .unwrap();
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: a\r\nBad Header Line\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(3), stream.read_to_end(&mut answer)).await;
    }
    assert!(served.terminate().await, "a clean exit");
    actix_web::rt::time::sleep(Duration::from_millis(100)).await;
    let text = String::from_utf8_lossy(&output.lock().unwrap()).into_owned();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(!lines.is_empty(), "JSON lines: {text}");
    let request = lines
        .iter()
        .find(|l| l["request_id"] == relayed_id.as_str())
        .unwrap_or_else(|| panic!("the relayed call's line: {text}"));
    assert_eq!(request["method"], "GET");
    assert_eq!(request["route"], "/v1/{tail:.*}");
    assert_eq!(request["path"], "/v1/models", "the path, without its query");
    assert_eq!(request["status"], 200);
    assert!(request["latency_ms"].as_f64().is_some(), "{request}");
    assert!(
        !text.contains(&key) && !text.contains("sk-provider-secret"),
        "no credential: {text}"
    );
    for line in &lines {
        assert_ne!(line["level"], "ERROR", "{line}");
        assert_ne!(line["level"], "WARN", "{line}");
    }
}

#[actix_web::test]
async fn a_stream_that_breaks_is_one_warning_and_its_request_line_says_so() {
    let (_provider, url) = crate::fakes::RawProvider::start();
    let openai = format!("{url}/v1");
    let mut served = serve_with(
        4096,
        "info",
        &[
            ("KEEL__TELEMETRY__FORMAT", "json"),
            ("KEEL_PROVIDER_OPENAI_URL", &openai),
        ],
    )
    .await;
    let output = capture(served.child.stderr.take().unwrap());
    let (_org_id, key) = org_with_key(&served.client, &served.base, "acme").await;
    let call = served
        .client
        .post(served.url("/v1/chat/completions"))
        .bearer_auth(&key)
        .header("X-Service-Provider", "openai")
        .header("X-Service-Provider-Key", "sk-provider-secret")
        .header("X-Service-Record", "false")
        .json(&json!({"model": "cut-close", "stream": true, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    let request_id = call.headers()["x-keel-request-id"].to_str().unwrap().to_owned();
    assert!(call.bytes().await.is_err(), "the body is aborted");
    assert!(served.terminate().await, "a clean exit");
    actix_web::rt::time::sleep(Duration::from_millis(100)).await;
    let text = String::from_utf8_lossy(&output.lock().unwrap()).into_owned();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let of_call: Vec<&serde_json::Value> = lines
        .iter()
        .filter(|l| l["request_id"] == request_id.as_str())
        .collect();
    let warnings: Vec<_> = of_call.iter().filter(|l| l["level"] == "WARN").collect();
    assert_eq!(warnings.len(), 1, "one warning: {text}");
    assert!(
        warnings[0]["cause"]
            .as_str()
            .unwrap()
            .contains("ended before [DONE]"),
        "{text}"
    );
    let request = of_call
        .iter()
        .find(|l| l["message"] == "request")
        .unwrap_or_else(|| panic!("the request line: {text}"));
    assert_eq!(request["status"], 200);
    assert!(
        request["stream_error"]
            .as_str()
            .unwrap()
            .contains("ended before [DONE]"),
        "{request}"
    );
    assert!(!lines.iter().any(|l| l["level"] == "ERROR"), "{text}");
}

#[actix_web::test]
async fn at_sigterm_every_task_the_core_started_reports_its_stop() {
    let mut served = serve(4096, "info").await;
    let output = capture(served.child.stderr.take().unwrap());
    served.healthz_many(10, 2).await;
    assert!(served.terminate().await, "a clean exit");
    actix_web::rt::time::sleep(Duration::from_millis(100)).await;
    let text = String::from_utf8_lossy(&output.lock().unwrap()).into_owned();
    let named = |what: &str| -> Vec<String> {
        let pattern = regex::Regex::new(&format!(r#"{what} task="([^"]+)""#)).unwrap();
        let mut names: Vec<String> = pattern.captures_iter(&text).map(|c| c[1].to_owned()).collect();
        names.sort();
        names
    };
    let started = named("task started");
    let stopped = named("task stopped");
    // What runs on every database with the default settings (the listener only on PostgreSQL).
    for task in [
        "auto top-up",
        "credit expiry",
        "key usage",
        "open streams",
        "payments reconciler",
        "search indexer",
        "trace retention",
        "trace writer",
        "webhook dispatcher",
    ] {
        assert!(started.iter().any(|s| s == task), "{task} started: {text}");
    }
    if postgres() {
        assert!(started.iter().any(|s| s == "cluster listener"), "{text}");
    }
    assert_eq!(started, stopped, "every task that started stopped: {text}");
    let drained = text.find("background work stopped").expect("shutdown finished");
    let last_stop = text.rfind("task stopped").unwrap();
    assert!(last_stop < drained, "every task stopped before the pool closed");
}

/// Issue 57: an operator reads what happened from the log alone. A scripted session (an
/// organization and its key, a grant, a charge, a job created, claimed, failed and retried, a
/// webhook that cannot be delivered, the key revoked) leaves one line per domain event with
/// its ids, request lines that name the organization, key, job and worker, a failed
/// delivery that names the request that caused it, and no secret anywhere.
#[actix_web::test]
async fn a_scripted_session_is_told_by_its_log_with_ids_and_without_secrets() {
    // A port nobody listens on: every delivery fails (connection refused).
    let dead = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let mut served = serve_with(
        8192,
        "info",
        &[
            ("KEEL__TELEMETRY__FORMAT", "json"),
            ("KEEL__WEBHOOKS__ALLOW_HTTP", "true"),
            ("KEEL__WEBHOOKS__ALLOW_PRIVATE_DESTINATIONS", "true"),
        ],
    )
    .await;
    let output = capture(served.child.stderr.take().unwrap());
    let http = served.client.clone();
    let (org_id, key) = org_with_key(&http, &served.base, "logged").await;
    let post = |path: &str, token: &str, body: serde_json::Value| {
        http.post(served.url(path)).bearer_auth(token).json(&body).send()
    };
    let granted = http
        .post(served.url("/api/internal/billing/grants"))
        .bearer_auth(INTERNAL_KEY)
        .header("Idempotency-Key", "goodwill-1")
        .json(&json!({"orgId": org_id, "amountCents": 5000, "reason": "goodwill"}))
        .send()
        .await
        .unwrap();
    assert_eq!(granted.status(), StatusCode::CREATED);
    let charged = post(
        "/api/billing/debit",
        &key,
        json!({"orgId": org_id, "runId": "run-1"}),
    )
    .await
    .unwrap();
    assert_eq!(charged.status(), StatusCode::OK);
    let charge_id = charged.headers()["x-request-id"].to_str().unwrap().to_owned();
    let endpoint = post(
        "/api/webhooks/endpoints",
        &key,
        json!({"url": format!("http://127.0.0.1:{dead}/hook"), "events": ["job.failed"]}),
    )
    .await
    .unwrap();
    assert_eq!(endpoint.status(), StatusCode::CREATED);
    let endpoint: serde_json::Value = endpoint.json().await.unwrap();
    let webhook_secret = endpoint["secret"].as_str().unwrap().to_owned();
    let endpoint_id = endpoint["endpointId"]
        .as_str()
        .or(endpoint["id"].as_str())
        .unwrap()
        .to_owned();
    let project: serde_json::Value = post("/api/projects", &key, json!({"name": "logged"}))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let queued: serde_json::Value = post(
        "/api/training/jobs",
        &key,
        json!({"projectId": project["id"], "action": "tracer"}),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    let job_id = queued["jobId"]
        .as_str()
        .or(queued["id"].as_str())
        .unwrap()
        .to_owned();
    let claimed = post(
        "/api/training/internal/jobs/claim",
        INTERNAL_KEY,
        json!({"worker_id": "w-logged", "action": "tracer", "limit": 1}),
    )
    .await
    .unwrap();
    assert_eq!(claimed.status(), StatusCode::OK);
    let failed = post(
        "/api/training/internal/jobs/failed",
        INTERNAL_KEY,
        json!({"job_id": job_id, "worker_id": "w-logged", "error": "out of memory"}),
    )
    .await
    .unwrap();
    assert_eq!(failed.status(), StatusCode::OK);
    let failed_id = failed.headers()["x-request-id"].to_str().unwrap().to_owned();
    let retried = post(&format!("/api/training/jobs/{job_id}/retry"), &key, json!({}))
        .await
        .unwrap();
    assert!(retried.status().is_success(), "{}", retried.status());
    let key_id = http
        .get(served.url("/api/api-keys"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json::<serde_json::Value>()
        .await
        .unwrap();
    let key_id = key_id["keys"]
        .as_array()
        .or(key_id.as_array())
        .and_then(|keys| keys.first())
        .and_then(|k| k["id"].as_str().or(k["apiKeyId"].as_str()))
        .expect("the key's id")
        .to_owned();
    // The delivery fails at its first attempt, within a second or two.
    let delivery_failed = |text: &str| text.contains("\"webhook.delivery_failed\"");
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while !delivery_failed(&String::from_utf8_lossy(&output.lock().unwrap()))
        && std::time::Instant::now() < deadline
    {
        actix_web::rt::time::sleep(Duration::from_millis(100)).await;
    }
    let revoked = http
        .delete(served.url(&format!("/api/internal/api-keys/{key_id}")))
        .bearer_auth(INTERNAL_KEY)
        .send()
        .await
        .unwrap();
    assert!(revoked.status().is_success(), "{}", revoked.status());
    assert!(served.terminate().await, "a clean exit");
    actix_web::rt::time::sleep(Duration::from_millis(100)).await;
    let text = String::from_utf8_lossy(&output.lock().unwrap()).into_owned();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let event =
        |name: &str| -> Vec<&serde_json::Value> { lines.iter().filter(|l| l["event"] == name).collect() };
    let one = |name: &str| -> &serde_json::Value {
        let found = event(name);
        assert!(!found.is_empty(), "a {name} line: {text}");
        found[0]
    };
    assert_eq!(one("key.created")["org_id"], org_id.as_str());
    assert_eq!(one("key.created")["api_key_id"], key_id.as_str());
    let grant = one("grant.issued");
    assert_eq!(grant["org_id"], org_id.as_str());
    assert_eq!(grant["amount_cents"], 5000);
    let created = one("job.created");
    assert_eq!(created["job_id"], job_id.as_str());
    assert_eq!(created["org_id"], org_id.as_str());
    let claimed = one("job.claimed");
    assert_eq!(claimed["job_id"], job_id.as_str());
    assert_eq!(claimed["worker_id"], "w-logged");
    assert_eq!(claimed["org_id"], org_id.as_str());
    let ended = one("job.ended");
    assert_eq!(ended["job_id"], job_id.as_str());
    assert_eq!(ended["outcome"], "failed");
    assert_eq!(ended["org_id"], org_id.as_str());
    assert_eq!(ended["worker_id"], "w-logged");
    let retried = one("job.retried");
    assert_eq!(retried["job_id"], job_id.as_str());
    let delivery = one("webhook.delivery_failed");
    assert_eq!(delivery["endpoint_id"], endpoint_id.as_str());
    assert_eq!(delivery["org_id"], org_id.as_str());
    assert_eq!(delivery["event_type"], "job.failed");
    assert_eq!(
        delivery["request_id"],
        failed_id.as_str(),
        "the report that caused it"
    );
    assert!(
        delivery["next_attempt_at"].is_string() && delivery["error"].is_string(),
        "{delivery}"
    );
    assert_eq!(one("key.revoked")["api_key_id"], key_id.as_str());
    // Request lines: the charge names its organization and key (by id); the worker's report
    // its job and worker; the retry its job (from the path).
    let request = |id: &str| -> &serde_json::Value {
        lines
            .iter()
            .find(|l| l["message"] == "request" && l["request_id"] == id)
            .unwrap_or_else(|| panic!("the request line of {id}: {text}"))
    };
    let charge = request(&charge_id);
    assert_eq!(charge["org_id"], org_id.as_str());
    assert_eq!(charge["api_key_id"], key_id.as_str());
    assert_eq!(charge["path"], "/api/billing/debit");
    assert_eq!(charge["route"], "/api/billing/debit");
    let report = request(&failed_id);
    assert_eq!(report["job_id"], job_id.as_str());
    assert_eq!(report["worker_id"], "w-logged");
    let retry = lines
        .iter()
        .find(|l| l["message"] == "request" && l["route"] == "/api/training/jobs/{job_id}/retry")
        .expect("the retry's request line");
    assert_eq!(retry["path"], format!("/api/training/jobs/{job_id}/retry"));
    assert_eq!(retry["job_id"], job_id.as_str());
    assert_eq!(retry["org_id"], org_id.as_str());
    // No secret anywhere: the API key, the webhook's signing secret, the internal key, the
    // session secret.
    for secret in [
        key.as_str(),
        webhook_secret.as_str(),
        INTERNAL_KEY,
        SESSION_SECRET,
    ] {
        assert!(!text.contains(secret), "a secret in the log: {text}");
    }
}

/// Issue 57: with `telemetry.otlp_endpoint` keel exports its own spans as OTLP/HTTP protobuf
/// (decoded here with the protocol's generated types), whatever the log filter: a request's
/// span continues the caller's `traceparent`, and its children (the service, the ledger
/// commit, the database statements) carry the same trace id.
#[actix_web::test]
async fn keel_exports_its_spans_over_otlp_continuing_the_callers_trace() {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use prost::Message;
    let (collector, url) = crate::fakes::FakeJson::start(|_| crate::fakes::Reply::Empty(200));
    let (provider, provider_url) = crate::fakes::FakeProvider::start();
    let (receiver, receiver_url) =
        crate::fakes::FakeJson::start(|_| crate::fakes::Reply::Json(200, json!({})));
    let openai = format!("{provider_url}/openai/v1");
    // A base URL: keel appends /v1/traces. The log says nothing below WARN.
    let served = serve_with(
        4096,
        "warn",
        &[
            ("KEEL__TELEMETRY__OTLP_ENDPOINT", &url),
            ("KEEL_PROVIDER_OPENAI_URL", &openai),
            ("KEEL__WEBHOOKS__ALLOW_HTTP", "true"),
            ("KEEL__WEBHOOKS__ALLOW_PRIVATE_DESTINATIONS", "true"),
        ],
    )
    .await;
    let (org_id, key) = org_with_key(&served.client, &served.base, "traced").await;
    let granted = served
        .client
        .post(served.url("/api/internal/billing/grants"))
        .bearer_auth(INTERNAL_KEY)
        .header("Idempotency-Key", "traced-1")
        .json(&json!({"orgId": org_id, "amountCents": 5000, "reason": "goodwill"}))
        .send()
        .await
        .unwrap();
    assert_eq!(granted.status(), StatusCode::CREATED);
    let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
    let caller_span = "00f067aa0ba902b7";
    let charged = served
        .client
        .post(served.url("/api/billing/debit"))
        .bearer_auth(&key)
        .header("traceparent", format!("00-{trace_id}-{caller_span}-01"))
        .json(&json!({"orgId": org_id, "runId": "traced-run"}))
        .send()
        .await
        .unwrap();
    assert_eq!(charged.status(), StatusCode::OK);
    let traceparent = format!("00-{trace_id}-{caller_span}-01");
    // A proxied call: the provider gets the trace (a span of keel's as the parent).
    let proxied = served
        .client
        .post(served.url("/v1/chat/completions"))
        .bearer_auth(&key)
        .header("X-Service-Provider", "openai")
        .header("X-Service-Provider-Key", "sk-provider")
        .header("X-Service-Record", "false")
        .header("traceparent", &traceparent)
        .json(&json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(proxied.status(), StatusCode::OK);
    let sent = provider
        .calls()
        .last()
        .and_then(|c| c.headers.get("traceparent").cloned());
    let sent = sent.expect("a traceparent to the provider");
    assert!(
        sent.starts_with(&format!("00-{trace_id}-")) && !sent.contains(caller_span),
        "{sent}"
    );
    // A webhook: the event of a report made in the trace goes out with it.
    let endpoint = served
        .client
        .post(served.url("/api/webhooks/endpoints"))
        .bearer_auth(&key)
        .json(&json!({"url": format!("{receiver_url}/hook"), "events": ["job.failed"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(endpoint.status(), StatusCode::CREATED);
    let project: serde_json::Value = served
        .client
        .post(served.url("/api/projects"))
        .bearer_auth(&key)
        .json(&json!({"name": "traced"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let job: serde_json::Value = served
        .client
        .post(served.url("/api/training/jobs"))
        .bearer_auth(&key)
        .json(&json!({"projectId": project["id"], "action": "tracer"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let claim = served
        .client
        .post(served.url("/api/training/internal/jobs/claim"))
        .bearer_auth(INTERNAL_KEY)
        .json(&json!({"worker_id": "w-traced", "action": "tracer", "limit": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(claim.status(), StatusCode::OK);
    let failed = served
        .client
        .post(served.url("/api/training/internal/jobs/failed"))
        .bearer_auth(INTERNAL_KEY)
        .header("traceparent", &traceparent)
        .json(&json!({"job_id": job["jobId"], "worker_id": "w-traced", "error": "boom"}))
        .send()
        .await
        .unwrap();
    assert_eq!(failed.status(), StatusCode::OK);
    assert!(
        crate::helpers::eventually(|| async { !receiver.calls().is_empty() }).await,
        "the webhook is delivered"
    );
    let delivered = receiver.calls()[0].headers.get("traceparent").cloned();
    let delivered = delivered.expect("a traceparent to the webhook receiver");
    assert!(delivered.starts_with(&format!("00-{trace_id}-")), "{delivered}");
    // SIGTERM: the last batch goes out before the exit.
    assert!(served.terminate().await, "a clean exit");

    struct Exported {
        trace_id: String,
        span_id: String,
        parent: String,
        name: String,
    }
    let mut spans = Vec::new();
    for call in collector.calls() {
        assert_eq!(call.path, "/v1/traces");
        assert_eq!(
            call.headers.get("content-type").map(String::as_str),
            Some("application/x-protobuf")
        );
        let request = ExportTraceServiceRequest::decode(call.raw.as_slice()).expect("OTLP protobuf");
        for resource in request.resource_spans {
            let service = resource
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|a| a.key == "service.name")
                .map(|a| format!("{:?}", a.value));
            assert!(service.is_some_and(|s| s.contains("keel")), "service.name keel");
            for scope in resource.scope_spans {
                for span in scope.spans {
                    spans.push(Exported {
                        trace_id: hex::encode(&span.trace_id),
                        span_id: hex::encode(&span.span_id),
                        parent: hex::encode(&span.parent_span_id),
                        name: span.name,
                    });
                }
            }
        }
    }
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    let ours: Vec<&Exported> = spans.iter().filter(|s| s.trace_id == trace_id).collect();
    // Each request sent with the caller's traceparent is a child of the caller's span. They
    // are found by name: a span is exported when it ends, and a request's span ends only once
    // its children (work it started) have, so the order they arrive in is not theirs.
    let callers_children: Vec<&str> = ours
        .iter()
        .filter(|s| s.parent == caller_span)
        .map(|s| s.name.as_str())
        .collect();
    for sent in [
        "POST /api/billing/debit",
        "POST /v1/chat/completions",
        "POST /api/training/internal/jobs/failed",
    ] {
        assert!(
            callers_children.contains(&sent),
            "{sent}, child of the caller's span: {callers_children:?}"
        );
    }
    let request = ours
        .iter()
        .find(|s| s.parent == caller_span && s.name == "POST /api/billing/debit")
        .unwrap_or_else(|| panic!("the debit's span, child of the caller's: {names:?}"));
    let child_of = |parent: &str| {
        ours.iter()
            .filter(|s| s.parent == parent)
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>()
    };
    let service = ours
        .iter()
        .find(|s| s.name == "charge_run_fee")
        .unwrap_or_else(|| panic!("the service's span in the trace: {names:?}"));
    // The service's span hangs below the request's (through the extractors' spans, if any).
    let mut at = service.parent.clone();
    let mut hops = 0;
    while at != request.span_id {
        at = ours
            .iter()
            .find(|s| s.span_id == at)
            .unwrap_or_else(|| panic!("{at} in the trace: {:?}", child_of(&request.span_id)))
            .parent
            .clone();
        hops += 1;
        assert!(hops < 10);
    }
    assert!(
        ours.iter().any(|s| s.name == "ledger.commit"),
        "the ledger commit: {names:?}"
    );
    assert!(
        ours.iter().any(|s| s.name.starts_with("sea_orm.")),
        "database statements: {names:?}"
    );
    assert!(
        ours.iter().any(|s| s.name == "webhook.deliver"),
        "the delivery continues the trace: {names:?}"
    );
    // Other requests are traces of their own (no traceparent sent).
    assert!(spans
        .iter()
        .any(|s| s.trace_id != trace_id && s.name.starts_with("POST /api/internal/orgs")));
}
