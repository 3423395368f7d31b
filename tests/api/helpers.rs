//! `spawn_app()` and shared helpers. A fresh database per test: a SQLite file in a
//! temporary directory, or, when `KEEL_TEST_DATABASE_URL` names a PostgreSQL server, a
//! uniquely named database that is dropped when the test ends.

use std::sync::OnceLock;

use actix_web::dev::ServerHandle;
use keel::startup::Application;
use keel_core::auth::session::SessionKeys;
use keel_core::config::Settings;
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use sea_orm::{ConnectionTrait, Database};
use serde_json::{json, Value};

pub const INTERNAL_KEY: &str = "test-internal-key";
pub const ROTATED_INTERNAL_KEY: &str = "test-internal-key-next";
pub const SESSION_SECRET: &str = "test-session-secret";

pub struct TestDb {
    pub url: String,
    postgres: Option<(String, String)>,
    _dir: Option<tempfile::TempDir>,
}

/// A sample's value in a `/metrics` text: `name_and_labels` as the line starts.
pub fn metric(text: &str, name_and_labels: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name_and_labels)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name_and_labels} missing:\n{text}"))
}

/// Whether the suite runs on PostgreSQL (`KEEL_TEST_DATABASE_URL` names a server).
pub fn postgres() -> bool {
    std::env::var("KEEL_TEST_DATABASE_URL").is_ok_and(|url| url.starts_with("postgres"))
}

/// [`postgres`], and when not, a line on stderr saying that the calling test skipped (tests
/// that need PostgreSQL return at once on SQLite, never silently).
pub fn postgres_or_skip() -> bool {
    let on = postgres();
    if !on {
        say_skipped("needs PostgreSQL (KEEL_TEST_DATABASE_URL); .ci/run runs it there");
    }
    on
}

/// Says on stderr that the calling test skipped, and why. Written to the stream itself, not
/// through `eprintln!`, which the test harness captures and shows only for a failed test.
pub fn say_skipped(why: &str) {
    use std::io::Write;
    let name = std::thread::current().name().unwrap_or("a test").to_owned();
    let _ = writeln!(std::io::stderr(), "skipped: {name} {why}");
}

impl TestDb {
    pub async fn new() -> Self {
        match std::env::var("KEEL_TEST_DATABASE_URL") {
            Ok(admin_url) if admin_url.starts_with("postgres") => {
                let name = format!("keel_test_{}", uuid::Uuid::new_v4().simple());
                let admin = Database::connect(&admin_url)
                    .await
                    .expect("connect to PostgreSQL");
                admin
                    .execute_unprepared(&format!("CREATE DATABASE \"{name}\""))
                    .await
                    .expect("create test database");
                admin.close().await.ok();
                let (base, _) = admin_url.rsplit_once('/').expect("a database URL");
                Self {
                    url: format!("{base}/{name}"),
                    postgres: Some((admin_url.clone(), name)),
                    _dir: None,
                }
            }
            _ => {
                let dir = tempfile::tempdir().expect("temp dir");
                Self {
                    url: format!("sqlite://{}?mode=rwc", dir.path().join("keel.db").display()),
                    postgres: None,
                    _dir: Some(dir),
                }
            }
        }
    }
}

impl TestDb {
    /// The database of another test app (a second instance); dropped by its owner.
    pub fn reuse(url: &str) -> Self {
        Self {
            url: url.to_owned(),
            postgres: None,
            _dir: None,
        }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some((admin_url, name)) = self.postgres.take() {
            // Drop runs outside async; a small runtime of its own does the clean-up.
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                rt.block_on(async {
                    if let Ok(admin) = Database::connect(&admin_url).await {
                        let _ = admin
                            .execute_unprepared(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                            .await;
                        let _ = admin.close().await;
                    }
                });
                Ok::<(), std::io::Error>(())
            })
            .join();
        }
    }
}

pub struct TestApp {
    pub address: String,
    pub client: reqwest::Client,
    pub db_url: String,
    handle: ServerHandle,
    // Dropped last: the server stops before its database goes.
    _db: TestDb,
}

impl Drop for TestApp {
    fn drop(&mut self) {
        // Sends the stop command at once; the workers wind down on their own threads.
        drop(self.handle.stop(false));
    }
}

pub fn test_settings(db_url: &str) -> Settings {
    let mut settings = Settings::defaults().expect("defaults");
    settings.database.url = db_url.to_owned();
    settings.server.listen = "127.0.0.1:0".into();
    settings.server.workers = 2;
    settings.auth.internal_keys = vec![INTERNAL_KEY.into(), ROTATED_INTERNAL_KEY.into()];
    settings.auth.session_secret = SESSION_SECRET.into();
    settings
}

fn init_logs() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        if std::env::var("TEST_LOG").is_ok() {
            // Kept for the whole test run: the log writer lives as long as the process.
            std::mem::forget(keel::telemetry::init(
                &Settings::defaults().expect("defaults").telemetry,
            ));
        }
    });
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

pub async fn spawn_app_with(configure: impl FnOnce(&mut Settings)) -> TestApp {
    init_logs();
    let db = TestDb::new().await;
    let mut settings = test_settings(&db.url);
    configure(&mut settings);
    spawn_on(db, settings).await
}

/// Spawns an app on an existing database (e.g. one the CLI bootstrapped).
pub async fn spawn_on(db: TestDb, settings: Settings) -> TestApp {
    let app = Application::build(settings).await.expect("application builds");
    let address = format!("http://127.0.0.1:{}", app.port());
    let handle = app.handle();
    actix_web::rt::spawn(app.run_until_stopped());
    TestApp {
        address,
        client: reqwest::Client::new(),
        db_url: db.url.clone(),
        handle,
        _db: db,
    }
}

/// An organization with an owner (session), a member (session) and an API key.
#[allow(dead_code)]
pub struct TestOrg {
    pub org_id: String,
    pub slug: String,
    pub owner_id: String,
    pub owner_token: String,
    pub member_id: String,
    pub member_token: String,
    pub api_key: String,
    pub api_key_id: String,
}

impl TestOrg {
    /// The same organization, calling with another of its API keys.
    pub fn with_key(&self, key: &str) -> TestOrg {
        TestOrg {
            org_id: self.org_id.clone(),
            slug: self.slug.clone(),
            owner_id: self.owner_id.clone(),
            owner_token: self.owner_token.clone(),
            member_id: self.member_id.clone(),
            member_token: self.member_token.clone(),
            api_key: key.to_owned(),
            api_key_id: String::new(),
        }
    }
}

pub fn session_token(user_id: &str) -> String {
    SessionKeys::new(SESSION_SECRET)
        .expect("secret")
        .issue(user_id, 3600)
        .expect("token")
}

pub fn expired_session_token(user_id: &str) -> String {
    SessionKeys::new(SESSION_SECRET)
        .expect("secret")
        .issue(user_id, -60)
        .expect("token")
}

impl TestApp {
    /// Stops the server gracefully; background work then drains (as at SIGTERM).
    pub async fn stop(&self) {
        self.handle.stop(true).await;
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.address, path)
    }

    pub fn request(&self, method: Method, path: &str, token: Option<&str>) -> RequestBuilder {
        let builder = self.client.request(method, self.url(path));
        match token {
            Some(token) => builder.bearer_auth(token),
            None => builder,
        }
    }

    /// The service's /openapi.json.
    pub async fn openapi(&self) -> Value {
        self.request(Method::GET, "/openapi.json", None)
            .send()
            .await
            .expect("the document")
            .json()
            .await
            .expect("JSON")
    }

    pub async fn get(&self, path: &str, token: &str) -> Response {
        self.request(Method::GET, path, Some(token))
            .send()
            .await
            .expect("request")
    }

    pub async fn post(&self, path: &str, token: &str, body: &Value) -> Response {
        self.request(Method::POST, path, Some(token))
            .json(body)
            .send()
            .await
            .expect("request")
    }

    /// A POST that borrows nothing once built (for many requests in flight at once).
    pub fn post_later(
        &self,
        path: &str,
        token: &str,
        body: &Value,
    ) -> impl std::future::Future<Output = Response> + use<> {
        let request = self.request(Method::POST, path, Some(token)).json(body);
        async move { request.send().await.expect("request") }
    }

    pub async fn put(&self, path: &str, token: &str, body: &Value) -> Response {
        self.request(Method::PUT, path, Some(token))
            .json(body)
            .send()
            .await
            .expect("request")
    }

    pub async fn delete(&self, path: &str, token: &str) -> Response {
        self.request(Method::DELETE, path, Some(token))
            .send()
            .await
            .expect("request")
    }

    /// Deletes an organization through the operator route; it must answer 200.
    pub async fn delete_org(&self, org: &TestOrg) {
        let deleted = self
            .delete(&format!("/api/internal/orgs/{}", org.org_id), INTERNAL_KEY)
            .await;
        assert_eq!(deleted.status(), StatusCode::OK, "deleting {}", org.org_id);
    }

    /// Creates an organization through the operator routes, with an owner, a member and a key.
    pub async fn create_org(&self, name: &str) -> TestOrg {
        let suffix = uuid::Uuid::new_v4().simple().to_string();
        let owner_id = format!("owner-{suffix}");
        let member_id = format!("member-{suffix}");
        let created = json_of(
            self.post(
                "/api/internal/orgs",
                INTERNAL_KEY,
                &json!({ "name": name, "ownerUserId": owner_id, "ownerEmail": "owner@example.com" }),
            )
            .await,
            StatusCode::CREATED,
        )
        .await;
        let org_id = created["orgId"].as_str().expect("orgId").to_owned();
        let slug = created["slug"].as_str().expect("slug").to_owned();
        let member = self
            .put(
                &format!("/api/internal/orgs/{org_id}/members/{member_id}"),
                INTERNAL_KEY,
                &json!({ "role": "member" }),
            )
            .await;
        assert_eq!(member.status(), StatusCode::OK);
        let key = json_of(
            self.post(
                &format!("/api/internal/orgs/{org_id}/api-keys"),
                INTERNAL_KEY,
                &json!({"name": "ci"}),
            )
            .await,
            StatusCode::CREATED,
        )
        .await;
        TestOrg {
            org_id,
            slug,
            owner_token: session_token(&owner_id),
            owner_id,
            member_token: session_token(&member_id),
            member_id,
            api_key: key["key"].as_str().expect("key").to_owned(),
            api_key_id: key["apiKeyId"].as_str().expect("apiKeyId").to_owned(),
        }
    }

    /// Creates a project with the organization's API key; answers its id.
    pub async fn create_project(&self, org: &TestOrg, name: &str) -> String {
        let body = json_of(
            self.post("/api/projects", &org.api_key, &json!({ "name": name }))
                .await,
            StatusCode::CREATED,
        )
        .await;
        body["id"].as_str().expect("id").to_owned()
    }
}

/// Asserts the status and answers the JSON body.
pub async fn json_of(response: Response, expected: StatusCode) -> Value {
    let status = response.status();
    let text = response.text().await.expect("body");
    assert_eq!(status, expected, "unexpected status; body: {text}");
    serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}"))
}

/// Asserts a 422 and answers its `detail` items.
pub async fn validation_issues(response: Response) -> Vec<Value> {
    let body = json_of(response, StatusCode::UNPROCESSABLE_ENTITY).await;
    let detail = body["detail"].as_array().expect("detail is a list").clone();
    assert!(!detail.is_empty());
    for item in &detail {
        assert!(item["loc"].is_array(), "loc: {item}");
        assert!(item["msg"].is_string(), "msg: {item}");
        assert!(item["type"].is_string(), "type: {item}");
    }
    detail
}

/// Asserts an error status with a string `detail`.
pub async fn assert_error(response: Response, expected: StatusCode) -> String {
    let body = json_of(response, expected).await;
    body["detail"].as_str().expect("detail is a string").to_owned()
}

impl TestApp {
    /// The Prometheus text of `/metrics`.
    pub async fn metrics_text(&self) -> String {
        self.get("/metrics", INTERNAL_KEY)
            .await
            .text()
            .await
            .expect("the metrics' text")
    }

    /// Saves the card `payment_method` for the organization (with its API key).
    pub async fn save_card(&self, org: &TestOrg, payment_method: &str) -> Response {
        self.post(
            "/api/billing/payment-method",
            &org.api_key,
            &json!({"orgId": org.org_id, "paymentMethodId": payment_method}),
        )
        .await
    }

    /// Tops up `cents` from the saved card (with the organization's API key).
    pub async fn topup(&self, org: &TestOrg, cents: i64) -> Response {
        self.post(
            "/api/billing/topup",
            &org.api_key,
            &json!({"orgId": org.org_id, "amountCents": cents}),
        )
        .await
    }

    /// Saves the simulated good card and tops up `cents`.
    pub async fn fund(&self, org: &TestOrg, cents: i64) {
        assert_eq!(self.save_card(org, "pm_card_visa").await.status(), StatusCode::OK);
        json_of(self.topup(org, cents).await, StatusCode::OK).await;
    }

    pub async fn billing(&self, org: &TestOrg) -> Value {
        json_of(
            self.get(&format!("/api/billing?orgId={}", org.org_id), &org.api_key)
                .await,
            StatusCode::OK,
        )
        .await
    }

    pub async fn balance_microcents(&self, org: &TestOrg) -> i64 {
        self.billing(org).await["balanceMicrocents"]
            .as_i64()
            .expect("balance")
    }

    /// Checks balance = sum of the organization's ledger entries; answers (balance, entries).
    pub async fn assert_ledger_invariant(&self, org_id: &str) -> (i64, usize) {
        ledger_invariant(&self.db_url, org_id).await
    }
}

pub async fn ledger_invariant(db_url: &str, org_id: &str) -> (i64, usize) {
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    let db = Database::connect(db_url).await.expect("connect");
    let entries = entities::ledger_entry::Entity::find()
        .filter(entities::ledger_entry::Column::OrgId.eq(org_id))
        .all(&db)
        .await
        .expect("entries");
    let balance = entities::billing_account::Entity::find_by_id(
        keel_core::domain::OrgId::parse(org_id).expect("an org id"),
    )
    .one(&db)
    .await
    .expect("account")
    .map_or(0, |a| a.balance_microcents.get());
    db.close().await.ok();
    let sum: i64 = entries.iter().map(|e| e.amount_microcents.get()).sum();
    assert_eq!(balance, sum, "balance must equal the sum of ledger entries");
    // Each entry's running balance chains from the previous one.
    let mut running = 0;
    let mut sorted = entries.clone();
    sorted.sort_by_key(|e| e.id);
    for entry in &sorted {
        running += entry.amount_microcents.get();
        assert_eq!(
            entry.balance_after_microcents.get(),
            running,
            "entry {} balance_after",
            entry.id
        );
    }
    grants_invariant(db_url, org_id, &entries, false).await;
    (balance, entries.len())
}

/// [`ledger_invariant`], and no entry drew from a grant at or after its expiry (tests that
/// move a grant's expiry back by hand cannot ask this).
pub async fn ledger_invariant_in_time(db_url: &str, org_id: &str) {
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    ledger_invariant(db_url, org_id).await;
    let db = Database::connect(db_url).await.expect("connect");
    let entries = entities::ledger_entry::Entity::find()
        .filter(entities::ledger_entry::Column::OrgId.eq(org_id))
        .all(&db)
        .await
        .expect("entries");
    db.close().await.ok();
    grants_invariant(db_url, org_id, &entries, true).await;
}

/// Per grant: the draws the entries record come to what remains of it (for grants made by
/// a credit entry; migrated balances have none); an expired grant holds nothing; with
/// `in_time`, no entry drew from a grant at or after its expiry but its `expiry` entry.
async fn grants_invariant(
    db_url: &str,
    org_id: &str,
    entries: &[entities::ledger_entry::Model],
    in_time: bool,
) {
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    let db = Database::connect(db_url).await.expect("connect");
    let grants = entities::credit_grant::Entity::find()
        .filter(entities::credit_grant::Column::OrgId.eq(org_id))
        .all(&db)
        .await
        .expect("grants");
    db.close().await.ok();
    for grant in grants {
        let mut sum = 0;
        let mut credited = false;
        for entry in entries {
            let draws: Vec<Value> = entry
                .grants
                .as_deref()
                .map(|text| serde_json::from_str(text).expect("draws"))
                .unwrap_or_default();
            for draw in draws.iter().filter(|d| d["grantId"] == grant.id.as_str()) {
                let amount = draw["microcents"].as_i64().expect("microcents");
                sum += amount;
                credited |= amount > 0;
                if in_time && amount < 0 && entry.kind != keel_core::domain::EntryKind::Expiry {
                    assert!(
                        grant.expires_at.is_none_or(|at| entry.created_at < at),
                        "entry {} ({:?}) drew {amount} from grant {} at {} after its expiry {:?}",
                        entry.id,
                        entry.kind,
                        grant.id,
                        entry.created_at,
                        grant.expires_at
                    );
                }
            }
        }
        if credited {
            assert_eq!(
                sum,
                grant.remaining_microcents.get(),
                "grant {}: its draws and what remains",
                grant.id
            );
        }
        if grant.expired_at.is_some() {
            assert_eq!(grant.remaining_microcents.get(), 0, "expired grant {}", grant.id);
        }
    }
}

/// An organization (owned by `owner-<name>`) and an API key's secret, made with the
/// internal key over HTTP at `base`: for a `keel serve` process, where no [`TestApp`] is at
/// hand. Answers the organization's id and the key.
pub async fn org_with_key(http: &reqwest::Client, base: &str, name: &str) -> (String, String) {
    let internal = |path: String, body: Value| async move {
        http.post(format!("{base}{path}"))
            .bearer_auth(INTERNAL_KEY)
            .json(&body)
            .send()
            .await
            .unwrap()
            .json::<Value>()
            .await
            .unwrap()
    };
    let org = internal(
        "/api/internal/orgs".into(),
        json!({"name": name, "ownerUserId": format!("owner-{name}")}),
    )
    .await;
    let org_id = org["orgId"].as_str().unwrap().to_owned();
    let key = internal(
        format!("/api/internal/orgs/{org_id}/api-keys"),
        json!({"name": "ci"}),
    )
    .await;
    (org_id, key["key"].as_str().unwrap().to_owned())
}

/// Polls `check` until it holds (background effects such as auto top-up), up to 10 s.
pub async fn eventually<F, Fut>(mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    for _ in 0..200 {
        if check().await {
            return true;
        }
        actix_web::rt::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    false
}

/// A client that shows redirects instead of following them.
pub fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}
