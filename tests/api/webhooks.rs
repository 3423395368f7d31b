//! Outbound webhooks: endpoints, their checks, signed deliveries, retries and the log.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

use crate::fakes::{FakeJson, Reply};
use crate::helpers::*;

/// An app whose endpoints may be plain http on this machine (as a receiver in a test is).
pub async fn local_app() -> TestApp {
    spawn_app_with(|s| {
        s.webhooks.allow_http = true;
        s.webhooks.allow_private_destinations = true;
    })
    .await
}

pub async fn create(app: &TestApp, org: &TestOrg, body: Value) -> Value {
    json_of(
        app.post("/api/webhooks/endpoints", &org.api_key, &body).await,
        StatusCode::CREATED,
    )
    .await
}

async fn patch(app: &TestApp, org: &TestOrg, id: &str, body: Value) -> reqwest::Response {
    app.request(
        Method::PATCH,
        &format!("/api/webhooks/endpoints/{id}"),
        Some(&org.api_key),
    )
    .json(&body)
    .send()
    .await
    .unwrap()
}

/// POSTs `action` (`test`, `rotate-secret`) of the endpoint and answers its JSON.
async fn act(app: &TestApp, org: &TestOrg, id: &str, action: &str, status: StatusCode) -> Value {
    json_of(
        app.post(
            &format!("/api/webhooks/endpoints/{id}/{action}"),
            &org.api_key,
            &json!({}),
        )
        .await,
        status,
    )
    .await
}

/// The 422's issue locations, as `body.field` strings.
async fn issue_fields(response: reqwest::Response) -> Vec<String> {
    let body = json_of(response, StatusCode::UNPROCESSABLE_ENTITY).await;
    body["detail"]
        .as_array()
        .unwrap()
        .iter()
        .map(|issue| {
            issue["loc"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| p.as_str().map_or_else(|| p.to_string(), str::to_owned))
                .collect::<Vec<_>>()
                .join(".")
        })
        .collect()
}

#[actix_web::test]
async fn members_create_read_change_rotate_and_delete_endpoints_and_see_the_secret_once() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let created = create(
        &app,
        &org,
        json!({"url": "https://hooks.example.com/keel", "events": ["job.failed", "job.succeeded"], "description": "ops"}),
    )
    .await;
    let id = created["endpointId"].as_str().unwrap().to_owned();
    let secret = created["secret"].as_str().unwrap();
    assert!(secret.starts_with("whsec_") && secret.len() > 40, "{secret}");
    assert_eq!(created["events"], json!(["job.failed", "job.succeeded"]));
    assert_eq!(created["enabled"], true);
    assert_eq!(created["orgId"], org.org_id);

    let listed = json_of(
        app.get("/api/webhooks/endpoints", &org.api_key).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(listed["endpoints"].as_array().unwrap().len(), 1);
    let read = json_of(
        app.get(&format!("/api/webhooks/endpoints/{id}"), &org.api_key)
            .await,
        StatusCode::OK,
    )
    .await;
    assert!(read.get("secret").is_none() && !read.to_string().contains(secret));
    assert_eq!(read["description"], "ops");

    let changed = json_of(
        patch(
            &app,
            &org,
            &id,
            json!({"events": ["*"], "description": null, "enabled": false}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(changed["events"], json!(["*"]));
    assert_eq!(changed["description"], Value::Null);
    assert_eq!(changed["enabled"], false);
    let changed = json_of(
        patch(&app, &org, &id, json!({"enabled": true})).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        (changed["enabled"].clone(), changed["events"].clone()),
        (json!(true), json!(["*"]))
    );

    let rotated = act(&app, &org, &id, "rotate-secret", StatusCode::OK).await;
    let new_secret = rotated["secret"].as_str().unwrap();
    assert!(new_secret.starts_with("whsec_") && new_secret != secret);
    let until: chrono::DateTime<chrono::Utc> =
        rotated["previousSecretUntil"].as_str().unwrap().parse().unwrap();
    let hours = (until - chrono::Utc::now()).num_minutes() as f64 / 60.0;
    assert!((23.9..=24.0).contains(&hours), "{hours}");

    // Another organization's member sees none of it.
    let other = app.create_org("Other").await;
    for response in [
        app.get(&format!("/api/webhooks/endpoints/{id}"), &other.api_key)
            .await,
        app.delete(&format!("/api/webhooks/endpoints/{id}"), &other.api_key)
            .await,
        app.post(
            &format!("/api/webhooks/endpoints/{id}/test"),
            &other.api_key,
            &json!({}),
        )
        .await,
    ] {
        assert_eq!(response.status(), StatusCode::NOT_FOUND);
    }
    let theirs = json_of(
        app.get("/api/webhooks/endpoints", &other.api_key).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(theirs["endpoints"], json!([]));
    // An API key naming another organization: 403, as everywhere.
    let foreign = app
        .post(
            "/api/webhooks/endpoints",
            &org.api_key,
            &json!({"orgId": other.org_id, "url": "https://hooks.example.com/x", "events": ["*"]}),
        )
        .await;
    assert_eq!(foreign.status(), StatusCode::FORBIDDEN);

    let deleted = app
        .delete(&format!("/api/webhooks/endpoints/{id}"), &org.api_key)
        .await;
    assert_eq!(deleted.status(), StatusCode::NO_CONTENT);
    let gone = app
        .get(&format!("/api/webhooks/endpoints/{id}"), &org.api_key)
        .await;
    assert_eq!(gone.status(), StatusCode::NOT_FOUND);
}

#[actix_web::test]
async fn the_webhook_metrics_exist_from_start_up() {
    let app = spawn_app_with(|s| s.webhooks.dispatcher = false).await;
    let org = app.create_org("Acme").await;
    let created = create(
        &app,
        &org,
        json!({"url": "https://hooks.example.com/k", "events": ["*"]}),
    )
    .await;
    let id = created["endpointId"].as_str().unwrap();
    let before = app.metrics_text().await;
    for name in [
        "keel_webhook_deliveries_total{outcome=\"succeeded\"} 0",
        "keel_webhook_delivery_seconds_count 0",
        "keel_webhook_outbox_pending 0",
        "keel_webhook_oldest_pending_seconds 0",
    ] {
        assert!(before.contains(name), "{name} not in:\n{before}");
    }
    // With no dispatcher on this instance, a test event waits: pending, and ageing.
    app.post(
        &format!("/api/webhooks/endpoints/{id}/test"),
        &org.api_key,
        &json!({}),
    )
    .await;
    actix_web::rt::time::sleep(Duration::from_millis(1100)).await;
    let after = app.metrics_text().await;
    assert!(after.contains("keel_webhook_outbox_pending 1"), "{after}");
    let age: f64 = after
        .lines()
        .find_map(|l| l.strip_prefix("keel_webhook_oldest_pending_seconds "))
        .unwrap()
        .parse()
        .unwrap();
    assert!(age >= 1.0, "{age}");
}

#[actix_web::test]
async fn bad_urls_private_destinations_and_unknown_events_are_422s_naming_the_field() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let send = |body: Value| app.post_later("/api/webhooks/endpoints", &org.api_key, &body);
    for url in [
        "http://hooks.example.com/keel",
        "https://127.0.0.1/keel",
        "https://[::1]/keel",
        "https://localhost:8443/keel",
        "https://169.254.169.254/latest",
        "https://10.0.0.7/keel",
        "https://user:pw@hooks.example.com/",
        "ftp://hooks.example.com/keel",
        "not a url at all",
    ] {
        let fields = issue_fields(send(json!({"url": url, "events": ["*"]})).await).await;
        assert_eq!(fields, ["body.url"], "{url}");
    }
    let fields =
        issue_fields(send(json!({"url": "https://hooks.example.com/k", "events": ["job.done"]})).await).await;
    assert_eq!(fields, ["body.events.0"]);
    let fields = issue_fields(send(json!({"url": "https://hooks.example.com/k", "events": []})).await).await;
    assert_eq!(fields, ["body.events"]);
    let created = create(
        &app,
        &org,
        json!({"url": "https://hooks.example.com/k", "events": ["*"]}),
    )
    .await;
    let id = created["endpointId"].as_str().unwrap();
    let fields = issue_fields(patch(&app, &org, id, json!({"url": "https://192.168.1.1/x"})).await).await;
    assert_eq!(fields, ["body.url"]);
    let listed = json_of(
        app.get("/api/webhooks/endpoints", &org.api_key).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(listed["endpoints"][0]["url"], "https://hooks.example.com/k");
}

/// Waits until the receiver has `n` calls.
async fn calls(receiver: &FakeJson, n: usize, within: Duration) -> Vec<crate::fakes::Call> {
    let deadline = std::time::Instant::now() + within;
    loop {
        let calls = receiver.calls();
        if calls.len() >= n || std::time::Instant::now() > deadline {
            return calls;
        }
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
}

fn verified(secret: &str, call: &crate::fakes::Call) -> bool {
    let mut headers = http::HeaderMap::new();
    for name in ["webhook-id", "webhook-timestamp", "webhook-signature"] {
        if let Some(value) = call.headers.get(name) {
            headers.insert(name, value.parse().unwrap());
        }
    }
    standardwebhooks::Webhook::new(secret)
        .unwrap()
        .verify(&call.raw, &headers)
        .is_ok()
}

#[actix_web::test]
async fn a_test_event_arrives_signed_and_a_500_is_retried_with_the_same_webhook_id() {
    let app = local_app().await;
    let org = app.create_org("Acme").await;
    let answers = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = answers.clone();
    let (receiver, url) =
        FakeJson::start(
            move |_| match counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
                0 => Reply::Json(500, json!({"error": "<b>down</b>"})),
                _ => Reply::Json(200, json!({"ok": true})),
            },
        );
    let created = create(
        &app,
        &org,
        json!({"url": format!("{url}/hooks"), "events": ["job.failed"]}),
    )
    .await;
    let (id, secret) = (
        created["endpointId"].as_str().unwrap().to_owned(),
        created["secret"].as_str().unwrap().to_owned(),
    );
    let sent = act(&app, &org, &id, "test", StatusCode::ACCEPTED).await;
    let delivery = sent["deliveryId"].as_str().unwrap().to_owned();
    // The first attempt within 2 s, the retry 5 s (±10%) after it.
    let first = calls(&receiver, 1, Duration::from_secs(2)).await;
    assert_eq!(first.len(), 1, "no delivery within 2 s");
    let all = calls(&receiver, 2, Duration::from_secs(9)).await;
    assert_eq!(all.len(), 2);
    let event = &all[0].body;
    assert_eq!(event["type"], "webhook.test");
    assert_eq!(event["orgId"], org.org_id);
    assert_eq!(event["data"], json!({"endpointId": id}));
    assert!(event["id"].as_str().unwrap().starts_with("evt_"));
    assert_eq!(all[0].headers["webhook-id"], event["id"].as_str().unwrap());
    assert_eq!(all[0].headers["webhook-id"], all[1].headers["webhook-id"]);
    assert_eq!(all[0].raw, all[1].raw);
    assert_eq!(all[0].path, "/hooks");
    for call in &all {
        assert!(verified(&secret, call), "{:?}", call.headers);
        assert!(!verified("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", call));
    }

    // The log: one delivery, two attempts (500 then 200), succeeded.
    let mut log = Value::Null;
    for _ in 0..40 {
        log = json_of(
            app.get(&format!("/api/webhooks/endpoints/{id}/deliveries"), &org.api_key)
                .await,
            StatusCode::OK,
        )
        .await;
        if log["deliveries"][0]["status"] == "succeeded" {
            break;
        }
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
    let only = &log["deliveries"][0];
    assert_eq!(log["deliveries"].as_array().unwrap().len(), 1);
    assert_eq!(only["deliveryId"], delivery);
    assert_eq!(only["type"], "webhook.test");
    assert_eq!(only["status"], "succeeded");
    let codes: Vec<Value> = only["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["statusCode"].clone())
        .collect();
    assert_eq!(codes, [json!(500), json!(200)]);
    assert!(only["attempts"][0]["response"]
        .as_str()
        .unwrap()
        .contains("<b>down</b>"));
    let failed_only = json_of(
        app.get(
            &format!("/api/webhooks/endpoints/{id}/deliveries?status=failed"),
            &org.api_key,
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(failed_only["deliveries"], json!([]));

    // The metrics: one attempt retried, one succeeded, nothing pending.
    let metrics = app.metrics_text().await;
    for line in [
        "keel_webhook_deliveries_total{outcome=\"succeeded\"} 1",
        "keel_webhook_deliveries_total{outcome=\"retrying\"} 1",
        "keel_webhook_deliveries_total{outcome=\"failed\"} 0",
        "keel_webhook_outbox_pending 0",
        "keel_webhook_oldest_pending_seconds 0",
        "keel_webhook_delivery_seconds_count 2",
    ] {
        assert!(metrics.contains(line), "{line} not in:\n{metrics}");
    }

    // Replayed on request: the same webhook-id again.
    let retried = app
        .post(
            &format!("/api/webhooks/deliveries/{delivery}/retry"),
            &org.api_key,
            &json!({}),
        )
        .await;
    assert_eq!(retried.status(), StatusCode::ACCEPTED);
    let all = calls(&receiver, 3, Duration::from_secs(3)).await;
    assert_eq!(all.len(), 3);
    assert_eq!(all[2].headers["webhook-id"], all[0].headers["webhook-id"]);
}

#[actix_web::test]
async fn a_rotation_signs_with_both_secrets_and_the_log_pages() {
    let app = local_app().await;
    let org = app.create_org("Acme").await;
    let (receiver, url) = FakeJson::start(|_| Reply::Json(204, json!({})));
    let created = create(&app, &org, json!({"url": url, "events": ["*"]})).await;
    let id = created["endpointId"].as_str().unwrap().to_owned();
    let old = created["secret"].as_str().unwrap().to_owned();
    let rotated = act(&app, &org, &id, "rotate-secret", StatusCode::OK).await;
    let new = rotated["secret"].as_str().unwrap().to_owned();
    for _ in 0..3 {
        let sent = app
            .post(
                &format!("/api/webhooks/endpoints/{id}/test"),
                &org.api_key,
                &json!({}),
            )
            .await;
        assert_eq!(sent.status(), StatusCode::ACCEPTED);
    }
    let all = calls(&receiver, 3, Duration::from_secs(5)).await;
    assert_eq!(all.len(), 3);
    for call in &all {
        assert_eq!(call.headers["webhook-signature"].split(' ').count(), 2);
        assert!(verified(&old, call) && verified(&new, call));
    }
    // Pages of two, newest first, no repeats.
    let mut seen = Vec::new();
    let mut path = format!("/api/webhooks/endpoints/{id}/deliveries?limit=2");
    loop {
        let page = json_of(app.get(&path, &org.api_key).await, StatusCode::OK).await;
        seen.extend(
            page["deliveries"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d["deliveryId"].clone()),
        );
        match page["nextCursor"].as_str() {
            Some(cursor) => path = format!("/api/webhooks/endpoints/{id}/deliveries?limit=2&cursor={cursor}"),
            None => break,
        }
    }
    assert_eq!(seen.len(), 3);
    seen.dedup();
    assert_eq!(seen.len(), 3);
    let bad = app
        .get(
            &format!("/api/webhooks/endpoints/{id}/deliveries?cursor=zz"),
            &org.api_key,
        )
        .await;
    assert_eq!(bad.status(), StatusCode::UNPROCESSABLE_ENTITY);
}

#[actix_web::test]
async fn a_name_that_resolves_to_a_private_address_is_refused_when_it_is_called() {
    // This machine's own name resolves to a loopback or private address.
    let host = String::from_utf8(std::process::Command::new("hostname").output().unwrap().stdout).unwrap();
    let host = host.trim().to_owned();
    let private = tokio::net::lookup_host((host.as_str(), 0))
        .await
        .map(|mut addrs| {
            addrs.all(|a| {
                a.ip().is_loopback() || matches!(a.ip(), std::net::IpAddr::V4(v4) if v4.is_private())
            })
        })
        .unwrap_or(false);
    if host.is_empty() || private.eq(&false) {
        eprintln!("skipped: this machine's name ({host:?}) does not resolve to a private address");
        return;
    }
    let app = spawn_app_with(|s| s.webhooks.allow_http = true).await;
    let org = app.create_org("Acme").await;
    let (receiver, url) = FakeJson::start(|_| Reply::Json(200, json!({})));
    let port = url.rsplit(':').next().unwrap().to_owned();
    // Saved: a name is only resolved when it is called.
    let created = create(
        &app,
        &org,
        json!({"url": format!("http://{host}:{port}/"), "events": ["*"]}),
    )
    .await;
    let id = created["endpointId"].as_str().unwrap().to_owned();
    app.post(
        &format!("/api/webhooks/endpoints/{id}/test"),
        &org.api_key,
        &json!({}),
    )
    .await;
    let mut attempt = Value::Null;
    for _ in 0..60 {
        let log = json_of(
            app.get(&format!("/api/webhooks/endpoints/{id}/deliveries"), &org.api_key)
                .await,
            StatusCode::OK,
        )
        .await;
        attempt = log["deliveries"][0]["attempts"][0].clone();
        if !attempt.is_null() {
            break;
        }
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(attempt["statusCode"], Value::Null, "{attempt}");
    assert!(
        attempt["error"]
            .as_str()
            .unwrap_or_default()
            .contains("allow_private_destinations"),
        "{attempt}"
    );
    assert!(receiver.calls().is_empty(), "the private address was called");
}

/// A receiver answering 204 to everything, and an endpoint of `org` subscribed to `events`
/// pointing at it; answers the receiver and the endpoint's secret.
pub(crate) async fn listening(app: &TestApp, org: &TestOrg, events: Value) -> (FakeJson, String) {
    let (receiver, url) = FakeJson::start(|_| Reply::Json(204, json!({})));
    let created = create(app, org, json!({"url": format!("{url}/in"), "events": events})).await;
    (receiver, created["secret"].as_str().unwrap().to_owned())
}

/// Waits for the receiver's `n`-th delivery; every one verified with the Standard Webhooks
/// reference library. Answers the events, in the order they arrived.
pub(crate) async fn events(receiver: &FakeJson, secret: &str, n: usize) -> Vec<Value> {
    let calls = calls(receiver, n, Duration::from_secs(10)).await;
    let bodies: Vec<Value> = calls.iter().map(|c| c.body.clone()).collect();
    assert!(
        calls.len() >= n,
        "{} of {n} events arrived: {bodies:#?}",
        calls.len()
    );
    for call in &calls {
        assert!(verified(secret, call), "unverified: {:?}", call.headers);
        assert_eq!(call.headers["webhook-id"], call.body["id"].as_str().unwrap());
    }
    bodies
}

pub(crate) fn of_type<'a>(events: &'a [Value], event_type: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == event_type).collect()
}

#[actix_web::test]
async fn job_events_carry_the_job_view_and_only_subscribed_ones_are_sent() {
    use crate::queue::{claim, funded, job, tracer, worker_post};
    let app = local_app().await;
    let (org, project) = funded(&app, "Acme").await;
    let (receiver, secret) = listening(
        &app,
        &org,
        json!(["job.succeeded", "job.failed", "job.blocked", "job.user_stopped"]),
    )
    .await;
    // Another endpoint of the organization listens to successes only.
    let (successes, success_secret) = listening(&app, &org, json!(["job.succeeded"])).await;
    let ids: Vec<String> = futures_util::future::join_all((0..3).map(|_| tracer(&app, &org, &project))).await;
    let stopped = tracer(&app, &org, &project).await;
    assert_eq!(
        app.post(
            &format!("/api/training/jobs/{stopped}/stop"),
            &org.api_key,
            &json!({})
        )
        .await
        .status(),
        StatusCode::OK
    );
    assert_eq!(claim(&app, "w", "tracer", 3).await.len(), 3);
    let reports = [
        (
            "succeeded",
            json!({"job_id": ids[0], "worker_id": "w", "result": {"loss": 0.25}}),
        ),
        (
            "failed",
            json!({"job_id": ids[1], "worker_id": "w", "error": "OOM"}),
        ),
        (
            "blocked",
            json!({"job_id": ids[2], "worker_id": "w", "reason": "needs approval"}),
        ),
    ];
    for (route, body) in reports.clone() {
        assert_eq!(worker_post(&app, route, body).await.status(), StatusCode::OK);
    }
    // A repeated report changes nothing and announces nothing again.
    assert_eq!(
        worker_post(&app, reports[0].0, reports[0].1.clone())
            .await
            .status(),
        StatusCode::OK
    );

    let got = events(&receiver, &secret, 4).await;
    actix_web::rt::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(receiver.calls().len(), 4, "one event per ended job");
    for (event_type, id) in [
        ("job.succeeded", &ids[0]),
        ("job.failed", &ids[1]),
        ("job.blocked", &ids[2]),
        ("job.user_stopped", &stopped),
    ] {
        let found = of_type(&got, event_type);
        assert_eq!(found.len(), 1, "{event_type}: {got:#?}");
        assert_eq!(found[0]["orgId"], org.org_id);
        // The data is the job's view, as the API answers it.
        assert_eq!(found[0]["data"], job(&app, &org, id).await, "{event_type}");
    }
    assert_eq!(
        of_type(&got, "job.succeeded")[0]["data"]["result"],
        json!({"loss": 0.25})
    );
    let only = events(&successes, &success_secret, 1).await;
    assert_eq!(only.len(), 1);
    assert_eq!(only[0]["type"], "job.succeeded");
}

#[actix_web::test]
async fn billing_events_announce_top_ups_declines_low_balances_and_auto_top_ups() {
    let app = local_app().await;
    let org = app.create_org("Acme").await;
    let (receiver, secret) = listening(&app, &org, json!(["*"])).await;
    // A top-up: its ledger entry. From 0 to 10.00 crosses no threshold downwards.
    app.fund(&org, 1000).await;
    let got = events(&receiver, &secret, 1).await;
    assert_eq!(got[0]["type"], "billing.topup.succeeded");
    let ledger = app.billing(&org).await["recentLedger"][0].clone();
    assert_eq!(got[0]["data"], ledger);
    assert_eq!(got[0]["data"]["kind"], "topup");
    assert_eq!(got[0]["data"]["amountMicrocents"], 1_000_000_000i64);

    // A run fee takes the balance under billing.low_balance_cents (10.00): once.
    for run in ["r1", "r2"] {
        let debit = app
            .post(
                "/api/billing/debit",
                &org.api_key,
                &json!({"orgId": org.org_id, "runId": run}),
            )
            .await;
        assert_eq!(debit.status(), StatusCode::OK);
    }
    let got = events(&receiver, &secret, 2).await;
    assert_eq!(
        got[1],
        json!({"id": got[1]["id"], "type": "billing.balance.low", "createdAt": got[1]["createdAt"], "orgId": org.org_id,
               "data": {"balanceMicrocents": 900_000_000i64, "thresholdCents": 1000}})
    );

    // With auto top-up, its threshold is the one: 7.50; the debit from 8.00 to 7.00 crosses
    // it, and
    // the auto top-up that follows is announced with its entry.
    let settings = json!({"orgId": org.org_id, "enabled": true, "thresholdCents": 750, "amountCents": 2000});
    assert_eq!(
        app.put("/api/billing/auto-topup", &org.api_key, &settings)
            .await
            .status(),
        StatusCode::OK
    );
    let debit = app
        .post(
            "/api/billing/debit",
            &org.api_key,
            &json!({"orgId": org.org_id, "runId": "r3"}),
        )
        .await;
    assert_eq!(debit.status(), StatusCode::OK);
    let got = events(&receiver, &secret, 4).await;
    let low = of_type(&got, "billing.balance.low");
    assert_eq!(low.len(), 2, "{got:#?}");
    assert_eq!(
        low[1]["data"],
        json!({"balanceMicrocents": 700_000_000i64, "thresholdCents": 750})
    );
    let auto = of_type(&got, "billing.auto_topup.succeeded");
    assert_eq!(auto.len(), 1, "{got:#?}");
    assert_eq!(auto[0]["data"]["kind"], "auto_topup");
    assert_eq!(auto[0]["data"]["amountMicrocents"], 2_000_000_000i64);
    assert_eq!(auto[0]["data"]["balanceAfterMicrocents"], 2_700_000_000i64);

    // A declined card: the top-up's failure, then an auto top-up's.
    app.save_card(&org, "pm_card_chargeDeclined").await;
    let declined = app.topup(&org, 500).await;
    assert_eq!(declined.status(), StatusCode::PAYMENT_REQUIRED);
    let got = events(&receiver, &secret, 5).await;
    let failed = of_type(&got, "billing.topup.failed");
    assert_eq!(failed.len(), 1, "{got:#?}");
    assert_eq!(failed[0]["data"]["amountCents"], 500);
    assert!(
        failed[0]["data"]["paymentMethod"]
            .as_str()
            .unwrap()
            .starts_with("pm_"),
        "{}",
        failed[0]
    );
    assert!(!failed[0]["data"]["reason"].as_str().unwrap().is_empty());
    let settings = json!({"orgId": org.org_id, "enabled": true, "thresholdCents": 5000, "amountCents": 1000});
    assert_eq!(
        app.put("/api/billing/auto-topup", &org.api_key, &settings)
            .await
            .status(),
        StatusCode::OK
    );
    app.post(
        "/api/billing/debit",
        &org.api_key,
        &json!({"orgId": org.org_id, "runId": "r4"}),
    )
    .await;
    let got = events(&receiver, &secret, 6).await;
    let failed = of_type(&got, "billing.auto_topup.failed");
    assert_eq!(failed.len(), 1, "{got:#?}");
    assert_eq!(failed[0]["data"]["amountCents"], 1000);
    app.assert_ledger_invariant(&org.org_id).await;
}

#[actix_web::test]
async fn nothing_is_written_for_organizations_without_endpoints_or_for_disabled_ones() {
    use sea_orm::{EntityTrait, PaginatorTrait};
    let app = local_app().await;
    let org = app.create_org("Acme").await;
    let (receiver, _) = listening(&app, &org, json!(["*"])).await;
    let id = json_of(
        app.get("/api/webhooks/endpoints", &org.api_key).await,
        StatusCode::OK,
    )
    .await["endpoints"][0]["endpointId"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        patch(&app, &org, &id, json!({"enabled": false})).await.status(),
        StatusCode::OK
    );
    app.fund(&org, 500).await;
    let quiet = app.create_org("Quiet").await;
    app.fund(&quiet, 500).await;
    let db = sea_orm::Database::connect(&app.db_url).await.unwrap();
    assert_eq!(
        entities::outbound_event::Entity::find().count(&db).await.unwrap(),
        0
    );
    db.close().await.ok();
    actix_web::rt::time::sleep(Duration::from_millis(300)).await;
    assert!(receiver.calls().is_empty());
}

#[actix_web::test]
async fn the_openapi_document_describes_every_event_in_its_webhooks_section() {
    let app = spawn_app().await;
    let doc = app.openapi().await;
    let section = doc["webhooks"].as_object().expect("a webhooks section");
    let names: Vec<&str> = section.keys().map(String::as_str).collect();
    let mut expected = keel_core::domain::EventType::ALL
        .map(keel_core::domain::EventType::as_str)
        .to_vec();
    expected.sort();
    assert_eq!(names, expected);
    // What an endpoint may subscribe to is the same list, with `*`.
    let subscribable = doc["components"]["schemas"]["WebhookEventName"]["enum"].clone();
    let mut with_every = vec!["*"];
    with_every.extend(keel_core::domain::EventType::ALL.map(keel_core::domain::EventType::as_str));
    assert_eq!(subscribable, serde_json::json!(with_every));
    // An endpoint may name every event and `*`: the body's bound is that many.
    for body in ["EndpointCreateBody", "EndpointPatchBody"] {
        assert_eq!(
            doc["components"]["schemas"][body]["properties"]["events"]["maxItems"]
                .as_u64()
                .or_else(|| {
                    doc["components"]["schemas"][body]["properties"]["events"]["oneOf"][0]["maxItems"]
                        .as_u64()
                }),
            Some(with_every.len() as u64),
            "{body}"
        );
    }
    assert_eq!(
        doc["components"]["schemas"]["DeliveryStatus"]["enum"],
        serde_json::json!(["pending", "succeeded", "failed"])
    );
    let body =
        |name: &str| section[name]["post"]["requestBody"]["content"]["application/json"]["schema"].clone();
    assert_eq!(
        body("job.failed")["properties"]["data"]["$ref"],
        "#/components/schemas/JobView"
    );
    assert_eq!(
        body("billing.topup.succeeded")["properties"]["data"]["$ref"],
        "#/components/schemas/LedgerEntryView"
    );
    assert_eq!(
        body("billing.balance.low")["properties"]["type"]["const"],
        "billing.balance.low"
    );
    assert_eq!(
        body("webhook.test")["required"],
        json!(["id", "type", "createdAt", "orgId", "data"])
    );
    let headers: Vec<&str> = section["webhook.test"]["post"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(headers, ["webhook-id", "webhook-timestamp", "webhook-signature"]);
    // Every reference resolves.
    for (name, _) in section {
        if let Some(reference) = body(name)["properties"]["data"]["$ref"].as_str() {
            let component = reference.trim_start_matches("#/components/schemas/");
            assert!(doc["components"]["schemas"][component].is_object(), "{reference}");
        }
    }
}

/// The text of the element that starts with `marker`, up to the next tag.
fn text_after<'a>(html: &'a str, marker: &str) -> &'a str {
    let start = html
        .find(marker)
        .unwrap_or_else(|| panic!("{marker} not in:\n{html}"))
        + marker.len();
    &html[start..start + html[start..].find('<').unwrap()]
}

#[actix_web::test]
async fn members_manage_endpoints_in_the_console_and_read_the_delivery_log() {
    use crate::console::Console;
    let app = local_app().await;
    let org = app.create_org("Acme").await;
    let (receiver, url) = FakeJson::start(|_| Reply::Json(200, json!({"note": "<script>alert(1)</script>"})));
    let member = Console::sign_in(&app, &org.member_token).await;
    let page = format!("/console/o/{}/webhooks", org.org_id);
    // Created with its secret shown once, on the page a redirect leads to.
    let created = member
        .post(
            &page,
            &[
                ("url", &format!("{url}/hook")),
                ("events", "job.failed"),
                ("events", "webhook.test"),
                ("description", "<i>ops</i>"),
            ],
        )
        .await;
    assert_eq!(created.status(), StatusCode::SEE_OTHER);
    let shown_at = created.headers()["location"].to_str().unwrap().to_owned();
    let html = member.page(&shown_at).await;
    let secret = text_after(&html, "<code id=\"new-secret\" class=\"secret\">").to_owned();
    assert!(secret.starts_with("whsec_"), "{secret}");
    assert!(html.contains("&#60;i&#62;ops&#60;/i&#62;") && !html.contains("<i>ops"));
    assert!(!member.page(&shown_at).await.contains(&secret), "shown once");
    let listed = json_of(
        app.get("/api/webhooks/endpoints", &org.api_key).await,
        StatusCode::OK,
    )
    .await;
    let id = listed["endpoints"][0]["endpointId"].as_str().unwrap().to_owned();
    assert_eq!(
        listed["endpoints"][0]["events"],
        json!(["job.failed", "webhook.test"])
    );

    // A test event arrives signed with that secret; the log shows it, the answer escaped.
    let html = member.submit(&format!("{page}/{id}/test"), &[]).await;
    assert!(html.contains("Test event queued"), "{html}");
    let got = events(&receiver, &secret, 1).await;
    assert_eq!(got[0]["type"], "webhook.test");
    let mut log = String::new();
    for _ in 0..40 {
        log = member.page(&format!("{page}/{id}")).await;
        if log.contains("<span class=\"status\">succeeded</span>") {
            break;
        }
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        log.contains("<span class=\"status\">succeeded</span>") && log.contains("webhook.test"),
        "{log}"
    );
    assert!(
        log.contains("&#60;script&#62;") && !log.contains("<script>alert"),
        "{log}"
    );
    // Retry from the log: the same webhook-id again.
    let delivery = json_of(
        app.get(&format!("/api/webhooks/endpoints/{id}/deliveries"), &org.api_key)
            .await,
        StatusCode::OK,
    )
    .await["deliveries"][0]["deliveryId"]
        .as_str()
        .unwrap()
        .to_owned();
    let html = member
        .submit(
            &format!("{page}/deliveries/{delivery}/retry"),
            &[("endpoint", &id)],
        )
        .await;
    assert!(html.contains("sent again now"), "{html}");
    let again = calls(&receiver, 2, Duration::from_secs(3)).await;
    assert_eq!(again.len(), 2);
    assert_eq!(again[1].headers["webhook-id"], again[0].headers["webhook-id"]);

    // Disabled, then enabled again.
    let html = member
        .submit(&format!("{page}/{id}/enabled"), &[("enabled", "no")])
        .await;
    assert!(
        html.contains("Endpoint disabled") && html.contains("<span class=\"status\">disabled"),
        "{html}"
    );
    let html = member
        .submit(&format!("{page}/{id}/enabled"), &[("enabled", "yes")])
        .await;
    assert!(html.contains("<span class=\"status\">enabled"), "{html}");

    // A rotation asks first, then shows the new secret once.
    let (asked, html) = member.confirm(&format!("{page}/{id}/rotate"), &[]).await;
    assert!(asked.contains("24 hours"), "{asked}");
    let rotated = text_after(&html, "<code id=\"new-secret\" class=\"secret\">").to_owned();
    assert!(rotated.starts_with("whsec_") && rotated != secret);

    // A bad URL or no event is said on the page; nothing is created.
    // The page answers at once (422), the form holding what was typed.
    let refused = member
        .post(&page, &[("url", "ftp://example.com/x"), ("events", "job.failed")])
        .await;
    assert_eq!(refused.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let html = refused.text().await.unwrap();
    assert!(
        html.contains("flash error") && html.contains(r#"value="ftp://example.com/x""#),
        "{html}"
    );
    let refused = member.post(&page, &[("url", &format!("{url}/other"))]).await;
    assert_eq!(refused.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let html = refused.text().await.unwrap();
    // Said as the API says it (the form is held to the same body), in words.
    assert!(
        html.contains("flash error") && html.contains("events: choose at least one"),
        "{html}"
    );
    let listed = json_of(
        app.get("/api/webhooks/endpoints", &org.api_key).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(listed["endpoints"].as_array().unwrap().len(), 1);

    // Deleted once confirmed.
    let (asked, html) = member.confirm(&format!("{page}/{id}/delete"), &[]).await;
    assert!(asked.contains(&format!("{url}/hook")), "{asked}");
    assert!(
        html.contains("Endpoint deleted.") && html.contains("No endpoints yet."),
        "{html}"
    );

    // Another organization's member finds nothing there.
    let other = app.create_org("Other").await;
    let stranger = Console::sign_in(&app, &other.member_token).await;
    assert_eq!(stranger.get(&page).await.status(), StatusCode::NOT_FOUND);
}

#[actix_web::test]
async fn an_endpoint_failing_for_five_days_is_disabled_and_the_console_says_so() {
    use sea_orm::{ActiveModelTrait, EntityTrait, Set};
    let app = local_app().await;
    let org = app.create_org("Acme").await;
    let (receiver, url) = FakeJson::start(|_| Reply::Json(503, json!({"error": "down"})));
    let created = create(&app, &org, json!({"url": format!("{url}/h"), "events": ["*"]})).await;
    let id = created["endpointId"].as_str().unwrap().to_owned();
    // A first failure starts the streak; a day's worth of failures does not disable.
    act(&app, &org, &id, "test", StatusCode::ACCEPTED).await;
    calls(&receiver, 1, Duration::from_secs(3)).await;
    let db = sea_orm::Database::connect(&app.db_url).await.unwrap();
    let endpoint = || async {
        entities::webhook_endpoint::Entity::find_by_id(id.clone())
            .one(&db)
            .await
            .unwrap()
            .unwrap()
    };
    let mut since = None;
    for _ in 0..40 {
        since = endpoint().await.failing_since;
        if since.is_some() {
            break;
        }
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(since.is_some(), "a failure starts the streak");
    let mut row: entities::webhook_endpoint::ActiveModel = endpoint().await.into();
    row.failing_since = Set(Some(chrono::Utc::now() - chrono::Duration::days(4)));
    row.update(&db).await.unwrap();
    act(&app, &org, &id, "test", StatusCode::ACCEPTED).await;
    calls(&receiver, 2, Duration::from_secs(3)).await;
    actix_web::rt::time::sleep(Duration::from_millis(300)).await;
    assert!(endpoint().await.enabled, "four days of failures: still enabled");
    // Five days and more: the next failure disables it, once, and the console says so.
    let mut row: entities::webhook_endpoint::ActiveModel = endpoint().await.into();
    row.failing_since = Set(Some(
        chrono::Utc::now() - chrono::Duration::days(5) - chrono::Duration::minutes(1),
    ));
    row.update(&db).await.unwrap();
    act(&app, &org, &id, "test", StatusCode::ACCEPTED).await;
    let mut read = Value::Null;
    for _ in 0..60 {
        read = json_of(
            app.get(&format!("/api/webhooks/endpoints/{id}"), &org.api_key)
                .await,
            StatusCode::OK,
        )
        .await;
        if read["enabled"] == false {
            break;
        }
        actix_web::rt::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(read["enabled"], false, "{read}");
    assert_eq!(read["disabledReason"], "every delivery failed for 5 days");
    let member = crate::console::Console::sign_in(&app, &org.member_token).await;
    let html = member.page(&format!("/console/o/{}/webhooks", org.org_id)).await;
    assert!(
        html.contains("was disabled: every delivery failed for 5 days"),
        "{html}"
    );
    let operator = crate::console::Console::sign_in(&app, INTERNAL_KEY).await;
    let failing = operator.page("/console/operator/webhooks").await;
    assert!(
        failing.contains(&format!("{url}/h")) && failing.contains("disabled: every delivery failed"),
        "{failing}"
    );
    // Enabled again: a fresh start (no streak, no reason); a success keeps it clean.
    assert_eq!(
        patch(&app, &org, &id, json!({"enabled": true})).await.status(),
        StatusCode::OK
    );
    let fresh = endpoint().await;
    assert!(fresh.enabled && fresh.failing_since.is_none() && fresh.disabled_reason.is_none());
    db.close().await.ok();
}

#[actix_web::test]
async fn two_instances_never_send_one_delivery_twice_at_once() {
    if !postgres_or_skip() {
        return;
    }
    let first = local_app().await;
    let mut settings = test_settings(&first.db_url);
    settings.webhooks.allow_http = true;
    settings.webhooks.allow_private_destinations = true;
    let second = spawn_on(TestDb::reuse(&first.db_url), settings).await;
    let org = first.create_org("Acme").await;
    // A slow receiver, so that the two dispatchers' claims overlap.
    let (receiver, url) = FakeJson::start(|_| {
        std::thread::sleep(Duration::from_millis(20));
        Reply::Json(200, json!({}))
    });
    // Twelve endpoints, so that none is sent more than its 10 test deliveries a minute
    // (with four, 30 each passed the limit only while every check ran before any insert).
    let mut ids = Vec::new();
    for i in 0..12 {
        let created = create(
            &first,
            &org,
            json!({"url": format!("{url}/{i}"), "events": ["webhook.test"]}),
        )
        .await;
        ids.push(created["endpointId"].as_str().unwrap().to_owned());
    }
    // 120 events, made through both instances at once.
    let sends = (0..120).map(|i| {
        let (app, id, org) = (
            if i % 2 == 0 { &first } else { &second },
            &ids[i % ids.len()],
            &org,
        );
        async move { act(app, org, id, "test", StatusCode::ACCEPTED).await }
    });
    futures_util::future::join_all(sends).await;
    let got = calls(&receiver, 120, Duration::from_secs(30)).await;
    actix_web::rt::time::sleep(Duration::from_millis(1500)).await;
    let got = receiver.calls().len().max(got.len());
    assert_eq!(got, 120, "every delivery once");
    let mut seen = std::collections::HashSet::new();
    for call in receiver.calls() {
        assert!(
            seen.insert(call.headers["webhook-id"].clone()),
            "sent twice: {}",
            call.headers["webhook-id"]
        );
    }
    // Each delivery's log has exactly one attempt.
    for id in &ids {
        let log = json_of(
            first
                .get(
                    &format!("/api/webhooks/endpoints/{id}/deliveries?limit=100"),
                    &org.api_key,
                )
                .await,
            StatusCode::OK,
        )
        .await;
        for delivery in log["deliveries"].as_array().unwrap() {
            assert_eq!(delivery["status"], "succeeded");
            assert_eq!(delivery["attempts"].as_array().unwrap().len(), 1, "{delivery}");
        }
    }
}

/// POSTs `/test` of the endpoint and answers the response.
async fn send_test(app: &TestApp, org: &TestOrg, id: &str) -> reqwest::Response {
    app.post(
        &format!("/api/webhooks/endpoints/{id}/test"),
        &org.api_key,
        &json!({}),
    )
    .await
}

#[actix_web::test]
async fn one_organizations_hanging_endpoints_never_hold_up_anothers_deliveries() {
    let app = local_app().await;
    let stuck = app.create_org("Stuck").await;
    let (_, hanging) = FakeJson::start(|_| Reply::Hang);
    let mut stuck_ids = Vec::new();
    for n in 0..6 {
        let created = create(
            &app,
            &stuck,
            json!({"url": format!("{hanging}/h{n}"), "events": ["*"]}),
        )
        .await;
        stuck_ids.push(created["endpointId"].as_str().unwrap().to_owned());
    }
    // Ten tests a minute per endpoint: 60 deliveries that hang; the eleventh test is 429.
    for id in &stuck_ids {
        for _ in 0..10 {
            assert_eq!(send_test(&app, &stuck, id).await.status(), StatusCode::ACCEPTED);
        }
    }
    let limited = send_test(&app, &stuck, &stuck_ids[0]).await;
    assert_eq!(limited.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = limited.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry_after), "{retry_after}");
    assert_eq!(
        json_of(limited, StatusCode::TOO_MANY_REQUESTS).await["code"],
        "rate_limit_exceeded"
    );
    // Their first deliveries are in flight (held by the hanging receiver).
    actix_web::rt::time::sleep(Duration::from_millis(500)).await;

    // Another organization's delivery goes out at once (CONTRACT: within 2 s).
    let other = app.create_org("Other").await;
    let (receiver, url) = FakeJson::start(|_| Reply::Json(204, json!({})));
    let created = create(&app, &other, json!({"url": url, "events": ["*"]})).await;
    let id = created["endpointId"].as_str().unwrap().to_owned();
    let sent_at = std::time::Instant::now();
    assert_eq!(send_test(&app, &other, &id).await.status(), StatusCode::ACCEPTED);
    let arrived = calls(&receiver, 1, Duration::from_secs(8)).await;
    assert_eq!(arrived.len(), 1);
    let waited = sent_at.elapsed();
    assert!(
        waited < Duration::from_secs(2),
        "another organization's delivery waited {waited:?}"
    );

    // A delivery in flight is not retried by hand (it would be sent twice).
    let log = json_of(
        app.get(
            &format!("/api/webhooks/endpoints/{}/deliveries", stuck_ids[0]),
            &stuck.api_key,
        )
        .await,
        StatusCode::OK,
    )
    .await;
    let in_flight = log["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["deliveryId"].as_str().unwrap().to_owned())
        .collect::<Vec<_>>();
    let mut refused = 0;
    for delivery in &in_flight {
        let retried = app
            .post(
                &format!("/api/webhooks/deliveries/{delivery}/retry"),
                &stuck.api_key,
                &json!({}),
            )
            .await;
        if retried.status() == StatusCode::CONFLICT {
            assert_eq!(
                json_of(retried, StatusCode::CONFLICT).await["code"],
                "delivery_in_flight"
            );
            refused += 1;
        }
    }
    assert!(refused >= 1, "at least the deliveries being sent are refused");
}

#[actix_web::test]
async fn an_organization_has_at_most_twenty_endpoints() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    for n in 0..20 {
        create(
            &app,
            &org,
            json!({"url": format!("https://hooks.example.com/{n}"), "events": ["*"]}),
        )
        .await;
    }
    let more = app
        .post(
            "/api/webhooks/endpoints",
            &org.api_key,
            &json!({"url": "https://hooks.example.com/21", "events": ["*"]}),
        )
        .await;
    assert_eq!(
        json_of(more, StatusCode::CONFLICT).await["code"],
        "endpoint_limit_reached"
    );
    // Another organization is not held by this one's.
    let other = app.create_org("Other").await;
    create(
        &app,
        &other,
        json!({"url": "https://hooks.example.com/x", "events": ["*"]}),
    )
    .await;
}

#[actix_web::test]
async fn every_rotated_out_secret_signs_until_its_own_deadline() {
    let app = local_app().await;
    let org = app.create_org("Acme").await;
    let (receiver, url) = FakeJson::start(|_| Reply::Json(204, json!({})));
    let created = create(&app, &org, json!({"url": url, "events": ["*"]})).await;
    let id = created["endpointId"].as_str().unwrap().to_owned();
    let first = created["secret"].as_str().unwrap().to_owned();
    let once = act(&app, &org, &id, "rotate-secret", StatusCode::OK).await;
    let twice = act(&app, &org, &id, "rotate-secret", StatusCode::OK).await;
    let (second, newest) = (
        once["secret"].as_str().unwrap().to_owned(),
        twice["secret"].as_str().unwrap().to_owned(),
    );
    assert_eq!(send_test(&app, &org, &id).await.status(), StatusCode::ACCEPTED);
    let call = calls(&receiver, 1, Duration::from_secs(5)).await.pop().unwrap();
    assert_eq!(call.headers["webhook-signature"].split(' ').count(), 3);
    for secret in [&first, &second, &newest] {
        assert!(
            verified(secret, &call),
            "a secret rotated out within 24 hours still signs"
        );
    }
    let view = json_of(
        app.get(&format!("/api/webhooks/endpoints/{id}"), &org.api_key)
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(view["previousSecretUntil"], twice["previousSecretUntil"]);
}

#[actix_web::test]
async fn a_410_disables_the_endpoint_and_its_deliveries_wait_until_it_is_enabled() {
    let app = local_app().await;
    let org = app.create_org("Acme").await;
    let gone = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let answer = gone.clone();
    let (receiver, url) = FakeJson::start(move |_| match answer.load(std::sync::atomic::Ordering::SeqCst) {
        true => Reply::Json(410, json!({"error": "gone"})),
        false => Reply::Json(204, json!({})),
    });
    let created = create(&app, &org, json!({"url": url, "events": ["*"]})).await;
    let id = created["endpointId"].as_str().unwrap().to_owned();
    assert_eq!(send_test(&app, &org, &id).await.status(), StatusCode::ACCEPTED);
    let endpoint = |app: &TestApp| {
        let path = format!("/api/webhooks/endpoints/{id}");
        let key = org.api_key.clone();
        let app = app.url("");
        async move {
            reqwest::Client::new()
                .get(format!("{app}{path}"))
                .bearer_auth(key)
                .send()
                .await
                .unwrap()
                .json::<Value>()
                .await
                .unwrap()
        }
    };
    assert!(
        eventually(|| async { endpoint(&app).await["enabled"] == false }).await,
        "a 410 disables the endpoint"
    );
    let view = endpoint(&app).await;
    assert_eq!(view["disabledReason"], "the endpoint answered 410 Gone", "{view}");
    assert_eq!(receiver.calls().len(), 1, "called once, not retried");
    // A delivery made before it was disabled waits, its attempts untouched.
    let db = sea_orm::Database::connect(&app.db_url).await.unwrap();
    let deliveries = || async {
        use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
        entities::webhook_delivery::Entity::find()
            .filter(entities::webhook_delivery::Column::EndpointId.eq(id.as_str()))
            .all(&db)
            .await
            .unwrap()
    };
    let waiting = deliveries().await;
    assert_eq!(waiting.len(), 1);
    assert_eq!((waiting[0].status.as_str(), waiting[0].attempts), ("pending", 1));
    {
        use sea_orm::{ActiveModelTrait, Set};
        // Due now, were it not for the disabled endpoint.
        let mut due: entities::webhook_delivery::ActiveModel = waiting[0].clone().into();
        due.next_attempt_at = Set(Some(chrono::Utc::now() - chrono::Duration::seconds(1)));
        due.update(&db).await.unwrap();
    }
    actix_web::rt::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(receiver.calls().len(), 1);
    assert_eq!(deliveries().await[0].attempts, 1);
    // Enabled again: the receiver is back, and the waiting delivery goes out.
    gone.store(false, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        patch(&app, &org, &id, json!({"enabled": true})).await.status(),
        StatusCode::OK
    );
    assert!(
        eventually(|| async { deliveries().await[0].status == keel_core::domain::DeliveryStatus::Succeeded })
            .await
    );
    assert_eq!(receiver.calls().len(), 2);
    db.close().await.ok();
}

/// A forward proxy that counts the connections made to it and answers each 502.
fn counting_proxy() -> (std::sync::Arc<std::sync::atomic::AtomicUsize>, String) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = count.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            seen.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            use std::io::{Read, Write};
            let mut buf = [0u8; 4096];
            let _ = stream.read(&mut buf);
            let _ = stream
                .write_all(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
        }
    });
    (count, url)
}

#[actix_web::test]
async fn deliveries_never_take_a_proxy_from_the_environment_and_a_configured_one_is_asked_only_for_allowed_destinations(
) {
    use crate::chaos::Instance;
    let (env_proxy, env_proxy_url) = counting_proxy();
    let db = TestDb::new().await;
    // keel with every proxy variable of the environment set: none is used.
    let keel = Instance::started(
        &db.url,
        &[
            ("HTTP_PROXY", env_proxy_url.as_str()),
            ("HTTPS_PROXY", env_proxy_url.as_str()),
            ("ALL_PROXY", env_proxy_url.as_str()),
            ("http_proxy", env_proxy_url.as_str()),
            ("KEEL__WEBHOOKS__ALLOW_HTTP", "true"),
            ("KEEL__WEBHOOKS__ALLOW_PRIVATE_DESTINATIONS", "true"),
        ],
    )
    .await;
    let http = reqwest::Client::new();
    let (_, key) = org_with_key(&http, &keel.base, "Acme").await;
    let (receiver, url) = FakeJson::start(|_| Reply::Json(204, json!({})));
    let created: Value = http
        .post(keel.url("/api/webhooks/endpoints"))
        .bearer_auth(&key)
        .json(&json!({"url": url, "events": ["*"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["endpointId"].as_str().unwrap().to_owned();
    let sent = http
        .post(keel.url(&format!("/api/webhooks/endpoints/{id}/test")))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert_eq!(sent.status(), StatusCode::ACCEPTED);
    assert_eq!(
        calls(&receiver, 1, Duration::from_secs(10)).await.len(),
        1,
        "delivered directly"
    );
    assert_eq!(env_proxy.load(std::sync::atomic::Ordering::SeqCst), 0);
    drop(keel);

    // With webhooks.proxy_url, a destination keel would not call itself never reaches the
    // proxy (this machine's name resolves to a private address); an allowed one does.
    let host = String::from_utf8(std::process::Command::new("hostname").output().unwrap().stdout).unwrap();
    let host = host.trim().to_owned();
    let private = tokio::net::lookup_host((host.as_str(), 0))
        .await
        .is_ok_and(|mut addrs| addrs.all(|a| !keel_core::webhooks::destination::is_public(a.ip())));
    if host.is_empty() || !private {
        say_skipped(&format!(
            "(its proxy_url half) this machine's name ({host:?}) does not resolve to a private address"
        ));
        return;
    }
    let (proxy, proxy_url) = counting_proxy();
    let db = TestDb::new().await;
    let keel = Instance::started(
        &db.url,
        &[
            ("KEEL__WEBHOOKS__PROXY_URL", proxy_url.as_str()),
            ("KEEL__WEBHOOKS__ALLOW_HTTP", "true"),
        ],
    )
    .await;
    let (_, key) = org_with_key(&http, &keel.base, "Acme").await;
    let port = url.rsplit(':').next().unwrap();
    let created: Value = http
        .post(keel.url("/api/webhooks/endpoints"))
        .bearer_auth(&key)
        .json(&json!({"url": format!("http://{host}:{port}/"), "events": ["*"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["endpointId"].as_str().unwrap().to_owned();
    http.post(keel.url(&format!("/api/webhooks/endpoints/{id}/test")))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    let mut attempt = Value::Null;
    for _ in 0..100 {
        let log: Value = http
            .get(keel.url(&format!("/api/webhooks/endpoints/{id}/deliveries")))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        attempt = log["deliveries"][0]["attempts"][0].clone();
        if !attempt.is_null() {
            break;
        }
        actix_web::rt::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        attempt["error"]
            .as_str()
            .unwrap_or_default()
            .contains("allow_private_destinations"),
        "{attempt}"
    );
    assert_eq!(
        proxy.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "the proxy was not asked"
    );
    drop(keel);
    // Private destinations allowed: the delivery goes through the configured proxy.
    let db = TestDb::new().await;
    let keel = Instance::started(
        &db.url,
        &[
            ("KEEL__WEBHOOKS__PROXY_URL", proxy_url.as_str()),
            ("KEEL__WEBHOOKS__ALLOW_HTTP", "true"),
            ("KEEL__WEBHOOKS__ALLOW_PRIVATE_DESTINATIONS", "true"),
        ],
    )
    .await;
    let (_, key) = org_with_key(&http, &keel.base, "Acme").await;
    let created: Value = http
        .post(keel.url("/api/webhooks/endpoints"))
        .bearer_auth(&key)
        .json(&json!({"url": url, "events": ["*"]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = created["endpointId"].as_str().unwrap().to_owned();
    http.post(keel.url(&format!("/api/webhooks/endpoints/{id}/test")))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    assert!(
        eventually(|| async { proxy.load(std::sync::atomic::Ordering::SeqCst) >= 1 }).await,
        "the configured proxy carries the delivery"
    );
}

/// Thirty test sends to one endpoint at once (through two instances on PostgreSQL): ten are
/// taken, the rest are 429, never more than the limit.
#[actix_web::test]
async fn test_sends_at_once_never_pass_the_limit_of_ten_a_minute() {
    let first = local_app().await;
    let second = match postgres() {
        true => {
            let mut settings = test_settings(&first.db_url);
            settings.webhooks.allow_http = true;
            settings.webhooks.allow_private_destinations = true;
            Some(spawn_on(TestDb::reuse(&first.db_url), settings).await)
        }
        false => None,
    };
    let org = first.create_org("Acme").await;
    let (_receiver, url) = FakeJson::start(|_| Reply::Json(200, json!({})));
    let created = create(&first, &org, json!({"url": url, "events": ["webhook.test"]})).await;
    let id = created["endpointId"].as_str().unwrap().to_owned();
    let sends = (0..30).map(|i| {
        let app = match (&second, i % 2) {
            (Some(second), 1) => second,
            _ => &first,
        };
        let (org, id) = (&org, &id);
        async move { send_test(app, org, id).await.status() }
    });
    let statuses = futures_util::future::join_all(sends).await;
    let taken = statuses.iter().filter(|s| **s == StatusCode::ACCEPTED).count();
    let limited = statuses
        .iter()
        .filter(|s| **s == StatusCode::TOO_MANY_REQUESTS)
        .count();
    assert_eq!((taken, limited), (10, 20), "{statuses:?}");
}
