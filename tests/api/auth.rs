use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::helpers::*;

#[actix_web::test]
async fn missing_or_unknown_credentials_are_401_everywhere() {
    let app = spawn_app().await;
    for path in ["/api/auth/verify", "/api/projects", "/metrics"] {
        let none = app.request(Method::GET, path, None).send().await.unwrap();
        assert_error(none, StatusCode::UNAUTHORIZED).await;
        for token in [
            "nonsense",
            "keel_sk_0123456789abcdefghijABCDEFGHIJ0123456789",
            &session_token("ghost-user"),
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ4In0.bad",
        ] {
            assert_error(app.get(path, token).await, StatusCode::UNAUTHORIZED).await;
        }
    }
    // A malformed Authorization header is no credential either.
    let basic = app
        .request(Method::GET, "/api/auth/verify", None)
        .header("Authorization", "Basic Zm9vOmJhcg==")
        .send()
        .await
        .unwrap();
    assert_error(basic, StatusCode::UNAUTHORIZED).await;
}

#[actix_web::test]
async fn user_credentials_on_internal_routes_are_403() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    for token in [&org.api_key, &org.owner_token] {
        let create = app
            .post(
                "/api/internal/orgs",
                token,
                &json!({"name": "x", "ownerUserId": "u"}),
            )
            .await;
        assert_error(create, StatusCode::FORBIDDEN).await;
        assert_error(app.get("/metrics", token).await, StatusCode::FORBIDDEN).await;
    }
}

#[actix_web::test]
async fn the_internal_key_cannot_act_as_a_user() {
    let app = spawn_app().await;
    assert_error(
        app.get("/api/projects", INTERNAL_KEY).await,
        StatusCode::FORBIDDEN,
    )
    .await;
}

#[actix_web::test]
async fn verify_describes_each_kind_of_credential() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;

    let key = json_of(app.get("/api/auth/verify", &org.api_key).await, StatusCode::OK).await;
    assert_eq!(key["valid"], true);
    assert_eq!(key["kind"], "api_key");
    assert_eq!(key["orgId"], org.org_id.as_str());
    assert_eq!(key["apiKeyId"], org.api_key_id.as_str());
    assert_eq!(key["orgs"][&org.org_id], "member");

    let session = json_of(
        app.get("/api/auth/verify", &org.owner_token).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(session["kind"], "session");
    assert_eq!(session["userId"], org.owner_id.as_str());
    assert_eq!(session["orgs"][&org.org_id], "owner");

    for internal in [INTERNAL_KEY, ROTATED_INTERNAL_KEY] {
        let body = json_of(app.get("/api/auth/verify", internal).await, StatusCode::OK).await;
        assert_eq!(body["kind"], "internal");
        assert_eq!(body["valid"], true);
    }
}

#[actix_web::test]
async fn revoked_keys_and_expired_sessions_are_401() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    assert_eq!(
        app.get("/api/auth/verify", &org.api_key).await.status(),
        StatusCode::OK
    );
    let revoked = app
        .delete(
            &format!("/api/internal/api-keys/{}", org.api_key_id),
            INTERNAL_KEY,
        )
        .await;
    assert_eq!(json_of(revoked, StatusCode::OK).await, json!({"revoked": true}));
    assert_error(
        app.get("/api/auth/verify", &org.api_key).await,
        StatusCode::UNAUTHORIZED,
    )
    .await;
    assert_error(
        app.get("/api/projects", &org.api_key).await,
        StatusCode::UNAUTHORIZED,
    )
    .await;

    let expired = expired_session_token(&org.owner_id);
    assert_error(
        app.get("/api/auth/verify", &expired).await,
        StatusCode::UNAUTHORIZED,
    )
    .await;
    assert_error(app.get("/api/projects", &expired).await, StatusCode::UNAUTHORIZED).await;
}

#[actix_web::test]
async fn sessions_are_rejected_when_no_secret_is_configured() {
    let app = spawn_app_with(|s| s.auth.session_secret = String::new()).await;
    let org = app.create_org("Acme").await;
    assert_error(
        app.get("/api/auth/verify", &org.owner_token).await,
        StatusCode::UNAUTHORIZED,
    )
    .await;
    assert_eq!(
        app.get("/api/auth/verify", &org.api_key).await.status(),
        StatusCode::OK
    );
}

#[actix_web::test]
async fn internal_routes_answer_401_when_no_internal_key_is_configured() {
    let app = spawn_app_with(|s| s.auth.internal_keys.clear()).await;
    let response = app
        .post(
            "/api/internal/orgs",
            INTERNAL_KEY,
            &json!({"name": "x", "ownerUserId": "u"}),
        )
        .await;
    assert_error(response, StatusCode::UNAUTHORIZED).await;
}

#[actix_web::test]
async fn a_non_member_session_is_403() {
    let app = spawn_app().await;
    let acme = app.create_org("Acme").await;
    let globex = app.create_org("Globex").await;
    let body = json!({"orgId": globex.org_id, "name": "sneaky"});
    assert_error(
        app.post("/api/projects", &acme.owner_token, &body).await,
        StatusCode::FORBIDDEN,
    )
    .await;
    let query = app
        .get(
            &format!("/api/projects?orgId={}", globex.org_id),
            &acme.member_token,
        )
        .await;
    assert_error(query, StatusCode::FORBIDDEN).await;
    let header = app
        .request(Method::GET, "/api/projects", Some(&acme.member_token))
        .header("X-Org-Id", &globex.org_id)
        .send()
        .await
        .unwrap();
    assert_error(header, StatusCode::FORBIDDEN).await;
}

#[actix_web::test]
async fn an_api_key_naming_another_organization_is_403() {
    let app = spawn_app().await;
    let acme = app.create_org("Acme").await;
    let globex = app.create_org("Globex").await;
    let body = json!({"orgId": globex.org_id, "name": "p"});
    assert_error(
        app.post("/api/projects", &acme.api_key, &body).await,
        StatusCode::FORBIDDEN,
    )
    .await;
    let query = app
        .get(&format!("/api/projects?orgId={}", globex.org_id), &acme.api_key)
        .await;
    assert_error(query, StatusCode::FORBIDDEN).await;
    let header = app
        .request(Method::GET, "/api/projects", Some(&acme.api_key))
        .header("X-Org-Id", &globex.org_id)
        .send()
        .await
        .unwrap();
    assert_error(header, StatusCode::FORBIDDEN).await;
    // Naming its own organization is fine.
    let own = app
        .get(&format!("/api/projects?orgId={}", acme.org_id), &acme.api_key)
        .await;
    assert_eq!(own.status(), StatusCode::OK);
}

#[actix_web::test]
async fn a_session_in_several_organizations_must_name_one() {
    let app = spawn_app().await;
    let acme = app.create_org("Acme").await;
    let globex = app.create_org("Globex").await;
    let joined = app
        .put(
            &format!("/api/internal/orgs/{}/members/{}", globex.org_id, acme.owner_id),
            INTERNAL_KEY,
            &json!({"role": "member"}),
        )
        .await;
    assert_eq!(joined.status(), StatusCode::OK);
    let ambiguous = app
        .post("/api/projects", &acme.owner_token, &json!({"name": "p"}))
        .await;
    let issues = validation_issues(ambiguous).await;
    assert_eq!(issues[0]["loc"], json!(["query", "orgId"]));
    let named = app
        .request(Method::POST, "/api/projects", Some(&acme.owner_token))
        .header("X-Org-Id", &globex.org_id)
        .json(&json!({"name": "p"}))
        .send()
        .await
        .unwrap();
    let created = json_of(named, StatusCode::CREATED).await;
    assert_eq!(created["orgId"], globex.org_id.as_str());
}

#[actix_web::test]
async fn owner_gated_routes_need_an_owner_session() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    // A member's session and an API key are refused.
    assert_error(
        app.post("/api/api-keys", &org.member_token, &json!({})).await,
        StatusCode::FORBIDDEN,
    )
    .await;
    assert_error(
        app.post("/api/api-keys", &org.api_key, &json!({})).await,
        StatusCode::FORBIDDEN,
    )
    .await;
    // The owner creates a key that works, and revokes it.
    let created = json_of(
        app.post("/api/api-keys", &org.owner_token, &json!({"name": "laptop"}))
            .await,
        StatusCode::CREATED,
    )
    .await;
    let key = created["key"].as_str().unwrap();
    assert!(key.starts_with("keel_sk_") && key.len() >= 40);
    assert_eq!(app.get("/api/auth/verify", key).await.status(), StatusCode::OK);
    let listed = json_of(app.get("/api/api-keys", &org.member_token).await, StatusCode::OK).await;
    let keys = listed["keys"].as_array().unwrap();
    assert_eq!(keys.len(), 2);
    assert!(
        !listed.to_string().contains(key),
        "a listing never shows a secret"
    );
    let path = format!("/api/api-keys/{}", created["apiKeyId"].as_str().unwrap());
    assert_error(app.delete(&path, &org.member_token).await, StatusCode::FORBIDDEN).await;
    assert_eq!(app.delete(&path, &org.owner_token).await.status(), StatusCode::OK);
    assert_error(app.get("/api/auth/verify", key).await, StatusCode::UNAUTHORIZED).await;
    // Revoking again is harmless and keeps the time it was revoked.
    let revoked_at = |listed: Value| {
        listed["keys"]
            .as_array()
            .unwrap()
            .iter()
            .find(|k| k["apiKeyId"] == created["apiKeyId"])
            .unwrap()["revokedAt"]
            .clone()
    };
    let first = revoked_at(json_of(app.get("/api/api-keys", &org.owner_token).await, StatusCode::OK).await);
    assert!(first.is_string(), "{first}");
    assert_eq!(app.delete(&path, &org.owner_token).await.status(), StatusCode::OK);
    let again = revoked_at(json_of(app.get("/api/api-keys", &org.owner_token).await, StatusCode::OK).await);
    assert_eq!(again, first);
}

#[actix_web::test]
async fn an_owner_cannot_revoke_another_organizations_key() {
    let app = spawn_app().await;
    let acme = app.create_org("Acme").await;
    let globex = app.create_org("Globex").await;
    let path = format!("/api/api-keys/{}", globex.api_key_id);
    assert_error(app.delete(&path, &acme.owner_token).await, StatusCode::NOT_FOUND).await;
    assert_eq!(
        app.get("/api/auth/verify", &globex.api_key).await.status(),
        StatusCode::OK
    );
}

/// A session token with exactly these claims, signed with the test secret.
fn token_with(claims: serde_json::Value) -> String {
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(SESSION_SECRET.as_bytes()),
    )
    .unwrap()
}

#[actix_web::test]
async fn a_session_needs_only_sub_and_exp_and_is_not_valid_before_nbf_or_iat() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let now = chrono::Utc::now().timestamp();
    let exp = now + 600;
    let app = &app;
    let verify = |claims| {
        let token = token_with(claims);
        async move { app.get("/api/auth/verify", &token).await.status() }
    };
    let sub = org.owner_id.as_str();
    assert_eq!(verify(json!({"sub": sub, "exp": exp})).await, StatusCode::OK);
    for early in [
        json!({"sub": sub, "exp": exp, "nbf": now + 500}),
        json!({"sub": sub, "exp": exp, "iat": now + 500}),
    ] {
        assert_eq!(verify(early).await, StatusCode::UNAUTHORIZED);
    }
    // Another clock a little ahead of ours is tolerated (30 s).
    assert_eq!(
        verify(json!({"sub": sub, "exp": exp, "nbf": now + 10, "iat": now + 10})).await,
        StatusCode::OK
    );
    assert_eq!(verify(json!({"sub": sub})).await, StatusCode::UNAUTHORIZED);
}

#[actix_web::test]
async fn a_foreign_org_id_is_403_even_in_a_body_that_has_no_such_field() {
    let app = spawn_app().await;
    let acme = app.create_org("Acme").await;
    let globex = app.create_org("Globex").await;
    app.fund(&acme, 1_000).await;
    let before = app.balance_microcents(&acme).await;
    let usage = json!({"runId": "run-1", "estimateCents": 1, "orgId": globex.org_id});
    assert_error(
        app.post("/api/billing/training-usage", &acme.api_key, &usage)
            .await,
        StatusCode::FORBIDDEN,
    )
    .await;
    // Repeated, or spelled snake_case: every supplied value counts.
    let repeated = format!(
        r#"{{"runId": "run-1", "estimateCents": 1, "orgId": "{}", "orgId": "{}"}}"#,
        acme.org_id, globex.org_id
    );
    let response = app
        .request(Method::POST, "/api/billing/training-usage", Some(&acme.api_key))
        .header("content-type", "application/json")
        .body(repeated)
        .send()
        .await
        .unwrap();
    assert_error(response, StatusCode::FORBIDDEN).await;
    let snake = json!({"runId": "run-1", "estimateCents": 1, "org_id": globex.org_id});
    assert_error(
        app.post("/api/billing/training-usage", &acme.api_key, &snake)
            .await,
        StatusCode::FORBIDDEN,
    )
    .await;
    // In the query or the header of a route that reads neither.
    let query = app
        .post(
            &format!("/api/billing/training-usage?orgId={}", globex.org_id),
            &acme.api_key,
            &json!({"runId": "run-1", "estimateCents": 1}),
        )
        .await;
    assert_error(query, StatusCode::FORBIDDEN).await;
    let header = app
        .request(Method::POST, "/api/billing/training-usage", Some(&acme.api_key))
        .header("X-Org-Id", &globex.org_id)
        .json(&json!({"runId": "run-1", "estimateCents": 1}))
        .send()
        .await
        .unwrap();
    assert_error(header, StatusCode::FORBIDDEN).await;
    assert_eq!(app.balance_microcents(&acme).await, before, "nothing was charged");

    let project = app.create_project(&acme, "Support").await;
    let run = json!({"projectId": project, "orgId": globex.org_id});
    assert_error(
        app.post("/api/runs", &acme.api_key, &run).await,
        StatusCode::FORBIDDEN,
    )
    .await;
    // The key's own organization, in any spelling, is fine.
    let own = json!({"runId": "run-2", "estimateCents": 1, "orgId": acme.org_id.to_uppercase()});
    assert_eq!(
        app.post("/api/billing/training-usage", &acme.api_key, &own)
            .await
            .status(),
        StatusCode::OK
    );
}

#[actix_web::test]
async fn authorization_is_decided_before_the_body_is_read() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let bad = json!({"bogus": 1});
    for token in [&org.api_key, &org.owner_token] {
        for (method, path) in [
            (Method::PUT, "/api/internal/adapters/acme/bot"),
            (Method::POST, "/api/internal/orgs"),
            (Method::POST, "/api/billing/serving-usage"),
            (Method::POST, "/api/training/internal/jobs/claim"),
        ] {
            let response = app
                .request(method.clone(), path, Some(token))
                .json(&bad)
                .send()
                .await
                .unwrap();
            assert_error(response, StatusCode::FORBIDDEN).await;
        }
    }
    // An unknown key with a bad body is 401, on user and internal routes alike.
    for path in ["/api/projects", "/api/internal/orgs"] {
        let unknown = app
            .post(path, "keel_sk_0123456789abcdefghijABCDEFGHIJ0123456789", &bad)
            .await;
        assert_error(unknown, StatusCode::UNAUTHORIZED).await;
    }
    // The internal key on a user route is 403 whatever the body.
    assert_error(
        app.post("/api/projects", INTERNAL_KEY, &bad).await,
        StatusCode::FORBIDDEN,
    )
    .await;
    // With the right credential, the body is judged.
    validation_issues(
        app.put("/api/internal/adapters/acme/bot", INTERNAL_KEY, &bad)
            .await,
    )
    .await;
}
