//! Several instances on one database, in process: invalidations and job wake-ups reach the
//! other instance, long-poll claims, a held balance row, stalled-ledger health, the metrics
//! an operator alerts on. (The process-level chaos tests are in `chaos.rs`.)

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::fakes::FakeProvider;
use crate::helpers::*;
use crate::proxy::{chat, proxy_app, sdk_request};

async fn enqueue(app: &TestApp, org: &TestOrg, project: &str, action: &str) -> Value {
    json_of(
        app.post(
            "/api/training/jobs",
            &org.api_key,
            &json!({"projectId": project, "action": action}),
        )
        .await,
        StatusCode::ACCEPTED,
    )
    .await
}

fn claim(app: &TestApp, worker: &str, action: &str, wait: Option<&str>) -> reqwest::RequestBuilder {
    let mut request = app
        .request(
            Method::POST,
            "/api/training/internal/jobs/claim",
            Some(INTERNAL_KEY),
        )
        .json(&json!({"worker_id": worker, "action": action, "limit": 1}));
    if let Some(wait) = wait {
        request = request.header("Prefer", wait);
    }
    request
}

#[actix_web::test]
async fn a_waiting_claim_gets_the_job_enqueued_meanwhile_and_an_idle_one_answers_empty() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    app.fund(&org, 1000).await;
    let project = app.create_project(&org, "Support").await;

    // Nothing queued, wait=1: answers empty once the wait is over.
    let idle = claim(&app, "w-idle", "tracer", Some("wait=1"))
        .send()
        .await
        .unwrap();
    assert_eq!(json_of(idle, StatusCode::OK).await, json!({"jobs": []}));

    // A claim waiting up to 20 s receives the job enqueued while it waits, long before that.
    let started = Instant::now();
    let waiting = actix_web::rt::spawn(claim(&app, "w-1", "tracer", Some("respond-async, wait=20")).send());
    actix_web::rt::time::sleep(Duration::from_millis(300)).await;
    // A job of another action does not end the wait.
    enqueue(&app, &org, &project, "draft").await;
    let job = enqueue(&app, &org, &project, "tracer").await;
    let claimed = json_of(waiting.await.unwrap().unwrap(), StatusCode::OK).await;
    assert_eq!(claimed["jobs"][0]["job_id"], job["jobId"], "{claimed}");
    assert!(started.elapsed() < Duration::from_secs(15));

    // Without the header a claim answers at once, as the spec has it.
    let at_once = claim(&app, "w-2", "tracer", None).send().await.unwrap();
    assert_eq!(json_of(at_once, StatusCode::OK).await, json!({"jobs": []}));
}

#[actix_web::test]
async fn a_waiting_claim_on_one_instance_gets_a_job_enqueued_on_the_other() {
    if !postgres_or_skip() {
        return; // One instance on SQLite.
    }
    let first = spawn_app().await;
    let second = spawn_on(TestDb::reuse(&first.db_url), test_settings(&first.db_url)).await;
    let org = first.create_org("Acme").await;
    first.fund(&org, 1000).await;
    let project = first.create_project(&org, "Support").await;
    let waiting = actix_web::rt::spawn(claim(&second, "w-1", "tracer", Some("wait=20")).send());
    actix_web::rt::time::sleep(Duration::from_millis(500)).await;
    let job = enqueue(&first, &org, &project, "tracer").await;
    let claimed = json_of(waiting.await.unwrap().unwrap(), StatusCode::OK).await;
    assert_eq!(claimed["jobs"][0]["job_id"], job["jobId"], "{claimed}");
}

/// Two instances on one PostgreSQL database with one fake provider, an organization and a
/// project. Verified keys stay cached far longer than the test: only a notification ends them.
async fn two_proxy_instances() -> (FakeProvider, TestApp, TestApp, TestOrg, String) {
    let (provider, url) = FakeProvider::start();
    let configure = |s: &mut keel_core::config::Settings| {
        s.providers.openai_url = format!("{url}/openai/v1");
        s.proxy.auth_cache_ttl_ms = 600_000;
    };
    let first = spawn_app_with(configure).await;
    let mut settings = test_settings(&first.db_url);
    configure(&mut settings);
    let second = spawn_on(TestDb::reuse(&first.db_url), settings).await;
    let org = first.create_org("Acme").await;
    let project = first.create_project(&org, "Support").await;
    (provider, first, second, org, project)
}

#[actix_web::test]
async fn a_key_revoked_on_one_instance_is_refused_by_the_other_within_a_second() {
    if !postgres_or_skip() {
        return;
    }
    let (_provider, first, second, org, project) = two_proxy_instances().await;
    let call = || sdk_request(&second, &org, Some(&project), &chat("gpt-4o-mini", "hi")).send();
    assert_eq!(
        call().await.unwrap().status(),
        StatusCode::OK,
        "the key works and is cached"
    );

    let revoked = first
        .delete(
            &format!("/api/internal/api-keys/{}", org.api_key_id),
            INTERNAL_KEY,
        )
        .await;
    assert_eq!(revoked.status(), StatusCode::OK);
    let at = Instant::now();
    let mut refused_after = None;
    while at.elapsed() < Duration::from_secs(3) {
        if call().await.unwrap().status() == StatusCode::UNAUTHORIZED {
            refused_after = Some(at.elapsed());
            break;
        }
        actix_web::rt::time::sleep(Duration::from_millis(20)).await;
    }
    let refused_after = refused_after.expect("the other instance refuses the revoked key");
    assert!(
        refused_after < Duration::from_secs(1),
        "refused after {refused_after:?}"
    );
    let text = second.metrics_text().await;
    assert!(metric(&text, "keel_cache_invalidations_received_total{kind=\"key\"}") >= 1.0);
}

#[actix_web::test]
async fn a_held_balance_row_answers_503_within_the_bound_and_holds_up_no_other_organization() {
    if !postgres_or_skip() {
        return; // SQLite has no row locks (one writer connection serializes everything).
    }
    let app = spawn_app_with(|s| s.database.lock_timeout_ms = 500).await;
    let held = app.create_org("Held").await;
    let free = app.create_org("Free").await;
    for org in [&held, &free] {
        app.fund(org, 10_000).await;
    }
    // Another session holds the held organization's balance row.
    let db = sea_orm::Database::connect(app.db_url.as_str()).await.unwrap();
    use sea_orm::{ConnectionTrait, TransactionTrait};
    let txn = db.begin().await.unwrap();
    txn.execute_unprepared(&format!(
        "SELECT * FROM billing_accounts WHERE org_id = '{}' FOR UPDATE",
        held.org_id
    ))
    .await
    .unwrap();

    let debit = |org: &TestOrg, run: String| {
        let sent = app.post_later(
            "/api/billing/debit",
            &org.api_key,
            &json!({"orgId": org.org_id, "runId": run}),
        );
        async move {
            let response = sent.await;
            let status = response.status();
            (status, response.json::<Value>().await.unwrap_or(Value::Null))
        }
    };
    let started = Instant::now();
    let mut calls = vec![debit(&held, "h-1".into())];
    calls.extend((0..40).map(|i| debit(&free, format!("f-{i}"))));
    let answers = join_all(calls).await;
    let held_answer = &answers[0];
    assert_eq!(
        held_answer.0,
        StatusCode::SERVICE_UNAVAILABLE,
        "{:?}",
        held_answer.1
    );
    assert!(
        held_answer.1["detail"]
            .as_str()
            .unwrap_or("")
            .contains("same Idempotency-Key"),
        "{:?}",
        held_answer.1
    );
    assert!(
        answers[1..].iter().all(|(status, _)| *status == StatusCode::OK),
        "{answers:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));

    // Released: the same request goes through, once.
    txn.rollback().await.unwrap();
    let again = debit(&held, "h-1".into()).await;
    assert_eq!(again.0, StatusCode::OK, "{:?}", again.1);
    let replay = debit(&held, "h-1".into()).await;
    assert_eq!(replay.0, StatusCode::OK);
    let (_, entries) = app.assert_ledger_invariant(&held.org_id).await;
    assert_eq!(entries, 2, "the top-up and one fee");
    db.close().await.ok();
}

#[actix_web::test]
async fn metrics_show_the_queue_the_money_and_the_proxy() {
    let (app, _provider) = proxy_app().await;
    let org = app.create_org("Acme").await;
    app.fund(&org, 1000).await;
    let project = app.create_project(&org, "Support").await;
    enqueue(&app, &org, &project, "tracer").await;
    enqueue(&app, &org, &project, "tracer").await;
    let claimed = json_of(
        claim(&app, "w-1", "tracer", None).send().await.unwrap(),
        StatusCode::OK,
    )
    .await;
    let job_id = claimed["jobs"][0]["job_id"].as_str().unwrap().to_owned();
    let reported = app
        .post(
            "/api/training/internal/jobs/succeeded",
            INTERNAL_KEY,
            &json!({"job_id": job_id, "worker_id": "w-1", "result": {}}),
        )
        .await;
    assert!(
        reported.status().is_success(),
        "{}",
        reported.text().await.unwrap()
    );
    let answered = sdk_request(&app, &org, Some(&project), &chat("gpt-4o-mini", "hi"))
        .send()
        .await
        .unwrap();
    assert_eq!(answered.status(), StatusCode::OK);

    let text = app.metrics_text().await;
    assert_eq!(
        metric(&text, "keel_queue_jobs{action=\"tracer\",status=\"queued\"}"),
        1.0,
        "{text}"
    );
    assert_eq!(
        metric(&text, "keel_queue_jobs{action=\"tracer\",status=\"succeeded\"}"),
        1.0
    );
    assert!(metric(&text, "keel_queue_oldest_queued_seconds{action=\"tracer\"}") >= 0.0);
    assert_eq!(metric(&text, "keel_queue_claimed_jobs_total"), 1.0);
    assert_eq!(
        metric(&text, "keel_queue_reports_total{outcome=\"applied\"}"),
        1.0
    );
    assert_eq!(
        metric(
            &text,
            "keel_ledger_operations_total{kind=\"topup\",outcome=\"applied\"}"
        ),
        1.0
    );
    assert_eq!(
        metric(
            &text,
            "keel_ledger_operations_total{kind=\"run_fee\",outcome=\"applied\"}"
        ),
        1.0
    );
    assert_eq!(metric(&text, "keel_payments_pending"), 0.0);
    assert_eq!(metric(&text, "keel_ledger_stalled_seconds"), 0.0);
    assert_eq!(
        metric(&text, "keel_proxy_upstream_seconds_count{provider=\"openai\"}"),
        1.0
    );
    assert_eq!(metric(&text, "keel_proxy_added_seconds_count"), 1.0);
    for name in [
        "keel_auto_topups_total",
        "keel_proxy_upstream_errors_total",
        "keel_trace_writer_lag_seconds",
        "keel_trace_writer_queue",
        "keel_queue_requeued_total",
        "keel_queue_attempts_exhausted_total",
        "keel_credit_grants_expired_total",
        "keel_credit_expired_microcents_total",
        "keel_auto_topup_limit_reached_total",
    ] {
        assert!(text.contains(&format!("# TYPE {name}")), "{name}:\n{text}");
    }
    // Tokens are counted once the trace writer has the call.
    assert!(
        eventually(|| async {
            let text = app.metrics_text().await;
            text.contains(
                "keel_proxy_tokens_total{kind=\"prompt\",model=\"gpt-4o-mini\",provider=\"openai\"}",
            )
        })
        .await,
        "{}",
        app.metrics_text().await
    );
}

#[actix_web::test]
async fn a_lost_listener_connection_clears_the_caches_and_reconnects() {
    if !postgres_or_skip() {
        return;
    }
    let (_provider, first, second, org, project) = two_proxy_instances().await;
    let call = || sdk_request(&second, &org, Some(&project), &chat("gpt-4o-mini", "hi")).send();
    assert_eq!(call().await.unwrap().status(), StatusCode::OK);

    // Every listener connection is cut (as a network blip or a failover would).
    let db = sea_orm::Database::connect(first.db_url.as_str()).await.unwrap();
    use sea_orm::ConnectionTrait;
    db.execute_unprepared(&format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = '{}'",
        keel_core::cluster::LISTENER_NAME
    ))
    .await
    .unwrap();
    db.close().await.ok();
    let reconnected = || async {
        let text = second.metrics_text().await;
        metric(&text, "keel_cluster_listener_reconnects_total") >= 1.0
    };
    assert!(eventually(reconnected).await, "the loss was noticed");

    // Listening again: a revocation still reaches the other instance at once.
    actix_web::rt::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(call().await.unwrap().status(), StatusCode::OK, "cached again");
    first
        .delete(
            &format!("/api/internal/api-keys/{}", org.api_key_id),
            INTERNAL_KEY,
        )
        .await;
    let refused = || async { call().await.unwrap().status() == StatusCode::UNAUTHORIZED };
    let at = Instant::now();
    assert!(eventually(refused).await);
    assert!(at.elapsed() < Duration::from_secs(1), "{:?}", at.elapsed());
}

#[actix_web::test]
async fn a_ledger_that_commits_nothing_while_work_waits_fails_healthz() {
    if !postgres_or_skip() {
        return;
    }
    let app = spawn_app_with(|s| {
        s.database.lock_timeout_ms = 30_000;
        s.billing.stall_after_secs = 1;
    })
    .await;
    let org = app.create_org("Held").await;
    app.fund(&org, 1000).await;
    let db = sea_orm::Database::connect(app.db_url.as_str()).await.unwrap();
    use sea_orm::{ConnectionTrait, TransactionTrait};
    let txn = db.begin().await.unwrap();
    txn.execute_unprepared(&format!(
        "SELECT * FROM billing_accounts WHERE org_id = '{}' FOR UPDATE",
        org.org_id
    ))
    .await
    .unwrap();
    let waiting = app.post_later(
        "/api/billing/debit",
        &org.api_key,
        &json!({"orgId": org.org_id, "runId": "r1"}),
    );
    let waiting = actix_web::rt::spawn(waiting);
    let stalled = || async {
        let health = app.request(Method::GET, "/healthz", None).send().await.unwrap();
        health.status() == StatusCode::SERVICE_UNAVAILABLE
            && health.json::<Value>().await.unwrap()
                == json!({"ok": false, "database": true, "ledger": false})
    };
    assert!(eventually(stalled).await, "healthz reports the stalled ledger");
    let text = app.metrics_text().await;
    assert!(metric(&text, "keel_ledger_stalled_seconds") >= 1.0);
    txn.rollback().await.unwrap();
    assert_eq!(waiting.await.unwrap().status(), StatusCode::OK);
    let health = app.request(Method::GET, "/healthz", None).send().await.unwrap();
    assert_eq!(
        json_of(health, StatusCode::OK).await,
        json!({"ok": true, "database": true})
    );
    db.close().await.ok();
}

#[actix_web::test]
async fn a_stopped_app_ends_its_background_work_and_leaves_no_connection_open() {
    // Stopped by its handle (as an embedding program or a test does, not by a signal), the
    // app's reconciler and its PostgreSQL listener end with it: neither keeps a session on
    // the database nor wakes up later to a closed pool.
    let db = TestDb::new().await;
    let app = keel::startup::Application::build(test_settings(&db.url))
        .await
        .unwrap();
    let (state, handle, port) = (app.state().clone(), app.handle(), app.port());
    let running = actix_web::rt::spawn(app.run_until_stopped());
    assert_eq!(
        reqwest::get(format!("http://127.0.0.1:{port}/healthz"))
            .await
            .unwrap()
            .status(),
        StatusCode::OK
    );
    handle.stop(true).await;
    running.await.unwrap().unwrap();
    assert!(state.cluster.stopping().is_cancelled());
    if postgres() {
        use sea_orm::ConnectionTrait;
        let observer = sea_orm::Database::connect(db.url.as_str()).await.unwrap();
        let others = || async {
            let row = observer
                .query_one_raw(sea_orm::Statement::from_string(
                    sea_orm::DbBackend::Postgres,
                    "SELECT count(*) AS n FROM pg_stat_activity \
                     WHERE datname = current_database() AND pid <> pg_backend_pid()",
                ))
                .await
                .unwrap()
                .unwrap();
            row.try_get::<i64>("", "n").unwrap()
        };
        assert!(
            eventually(|| async { others().await == 0 }).await,
            "{} sessions still open on the stopped app's database",
            others().await
        );
        observer.close().await.unwrap();
    }
}
