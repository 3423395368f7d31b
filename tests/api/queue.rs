//! The training-job queue: every transition of the contract, claims, sweeps, secrets,
//! agent logs.

use std::collections::HashSet;

use futures_util::future::join_all;
use keel_core::domain::{OrgId, ProjectId};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::*;

pub const CLAIM: &str = "/api/training/internal/jobs/claim";

pub async fn enqueue(app: &TestApp, org: &TestOrg, project: &str, body: Value) -> Value {
    let mut body = body;
    body["projectId"] = json!(project);
    json_of(
        app.post("/api/training/jobs", &org.api_key, &body).await,
        StatusCode::ACCEPTED,
    )
    .await
}

pub async fn tracer(app: &TestApp, org: &TestOrg, project: &str) -> String {
    enqueue(app, org, project, json!({"action": "tracer"})).await["jobId"]
        .as_str()
        .unwrap()
        .to_owned()
}

pub async fn claim(app: &TestApp, worker: &str, action: &str, limit: i64) -> Vec<Value> {
    let body = json!({"worker_id": worker, "action": action, "limit": limit});
    json_of(app.post(CLAIM, INTERNAL_KEY, &body).await, StatusCode::OK).await["jobs"]
        .as_array()
        .unwrap()
        .clone()
}

pub async fn job(app: &TestApp, org: &TestOrg, job_id: &str) -> Value {
    json_of(
        app.get(&format!("/api/training/jobs/{job_id}"), &org.api_key)
            .await,
        StatusCode::OK,
    )
    .await
}

pub async fn worker_post(app: &TestApp, route: &str, body: Value) -> reqwest::Response {
    app.post(
        &format!("/api/training/internal/jobs/{route}"),
        INTERNAL_KEY,
        &body,
    )
    .await
}

/// An organization with a project and a balance for ten run fees.
pub async fn funded(app: &TestApp, name: &str) -> (TestOrg, String) {
    let org = app.create_org(name).await;
    let project = app.create_project(&org, "Agents").await;
    let promo = app
        .post(
            "/api/billing/promo-code",
            &org.api_key,
            &json!({"orgId": org.org_id, "code": "WELCOME10"}),
        )
        .await;
    assert_eq!(promo.status(), StatusCode::OK);
    (org, project)
}

#[actix_web::test]
async fn each_action_has_its_own_body() {
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Acme").await;
    let tracer = enqueue(
        &app,
        &org,
        &project,
        json!({"action": "tracer", "environmentSlug": "acme/agents/env", "model": "m", "input": {"k": 1}}),
    )
    .await;
    assert_eq!(tracer["status"], "queued");
    assert_eq!(tracer["action"], "tracer");
    assert_eq!(tracer["attempts"], 0);
    assert_eq!(tracer["orgId"], org.org_id.as_str());
    assert_eq!(tracer["projectId"], project.as_str());
    for key in [
        "jobId",
        "trainingTaskId",
        "workerId",
        "stopRequested",
        "liveStatus",
        "result",
        "error",
        "createdAt",
        "updatedAt",
        "claimedAt",
        "heartbeatAt",
        "finishedAt",
    ] {
        assert!(tracer.get(key).is_some(), "job view has {key}");
    }
    enqueue(
        &app,
        &org,
        &project,
        json!({"action": "draft", "prompt": "write a plan", "trainingTaskId": "task-1"}),
    )
    .await;
    enqueue(
        &app,
        &org,
        &project,
        json!({"action": "optimize", "baseModel": "m", "objective": "accuracy"}),
    )
    .await;
    enqueue(&app, &org, &project, json!({"action": "training", "model": "meta-llama/Llama-3.1-8B-Instruct", "environmentSlug": "acme/agents/env", "algorithm": "grpo", "gpuType": "h100"})).await;

    let post = |body: Value| {
        let mut body = body;
        body["projectId"] = json!(project);
        app.post_later("/api/training/jobs", &org.api_key, &body)
    };
    // A field of another action is unknown here.
    let issues = validation_issues(post(json!({"action": "draft", "model": "m"})).await).await;
    assert_eq!(issues[0]["type"], "extra_forbidden");
    assert_eq!(issues[0]["loc"], json!(["body", "model"]));
    let issues = validation_issues(post(json!({"action": "training", "model": "m"})).await).await;
    assert_eq!(issues[0]["loc"], json!(["body", "environmentSlug"]));
    assert_eq!(issues[0]["type"], "missing");
    let issues = validation_issues(
        post(json!({"action": "training", "model": "", "environmentSlug": "Bad Slug"})).await,
    )
    .await;
    assert_eq!(issues.len(), 2);
    let issues = validation_issues(post(json!({"action": "deploy"})).await).await;
    assert_eq!(issues[0]["loc"], json!(["body", "action"]));
    assert_eq!(issues[0]["type"], "literal_error");
    let issues = validation_issues(post(json!({})).await).await;
    assert_eq!(issues[0]["loc"], json!(["body", "action"]));
    let issues =
        validation_issues(post(json!({"action": "draft", "trainingTaskId": "x".repeat(101)})).await).await;
    assert_eq!(issues[0]["loc"], json!(["body", "trainingTaskId"]));
    let issues = validation_issues(
        app.post(
            "/api/training/jobs",
            &org.api_key,
            &json!({"action": "draft", "projectId": "nope"}),
        )
        .await,
    )
    .await;
    assert_eq!(issues[0]["loc"], json!(["body", "projectId"]));
}

#[actix_web::test]
async fn the_job_list_filters_by_states_and_action_and_pages_by_cursor() {
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Acme").await;
    let mut tracers = Vec::new();
    for _ in 0..5 {
        tracers.push(tracer(&app, &org, &project).await);
    }
    let draft = enqueue(&app, &org, &project, json!({"action": "draft"})).await["jobId"]
        .as_str()
        .unwrap()
        .to_owned();
    // Two tracers run, one of them is blocked by its worker; a third is stopped.
    let claimed = claim(&app, "w", "tracer", 2).await;
    let running: Vec<String> = claimed
        .iter()
        .map(|j| j["job_id"].as_str().unwrap().to_owned())
        .collect();
    let blocked = worker_post(
        &app,
        "blocked",
        json!({"job_id": running[0], "worker_id": "w", "reason": "no GPU"}),
    )
    .await;
    assert_eq!(blocked.status(), StatusCode::OK);
    let stopped = app
        .post(
            &format!("/api/training/jobs/{}/stop", tracers[4]),
            &org.api_key,
            &json!({}),
        )
        .await;
    assert_eq!(stopped.status(), StatusCode::OK);
    let ids = |list: &Value| -> Vec<String> {
        list["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|j| j["jobId"].as_str().unwrap().to_owned())
            .collect()
    };
    let get = |query: String| {
        let app = &app;
        let key = org.api_key.clone();
        async move {
            json_of(
                app.get(&format!("/api/training/jobs?{query}"), &key).await,
                StatusCode::OK,
            )
            .await
        }
    };
    assert_eq!(ids(&get("status=blocked".into()).await), vec![running[0].clone()]);
    let ended = get("status=blocked&status=user_stopped".into()).await;
    let mut ended_ids = ids(&ended);
    ended_ids.sort();
    let mut expected = vec![running[0].clone(), tracers[4].clone()];
    expected.sort();
    assert_eq!(ended_ids, expected);
    assert_eq!(ids(&get("action=draft".into()).await), vec![draft.clone()]);
    assert_eq!(get("action=draft&status=running".into()).await["count"], 0);
    for job in get("status=queued&action=tracer".into()).await["jobs"]
        .as_array()
        .unwrap()
    {
        assert_eq!(
            (job["status"].as_str(), job["action"].as_str()),
            (Some("queued"), Some("tracer"))
        );
    }
    // Pages of two, newest first, the cursor walking to the end without gaps or repeats.
    let mut seen = Vec::new();
    let mut query = "limit=2&action=tracer".to_owned();
    loop {
        let page = get(query.clone()).await;
        assert!(page["count"].as_u64().unwrap() <= 2);
        seen.extend(ids(&page));
        match page["nextCursor"].as_str() {
            Some(cursor) => query = format!("limit=2&action=tracer&cursor={cursor}"),
            None => break,
        }
    }
    let mut newest_first = tracers.clone();
    newest_first.reverse();
    assert_eq!(seen, newest_first);
    // Unknown values are 422s naming them (never ignored).
    for (bad, loc) in [
        ("status=bogus", json!(["query", "status", 0])),
        ("status=queued&status=nope", json!(["query", "status", 1])),
        ("action=sweep", json!(["query", "action"])),
        ("cursor=zz", json!(["query", "cursor"])),
    ] {
        let issues =
            validation_issues(app.get(&format!("/api/training/jobs?{bad}"), &org.api_key).await).await;
        assert_eq!(issues[0]["loc"], loc, "{bad}: {issues:?}");
    }
    // The console's jobs page takes several states too.
    let console = crate::console::Console::sign_in(&app, &org.api_key).await;
    let page = console
        .page(&format!(
            "/console/o/{}/jobs?status=blocked&status=user_stopped",
            org.org_id
        ))
        .await;
    assert!(page.contains(&running[0]) && page.contains(&tracers[4]), "{page}");
    assert!(!page.contains(&tracers[1]) && !page.contains(&draft));
    assert!(page.contains(r#"value="blocked" checked"#) && page.contains(r#"value="user_stopped" checked"#));
}

#[actix_web::test]
async fn jobs_go_only_to_projects_of_the_callers_organization() {
    let app = spawn_app().await;
    let (acme, _) = funded(&app, "Acme").await;
    let (globex, globex_project) = funded(&app, "Globex").await;
    let body = json!({"action": "tracer", "projectId": globex_project});
    assert_error(
        app.post("/api/training/jobs", &acme.api_key, &body).await,
        StatusCode::NOT_FOUND,
    )
    .await;
    let theirs = tracer(&app, &globex, &globex_project).await;
    let path = format!("/api/training/jobs/{theirs}");
    assert_error(app.get(&path, &acme.api_key).await, StatusCode::NOT_FOUND).await;
    assert_error(
        app.post(&format!("{path}/stop"), &acme.api_key, &json!({})).await,
        StatusCode::NOT_FOUND,
    )
    .await;
    let list = json_of(app.get("/api/training/jobs", &acme.api_key).await, StatusCode::OK).await;
    assert_eq!(list, json!({"jobs": [], "count": 0, "nextCursor": null}));
}

#[actix_web::test]
async fn listing_filters_limits_and_orders_newest_first() {
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Acme").await;
    let other_project = app.create_project(&org, "Other").await;
    let first = tracer(&app, &org, &project).await;
    let second = enqueue(
        &app,
        &org,
        &project,
        json!({"action": "draft", "trainingTaskId": "t-9"}),
    )
    .await["jobId"]
        .clone();
    let third = tracer(&app, &org, &other_project).await;
    let list = json_of(app.get("/api/training/jobs", &org.api_key).await, StatusCode::OK).await;
    let ids: Vec<_> = list["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["jobId"].clone())
        .collect();
    assert_eq!(ids, vec![json!(third), second.clone(), json!(first)]);
    assert_eq!(list["count"], 3);
    let limited = json_of(
        app.get("/api/training/jobs?limit=1", &org.member_token).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(limited["count"], 1);
    let by_project = json_of(
        app.get(&format!("/api/training/jobs?projectId={project}"), &org.api_key)
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(by_project["count"], 2);
    let by_task = json_of(
        app.get("/api/training/jobs?trainingTaskId=t-9", &org.api_key)
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(by_task["jobs"][0]["jobId"], second);
    for bad in ["limit=0", "limit=201", "limit=x", "projectId="] {
        let issues =
            validation_issues(app.get(&format!("/api/training/jobs?{bad}"), &org.api_key).await).await;
        assert_eq!(issues[0]["loc"][0], "query", "{bad}");
    }
    // An organization id out of bounds: a session's is judged (422); with an API key any
    // other organization than its own is 403 before the query is.
    let long = format!("/api/training/jobs?orgId={}", "o".repeat(101));
    let issues = validation_issues(app.get(&long, &org.owner_token).await).await;
    assert_eq!(issues[0]["loc"], json!(["query", "orgId"]));
    assert_error(app.get(&long, &org.api_key).await, StatusCode::FORBIDDEN).await;
    // Reading one job with a mismatching project is "not found".
    let wrong = app
        .get(
            &format!("/api/training/jobs/{first}?projectId={other_project}"),
            &org.api_key,
        )
        .await;
    assert_error(wrong, StatusCode::NOT_FOUND).await;
    let right = app
        .get(
            &format!("/api/training/jobs/{first}?projectId={project}&trainingTaskId="),
            &org.api_key,
        )
        .await;
    assert_eq!(right.status(), StatusCode::OK);
}

#[actix_web::test]
async fn a_job_runs_to_success_and_repeated_reports_are_harmless() {
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Acme").await;
    let id = tracer(&app, &org, &project).await;
    let claimed = claim(&app, "w1", "tracer", 10).await;
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0]["job_id"], id.as_str());
    assert_eq!(claimed[0]["org_id"], org.org_id.as_str());
    assert_eq!(claimed[0]["project_id"], project.as_str());
    assert_eq!(claimed[0]["action"], "tracer");
    assert_eq!(claimed[0]["attempt"], 1);
    assert!(claimed[0]["payload"].is_object());
    let running = job(&app, &org, &id).await;
    assert_eq!(running["status"], "running");
    assert_eq!(running["workerId"], "w1");
    assert!(running["claimedAt"].is_string());
    // Nothing left to claim.
    assert!(claim(&app, "w2", "tracer", 10).await.is_empty());

    let hb = json_of(
        worker_post(&app, "heartbeat", json!({"job_id": id, "worker_id": "w1"})).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(hb, json!({"ok": true, "stop_requested": false}));
    assert_error(
        worker_post(&app, "heartbeat", json!({"job_id": id, "worker_id": "w2"})).await,
        StatusCode::CONFLICT,
    )
    .await;
    let live = worker_post(
        &app,
        "live-status",
        json!({"job_id": id, "worker_id": "w1", "live_status": {"step": 3}}),
    )
    .await;
    assert_eq!(json_of(live, StatusCode::OK).await, json!({"ok": true}));
    assert_eq!(job(&app, &org, &id).await["liveStatus"], json!({"step": 3}));

    let other = worker_post(&app, "succeeded", json!({"job_id": id, "worker_id": "w2"})).await;
    assert_error(other, StatusCode::CONFLICT).await;
    let done = worker_post(
        &app,
        "succeeded",
        json!({"job_id": id, "worker_id": "w1", "result": {"score": 0.9}}),
    )
    .await;
    assert_eq!(json_of(done, StatusCode::OK).await, json!({"ok": true}));
    let again = worker_post(
        &app,
        "succeeded",
        json!({"job_id": id, "worker_id": "w1", "result": {"score": 0.9}}),
    )
    .await;
    assert_eq!(again.status(), StatusCode::OK);
    // A different terminal report after the end is a conflict.
    assert_error(
        worker_post(
            &app,
            "failed",
            json!({"job_id": id, "worker_id": "w1", "error": "x"}),
        )
        .await,
        StatusCode::CONFLICT,
    )
    .await;
    assert_error(
        worker_post(&app, "heartbeat", json!({"job_id": id, "worker_id": "w1"})).await,
        StatusCode::CONFLICT,
    )
    .await;
    let finished = job(&app, &org, &id).await;
    assert_eq!(finished["status"], "succeeded");
    assert_eq!(finished["result"], json!({"score": 0.9}));
    assert!(finished["finishedAt"].is_string());
    assert_error(
        app.post(&format!("/api/training/jobs/{id}/stop"), &org.api_key, &json!({}))
            .await,
        StatusCode::CONFLICT,
    )
    .await;
    assert_error(
        worker_post(&app, "succeeded", json!({"job_id": "nope", "worker_id": "w1"})).await,
        StatusCode::NOT_FOUND,
    )
    .await;
}

#[actix_web::test]
async fn blocked_and_failed_reports_end_a_job() {
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Acme").await;
    let a = tracer(&app, &org, &project).await;
    let b = tracer(&app, &org, &project).await;
    claim(&app, "w", "tracer", 2).await;
    let blocked = worker_post(
        &app,
        "blocked",
        json!({"job_id": a, "worker_id": "w", "reason": "needs approval"}),
    )
    .await;
    assert_eq!(blocked.status(), StatusCode::OK);
    let failed = worker_post(
        &app,
        "failed",
        json!({"job_id": b, "worker_id": "w", "error": "OOM"}),
    )
    .await;
    assert_eq!(failed.status(), StatusCode::OK);
    assert_eq!(job(&app, &org, &a).await["status"], "blocked");
    assert_eq!(job(&app, &org, &a).await["error"], "needs approval");
    assert_eq!(job(&app, &org, &b).await["status"], "failed");
    assert_eq!(job(&app, &org, &b).await["error"], "OOM");
    let issues =
        validation_issues(worker_post(&app, "blocked", json!({"job_id": a, "worker_id": "w"})).await).await;
    assert_eq!(issues[0]["loc"], json!(["body", "reason"]));
}

#[actix_web::test]
async fn stopping_a_queued_job_and_a_running_one() {
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Acme").await;
    let queued = tracer(&app, &org, &project).await;
    let stopped = json_of(
        app.post(
            &format!("/api/training/jobs/{queued}/stop"),
            &org.member_token,
            &json!({"orgId": org.org_id, "reason": "changed my mind"}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(stopped["status"], "user_stopped");
    assert!(
        claim(&app, "w", "tracer", 5).await.is_empty(),
        "a stopped job is never handed out"
    );

    let running = tracer(&app, &org, &project).await;
    claim(&app, "w", "tracer", 5).await;
    // No body at all is allowed.
    let response = app
        .request(
            reqwest::Method::POST,
            &format!("/api/training/jobs/{running}/stop"),
            Some(&org.api_key),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(json_of(response, StatusCode::OK).await["status"], "stopping");
    let again = app
        .post(
            &format!("/api/training/jobs/{running}/stop"),
            &org.api_key,
            &json!({}),
        )
        .await;
    assert_eq!(json_of(again, StatusCode::OK).await["status"], "stopping");
    let hb = json_of(
        worker_post(&app, "heartbeat", json!({"job_id": running, "worker_id": "w"})).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(hb["stop_requested"], true);
    let ack = worker_post(&app, "user-stopped", json!({"job_id": running, "worker_id": "w"})).await;
    assert_eq!(ack.status(), StatusCode::OK);
    assert_eq!(job(&app, &org, &running).await["status"], "user_stopped");
    assert_eq!(stopped["stopReason"], "changed my mind");

    // A running job's reason outlives its worker's report (whose own text is the error).
    let held = tracer(&app, &org, &project).await;
    claim(&app, "w", "tracer", 5).await;
    let stopping = app
        .post(
            &format!("/api/training/jobs/{held}/stop"),
            &org.api_key,
            &json!({"reason": "wrong dataset"}),
        )
        .await;
    assert_eq!(
        json_of(stopping, StatusCode::OK).await["stopReason"],
        "wrong dataset"
    );
    let ack = worker_post(
        &app,
        "user-stopped",
        json!({"job_id": held, "worker_id": "w", "reason": "stopped at the user's request"}),
    )
    .await;
    assert_eq!(ack.status(), StatusCode::OK);
    let ended = job(&app, &org, &held).await;
    assert_eq!(ended["status"], "user_stopped");
    assert_eq!(ended["stopReason"], "wrong dataset", "{ended}");
    assert_eq!(ended["error"], "stopped at the user's request");
    let console = crate::console::Console::sign_in(&app, &org.api_key).await;
    let page = console
        .page(&format!("/console/o/{}/jobs/{held}", org.org_id))
        .await;
    assert!(
        page.contains(r#"<dd id="stop-reason" dir="auto">wrong dataset</dd>"#),
        "{page}"
    );
    // Retried, it is no longer stopped: the reason goes.
    let retried = app
        .post(
            &format!("/api/training/jobs/{held}/retry"),
            &org.api_key,
            &json!({}),
        )
        .await;
    assert!(json_of(retried, StatusCode::OK).await["stopReason"].is_null());
}

#[actix_web::test]
async fn claims_bill_the_run_fee_once_and_block_jobs_that_cannot_pay() {
    let app = spawn_app().await;
    let broke = app.create_org("Broke").await;
    let broke_project = app.create_project(&broke, "P").await;
    let unpaid = tracer(&app, &broke, &broke_project).await;
    assert!(claim(&app, "w", "tracer", 10).await.is_empty());
    let blocked = job(&app, &broke, &unpaid).await;
    assert_eq!(blocked["status"], "blocked");
    assert!(blocked["error"].as_str().unwrap().contains("balance"));

    let app = spawn_app_with(|s| s.queue.stale_after_secs = 1).await;
    let (org, project) = funded(&app, "Acme").await;
    let id = tracer(&app, &org, &project).await;
    claim(&app, "w1", "tracer", 1).await;
    assert_eq!(app.balance_microcents(&org).await, 900_000_000);
    // The worker dies; the job is requeued and claimed again, without a second fee.
    actix_web::rt::time::sleep(std::time::Duration::from_millis(1200)).await;
    let swept = json_of(
        worker_post(&app, "requeue-stale", json!({})).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(swept, json!({"requeued": 1, "failed": 0, "stopped": 0}));
    let again = claim(&app, "w2", "tracer", 1).await;
    assert_eq!(again[0]["job_id"], id.as_str());
    assert_eq!(again[0]["attempt"], 2);
    assert_eq!(app.balance_microcents(&org).await, 900_000_000);
    app.assert_ledger_invariant(&org.org_id).await;
}

#[actix_web::test]
async fn a_claim_refused_for_funds_gives_its_attempt_back_and_stays_in_the_history() {
    let app = spawn_app_with(|s| {
        s.queue.stale_after_secs = 1;
        s.queue.max_attempts = 2;
        s.queue.sweep_interval_secs = 0;
    })
    .await;
    let org = app.create_org("Broke").await;
    let project = app.create_project(&org, "P").await;
    let id = tracer(&app, &org, &project).await;
    // Refused twice (the user retries it in between): no attempt is used.
    assert!(claim(&app, "w1", "tracer", 1).await.is_empty());
    let retried = app
        .post(
            &format!("/api/training/jobs/{id}/retry"),
            &org.api_key,
            &json!({}),
        )
        .await;
    assert_eq!(retried.status(), StatusCode::OK);
    assert!(claim(&app, "w1", "tracer", 1).await.is_empty());
    let refused = job(&app, &org, &id).await;
    assert_eq!(refused["status"], "blocked");
    assert_eq!(refused["attempts"], 0, "{refused}");
    // Credited: queued again; the claim that is paid is attempt 1.
    app.fund(&org, 500).await;
    assert!(eventually(|| async { job(&app, &org, &id).await["status"] == "queued" }).await);
    let first = claim(&app, "w2", "tracer", 1).await;
    assert_eq!(first[0]["attempt"], 1);
    // Stale once: with max_attempts 2 it has an attempt left.
    actix_web::rt::time::sleep(std::time::Duration::from_millis(1200)).await;
    let swept = json_of(
        worker_post(&app, "requeue-stale", json!({})).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(swept, json!({"requeued": 1, "failed": 0, "stopped": 0}));
    let second = claim(&app, "w3", "tracer", 1).await;
    assert_eq!(second[0]["attempt"], 2);
    let done = worker_post(&app, "succeeded", json!({"job_id": id, "worker_id": "w3"})).await;
    assert_eq!(done.status(), StatusCode::OK);
    let ended = job(&app, &org, &id).await;
    assert_eq!(ended["status"], "succeeded");
    assert_eq!(ended["attempts"], 2);
    let history: Vec<(String, i64)> = ended["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            (
                h["outcome"].as_str().unwrap().to_owned(),
                h["attempt"].as_i64().unwrap(),
            )
        })
        .collect();
    let expected: Vec<(String, i64)> = [("blocked", 1), ("blocked", 1), ("stale", 1), ("succeeded", 2)]
        .into_iter()
        .map(|(o, a)| (o.to_owned(), a))
        .collect();
    assert_eq!(history, expected);
    // One run fee: the refused claims charged nothing.
    assert_eq!(app.balance_microcents(&org).await, 400_000_000);
}

#[actix_web::test]
async fn stale_jobs_are_requeued_then_failed_and_stopping_ones_end_stopped() {
    let app = spawn_app_with(|s| {
        s.queue.stale_after_secs = 1;
        s.queue.max_attempts = 2;
        s.queue.sweep_interval_secs = 0;
    })
    .await;
    let (org, project) = funded(&app, "Acme").await;
    let flaky = tracer(&app, &org, &project).await;
    let stopping = tracer(&app, &org, &project).await;
    claim(&app, "w1", "tracer", 2).await;
    app.post(
        &format!("/api/training/jobs/{stopping}/stop"),
        &org.api_key,
        &json!({}),
    )
    .await;
    // A fresh heartbeat keeps a job alive.
    let alive = tracer(&app, &org, &project).await;
    actix_web::rt::time::sleep(std::time::Duration::from_millis(1200)).await;
    claim(&app, "w9", "tracer", 1).await;
    let swept = json_of(
        worker_post(&app, "requeue-stale", json!({})).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(swept, json!({"requeued": 1, "failed": 0, "stopped": 1}));
    assert_eq!(job(&app, &org, &stopping).await["status"], "user_stopped");
    assert_eq!(job(&app, &org, &alive).await["status"], "running");
    assert_eq!(job(&app, &org, &flaky).await["status"], "queued");
    // The stale worker's late report is refused.
    assert_error(
        worker_post(&app, "succeeded", json!({"job_id": flaky, "worker_id": "w1"})).await,
        StatusCode::CONFLICT,
    )
    .await;

    let second = claim(&app, "w2", "tracer", 1).await;
    assert_eq!(second[0]["attempt"], 2);
    actix_web::rt::time::sleep(std::time::Duration::from_millis(1200)).await;
    let swept = json_of(
        worker_post(&app, "requeue-stale", json!({})).await,
        StatusCode::OK,
    )
    .await;
    // flaky's attempts are spent; alive (claimed once) goes back to the queue.
    assert_eq!(swept, json!({"requeued": 1, "failed": 1, "stopped": 0}));
    assert_eq!(job(&app, &org, &alive).await["status"], "queued");
    let failed = job(&app, &org, &flaky).await;
    assert_eq!(failed["status"], "failed");
    assert!(failed["error"].as_str().unwrap().contains("heartbeat"));
}

#[actix_web::test]
async fn the_scheduled_sweep_requeues_without_being_asked() {
    let app = spawn_app_with(|s| {
        s.queue.stale_after_secs = 1;
        s.queue.sweep_interval_secs = 1;
    })
    .await;
    let (org, project) = funded(&app, "Acme").await;
    let id = tracer(&app, &org, &project).await;
    claim(&app, "w1", "tracer", 1).await;
    assert!(eventually(|| async { job(&app, &org, &id).await["status"] == "queued" }).await);
}

#[actix_web::test]
async fn requeue_interrupted_returns_a_workers_jobs() {
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Acme").await;
    let a = tracer(&app, &org, &project).await;
    let b = tracer(&app, &org, &project).await;
    let c = tracer(&app, &org, &project).await;
    claim(&app, "w1", "tracer", 2).await;
    claim(&app, "w2", "tracer", 1).await;
    let requeued = json_of(
        worker_post(&app, "requeue-interrupted", json!({"worker_id": "w1"})).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(requeued, json!({"requeued": 2}));
    assert_eq!(job(&app, &org, &a).await["status"], "queued");
    assert_eq!(job(&app, &org, &b).await["status"], "queued");
    assert_eq!(job(&app, &org, &c).await["status"], "running");
    let reclaimed = claim(&app, "w3", "tracer", 5).await;
    assert!(reclaimed.iter().all(|j| j["attempt"] == 2));
    let issues =
        validation_issues(worker_post(&app, "requeue-interrupted", json!({"worker_id": ""})).await).await;
    assert_eq!(issues[0]["loc"], json!(["body", "worker_id"]));
}

#[actix_web::test]
async fn claim_requests_are_validated() {
    let app = spawn_app().await;
    for (body, loc) in [
        (json!({"worker_id": "w", "action": "tracer", "limit": 0}), "limit"),
        (
            json!({"worker_id": "w", "action": "tracer", "limit": 101}),
            "limit",
        ),
        (
            json!({"worker_id": "", "action": "tracer", "limit": 1}),
            "worker_id",
        ),
        (
            json!({"worker_id": "w".repeat(201), "action": "tracer", "limit": 1}),
            "worker_id",
        ),
        (
            json!({"worker_id": "w", "action": "deploy", "limit": 1}),
            "action",
        ),
        (
            json!({"worker_id": "w", "action": "tracer", "limit": 1, "extra": 1}),
            "extra",
        ),
        (json!({"worker_id": "w", "action": "tracer"}), "limit"),
    ] {
        let issues = validation_issues(app.post(CLAIM, INTERNAL_KEY, &body).await).await;
        assert_eq!(issues[0]["loc"], json!(["body", loc]), "{body}");
    }
    let org = app.create_org("Acme").await;
    let user = app
        .post(
            CLAIM,
            &org.api_key,
            &json!({"worker_id": "w", "action": "tracer", "limit": 1}),
        )
        .await;
    assert_error(user, StatusCode::FORBIDDEN).await;
}

#[actix_web::test]
async fn claims_are_per_action() {
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Acme").await;
    let draft = enqueue(&app, &org, &project, json!({"action": "draft"})).await["jobId"].clone();
    tracer(&app, &org, &project).await;
    let claimed = claim(&app, "w", "draft", 10).await;
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0]["job_id"], draft);
}

#[actix_web::test]
async fn one_organizations_burst_does_not_starve_another() {
    let app = spawn_app().await;
    let (busy, busy_project) = funded(&app, "Busy").await;
    let (small, small_project) = funded(&app, "Small").await;
    for _ in 0..6 {
        let burst = (0..50).map(|_| {
            app.post_later(
                "/api/training/jobs",
                &busy.api_key,
                &json!({"action": "tracer", "projectId": busy_project}),
            )
        });
        for response in join_all(burst).await {
            assert_eq!(response.status(), StatusCode::ACCEPTED);
        }
    }
    let lonely = tracer(&app, &small, &small_project).await;
    let first = claim(&app, "w", "tracer", 10).await;
    assert_eq!(first.len(), 10);
    assert!(
        first.iter().any(|j| j["job_id"] == lonely.as_str()),
        "the small org's job is in the first batch"
    );
}

#[actix_web::test]
async fn concurrent_claimers_get_disjoint_jobs_and_together_all() {
    let app = spawn_app().await;
    let second = spawn_on(TestDb::reuse(&app.db_url), test_settings(&app.db_url)).await;
    let org = app.create_org("Acme").await;
    let project = app.create_project(&org, "P").await;
    // 60 jobs, fees covered.
    for _ in 0..6 {
        app.fund(&org, 1000).await;
    }
    for _ in 0..60 {
        tracer(&app, &org, &project).await;
    }
    let claims: Vec<_> = (0..12)
        .map(|i| {
            let instance = if i % 2 == 0 { &app } else { &second };
            instance.post_later(
                CLAIM,
                INTERNAL_KEY,
                &json!({"worker_id": format!("w{i}"), "action": "tracer", "limit": 7}),
            )
        })
        .collect();
    let mut seen = HashSet::new();
    let mut total = 0;
    for response in join_all(claims).await {
        for job in json_of(response, StatusCode::OK).await["jobs"]
            .as_array()
            .unwrap()
        {
            total += 1;
            assert!(
                seen.insert(job["job_id"].as_str().unwrap().to_owned()),
                "a job went to two workers"
            );
        }
    }
    // Whatever the first round left is claimed by the next.
    while total < 60 {
        let more = claim(&app, "late", "tracer", 100).await;
        assert!(!more.is_empty(), "jobs were lost: {total} of 60");
        for job in more {
            total += 1;
            assert!(seen.insert(job["job_id"].as_str().unwrap().to_owned()));
        }
    }
    assert_eq!(seen.len(), 60);
    // One fee per job.
    let (balance, _) = app.assert_ledger_invariant(&org.org_id).await;
    assert_eq!(balance, 6_000_000_000 - 60 * 100_000_000);
}

#[actix_web::test]
async fn secrets_are_encrypted_and_only_the_worker_sees_their_values() {
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Acme").await;
    let saved = app
        .post(
            "/api/training/secrets",
            &org.member_token,
            &json!({"orgId": org.org_id, "secrets": {"HF_TOKEN": "hf_supersecret", "WANDB_API_KEY": "wandb_secret_value"}}),
        )
        .await;
    assert_eq!(
        json_of(saved, StatusCode::OK).await,
        json!({"names": ["HF_TOKEN", "WANDB_API_KEY"]})
    );
    let deleted = app
        .post(
            "/api/training/secrets",
            &org.api_key,
            &json!({"secrets": {"WANDB_API_KEY": ""}}),
        )
        .await;
    assert_eq!(
        json_of(deleted, StatusCode::OK).await,
        json!({"names": ["HF_TOKEN"]})
    );
    let bad = app
        .post(
            "/api/training/secrets",
            &org.api_key,
            &json!({"secrets": {"bad name": "x"}}),
        )
        .await;
    assert_eq!(validation_issues(bad).await[0]["loc"], json!(["body", "secrets"]));

    let id = tracer(&app, &org, &project).await;
    for path in [
        format!("/api/training/jobs/{id}"),
        "/api/training/jobs".to_owned(),
    ] {
        let text = app.get(&path, &org.api_key).await.text().await.unwrap();
        assert!(!text.contains("hf_supersecret"));
    }
    let worker = json_of(
        app.get(&format!("/api/training/internal/jobs/{id}"), INTERNAL_KEY)
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(worker["secrets"], json!({"HF_TOKEN": "hf_supersecret"}));
    assert_eq!(worker["jobId"], id.as_str());
    assert!(worker["payload"].is_object());
    assert_error(
        app.get(&format!("/api/training/internal/jobs/{id}"), &org.api_key)
            .await,
        StatusCode::FORBIDDEN,
    )
    .await;
    assert_error(
        app.get("/api/training/internal/jobs/unknown", INTERNAL_KEY).await,
        StatusCode::NOT_FOUND,
    )
    .await;

    let db = sea_orm::Database::connect(&app.db_url).await.unwrap();
    use sea_orm::EntityTrait;
    for row in entities::org_secret::Entity::find().all(&db).await.unwrap() {
        assert!(!row.sealed.contains("hf_supersecret"));
    }
    db.close().await.unwrap();
}

#[actix_web::test]
async fn agent_logs_from_users_and_workers_are_listed_newest_first() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let posted = json_of(
        app.post("/api/agent-logs", &org.api_key, &json!({"content": "first"}))
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(posted["ok"], true);
    assert!(posted["agent_log_id"].is_string());
    let internal = app
        .post(
            "/api/training/internal/agent-logs",
            INTERNAL_KEY,
            &json!({"org_id": org.org_id, "content": "second", "job_id": "j1"}),
        )
        .await;
    assert_eq!(json_of(internal, StatusCode::OK).await["ok"], true);
    let list = json_of(
        app.get(
            &format!("/api/training/internal/agent-logs?org_id={}", org.org_id),
            INTERNAL_KEY,
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(list["count"], 2);
    assert_eq!(list["logs"][0]["content"], "second");
    assert_eq!(list["logs"][0]["source"], "internal");
    assert_eq!(list["logs"][1]["source"], "api");
    assert_eq!(list["logs"][1]["agent_log_id"], posted["agent_log_id"]);
    let one = json_of(
        app.get(
            &format!("/api/training/internal/agent-logs?org_id={}&limit=1", org.org_id),
            INTERNAL_KEY,
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(one["count"], 1);

    for body in [
        json!({"content": ""}),
        json!({"content": "x".repeat(50_001)}),
        json!({"content": "x", "level": "info"}),
    ] {
        validation_issues(app.post("/api/agent-logs", &org.api_key, &body).await).await;
    }
    assert_eq!(
        app.post(
            "/api/agent-logs",
            &org.api_key,
            &json!({"content": "x".repeat(50_000)})
        )
        .await
        .status(),
        StatusCode::OK
    );
    for query in ["limit=0", "limit=501"] {
        let response = app
            .get(
                &format!("/api/training/internal/agent-logs?org_id={}&{query}", org.org_id),
                INTERNAL_KEY,
            )
            .await;
        validation_issues(response).await;
    }
    validation_issues(app.get("/api/training/internal/agent-logs", INTERNAL_KEY).await).await;
}

#[actix_web::test]
async fn agent_usage_is_upserted_per_account_and_timelines_sync() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let report = json!({"account_label": "codex-1", "plan_type": "pro", "primary_used_percent": 42.5,
                        "primary_window_minutes": 300, "primary_resets_at": "2026-11-22T05:00:00Z", "secondary_used_percent": 3});
    let first = app
        .post("/api/training/internal/agent-usage", INTERNAL_KEY, &report)
        .await;
    assert_eq!(json_of(first, StatusCode::OK).await, json!({"upserted": 1}));
    let second = app
        .post(
            "/api/training/internal/agent-usage",
            INTERNAL_KEY,
            &json!({"account_label": "codex-1", "primary_resets_at": 1_790_000_000}),
        )
        .await;
    assert_eq!(second.status(), StatusCode::OK);
    let db = sea_orm::Database::connect(&app.db_url).await.unwrap();
    use sea_orm::EntityTrait;
    let rows = entities::agent_usage::Entity::find().all(&db).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert!(rows[0].report.contains("1790000000"));
    db.close().await.unwrap();
    let bad = app
        .post(
            "/api/training/internal/agent-usage",
            INTERNAL_KEY,
            &json!({"account_label": ""}),
        )
        .await;
    assert_eq!(
        validation_issues(bad).await[0]["loc"],
        json!(["body", "account_label"])
    );
    let bad = app
        .post(
            "/api/training/internal/agent-usage",
            INTERNAL_KEY,
            &json!({"account_label": "a", "plan_type": "p".repeat(101)}),
        )
        .await;
    assert_eq!(
        validation_issues(bad).await[0]["loc"],
        json!(["body", "plan_type"])
    );

    let sync = app
        .post(
            "/api/training/internal/optimizer-timelines/sync",
            INTERNAL_KEY,
            &json!({"org_id": org.org_id, "timelines": [{"timeline_id": "t1", "events": [{"step": 1}]}, {"timeline_id": "t2", "events": []}]}),
        )
        .await;
    assert_eq!(json_of(sync, StatusCode::OK).await, json!({"synced": 2}));
    let unknown = app
        .post(
            "/api/training/internal/optimizer-timelines/sync",
            INTERNAL_KEY,
            &json!({"org_id": uuid::Uuid::new_v4(), "timelines": []}),
        )
        .await;
    assert_error(unknown, StatusCode::NOT_FOUND).await;
}

#[actix_web::test]
async fn workers_claiming_and_reporting_at_once_never_stall() {
    // Found by `keel bench queue`: with SQLite's single connection, a report batch frozen
    // mid-query while a claim held the queue actor deadlocked the pool.
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Acme").await;
    for _ in 0..10 {
        tracer(&app, &org, &project).await;
    }
    let worker = |name: &'static str| {
        let app = &app;
        async move {
            let mut done = 0;
            loop {
                let jobs = claim(app, name, "tracer", 3).await;
                if jobs.is_empty() {
                    return done;
                }
                let reports = jobs.iter().map(|job| {
                    app.post_later(
                        "/api/training/internal/jobs/succeeded",
                        INTERNAL_KEY,
                        &json!({"job_id": job["job_id"], "worker_id": name}),
                    )
                });
                for response in join_all(reports).await {
                    assert_eq!(response.status(), StatusCode::OK);
                }
                done += jobs.len();
            }
        }
    };
    let done: usize = join_all([worker("a"), worker("b"), worker("c")])
        .await
        .into_iter()
        .sum();
    assert_eq!(done, 10);
    let list = json_of(app.get("/api/training/jobs", &org.api_key).await, StatusCode::OK).await;
    assert!(list["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .all(|j| j["status"] == "succeeded"));
}

#[actix_web::test]
async fn jobs_enqueued_at_once_are_each_queued_once() {
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Acme").await;
    // Run fees for all 120.
    for _ in 0..11 {
        app.fund(&org, 1000).await;
    }
    let body = json!({"action": "tracer", "projectId": project});
    let requests: Vec<_> = (0..120)
        .map(|_| app.post_later("/api/training/jobs", &org.api_key, &body))
        .collect();
    let mut enqueued = HashSet::new();
    for response in join_all(requests).await {
        let job = json_of(response, StatusCode::ACCEPTED).await;
        assert_eq!(job["status"], "queued");
        assert!(enqueued.insert(job["jobId"].as_str().unwrap().to_owned()));
    }
    let listed = json_of(
        app.get("/api/training/jobs?limit=200", &org.api_key).await,
        StatusCode::OK,
    )
    .await;
    let listed: HashSet<String> = listed["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|job| job["jobId"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(listed, enqueued);
    let mut claimed = HashSet::new();
    for _ in 0..2 {
        for job in claim(&app, "w1", "tracer", 100).await {
            assert!(claimed.insert(job["job_id"].as_str().unwrap().to_owned()));
        }
    }
    assert_eq!(claimed, enqueued);
}

#[actix_web::test]
async fn a_batch_of_new_jobs_with_one_bad_job_queues_the_others() {
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Acme").await;
    let settings = test_settings(&app.db_url);
    let db = keel_core::database::connect(&settings.database).await.unwrap();
    let job = |project_id: &str| keel_core::queue::NewJob {
        org_id: OrgId::parse(&org.org_id).unwrap(),
        project_id: ProjectId::parse(project_id).unwrap(),
        training_task_id: None,
        action: keel_core::domain::JobAction::Tracer,
        payload: json!({"action": "tracer"}),
        priority: keel_core::queue::DEFAULT_PRIORITY,
        run_at: None,
        unique_key: None,
        idempotency: None,
        dataset: None,
        schedule: None,
        depends_on: Vec::new(),
    };
    // The middle job's project does not exist: the one-statement insert fails, and the
    // jobs are then inserted one by one.
    let results = keel_core::fixtures::insert_jobs(
        &db,
        vec![
            job(&project),
            job(&uuid::Uuid::new_v4().to_string()),
            job(&project),
        ],
    )
    .await;
    assert!(results[0].is_ok());
    assert!(results[1].is_err());
    assert!(results[2].is_ok());
    let queued: HashSet<String> = claim(&app, "w1", "tracer", 10)
        .await
        .iter()
        .map(|job| job["job_id"].as_str().unwrap().to_owned())
        .collect();
    let inserted: HashSet<String> = [&results[0], &results[2]]
        .iter()
        .map(|r| r.as_ref().unwrap().id.to_string())
        .collect();
    assert_eq!(queued, inserted);
    db.close().await.unwrap();
}

/// A long-poll claim sent on a raw connection that the caller closes after `open_for`.
async fn abandoned_claim(app: &TestApp, worker: &str, open_for: std::time::Duration) {
    use tokio::io::AsyncWriteExt;
    let body = json!({"worker_id": worker, "action": "tracer", "limit": 1}).to_string();
    let request = format!(
        "POST {CLAIM} HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer {INTERNAL_KEY}\r\nPrefer: wait=30\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(app.address.trim_start_matches("http://"))
        .await
        .unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    actix_web::rt::time::sleep(open_for).await;
    drop(stream);
}

#[actix_web::test]
async fn a_claim_whose_worker_left_takes_no_job() {
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Acme").await;
    let balance = app.balance_microcents(&org).await;
    // Two workers wait and leave; then a job is queued.
    abandoned_claim(&app, "w-gone-1", std::time::Duration::from_millis(300)).await;
    abandoned_claim(&app, "w-gone-2", std::time::Duration::from_millis(1_200)).await;
    actix_web::rt::time::sleep(std::time::Duration::from_millis(200)).await;
    let job_id = tracer(&app, &org, &project).await;
    actix_web::rt::time::sleep(std::time::Duration::from_millis(500)).await;
    let queued = job(&app, &org, &job_id).await;
    assert_eq!(queued["status"], "queued", "a gone worker took it: {queued}");
    assert_eq!(
        app.balance_microcents(&org).await,
        balance,
        "no fee for a gone worker"
    );
    // A worker that is there gets it, on its first attempt.
    let claimed = claim(&app, "w-live", "tracer", 1).await;
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0]["job_id"], json!(job_id));
    assert_eq!(claimed[0]["attempt"], 1);
}

// Issue 39: priorities, scheduled jobs, retries by users.

#[actix_web::test]
async fn within_an_organization_the_most_urgent_job_is_claimed_first_then_the_oldest() {
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Urgent").await;
    let mut made = Vec::new();
    for priority in [5, 9, 0, 5, 0] {
        let job = enqueue(
            &app,
            &org,
            &project,
            json!({"action": "tracer", "priority": priority}),
        )
        .await;
        assert_eq!(job["priority"], priority);
        made.push((priority, job["jobId"].as_str().unwrap().to_owned()));
    }
    let default = enqueue(&app, &org, &project, json!({"action": "tracer"})).await;
    assert_eq!(default["priority"], 5, "the default priority");
    // Expected: priority, then creation order (the order made, as they were made one by one).
    let mut expected: Vec<(i64, String)> = made.clone();
    expected.push((5, default["jobId"].as_str().unwrap().to_owned()));
    expected.sort_by_key(|(priority, _)| *priority);
    let mut claimed = Vec::new();
    for _ in 0..expected.len() {
        let jobs = claim(&app, "w1", "tracer", 1).await;
        assert_eq!(jobs.len(), 1);
        claimed.push((
            jobs[0]["priority"].as_i64().unwrap(),
            jobs[0]["job_id"].as_str().unwrap().to_owned(),
        ));
    }
    assert_eq!(claimed, expected);
    // In one claim of many, the same order.
    for priority in [3, 1, 2] {
        enqueue(
            &app,
            &org,
            &project,
            json!({"action": "draft", "priority": priority}),
        )
        .await;
    }
    let jobs = claim(&app, "w1", "draft", 10).await;
    let order: Vec<i64> = jobs.iter().map(|j| j["priority"].as_i64().unwrap()).collect();
    assert_eq!(order, [1, 2, 3]);
}

#[actix_web::test]
async fn a_bad_priority_or_run_at_is_a_422_naming_it() {
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Bad").await;
    for (field, value, kind) in [
        ("priority", json!(10), "less_than_equal"),
        ("priority", json!(-1), "greater_than_equal"),
        ("priority", json!("high"), "int_type"),
        ("runAt", json!("tomorrow"), "datetime_from_date_parsing"),
        (
            "runAt",
            json!("2026-13-40T99:00:00Z"),
            "datetime_from_date_parsing",
        ),
    ] {
        let mut body = json!({"action": "tracer", "projectId": project});
        body[field] = value;
        let response = app.post("/api/training/jobs", &org.api_key, &body).await;
        assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY, "{field}");
        let answer: Value = response.json().await.unwrap();
        assert_eq!(answer["detail"][0]["loc"], json!(["body", field]), "{answer}");
        assert_eq!(answer["detail"][0]["type"], kind, "{answer}");
    }
    // JSON Schema counts 4.0 as an integer: so does keel, inside the union of job bodies too.
    let job = enqueue(
        &app,
        &org,
        &project,
        json!({"action": "optimize", "priority": 4.0}),
    )
    .await;
    assert_eq!(job["priority"], 4);
    let body = json!({"action": "optimize", "projectId": project, "priority": 4.5});
    let response = app.post("/api/training/jobs", &org.api_key, &body).await;
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(
        answer["detail"][0]["loc"],
        json!(["body", "priority"]),
        "{answer}"
    );
}

#[actix_web::test]
async fn a_job_due_later_is_scheduled_until_then_and_claimable_as_soon_as_it_is_due() {
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Later").await;
    // In the past: queued at once.
    let past = enqueue(
        &app,
        &org,
        &project,
        json!({"action": "draft", "runAt": "2020-01-01T00:00:00Z"}),
    )
    .await;
    assert_eq!(past["status"], "queued");
    assert!(past["scheduledAt"].is_null());
    assert_eq!(claim(&app, "w1", "draft", 10).await.len(), 1);

    let due = chrono::Utc::now() + chrono::Duration::milliseconds(1500);
    let job = enqueue(
        &app,
        &org,
        &project,
        json!({"action": "tracer", "runAt": due.to_rfc3339()}),
    )
    .await;
    assert_eq!(job["status"], "scheduled");
    let scheduled_at: chrono::DateTime<chrono::Utc> = job["scheduledAt"].as_str().unwrap().parse().unwrap();
    assert!(
        (scheduled_at - due).num_milliseconds().abs() < 2,
        "{scheduled_at} vs {due}"
    );
    assert!(
        claim(&app, "w1", "tracer", 10).await.is_empty(),
        "not before it is due"
    );
    // A long-poll claim waiting on its action gets it once due (the sweep timer is off in tests).
    let started = std::time::Instant::now();
    let response = app
        .client
        .post(app.url(CLAIM))
        .bearer_auth(INTERNAL_KEY)
        .header("Prefer", "wait=10")
        .json(&json!({"worker_id": "w2", "action": "tracer", "limit": 1}))
        .send()
        .await
        .unwrap();
    let jobs = json_of(response, StatusCode::OK).await["jobs"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(jobs.len(), 1, "claimed once due");
    assert_eq!(jobs[0]["job_id"], job["jobId"]);
    assert!(chrono::Utc::now() >= due, "not before its time");
    assert!(
        started.elapsed() < std::time::Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );

    // A scheduled job stops like a queued one.
    let later = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let job = enqueue(&app, &org, &project, json!({"action": "tracer", "runAt": later})).await;
    let id = job["jobId"].as_str().unwrap();
    let stopped = json_of(
        app.post(&format!("/api/training/jobs/{id}/stop"), &org.api_key, &json!({}))
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(stopped["status"], "user_stopped");
    assert!(
        claim(&app, "w1", "tracer", 10).await.is_empty(),
        "a stopped job is never claimed"
    );
}

#[actix_web::test]
async fn users_retry_failed_blocked_and_stopped_jobs_and_nothing_else() {
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Again").await;
    let retry = |id: String| {
        let app = &app;
        let org = &org;
        async move {
            app.post(
                &format!("/api/training/jobs/{id}/retry"),
                &org.api_key,
                &json!({}),
            )
            .await
        }
    };
    // A failed job: back to queued, its attempts kept, claimable again.
    let id = tracer(&app, &org, &project).await;
    assert_eq!(claim(&app, "w1", "tracer", 1).await.len(), 1);
    // Running: not retryable.
    let response = retry(id.clone()).await;
    assert_eq!(response.status(), StatusCode::CONFLICT);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["code"], "job_not_retryable");
    let failed = worker_post(
        &app,
        "failed",
        json!({"job_id": id, "worker_id": "w1", "error": "boom"}),
    )
    .await;
    assert_eq!(failed.status(), StatusCode::OK);
    let retried = json_of(retry(id.clone()).await, StatusCode::OK).await;
    assert_eq!(retried["status"], "queued");
    assert_eq!(retried["attempts"], 1);
    assert!(retried["error"].is_null() && retried["finishedAt"].is_null() && retried["workerId"].is_null());
    let again = claim(&app, "w2", "tracer", 1).await;
    assert_eq!(again.len(), 1);
    assert_eq!(again[0]["attempt"], 2);
    // Queued: not retryable; succeeded: not retryable.
    let queued = tracer(&app, &org, &project).await;
    assert_eq!(retry(queued).await.status(), StatusCode::CONFLICT);
    let done = worker_post(&app, "succeeded", json!({"job_id": id, "worker_id": "w2"})).await;
    assert_eq!(done.status(), StatusCode::OK);
    assert_eq!(retry(id.clone()).await.status(), StatusCode::CONFLICT);
    // A user-stopped job and a blocked one come back.
    let stopped = tracer(&app, &org, &project).await;
    app.post(
        &format!("/api/training/jobs/{stopped}/stop"),
        &org.api_key,
        &json!({}),
    )
    .await;
    assert_eq!(
        json_of(retry(stopped).await, StatusCode::OK).await["status"],
        "queued"
    );
    let blocked = enqueue(&app, &org, &project, json!({"action": "draft"})).await["jobId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(claim(&app, "w3", "draft", 1).await.len(), 1);
    worker_post(
        &app,
        "blocked",
        json!({"job_id": blocked, "worker_id": "w3", "reason": "no GPU"}),
    )
    .await;
    assert_eq!(
        json_of(retry(blocked).await, StatusCode::OK).await["status"],
        "queued"
    );
    // Another organization's job, or no job: 404.
    let other = app.create_org("Other").await;
    let response = app
        .post(
            &format!("/api/training/jobs/{id}/retry"),
            &other.api_key,
            &json!({}),
        )
        .await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    assert_eq!(retry("nope".into()).await.status(), StatusCode::NOT_FOUND);
}

#[actix_web::test]
async fn a_paused_action_hands_out_nothing_until_resumed_and_its_waiting_claims_wake_then() {
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Incident").await;
    tracer(&app, &org, &project).await;
    enqueue(&app, &org, &project, json!({"action": "draft"})).await;
    let paused = json_of(
        app.post("/api/internal/queue/tracer/pause", INTERNAL_KEY, &json!({}))
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(paused["action"], "tracer");
    assert_eq!(paused["paused"], true);
    assert_eq!(paused["counts"]["queued"], 1);
    // Twice is harmless.
    app.post("/api/internal/queue/tracer/pause", INTERNAL_KEY, &json!({}))
        .await;
    assert!(
        claim(&app, "w1", "tracer", 10).await.is_empty(),
        "a paused action hands out nothing"
    );
    assert_eq!(
        claim(&app, "w1", "draft", 10).await.len(),
        1,
        "other actions go on"
    );
    let state = json_of(app.get("/api/internal/queue", INTERNAL_KEY).await, StatusCode::OK).await;
    let actions = state["actions"].as_array().unwrap();
    assert_eq!(actions.len(), 4);
    let tracer_queue = actions.iter().find(|a| a["action"] == "tracer").unwrap();
    assert_eq!(tracer_queue["paused"], true);
    assert_eq!(tracer_queue["counts"]["queued"], 1);
    assert_eq!(tracer_queue["counts"]["scheduled"], 0);
    let draft_queue = actions.iter().find(|a| a["action"] == "draft").unwrap();
    assert_eq!(draft_queue["paused"], false);
    assert_eq!(draft_queue["counts"]["running"], 1);

    // A long-poll claim waits through the pause and gets the job at the resume.
    let waiting = {
        let (client, url) = (app.client.clone(), app.url(CLAIM));
        actix_web::rt::spawn(async move {
            client
                .post(url)
                .bearer_auth(INTERNAL_KEY)
                .header("Prefer", "wait=10")
                .json(&json!({"worker_id": "w2", "action": "tracer", "limit": 1}))
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        })
    };
    actix_web::rt::time::sleep(std::time::Duration::from_millis(500)).await;
    let resumed = json_of(
        app.post("/api/internal/queue/tracer/resume", INTERNAL_KEY, &json!({}))
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(resumed["paused"], false);
    let answer = waiting.await.unwrap();
    assert_eq!(answer["jobs"].as_array().unwrap().len(), 1, "{answer}");

    // An unknown action is a 422 naming it; only the internal key may pause.
    let response = app
        .post("/api/internal/queue/nope/pause", INTERNAL_KEY, &json!({}))
        .await;
    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["detail"][0]["loc"], json!(["path", "action"]), "{answer}");
    let response = app
        .post("/api/internal/queue/tracer/pause", &org.api_key, &json!({}))
        .await;
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
}

#[actix_web::test]
async fn a_pause_on_one_instance_holds_on_another_at_once() {
    let app = spawn_app().await;
    let second = spawn_on(TestDb::reuse(&app.db_url), test_settings(&app.db_url)).await;
    let (org, project) = funded(&app, "Two").await;
    tracer(&app, &org, &project).await;
    let paused = app
        .post("/api/internal/queue/tracer/pause", INTERNAL_KEY, &json!({}))
        .await;
    assert_eq!(paused.status(), StatusCode::OK);
    // The other instance hands out nothing, and says so.
    let body = json!({"worker_id": "w2", "action": "tracer", "limit": 10});
    let claimed = json_of(second.post(CLAIM, INTERNAL_KEY, &body).await, StatusCode::OK).await;
    assert_eq!(claimed["jobs"].as_array().unwrap().len(), 0);
    let state = json_of(
        second.get("/api/internal/queue", INTERNAL_KEY).await,
        StatusCode::OK,
    )
    .await;
    let tracer_queue = state["actions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["action"] == "tracer")
        .cloned()
        .unwrap();
    assert_eq!(tracer_queue["paused"], true);
    // Resumed on the second, claimed on the first.
    let resumed = second
        .post("/api/internal/queue/tracer/resume", INTERNAL_KEY, &json!({}))
        .await;
    assert_eq!(resumed.status(), StatusCode::OK);
    assert_eq!(claim(&app, "w1", "tracer", 10).await.len(), 1);
}
