//! `keel admin` (issue 57): each command, run as a process on a running keel's database, does
//! what its HTTP route does (through the same services), prints a table or the API's JSON,
//! and exits 0, 1 (refused) or 2 (usage or configuration). On PostgreSQL its changes reach the
//! running instance at once (a revoked key is refused by the proxy, a resumed queue wakes a
//! waiting claim).

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::*;
use crate::queue::{claim, tracer, worker_post};

/// `keel admin ARGS` on `db_url`, with the suite's session secret.
fn admin(db_url: &str, args: &[&str]) -> Output {
    admin_with(db_url, args, &[("KEEL_SESSION_SECRET", SESSION_SECRET)])
}

fn admin_with(db_url: &str, args: &[&str], envs: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("admin")
        .args(args)
        .env("KEEL_DATABASE_URL", db_url)
        .env(
            "KEEL_CONFIG_DIR",
            env!("CARGO_MANIFEST_DIR").to_owned() + "/config",
        )
        .env_remove("KEEL_SESSION_SECRET")
        .envs(envs.iter().copied())
        .env("RUST_LOG", "warn")
        .output()
        .expect("keel runs")
}

/// A command that must succeed: its stdout.
#[track_caller]
fn ok(output: Output) -> String {
    assert!(
        output.status.success(),
        "exit {:?}: {}",
        output.status.code(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8")
}

/// A `--json` command that must succeed: its answer.
#[track_caller]
fn ok_json(output: Output) -> Value {
    let text = ok(output);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("JSON on stdout ({e}): {text}"))
}

/// A command that must fail with `code`: its message.
#[track_caller]
fn fails(output: Output, code: i32) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(code), "{stderr}");
    stderr
}

#[actix_web::test]
async fn every_admin_command_does_what_its_route_does_with_tables_json_and_exit_codes() {
    let app = spawn_app().await;
    let db = app.db_url.clone();
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Agents").await;

    // session: an owner's token after 24 h, by id or e-mail.
    let token = ok(admin(&db, &["session", "--user", &org.owner_id]));
    let verified = json_of(app.get("/api/auth/verify", token.trim()).await, StatusCode::OK).await;
    assert_eq!(verified["orgs"][&org.org_id], "owner");
    let by_id = ok_json(admin(&db, &["session", "--user", &org.owner_id, "--json"]));
    assert_eq!(by_id["userId"], org.owner_id.as_str());
    assert!(by_id["sessionToken"].is_string() && by_id["expiresAt"].is_string());
    assert!(fails(admin(&db, &["session", "--user", "nobody@nowhere"]), 1).contains("no user"));
    assert!(
        fails(admin_with(&db, &["session", "--user", &org.owner_id], &[]), 2).contains("KEEL_SESSION_SECRET")
    );

    // orgs list: a table with a header, or the list as JSON.
    let table = ok(admin(&db, &["orgs", "list"]));
    assert!(
        table.starts_with("ORG ID") && table.contains(&org.org_id) && table.contains("Acme"),
        "{table}"
    );
    let orgs = ok_json(admin(&db, &["orgs", "list", "--json"]));
    assert!(orgs["orgs"]
        .as_array()
        .unwrap()
        .iter()
        .any(|o| o["orgId"] == org.org_id.as_str()));

    // keys: list (never a secret), create (its secret once, accepted by the API), revoke.
    let keys = ok_json(admin(&db, &["keys", "list", "--org", &org.org_id, "--json"]));
    assert!(keys["keys"]
        .as_array()
        .unwrap()
        .iter()
        .any(|k| k["apiKeyId"] == org.api_key_id.as_str()));
    assert!(!keys.to_string().contains(&org.api_key), "no secret listed");
    let created = ok_json(admin(
        &db,
        &["keys", "create", "--org", &org.org_id, "--name", "cli", "--json"],
    ));
    let new_key = created["key"].as_str().unwrap().to_owned();
    json_of(app.get("/api/auth/verify", &new_key).await, StatusCode::OK).await;
    let revoked = ok(admin(
        &db,
        &[
            "keys",
            "revoke",
            "--org",
            &org.org_id,
            created["apiKeyId"].as_str().unwrap(),
        ],
    ));
    assert!(revoked.contains("true"), "{revoked}");
    assert_eq!(
        app.get("/api/auth/verify", &new_key).await.status(),
        StatusCode::UNAUTHORIZED
    );
    // Revoking again is the route's answer too (done); an unknown key is refused.
    ok(admin(
        &db,
        &[
            "keys",
            "revoke",
            "--org",
            &org.org_id,
            created["apiKeyId"].as_str().unwrap(),
        ],
    ));
    let unknown = fails(
        admin(
            &db,
            &[
                "keys",
                "revoke",
                "--org",
                &org.org_id,
                "0190d3c0-0000-7000-8000-000000000000",
            ],
        ),
        1,
    );
    assert!(unknown.to_lowercase().contains("not found"), "{unknown}");
    fails(
        admin(
            &db,
            &["keys", "list", "--org", "0190d3c0-0000-7000-8000-000000000000"],
        ),
        1,
    );

    // grants add: the route's body rules and idempotency; the balance moves once.
    let grant = [
        "grants",
        "add",
        "--org",
        &org.org_id,
        "--amount-cents",
        "700",
        "--reason",
        "goodwill",
        "--idempotency-key",
        "cli-1",
    ];
    let first = ok_json(admin(&db, &[&grant[..], &["--json"]].concat()));
    assert_eq!(first["kind"], "manual");
    assert_eq!(first["originalMicrocents"], 700_000_000i64);
    assert!(
        first["createdBy"].as_str().unwrap().starts_with("cli:"),
        "{first}"
    );
    let again = ok_json(admin(&db, &[&grant[..], &["--json"]].concat()));
    assert_eq!(again["grantId"], first["grantId"], "the same key grants once");
    let billing = json_of(
        app.get(&format!("/api/billing?orgId={}", org.org_id), &org.api_key)
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        billing["balanceMicrocents"]
            .as_i64()
            .or(billing["balance_microcents"].as_i64()),
        Some(700_000_000),
        "{billing}"
    );
    let other_body = [
        "grants",
        "add",
        "--org",
        &org.org_id,
        "--amount-cents",
        "800",
        "--reason",
        "goodwill",
        "--idempotency-key",
        "cli-1",
    ];
    assert!(fails(admin(&db, &other_body), 1).contains("Idempotency-Key"));
    let zero = [
        "grants",
        "add",
        "--org",
        &org.org_id,
        "--amount-cents",
        "0",
        "--reason",
        "r",
        "--idempotency-key",
        "cli-2",
    ];
    assert!(fails(admin(&db, &zero), 2).contains("amountCents"));
    let bad_time = [
        "grants",
        "add",
        "--org",
        &org.org_id,
        "--amount-cents",
        "5",
        "--reason",
        "r",
        "--expires-at",
        "soon",
        "--idempotency-key",
        "cli-3",
    ];
    assert!(fails(admin(&db, &bad_time), 2).contains("expiresAt"));

    // jobs: list by status, retry a failed one (its route's rules: a queued one is refused).
    let job_id = tracer(&app, &org, &project).await;
    let listed = ok_json(admin(
        &db,
        &[
            "jobs",
            "list",
            "--org",
            &org.org_id,
            "--status",
            "queued",
            "--json",
        ],
    ));
    assert_eq!(listed["jobs"][0]["jobId"], job_id.as_str(), "{listed}");
    let table = ok(admin(&db, &["jobs", "list", "--org", &org.org_id]));
    assert!(table.contains(&job_id) && table.contains("queued"), "{table}");
    let refused = fails(admin(&db, &["jobs", "retry", &job_id]), 1);
    assert!(
        refused.contains("queued"),
        "a queued job is not retried: {refused}"
    );
    let held = claim(&app, "w-cli", "tracer", 1).await;
    assert_eq!(held[0]["job_id"], job_id.as_str());
    let failed = worker_post(
        &app,
        "failed",
        json!({"job_id": job_id, "worker_id": "w-cli", "error": "boom"}),
    )
    .await;
    assert_eq!(failed.status(), StatusCode::OK);
    let retried = ok_json(admin(&db, &["jobs", "retry", &job_id, "--json"]));
    assert_eq!(retried["status"], "queued", "{retried}");
    assert_eq!(crate::queue::job(&app, &org, &job_id).await["status"], "queued");
    fails(
        admin(
            &db,
            &["jobs", "list", "--org", &org.org_id, "--status", "sleeping"],
        ),
        2,
    );

    // queue: status, pause and resume (as the operator's routes see them).
    let status = ok_json(admin(&db, &["queue", "status", "--json"]));
    assert_eq!(status["actions"].as_array().unwrap().len(), 4);
    let paused = ok_json(admin(&db, &["queue", "pause", "tracer", "--json"]));
    assert_eq!(paused["paused"], true);
    assert!(
        claim(&app, "w-cli", "tracer", 1).await.is_empty(),
        "a paused action hands out nothing"
    );
    let table = ok(admin(&db, &["queue", "resume", "tracer"]));
    assert!(table.contains("tracer") && table.contains("running"), "{table}");
    assert_eq!(claim(&app, "w-cli", "tracer", 1).await.len(), 1);
    assert!(fails(admin(&db, &["queue", "pause", "sleeping"]), 2).contains("unknown action"));

    // webhooks list: the organization's endpoints, never their secrets.
    let endpoint = json_of(
        app.post(
            "/api/webhooks/endpoints",
            &org.api_key,
            &json!({"url": "https://hooks.example.com/keel", "events": ["job.failed"]}),
        )
        .await,
        StatusCode::CREATED,
    )
    .await;
    let hooks = ok_json(admin(&db, &["webhooks", "list", "--org", &org.org_id, "--json"]));
    assert_eq!(hooks["endpoints"][0]["endpointId"], endpoint["endpointId"]);
    assert!(!hooks.to_string().contains(endpoint["secret"].as_str().unwrap()));
    let table = ok(admin(&db, &["webhooks", "list", "--org", &org.org_id]));
    assert!(table.contains("https://hooks.example.com/keel"), "{table}");

    // Usage: an unknown command or a missing flag is 2 (clap's own).
    fails(admin(&db, &["keys", "list"]), 2);
    fails(admin(&db, &["nothing"]), 2);
}

/// PostgreSQL: a command's change reaches a running instance at once, as its route's would:
/// the proxy refuses a key revoked from the command line (its cache is told), and a claim
/// waiting on a paused action gets its job when the command line resumes it.
#[actix_web::test]
async fn on_postgres_admin_changes_reach_a_running_instance_at_once() {
    if !postgres_or_skip() {
        return;
    }
    let (app, _provider) = crate::proxy::proxy_app().await;
    let db = app.db_url.clone();
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "Support").await;
    app.fund(&org, 1000).await;
    let call = || {
        crate::proxy::sdk_request(
            &app,
            &org,
            Some(&project),
            &crate::proxy::chat("gpt-4o-mini", "hi"),
        )
        .send()
    };
    assert_eq!(
        call().await.unwrap().status(),
        StatusCode::OK,
        "the key is cached by the proxy now"
    );
    ok(admin(
        &db,
        &["keys", "revoke", "--org", &org.org_id, &org.api_key_id],
    ));
    // The proxy holds keys for 5 minutes (`proxy.auth_cache_ttl_ms`): refused within the
    // moment the announcement takes to arrive, not at the entry's expiry.
    let revoked_at = Instant::now();
    assert!(
        eventually(|| async { call().await.unwrap().status() == StatusCode::UNAUTHORIZED }).await,
        "the revoked key is refused"
    );
    assert!(
        revoked_at.elapsed() < Duration::from_secs(10),
        "{:?}",
        revoked_at.elapsed()
    );

    let other = app.create_org("Beta").await;
    let other_project = app.create_project(&other, "Agents").await;
    app.fund(&other, 1000).await;
    ok(admin(&db, &["queue", "pause", "draft"]));
    let job_id = crate::queue::enqueue(&app, &other, &other_project, json!({"action": "draft"})).await
        ["jobId"]
        .as_str()
        .unwrap()
        .to_owned();
    let waiting = app
        .request(reqwest::Method::POST, crate::queue::CLAIM, Some(INTERNAL_KEY))
        .header("Prefer", "wait=20")
        .json(&json!({"worker_id": "w-wait", "action": "draft", "limit": 1}))
        .send();
    let waiting = actix_web::rt::spawn(waiting);
    actix_web::rt::time::sleep(Duration::from_millis(500)).await;
    let resumed_at = Instant::now();
    ok(admin(&db, &["queue", "resume", "draft"]));
    let answer: Value = waiting.await.unwrap().unwrap().json().await.unwrap();
    assert_eq!(answer["jobs"][0]["job_id"], job_id.as_str(), "{answer}");
    // Woken by the command's announcement, not by the end of its 20 s wait.
    assert!(
        resumed_at.elapsed() < Duration::from_secs(10),
        "{:?}",
        resumed_at.elapsed()
    );
}
