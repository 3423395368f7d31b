use reqwest::StatusCode;
use serde_json::json;

use crate::helpers::*;

#[actix_web::test]
async fn organizations_are_created_with_a_slug_and_an_owner() {
    let app = spawn_app().await;
    let body = json_of(
        app.post(
            "/api/internal/orgs",
            INTERNAL_KEY,
            &json!({"name": "Acme Labs", "ownerUserId": "alice"}),
        )
        .await,
        StatusCode::CREATED,
    )
    .await;
    assert_eq!(body["slug"], "acme-labs");
    let org_id = body["orgId"].as_str().unwrap();
    assert!(uuid::Uuid::parse_str(org_id).is_ok());
    let verify = json_of(
        app.get("/api/auth/verify", &session_token("alice")).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(verify["orgs"][org_id], "owner");

    // A derived slug that is taken gets a suffix; an explicit one is a conflict.
    let again = json_of(
        app.post(
            "/api/internal/orgs",
            INTERNAL_KEY,
            &json!({"name": "Acme Labs", "ownerUserId": "bob"}),
        )
        .await,
        StatusCode::CREATED,
    )
    .await;
    assert_ne!(again["slug"], "acme-labs");
    assert!(again["slug"].as_str().unwrap().starts_with("acme-labs-"));
    let taken = app
        .post(
            "/api/internal/orgs",
            INTERNAL_KEY,
            &json!({"name": "Other", "slug": "acme-labs", "ownerUserId": "carol"}),
        )
        .await;
    assert_error(taken, StatusCode::CONFLICT).await;
}

#[actix_web::test]
async fn members_can_be_added_and_promoted() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let path = format!("/api/internal/orgs/{}/members/dave", org.org_id);
    assert_eq!(
        json_of(
            app.put(&path, INTERNAL_KEY, &json!({"role": "member", "email": "d@x.io"}))
                .await,
            StatusCode::OK
        )
        .await,
        json!({"ok": true})
    );
    let verify = json_of(
        app.get("/api/auth/verify", &session_token("dave")).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(verify["orgs"][&org.org_id], "member");
    app.put(&path, INTERNAL_KEY, &json!({"role": "owner"})).await;
    let verify = json_of(
        app.get("/api/auth/verify", &session_token("dave")).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(verify["orgs"][&org.org_id], "owner");

    let bad_role = app.put(&path, INTERNAL_KEY, &json!({"role": "admin"})).await;
    assert_eq!(
        validation_issues(bad_role).await[0]["loc"],
        json!(["body", "role"])
    );
    let unknown_org = app
        .put(
            &format!("/api/internal/orgs/{}/members/dave", uuid::Uuid::new_v4()),
            INTERNAL_KEY,
            &json!({"role": "member"}),
        )
        .await;
    assert_error(unknown_org, StatusCode::NOT_FOUND).await;
}

#[actix_web::test]
async fn api_keys_are_minted_once_and_stored_only_as_hashes() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    // An empty body is allowed.
    let response = app
        .request(
            reqwest::Method::POST,
            &format!("/api/internal/orgs/{}/api-keys", org.org_id),
            Some(INTERNAL_KEY),
        )
        .send()
        .await
        .unwrap();
    let created = json_of(response, StatusCode::CREATED).await;
    let key = created["key"].as_str().unwrap();
    let random = key.strip_prefix("keel_sk_").unwrap();
    assert!(random.len() >= 32 && random.chars().all(|c| c.is_ascii_alphanumeric()));

    // The database holds no secret.
    let db = sea_orm::Database::connect(&app.db_url).await.unwrap();
    use sea_orm::EntityTrait;
    let rows = entities::api_key::Entity::find().all(&db).await.unwrap();
    assert_eq!(rows.len(), 2);
    for row in rows {
        assert!(!format!("{row:?}").contains(random));
        assert!(!format!("{row:?}").contains(&org.api_key["keel_sk_".len()..]));
    }
    db.close().await.unwrap();

    let unknown = app
        .post(
            &format!("/api/internal/orgs/{}/api-keys", uuid::Uuid::new_v4()),
            INTERNAL_KEY,
            &json!({}),
        )
        .await;
    assert_error(unknown, StatusCode::NOT_FOUND).await;
    let unknown_key = app.delete("/api/internal/api-keys/nope", INTERNAL_KEY).await;
    assert_error(unknown_key, StatusCode::NOT_FOUND).await;
}

#[actix_web::test]
async fn adapters_have_exactly_one_owner() {
    let app = spawn_app().await;
    let acme = app.create_org("Acme").await;
    let globex = app.create_org("Globex").await;
    let path = "/api/internal/adapters/acme/support-bot";
    let created = json_of(
        app.put(
            path,
            INTERNAL_KEY,
            &json!({"orgId": acme.org_id, "baseModel": "meta-llama/Llama-3.1-8B-Instruct", "live": true}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        created,
        json!({"adapterId": "acme/support-bot", "orgId": acme.org_id, "baseModel": "meta-llama/Llama-3.1-8B-Instruct", "live": true})
    );
    // Re-attributing keeps one owner; `live` is kept when not sent.
    let moved = json_of(
        app.put(
            path,
            INTERNAL_KEY,
            &json!({"orgId": globex.org_id, "baseModel": "meta-llama/Llama-3.1-8B-Instruct"}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(moved["orgId"], globex.org_id.as_str());
    assert_eq!(moved["live"], true);

    let unknown_org = app
        .put(
            path,
            INTERNAL_KEY,
            &json!({"orgId": uuid::Uuid::new_v4(), "baseModel": "m"}),
        )
        .await;
    assert_error(unknown_org, StatusCode::NOT_FOUND).await;
    let bad = app
        .put(
            path,
            INTERNAL_KEY,
            &json!({"orgId": "not-a-uuid", "baseModel": ""}),
        )
        .await;
    let issues = validation_issues(bad).await;
    let locs: Vec<_> = issues.iter().map(|i| i["loc"].clone()).collect();
    assert!(locs.contains(&json!(["body", "orgId"])));
    assert!(locs.contains(&json!(["body", "baseModel"])));

    assert_eq!(
        json_of(app.delete(path, INTERNAL_KEY).await, StatusCode::OK).await,
        json!({"deleted": true})
    );
    assert_error(app.delete(path, INTERNAL_KEY).await, StatusCode::NOT_FOUND).await;
}

#[actix_web::test]
async fn deleting_an_organization_takes_everything_of_it() {
    let app = spawn_app().await;
    let acme = app.create_org("Acme").await;
    let globex = app.create_org("Globex").await;
    let project = app.create_project(&acme, "Doomed").await;
    let kept = app.create_project(&globex, "Kept").await;
    app.put(
        "/api/internal/adapters/acme-bot",
        INTERNAL_KEY,
        &json!({"orgId": acme.org_id, "baseModel": "m"}),
    )
    .await;
    // A job with an ended attempt in its history, and another organization's.
    let mut ended = Vec::new();
    for (org, project) in [(&acme, &project), (&globex, &kept)] {
        app.fund(org, 1000).await;
        let job = crate::queue::tracer(&app, org, project).await;
        assert_eq!(crate::queue::claim(&app, "w", "tracer", 1).await.len(), 1);
        let done =
            crate::queue::worker_post(&app, "succeeded", json!({"job_id": job, "worker_id": "w"})).await;
        assert_eq!(done.status(), StatusCode::OK);
        ended.push(keel_core::domain::JobId::parse(&job).unwrap());
    }

    let deleted = app
        .delete(&format!("/api/internal/orgs/{}", acme.org_id), INTERNAL_KEY)
        .await;
    assert_eq!(json_of(deleted, StatusCode::OK).await, json!({"deleted": true}));
    assert_error(
        app.get("/api/auth/verify", &acme.api_key).await,
        StatusCode::UNAUTHORIZED,
    )
    .await;
    let verify = json_of(
        app.get("/api/auth/verify", &acme.owner_token).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(verify["orgs"], json!({}));
    assert_error(
        app.delete("/api/internal/adapters/acme-bot", INTERNAL_KEY).await,
        StatusCode::NOT_FOUND,
    )
    .await;

    let db = sea_orm::Database::connect(&app.db_url).await.unwrap();
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    assert!(
        entities::project::Entity::find_by_id(keel_core::domain::ProjectId::parse(&project).unwrap())
            .one(&db)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        entities::project::Entity::find_by_id(keel_core::domain::ProjectId::parse(&kept).unwrap())
            .one(&db)
            .await
            .unwrap()
            .is_some()
    );
    // Its jobs' attempts went with it; the other organization's stay.
    let attempts = |job: keel_core::domain::JobId| {
        let db = &db;
        async move {
            entities::training_job_attempt::Entity::find()
                .filter(entities::training_job_attempt::Column::JobId.eq(job))
                .all(db)
                .await
                .unwrap()
                .len()
        }
    };
    assert_eq!(attempts(ended[0].clone()).await, 0);
    assert_eq!(attempts(ended[1].clone()).await, 1);
    db.close().await.unwrap();

    let again = app
        .delete(&format!("/api/internal/orgs/{}", acme.org_id), INTERNAL_KEY)
        .await;
    assert_error(again, StatusCode::NOT_FOUND).await;
    let bad = app.delete("/api/internal/orgs/not-a-uuid", INTERNAL_KEY).await;
    assert_eq!(validation_issues(bad).await[0]["loc"], json!(["path", "org_id"]));
}
