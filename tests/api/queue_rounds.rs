//! The queue's second round: retries with backoff and the attempt history, idempotent and
//! unique creates, bulk enqueue, jobs blocked for funds, fair shares and caps, and the
//! queue's metrics.

use std::time::Duration;

use futures_util::future::join_all;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::console::{org_path, Console};
use crate::helpers::*;
use crate::queue::{claim, funded, job, tracer, worker_post, CLAIM};

fn history(view: &Value) -> Vec<(i64, String, String)> {
    view["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a["attempt"].as_i64().unwrap(),
                a["workerId"].as_str().unwrap_or("").to_owned(),
                a["outcome"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

async fn fail(app: &TestApp, id: &str, worker: &str, retryable: bool) -> StatusCode {
    worker_post(
        app,
        "failed",
        json!({"job_id": id, "worker_id": worker, "error": format!("boom from {worker}"), "retryable": retryable}),
    )
    .await
    .status()
}

/// Claims one job of `action` for `worker`, waiting up to `secs` for one to come due.
async fn claim_when_due(app: &TestApp, worker: &str, action: &str, secs: u64) -> Vec<Value> {
    let body = json!({"worker_id": worker, "action": action, "limit": 1});
    let response = app
        .request(Method::POST, CLAIM, Some(INTERNAL_KEY))
        .header("Prefer", format!("wait={secs}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    json_of(response, StatusCode::OK).await["jobs"]
        .as_array()
        .unwrap()
        .clone()
}

#[actix_web::test]
async fn a_retryable_failure_is_scheduled_after_a_backoff_until_its_attempts_are_spent() {
    let app = spawn_app_with(|s| {
        s.queue.max_attempts = 3;
        s.queue.retry_backoff_base_secs = 1;
        s.queue.retry_backoff_max_secs = 2;
    })
    .await;
    let (org, project) = funded(&app, "Flaky").await;
    let before = app.balance_microcents(&org).await;
    let id = tracer(&app, &org, &project).await;
    assert_eq!(claim(&app, "w1", "tracer", 1).await.len(), 1);
    let failed_at = chrono::Utc::now();
    assert_eq!(fail(&app, &id, "w1", true).await, StatusCode::OK);
    let view = job(&app, &org, &id).await;
    assert_eq!(view["status"], "scheduled");
    assert_eq!(view["error"], "boom from w1");
    assert!(view["workerId"].is_null());
    // Backoff of the first attempt: 1 s ± 20%.
    let due: chrono::DateTime<chrono::Utc> = view["scheduledAt"].as_str().unwrap().parse().unwrap();
    let wait = (due - failed_at).num_milliseconds();
    assert!((700..=1300).contains(&wait), "first backoff {wait} ms");
    assert_eq!(history(&view), vec![(1, "w1".into(), "retried".into())]);
    assert_eq!(view["history"][0]["error"], "boom from w1");
    assert!(view["history"][0]["claimedAt"].is_string() && view["history"][0]["endedAt"].is_string());
    // The same report again is harmless; not claimable before it is due.
    assert_eq!(fail(&app, &id, "w1", true).await, StatusCode::OK);
    assert!(claim(&app, "w2", "tracer", 1).await.is_empty());

    // Due: a waiting claim gets it, as attempt 2; the second backoff doubles (capped at 2 s).
    let second = claim_when_due(&app, "w2", "tracer", 5).await;
    assert_eq!(second.len(), 1);
    assert_eq!(second[0]["attempt"], 2);
    let failed_at = chrono::Utc::now();
    assert_eq!(fail(&app, &id, "w2", true).await, StatusCode::OK);
    let view = job(&app, &org, &id).await;
    let due: chrono::DateTime<chrono::Utc> = view["scheduledAt"].as_str().unwrap().parse().unwrap();
    let wait = (due - failed_at).num_milliseconds();
    assert!((1500..=2500).contains(&wait), "second backoff {wait} ms");
    let third = claim_when_due(&app, "w3", "tracer", 6).await;
    assert_eq!(third[0]["attempt"], 3);
    // No attempts left: failed, as without `retryable`.
    assert_eq!(fail(&app, &id, "w3", true).await, StatusCode::OK);
    let view = job(&app, &org, &id).await;
    assert_eq!(view["status"], "failed");
    assert_eq!(
        history(&view),
        vec![
            (1, "w1".into(), "retried".into()),
            (2, "w2".into(), "retried".into()),
            (3, "w3".into(), "failed".into()),
        ]
    );
    // One run fee for the job, whatever its attempts.
    assert_eq!(before - app.balance_microcents(&org).await, 100_000_000);
    app.assert_ledger_invariant(&org.org_id).await;

    let text = app.metrics_text().await;
    assert_eq!(metric(&text, "keel_queue_retries_total{action=\"tracer\"}"), 2.0);
    assert_eq!(
        metric(
            &text,
            "keel_queue_run_seconds_count{action=\"tracer\",outcome=\"retried\"}"
        ),
        2.0
    );
    assert_eq!(
        metric(
            &text,
            "keel_queue_run_seconds_count{action=\"tracer\",outcome=\"failed\"}"
        ),
        1.0
    );
    assert_eq!(
        metric(&text, "keel_queue_wait_seconds_count{action=\"tracer\"}"),
        3.0
    );
    // Every action's series exist from the start.
    assert_eq!(
        metric(&text, "keel_queue_retries_total{action=\"training\"}"),
        0.0
    );
    assert_eq!(
        metric(&text, "keel_queue_wait_seconds_count{action=\"draft\"}"),
        0.0
    );
}

#[actix_web::test]
async fn a_failure_without_retryable_or_of_a_stopping_job_is_not_retried() {
    let app = spawn_app_with(|s| s.queue.max_attempts = 5).await;
    let (org, project) = funded(&app, "Firm").await;
    let plain = tracer(&app, &org, &project).await;
    let stopping = tracer(&app, &org, &project).await;
    assert_eq!(claim(&app, "w1", "tracer", 2).await.len(), 2);
    assert_eq!(fail(&app, &plain, "w1", false).await, StatusCode::OK);
    assert_eq!(job(&app, &org, &plain).await["status"], "failed");
    // The user asked the job to stop: a retryable failure ends it.
    app.post(
        &format!("/api/training/jobs/{stopping}/stop"),
        &org.api_key,
        &json!({}),
    )
    .await;
    assert_eq!(fail(&app, &stopping, "w1", true).await, StatusCode::OK);
    assert_eq!(job(&app, &org, &stopping).await["status"], "failed");
    // A worker that does not hold the job cannot retry it.
    let other = tracer(&app, &org, &project).await;
    assert_eq!(claim(&app, "w2", "tracer", 1).await.len(), 1);
    assert_eq!(fail(&app, &other, "w9", true).await, StatusCode::CONFLICT);
    assert_eq!(job(&app, &org, &other).await["status"], "running");
}

#[actix_web::test]
async fn every_way_an_attempt_ends_is_in_the_history() {
    let app = spawn_app_with(|s| {
        s.queue.stale_after_secs = 1;
        s.queue.sweep_interval_secs = 0;
        s.queue.max_attempts = 10;
    })
    .await;
    let (org, project) = funded(&app, "Story").await;
    let id = tracer(&app, &org, &project).await;
    assert!(history(&job(&app, &org, &id).await).is_empty());
    // Interrupted: the worker restarted.
    claim(&app, "w1", "tracer", 1).await;
    let requeued = worker_post(&app, "requeue-interrupted", json!({"worker_id": "w1"})).await;
    assert_eq!(requeued.status(), StatusCode::OK);
    // Stale: no heartbeat.
    claim(&app, "w2", "tracer", 1).await;
    actix_web::rt::time::sleep(Duration::from_millis(1200)).await;
    let swept = json_of(
        worker_post(&app, "requeue-stale", json!({})).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(swept["requeued"], 1);
    // Blocked by the worker, retried by the user, stopped, retried, succeeded.
    claim(&app, "w3", "tracer", 1).await;
    worker_post(
        &app,
        "blocked",
        json!({"job_id": id, "worker_id": "w3", "reason": "no GPU"}),
    )
    .await;
    let retry = format!("/api/training/jobs/{id}/retry");
    assert_eq!(
        app.post(&retry, &org.api_key, &json!({})).await.status(),
        StatusCode::OK
    );
    claim(&app, "w4", "tracer", 1).await;
    app.post(&format!("/api/training/jobs/{id}/stop"), &org.api_key, &json!({}))
        .await;
    worker_post(&app, "user-stopped", json!({"job_id": id, "worker_id": "w4"})).await;
    let retried = json_of(app.post(&retry, &org.api_key, &json!({})).await, StatusCode::OK).await;
    assert_eq!(history(&retried).len(), 4, "a retry keeps the history");
    claim(&app, "w5", "tracer", 1).await;
    worker_post(&app, "succeeded", json!({"job_id": id, "worker_id": "w5"})).await;
    let view = job(&app, &org, &id).await;
    assert_eq!(
        history(&view),
        vec![
            (1, "w1".into(), "interrupted".into()),
            (2, "w2".into(), "stale".into()),
            (3, "w3".into(), "blocked".into()),
            (4, "w4".into(), "user_stopped".into()),
            (5, "w5".into(), "succeeded".into()),
        ]
    );
    assert_eq!(view["history"][2]["error"], "no GPU");
    // The list shows the history too.
    let list = json_of(app.get("/api/training/jobs", &org.api_key).await, StatusCode::OK).await;
    assert_eq!(history(&list["jobs"][0]).len(), 5);
    // A job blocked at its claim for want of funds: its attempt ends `blocked`.
    let broke = app.create_org("Broke").await;
    let broke_project = app.create_project(&broke, "P").await;
    let unpaid = tracer(&app, &broke, &broke_project).await;
    assert!(claim(&app, "w6", "tracer", 1).await.is_empty());
    assert_eq!(
        history(&job(&app, &broke, &unpaid).await),
        vec![(1, "w6".into(), "blocked".into())]
    );
}

async fn create_with_key(app: &TestApp, org: &TestOrg, key: &str, body: &Value) -> reqwest::Response {
    app.request(Method::POST, "/api/training/jobs", Some(&org.api_key))
        .header("Idempotency-Key", key)
        .json(body)
        .send()
        .await
        .unwrap()
}

async fn job_count(app: &TestApp, org: &TestOrg) -> usize {
    json_of(
        app.get("/api/training/jobs?limit=200", &org.api_key).await,
        StatusCode::OK,
    )
    .await["count"]
        .as_u64()
        .unwrap() as usize
}

#[actix_web::test]
async fn an_idempotency_key_makes_a_repeated_create_one_job() {
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Once").await;
    let body = json!({"action": "tracer", "projectId": project, "priority": 2});
    let first = json_of(
        create_with_key(&app, &org, "submit-1", &body).await,
        StatusCode::ACCEPTED,
    )
    .await;
    // The same body, spaced and ordered otherwise: the same job.
    let spaced = app
        .request(Method::POST, "/api/training/jobs", Some(&org.api_key))
        .header("Idempotency-Key", "submit-1")
        .header("content-type", "application/json")
        .body(format!(
            "{{ \"priority\": 2, \"action\" : \"tracer\",  \"projectId\": \"{project}\" }}"
        ))
        .send()
        .await
        .unwrap();
    let again = json_of(spaced, StatusCode::ACCEPTED).await;
    assert_eq!(again["jobId"], first["jobId"]);
    assert_eq!(job_count(&app, &org).await, 1);
    // The same key with another body: 409.
    let other = json!({"action": "tracer", "projectId": project, "priority": 3});
    let response = create_with_key(&app, &org, "submit-1", &other).await;
    assert_eq!(response.status(), StatusCode::CONFLICT);
    assert_eq!(
        response.json::<Value>().await.unwrap()["code"],
        "idempotency_key_reused"
    );
    // Another key, or another organization with the same key: another job.
    let second = json_of(
        create_with_key(&app, &org, "submit-2", &body).await,
        StatusCode::ACCEPTED,
    )
    .await;
    assert_ne!(second["jobId"], first["jobId"]);
    let (stranger, stranger_project) = funded(&app, "Stranger").await;
    let theirs = json!({"action": "tracer", "projectId": stranger_project, "priority": 2});
    let theirs = json_of(
        create_with_key(&app, &stranger, "submit-1", &theirs).await,
        StatusCode::ACCEPTED,
    )
    .await;
    assert_ne!(theirs["jobId"], first["jobId"]);
    // A bad key is a 422 naming the header.
    let long = "k".repeat(201);
    let response = create_with_key(&app, &org, &long, &body).await;
    let issues = validation_issues(response).await;
    assert_eq!(issues[0]["loc"], json!(["header", "Idempotency-Key"]));
    // Sent at once, many times: one job.
    let racing = (0..12).map(|_| create_with_key(&app, &org, "submit-3", &body));
    let answers = join_all(racing).await;
    let mut ids = Vec::new();
    for answer in answers {
        ids.push(json_of(answer, StatusCode::ACCEPTED).await["jobId"].clone());
    }
    ids.dedup();
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert_eq!(job_count(&app, &org).await, 3);
}

#[actix_web::test]
async fn a_unique_key_answers_the_open_job_until_it_ends() {
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Nightly").await;
    let body = json!({"action": "tracer", "projectId": project, "uniqueKey": "nightly-eval"});
    let first = json_of(
        app.post("/api/training/jobs", &org.api_key, &body).await,
        StatusCode::ACCEPTED,
    )
    .await;
    let again = json_of(
        app.post("/api/training/jobs", &org.api_key, &body).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(again["jobId"], first["jobId"]);
    // Still open while running.
    let id = first["jobId"].as_str().unwrap();
    assert_eq!(claim(&app, "w1", "tracer", 1).await.len(), 1);
    let running = json_of(
        app.post("/api/training/jobs", &org.api_key, &body).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(running["jobId"], id);
    assert_eq!(running["status"], "running");
    // Ended: the key is free again.
    worker_post(&app, "succeeded", json!({"job_id": id, "worker_id": "w1"})).await;
    let next = json_of(
        app.post("/api/training/jobs", &org.api_key, &body).await,
        StatusCode::ACCEPTED,
    )
    .await;
    assert_ne!(next["jobId"], id);
    // Scheduled jobs hold their key too; another organization's key is its own.
    let later = json!({"action": "tracer", "projectId": project, "uniqueKey": "later",
        "runAt": (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339()});
    let scheduled = json_of(
        app.post("/api/training/jobs", &org.api_key, &later).await,
        StatusCode::ACCEPTED,
    )
    .await;
    assert_eq!(scheduled["status"], "scheduled");
    let same = json_of(
        app.post("/api/training/jobs", &org.api_key, &later).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(same["jobId"], scheduled["jobId"]);
    let (other, other_project) = funded(&app, "Other").await;
    let theirs = json!({"action": "tracer", "projectId": other_project, "uniqueKey": "nightly-eval"});
    json_of(
        app.post("/api/training/jobs", &other.api_key, &theirs).await,
        StatusCode::ACCEPTED,
    )
    .await;
    // Bounds: 1..200.
    for bad in [json!(""), json!("k".repeat(201))] {
        let body = json!({"action": "tracer", "projectId": project, "uniqueKey": bad});
        let issues = validation_issues(app.post("/api/training/jobs", &org.api_key, &body).await).await;
        assert_eq!(issues[0]["loc"], json!(["body", "uniqueKey"]));
    }
    // Sent at once, many times: one job.
    let racing = json!({"action": "tracer", "projectId": project, "uniqueKey": "race"});
    let answers = join_all((0..12).map(|_| app.post("/api/training/jobs", &org.api_key, &racing))).await;
    let mut created = 0;
    let mut ids = Vec::new();
    for answer in answers {
        if answer.status() == StatusCode::ACCEPTED {
            created += 1;
        }
        assert!(answer.status().is_success());
        ids.push(answer.json::<Value>().await.unwrap()["jobId"].clone());
    }
    ids.dedup();
    assert_eq!((created, ids.len()), (1, 1));
}

#[actix_web::test]
async fn unique_keys_and_idempotency_keys_hold_across_two_instances() {
    if !postgres_or_skip() {
        return;
    }
    let app = spawn_app().await;
    let second = spawn_on(TestDb::reuse(&app.db_url), test_settings(&app.db_url)).await;
    let (org, project) = funded(&app, "Twice").await;
    let unique = json!({"action": "tracer", "projectId": project, "uniqueKey": "one"});
    let keyed = json!({"action": "draft", "projectId": project});
    let mut calls = Vec::new();
    for i in 0..10 {
        let instance = if i % 2 == 0 { &app } else { &second };
        calls.push(instance.post("/api/training/jobs", &org.api_key, &unique));
    }
    let unique_answers = join_all(calls).await;
    let keyed_answers = join_all((0..10).map(|i| {
        let instance = if i % 2 == 0 { &app } else { &second };
        create_with_key(instance, &org, "twice", &keyed)
    }))
    .await;
    let mut ids = std::collections::HashSet::new();
    for answer in unique_answers.into_iter().chain(keyed_answers) {
        assert!(answer.status().is_success(), "{}", answer.status());
        ids.insert(
            answer.json::<Value>().await.unwrap()["jobId"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    assert_eq!(ids.len(), 2);
    assert_eq!(job_count(&app, &org).await, 2);
}

#[actix_web::test]
async fn a_batch_queues_all_its_jobs_or_none() {
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Bulk").await;
    let later = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let body = json!({"jobs": [
        {"action": "tracer", "projectId": project, "priority": 1},
        {"action": "draft", "projectId": project, "prompt": "hi", "runAt": later},
        {"action": "tracer", "projectId": project, "uniqueKey": "dup"},
        {"action": "tracer", "projectId": project, "uniqueKey": "dup"},
    ]});
    let answer = json_of(
        app.post("/api/training/jobs/batch", &org.api_key, &body).await,
        StatusCode::ACCEPTED,
    )
    .await;
    let jobs = answer["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 4);
    assert_eq!(
        (jobs[0]["action"].as_str(), jobs[0]["priority"].as_i64()),
        (Some("tracer"), Some(1))
    );
    assert_eq!(jobs[1]["status"], "scheduled");
    assert_eq!(
        jobs[2]["jobId"], jobs[3]["jobId"],
        "a unique key within the batch"
    );
    assert_eq!(job_count(&app, &org).await, 3);
    // The most urgent of the batch is claimed first.
    assert_eq!(claim(&app, "w", "tracer", 1).await[0]["job_id"], jobs[0]["jobId"]);

    // One bad item: a 422 naming its index, nothing queued.
    let bad = json!({"jobs": [
        {"action": "tracer", "projectId": project},
        {"action": "tracer", "projectId": project, "priority": 12},
        {"action": "nope", "projectId": project},
    ]});
    let issues = validation_issues(app.post("/api/training/jobs/batch", &org.api_key, &bad).await).await;
    let locs: Vec<&Value> = issues.iter().map(|i| &i["loc"]).collect();
    assert!(
        locs.contains(&&json!(["body", "jobs", 1, "priority"])),
        "{issues:?}"
    );
    assert!(
        locs.contains(&&json!(["body", "jobs", 2, "action"])),
        "{issues:?}"
    );
    // A project of another organization: 404 as for one job, naming the item; nothing queued.
    let (_, foreign) = funded(&app, "Foreign").await;
    let bad = json!({"jobs": [
        {"action": "tracer", "projectId": project},
        {"action": "tracer", "projectId": foreign},
    ]});
    let response = app.post("/api/training/jobs/batch", &org.api_key, &bad).await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["code"], "project_not_found");
    assert!(answer["detail"].as_str().unwrap().contains("jobs[1]"), "{answer}");
    assert_eq!(job_count(&app, &org).await, 3);
    // 1..1000 items.
    for jobs in [
        json!([]),
        Value::Array(vec![json!({"action": "tracer", "projectId": project}); 1001]),
    ] {
        let issues = validation_issues(
            app.post("/api/training/jobs/batch", &org.api_key, &json!({"jobs": jobs}))
                .await,
        )
        .await;
        assert_eq!(issues[0]["loc"], json!(["body", "jobs"]));
    }
    let issues = validation_issues(
        app.post("/api/training/jobs/batch", &org.api_key, &json!({}))
            .await,
    )
    .await;
    assert_eq!(issues[0]["loc"], json!(["body", "jobs"]));
    // A thousand at once.
    app.fund(&org, 100_000).await;
    let many = Value::Array(vec![
        json!({"action": "training", "projectId": project, "model": "m", "environmentSlug": "a/b/c"});
        1000
    ]);
    let answer = json_of(
        app.post("/api/training/jobs/batch", &org.api_key, &json!({"jobs": many}))
            .await,
        StatusCode::ACCEPTED,
    )
    .await;
    assert_eq!(answer["jobs"].as_array().unwrap().len(), 1000);
    assert_eq!(claim(&app, "w", "training", 100).await.len(), 100);
}

#[actix_web::test]
async fn retry_policy_doubles_to_its_cap() {
    let policy = keel_core::queue::RetryPolicy {
        max_attempts: 10,
        backoff_base: chrono::Duration::seconds(30),
        backoff_max: chrono::Duration::seconds(3600),
    };
    let waits: Vec<i64> = (1..=9).map(|a| policy.backoff(a).num_seconds()).collect();
    assert_eq!(waits, vec![30, 60, 120, 240, 480, 960, 1920, 3600, 3600]);
    for attempt in 1..=9 {
        let plain = policy.backoff(attempt).num_milliseconds() as f64;
        let jittered = policy.jittered(attempt).num_milliseconds() as f64;
        assert!((plain * 0.8..=plain * 1.2).contains(&jittered));
    }
}

#[actix_web::test]
async fn jobs_blocked_for_funds_are_queued_again_at_the_next_credit() {
    let app = spawn_app().await;
    let org = app.create_org("Thin").await;
    let project = app.create_project(&org, "P").await;
    app.fund(&org, 100).await; // one run fee
    let paid = tracer(&app, &org, &project).await;
    let unpaid = tracer(&app, &org, &project).await;
    let handed = claim(&app, "w1", "tracer", 2).await;
    assert_eq!(handed.len(), 1);
    assert_eq!(handed[0]["job_id"], paid.as_str());
    assert_eq!(job(&app, &org, &unpaid).await["status"], "blocked");
    // The worker reports the paid job blocked: that one is the worker's to decide.
    worker_post(
        &app,
        "blocked",
        json!({"job_id": paid, "worker_id": "w1", "reason": "dataset missing"}),
    )
    .await;
    // A promo code credits the balance: the job blocked for funds is queued again.
    let promo = app
        .post(
            "/api/billing/promo-code",
            &org.api_key,
            &json!({"orgId": org.org_id, "code": "WELCOME10"}),
        )
        .await;
    assert_eq!(promo.status(), StatusCode::OK);
    assert!(eventually(|| async { job(&app, &org, &unpaid).await["status"] == "queued" }).await);
    let requeued = job(&app, &org, &unpaid).await;
    assert!(requeued["error"].is_null() && requeued["finishedAt"].is_null());
    assert_eq!(job(&app, &org, &paid).await["status"], "blocked");
    let again = claim(&app, "w2", "tracer", 5).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0]["job_id"], unpaid.as_str());
    // The claim refused for funds gave its attempt back (issue 54).
    assert_eq!(again[0]["attempt"], 1);

    // Turned off: a credit leaves them blocked.
    let app = spawn_app_with(|s| s.queue.requeue_blocked_on_credit = false).await;
    let org = app.create_org("Off").await;
    let project = app.create_project(&org, "P").await;
    let unpaid = tracer(&app, &org, &project).await;
    assert!(claim(&app, "w1", "tracer", 1).await.is_empty());
    app.fund(&org, 1000).await;
    actix_web::rt::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(job(&app, &org, &unpaid).await["status"], "blocked");
}

/// A keyed job's id, created (202) or answered by the open job with its key (200).
async fn keyed(app: &TestApp, org: &TestOrg, project: &str, key: &str, created: bool) -> String {
    let body = json!({"action": "tracer", "projectId": project, "uniqueKey": key});
    let status = if created {
        StatusCode::ACCEPTED
    } else {
        StatusCode::OK
    };
    json_of(app.post("/api/training/jobs", &org.api_key, &body).await, status).await["jobId"]
        .as_str()
        .unwrap()
        .to_owned()
}

async fn retry(app: &TestApp, org: &TestOrg, job_id: &str) -> reqwest::Response {
    app.post(
        &format!("/api/training/jobs/{job_id}/retry"),
        &org.api_key,
        &json!({}),
    )
    .await
}

#[actix_web::test]
async fn a_retry_leaves_a_job_whose_unique_key_another_open_job_holds() {
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Nightly").await;
    // The first run failed for good; the next was created with the key (the first is done).
    let first = keyed(&app, &org, &project, "nightly", true).await;
    assert_eq!(claim(&app, "w1", "tracer", 1).await.len(), 1);
    let failed = json!({"job_id": first, "worker_id": "w1", "error": "out of memory"});
    assert_eq!(worker_post(&app, "failed", failed).await.status(), StatusCode::OK);
    let second = keyed(&app, &org, &project, "nightly", true).await;
    assert_ne!(first, second);

    // Retrying the first while the second is open is a 409 naming the second, not a 500.
    let body = json_of(retry(&app, &org, &first).await, StatusCode::CONFLICT).await;
    assert_eq!(body["code"], "job_not_retryable");
    assert!(body["detail"].as_str().unwrap().contains(&second), "{body}");
    assert_eq!(job(&app, &org, &first).await["status"], "failed");

    // Both failed: a retry of both puts one back; the other stays failed.
    assert_eq!(claim(&app, "w1", "tracer", 1).await.len(), 1);
    let failed = json!({"job_id": second, "worker_id": "w1", "error": "out of memory"});
    assert_eq!(worker_post(&app, "failed", failed).await.status(), StatusCode::OK);
    let console = Console::sign_in(&app, &org.member_token).await;
    let both = [("do", "retry"), ("job", second.as_str()), ("job", first.as_str())];
    let (_, done) = console.confirm(&org_path(&org, "/jobs/bulk"), &both).await;
    assert!(
        done.contains("1 job(s) queued again; 1 left alone (not failed, blocked or stopped, or their uniqueKey held by an open job)."),
        "{done}"
    );
    let statuses = [
        job(&app, &org, &first).await["status"].clone(),
        job(&app, &org, &second).await["status"].clone(),
    ];
    assert!(
        statuses.contains(&json!("queued")) && statuses.contains(&json!("failed")),
        "{statuses:?}"
    );
    let open = keyed(&app, &org, &project, "nightly", false).await;

    // Once the open one is done, the other may be retried.
    assert_eq!(claim(&app, "w1", "tracer", 1).await[0]["job_id"], open.as_str());
    let succeeded = json!({"job_id": open, "worker_id": "w1"});
    assert_eq!(
        worker_post(&app, "succeeded", succeeded).await.status(),
        StatusCode::OK
    );
    let other = if open == first { &second } else { &first };
    let again = json_of(retry(&app, &org, other).await, StatusCode::OK).await;
    assert_eq!(again["status"], "queued");
    assert_eq!(keyed(&app, &org, &project, "nightly", false).await, *other);
}

#[actix_web::test]
async fn a_credit_requeues_the_jobs_blocked_for_funds_whose_unique_key_is_free() {
    let app = spawn_app().await;
    let org = app.create_org("Thin").await;
    let project = app.create_project(&org, "P").await;
    // Blocked at their claims for want of funds, one after another: two with one key (the
    // second created once the first was blocked: a blocked job is done), one whose key a
    // job created after it holds (queued), and one without a key.
    let mut blocked = Vec::new();
    for key in ["weekly", "weekly", "daily"] {
        blocked.push(keyed(&app, &org, &project, key, true).await);
        assert!(claim(&app, "w1", "tracer", 1).await.is_empty());
    }
    let holder = keyed(&app, &org, &project, "daily", true).await;
    let plain = tracer(&app, &org, &project).await;
    assert!(claim(&app, "w1", "tracer", 5).await.is_empty());
    for id in blocked.iter().chain([&plain]) {
        assert_eq!(job(&app, &org, id).await["status"], "blocked", "{id}");
    }
    assert_eq!(job(&app, &org, &holder).await["status"], "blocked");
    // The holder is blocked too now; queue it again by hand so it holds its key.
    assert_eq!(
        json_of(retry(&app, &org, &holder).await, StatusCode::OK).await["status"],
        "queued"
    );

    // Credited: the first with "weekly" and the one without a key are queued; the second
    // "weekly" and the "daily" whose key the holder has stay blocked, for a later credit.
    app.fund(&org, 10_000).await;
    let requeued = eventually(|| async { job(&app, &org, &plain).await["status"] == "queued" }).await;
    assert!(requeued, "{}", job(&app, &org, &plain).await);
    assert_eq!(job(&app, &org, &blocked[0]).await["status"], "queued");
    assert_eq!(job(&app, &org, &blocked[1]).await["status"], "blocked");
    assert_eq!(job(&app, &org, &blocked[2]).await["status"], "blocked");
    assert_eq!(job(&app, &org, &holder).await["status"], "queued");

    // The holder and the first "weekly" done, the next credit queues the rest.
    let handed = claim(&app, "w1", "tracer", 10).await;
    assert_eq!(handed.len(), 3, "{handed:?}");
    for item in &handed {
        let done = json!({"job_id": item["job_id"], "worker_id": "w1"});
        assert_eq!(
            worker_post(&app, "succeeded", done).await.status(),
            StatusCode::OK
        );
    }
    app.fund(&org, 1_000).await;
    assert!(eventually(|| async { job(&app, &org, &blocked[1]).await["status"] == "queued" }).await);
    assert_eq!(job(&app, &org, &blocked[2]).await["status"], "queued");
}

/// An organization with `jobs` queued tracer jobs (1,000 a batch) and money for all of them.
pub async fn backlogged(app: &TestApp, name: &str, jobs: usize) -> TestOrg {
    let org = app.create_org(name).await;
    let project = app.create_project(&org, "P").await;
    app.fund(&org, 100 * jobs as i64 + 1000).await;
    for chunk in (0..jobs).collect::<Vec<_>>().chunks(1000) {
        let items = vec![json!({"action": "tracer", "projectId": project}); chunk.len()];
        json_of(
            app.post("/api/training/jobs/batch", &org.api_key, &json!({"jobs": items}))
                .await,
            StatusCode::ACCEPTED,
        )
        .await;
    }
    org
}

pub async fn set_share(app: &TestApp, org: &TestOrg, body: Value) -> Value {
    json_of(
        app.put(
            &format!("/api/internal/orgs/{}/queue", org.org_id),
            INTERNAL_KEY,
            &body,
        )
        .await,
        StatusCode::OK,
    )
    .await
}

/// How many of `claimed` are each organization's.
fn split(claimed: &[Value], orgs: &[&TestOrg]) -> Vec<usize> {
    orgs.iter()
        .map(|org| {
            claimed
                .iter()
                .filter(|j| j["org_id"] == org.org_id.as_str())
                .count()
        })
        .collect()
}

#[actix_web::test]
async fn claims_share_jobs_across_organizations_by_weight() {
    let app = spawn_app().await;
    let heavy = backlogged(&app, "Heavy", 40).await;
    let light = backlogged(&app, "Light", 40).await;
    let view = set_share(&app, &heavy, json!({"weight": 3})).await;
    assert_eq!(
        (view["weight"].as_i64(), view["maxRunning"].is_null()),
        (Some(3), true)
    );
    // Twenty claims of one job each: 15 to 5 (±2).
    let mut claimed = Vec::new();
    for i in 0..20 {
        claimed.extend(claim(&app, &format!("w{i}"), "tracer", 1).await);
    }
    let shares = split(&claimed, &[&heavy, &light]);
    assert!(
        (13..=17).contains(&shares[0]) && shares[0] + shares[1] == 20,
        "{shares:?}"
    );
    // Two claims of ten: the same proportion.
    let mut claimed = claim(&app, "b1", "tracer", 10).await;
    claimed.extend(claim(&app, "b2", "tracer", 10).await);
    let shares = split(&claimed, &[&heavy, &light]);
    assert!(
        (13..=17).contains(&shares[0]) && shares[0] + shares[1] == 20,
        "{shares:?}"
    );
    // Equal weights share equally, one at a time.
    let a = backlogged(&app, "A", 10).await;
    let b = backlogged(&app, "B", 10).await;
    set_share(&app, &heavy, json!({"weight": 1, "maxRunning": 0})).await;
    set_share(&app, &light, json!({"weight": 1, "maxRunning": 0})).await;
    let mut claimed = Vec::new();
    for i in 0..16 {
        claimed.extend(claim(&app, &format!("e{i}"), "tracer", 1).await);
    }
    let shares = split(&claimed, &[&heavy, &light, &a, &b]);
    assert!(shares.iter().all(|n| (3..=5).contains(n)), "{shares:?}");
}

#[actix_web::test]
async fn weighted_shares_hold_across_two_instances() {
    if !postgres_or_skip() {
        return;
    }
    let app = spawn_app().await;
    let second = spawn_on(TestDb::reuse(&app.db_url), test_settings(&app.db_url)).await;
    let heavy = backlogged(&app, "Heavy", 30).await;
    let light = backlogged(&app, "Light", 30).await;
    set_share(&second, &heavy, json!({"weight": 3})).await;
    let mut claimed = Vec::new();
    for i in 0..20 {
        let instance = if i % 2 == 0 { &app } else { &second };
        claimed.extend(claim(instance, &format!("w{i}"), "tracer", 1).await);
    }
    let shares = split(&claimed, &[&heavy, &light]);
    assert!(
        (13..=17).contains(&shares[0]) && shares[0] + shares[1] == 20,
        "{shares:?}"
    );
    // At once from both instances: still the proportion, and no job twice.
    let racing = (0..20).map(|i| {
        let instance = if i % 2 == 0 { &app } else { &second };
        claim(instance, "racer", "tracer", 1)
    });
    let claimed: Vec<Value> = join_all(racing).await.into_iter().flatten().collect();
    let ids: std::collections::HashSet<&str> =
        claimed.iter().map(|j| j["job_id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), claimed.len());
    let shares = split(&claimed, &[&heavy, &light]);
    assert!((13..=17).contains(&shares[0]), "{shares:?}");
}

#[actix_web::test]
async fn no_organization_runs_more_than_its_cap() {
    let app = spawn_app_with(|s| s.queue.max_running_per_org = 2).await;
    let capped = backlogged(&app, "Capped", 6).await;
    let other = backlogged(&app, "Other", 6).await;
    let view = json_of(
        app.get(
            &format!("/api/internal/orgs/{}/queue", capped.org_id),
            INTERNAL_KEY,
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        (
            view["weight"].as_i64(),
            view["maxRunning"].is_null(),
            view["effectiveMaxRunning"].as_i64(),
            view["running"].as_i64()
        ),
        (Some(1), true, Some(2), Some(0))
    );
    // The default cap: two each, whatever the claim's size.
    let first = claim(&app, "w1", "tracer", 10).await;
    assert_eq!(split(&first, &[&capped, &other]), vec![2, 2]);
    assert!(claim(&app, "w2", "tracer", 10).await.is_empty());
    // One ends: one more may run.
    let done = first
        .iter()
        .find(|j| j["org_id"] == capped.org_id.as_str())
        .unwrap();
    worker_post(
        &app,
        "succeeded",
        json!({"job_id": done["job_id"], "worker_id": "w1"}),
    )
    .await;
    assert_eq!(
        split(&claim(&app, "w3", "tracer", 10).await, &[&capped, &other]),
        vec![1, 0]
    );
    // The operator's own cap overrides the default; 0 lifts it.
    let view = set_share(&app, &capped, json!({"maxRunning": 3})).await;
    assert_eq!(
        (view["effectiveMaxRunning"].as_i64(), view["running"].as_i64()),
        (Some(3), Some(2))
    );
    assert_eq!(
        split(&claim(&app, "w4", "tracer", 10).await, &[&capped, &other]),
        vec![1, 0]
    );
    set_share(&app, &other, json!({"maxRunning": 0})).await;
    assert_eq!(
        split(&claim(&app, "w5", "tracer", 10).await, &[&capped, &other]),
        vec![0, 4]
    );
}

#[actix_web::test]
async fn queue_shares_are_validated_and_need_an_organization() {
    let app = spawn_app().await;
    let org = app.create_org("Valid").await;
    let path = format!("/api/internal/orgs/{}/queue", org.org_id);
    for (body, field) in [
        (json!({"weight": 0}), "weight"),
        (json!({"weight": 101}), "weight"),
        (json!({"maxRunning": -1}), "maxRunning"),
        (json!({"weight": "3"}), "weight"),
    ] {
        let issues = validation_issues(app.put(&path, INTERNAL_KEY, &body).await).await;
        assert_eq!(issues[0]["loc"], json!(["body", field]), "{body}");
    }
    let unknown = format!("/api/internal/orgs/{}/queue", uuid::Uuid::new_v4());
    assert_error(app.get(&unknown, INTERNAL_KEY).await, StatusCode::NOT_FOUND).await;
    assert_error(
        app.put(&unknown, INTERNAL_KEY, &json!({"weight": 2})).await,
        StatusCode::NOT_FOUND,
    )
    .await;
    let issues = validation_issues(app.get("/api/internal/orgs/nope/queue", INTERNAL_KEY).await).await;
    assert_eq!(issues[0]["loc"], json!(["path", "org_id"]));
    // Not for organizations' own keys.
    assert_error(app.get(&path, &org.api_key).await, StatusCode::FORBIDDEN).await;
    // An empty body sets the defaults.
    let view = set_share(&app, &org, json!({})).await;
    assert_eq!(
        (view["weight"].as_i64(), view["maxRunning"].is_null()),
        (Some(1), true)
    );
}

#[actix_web::test]
async fn a_scheduled_job_waits_from_when_it_came_due() {
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Later").await;
    let due = chrono::Utc::now() + chrono::Duration::milliseconds(1500);
    let id = enqueue_at(&app, &org, &project, due).await;
    assert!(eventually(|| async { job(&app, &org, &id).await["status"] == "queued" }).await);
    // Created over 1.5 s ago, queued just now: the gauge counts from the latter.
    let text = app.metrics_text().await;
    let oldest = metric(&text, "keel_queue_oldest_queued_seconds{action=\"draft\"}");
    assert!(oldest < 1.4, "oldest queued {oldest}");
    let claimed = claim(&app, "w", "draft", 1).await;
    assert_eq!(claimed.len(), 1);
    let text = app.metrics_text().await;
    assert_eq!(
        metric(&text, "keel_queue_wait_seconds_count{action=\"draft\"}"),
        1.0
    );
    assert!(metric(&text, "keel_queue_wait_seconds_sum{action=\"draft\"}") < 1.4);
}

async fn enqueue_at(
    app: &TestApp,
    org: &TestOrg,
    project: &str,
    at: chrono::DateTime<chrono::Utc>,
) -> String {
    let body = json!({"action": "draft", "projectId": project, "runAt": at.to_rfc3339()});
    json_of(
        app.post("/api/training/jobs", &org.api_key, &body).await,
        StatusCode::ACCEPTED,
    )
    .await["jobId"]
        .as_str()
        .unwrap()
        .to_owned()
}
