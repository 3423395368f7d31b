//! Runs: create, update, tracker links and reads; checkpoints (internal).

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::fakes::{FakeJson, Reply};
use crate::helpers::*;

const CHECKPOINTS: &str = "/api/runs/internal/checkpoints";

async fn create_run(app: &TestApp, org: &TestOrg, project: &str) -> String {
    let body = json_of(
        app.post(
            "/api/runs",
            &org.api_key,
            &json!({"projectId": project, "name": "sft-1", "model": "llama", "config": {"lr": 0.0001}}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(body["projectId"], json!(project));
    assert_eq!(body["status"], "created");
    body["runId"].as_str().unwrap().to_owned()
}

async fn patch(app: &TestApp, token: &str, run_id: &str, body: &Value) -> reqwest::Response {
    app.request(
        reqwest::Method::PATCH,
        &format!("/api/runs/{run_id}"),
        Some(token),
    )
    .json(body)
    .send()
    .await
    .unwrap()
}

#[actix_web::test]
async fn runs_are_created_in_the_callers_projects_and_updated_field_by_field() {
    let app = spawn_app().await;
    let (acme, globex) = (app.create_org("Acme").await, app.create_org("Globex").await);
    let project = app.create_project(&acme, "Support").await;
    let run_id = create_run(&app, &acme, &project).await;

    // Another organization's project, a bad id, a bad environment slug.
    let theirs = app.create_project(&globex, "Theirs").await;
    let response = app
        .post("/api/runs", &acme.api_key, &json!({"projectId": theirs}))
        .await;
    assert_error(response, StatusCode::NOT_FOUND).await;
    for (body, field) in [
        (json!({"projectId": "nope"}), "projectId"),
        (
            json!({"projectId": project, "environmentSlug": "Acme/x/y"}),
            "environmentSlug",
        ),
        (json!({"projectId": project, "name": ""}), "name"),
    ] {
        let issues = validation_issues(app.post("/api/runs", &acme.api_key, &body).await).await;
        assert_eq!(issues[0]["loc"], json!(["body", field]), "{body}");
    }

    let updated = json_of(
        patch(
            &app,
            &acme.member_token,
            &run_id,
            &json!({"status": "running", "summary": {"loss": 0.4}, "metrics": {"step": 10}, "error": "oom once"}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(updated["runId"], json!(run_id));
    assert_eq!(updated["status"], "running");
    assert_eq!(updated["summary"], json!({"loss": 0.4}));
    assert_eq!(updated["metrics"], json!({"step": 10}));
    assert_eq!(updated["config"], json!({"lr": 0.0001}));
    assert_eq!(updated["error"], "oom once");

    // Absent fields stay; null clears.
    let cleared = json_of(
        patch(
            &app,
            &acme.api_key,
            &run_id,
            &json!({"error": null, "summary": "done"}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(cleared["status"], "running");
    assert_eq!(cleared["error"], Value::Null);
    assert_eq!(cleared["summary"], "done");
    assert_eq!(cleared["metrics"], json!({"step": 10}));

    assert_error(
        patch(&app, &globex.api_key, &run_id, &json!({"status": "x"})).await,
        StatusCode::NOT_FOUND,
    )
    .await;
    assert_error(
        patch(&app, &acme.api_key, "no-such-run", &json!({})).await,
        StatusCode::NOT_FOUND,
    )
    .await;
    let issues =
        validation_issues(patch(&app, &acme.api_key, &run_id, &json!({"status": "s".repeat(65)})).await)
            .await;
    assert_eq!(issues[0]["loc"], json!(["body", "status"]));
    let issues = validation_issues(patch(&app, &acme.api_key, &run_id, &json!({"summary": 3})).await).await;
    assert_eq!(issues[0]["loc"], json!(["body", "summary"]));
}

async fn link(app: &TestApp, org: &TestOrg, run_id: &str, tracker_run_id: &str) {
    let body = json!({"entity": "acme-team", "project": "support", "trackerRunId": tracker_run_id,
        "url": format!("https://tracker.example/acme-team/support/{tracker_run_id}")});
    let linked = json_of(
        app.post(&format!("/api/runs/{run_id}/tracker"), &org.api_key, &body)
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(linked["runId"], json!(run_id));
    assert_eq!(linked["trackerRunId"], json!(tracker_run_id));
}

#[actix_web::test]
async fn tracker_links_are_answered_as_stored_without_a_tracker() {
    let app = spawn_app().await;
    let (acme, globex) = (app.create_org("Acme").await, app.create_org("Globex").await);
    let project = app.create_project(&acme, "Support").await;
    let run_id = create_run(&app, &acme, &project).await;
    link(&app, &acme, &run_id, "trk-1").await;

    let bad_url = json!({"entity": "e", "project": "p", "trackerRunId": "t", "url": "ftp://x"});
    let issues = validation_issues(
        app.post(&format!("/api/runs/{run_id}/tracker"), &acme.api_key, &bad_url)
            .await,
    )
    .await;
    assert_eq!(issues[0]["loc"], json!(["body", "url"]));
    let theirs = json!({"entity": "e", "project": "p", "trackerRunId": "t"});
    let response = app
        .post(&format!("/api/runs/{run_id}/tracker"), &globex.api_key, &theirs)
        .await;
    assert_error(response, StatusCode::NOT_FOUND).await;

    let answer = json_of(
        app.get(
            "/api/tracker?entity=acme-team&project=support&runId=trk-1&runId=trk-2",
            &acme.api_key,
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(answer["trackerConfigured"], false);
    let runs = answer["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0]["status"], "linked");
    assert_eq!(runs[0]["keelRunId"], json!(run_id));
    assert_eq!(runs[0]["url"], "https://tracker.example/acme-team/support/trk-1");
    assert_eq!(runs[1]["status"], "not_linked");

    // Links are the caller's own.
    let theirs = json_of(
        app.get(
            "/api/tracker?entity=acme-team&project=support&runId=trk-1",
            &globex.api_key,
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(theirs["runs"][0]["status"], "not_linked");

    let too_many: String = (0..501).map(|i| format!("&runId=r{i}")).collect();
    for (query, field) in [
        ("entity=e&project=p".to_owned(), "runId"),
        ("project=p&runId=r".to_owned(), "entity"),
        (format!("entity=e&project=p{too_many}"), "runId"),
        (format!("entity={}&project=p&runId=r", "e".repeat(201)), "entity"),
    ] {
        let issues = validation_issues(app.get(&format!("/api/tracker?{query}"), &acme.api_key).await).await;
        assert_eq!(issues[0]["loc"], json!(["query", field]), "{query}");
    }
}

#[actix_web::test]
async fn tracker_reads_report_a_failing_run_in_its_own_entry() {
    let (tracker, url) = FakeJson::start(|call| match call.path.as_str() {
        "/api/runs/acme-team/support/trk-ok" => {
            Reply::Json(200, json!({"id": "trk-ok", "state": "finished"}))
        }
        "/api/runs/acme-team/support/trk-slow" => Reply::Hang,
        _ => Reply::Json(500, json!({"error": "boom"})),
    });
    let app = spawn_app_with(|s| {
        s.tracker.url = url;
        s.tracker.api_key = "tracker-secret".into();
        s.tracker.timeout_ms = 300;
    })
    .await;
    let acme = app.create_org("Acme").await;
    let project = app.create_project(&acme, "Support").await;
    for tracker_run in ["trk-ok", "trk-bad", "trk-slow"] {
        let run_id = create_run(&app, &acme, &project).await;
        link(&app, &acme, &run_id, tracker_run).await;
    }
    let answer = json_of(
        app.get(
            "/api/tracker?entity=acme-team&project=support&runId=trk-ok&runId=trk-bad&runId=trk-slow&runId=trk-none",
            &acme.member_token,
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(answer["trackerConfigured"], true);
    let statuses: Vec<&str> = answer["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_str().unwrap())
        .collect();
    assert_eq!(statuses, ["ok", "error", "error", "not_linked"]);
    assert_eq!(
        answer["runs"][0]["run"],
        json!({"id": "trk-ok", "state": "finished"})
    );
    assert!(answer["runs"][1]["error"].as_str().unwrap().contains("500"));
    assert!(answer["runs"][2]["error"].as_str().unwrap().contains("in time"));
    // Only linked runs are read, with the tracker's key.
    let calls = tracker.calls();
    assert_eq!(calls.len(), 3);
    assert!(calls
        .iter()
        .all(|c| c.authorization.as_deref() == Some("Bearer tracker-secret")));
}

#[actix_web::test]
async fn checkpoints_upsert_by_step_and_list_in_step_order() {
    let app = spawn_app().await;
    let (acme, globex) = (app.create_org("Acme").await, app.create_org("Globex").await);
    let project = app.create_project(&acme, "Support").await;
    let body = json!({"runId": "run-7", "orgId": acme.org_id, "projectId": project, "checkpoints": [
        {"step": 200, "subfolder": "ckpt/200"},
        {"step": 0, "subfolder": "ckpt/0"},
        {"step": 100, "subfolder": "ckpt/100-first"},
        {"step": 100, "subfolder": "ckpt/100"},
    ]});
    let written = json_of(app.post(CHECKPOINTS, INTERNAL_KEY, &body).await, StatusCode::OK).await;
    assert_eq!(written, json!({"runId": "run-7", "upserted": 3, "total": 3}));
    let again = json!({"runId": "run-7", "orgId": acme.org_id, "projectId": project, "checkpoints": [
        {"step": 200, "subfolder": "ckpt/200-final"}, {"step": 300, "subfolder": "ckpt/300"}]});
    let written = json_of(app.post(CHECKPOINTS, INTERNAL_KEY, &again).await, StatusCode::OK).await;
    assert_eq!(written["total"], 4);
    let other_run = json!({"runId": "run-8", "orgId": acme.org_id, "projectId": project,
        "checkpoints": [{"step": 1, "subfolder": "x"}]});
    assert_eq!(
        app.post(CHECKPOINTS, INTERNAL_KEY, &other_run).await.status(),
        StatusCode::OK
    );

    let query = format!(
        "{CHECKPOINTS}?runId=run-7&orgId={}&projectId={project}",
        acme.org_id
    );
    let listed = json_of(app.get(&query, INTERNAL_KEY).await, StatusCode::OK).await;
    assert_eq!(
        listed,
        json!({"runId": "run-7", "checkpoints": [
            {"step": 0, "subfolder": "ckpt/0"},
            {"step": 100, "subfolder": "ckpt/100"},
            {"step": 200, "subfolder": "ckpt/200-final"},
            {"step": 300, "subfolder": "ckpt/300"},
        ]})
    );

    // The project must be that organization's; only the internal key may call.
    let wrong_org = format!(
        "{CHECKPOINTS}?runId=run-7&orgId={}&projectId={project}",
        globex.org_id
    );
    assert_error(app.get(&wrong_org, INTERNAL_KEY).await, StatusCode::NOT_FOUND).await;
    assert_error(app.get(&query, &acme.api_key).await, StatusCode::FORBIDDEN).await;
    let mut theirs = body.clone();
    theirs["orgId"] = json!(globex.org_id);
    assert_error(
        app.post(CHECKPOINTS, INTERNAL_KEY, &theirs).await,
        StatusCode::NOT_FOUND,
    )
    .await;

    for (item, field) in [
        (json!({"step": -1, "subfolder": "x"}), "step"),
        (json!({"step": 1, "subfolder": ""}), "subfolder"),
        (json!({"step": 1, "subfolder": "s".repeat(301)}), "subfolder"),
    ] {
        let mut bad = body.clone();
        bad["checkpoints"] = json!([{"step": 5, "subfolder": "ok"}, item]);
        let issues = validation_issues(app.post(CHECKPOINTS, INTERNAL_KEY, &bad).await).await;
        assert_eq!(issues[0]["loc"], json!(["body", "checkpoints", 1, field]));
    }
    let mut long_run = body.clone();
    long_run["runId"] = json!("r".repeat(301));
    let issues = validation_issues(app.post(CHECKPOINTS, INTERNAL_KEY, &long_run).await).await;
    assert_eq!(issues[0]["loc"], json!(["body", "runId"]));
    for (query, field) in [
        (
            format!("runId=&orgId={}&projectId={project}", acme.org_id),
            "runId",
        ),
        (format!("runId=r&orgId={}", acme.org_id), "projectId"),
        (
            format!("runId=r&orgId={}&projectId={project}", "o".repeat(301)),
            "orgId",
        ),
    ] {
        let issues = validation_issues(app.get(&format!("{CHECKPOINTS}?{query}"), INTERNAL_KEY).await).await;
        assert_eq!(issues[0]["loc"], json!(["query", field]), "{query}");
    }
}
