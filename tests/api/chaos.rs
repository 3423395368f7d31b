//! Process-level chaos on PostgreSQL: `keel serve` processes (the built binary) on one
//! database, started together, killed with SIGKILL, frozen with SIGSTOP, crashed between a
//! card charge and its credit, and stopped with SIGTERM under kept-alive clients. Money and
//! jobs must come out exact. Skipped on SQLite (one instance), except the shutdown test.

use std::collections::{HashMap, HashSet};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::*;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// One `keel serve` process.
/// In an instance's environment: where its log (stderr) goes.
const LOG_FILE: &str = "KEEL_TEST_LOG_FILE";

/// The last `lines` lines of a log file, for a failure's message.
fn log_tail(path: &std::path::Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

pub(crate) struct Instance {
    child: Child,
    pub(crate) base: String,
    db_url: String,
    port: u16,
    envs: Vec<(String, String)>,
}

impl Instance {
    /// Starts the process (not waiting for it to serve).
    pub(crate) fn start(db_url: &str, envs: &[(&str, &str)]) -> Self {
        let port = free_port();
        let envs: Vec<(String, String)> = envs.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect();
        let child = spawn(db_url, port, &envs);
        Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
            db_url: db_url.to_owned(),
            port,
            envs,
        }
    }

    pub(crate) async fn started(db_url: &str, envs: &[(&str, &str)]) -> Self {
        let instance = Self::start(db_url, envs);
        instance.ready().await;
        instance
    }

    pub(crate) async fn ready(&self) {
        let client = reqwest::Client::new();
        for _ in 0..600 {
            if let Ok(r) = client.get(self.url("/healthz")).send().await {
                if r.status() == StatusCode::OK {
                    return;
                }
            }
            actix_web::rt::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("keel on port {} did not become ready", self.port);
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    pub(crate) fn signal(&self, signal: &str) {
        let sent = Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success());
    }

    pub(crate) fn kill9(&mut self) {
        self.signal("-KILL");
        let _ = self.child.wait();
    }

    /// The same process again (same port and settings), after a crash; `envs` replace.
    pub(crate) async fn restart(&mut self, envs: &[(&str, &str)]) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for (k, v) in envs {
            self.envs.retain(|(name, _)| name != k);
            self.envs.push(((*k).into(), (*v).into()));
        }
        self.child = spawn(&self.db_url, self.port, &self.envs);
        self.ready().await;
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        let _ = self.signal_quietly();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Instance {
    fn signal_quietly(&self) -> std::io::Result<std::process::ExitStatus> {
        Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .status()
    }
}

fn spawn(db_url: &str, port: u16, envs: &[(String, String)]) -> Child {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .arg("serve")
        .env("KEEL_DATABASE_URL", db_url)
        .env("KEEL_LISTEN", port.to_string())
        .env("KEEL_INTERNAL_KEYS", INTERNAL_KEY)
        .env("KEEL_SESSION_SECRET", SESSION_SECRET)
        .env("KEEL__SERVER__WORKERS", "2")
        .env("KEEL__SERVER__SHUTDOWN_GRACE_SECS", "1")
        .env(
            "RUST_LOG",
            std::env::var("KEEL_CHAOS_LOG_LEVEL").unwrap_or_else(|_| "warn".into()),
        )
        .env(
            "KEEL_CONFIG_DIR",
            env!("CARGO_MANIFEST_DIR").to_owned() + "/config",
        )
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(match envs.iter().find(|(k, _)| k == LOG_FILE) {
            // A test that reads keel's log when it fails.
            Some((_, path)) => Stdio::from(std::fs::File::create(path).expect("a log file")),
            None if std::env::var("KEEL_CHAOS_LOGS").is_ok() => Stdio::inherit(),
            None => Stdio::null(),
        });
    for (k, v) in envs {
        command.env(k, v);
    }
    command.spawn().expect("keel starts")
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(3))
        .build()
        .expect("a client")
}

/// An organization with a saved card and funds, made through `instance`.
async fn funded_org(instance: &Instance, name: &str, cents: i64) -> (String, String) {
    let http = client();
    let (org_id, key) = org_with_key(&http, &instance.base, name).await;
    let saved = http
        .post(instance.url("/api/billing/payment-method"))
        .bearer_auth(&key)
        .json(&json!({"orgId": org_id, "paymentMethodId": "pm_card_visa"}))
        .send()
        .await
        .unwrap();
    assert_eq!(saved.status(), StatusCode::OK);
    let mut left = cents;
    while left > 0 {
        let amount = left.min(1_000_000);
        let topped = http
            .post(instance.url("/api/billing/topup"))
            .bearer_auth(&key)
            .json(&json!({"orgId": org_id, "amountCents": amount}))
            .send()
            .await
            .unwrap();
        assert_eq!(topped.status(), StatusCode::OK);
        left -= amount;
    }
    (org_id, key)
}

/// The account's balance alone (read while the ledger may be writing).
async fn balance_of(db_url: &str, org_id: &str) -> i64 {
    use sea_orm::EntityTrait;
    let db = sea_orm::Database::connect(db_url).await.unwrap();
    let account =
        entities::billing_account::Entity::find_by_id(keel_core::domain::OrgId::parse(org_id).unwrap())
            .one(&db)
            .await
            .unwrap();
    db.close().await.ok();
    account.map_or(0, |a| a.balance_microcents.get())
}

/// Ledger entries of an organization by idempotency key (every key must appear once).
async fn entries_by_key(db_url: &str, org_id: &str) -> HashMap<String, usize> {
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    let db = sea_orm::Database::connect(db_url).await.unwrap();
    let entries = entities::ledger_entry::Entity::find()
        .filter(entities::ledger_entry::Column::OrgId.eq(org_id))
        .all(&db)
        .await
        .unwrap();
    db.close().await.ok();
    let mut keys = HashMap::new();
    for entry in entries {
        if let Some(key) = entry.idempotency_key {
            *keys.entry(key).or_insert(0) += 1;
        }
    }
    keys
}

/// Debits the run fee of `run` (idempotent per run), through `base`, until an instance
/// answers; answers the status and which instance answered.
async fn debit_until_answered(
    http: &reqwest::Client,
    bases: &[String],
    key: &str,
    org_id: &str,
    run: &str,
) -> StatusCode {
    for attempt in 0..200 {
        let base = &bases[attempt % bases.len()];
        let sent = http
            .post(format!("{base}/api/billing/debit"))
            .bearer_auth(key)
            .json(&json!({"orgId": org_id, "runId": run}))
            .send()
            .await;
        match sent {
            Ok(r) if r.status() == StatusCode::OK || r.status() == StatusCode::PAYMENT_REQUIRED => {
                return r.status();
            }
            _ => actix_web::rt::time::sleep(Duration::from_millis(20)).await,
        }
    }
    panic!("run {run} was never answered");
}

#[actix_web::test]
async fn instances_started_together_on_a_fresh_database_all_serve() {
    if !postgres_or_skip() {
        return;
    }
    let db = TestDb::new().await;
    let instances: Vec<Instance> = (0..3).map(|_| Instance::start(&db.url, &[])).collect();
    for instance in &instances {
        instance.ready().await;
    }
    // They serve one schema: an organization made on one is seen by the others.
    let (org_id, key) = funded_org(&instances[0], "together", 100).await;
    for instance in &instances[1..] {
        let billing = client()
            .get(instance.url(&format!("/api/billing?orgId={org_id}")))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap();
        assert_eq!(billing.status(), StatusCode::OK);
    }
}

#[actix_web::test]
async fn kill_9_under_concurrent_charges_with_replays_loses_and_duplicates_nothing() {
    if !postgres_or_skip() {
        return;
    }
    let db = TestDb::new().await;
    let mut first = Instance::started(&db.url, &[]).await;
    let second = Instance::started(&db.url, &[]).await;
    let (org_id, key) = funded_org(&first, "charged", 1_000_000).await;
    let bases = vec![first.base.clone(), second.base.clone()];
    let acknowledged = Arc::new(Mutex::new(HashSet::new()));
    let http = client();

    // 16 clients, each charging new runs and replaying its previous one, on both instances.
    let clients = (0..16).map(|c| {
        let (http, bases, key, org_id, acknowledged) = (
            http.clone(),
            bases.clone(),
            key.clone(),
            org_id.clone(),
            acknowledged.clone(),
        );
        async move {
            for i in 0..60 {
                let run = format!("c{c}-r{i}");
                let status = debit_until_answered(&http, &bases, &key, &org_id, &run).await;
                assert_eq!(status, StatusCode::OK);
                acknowledged.lock().unwrap().insert(run);
                if i > 0 {
                    let replay = format!("c{c}-r{}", i - 1);
                    debit_until_answered(&http, &bases, &key, &org_id, &replay).await;
                }
            }
        }
    });
    let killer = async {
        actix_web::rt::time::sleep(Duration::from_millis(700)).await;
        first.kill9();
    };
    tokio::join!(join_all(clients), killer);

    let acknowledged = acknowledged.lock().unwrap().clone();
    assert_eq!(acknowledged.len(), 16 * 60);
    let keys = entries_by_key(&db.url, &org_id).await;
    for run in &acknowledged {
        assert_eq!(
            keys.get(&format!("run-fee:{run}")),
            Some(&1),
            "run {run} charged exactly once"
        );
    }
    assert!(keys.values().all(|n| *n == 1), "no key twice");
    let (balance, entries) = ledger_invariant(&db.url, &org_id).await;
    assert_eq!(entries, 1 + 16 * 60, "the top-up and one fee per run");
    assert_eq!(balance, (1_000_000 - 100 * 16 * 60) * 1_000_000);
}

#[actix_web::test]
async fn kill_9_under_claims_and_reports_leaves_no_job_twice_held_and_every_job_ended() {
    if !postgres_or_skip() {
        return;
    }
    let db = TestDb::new().await;
    // Jobs whose claim answer died with the killed instance are requeued after 2 s.
    let envs = [
        ("KEEL__QUEUE__STALE_AFTER_SECS", "2"),
        ("KEEL__QUEUE__SWEEP_INTERVAL_SECS", "1"),
    ];
    let mut first = Instance::started(&db.url, &envs).await;
    let second = Instance::started(&db.url, &envs).await;
    let (org_id, key) = funded_org(&first, "worked", 100_000).await;
    let http = client();
    let project: Value = http
        .post(first.url("/api/projects"))
        .bearer_auth(&key)
        .json(&json!({"name": "chaos"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let project = project["id"].as_str().unwrap().to_owned();
    const JOBS: usize = 120;
    for _ in 0..JOBS {
        let queued = http
            .post(first.url("/api/training/jobs"))
            .bearer_auth(&key)
            .json(&json!({"projectId": project, "action": "tracer"}))
            .send()
            .await
            .unwrap();
        assert_eq!(queued.status(), StatusCode::ACCEPTED);
    }
    let bases = vec![first.base.clone(), second.base.clone()];
    let received: Arc<Mutex<Vec<String>>> = Arc::default();
    let started = Instant::now();
    let workers = (0..8).map(|w| {
        let (http, bases, received) = (http.clone(), bases.clone(), received.clone());
        async move {
            let worker = format!("w{w}");
            let mut turn = w;
            while received.lock().unwrap().iter().collect::<HashSet<_>>().len() < JOBS
                && started.elapsed() < Duration::from_secs(40)
            {
                turn += 1;
                let base = &bases[turn % bases.len()];
                let claimed = http
                    .post(format!("{base}/api/training/internal/jobs/claim"))
                    .bearer_auth(INTERNAL_KEY)
                    .header("Prefer", "wait=1")
                    .json(&json!({"worker_id": worker, "action": "tracer", "limit": 3}))
                    .send()
                    .await;
                let Ok(claimed) = claimed else { continue };
                let Ok(body) = claimed.json::<Value>().await else {
                    continue;
                };
                for job in body["jobs"].as_array().cloned().unwrap_or_default() {
                    let job_id = job["job_id"].as_str().unwrap().to_owned();
                    received.lock().unwrap().push(job_id.clone());
                    // Reported until some instance answers.
                    for attempt in 0..100 {
                        let base = &bases[(turn + attempt) % bases.len()];
                        let done = http
                            .post(format!("{base}/api/training/internal/jobs/succeeded"))
                            .bearer_auth(INTERNAL_KEY)
                            .json(&json!({"job_id": job_id, "worker_id": worker}))
                            .send()
                            .await;
                        if done.is_ok_and(|r| r.status() == StatusCode::OK) {
                            break;
                        }
                        actix_web::rt::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
        }
    });
    let killer = async {
        actix_web::rt::time::sleep(Duration::from_millis(400)).await;
        first.kill9();
    };
    tokio::join!(join_all(workers), killer);

    let received = received.lock().unwrap().clone();
    let distinct: HashSet<&String> = received.iter().collect();
    assert_eq!(distinct.len(), received.len(), "no job was handed to two workers");
    assert_eq!(distinct.len(), JOBS, "every job was handed out");
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    let conn = sea_orm::Database::connect(db.url.as_str()).await.unwrap();
    let jobs = entities::training_job::Entity::find()
        .filter(entities::training_job::Column::OrgId.eq(org_id.as_str()))
        .all(&conn)
        .await
        .unwrap();
    assert!(
        jobs.iter().all(|j| j.status.as_str() == "succeeded"),
        "every job ended"
    );
    let fees = entities::ledger_entry::Entity::find()
        .filter(entities::ledger_entry::Column::OrgId.eq(org_id.as_str()))
        .filter(entities::ledger_entry::Column::Kind.eq("run_fee"))
        .all(&conn)
        .await
        .unwrap();
    conn.close().await.ok();
    assert_eq!(fees.len(), JOBS, "each job's fee once");
    ledger_invariant(&db.url, &org_id).await;
}

#[actix_web::test]
async fn a_crash_between_the_card_charge_and_the_credit_is_credited_once_after_restart() {
    if !postgres_or_skip() {
        return;
    }
    let db = TestDb::new().await;
    let mut instance = Instance::started(&db.url, &[("KEEL__PAYMENTS__RECONCILE_MIN_AGE_SECS", "0")]).await;
    let (org_id, key) = funded_org(&instance, "crashed", 100).await;
    let before = ledger_invariant(&db.url, &org_id).await.0;
    // The next charge succeeds at the processor, then the process dies before the credit.
    instance.restart(&[("KEEL_FAULT_POINT", "after_charge")]).await;
    let crashed = client()
        .post(instance.url("/api/billing/topup"))
        .bearer_auth(&key)
        .header("Idempotency-Key", "crash-1")
        .json(&json!({"orgId": org_id, "amountCents": 2500}))
        .send()
        .await;
    assert!(crashed.is_err(), "the process died before answering");
    assert_eq!(
        ledger_invariant(&db.url, &org_id).await.0,
        before,
        "charged, not credited yet"
    );

    // Restarted (no fault): the reconciler asks the processor and credits the charge once.
    instance.restart(&[("KEEL_FAULT_POINT", "")]).await;
    let credited = before + 2500 * 1_000_000;
    assert!(
        eventually(|| async { balance_of(&db.url, &org_id).await == credited }).await,
        "the charge was credited after the restart"
    );
    // The client's retry answers the same payment, and charges nothing more.
    let retried = client()
        .post(instance.url("/api/billing/topup"))
        .bearer_auth(&key)
        .header("Idempotency-Key", "crash-1")
        .json(&json!({"orgId": org_id, "amountCents": 2500}))
        .send()
        .await
        .unwrap();
    assert_eq!(retried.status(), StatusCode::OK);
    let (balance, entries) = ledger_invariant(&db.url, &org_id).await;
    assert_eq!(balance, credited);
    assert_eq!(entries, 2, "the first top-up and the crashed one, once");
    let metrics = client()
        .get(instance.url("/metrics"))
        .bearer_auth(INTERNAL_KEY)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("keel_payments_pending 0"), "{metrics}");
    assert!(
        metrics.contains("keel_payments_reconciled_total{outcome=\"credited\"} 1"),
        "{metrics}"
    );
}

#[actix_web::test]
async fn a_key_revoked_on_one_process_is_refused_by_the_other_within_a_second() {
    if !postgres_or_skip() {
        return;
    }
    let (_provider, provider_url) = crate::fakes::FakeProvider::start();
    let db = TestDb::new().await;
    let openai = format!("{provider_url}/openai/v1");
    let envs = [
        ("KEEL_PROVIDER_OPENAI_URL", openai.as_str()),
        // A verified key would be remembered for a minute: only the notification can end it.
        ("KEEL__PROXY__AUTH_CACHE_TTL_MS", "60000"),
    ];
    let first = Instance::started(&db.url, &envs).await;
    let second = Instance::started(&db.url, &envs).await;
    let (_org_id, key) = funded_org(&first, "revoked", 100).await;
    let http = client();
    let project: Value = http
        .post(first.url("/api/projects"))
        .bearer_auth(&key)
        .json(&json!({"name": "bot"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let project = project["id"].as_str().unwrap().to_owned();
    let call = || {
        http.post(second.url("/v1/chat/completions"))
            .bearer_auth(&key)
            .header("X-Service-Project-Id", &project)
            .header("X-Service-Provider", "openai")
            .header("X-Service-Provider-Key", "sk-provider")
            .json(&json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]}))
            .send()
    };
    assert_eq!(
        call().await.unwrap().status(),
        StatusCode::OK,
        "the key works and is cached"
    );
    let keys: Value = http
        .get(first.url("/api/api-keys"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let key_id = keys["keys"][0]["apiKeyId"].clone();
    let revoked = http
        .delete(first.url(&format!("/api/internal/api-keys/{}", key_id.as_str().unwrap())))
        .bearer_auth(INTERNAL_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(revoked.status(), StatusCode::OK);
    let at = Instant::now();
    let refused = || async { call().await.unwrap().status() == StatusCode::UNAUTHORIZED };
    assert!(eventually(refused).await);
    assert!(
        at.elapsed() < Duration::from_secs(1),
        "refused after {:?}",
        at.elapsed()
    );
}

#[actix_web::test]
async fn an_auto_top_up_crashed_after_its_charge_is_credited_once_after_restart() {
    if !postgres_or_skip() {
        return;
    }
    let db = TestDb::new().await;
    let mut instance = Instance::started(&db.url, &[("KEEL__PAYMENTS__RECONCILE_MIN_AGE_SECS", "0")]).await;
    // 150 cents, auto top-up of 1,000 below 100: the first run fee (100) sets it off.
    let (org_id, key) = funded_org(&instance, "auto", 150).await;
    let set = client()
        .put(instance.url("/api/billing/auto-topup"))
        .bearer_auth(&key)
        .json(&json!({"orgId": org_id, "enabled": true, "thresholdCents": 100, "amountCents": 1000}))
        .send()
        .await
        .unwrap();
    assert_eq!(set.status(), StatusCode::OK);
    instance.restart(&[("KEEL_FAULT_POINT", "after_charge")]).await;
    let fee = client()
        .post(instance.url("/api/billing/debit"))
        .bearer_auth(&key)
        .json(&json!({"orgId": org_id, "runId": "r1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(fee.status(), StatusCode::OK);
    // The auto top-up charged the card, and the process died before crediting it.
    let mut exited = false;
    for _ in 0..200 {
        if instance.child.try_wait().is_ok_and(|status| status.is_some()) {
            exited = true;
            break;
        }
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(exited, "the fault point ended the process");
    assert_eq!(balance_of(&db.url, &org_id).await, 50 * 1_000_000);

    instance.restart(&[("KEEL_FAULT_POINT", "")]).await;
    let credited = (50 + 1000) * 1_000_000;
    assert!(
        eventually(|| async { balance_of(&db.url, &org_id).await == credited }).await,
        "the auto top-up was credited after the restart"
    );
    // Settled once: later passes find nothing pending, and the claim is released.
    actix_web::rt::time::sleep(Duration::from_millis(300)).await;
    let (balance, entries) = ledger_invariant(&db.url, &org_id).await;
    assert_eq!(balance, credited);
    assert_eq!(entries, 3, "the top-up, the fee and the auto top-up");
    let keys = entries_by_key(&db.url, &org_id).await;
    assert!(keys.values().all(|n| *n == 1));
}

#[actix_web::test]
async fn an_instance_frozen_mid_load_does_not_stop_the_other_from_charging_every_organization() {
    if !postgres_or_skip() {
        return;
    }
    let db = TestDb::new().await;
    let envs = [
        ("KEEL__DATABASE__LOCK_TIMEOUT_MS", "500"),
        ("KEEL__DATABASE__IDLE_IN_TRANSACTION_TIMEOUT_MS", "2000"),
    ];
    let frozen = Instance::started(&db.url, &envs).await;
    let live = Instance::started(&db.url, &envs).await;
    let mut orgs = Vec::new();
    for i in 0..4 {
        orgs.push(funded_org(&live, &format!("org{i}"), 1_000_000).await);
    }
    let http = reqwest::Client::builder()
        .timeout(Duration::from_millis(1500))
        .build()
        .unwrap();
    let bases = vec![frozen.base.clone(), live.base.clone()];
    let started = Instant::now();
    // (org index, when the live instance acknowledged a charge)
    let live_acks: Arc<Mutex<Vec<(usize, Duration)>>> = Arc::default();
    let clients = (0..8).map(|c| {
        let (http, bases, orgs, live_acks, live_base) = (
            http.clone(),
            bases.clone(),
            orgs.clone(),
            live_acks.clone(),
            live.base.clone(),
        );
        async move {
            let mut i = 0;
            while started.elapsed() < Duration::from_secs(13) {
                i += 1;
                let org = (c + i) % orgs.len();
                let (org_id, key) = &orgs[org];
                let run = format!("c{c}-{i}");
                // Each charge goes to either instance first, then to the other until answered.
                for attempt in 0..100 {
                    let base = &bases[(i + attempt) % 2];
                    let sent = http
                        .post(format!("{base}/api/billing/debit"))
                        .bearer_auth(key)
                        .json(&json!({"orgId": org_id, "runId": run}))
                        .send()
                        .await;
                    if sent.is_ok_and(|r| r.status() == StatusCode::OK) {
                        if *base == live_base {
                            live_acks.lock().unwrap().push((org, started.elapsed()));
                        }
                        break;
                    }
                }
            }
        }
    });
    let freezer = async {
        actix_web::rt::time::sleep(Duration::from_secs(2)).await;
        frozen.signal("-STOP");
        actix_web::rt::time::sleep(Duration::from_secs(10)).await;
        frozen.signal("-CONT");
    };
    tokio::join!(join_all(clients), freezer);

    // While the other instance was frozen (2 s..12 s), and once whatever it held was released
    // (the idle-in-transaction bound), the live instance charged every organization.
    let acks = live_acks.lock().unwrap().clone();
    for org in 0..orgs.len() {
        let during = acks
            .iter()
            .filter(|(o, at)| *o == org && *at > Duration::from_secs(5) && *at < Duration::from_secs(12))
            .count();
        assert!(
            during > 0,
            "organization {org} was charged while the other instance was frozen"
        );
    }
    for (org_id, _) in &orgs {
        let keys = entries_by_key(&db.url, org_id).await;
        assert!(keys.values().all(|n| *n == 1), "no key twice");
        ledger_invariant(&db.url, org_id).await;
    }
}

/// When a request was sent, and its status and whether the connection closes after it (or
/// the transport error).
type Sent = (Instant, Result<(StatusCode, bool), String>);

#[actix_web::test]
async fn sigterm_answers_every_request_sent_before_it_on_kept_alive_connections() {
    let db = TestDb::new().await;
    let instance = Instance::started(&db.url, &[("KEEL__SERVER__SHUTDOWN_GRACE_SECS", "2")]).await;
    // Kept-alive connections: one client (its pool) per sender.
    let signalled: Arc<Mutex<Option<Instant>>> = Arc::default();
    let outcomes: Arc<Mutex<Vec<Sent>>> = Arc::default();
    let senders = (0..16).map(|_| {
        let (url, signalled, outcomes) = (instance.url("/healthz"), signalled.clone(), outcomes.clone());
        async move {
            let http = reqwest::Client::builder()
                .pool_max_idle_per_host(1)
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap();
            loop {
                let sent_at = Instant::now();
                let answer = http.get(&url).send().await;
                let outcome = match answer {
                    Ok(r) => {
                        let close = r
                            .headers()
                            .get("connection")
                            .is_some_and(|v| v.to_str().unwrap_or("").eq_ignore_ascii_case("close"));
                        Ok((r.status(), close))
                    }
                    Err(err) => Err(format!("{err:?}")),
                };
                let refused = outcome.as_ref().is_err_and(|e| e.contains("ConnectionRefused"));
                outcomes.lock().unwrap().push((sent_at, outcome));
                let after = signalled
                    .lock()
                    .unwrap()
                    .is_some_and(|at| at.elapsed() > Duration::from_secs(4));
                if refused || after {
                    return;
                }
            }
        }
    });
    // A worker's claim waiting for a job when the signal comes.
    let waiting_claim = async {
        let sent = reqwest::Client::new()
            .post(instance.url("/api/training/internal/jobs/claim"))
            .bearer_auth(INTERNAL_KEY)
            .header("Prefer", "wait=30")
            .json(&json!({"worker_id": "w1", "action": "tracer", "limit": 1}))
            .send()
            .await;
        (Instant::now(), sent)
    };
    let terminator = async {
        actix_web::rt::time::sleep(Duration::from_millis(500)).await;
        *signalled.lock().unwrap() = Some(Instant::now());
        instance.signal("-TERM");
    };
    let (_, (claim_answered_at, claim), _) = tokio::join!(join_all(senders), waiting_claim, terminator);
    let claim = claim.expect("the waiting claim is answered");
    // Draining, it says when to come back rather than handing an empty list (issue 54).
    assert_eq!(claim.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(claim.headers().contains_key("retry-after"));

    let at = signalled.lock().unwrap().expect("signalled");
    assert!(
        claim_answered_at.duration_since(at) < Duration::from_secs(2),
        "the waiting claim ended at the signal, not after its 30 s"
    );
    let outcomes = outcomes.lock().unwrap();
    let before: Vec<_> = outcomes.iter().filter(|(sent, _)| *sent < at).collect();
    assert!(before.len() > 50, "load before the signal");
    for (_, outcome) in &before {
        assert!(
            outcome.is_ok(),
            "a request sent before SIGTERM was cut off: {outcome:?}"
        );
    }
    // After the signal: not ready (503), connections closed after each answer.
    let draining: Vec<_> = outcomes
        .iter()
        .filter_map(|(sent, o)| (*sent > at + Duration::from_millis(200)).then_some(o))
        .filter_map(|o| o.as_ref().ok())
        .collect();
    assert!(!draining.is_empty(), "answers during the grace period");
    assert!(
        draining
            .iter()
            .all(|(status, close)| *status == StatusCode::SERVICE_UNAVAILABLE && *close),
        "{draining:?}"
    );
}

/// Waits for the process to exit (at most `limit`); answers whether it did.
fn exited_within(child: &mut Child, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

#[actix_web::test]
async fn sigterm_writes_every_acknowledged_trace_before_the_process_exits() {
    let db = TestDb::new().await;
    let (_provider, url) = crate::fakes::FakeProvider::start();
    let openai = format!("{url}/openai/v1");
    // A long flush interval: every trace waits in the writer's queue until the shutdown.
    // keel's log is kept: a lost trace is explained by it (the writer logs what it drops).
    let log = std::env::temp_dir().join(format!("keel-sigterm-{}.log", uuid::Uuid::new_v4()));
    let log_path = log.to_string_lossy().into_owned();
    let mut instance = Instance::started(
        &db.url,
        &[
            ("KEEL__PROVIDERS__OPENAI_URL", openai.as_str()),
            ("KEEL__TRACES__FLUSH_MS", "600000"),
            ("KEEL__TRACES__FLUSH_ROWS", "500"),
            (LOG_FILE, log_path.as_str()),
        ],
    )
    .await;
    let http = client();
    let mut keys = Vec::new();
    for name in ["Acme", "Globex"] {
        let (_, key) = org_with_key(&http, &instance.base, name).await;
        let project: Value = http
            .post(instance.url("/api/projects"))
            .bearer_auth(&key)
            .json(&json!({"name": "Support"}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        keys.push((key, project["id"].as_str().unwrap().to_owned()));
    }
    // Database work on the HTTP workers first (a listing per call): the pool's connections
    // are opened by, and belong to, the workers' runtimes, which stop before the writer's
    // last batch.
    for _ in 0..5 {
        let listings = (0..32).map(|i| {
            http.get(instance.url("/api/projects"))
                .bearer_auth(&keys[i % 2].0)
                .send()
        });
        for listed in join_all(listings).await {
            assert_eq!(listed.unwrap().status(), StatusCode::OK);
        }
    }
    // Sixteen clients call without pause from before the signal until keel stops answering:
    // every call answered 200 was acknowledged, and its trace must be written.
    let acknowledged = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let senders = (0..16).map(|i| {
        let (key, project) = keys[i % 2].clone();
        let (url, acknowledged) = (instance.url("/v1/chat/completions"), acknowledged.clone());
        async move {
            let http = reqwest::Client::builder().timeout(Duration::from_secs(20)).build().unwrap();
            for n in 0.. {
                let sent = http
                    .post(&url)
                    .bearer_auth(&key)
                    .header("X-Service-Provider", "openai")
                    .header("X-Service-Provider-Key", "sk-test-provider-key")
                    .header("X-Service-Project-Id", &project)
                    .json(&json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": format!("q{i}-{n}")}]}))
                    .send()
                    .await;
                match sent {
                    Ok(r) if r.status() == StatusCode::OK => {
                        acknowledged.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    Ok(r) if r.status() == StatusCode::SERVICE_UNAVAILABLE => {}
                    Ok(r) => panic!("{}", r.status()),
                    Err(_) => return,
                }
            }
        }
    });
    let terminator = async {
        actix_web::rt::time::sleep(Duration::from_millis(700)).await;
        instance.signal("-TERM");
    };
    tokio::join!(join_all(senders), terminator);
    let acknowledged = acknowledged.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        acknowledged > 100,
        "load before and during the shutdown: {acknowledged}"
    );
    assert!(
        exited_within(&mut instance.child, Duration::from_secs(30)),
        "keel exits after SIGTERM"
    );
    let db_conn = sea_orm::Database::connect(db.url.as_str()).await.unwrap();
    use sea_orm::{EntityTrait, PaginatorTrait};
    let written = entities::trace::Entity::find().count(&db_conn).await.unwrap();
    assert_eq!(
        written,
        acknowledged,
        "every acknowledged trace is in the database; keel's log ends:\n{}",
        log_tail(&log, 80)
    );
    std::fs::remove_file(&log).ok();
}

#[actix_web::test]
async fn sigterm_answers_every_request_that_reached_keel_until_it_stops_listening() {
    let db = TestDb::new().await;
    // Two seconds of grace: a sender starved by a loaded machine still takes its last
    // keep-alive answer and sends again before keel closes its idle connections.
    let instance = Instance::started(&db.url, &[("KEEL__SERVER__SHUTDOWN_GRACE_SECS", "2")]).await;
    let errors: Arc<Mutex<Vec<String>>> = Arc::default();
    let answered = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let senders = (0..16).map(|_| {
        let (url, errors, answered) = (instance.url("/healthz"), errors.clone(), answered.clone());
        async move {
            let http = reqwest::Client::builder()
                .pool_max_idle_per_host(1)
                .timeout(Duration::from_secs(10))
                .build()
                .unwrap();
            loop {
                match http.get(&url).send().await {
                    Ok(_) => {
                        answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                    // Never reached keel: it no longer listens.
                    Err(err) if err.is_connect() => return,
                    Err(err) => {
                        errors.lock().unwrap().push(format!("{err:?}"));
                        return;
                    }
                }
            }
        }
    });
    let terminator = async {
        actix_web::rt::time::sleep(Duration::from_millis(300)).await;
        instance.signal("-TERM");
    };
    tokio::join!(join_all(senders), terminator);
    assert!(answered.load(std::sync::atomic::Ordering::SeqCst) > 100);
    let errors = errors.lock().unwrap();
    assert!(
        errors.is_empty(),
        "requests that reached keel were cut off: {errors:?}"
    );
}

#[actix_web::test]
async fn a_client_that_leaves_a_silent_stream_closes_the_providers_connection_within_a_second() {
    let db = TestDb::new().await;
    let (provider, url) = crate::fakes::RawProvider::start();
    let openai = format!("{url}/v1");
    // The default read timeout (300 s): only the client's leaving can end the call.
    let instance = Instance::started(&db.url, &[("KEEL__PROVIDERS__OPENAI_URL", openai.as_str())]).await;
    let http = client();
    let (_, key) = org_with_key(&http, &instance.base, "Acme").await;
    let mut stream = reqwest::Client::new()
        .post(instance.url("/v1/chat/completions"))
        .bearer_auth(&key)
        .header("X-Service-Provider", "openai")
        .header("X-Service-Provider-Key", "sk-test-provider-key")
        .header("X-Service-Record", "false")
        .json(&json!({"model": "silent", "stream": true, "messages": [{"role": "user", "content": "x"}]}))
        .send()
        .await
        .unwrap()
        .bytes_stream();
    use futures_util::StreamExt;
    let first = stream.next().await.unwrap().unwrap();
    assert!(String::from_utf8_lossy(&first).contains("tok0"));
    // The client's FIN, while the provider says nothing.
    let left = Instant::now();
    drop(stream);
    let closed = provider.closed_at.clone();
    for _ in 0..100 {
        if !closed.lock().unwrap().is_empty() {
            break;
        }
        actix_web::rt::time::sleep(Duration::from_millis(20)).await;
    }
    let at = closed
        .lock()
        .unwrap()
        .first()
        .copied()
        .expect("the provider's connection was closed");
    assert!(
        at.duration_since(left) < Duration::from_secs(1),
        "{:?}",
        at.duration_since(left)
    );
}

/// The promise for outbound webhooks: a change acknowledged (committed) before a
/// kill -9 is announced after the restart. The first process sends nothing (its dispatcher
/// is off), so the crash falls between the commit and the delivery by construction. Runs on
/// both databases (one process at a time).
#[actix_web::test]
async fn a_webhook_event_committed_before_a_kill_9_is_delivered_after_the_restart() {
    use crate::fakes::{FakeJson, Reply};
    let db = TestDb::new().await;
    let hooks = [
        ("KEEL__WEBHOOKS__ALLOW_HTTP", "true"),
        ("KEEL__WEBHOOKS__ALLOW_PRIVATE_DESTINATIONS", "true"),
    ];
    let mut envs = hooks.to_vec();
    envs.push(("KEEL__WEBHOOKS__DISPATCHER", "false"));
    let mut instance = Instance::started(&db.url, &envs).await;
    let (receiver, url) = FakeJson::start(|_| Reply::Json(200, json!({})));
    let http = client();
    let (org_id, key) = org_with_key(&http, &instance.base, "announced").await;
    let created: Value = http
        .post(instance.url("/api/webhooks/endpoints"))
        .bearer_auth(&key)
        .json(&json!({"url": format!("{url}/in"), "events": ["billing.topup.succeeded"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let secret = created["secret"].as_str().expect("a secret").to_owned();
    let saved = http
        .post(instance.url("/api/billing/payment-method"))
        .bearer_auth(&key)
        .json(&json!({"orgId": org_id, "paymentMethodId": "pm_card_visa"}))
        .send()
        .await
        .unwrap();
    assert_eq!(saved.status(), StatusCode::OK);
    let topped = http
        .post(instance.url("/api/billing/topup"))
        .bearer_auth(&key)
        .json(&json!({"orgId": org_id, "amountCents": 1234}))
        .send()
        .await
        .unwrap();
    assert_eq!(topped.status(), StatusCode::OK, "acknowledged");
    instance.kill9();
    assert!(receiver.calls().is_empty());

    // Restarted with its dispatcher: the event arrives, signed, within 2 s of serving.
    instance.envs.retain(|(k, _)| k != "KEEL__WEBHOOKS__DISPATCHER");
    instance.restart(&[]).await;
    let deadline = Instant::now() + Duration::from_secs(2);
    while receiver.calls().is_empty() && Instant::now() < deadline {
        actix_web::rt::time::sleep(Duration::from_millis(20)).await;
    }
    let calls = receiver.calls();
    assert_eq!(calls.len(), 1, "delivered once after the restart");
    assert_eq!(calls[0].body["type"], "billing.topup.succeeded");
    assert_eq!(calls[0].body["orgId"], org_id);
    assert_eq!(calls[0].body["data"]["amountMicrocents"], 1_234_000_000i64);
    let mut headers = http::HeaderMap::new();
    for name in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
        headers.insert(name, calls[0].headers[name].parse().unwrap());
    }
    assert!(standardwebhooks::Webhook::new(&secret)
        .unwrap()
        .verify(&calls[0].raw, &headers)
        .is_ok());
}

/// Credit grants expire once whatever a kill -9 interrupts: 100 organizations' lapsed grants,
/// the process killed while its first sweep runs, restarted; every grant then has exactly one
/// expiry entry, every balance is its ledger's sum and nothing of the grants remains. Both
/// databases (one process at a time).
#[actix_web::test]
async fn kill_9_during_an_expiry_sweep_loses_and_doubles_nothing() {
    use sea_orm::{ConnectionTrait, EntityTrait, Statement};
    let db = TestDb::new().await;
    let mut instance = Instance::started(&db.url, &[("KEEL__BILLING__EXPIRY_SWEEP_SECS", "3600")]).await;
    let http = client();
    let mut orgs = Vec::new();
    for i in 0..100 {
        let (org_id, _) = org_with_key(&http, &instance.base, &format!("lapsing {i}")).await;
        for (n, cents) in [(0, 700), (1, 300)] {
            let made = http
                .post(instance.url("/api/internal/billing/grants"))
                .bearer_auth(INTERNAL_KEY)
                .header("Idempotency-Key", format!("g-{i}-{n}"))
                .json(
                    &json!({"orgId": org_id, "amountCents": cents, "reason": "goodwill",
                    "expiresAt": (chrono::Utc::now() + chrono::Duration::days(1)).to_rfc3339()}),
                )
                .send()
                .await
                .unwrap();
            assert_eq!(made.status(), StatusCode::CREATED);
        }
        orgs.push(org_id);
    }
    instance.kill9();
    // Every grant lapsed a minute ago.
    let conn = sea_orm::Database::connect(&db.url).await.unwrap();
    let backend = conn.get_database_backend();
    let sql = match backend {
        sea_orm::DbBackend::Postgres => "UPDATE credit_grants SET expires_at = $1",
        _ => "UPDATE credit_grants SET expires_at = ?",
    };
    conn.execute_raw(Statement::from_sql_and_values(
        backend,
        sql,
        [(chrono::Utc::now() - chrono::Duration::minutes(1)).into()],
    ))
    .await
    .unwrap();
    // Started with a sweep at once, killed while it runs, started again.
    instance
        .restart(&[("KEEL__BILLING__EXPIRY_SWEEP_SECS", "1")])
        .await;
    actix_web::rt::time::sleep(Duration::from_millis(40)).await;
    instance.kill9();
    let expired_at_kill = entities::credit_grant::Entity::find()
        .all(&conn)
        .await
        .unwrap()
        .iter()
        .filter(|g| g.expired_at.is_some())
        .count();
    // Where the kill fell (the end state must be exact wherever it did).
    eprintln!("expiry sweep killed with {expired_at_kill} of 200 grants expired");
    instance.restart(&[]).await;
    let all_expired = || async {
        let grants = entities::credit_grant::Entity::find().all(&conn).await.unwrap();
        grants
            .iter()
            .all(|g| g.remaining_microcents.get() == 0 && g.expired_at.is_some())
    };
    assert!(
        eventually(all_expired).await,
        "every grant expired after the restart"
    );
    let entries = entities::ledger_entry::Entity::find().all(&conn).await.unwrap();
    let grants = entities::credit_grant::Entity::find().all(&conn).await.unwrap();
    for grant in &grants {
        let expiries: Vec<_> = entries
            .iter()
            .filter(|e| e.idempotency_key.as_deref() == Some(&format!("expiry:{}", grant.id)))
            .collect();
        assert_eq!(expiries.len(), 1, "one expiry entry for {}", grant.id);
        assert_eq!(expiries[0].amount_microcents, -grant.original_microcents);
    }
    for org_id in &orgs {
        let (balance, count) = ledger_invariant(&db.url, org_id).await;
        assert_eq!((balance, count), (0, 4), "two grants and their two expiries");
    }
    conn.close().await.ok();
}

#[actix_web::test]
async fn a_draining_instance_answers_claims_503_with_retry_after() {
    // SQLite or PostgreSQL alike: one instance.
    let db = TestDb::new().await;
    let keel = Instance::started(&db.url, &[("KEEL__SERVER__SHUTDOWN_GRACE_SECS", "3")]).await;
    let http = reqwest::Client::new();
    let claim = |wait: u32| {
        http.post(keel.url("/api/training/internal/jobs/claim"))
            .bearer_auth(INTERNAL_KEY)
            .header("Prefer", format!("wait={wait}"))
            .json(&json!({"worker_id": "w", "action": "tracer", "limit": 1}))
            .send()
    };
    let waiting = actix_web::rt::spawn(claim(20));
    actix_web::rt::time::sleep(Duration::from_millis(300)).await;
    keel.signal("-TERM");
    // The long poll ends at once, and says when to come back (not an empty answer that
    // would have the worker ask again at once).
    let ended = waiting.await.unwrap().unwrap();
    assert_eq!(ended.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(ended.headers()["retry-after"], "5");
    let body: Value = ended.json().await.unwrap();
    assert_eq!(body["code"], "unavailable", "{body}");
    // So does any claim during the grace period.
    let again = claim(0).await.unwrap();
    assert_eq!(again.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(again.headers().contains_key("retry-after"));
}
