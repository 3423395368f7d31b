use reqwest::{Method, StatusCode};
use serde_json::json;

use crate::helpers::*;

#[actix_web::test]
async fn projects_are_created_listed_and_read() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let created = json_of(
        app.post(
            "/api/projects",
            &org.api_key,
            &json!({"name": "Support Bot", "description": "answers tickets"}),
        )
        .await,
        StatusCode::CREATED,
    )
    .await;
    let id = created["id"].as_str().unwrap().to_owned();
    assert!(uuid::Uuid::parse_str(&id).is_ok());
    assert_eq!(
        created,
        json!({"id": id, "orgId": org.org_id, "name": "Support Bot", "slug": "support-bot", "active": true})
    );

    // A session names its organization in the body.
    let second = json_of(
        app.post(
            "/api/projects",
            &org.member_token,
            &json!({"orgId": org.org_id, "name": "Eval Suite", "slug": "evals"}),
        )
        .await,
        StatusCode::CREATED,
    )
    .await;
    assert_eq!(second["slug"], "evals");

    for token in [&org.api_key, &org.owner_token, &org.member_token] {
        let list = json_of(app.get("/api/projects", token).await, StatusCode::OK).await;
        let names: Vec<_> = list
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].clone())
            .collect();
        assert_eq!(names, vec![json!("Support Bot"), json!("Eval Suite")]);
    }
    let one = json_of(
        app.get(&format!("/api/projects/{id}"), &org.member_token).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(one["name"], "Support Bot");
    assert_eq!(one["description"], "answers tickets");
    assert_eq!(one["orgId"], org.org_id.as_str());
    // Upper-case spelling of the same UUID finds the same project.
    let upper = app
        .get(&format!("/api/projects/{}", id.to_uppercase()), &org.api_key)
        .await;
    assert_eq!(upper.status(), StatusCode::OK);
}

#[actix_web::test]
async fn slugs_are_unique_within_an_organization_only() {
    let app = spawn_app().await;
    let acme = app.create_org("Acme").await;
    let globex = app.create_org("Globex").await;
    app.create_project(&acme, "Bot").await;
    // An explicit slug that is taken is a conflict; a derived one gets a suffix instead.
    let clash = app
        .post(
            "/api/projects",
            &acme.api_key,
            &json!({"name": "x", "slug": "bot"}),
        )
        .await;
    assert_error(clash, StatusCode::CONFLICT).await;
    let derived = json_of(
        app.post("/api/projects", &acme.api_key, &json!({"name": "bot"}))
            .await,
        StatusCode::CREATED,
    )
    .await;
    let slug = derived["slug"].as_str().unwrap();
    assert!(slug.starts_with("bot-") && slug.len() == 10, "{slug}");
    // Another organization has slugs of its own.
    let theirs = json_of(
        app.post(
            "/api/projects",
            &globex.api_key,
            &json!({"name": "Bot", "slug": "bot"}),
        )
        .await,
        StatusCode::CREATED,
    )
    .await;
    assert_eq!(theirs["slug"], "bot");
}

#[actix_web::test]
async fn another_organizations_project_is_404_and_never_listed() {
    let app = spawn_app().await;
    let acme = app.create_org("Acme").await;
    let globex = app.create_org("Globex").await;
    let secret = app.create_project(&globex, "Secret").await;
    for token in [&acme.api_key, &acme.owner_token] {
        let response = app.get(&format!("/api/projects/{secret}"), token).await;
        assert_error(response, StatusCode::NOT_FOUND).await;
        let list = json_of(app.get("/api/projects", token).await, StatusCode::OK).await;
        assert_eq!(list, json!([]));
    }
    let missing = app
        .get(&format!("/api/projects/{}", uuid::Uuid::new_v4()), &acme.api_key)
        .await;
    assert_error(missing, StatusCode::NOT_FOUND).await;
}

#[actix_web::test]
async fn a_bad_project_id_is_422_on_the_path() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let issues = validation_issues(app.get("/api/projects/not-a-uuid", &org.api_key).await).await;
    assert_eq!(issues[0]["loc"], json!(["path", "project_id"]));
    assert_eq!(issues[0]["type"], "uuid_parsing");
}

#[actix_web::test]
async fn a_session_listing_with_an_organization_sees_only_that_one() {
    let app = spawn_app().await;
    let acme = app.create_org("Acme").await;
    let globex = app.create_org("Globex").await;
    app.put(
        &format!("/api/internal/orgs/{}/members/{}", globex.org_id, acme.owner_id),
        INTERNAL_KEY,
        &json!({"role": "member"}),
    )
    .await;
    app.create_project(&acme, "A").await;
    app.create_project(&globex, "G").await;
    let all = json_of(app.get("/api/projects", &acme.owner_token).await, StatusCode::OK).await;
    assert_eq!(all.as_array().unwrap().len(), 2);
    let only = app
        .request(Method::GET, "/api/projects", Some(&acme.owner_token))
        .header("X-Org-Id", &globex.org_id)
        .send()
        .await
        .unwrap();
    let only = json_of(only, StatusCode::OK).await;
    assert_eq!(only.as_array().unwrap().len(), 1);
    assert_eq!(only[0]["name"], "G");
}

#[actix_web::test]
async fn names_without_ascii_letters_get_unique_slugs_and_blank_names_are_refused() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let mut slugs = std::collections::HashSet::new();
    for name in ["中文", "中文", "%", "%", "  ~ ~  "] {
        let created = json_of(
            app.post("/api/projects", &org.api_key, &json!({"name": name}))
                .await,
            StatusCode::CREATED,
        )
        .await;
        assert_eq!(created["name"], name);
        let slug = created["slug"].as_str().unwrap().to_owned();
        assert!(regex_lite_slug(&slug), "{name:?} gave the slug {slug:?}");
        assert!(slugs.insert(slug), "every project has its own slug");
    }
    assert!(slugs.contains("zhong-wen"), "{slugs:?}");
    // An explicit slug that is taken is still a conflict.
    assert_error(
        app.post(
            "/api/projects",
            &org.api_key,
            &json!({"name": "x", "slug": "zhong-wen"}),
        )
        .await,
        StatusCode::CONFLICT,
    )
    .await;
    for blank in [" ", "\t\n", "   "] {
        let issues = validation_issues(
            app.post("/api/projects", &org.api_key, &json!({"name": blank}))
                .await,
        )
        .await;
        assert_eq!(issues[0]["loc"], json!(["body", "name"]), "{blank:?}");
    }
    let issues = validation_issues(
        app.post(
            "/api/internal/orgs",
            INTERNAL_KEY,
            &json!({"name": "  ", "ownerUserId": "ada"}),
        )
        .await,
    )
    .await;
    assert_eq!(issues[0]["loc"], json!(["body", "name"]));
}

/// The slug rule of docs/DECISIONS.md: `^[a-z0-9][a-z0-9._-]*$`, 1..100.
fn regex_lite_slug(slug: &str) -> bool {
    let mut bytes = slug.bytes();
    slug.len() <= 100
        && bytes
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'.' | b'_' | b'-'))
}
