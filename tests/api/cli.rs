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
fn a_sqlite_checkpoint_of_zero_pages_is_refused_by_name() {
    let output = keel(
        &["migrate", "status"],
        &[("KEEL__DATABASE__SQLITE_WAL_AUTOCHECKPOINT_PAGES", "0")],
    );
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("database.sqlite_wal_autocheckpoint_pages") && stderr.contains("must be positive"),
        "{stderr}"
    );
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

fn keel(args: &[&str], envs: &[(&str, &str)]) -> std::process::Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command.args(args).env(
        "KEEL_CONFIG_DIR",
        env!("CARGO_MANIFEST_DIR").to_owned() + "/config",
    );
    for (name, value) in envs {
        command.env(name, value);
    }
    command.output().expect("keel runs")
}

#[test]
fn bootstrap_of_a_name_already_taken_says_so_unless_asked_for_another() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("k.db").display());
    let bootstrap = |extra: &[&str]| {
        let mut args = vec!["admin", "bootstrap", "--org", "Acme", "--owner", "ada"];
        args.extend_from_slice(extra);
        keel(&args, &[("KEEL_DATABASE_URL", &url)])
    };
    assert!(bootstrap(&[]).status.success());
    let again = bootstrap(&[]);
    assert!(!again.status.success());
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(
        stderr.contains("already exists") && stderr.contains("--another"),
        "{stderr}"
    );
    assert!(again.stdout.is_empty(), "no credentials printed");
    let another = bootstrap(&["--another"]);
    assert!(
        another.status.success(),
        "{}",
        String::from_utf8_lossy(&another.stderr)
    );
}

#[test]
fn an_unreachable_postgres_fails_start_up_at_once_naming_host_and_port() {
    // A port nothing listens on (bound, then released).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .unwrap()
        .port();
    let started = std::time::Instant::now();
    let output = keel(
        &["migrate", "status"],
        &[(
            "KEEL_DATABASE_URL",
            &format!("postgres://postgres:hunter2@127.0.0.1:{port}/keel"),
        )],
    );
    assert!(!output.status.success());
    assert!(started.elapsed() < std::time::Duration::from_secs(15));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(&format!("127.0.0.1:{port}")), "{stderr}");
    assert!(!stderr.contains("hunter2"), "no password: {stderr}");
}

#[actix_web::test]
async fn a_missing_postgres_database_is_named() {
    let Ok(admin) = std::env::var("KEEL_TEST_DATABASE_URL") else {
        return;
    };
    if !admin.starts_with("postgres") {
        return;
    }
    let (base, _) = admin.rsplit_once('/').unwrap();
    let output = keel(
        &["migrate", "status"],
        &[("KEEL_DATABASE_URL", &format!("{base}/keel_no_such_database"))],
    );
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("keel_no_such_database"), "{stderr}");
}

#[test]
fn serve_help_lists_the_settings_and_their_variables() {
    let output = keel(&["serve", "--help"], &[]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    for var in [
        "KEEL_LISTEN",
        "KEEL_DATABASE_URL",
        "KEEL_INTERNAL_KEYS",
        "KEEL_SESSION_SECRET",
        "KEEL_PAYMENTS",
    ] {
        assert!(stdout.contains(var), "{var}: {stdout}");
    }
}

#[test]
fn start_up_warns_of_missing_keys_and_misspelled_settings() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("k.db").display());
    // A listen address that is taken makes `serve` stop right after its warnings.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let output = keel(
        &["serve"],
        &[
            ("KEEL_DATABASE_URL", &url),
            ("KEEL_LISTEN", &format!("localhost:{port}")),
            ("KEEL__SERVER__LISEN", "1"),
            ("KEEL_PROFILE", "no-such-profile"),
        ],
    );
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    for expected in [
        "KEEL_INTERNAL_KEYS",
        "KEEL_SESSION_SECRET",
        "KEEL__SERVER__LISEN names no known setting",
        "KEEL_PROFILE=no-such-profile names no file",
        &format!("127.0.0.1:{port}"),
    ] {
        assert!(stderr.contains(expected), "{expected}: {stderr}");
    }
}

/// `keel serve` raises its open-files soft limit to the hard one: a proxied stream holds two
/// descriptors, and a soft limit of 1,024 (systemd's default) would refuse connections past
/// about 500 open streams.
#[test]
fn serve_raises_its_open_files_soft_limit_to_the_hard_one() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("k.db").display());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // prlimit sets the limits, then becomes keel (same process).
    let mut child = Command::new("prlimit")
        .args(["--nofile=256:4096", env!("CARGO_BIN_EXE_keel"), "serve"])
        .env("KEEL_DATABASE_URL", &url)
        .env("KEEL_LISTEN", port.to_string())
        .env("KEEL_INTERNAL_KEYS", INTERNAL_KEY)
        .env("RUST_LOG", "warn")
        .env(
            "KEEL_CONFIG_DIR",
            env!("CARGO_MANIFEST_DIR").to_owned() + "/config",
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("prlimit (util-linux) runs keel");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let healthy = loop {
        let answer = std::net::TcpStream::connect(("127.0.0.1", port)).and_then(|mut stream| {
            stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: keel\r\nConnection: close\r\n\r\n")?;
            let mut head = String::new();
            stream.read_to_string(&mut head)?;
            Ok(head)
        });
        match answer {
            Ok(head) if head.starts_with("HTTP/1.1 200") => break true,
            _ if std::time::Instant::now() > deadline => break false,
            _ => std::thread::sleep(std::time::Duration::from_millis(50)),
        }
    };
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", child.id())).unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(healthy, "keel serves");
    let open_files: Vec<&str> = limits
        .lines()
        .find(|line| line.starts_with("Max open files"))
        .unwrap()
        .split_whitespace()
        .skip(3)
        .take(2)
        .collect();
    assert_eq!(open_files, ["4096", "4096"], "soft and hard limits: {limits}");
}

#[actix_web::test]
async fn a_fresh_sqlite_database_migrates_with_a_pool_of_several_connections_and_a_half_migrated_one_starts()
{
    use migration::MigratorTrait;
    use sea_orm::ConnectionTrait;
    // Fresh, with four connections in the pool: the migrations run on one of their own.
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("fresh.db").display());
    let migrated = keel(
        &["migrate", "up"],
        &[
            ("KEEL_DATABASE_URL", &url),
            ("KEEL__DATABASE__MAX_CONNECTIONS", "4"),
        ],
    );
    assert!(
        migrated.status.success(),
        "{}",
        String::from_utf8_lossy(&migrated.stderr)
    );

    // Left half-migrated by a keel that migrated over several connections: the claim index
    // dropped, its migration not recorded. `keel serve` migrates it and serves.
    let url = format!("sqlite://{}?mode=rwc", dir.path().join("half.db").display());
    let db = sea_orm::Database::connect(&url).await.unwrap();
    migration::Migrator::up(&db, Some(5)).await.unwrap();
    db.execute_unprepared("DROP INDEX idx_training_jobs_claim")
        .await
        .unwrap();
    db.close().await.unwrap();
    let keel = crate::chaos::Instance::started(&url, &[("KEEL__DATABASE__MAX_CONNECTIONS", "4")]).await;
    let health = reqwest::get(keel.url("/healthz")).await.unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    let status = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["migrate", "status"])
        .env("KEEL_DATABASE_URL", &url)
        .env(
            "KEEL_CONFIG_DIR",
            env!("CARGO_MANIFEST_DIR").to_owned() + "/config",
        )
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&status.stdout);
    assert!(!listed.contains("Pending"), "{listed}");
}
