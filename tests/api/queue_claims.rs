//! Issue 56: claims without a cluster-wide lock keep every guarantee (weights over many
//! concurrent claims, caps across instances, no job twice, the fee once), and workers report
//! and heartbeat many jobs in one request.

use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::*;
use crate::queue::{claim, funded, job, tracer, worker_post};
use crate::queue_rounds::{backlogged, set_share};

/// The instances a test claims through: one on SQLite, two sharing the database on
/// PostgreSQL.
async fn instances(configure: impl Fn(&mut keel_core::config::Settings) + Copy) -> Vec<TestApp> {
    let app = spawn_app_with(configure).await;
    if !postgres() {
        return vec![app];
    }
    let mut settings = test_settings(&app.db_url);
    configure(&mut settings);
    let second = spawn_on(TestDb::reuse(&app.db_url), settings).await;
    vec![app, second]
}

#[actix_web::test]
async fn weights_hold_over_five_hundred_concurrent_one_job_claims() {
    let apps = instances(|_| {}).await;
    let app = &apps[0];
    let heavy = backlogged(app, "Heavy", 400).await;
    let one = backlogged(app, "One", 400).await;
    let two = backlogged(app, "Two", 400).await;
    let _ = set_share(app, &heavy, json!({"weight": 3})).await;
    let before: Vec<i64> = join_all([&heavy, &one, &two].map(|org| app.balance_microcents(org))).await;
    // Sixteen claimers at once (spread over the instances), one job a claim, 500 in all.
    let left = Arc::new(AtomicI64::new(500));
    let claimers = (0..16).map(|i| {
        let instance = &apps[i % apps.len()];
        let left = left.clone();
        async move {
            let mut mine = Vec::new();
            while left.fetch_sub(1, Ordering::SeqCst) > 0 {
                let claimed = claim(instance, &format!("w{i}"), "tracer", 1).await;
                assert_eq!(claimed.len(), 1, "a claim found nothing while jobs were queued");
                mine.extend(claimed);
            }
            mine
        }
    });
    let claimed: Vec<Value> = join_all(claimers).await.into_iter().flatten().collect();
    assert_eq!(claimed.len(), 500);
    let ids: std::collections::HashSet<&str> =
        claimed.iter().map(|j| j["job_id"].as_str().unwrap()).collect();
    assert_eq!(ids.len(), 500, "a job was handed to two claims");
    let count = |org: &TestOrg| {
        claimed
            .iter()
            .filter(|j| j["org_id"] == org.org_id.as_str())
            .count() as f64
    };
    // Shares 3:1:1 of 500 (300, 100, 100), each within 10%.
    for (org, share) in [(&heavy, 300.0), (&one, 100.0), (&two, 100.0)] {
        let got = count(org);
        assert!(
            (got - share).abs() <= share * 0.1,
            "{}: {got} of 500, share {share}",
            org.org_id
        );
    }
    // Each job's fee charged once: every balance fell by one fee a job it was handed.
    let after: Vec<i64> = join_all([&heavy, &one, &two].map(|org| app.balance_microcents(org))).await;
    for (i, org) in [&heavy, &one, &two].into_iter().enumerate() {
        assert_eq!(
            before[i] - after[i],
            count(org) as i64 * 100 * 1_000_000,
            "{}",
            org.org_id
        );
        app.assert_ledger_invariant(&org.org_id).await;
    }
}

/// Claims that arrive together share claim statements: each is still answered as if alone
/// (its own limit, its own jobs, held by its own worker), a worker claiming twice at once gets
/// two answers, and no job goes to two of them.
#[actix_web::test]
async fn claims_arriving_together_are_each_answered_as_their_own() {
    let apps = instances(|_| {}).await;
    let app = &apps[0];
    let orgs = [
        backlogged(app, "A", 60).await,
        backlogged(app, "B", 60).await,
        backlogged(app, "C", 60).await,
    ];
    // Twelve workers, each claiming twice at once (1..=5 jobs a claim): 72 jobs of 180.
    let claims = (0..24).map(|i| {
        let instance = &apps[i % apps.len()];
        let worker = format!("together-{}", i / 2);
        let limit = (i % 5 + 1) as i64;
        async move {
            (
                worker.clone(),
                limit,
                claim(instance, &worker, "tracer", limit).await,
            )
        }
    });
    let answers = join_all(claims).await;
    let mut seen = std::collections::HashSet::new();
    for (worker, limit, jobs) in &answers {
        assert_eq!(jobs.len() as i64, *limit, "{worker} asked for {limit}: {jobs:?}");
        for claimed in jobs {
            let id = claimed["job_id"].as_str().unwrap();
            assert!(seen.insert(id.to_owned()), "{id} handed twice");
            let org = orgs
                .iter()
                .find(|o| claimed["org_id"] == o.org_id.as_str())
                .unwrap();
            let view = job(app, org, id).await;
            assert_eq!(view["status"], "running");
            assert_eq!(view["workerId"], worker.as_str(), "{id} is held by its claimant");
        }
    }
    let handed: i64 = answers.iter().map(|(_, limit, _)| limit).sum();
    assert_eq!(seen.len() as i64, handed);
    // The 24 claims took fewer statements than claims: some were served together.
    let (mut claims, mut statements) = (0.0, 0.0);
    for instance in &apps {
        let text = instance.get("/metrics", INTERNAL_KEY).await.text().await.unwrap();
        claims += metric(&text, "keel_queue_claims_per_statement_sum");
        statements += metric(&text, "keel_queue_claims_per_statement_count");
    }
    assert_eq!(claims, 24.0);
    assert!(statements < 24.0, "{statements} statements for 24 claims");
    // Every fee charged once: 100 cents a job handed.
    for org in &orgs {
        let mine = answers
            .iter()
            .flat_map(|(_, _, jobs)| jobs)
            .filter(|j| j["org_id"] == org.org_id.as_str())
            .count() as i64;
        assert_eq!(
            app.balance_microcents(org).await,
            (100 * 60 + 1000 - 100 * mine) * 1_000_000,
            "{}",
            org.org_id
        );
        app.assert_ledger_invariant(&org.org_id).await;
    }
}

#[actix_web::test]
async fn a_cap_holds_for_eight_claimers_on_every_instance() {
    let apps = instances(|_| {}).await;
    let app = &apps[0];
    let capped = backlogged(app, "Capped", 60).await;
    let free = backlogged(app, "Free", 200).await;
    let _ = set_share(app, &capped, json!({"maxRunning": 3})).await;
    let held = Arc::new(AtomicI64::new(0));
    let most = Arc::new(AtomicI64::new(0));
    let capped_claims = Arc::new(AtomicUsize::new(0));
    let claimers = (0..8).map(|i| {
        let instance = &apps[i % apps.len()];
        let (held, most, capped_claims) = (held.clone(), most.clone(), capped_claims.clone());
        let capped_id = capped.org_id.clone();
        async move {
            for _ in 0..12 {
                let worker = format!("w{i}");
                let claimed = claim(instance, &worker, "tracer", 1).await;
                let Some(job) = claimed.first() else { continue };
                let mine = job["org_id"] == capped_id.as_str();
                if mine {
                    capped_claims.fetch_add(1, Ordering::SeqCst);
                    let now = held.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                }
                actix_web::rt::time::sleep(Duration::from_millis(30)).await;
                if mine {
                    // Counted out before the report: the count never exceeds what the
                    // database holds.
                    held.fetch_sub(1, Ordering::SeqCst);
                }
                let done = worker_post(
                    instance,
                    "succeeded",
                    json!({"job_id": job["job_id"], "worker_id": worker}),
                )
                .await;
                assert_eq!(done.status(), StatusCode::OK);
            }
        }
    });
    join_all(claimers).await;
    let most = most.load(Ordering::SeqCst);
    assert!(most <= 3, "the capped organization held {most} jobs at once");
    assert!(
        capped_claims.load(Ordering::SeqCst) > 0 && most >= 2,
        "the cap was never approached ({most})"
    );
    let _ = free;
}

#[actix_web::test]
async fn many_reports_in_one_request_answer_each_as_its_own_route_would() {
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Reports").await;
    let ids: Vec<String> = join_all((0..5).map(|_| tracer(&app, &org, &project))).await;
    let claimed = claim(&app, "w1", "tracer", 5).await;
    assert_eq!(claimed.len(), 5);
    let unknown = uuid::Uuid::new_v4().to_string();
    let body = json!({"reports": [
        {"job_id": ids[0], "worker_id": "w1", "outcome": "succeeded", "result": {"loss": 0.1}},
        {"job_id": ids[1], "worker_id": "w1", "outcome": "failed", "error": "boom"},
        {"job_id": ids[2], "worker_id": "w1", "outcome": "blocked", "reason": "dataset missing"},
        {"job_id": ids[3], "worker_id": "w1", "outcome": "user_stopped"},
        {"job_id": ids[4], "worker_id": "someone-else", "outcome": "succeeded"},
        {"job_id": unknown, "worker_id": "w1", "outcome": "succeeded"},
        {"job_id": "not-an-id", "worker_id": "w1", "outcome": "succeeded"},
        // The same report again in the batch: a repeat, harmless.
        {"job_id": ids[0], "worker_id": "w1", "outcome": "succeeded"},
    ]});
    let answer = json_of(worker_post(&app, "reports", body).await, StatusCode::OK).await;
    let results: Vec<(String, bool, Value)> = answer["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["job_id"].as_str().unwrap().to_owned(),
                r["ok"].as_bool().unwrap(),
                r["error"].clone(),
            )
        })
        .collect();
    let expected = [
        (ids[0].clone(), true, Value::Null),
        (ids[1].clone(), true, Value::Null),
        (ids[2].clone(), true, Value::Null),
        (ids[3].clone(), true, Value::Null),
        (ids[4].clone(), false, json!("job_not_held")),
        (unknown.clone(), false, json!("job_not_found")),
        ("not-an-id".to_owned(), false, json!("job_not_found")),
        (ids[0].clone(), true, Value::Null),
    ];
    assert_eq!(results, expected);
    let statuses: Vec<Value> = join_all(ids.iter().map(|id| job(&app, &org, id)))
        .await
        .into_iter()
        .map(|view| view["status"].clone())
        .collect();
    assert_eq!(
        statuses,
        ["succeeded", "failed", "blocked", "user_stopped", "running"].map(|s| json!(s))
    );
    let done = job(&app, &org, &ids[0]).await;
    assert_eq!(done["result"], json!({"loss": 0.1}));
    assert_eq!(job(&app, &org, &ids[2]).await["error"], "dataset missing");

    // A retryable failure with attempts left is scheduled again, as its route does.
    let retried = tracer(&app, &org, &project).await;
    assert_eq!(claim(&app, "w2", "tracer", 1).await.len(), 1);
    let body = json!({"reports": [{"job_id": retried, "worker_id": "w2", "outcome": "failed", "error": "flaky", "retryable": true}]});
    let answer = json_of(worker_post(&app, "reports", body).await, StatusCode::OK).await;
    assert_eq!(answer["results"][0]["ok"], true);
    assert_eq!(job(&app, &org, &retried).await["status"], "scheduled");
}

#[actix_web::test]
async fn a_report_of_many_is_held_to_each_routes_rules() {
    let app = spawn_app().await;
    let id = uuid::Uuid::new_v4().to_string();
    for (reports, loc) in [
        (json!([]), json!(["body", "reports"])),
        (
            json!([{"job_id": id, "worker_id": "w", "outcome": "failed"}]),
            json!(["body", "reports", 0, "error"]),
        ),
        (
            json!([{"job_id": id, "worker_id": "w", "outcome": "failed", "error": ""}]),
            json!(["body", "reports", 0, "error"]),
        ),
        (
            json!([{"job_id": id, "worker_id": "w", "outcome": "succeeded"}, {"job_id": id, "worker_id": "w", "outcome": "blocked"}]),
            json!(["body", "reports", 1, "reason"]),
        ),
        (
            json!([{"job_id": id, "worker_id": "w", "outcome": "done"}]),
            json!(["body", "reports", 0, "outcome"]),
        ),
        (
            json!([{"job_id": id, "worker_id": "", "outcome": "succeeded"}]),
            json!(["body", "reports", 0, "worker_id"]),
        ),
    ] {
        let issues = validation_issues(worker_post(&app, "reports", json!({"reports": reports})).await).await;
        assert_eq!(issues[0]["loc"], loc, "{reports}");
    }
    let too_many: Vec<Value> = (0..1001)
        .map(|_| json!({"job_id": id, "worker_id": "w", "outcome": "succeeded"}))
        .collect();
    let issues = validation_issues(worker_post(&app, "reports", json!({"reports": too_many})).await).await;
    assert_eq!(issues[0]["loc"], json!(["body", "reports"]));
    // Only for the internal key.
    let (org, _) = funded(&app, "Outsider").await;
    let refused = app
        .post(
            "/api/training/internal/jobs/reports",
            &org.api_key,
            &json!({"reports": []}),
        )
        .await;
    assert!(
        matches!(refused.status(), StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN),
        "{}",
        refused.status()
    );
}

#[actix_web::test]
async fn one_heartbeat_covers_every_job_a_worker_holds() {
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Beats").await;
    let ids: Vec<String> = join_all((0..3).map(|_| tracer(&app, &org, &project))).await;
    assert_eq!(claim(&app, "w1", "tracer", 2).await.len(), 2);
    assert_eq!(claim(&app, "w2", "tracer", 1).await.len(), 1);
    let mut w1 = Vec::new();
    let mut w2 = Vec::new();
    for id in &ids {
        match job(&app, &org, id).await["workerId"].as_str() {
            Some("w1") => w1.push(id.clone()),
            _ => w2.push(id.clone()),
        }
    }
    let stop = app
        .post(
            &format!("/api/training/jobs/{}/stop", w1[1]),
            &org.api_key,
            &json!({}),
        )
        .await;
    assert_eq!(stop.status(), StatusCode::OK);
    let before = job(&app, &org, &w1[0]).await["heartbeatAt"].clone();
    actix_web::rt::time::sleep(Duration::from_millis(20)).await;
    let unknown = uuid::Uuid::new_v4().to_string();
    let body = json!({"worker_id": "w1", "job_ids": [w1[0], w1[1], w2[0], unknown, "nope"]});
    let answer = json_of(worker_post(&app, "heartbeats", body).await, StatusCode::OK).await;
    assert_eq!(
        answer["jobs"],
        json!([
            {"job_id": w1[0], "ok": true, "stop_requested": false},
            {"job_id": w1[1], "ok": true, "stop_requested": true},
            {"job_id": w2[0], "ok": false, "stop_requested": false},
            {"job_id": unknown, "ok": false, "stop_requested": false},
            {"job_id": "nope", "ok": false, "stop_requested": false},
        ])
    );
    assert_ne!(job(&app, &org, &w1[0]).await["heartbeatAt"], before);
    for (body, loc) in [
        (
            json!({"worker_id": "w1", "job_ids": []}),
            json!(["body", "job_ids"]),
        ),
        (
            json!({"worker_id": "", "job_ids": [w1[0]]}),
            json!(["body", "worker_id"]),
        ),
        (json!({"job_ids": [w1[0]]}), json!(["body", "worker_id"])),
    ] {
        let issues = validation_issues(worker_post(&app, "heartbeats", body.clone()).await).await;
        assert_eq!(issues[0]["loc"], loc, "{body}");
    }
}

#[actix_web::test]
async fn without_a_run_fee_a_claim_charges_nothing_and_blocks_nothing() {
    let app = spawn_app_with(|s| s.billing.flat_run_fee_cents = keel_core::domain::Cents(0)).await;
    // No credit at all: with a fee this job would be blocked for funds.
    let org = app.create_org("Free").await;
    let project = app.create_project(&org, "P").await;
    let id = tracer(&app, &org, &project).await;
    let claimed = claim(&app, "w1", "tracer", 1).await;
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0]["job_id"], id.as_str());
    assert_eq!(job(&app, &org, &id).await["status"], "running");
    let (balance, entries) = app.assert_ledger_invariant(&org.org_id).await;
    assert_eq!((balance, entries), (0, 0), "no ledger entry of zero");
}
