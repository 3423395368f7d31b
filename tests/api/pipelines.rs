//! Pipelines (issue 62): jobs that wait for the jobs they depend on (`dependsOn`), created
//! one at a time or as a whole batch with refs; queued when all succeeded, cancelled
//! (transitively) when one ends otherwise, waiting again when that one is retried.

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::*;
use crate::queue::{claim, funded, job, worker_post};

const BATCH: &str = "/api/training/jobs/batch";

/// Creates a batch; answers its jobs' ids, in order.
async fn batch(app: &TestApp, org: &TestOrg, jobs: Value) -> Vec<String> {
    let answer = json_of(
        app.post(BATCH, &org.api_key, &json!({"jobs": jobs})).await,
        StatusCode::ACCEPTED,
    )
    .await;
    answer["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["jobId"].as_str().unwrap().to_owned())
        .collect()
}

/// tracer → draft → optimize → training, one batch.
async fn four(app: &TestApp, org: &TestOrg, project: &str) -> Vec<String> {
    batch(
        app,
        org,
        json!([
            {"ref": "tracer", "action": "tracer", "projectId": project},
            {"ref": "draft", "action": "draft", "projectId": project, "dependsOn": ["ref:tracer"]},
            {"ref": "optimize", "action": "optimize", "projectId": project, "dependsOn": ["ref:draft"]},
            {"action": "training", "projectId": project, "model": "m", "environmentSlug": "a/b/c",
             "dependsOn": ["ref:optimize"]},
        ]),
    )
    .await
}

async fn statuses(app: &TestApp, org: &TestOrg, ids: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    for id in ids {
        found.push(job(app, org, id).await["status"].as_str().unwrap().to_owned());
    }
    found
}

/// Claims the one job of `action` (it must be the only one claimable) and reports it.
async fn run(app: &TestApp, id: &str, action: &str, report: &str, extra: Value) {
    let claimed = claim(app, "w", action, 10).await;
    let ids: Vec<&str> = claimed.iter().map(|j| j["job_id"].as_str().unwrap()).collect();
    assert_eq!(ids, [id], "claimed {action}");
    let mut body = json!({"job_id": id, "worker_id": "w"});
    if let (Value::Object(body), Value::Object(extra)) = (&mut body, extra) {
        body.extend(extra);
    }
    assert_eq!(worker_post(app, report, body).await.status(), StatusCode::OK);
}

async fn succeed(app: &TestApp, id: &str, action: &str) {
    run(app, id, action, "succeeded", json!({})).await;
}

fn s(v: &[&str]) -> Vec<String> {
    v.iter().map(|x| x.to_string()).collect()
}

#[actix_web::test]
async fn a_pipeline_of_four_runs_each_job_once_the_one_before_succeeded() {
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Acme").await;
    let ids = four(&app, &org, &project).await;
    assert_eq!(ids.len(), 4);
    assert_eq!(
        statuses(&app, &org, &ids).await,
        s(&["queued", "waiting", "waiting", "waiting"])
    );
    // A waiting job is never claimed.
    assert!(claim(&app, "w", "draft", 10).await.is_empty());
    // Its view names what it waits for and what waits for it, with their states.
    let draft = job(&app, &org, &ids[1]).await;
    assert_eq!(
        draft["dependsOn"],
        json!([{"jobId": ids[0], "action": "tracer", "status": "queued"}])
    );
    assert_eq!(
        draft["dependents"],
        json!([{"jobId": ids[2], "action": "optimize", "status": "waiting"}])
    );
    assert_eq!(draft["dependentsCount"], 1);

    succeed(&app, &ids[0], "tracer").await;
    assert_eq!(
        statuses(&app, &org, &ids).await,
        s(&["succeeded", "queued", "waiting", "waiting"])
    );
    assert_eq!(
        job(&app, &org, &ids[1]).await["dependsOn"][0]["status"],
        "succeeded"
    );
    succeed(&app, &ids[1], "draft").await;
    succeed(&app, &ids[2], "optimize").await;
    assert_eq!(job(&app, &org, &ids[3]).await["status"], "queued");
    succeed(&app, &ids[3], "training").await;
    assert_eq!(
        statuses(&app, &org, &ids).await,
        s(&["succeeded", "succeeded", "succeeded", "succeeded"])
    );

    // The pipeline's list, from any of its jobs, pages by cursor.
    let first = json_of(
        app.get(
            &format!("/api/training/jobs?pipeline={}&limit=3", ids[2]),
            &org.api_key,
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(first["count"], 3);
    let cursor = first["nextCursor"].as_str().unwrap();
    let rest = json_of(
        app.get(
            &format!("/api/training/jobs?pipeline={}&limit=3&cursor={cursor}", ids[2]),
            &org.api_key,
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(rest["count"], 1);
    assert!(rest["nextCursor"].is_null());
    let mut listed: Vec<String> = first["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .chain(rest["jobs"].as_array().unwrap())
        .map(|j| j["jobId"].as_str().unwrap().to_owned())
        .collect();
    listed.sort();
    let mut expected = ids.clone();
    expected.sort();
    assert_eq!(listed, expected);
    // A job of no pipeline is its own; text that is no id matches none.
    let alone = crate::queue::tracer(&app, &org, &project).await;
    let own = json_of(
        app.get(&format!("/api/training/jobs?pipeline={alone}"), &org.api_key)
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(own["count"], 1);
    let none = json_of(
        app.get("/api/training/jobs?pipeline=nope", &org.api_key).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(none["count"], 0);
}

#[actix_web::test]
async fn a_failure_cancels_the_rest_transitively_and_its_retry_makes_them_wait_again() {
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Acme").await;
    let ids = four(&app, &org, &project).await;
    // A retryable failure with attempts left is no end: the rest go on waiting.
    run(
        &app,
        &ids[0],
        "tracer",
        "failed",
        json!({"error": "flaky", "retryable": true}),
    )
    .await;
    assert_eq!(job(&app, &org, &ids[0]).await["status"], "scheduled");
    assert_eq!(
        statuses(&app, &org, &ids[1..]).await,
        s(&["waiting", "waiting", "waiting"])
    );
    // Stopped while its retry waits for the backoff: that ends it, and cancels the rest.
    let retried = app
        .post(
            &format!("/api/training/jobs/{}/stop", ids[0]),
            &org.api_key,
            &json!({}),
        )
        .await;
    assert_eq!(retried.status(), StatusCode::OK);
    assert_eq!(
        statuses(&app, &org, &ids).await,
        s(&["user_stopped", "cancelled", "cancelled", "cancelled"])
    );
    let draft = job(&app, &org, &ids[1]).await;
    let error = draft["error"].as_str().unwrap();
    assert!(
        error.contains(ids[0].as_str()) && error.contains("user_stopped"),
        "{error}"
    );
    let optimize = job(&app, &org, &ids[2]).await;
    let error = optimize["error"].as_str().unwrap();
    assert!(
        error.contains(ids[1].as_str()) && error.contains("cancelled"),
        "{error}"
    );
    assert!(claim(&app, "w", "draft", 10).await.is_empty());

    // A cancelled job is not retried itself: its dependency is.
    let refused = app
        .post(
            &format!("/api/training/jobs/{}/retry", ids[2]),
            &org.api_key,
            &json!({}),
        )
        .await;
    assert_eq!(refused.status(), StatusCode::CONFLICT);
    let body: Value = refused.json().await.unwrap();
    assert_eq!(body["code"], "job_not_retryable");
    assert!(
        body["detail"].as_str().unwrap().contains(ids[1].as_str()),
        "{body}"
    );

    let retried = app
        .post(
            &format!("/api/training/jobs/{}/retry", ids[0]),
            &org.api_key,
            &json!({}),
        )
        .await;
    assert_eq!(retried.status(), StatusCode::OK);
    assert_eq!(
        statuses(&app, &org, &ids).await,
        s(&["queued", "waiting", "waiting", "waiting"])
    );
    assert!(job(&app, &org, &ids[1]).await["error"].is_null());

    // This time it fails for good: the same cancellations, by a worker's report.
    run(&app, &ids[0], "tracer", "failed", json!({"error": "OOM"})).await;
    assert_eq!(
        statuses(&app, &org, &ids).await,
        s(&["failed", "cancelled", "cancelled", "cancelled"])
    );
    let error = job(&app, &org, &ids[1]).await["error"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        error.contains(ids[0].as_str()) && error.contains("failed"),
        "{error}"
    );
    app.post(
        &format!("/api/training/jobs/{}/retry", ids[0]),
        &org.api_key,
        &json!({}),
    )
    .await;
    succeed(&app, &ids[0], "tracer").await;
    assert_eq!(job(&app, &org, &ids[1]).await["status"], "queued");

    // A stop of a waiting job ends it; the ones waiting for it are cancelled, and its retry
    // makes it wait again (its own dependency has not succeeded yet).
    let stopped = json_of(
        app.post(
            &format!("/api/training/jobs/{}/stop", ids[2]),
            &org.api_key,
            &json!({"reason": "not now"}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(stopped["status"], "user_stopped");
    assert_eq!(job(&app, &org, &ids[3]).await["status"], "cancelled");
    let again = json_of(
        app.post(
            &format!("/api/training/jobs/{}/retry", ids[2]),
            &org.api_key,
            &json!({}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(again["status"], "waiting");
    assert_eq!(job(&app, &org, &ids[3]).await["status"], "waiting");
    // A worker blocking one cancels the rest too.
    run(
        &app,
        &ids[1],
        "draft",
        "blocked",
        json!({"reason": "needs approval"}),
    )
    .await;
    assert_eq!(
        statuses(&app, &org, &ids[2..]).await,
        s(&["cancelled", "cancelled"])
    );
}

#[actix_web::test]
async fn in_a_diamond_the_last_job_waits_for_both_branches() {
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Acme").await;
    let ids = batch(
        &app,
        &org,
        json!([
            {"ref": "d", "action": "training", "projectId": project, "model": "m", "environmentSlug": "a/b/c",
             "dependsOn": ["ref:b", "ref:c"]},
            {"ref": "b", "action": "draft", "projectId": project, "dependsOn": ["ref:a"]},
            {"ref": "c", "action": "optimize", "projectId": project, "dependsOn": ["ref:a"]},
            {"ref": "a", "action": "tracer", "projectId": project},
        ]),
    )
    .await;
    let (d, b, c, a) = (&ids[0], &ids[1], &ids[2], &ids[3]);
    assert_eq!(
        statuses(&app, &org, &ids).await,
        s(&["waiting", "waiting", "waiting", "queued"])
    );
    succeed(&app, a, "tracer").await;
    assert_eq!(
        statuses(&app, &org, &ids).await,
        s(&["waiting", "queued", "queued", "succeeded"])
    );
    succeed(&app, b, "draft").await;
    assert_eq!(job(&app, &org, d).await["status"], "waiting");
    assert!(claim(&app, "w", "training", 10).await.is_empty());
    succeed(&app, c, "optimize").await;
    assert_eq!(job(&app, &org, d).await["status"], "queued");
    let view = job(&app, &org, d).await;
    assert_eq!(view["dependsOn"].as_array().unwrap().len(), 2);
    assert_eq!(job(&app, &org, a).await["dependentsCount"], 2);
}

#[actix_web::test]
async fn a_job_created_on_its_own_waits_for_existing_jobs_and_a_run_at_counts_after() {
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Acme").await;
    let done = crate::queue::tracer(&app, &org, &project).await;
    succeed_any(&app, &done).await;
    let first = crate::queue::tracer(&app, &org, &project).await;
    let later = (chrono::Utc::now() + chrono::Duration::hours(1)).to_rfc3339();
    let created = json_of(
        app.post(
            "/api/training/jobs",
            &org.api_key,
            &json!({"action": "draft", "projectId": project, "dependsOn": [first, done], "runAt": later}),
        )
        .await,
        StatusCode::ACCEPTED,
    )
    .await;
    assert_eq!(created["status"], "waiting");
    assert_eq!(created["dependsOn"].as_array().unwrap().len(), 2);
    let id = created["jobId"].as_str().unwrap().to_owned();
    succeed_any(&app, &first).await;
    // Its runAt is ahead: scheduled until then.
    let view = job(&app, &org, &id).await;
    assert_eq!(view["status"], "scheduled");
    assert!(view["scheduledAt"].is_string());
    // Dependencies that all succeeded already: queued at once.
    let at_once = json_of(
        app.post(
            "/api/training/jobs",
            &org.api_key,
            &json!({"action": "draft", "projectId": project, "dependsOn": [done]}),
        )
        .await,
        StatusCode::ACCEPTED,
    )
    .await;
    assert_eq!(at_once["status"], "queued");
    // A dependency that ended without success: cancelled at once, named.
    let stopped = crate::queue::tracer(&app, &org, &project).await;
    app.post(
        &format!("/api/training/jobs/{stopped}/stop"),
        &org.api_key,
        &json!({}),
    )
    .await;
    let cancelled = json_of(
        app.post(
            "/api/training/jobs",
            &org.api_key,
            &json!({"action": "draft", "projectId": project, "dependsOn": [stopped]}),
        )
        .await,
        StatusCode::ACCEPTED,
    )
    .await;
    assert_eq!(cancelled["status"], "cancelled");
    assert!(cancelled["error"].as_str().unwrap().contains(&stopped));
}

/// Claims `id` (the one tracer job queued) and reports it succeeded.
async fn succeed_any(app: &TestApp, id: &str) {
    succeed(app, id, "tracer").await;
}

#[actix_web::test]
async fn cycles_unknown_refs_and_unknown_jobs_are_refused_naming_the_item() {
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Acme").await;
    let (other, other_project) = funded(&app, "Other").await;
    let cycle = app
        .post(
            BATCH,
            &org.api_key,
            &json!({"jobs": [
                {"ref": "a", "action": "tracer", "projectId": project},
                {"ref": "b", "action": "draft", "projectId": project, "dependsOn": ["ref:a", "ref:c"]},
                {"ref": "c", "action": "draft", "projectId": project, "dependsOn": ["ref:b"]},
            ]}),
        )
        .await;
    let issues = validation_issues(cycle).await;
    assert_eq!(issues.len(), 1, "{issues:?}");
    assert_eq!(issues[0]["loc"], json!(["body", "jobs", 1, "dependsOn"]));
    let msg = issues[0]["msg"].as_str().unwrap();
    assert!(
        msg.contains("jobs[1] (b)") && msg.contains("jobs[2] (c)"),
        "{msg}"
    );
    let itself = app
        .post(
            BATCH,
            &org.api_key,
            &json!({"jobs": [{"ref": "a", "action": "tracer", "projectId": project, "dependsOn": ["ref:a"]}]}),
        )
        .await;
    assert_eq!(
        validation_issues(itself).await[0]["loc"],
        json!(["body", "jobs", 0, "dependsOn"])
    );
    let unknown = app
        .post(
            BATCH,
            &org.api_key,
            &json!({"jobs": [
                {"ref": "a", "action": "tracer", "projectId": project},
                {"action": "draft", "projectId": project, "dependsOn": ["ref:a", "ref:zz"]},
            ]}),
        )
        .await;
    let issues = validation_issues(unknown).await;
    assert_eq!(issues[0]["loc"], json!(["body", "jobs", 1, "dependsOn", 1]));
    assert!(issues[0]["msg"].as_str().unwrap().contains("zz"));
    let twice = app
        .post(
            BATCH,
            &org.api_key,
            &json!({"jobs": [
                {"ref": "a", "action": "tracer", "projectId": project},
                {"ref": "a", "action": "draft", "projectId": project},
            ]}),
        )
        .await;
    assert_eq!(
        validation_issues(twice).await[0]["loc"],
        json!(["body", "jobs", 1, "ref"])
    );
    // Shapes: a ref that is no name, an entry that is neither, too many, none.
    for (body, loc) in [
        (json!({"ref": "a b"}), json!(["body", "ref"])),
        (json!({"dependsOn": ["nope"]}), json!(["body", "dependsOn", 0])),
        (json!({"dependsOn": []}), json!(["body", "dependsOn"])),
        (
            json!({"dependsOn": (0..101).map(|_| uuid::Uuid::new_v4().to_string()).collect::<Vec<_>>()}),
            json!(["body", "dependsOn"]),
        ),
        // A single create has no other item to name.
        (json!({"dependsOn": ["ref:a"]}), json!(["body", "dependsOn", 0])),
    ] {
        let mut body = body;
        body["action"] = json!("tracer");
        body["projectId"] = json!(project);
        let issues = validation_issues(app.post("/api/training/jobs", &org.api_key, &body).await).await;
        assert!(issues.iter().any(|i| i["loc"] == loc), "{body}: {issues:?}");
    }
    // A job id that is none of the organization's: 404, named, and nothing created.
    let theirs = crate::queue::tracer(&app, &other, &other_project).await;
    for missing in [theirs.clone(), uuid::Uuid::new_v4().to_string()] {
        let refused = app
            .post(
                BATCH,
                &org.api_key,
                &json!({"jobs": [
                    {"action": "tracer", "projectId": project},
                    {"action": "draft", "projectId": project, "dependsOn": [missing]},
                ]}),
            )
            .await;
        assert_eq!(refused.status(), StatusCode::NOT_FOUND);
        let body: Value = refused.json().await.unwrap();
        assert_eq!(body["code"], "dependency_not_found");
        let detail = body["detail"].as_str().unwrap();
        assert!(
            detail.contains(&missing) && detail.contains("jobs[1]"),
            "{detail}"
        );
    }
    let single = app
        .post(
            "/api/training/jobs",
            &org.api_key,
            &json!({"action": "draft", "projectId": project, "dependsOn": [theirs]}),
        )
        .await;
    assert_eq!(single.status(), StatusCode::NOT_FOUND);
    let listed = json_of(app.get("/api/training/jobs", &org.api_key).await, StatusCode::OK).await;
    assert_eq!(listed["count"], 0, "a refused batch created nothing");
    // A schedule's job takes no dependsOn.
    let schedule = app
        .post(
            "/api/training/schedules",
            &org.api_key,
            &json!({"name": "n", "cron": "0 * * * *",
                    "job": {"action": "draft", "projectId": project, "dependsOn": [theirs]}}),
        )
        .await;
    assert_eq!(
        validation_issues(schedule).await[0]["loc"],
        json!(["body", "job", "dependsOn"])
    );
}

#[actix_web::test]
async fn waiting_jobs_are_never_claimed_nor_counted_against_a_cap() {
    let app = spawn_app_with(|s| s.queue.max_running_per_org = 1).await;
    let (org, project) = funded(&app, "Acme").await;
    let mut jobs = vec![json!({"ref": "root", "action": "draft", "projectId": project})];
    for _ in 0..20 {
        jobs.push(json!({"action": "tracer", "projectId": project, "dependsOn": ["ref:root"]}));
    }
    let ids = batch(&app, &org, json!(jobs)).await;
    // Twenty waiting tracer jobs: none is claimed, and none holds the cap's one place.
    assert!(claim(&app, "w", "tracer", 50).await.is_empty());
    let free = crate::queue::tracer(&app, &org, &project).await;
    let claimed = claim(&app, "w", "tracer", 50).await;
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0]["job_id"], free.as_str());
    assert_eq!(
        worker_post(&app, "succeeded", json!({"job_id": free, "worker_id": "w"}))
            .await
            .status(),
        StatusCode::OK
    );
    succeed(&app, &ids[0], "draft").await;
    // Queued now, and the cap counts them once they run: one at a time.
    assert_eq!(claim(&app, "w", "tracer", 50).await.len(), 1);
    assert!(claim(&app, "w", "tracer", 50).await.is_empty());
    let metrics = app.metrics_text().await;
    assert!(
        metrics.contains("status=\"waiting\""),
        "the per-status metrics name waiting"
    );
}

#[actix_web::test]
async fn a_thousand_job_pipeline_is_created_by_one_batch_and_cancelled_to_its_end() {
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Acme").await;
    let jobs: Vec<Value> = (0..1000)
        .map(|i| match i {
            0 => json!({"ref": "j0", "action": "tracer", "projectId": project}),
            _ => json!({"ref": format!("j{i}"), "action": "draft", "projectId": project,
                        "dependsOn": [format!("ref:j{}", i - 1)]}),
        })
        .collect();
    let answer = json_of(
        app.post(BATCH, &org.api_key, &json!({"jobs": jobs})).await,
        StatusCode::ACCEPTED,
    )
    .await;
    let listed = answer["jobs"].as_array().unwrap();
    assert_eq!(listed.len(), 1000);
    assert_eq!(listed[0]["status"], "queued");
    assert!(listed[1..].iter().all(|j| j["status"] == "waiting"));
    let ids: Vec<String> = listed
        .iter()
        .map(|j| j["jobId"].as_str().unwrap().to_owned())
        .collect();
    // Each depends on the one before it, in order.
    let middle = job(&app, &org, &ids[500]).await;
    assert_eq!(middle["dependsOn"][0]["jobId"], ids[499].as_str());
    assert_eq!(middle["dependents"][0]["jobId"], ids[501].as_str());
    // The pipeline's list has all thousand, page after page.
    let mut seen = std::collections::HashSet::new();
    let mut path = format!("/api/training/jobs?pipeline={}&limit=200", ids[999]);
    loop {
        let page = json_of(app.get(&path, &org.api_key).await, StatusCode::OK).await;
        for j in page["jobs"].as_array().unwrap() {
            seen.insert(j["jobId"].as_str().unwrap().to_owned());
        }
        match page["nextCursor"].as_str() {
            Some(cursor) => {
                path = format!(
                    "/api/training/jobs?pipeline={}&limit=200&cursor={cursor}",
                    ids[999]
                )
            }
            None => break,
        }
    }
    assert_eq!(seen.len(), 1000);
    // Its first job fails: all 999 after it are cancelled, each naming the one before.
    run(&app, &ids[0], "tracer", "failed", json!({"error": "OOM"})).await;
    let cancelled = json_of(
        app.get("/api/training/jobs?status=cancelled&limit=200", &org.api_key)
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(cancelled["count"], 200);
    let last = job(&app, &org, &ids[999]).await;
    assert_eq!(last["status"], "cancelled");
    assert!(last["error"].as_str().unwrap().contains(ids[998].as_str()));
    let counts = json_of(
        app.get("/api/training/jobs?status=waiting&limit=200", &org.api_key)
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(counts["count"], 0);
}

#[actix_web::test]
async fn a_cancelled_job_is_announced_to_webhook_endpoints() {
    let app = crate::webhooks::local_app().await;
    let (org, project) = funded(&app, "Acme").await;
    let (receiver, secret) =
        crate::webhooks::listening(&app, &org, json!(["job.cancelled", "job.failed"])).await;
    let ids = batch(
        &app,
        &org,
        json!([
            {"ref": "a", "action": "tracer", "projectId": project},
            {"ref": "b", "action": "draft", "projectId": project, "dependsOn": ["ref:a"]},
            {"action": "draft", "projectId": project, "dependsOn": ["ref:b"]},
        ]),
    )
    .await;
    run(&app, &ids[0], "tracer", "failed", json!({"error": "OOM"})).await;
    let events = crate::webhooks::events(&receiver, &secret, 3).await;
    assert_eq!(crate::webhooks::of_type(&events, "job.failed").len(), 1);
    let cancelled = crate::webhooks::of_type(&events, "job.cancelled");
    let mut named: Vec<&str> = cancelled
        .iter()
        .map(|e| e["data"]["jobId"].as_str().unwrap())
        .collect();
    named.sort_unstable();
    let mut expected = vec![ids[1].as_str(), ids[2].as_str()];
    expected.sort_unstable();
    assert_eq!(named, expected);
    assert!(cancelled
        .iter()
        .all(|e| e["data"]["status"] == "cancelled" && e["data"]["error"].is_string()));
}

#[actix_web::test]
async fn the_console_draws_a_jobs_pipeline() {
    use crate::console::{org_path, Console};
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Acme").await;
    let ids = four(&app, &org, &project).await;
    let console = Console::sign_in(&app, &org.api_key).await;
    let page = console.page(&org_path(&org, &format!("/jobs/{}", ids[1]))).await;
    assert!(page.contains("<svg id=\"pipeline\""), "{page}");
    for id in &ids {
        assert!(page.contains(&format!("data-job=\"{id}\"")), "{id} is drawn");
    }
    assert!(page.contains("data-status=\"waiting\""));
    assert_eq!(page.matches("class=\"edge").count(), 3, "three edges");
    // A job of no pipeline draws none.
    let alone = crate::queue::tracer(&app, &org, &project).await;
    let page = console.page(&org_path(&org, &format!("/jobs/{alone}"))).await;
    assert!(!page.contains("id=\"pipeline\""));
}

#[actix_web::test]
async fn two_branches_ending_at_once_on_two_instances_queue_the_job_that_waits_for_both() {
    if !postgres_or_skip() {
        return;
    }
    let first = spawn_app().await;
    let second = spawn_on(TestDb::reuse(&first.db_url), test_settings(&first.db_url)).await;
    let (org, project) = funded(&first, "Acme").await;
    first.fund(&org, 10_000).await;
    for round in 0..10 {
        let ids = batch(
            &first,
            &org,
            json!([
                {"ref": "b", "action": "draft", "projectId": project},
                {"ref": "c", "action": "optimize", "projectId": project},
                {"action": "tracer", "projectId": project, "dependsOn": ["ref:b", "ref:c"]},
            ]),
        )
        .await;
        let b = claim(&first, "w1", "draft", 1).await;
        let c = claim(&second, "w2", "optimize", 1).await;
        assert_eq!((b.len(), c.len()), (1, 1));
        let (x, y) = futures_util::future::join(
            worker_post(&first, "succeeded", json!({"job_id": ids[0], "worker_id": "w1"})),
            worker_post(&second, "succeeded", json!({"job_id": ids[1], "worker_id": "w2"})),
        )
        .await;
        assert_eq!((x.status(), y.status()), (StatusCode::OK, StatusCode::OK));
        assert_eq!(
            job(&first, &org, &ids[2]).await["status"],
            "queued",
            "round {round}"
        );
        let d = claim(&second, "w3", "tracer", 1).await;
        assert_eq!(d.len(), 1);
        worker_post(&second, "succeeded", json!({"job_id": ids[2], "worker_id": "w3"})).await;
    }
}

#[actix_web::test]
async fn a_cancelled_job_whose_unique_key_was_taken_meanwhile_stays_cancelled_at_the_retry() {
    let app = spawn_app().await;
    let (org, project) = funded(&app, "Acme").await;
    let ids = batch(
        &app,
        &org,
        json!([
            {"ref": "a", "action": "tracer", "projectId": project},
            {"action": "draft", "projectId": project, "uniqueKey": "nightly", "dependsOn": ["ref:a"]},
        ]),
    )
    .await;
    // A waiting job holds its unique key.
    let same = app
        .post(
            "/api/training/jobs",
            &org.api_key,
            &json!({"action": "draft", "projectId": project, "uniqueKey": "nightly"}),
        )
        .await;
    assert_eq!(same.status(), StatusCode::OK);
    assert_eq!(same.json::<Value>().await.unwrap()["jobId"], ids[1].as_str());
    run(&app, &ids[0], "tracer", "failed", json!({"error": "OOM"})).await;
    assert_eq!(job(&app, &org, &ids[1]).await["status"], "cancelled");
    // Cancelled, it holds it no more: another job takes it.
    let taken = json_of(
        app.post(
            "/api/training/jobs",
            &org.api_key,
            &json!({"action": "draft", "projectId": project, "uniqueKey": "nightly"}),
        )
        .await,
        StatusCode::ACCEPTED,
    )
    .await;
    assert_ne!(taken["jobId"], ids[1].as_str());
    let retried = app
        .post(
            &format!("/api/training/jobs/{}/retry", ids[0]),
            &org.api_key,
            &json!({}),
        )
        .await;
    assert_eq!(retried.status(), StatusCode::OK);
    assert_eq!(job(&app, &org, &ids[1]).await["status"], "cancelled");
}
