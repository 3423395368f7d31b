//! The `keel` binary: bootstrap prints credentials that the service accepts.

use std::process::Command;

use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::*;

#[actix_web::test]
async fn bootstrap_prints_an_api_key_and_session_that_verify() {
    let db = TestDb::new().await;
    let output = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args([
            "admin",
            "bootstrap",
            "--org",
            "Acme Robotics",
            "--owner",
            "ada",
            "--email",
            "ada@example.com",
        ])
        .env("KEEL_DATABASE_URL", &db.url)
        .env("KEEL_SESSION_SECRET", SESSION_SECRET)
        .env(
            "KEEL_CONFIG_DIR",
            env!("CARGO_MANIFEST_DIR").to_owned() + "/config",
        )
        .output()
        .expect("keel runs");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let printed: Value = serde_json::from_slice(&output.stdout).expect("JSON on stdout");
    assert_eq!(printed["userId"], "ada");
    assert_eq!(printed["slug"], "acme-robotics");
    let settings = test_settings(&db.url);
    let app = spawn_on(db, settings).await;

    let by_key = json_of(
        app.get("/api/auth/verify", printed["apiKey"].as_str().unwrap())
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(by_key["orgId"], printed["orgId"]);
    let by_session = json_of(
        app.get("/api/auth/verify", printed["sessionToken"].as_str().unwrap())
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(by_session["orgs"][printed["orgId"].as_str().unwrap()], "owner");
}

#[test]
fn invalid_configuration_stops_with_one_clear_line() {
    let output = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["migrate", "status"])
        .env("KEEL_SERVING_URL", "not a url")
        .env(
            "KEEL_CONFIG_DIR",
            env!("CARGO_MANIFEST_DIR").to_owned() + "/config",
        )
        .output()
        .expect("keel runs");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("serving.url"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn migrate_status_lists_the_migrations() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("k.db").display());
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_keel"))
            .args(args)
            .env("KEEL_DATABASE_URL", &url)
            .env(
                "KEEL_CONFIG_DIR",
                env!("CARGO_MANIFEST_DIR").to_owned() + "/config",
            )
            .output()
            .expect("keel runs")
    };
    assert!(run(&["migrate", "up"]).status.success());
    let status = run(&["migrate", "status"]);
    let stdout = String::from_utf8_lossy(&status.stdout);
    assert!(
        stdout.contains("m20261121_000001_foundation\tApplied"),
        "{stdout}"
    );
}
