//! Flash (control-plane) endpoints: projects, environments, runs, checkpoints, events,
//! hub provisioning with per-organization backoff.

use futures_util::future::join_all;
use reqwest::{Method, StatusCode};
use sea_orm::{ColumnTrait, Database, EntityTrait, PaginatorTrait, QueryFilter};
use serde_json::{json, Value};

use crate::fakes::{FakeJson, Reply};
use crate::helpers::*;

const ENVIRONMENTS: &str = "/api/flash/environments/internal";
const PROVISION: &str = "/api/flash/environments/hub/provision/internal";

fn env_body(org: &TestOrg, project: &str, name: &str) -> Value {
    json!({
        "orgId": org.org_id,
        "projectId": project,
        "slug": format!("{}/support/{name}", org.slug),
        "name": name,
        "hubPath": format!("envs/{name}"),
    })
}

async fn publish(app: &TestApp, body: &Value) -> Value {
    json_of(app.post(ENVIRONMENTS, INTERNAL_KEY, body).await, StatusCode::OK).await
}

async fn delete_env(app: &TestApp, body: &Value) -> reqwest::Response {
    app.request(Method::DELETE, ENVIRONMENTS, Some(INTERNAL_KEY))
        .json(body)
        .send()
        .await
        .unwrap()
}

#[actix_web::test]
async fn project_validate_checks_the_project_is_active_in_the_organization() {
    let app = spawn_app().await;
    let (acme, globex) = (app.create_org("Acme").await, app.create_org("Globex").await);
    let project = app.create_project(&acme, "Support").await;
    let path = "/api/flash/projects/validate/internal";
    let ok = json_of(
        app.post(
            path,
            INTERNAL_KEY,
            &json!({"orgId": acme.org_id, "projectId": project}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(ok["valid"], true);
    assert_eq!(ok["projectId"], json!(project));
    assert_eq!(ok["slug"], "support");
    let other = json!({"orgId": globex.org_id, "projectId": project});
    assert_error(app.post(path, INTERNAL_KEY, &other).await, StatusCode::NOT_FOUND).await;
    assert_error(
        app.post(
            path,
            &acme.api_key,
            &json!({"orgId": acme.org_id, "projectId": project}),
        )
        .await,
        StatusCode::FORBIDDEN,
    )
    .await;
    for (body, field) in [
        (json!({"orgId": "", "projectId": project}), "orgId"),
        (json!({"orgId": acme.org_id, "projectId": "x"}), "projectId"),
        (json!({"orgId": acme.org_id}), "projectId"),
    ] {
        let issues = validation_issues(app.post(path, INTERNAL_KEY, &body).await).await;
        assert_eq!(issues[0]["loc"], json!(["body", field]), "{body}");
    }
}

#[actix_web::test]
async fn environments_publish_upsert_by_slug_validate_use_and_delete() {
    let (hub, hub_url) = FakeJson::start(|_| Reply::Json(201, json!({})));
    let app = spawn_app_with(|s| s.hub.url = hub_url).await;
    let (acme, globex) = (app.create_org("Acme").await, app.create_org("Globex").await);
    let project = app.create_project(&acme, "Support").await;
    let other_project = app.create_project(&acme, "Other").await;
    let body = env_body(&acme, &project, "grader");
    let slug = body["slug"].as_str().unwrap().to_owned();

    let created = publish(&app, &body).await;
    assert_eq!(created["created"], true);
    assert_eq!(created["slug"], json!(slug));
    assert_eq!(created["hubRepo"], "keel/environments");
    assert_eq!(created["hubRef"], "main");
    assert_eq!(created["hubStatus"], "pending");
    let mut renamed = body.clone();
    renamed["name"] = json!("Grader v2");
    renamed["packageSha256"] = json!("a".repeat(64));
    renamed["metadata"] = json!({"tags": ["rl"]});
    let replaced = publish(&app, &renamed).await;
    assert_eq!(replaced["created"], false);
    assert_eq!(replaced["id"], created["id"]);
    assert_eq!(replaced["name"], "Grader v2");
    assert_eq!(replaced["metadata"], json!({"tags": ["rl"]}));

    // Another organization cannot take the slug; a project outside the org is 404.
    let mut stolen = env_body(&globex, &app.create_project(&globex, "Support").await, "grader");
    stolen["slug"] = json!(slug);
    assert_error(
        app.post(ENVIRONMENTS, INTERNAL_KEY, &stolen).await,
        StatusCode::CONFLICT,
    )
    .await;
    let mut foreign = body.clone();
    foreign["orgId"] = json!(globex.org_id);
    assert_error(
        app.post(ENVIRONMENTS, INTERNAL_KEY, &foreign).await,
        StatusCode::NOT_FOUND,
    )
    .await;

    // Validate checks the project association and changes nothing.
    let reference = json!({"orgId": acme.org_id, "projectId": project, "slug": slug});
    let validate = "/api/flash/environments/validate/internal";
    let valid = json_of(app.post(validate, INTERNAL_KEY, &reference).await, StatusCode::OK).await;
    assert_eq!(valid, json!({"valid": true}));
    let mut wrong = reference.clone();
    wrong["projectId"] = json!(other_project);
    assert_error(
        app.post(validate, INTERNAL_KEY, &wrong).await,
        StatusCode::NOT_FOUND,
    )
    .await;
    let unknown =
        json!({"orgId": acme.org_id, "projectId": project, "slug": format!("{}/support/none", acme.slug)});
    assert_error(
        app.post(validate, INTERNAL_KEY, &unknown).await,
        StatusCode::NOT_FOUND,
    )
    .await;
    assert_eq!(
        publish(&app, &renamed).await["created"],
        false,
        "validate created nothing"
    );

    // Use records the run's reference, once per run.
    let used = "/api/flash/environments/use/internal";
    let mut use_body = reference.clone();
    use_body["runId"] = json!("run-1");
    for _ in 0..2 {
        let recorded = json_of(app.post(used, INTERNAL_KEY, &use_body).await, StatusCode::OK).await;
        assert_eq!(recorded, json!({"recorded": true}));
    }
    assert_eq!(
        app.post(used, INTERNAL_KEY, &reference).await.status(),
        StatusCode::OK
    );
    let db = Database::connect(&app.db_url).await.unwrap();
    let uses = entities::flash_environment_use::Entity::find()
        .filter(entities::flash_environment_use::Column::Slug.eq(&slug))
        .all(&db)
        .await
        .unwrap();
    assert_eq!(uses.len(), 2);
    assert_eq!(
        uses.iter()
            .filter(|u| u.run_id.as_deref() == Some("run-1"))
            .count(),
        1
    );
    let mut foreign_use = use_body.clone();
    foreign_use["orgId"] = json!(globex.org_id);
    assert_error(
        app.post(used, INTERNAL_KEY, &foreign_use).await,
        StatusCode::NOT_FOUND,
    )
    .await;
    let mut empty_run = use_body.clone();
    empty_run["runId"] = json!("");
    let issues = validation_issues(app.post(used, INTERNAL_KEY, &empty_run).await).await;
    assert_eq!(issues[0]["loc"], json!(["body", "runId"]));

    // Delete drops the mirror row only, and is harmless twice; it never calls anyone back.
    let deleted = json_of(delete_env(&app, &reference).await, StatusCode::OK).await;
    assert_eq!(deleted["deleted"], true);
    let again = json_of(delete_env(&app, &reference).await, StatusCode::OK).await;
    assert_eq!(again["deleted"], false);
    assert_error(
        app.post(validate, INTERNAL_KEY, &reference).await,
        StatusCode::NOT_FOUND,
    )
    .await;
    assert!(hub.calls().is_empty());
    db.close().await.ok();
}

#[actix_web::test]
async fn environment_bodies_enforce_every_bound() {
    let app = spawn_app().await;
    let acme = app.create_org("Acme").await;
    let project = app.create_project(&acme, "Support").await;
    let good = env_body(&acme, &project, "grader");
    let cases: Vec<(&str, Value, &str)> = vec![
        ("slug", json!("ab"), "string_too_short"),
        (
            "slug",
            json!(format!("a/b/{}", "c".repeat(510))),
            "string_too_long",
        ),
        ("slug", json!("acme/support"), "string_pattern_mismatch"),
        ("slug", json!("Acme/support/grader"), "string_pattern_mismatch"),
        ("slug", json!("acme/-support/grader"), "string_pattern_mismatch"),
        (
            "slug",
            json!("acme/support/grader/extra"),
            "string_pattern_mismatch",
        ),
        ("name", json!(""), "string_too_short"),
        ("name", json!("n".repeat(121)), "string_too_long"),
        ("hubRepo", json!(""), "string_too_short"),
        ("hubRef", json!(""), "string_too_short"),
        ("hubPath", json!(""), "string_too_short"),
        ("packageSha256", json!("A".repeat(64)), "string_pattern_mismatch"),
        ("packageSha256", json!("a".repeat(63)), "string_pattern_mismatch"),
        ("orgId", json!(""), "string_too_short"),
        ("projectId", json!("not-a-uuid"), "uuid_parsing"),
        ("metadata", json!("text"), "dict_type"),
    ];
    for (field, value, kind) in cases {
        let mut body = good.clone();
        body[field] = value;
        let issues = validation_issues(app.post(ENVIRONMENTS, INTERNAL_KEY, &body).await).await;
        assert_eq!(issues[0]["loc"], json!(["body", field]), "{field}");
        assert_eq!(issues[0]["type"], kind, "{field}: {issues:?}");
    }
    let mut missing = good.clone();
    missing.as_object_mut().unwrap().remove("hubPath");
    let issues = validation_issues(app.post(ENVIRONMENTS, INTERNAL_KEY, &missing).await).await;
    assert_eq!(issues[0]["type"], "missing");
    let mut edge = good.clone();
    edge["name"] = json!("n".repeat(120));
    edge["packageSha256"] = json!("0123456789abcdef".repeat(4));
    edge["hubRepo"] = json!("acme/envs");
    edge["hubRef"] = json!("v1");
    let published = publish(&app, &edge).await;
    assert_eq!(published["hubRepo"], "acme/envs");
    for path in [
        "/api/flash/environments/validate/internal",
        "/api/flash/environments/use/internal",
    ] {
        let body = json!({"orgId": acme.org_id, "projectId": project, "slug": "no"});
        let issues = validation_issues(app.post(path, INTERNAL_KEY, &body).await).await;
        assert_eq!(issues[0]["loc"], json!(["body", "slug"]), "{path}");
    }
    let bad_delete = json!({"orgId": acme.org_id, "slug": "a/b/c"});
    let issues = validation_issues(delete_env(&app, &bad_delete).await).await;
    assert_eq!(issues[0]["loc"], json!(["body", "projectId"]));
}

#[actix_web::test]
async fn run_and_checkpoint_upserts_keep_one_row_and_the_latest_status() {
    let app = spawn_app().await;
    let (acme, globex) = (app.create_org("Acme").await, app.create_org("Globex").await);
    let project = app.create_project(&acme, "Support").await;
    let runs = "/api/flash/runs/internal";
    let first = json!({"orgId": acme.org_id, "projectId": project, "runId": "run-1", "status": "queued",
        "model": "llama", "costUsd": 0.5, "updatedAt": "2026-11-22T10:00:00Z"});
    let created = json_of(app.post(runs, INTERNAL_KEY, &first).await, StatusCode::OK).await;
    assert_eq!(created["result"], "created");
    assert_eq!(created["status"], "queued");
    assert!(
        created.as_object().unwrap().values().all(Value::is_string),
        "string to string: {created}"
    );
    let second = json!({"orgId": acme.org_id, "projectId": project, "runId": "run-1", "status": "running",
        "phase": "train", "costUsd": null, "updatedAt": "2026-11-22T10:05:00Z"});
    let updated = json_of(app.post(runs, INTERNAL_KEY, &second).await, StatusCode::OK).await;
    assert_eq!(
        (updated["result"].as_str(), updated["status"].as_str()),
        (Some("updated"), Some("running"))
    );
    // A late, older update does not roll the status back.
    let late = json!({"orgId": acme.org_id, "projectId": project, "runId": "run-1", "status": "queued",
        "updatedAt": "2026-11-22T09:59:00Z"});
    let stale = json_of(app.post(runs, INTERNAL_KEY, &late).await, StatusCode::OK).await;
    assert_eq!(
        (stale["result"].as_str(), stale["status"].as_str()),
        (Some("stale"), Some("running"))
    );

    let db = Database::connect(&app.db_url).await.unwrap();
    let rows = entities::flash_run::Entity::find().all(&db).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].status, "running");
    let data: Value = serde_json::from_str(&rows[0].data).unwrap();
    assert_eq!(data["model"], "llama", "absent fields are kept");
    assert_eq!(data["phase"], "train");
    assert_eq!(data["costUsd"], Value::Null, "null clears");

    let mut foreign = first.clone();
    foreign["orgId"] = json!(globex.org_id);
    assert_error(
        app.post(runs, INTERNAL_KEY, &foreign).await,
        StatusCode::NOT_FOUND,
    )
    .await;
    let other_project = app.create_project(&acme, "Other").await;
    let mut moved = second.clone();
    moved["projectId"] = json!(other_project);
    assert_error(app.post(runs, INTERNAL_KEY, &moved).await, StatusCode::CONFLICT).await;
    for (field, value) in [
        ("runId", json!("")),
        ("runId", json!("r".repeat(129))),
        ("status", json!("")),
        ("status", json!("s".repeat(65))),
        ("costUsd", json!("cheap")),
        ("spec", json!([1])),
        ("projectId", json!("nope")),
    ] {
        let mut body = first.clone();
        body[field] = value;
        let issues = validation_issues(app.post(runs, INTERNAL_KEY, &body).await).await;
        assert_eq!(issues[0]["loc"], json!(["body", field]), "{field}");
    }
    let mut edge = first.clone();
    edge["runId"] = json!("r".repeat(128));
    edge["status"] = json!("s".repeat(64));
    assert_eq!(app.post(runs, INTERNAL_KEY, &edge).await.status(), StatusCode::OK);

    let checkpoints = "/api/flash/runs/checkpoints/internal";
    let checkpoint = json!({"orgId": acme.org_id, "projectId": project, "runId": "run-1",
        "checkpointId": "ckpt-100", "seed": 7, "metrics": {"loss": 0.3}});
    let first_cp = json_of(
        app.post(checkpoints, INTERNAL_KEY, &checkpoint).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(first_cp["result"], "created");
    assert_eq!(first_cp["checkpointId"], "ckpt-100");
    let mut second_cp = checkpoint.clone();
    second_cp["artifactPath"] = json!("s3://bucket/ckpt-100");
    second_cp.as_object_mut().unwrap().remove("seed");
    let again = json_of(
        app.post(checkpoints, INTERNAL_KEY, &second_cp).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(again["result"], "updated");
    let stored = entities::flash_checkpoint::Entity::find().all(&db).await.unwrap();
    assert_eq!(stored.len(), 1);
    let data: Value = serde_json::from_str(&stored[0].data).unwrap();
    assert_eq!(
        (data["seed"].as_i64(), data["artifactPath"].as_str()),
        (Some(7), Some("s3://bucket/ckpt-100"))
    );
    for (field, value) in [
        ("checkpointId", json!("")),
        ("checkpointId", json!("c".repeat(257))),
        ("runId", json!("r".repeat(129))),
        ("seed", json!("seven")),
    ] {
        let mut body = checkpoint.clone();
        body[field] = value;
        let issues = validation_issues(app.post(checkpoints, INTERNAL_KEY, &body).await).await;
        assert_eq!(issues[0]["loc"], json!(["body", field]), "{field}");
    }
    let mut long_id = checkpoint.clone();
    long_id["checkpointId"] = json!("c".repeat(256));
    assert_eq!(
        app.post(checkpoints, INTERNAL_KEY, &long_id).await.status(),
        StatusCode::OK
    );

    // Deleting the organization removes its mirrors.
    app.delete_org(&acme).await;
    assert_eq!(entities::flash_run::Entity::find().count(&db).await.unwrap(), 0);
    assert_eq!(
        entities::flash_checkpoint::Entity::find()
            .count(&db)
            .await
            .unwrap(),
        0
    );
    db.close().await.ok();
}

#[actix_web::test]
async fn concurrent_upserts_of_one_run_keep_one_row_and_lose_no_field() {
    let app = spawn_app().await;
    let acme = app.create_org("Acme").await;
    let project = app.create_project(&acme, "Support").await;
    let requests = (0..20).map(|i| {
        let body = json!({"orgId": acme.org_id, "projectId": project, "runId": "run-hot",
            "status": format!("step-{i}"), "metadata": {"writer": i}, "gpuType": format!("gpu-{i}")});
        let mut body = body;
        // Each writer also sets a field nobody else sets.
        body[["model", "phase", "algorithm", "adapterRef"][i % 4]] = json!(format!("v{i}"));
        app.post_later("/api/flash/runs/internal", INTERNAL_KEY, &body)
    });
    for response in join_all(requests).await {
        assert_eq!(response.status(), StatusCode::OK);
    }
    let db = Database::connect(&app.db_url).await.unwrap();
    let rows = entities::flash_run::Entity::find().all(&db).await.unwrap();
    assert_eq!(rows.len(), 1);
    let data: Value = serde_json::from_str(&rows[0].data).unwrap();
    for field in ["model", "phase", "algorithm", "adapterRef", "gpuType", "metadata"] {
        assert!(
            data[field].is_string() || data[field].is_object(),
            "{field} lost: {data}"
        );
    }
    db.close().await.ok();
}

#[actix_web::test]
async fn product_events_outside_the_allowlist_are_422() {
    let app = spawn_app_with(|s| s.flash.event_allowlist.push("custom_event".into())).await;
    let acme = app.create_org("Acme").await;
    let path = "/api/flash/events/internal";
    for event in ["adapter_exported", "environment_published", "custom_event"] {
        let body =
            json!({"orgId": acme.org_id, "event": event, "userId": "u1", "properties": {"adapterId": "a"}});
        assert_eq!(
            json_of(app.post(path, INTERNAL_KEY, &body).await, StatusCode::OK).await,
            json!({"accepted": true})
        );
    }
    for event in [json!("made_up"), json!(""), json!("e".repeat(65))] {
        let issues = validation_issues(
            app.post(path, INTERNAL_KEY, &json!({"orgId": acme.org_id, "event": event}))
                .await,
        )
        .await;
        assert_eq!(issues[0]["loc"], json!(["body", "event"]), "{event}");
    }
    let issues = validation_issues(
        app.post(
            path,
            INTERNAL_KEY,
            &json!({"orgId": acme.org_id, "event": "made_up"}),
        )
        .await,
    )
    .await;
    assert_eq!(issues[0]["type"], "literal_error");
    let unknown_org = json!({"orgId": uuid::Uuid::new_v4().to_string(), "event": "adapter_exported"});
    assert_error(
        app.post(path, INTERNAL_KEY, &unknown_org).await,
        StatusCode::NOT_FOUND,
    )
    .await;
    let db = Database::connect(&app.db_url).await.unwrap();
    let stored = entities::product_event::Entity::find()
        .filter(entities::product_event::Column::OrgId.eq(&acme.org_id))
        .count(&db)
        .await
        .unwrap();
    assert_eq!(stored, 3);
    db.close().await.ok();
}

async fn provision(app: &TestApp, query: &str) -> Value {
    json_of(
        app.post(&format!("{PROVISION}{query}"), INTERNAL_KEY, &json!({}))
            .await,
        StatusCode::OK,
    )
    .await
}

fn report(attempted: u64, provisioned: u64, failed: u64, skipped: u64) -> Value {
    json!({"attempted": attempted, "provisioned": provisioned, "failed": failed, "skipped": skipped})
}

async fn backoff_failures(db_url: &str, org_id: &str) -> Option<i32> {
    let db = Database::connect(db_url).await.unwrap();
    let row = entities::hub_backoff::Entity::find_by_id(keel_core::domain::OrgId::parse(org_id).unwrap())
        .one(&db)
        .await
        .unwrap();
    db.close().await.ok();
    row.map(|b| b.failures)
}

#[actix_web::test]
async fn hub_provisioning_backs_off_per_organization() {
    // The hub refuses Acme's environments.
    let (hub, hub_url) = FakeJson::start(|call| {
        if call.body["slug"].as_str().unwrap_or_default().starts_with("acme") {
            Reply::Json(500, json!({"error": "quota"}))
        } else {
            Reply::Json(201, json!({"ok": true}))
        }
    });
    let app = spawn_app_with(|s| {
        s.hub.url = hub_url;
        s.hub.token = "hub-token".into();
        s.hub.backoff_base_secs = 1;
        s.hub.backoff_max_secs = 1;
    })
    .await;
    let (acme, globex) = (app.create_org("Acme").await, app.create_org("Globex").await);
    let (acme_project, globex_project) = (
        app.create_project(&acme, "Support").await,
        app.create_project(&globex, "Support").await,
    );
    for name in ["one", "two"] {
        publish(&app, &env_body(&acme, &acme_project, name)).await;
        publish(&app, &env_body(&globex, &globex_project, name)).await;
    }

    // A pass narrowed to Globex touches Globex only.
    assert_eq!(
        provision(&app, &format!("?orgId={}", globex.org_id)).await,
        report(2, 2, 0, 0)
    );
    assert_eq!(backoff_failures(&app.db_url, &acme.org_id).await, None);
    let call = &hub.calls()[0];
    assert_eq!((call.method.as_str(), call.path.as_str()), ("POST", "/repos"));
    assert_eq!(call.authorization.as_deref(), Some("Bearer hub-token"));
    assert_eq!(call.body["repo"], "keel/environments");
    assert_eq!(call.body["ref"], "main");
    assert_eq!(call.body["orgId"], json!(globex.org_id));

    // Acme's first failure backs Acme off and skips its second environment.
    assert_eq!(provision(&app, "").await, report(1, 0, 1, 1));
    assert_eq!(backoff_failures(&app.db_url, &acme.org_id).await, Some(1));
    // While Acme waits, its environments are skipped, and Globex's new one still goes.
    publish(&app, &env_body(&globex, &globex_project, "three")).await;
    assert_eq!(provision(&app, "").await, report(1, 1, 0, 2));
    assert_eq!(
        provision(&app, &format!("?orgId={}", acme.org_id)).await,
        report(0, 0, 0, 2)
    );
    assert_eq!(backoff_failures(&app.db_url, &acme.org_id).await, Some(1));
    assert_eq!(backoff_failures(&app.db_url, &globex.org_id).await, None);
    let calls_before = hub.calls().len();
    // After the delay Acme is tried again, and its backoff grows.
    actix_web::rt::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert_eq!(
        provision(&app, &format!("?orgId={}", globex.org_id)).await,
        report(0, 0, 0, 0)
    );
    assert_eq!(provision(&app, "?limit=1").await, report(1, 0, 1, 0));
    assert_eq!(backoff_failures(&app.db_url, &acme.org_id).await, Some(2));
    assert_eq!(hub.calls().len(), calls_before + 1);
}

#[actix_web::test]
async fn concurrent_provisioning_passes_call_the_hub_once_per_environment() {
    let (hub, hub_url) = FakeJson::start(|_| Reply::Json(200, json!({})));
    let app = spawn_app_with(|s| s.hub.url = hub_url).await;
    let acme = app.create_org("Acme").await;
    let project = app.create_project(&acme, "Support").await;
    for i in 0..6 {
        publish(&app, &env_body(&acme, &project, &format!("env{i}"))).await;
    }
    let passes = join_all((0..3).map(|_| app.post_later(PROVISION, INTERNAL_KEY, &json!({})))).await;
    let mut provisioned = 0;
    for pass in passes {
        provisioned += json_of(pass, StatusCode::OK).await["provisioned"]
            .as_u64()
            .unwrap();
    }
    assert_eq!(provisioned, 6);
    let mut slugs: Vec<String> = hub
        .calls()
        .iter()
        .map(|c| c.body["slug"].as_str().unwrap().to_owned())
        .collect();
    slugs.sort();
    slugs.dedup();
    assert_eq!((slugs.len(), hub.calls().len()), (6, 6));
    // Nothing is left waiting.
    assert_eq!(provision(&app, "").await, report(0, 0, 0, 0));
}

#[actix_web::test]
async fn provisioning_query_bounds_and_an_unconfigured_hub() {
    let (_hub, hub_url) = FakeJson::start(|_| Reply::Json(200, json!({})));
    let app = spawn_app_with(|s| s.hub.url = hub_url).await;
    for (query, field) in [
        ("?limit=0", "limit"),
        ("?limit=101", "limit"),
        ("?limit=x", "limit"),
        ("?orgId=nope", "orgId"),
    ] {
        let issues = validation_issues(
            app.post(&format!("{PROVISION}{query}"), INTERNAL_KEY, &json!({}))
                .await,
        )
        .await;
        assert_eq!(issues[0]["loc"], json!(["query", field]), "{query}");
    }
    assert_eq!(provision(&app, "?limit=100").await, report(0, 0, 0, 0));
    let acme = app.create_org("Acme").await;
    assert_error(
        app.post(PROVISION, &acme.api_key, &json!({})).await,
        StatusCode::FORBIDDEN,
    )
    .await;

    // No hub configured: 200, nothing attempted, the environments the pass would have tried
    // (at most `limit`) counted as skipped, and still waiting for a later pass.
    let unconfigured = spawn_app().await;
    assert_eq!(provision(&unconfigured, "").await, report(0, 0, 0, 0));
    let initech = unconfigured.create_org("Initech").await;
    let project = unconfigured.create_project(&initech, "Support").await;
    for name in ["one", "two", "three"] {
        publish(&unconfigured, &env_body(&initech, &project, name)).await;
    }
    assert_eq!(provision(&unconfigured, "").await, report(0, 0, 0, 3));
    assert_eq!(provision(&unconfigured, "?limit=2").await, report(0, 0, 0, 2));
    assert_eq!(
        provision(&unconfigured, &format!("?orgId={}", initech.org_id)).await,
        report(0, 0, 0, 3)
    );
}
