//! Credit grants: every credit is one; debits draw from them in order; the billing view
//! shows the active ones and the next expiry.

use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::helpers::*;

async fn grants(app: &TestApp, org: &TestOrg) -> Vec<Value> {
    json_of(
        app.get(&format!("/api/billing/grants?orgId={}", org.org_id), &org.api_key)
            .await,
        StatusCode::OK,
    )
    .await["grants"]
        .as_array()
        .unwrap()
        .clone()
}

fn days_from_now(value: &Value) -> f64 {
    let at: chrono::DateTime<chrono::Utc> = value.as_str().unwrap().parse().unwrap();
    (at - chrono::Utc::now()).num_minutes() as f64 / (24.0 * 60.0)
}

#[actix_web::test]
async fn a_debit_spanning_three_grants_draws_in_order_and_the_view_shows_what_is_left() {
    let app = spawn_app_with(|s| {
        s.billing.starter_credit_cents = keel_core::domain::Cents(500);
        s.billing.starter_credit_expires_days = 30;
        s.billing.promo_expires_days.insert("WELCOME10".into(), 7);
        s.billing.flat_run_fee_cents = keel_core::domain::Cents(1600);
    })
    .await;
    let org = app.create_org("Acme").await;
    let ok = |r: reqwest::Response| async move {
        assert_eq!(r.status(), StatusCode::OK, "{}", r.text().await.unwrap())
    };
    ok(app
        .post(
            "/api/billing/starter-credit",
            &org.api_key,
            &json!({"orgId": org.org_id}),
        )
        .await)
    .await;
    ok(app
        .post(
            "/api/billing/promo-code",
            &org.api_key,
            &json!({"orgId": org.org_id, "code": "WELCOME10"}),
        )
        .await)
    .await;
    app.fund(&org, 2000).await;

    // Promotional credit first (the promo expires sooner than the starter credit), paid last.
    let listed = grants(&app, &org).await;
    let kinds: Vec<&str> = listed.iter().map(|g| g["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["promo", "starter", "topup"]);
    assert_eq!(listed[0]["priority"], 10);
    assert_eq!(listed[2]["priority"], 50);
    assert!((6.9..=7.0).contains(&days_from_now(&listed[0]["expiresAt"])));
    assert!((29.9..=30.0).contains(&days_from_now(&listed[1]["expiresAt"])));
    assert_eq!(listed[2]["expiresAt"], Value::Null);
    let billing = app.billing(&org).await;
    assert_eq!(billing["balanceMicrocents"], 3_500_000_000i64);
    assert_eq!(billing["grants"].as_array().unwrap().len(), 3);
    assert_eq!(billing["nextExpiry"]["microcents"], 1_000_000_000i64);
    assert_eq!(billing["nextExpiry"]["at"], listed[0]["expiresAt"]);

    // A fee of 16.00: the promo's 10.00, the starter's 5.00, then 1.00 of the top-up.
    let debit = app
        .post(
            "/api/billing/debit",
            &org.api_key,
            &json!({"orgId": org.org_id, "runId": "r1"}),
        )
        .await;
    assert_eq!(debit.status(), StatusCode::OK);
    let listed = grants(&app, &org).await;
    let left: Vec<(&str, i64)> = listed
        .iter()
        .map(|g| {
            (
                g["kind"].as_str().unwrap(),
                g["remainingMicrocents"].as_i64().unwrap(),
            )
        })
        .collect();
    // The active one first; the spent ones after it, newest first.
    assert_eq!(left, [("topup", 1_900_000_000), ("promo", 0), ("starter", 0)]);
    assert_eq!(listed[1]["originalMicrocents"], 1_000_000_000i64);
    let billing = app.billing(&org).await;
    assert_eq!(billing["balanceMicrocents"], 1_900_000_000i64);
    let active: Vec<&str> = billing["grants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["kind"].as_str().unwrap())
        .collect();
    assert_eq!(active, ["topup"]);
    assert_eq!(billing["nextExpiry"], Value::Null, "what is left never expires");

    // The ledger row of the fee records the three draws, in order.
    use sea_orm::{EntityTrait, QueryOrder};
    let db = sea_orm::Database::connect(&app.db_url).await.unwrap();
    let fee = entities::ledger_entry::Entity::find()
        .order_by_desc(entities::ledger_entry::Column::Id)
        .one(&db)
        .await
        .unwrap()
        .unwrap();
    let draws: Vec<Value> = serde_json::from_str(fee.grants.as_deref().unwrap()).unwrap();
    let amounts: Vec<i64> = draws.iter().map(|d| d["microcents"].as_i64().unwrap()).collect();
    assert_eq!(amounts, [-1_000_000_000, -500_000_000, -100_000_000]);
    let ids: Vec<&str> = draws.iter().map(|d| d["grantId"].as_str().unwrap()).collect();
    assert_eq!(
        ids,
        [
            listed[1]["grantId"].as_str().unwrap(),
            listed[2]["grantId"].as_str().unwrap(),
            listed[0]["grantId"].as_str().unwrap()
        ]
    );
    db.close().await.ok();
    app.assert_ledger_invariant(&org.org_id).await;

    // Another organization's grants are not this key's to read.
    let other = app.create_org("Other").await;
    let refused = app
        .get(
            &format!("/api/billing/grants?orgId={}", other.org_id),
            &org.api_key,
        )
        .await;
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
}

/// A database from before credit grants: each positive balance becomes one `migrated` grant
/// (paid priority, never expires); a negative balance stays an overdraft, paid first by the
/// next credit.
#[actix_web::test]
async fn balances_from_before_grants_become_one_migrated_grant_each() {
    use migration::{Migrator, MigratorTrait};
    use sea_orm::{ConnectionTrait, Statement};
    let db_handle = TestDb::new().await;
    let db = sea_orm::Database::connect(&db_handle.url).await.unwrap();
    // Every migration before the one that brought grants.
    let before_grants = Migrator::migrations()
        .iter()
        .position(|m| m.name() == "m20261126_000009_credit_grants")
        .expect("the grants migration") as u32;
    Migrator::up(&db, Some(before_grants)).await.unwrap();
    let backend = db.get_database_backend();
    let (rich, poor) = (uuid::Uuid::new_v4().to_string(), uuid::Uuid::new_v4().to_string());
    let now = chrono::Utc::now();
    for (id, balance) in [(&rich, 1_234_000_000i64), (&poor, -50_000_000)] {
        let sql = match backend {
            sea_orm::DbBackend::Postgres => [
                "INSERT INTO organizations (id, name, slug, created_at) VALUES ($1, $2, $3, $4)",
                "INSERT INTO billing_accounts (org_id, balance_microcents, auto_topup_enabled, auto_topup_declines, \
                 starter_credit_granted, created_at, updated_at) VALUES ($1, $2, false, 0, false, $3, $3)",
            ],
            _ => [
                "INSERT INTO organizations (id, name, slug, created_at) VALUES (?, ?, ?, ?)",
                "INSERT INTO billing_accounts (org_id, balance_microcents, auto_topup_enabled, auto_topup_declines, \
                 starter_credit_granted, created_at, updated_at) VALUES (?, ?, false, 0, false, ?, ?)",
            ],
        };
        db.execute_raw(Statement::from_sql_and_values(
            backend,
            sql[0],
            [
                id.as_str().into(),
                "Old".into(),
                format!("old-{id}").into(),
                now.into(),
            ],
        ))
        .await
        .unwrap();
        let values: Vec<sea_orm::Value> = match backend {
            sea_orm::DbBackend::Postgres => vec![id.as_str().into(), balance.into(), now.into()],
            _ => vec![id.as_str().into(), balance.into(), now.into(), now.into()],
        };
        db.execute_raw(Statement::from_sql_and_values(backend, sql[1], values))
            .await
            .unwrap();
    }
    Migrator::up(&db, None).await.unwrap();
    let mut keys = std::collections::HashMap::new();
    for id in [&rich, &poor] {
        let org_id = keel_core::domain::OrgId::parse(id).unwrap();
        let key = keel_core::fixtures::insert_key(&db, &org_id, Some("test"), &Default::default())
            .await
            .unwrap();
        keys.insert(id.clone(), key.secret);
    }
    db.close().await.ok();

    let app = spawn_on(TestDb::reuse(&db_handle.url), test_settings(&db_handle.url)).await;
    let rows = |org: &str| {
        let (app, key, org) = (&app, keys[org].clone(), org.to_owned());
        async move {
            json_of(
                app.get(&format!("/api/billing/grants?orgId={org}"), &key).await,
                StatusCode::OK,
            )
            .await["grants"]
                .as_array()
                .unwrap()
                .clone()
        }
    };
    let migrated = rows(&rich).await;
    assert_eq!(migrated.len(), 1);
    assert_eq!(migrated[0]["kind"], "migrated");
    assert_eq!(migrated[0]["remainingMicrocents"], 1_234_000_000i64);
    assert_eq!(migrated[0]["originalMicrocents"], 1_234_000_000i64);
    assert_eq!(migrated[0]["priority"], 50);
    assert_eq!(migrated[0]["expiresAt"], Value::Null);
    assert!(rows(&poor).await.is_empty(), "an overdraft is no grant");
    // The next credit of the overdrawn organization pays its overdraft first.
    let credited = app
        .post(
            "/api/billing/starter-credit",
            &keys[&poor],
            &json!({"orgId": poor}),
        )
        .await;
    assert_eq!(
        credited.status(),
        StatusCode::OK,
        "{}",
        credited.text().await.unwrap()
    );
    let starter = rows(&poor).await;
    assert_eq!(starter[0]["kind"], "starter");
    assert_eq!(starter[0]["originalMicrocents"], 500_000_000i64);
    assert_eq!(
        starter[0]["remainingMicrocents"], 450_000_000i64,
        "0.50 paid the overdraft"
    );
    drop(db_handle);
}

#[actix_web::test]
async fn a_lapsed_grant_expires_once_into_an_expiry_entry_and_both_events_are_sent() {
    use crate::fakes::{FakeJson, Reply};
    use sea_orm::{ActiveModelTrait, EntityTrait, Set};
    let app = spawn_app_with(|s| {
        s.billing.promo_expires_days.insert("WELCOME10".into(), 7);
        s.billing.expiry_sweep_secs = 1;
        s.webhooks.allow_http = true;
        s.webhooks.allow_private_destinations = true;
    })
    .await;
    let org = app.create_org("Acme").await;
    let (receiver, url) = FakeJson::start(|_| Reply::Json(204, json!({})));
    let created = app
        .post(
            "/api/webhooks/endpoints",
            &org.api_key,
            &json!({"url": format!("{url}/in"), "events": ["billing.credit.expiring", "billing.credit.expired"]}),
        )
        .await;
    assert_eq!(created.status(), StatusCode::CREATED);
    app.post(
        "/api/billing/promo-code",
        &org.api_key,
        &json!({"orgId": org.org_id, "code": "WELCOME10"}),
    )
    .await;
    app.fund(&org, 500).await;
    let fee = app
        .post(
            "/api/billing/debit",
            &org.api_key,
            &json!({"orgId": org.org_id, "runId": "r1"}),
        )
        .await;
    assert_eq!(fee.status(), StatusCode::OK);
    let promo = grants(&app, &org).await[0].clone();
    assert_eq!(
        (promo["kind"].as_str(), promo["remainingMicrocents"].as_i64()),
        (Some("promo"), Some(900_000_000))
    );

    // Within 7 days of its expiry: announced once.
    assert!(
        eventually(|| async { receiver.calls().len() == 1 }).await,
        "billing.credit.expiring sent"
    );
    let expiring = &receiver.calls()[0].body;
    assert_eq!(expiring["type"], "billing.credit.expiring");
    assert_eq!(expiring["data"]["grantId"], promo["grantId"]);
    assert_eq!(expiring["data"]["remainingMicrocents"], 900_000_000i64);

    // Its time comes: the remainder becomes one expiry entry.
    let db = sea_orm::Database::connect(&app.db_url).await.unwrap();
    let id = promo["grantId"].as_str().unwrap().to_owned();
    let mut row: entities::credit_grant::ActiveModel = entities::credit_grant::Entity::find_by_id(id.clone())
        .one(&db)
        .await
        .unwrap()
        .unwrap()
        .into();
    row.expires_at = Set(Some(chrono::Utc::now() - chrono::Duration::minutes(1)));
    row.update(&db).await.unwrap();
    assert!(
        eventually(|| async { app.balance_microcents(&org).await == 500_000_000 }).await,
        "the promo's 9.00 expired"
    );
    assert!(
        eventually(|| async { receiver.calls().len() == 2 }).await,
        "billing.credit.expired sent"
    );
    let expired = &receiver.calls()[1].body;
    assert_eq!(expired["type"], "billing.credit.expired");
    assert_eq!(
        expired["data"],
        json!({"grantId": id, "expiredMicrocents": 900_000_000i64})
    );
    let ledger = app.billing(&org).await["recentLedger"].clone();
    assert_eq!(ledger[0]["kind"], "expiry");
    assert_eq!(ledger[0]["amountMicrocents"], -900_000_000i64);
    let grant = entities::credit_grant::Entity::find_by_id(id.clone())
        .one(&db)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(grant.remaining_microcents.get(), 0);
    assert!(grant.expired_at.is_some());
    // Later passes change nothing: one entry, one event of each.
    actix_web::rt::time::sleep(std::time::Duration::from_millis(2500)).await;
    assert_eq!(app.balance_microcents(&org).await, 500_000_000);
    assert_eq!(receiver.calls().len(), 2);
    let (_, entries) = app.assert_ledger_invariant(&org.org_id).await;
    assert_eq!(entries, 4, "promo, top-up, fee, expiry");
    let metrics = app.metrics_text().await;
    assert!(
        metrics.contains("keel_credit_grants_expired_total 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("keel_credit_expired_microcents_total 900000000"),
        "{metrics}"
    );
    db.close().await.ok();
}

/// An operator's grant of `cents` that expires `seconds` from now.
async fn grant_expiring(app: &TestApp, org: &TestOrg, cents: i64, seconds: i64) -> Value {
    let body = json!({"orgId": org.org_id, "amountCents": cents, "reason": "short-lived",
        "expiresAt": (chrono::Utc::now() + chrono::Duration::seconds(seconds)).to_rfc3339()});
    let response = app
        .request(
            reqwest::Method::POST,
            "/api/internal/billing/grants",
            Some(INTERNAL_KEY),
        )
        .header("Idempotency-Key", uuid::Uuid::new_v4().to_string())
        .json(&body)
        .send()
        .await
        .unwrap();
    json_of(response, StatusCode::CREATED).await
}

#[actix_web::test]
async fn a_grant_past_its_expiry_is_never_drawn_nor_shown_though_no_sweep_ran() {
    // The sweep would come only in an hour: operations and reads end lapsed grants themselves.
    let app = spawn_app_with(|s| s.billing.expiry_sweep_secs = 3600).await;
    let org = app.create_org("Acme").await;
    app.fund(&org, 500).await;
    let soon = grant_expiring(&app, &org, 300, 2).await;
    assert_eq!(app.balance_microcents(&org).await, 800_000_000);
    let billing = app.billing(&org).await;
    assert_eq!(billing["nextExpiry"]["microcents"], 300_000_000i64);
    actix_web::rt::time::sleep(std::time::Duration::from_millis(2200)).await;

    // A run fee after its expiry draws from the top-up, not from the lapsed grant.
    let fee = app
        .post(
            "/api/billing/debit",
            &org.api_key,
            &json!({"orgId": org.org_id, "runId": "r1"}),
        )
        .await;
    let fee = json_of(fee, StatusCode::OK).await;
    assert_eq!(fee["balanceCents"], 400, "{fee}");
    let billing = app.billing(&org).await;
    assert_eq!(billing["balanceMicrocents"], 400_000_000i64);
    assert!(billing["nextExpiry"].is_null(), "{billing}");
    let kinds: Vec<&str> = billing["recentLedger"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["run_fee", "expiry", "manual", "topup"]);
    assert_eq!(billing["recentLedger"][1]["amountMicrocents"], -300_000_000i64);
    let ended = grants(&app, &org)
        .await
        .into_iter()
        .find(|g| g["grantId"] == soon["grantId"])
        .unwrap();
    assert_eq!(ended["remainingMicrocents"], 0, "{ended}");

    // A read alone (no operation) ends a lapsed grant too: the balance shown is the one
    // checked, and nextExpiry never names a past time.
    grant_expiring(&app, &org, 200, 2).await;
    actix_web::rt::time::sleep(std::time::Duration::from_millis(2200)).await;
    let billing = app.billing(&org).await;
    assert_eq!(billing["balanceMicrocents"], 400_000_000i64, "{billing}");
    assert!(billing["nextExpiry"].is_null(), "{billing}");
    assert_eq!(billing["recentLedger"][0]["kind"], "expiry");
    // Read again: nothing more is written (one expiry entry per grant).
    app.billing(&org).await;
    let (balance, entries) = app.assert_ledger_invariant(&org.org_id).await;
    assert_eq!((balance, entries), (400_000_000, 6));
    ledger_invariant_in_time(&app.db_url, &org.org_id).await;
    let metrics = app.metrics_text().await;
    assert_eq!(metric(&metrics, "keel_credit_grants_expired_total"), 2.0);
    assert_eq!(
        metric(&metrics, "keel_credit_expired_microcents_total"),
        500_000_000.0
    );
}

#[actix_web::test]
async fn concurrent_charges_and_a_busy_sweep_never_draw_expired_credit_and_expire_it_once() {
    let app = spawn_app_with(|s| {
        s.billing.expiry_sweep_secs = 1;
        s.billing.flat_run_fee_cents = keel_core::domain::Cents(1);
    })
    .await;
    let org = app.create_org("Acme").await;
    app.fund(&org, 5000).await;
    for seconds in [1, 2, 3] {
        grant_expiring(&app, &org, 1000, seconds).await;
    }
    // Twelve chargers for four seconds, across the three expiries and the sweep's passes.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(4);
    let chargers = (0..12).map(|c| {
        let (app, org) = (&app, &org);
        async move {
            let mut n = 0;
            while std::time::Instant::now() < until {
                let fee = app
                    .post(
                        "/api/billing/debit",
                        &org.api_key,
                        &json!({"orgId": org.org_id, "runId": format!("c{c}-{n}")}),
                    )
                    .await;
                assert!(
                    matches!(fee.status(), StatusCode::OK | StatusCode::PAYMENT_REQUIRED),
                    "{}",
                    fee.status()
                );
                n += 1;
                actix_web::rt::time::sleep(std::time::Duration::from_millis(20)).await;
            }
        }
    });
    futures_util::future::join_all(chargers).await;
    assert!(
        eventually(|| async { app.billing(&org).await["nextExpiry"].is_null() }).await,
        "every short grant ended"
    );
    // No entry drew from a grant after its expiry, each grant's draws come to what remains,
    // and balance = sum of entries.
    ledger_invariant_in_time(&app.db_url, &org.org_id).await;
    let manual: Vec<Value> = grants(&app, &org)
        .await
        .into_iter()
        .filter(|g| g["kind"] == "manual")
        .collect();
    assert_eq!(manual.len(), 3);
    assert!(manual.iter().all(|g| g["remainingMicrocents"] == 0), "{manual:?}");
    // One expiry entry per grant that still held something, whoever wrote it.
    use sea_orm::{ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter};
    let db = sea_orm::Database::connect(&app.db_url).await.unwrap();
    let expiries = entities::ledger_entry::Entity::find()
        .filter(entities::ledger_entry::Column::OrgId.eq(org.org_id.as_str()))
        .filter(entities::ledger_entry::Column::Kind.eq(keel_core::domain::EntryKind::Expiry))
        .count(&db)
        .await
        .unwrap();
    db.close().await.ok();
    assert!(expiries >= 1, "the chargers left something to expire");
    let metrics = app.metrics_text().await;
    assert_eq!(
        metric(&metrics, "keel_credit_grants_expired_total"),
        expiries as f64
    );
}

#[actix_web::test]
async fn operators_grant_by_hand_once_per_key_with_reason_and_maker() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let grant = |key: Option<&str>, body: Value| {
        let mut request = app
            .request(
                reqwest::Method::POST,
                "/api/internal/billing/grants",
                Some(INTERNAL_KEY),
            )
            .json(&body);
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        request.send()
    };
    let body = json!({"orgId": org.org_id, "amountCents": 2500, "reason": "refund: the outage", "priority": 5,
        "expiresAt": (chrono::Utc::now() + chrono::Duration::days(30)).to_rfc3339()});
    let made = json_of(
        grant(Some("g-1"), body.clone()).await.unwrap(),
        StatusCode::CREATED,
    )
    .await;
    assert_eq!(made["kind"], "manual");
    assert_eq!(made["originalMicrocents"], 2_500_000_000i64);
    assert_eq!(made["priority"], 5);
    assert_eq!(made["reason"], "refund: the outage");
    let maker = made["createdBy"].as_str().unwrap();
    assert!(
        maker.starts_with("internal:") && maker.len() == "internal:".len() + 12,
        "{maker}"
    );
    assert!(!maker.contains(INTERNAL_KEY));
    // A repeat answers the original, and credits nothing more.
    let again = json_of(
        grant(Some("g-1"), body.clone()).await.unwrap(),
        StatusCode::CREATED,
    )
    .await;
    assert_eq!(again["grantId"], made["grantId"]);
    assert_eq!(app.balance_microcents(&org).await, 2_500_000_000);
    assert_eq!(app.billing(&org).await["recentLedger"][0]["kind"], "manual");
    assert_eq!(
        app.billing(&org).await["recentLedger"][0]["reason"],
        "refund: the outage"
    );
    // The same key with another body: 409; nothing written.
    let mut other = body.clone();
    other["amountCents"] = json!(2600);
    assert_error(grant(Some("g-1"), other).await.unwrap(), StatusCode::CONFLICT).await;
    assert_eq!(app.balance_microcents(&org).await, 2_500_000_000);
    // Bad input: 422 naming what; a missing key is 422 too.
    let issues = validation_issues(grant(None, body.clone()).await.unwrap()).await;
    assert_eq!(issues[0]["loc"], json!(["header", "Idempotency-Key"]));
    for (field, value) in [
        ("expiresAt", json!("2020-01-01T00:00:00Z")),
        ("amountCents", json!(0)),
        ("priority", json!(-1)),
    ] {
        let mut bad = body.clone();
        bad[field] = value;
        let issues = validation_issues(grant(Some("g-2"), bad).await.unwrap()).await;
        assert_eq!(issues[0]["loc"], json!(["body", field]), "{field}: {issues:?}");
    }
    // Not for members; an unknown organization is 404.
    let refused = app
        .request(
            reqwest::Method::POST,
            "/api/internal/billing/grants",
            Some(&org.api_key),
        )
        .header("Idempotency-Key", "g-3")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::FORBIDDEN);
    let mut unknown = body.clone();
    unknown["orgId"] = json!(uuid::Uuid::new_v4().to_string());
    assert_error(grant(Some("g-4"), unknown).await.unwrap(), StatusCode::NOT_FOUND).await;
    app.assert_ledger_invariant(&org.org_id).await;
}

/// Last month's first day at noon (UTC).
fn last_month() -> chrono::DateTime<chrono::Utc> {
    use chrono::Datelike;
    let now = chrono::Utc::now();
    let first = now.date_naive().with_day(1).unwrap();
    (first - chrono::Duration::days(1))
        .with_day(15)
        .unwrap()
        .and_hms_opt(12, 0, 0)
        .unwrap()
        .and_utc()
}

async fn statement(app: &TestApp, org: &TestOrg, month: &str) -> Value {
    json_of(
        app.get(
            &format!("/api/billing/statement?orgId={}&month={month}", org.org_id),
            &org.api_key,
        )
        .await,
        StatusCode::OK,
    )
    .await
}

#[actix_web::test]
async fn a_credit_expiring_mid_month_leaves_the_balance_and_the_statements_consistent() {
    use sea_orm::{ActiveModelTrait, ColumnTrait, EntityTrait, QueryFilter, Set};
    let app = spawn_app_with(|s| {
        s.billing.promo_expires_days.insert("WELCOME10".into(), 30);
        s.billing.expiry_sweep_secs = 1;
    })
    .await;
    let org = app.create_org("Acme").await;
    app.post(
        "/api/billing/promo-code",
        &org.api_key,
        &json!({"orgId": org.org_id, "code": "WELCOME10"}),
    )
    .await;
    let db = sea_orm::Database::connect(&app.db_url).await.unwrap();
    // The promo was credited last month.
    let promo_entry = entities::ledger_entry::Entity::find()
        .filter(
            entities::ledger_entry::Column::OrgId.eq(keel_core::domain::OrgId::parse(&org.org_id).unwrap()),
        )
        .one(&db)
        .await
        .unwrap()
        .unwrap();
    let mut row: entities::ledger_entry::ActiveModel = promo_entry.into();
    row.created_at = Set(last_month());
    row.update(&db).await.unwrap();
    app.fund(&org, 500).await;
    app.post(
        "/api/billing/debit",
        &org.api_key,
        &json!({"orgId": org.org_id, "runId": "r1"}),
    )
    .await;
    // This month the promo lapses with 9.00 left.
    let promo = grants(&app, &org)
        .await
        .into_iter()
        .find(|g| g["kind"] == "promo")
        .unwrap();
    let mut grant: entities::credit_grant::ActiveModel =
        entities::credit_grant::Entity::find_by_id(promo["grantId"].as_str().unwrap().to_owned())
            .one(&db)
            .await
            .unwrap()
            .unwrap()
            .into();
    grant.expires_at = Set(Some(chrono::Utc::now() - chrono::Duration::seconds(1)));
    grant.update(&db).await.unwrap();
    assert!(eventually(|| async { app.balance_microcents(&org).await == 500_000_000 }).await);
    db.close().await.ok();

    let previous = last_month().format("%Y-%m").to_string();
    let current = chrono::Utc::now().format("%Y-%m").to_string();
    assert_eq!(
        statement(&app, &org, &previous).await,
        json!({"month": previous, "openingMicrocents": 0, "credits": {"promo": 1_000_000_000i64}, "debits": {},
               "expiredMicrocents": 0, "closingMicrocents": 1_000_000_000i64})
    );
    assert_eq!(
        statement(&app, &org, &current).await,
        json!({"month": current, "openingMicrocents": 1_000_000_000i64, "credits": {"topup": 500_000_000i64},
               "debits": {"run_fee": 100_000_000i64}, "expiredMicrocents": 900_000_000i64,
               "closingMicrocents": 500_000_000i64})
    );
    assert_eq!(app.balance_microcents(&org).await, 500_000_000);
    app.assert_ledger_invariant(&org.org_id).await;
    // A month with nothing in it opens and closes on the balance before it.
    let empty = statement(&app, &org, "2001-01").await;
    assert_eq!(
        (
            empty["openingMicrocents"].clone(),
            empty["closingMicrocents"].clone()
        ),
        (json!(0), json!(0))
    );

    // Bad months and dates: 422 naming the parameter (one issue for a month).
    for (route, query, field) in [
        ("statement", "month=2026-13", "month"),
        ("statement", "month=2026-1", "month"),
        ("statement", "month=", "month"),
        ("statement", "", "month"),
        ("ledger.csv", "from=yesterday", "from"),
        ("ledger.csv", "to=2026-02-30T00:00:00Z", "to"),
    ] {
        let path = format!("/api/billing/{route}?orgId={}&{query}", org.org_id);
        let issues = validation_issues(app.get(&path, &org.api_key).await).await;
        assert_eq!(issues[0]["loc"], json!(["query", field]), "{query}: {issues:?}");
        assert!(route != "statement" || issues.len() == 1, "{query}: {issues:?}");
    }
}

#[actix_web::test]
async fn the_ledger_csv_streams_every_one_of_100000_rows() {
    use sea_orm::EntityTrait;
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let org_id = keel_core::domain::OrgId::parse(&org.org_id).unwrap();
    let db = sea_orm::Database::connect(&app.db_url).await.unwrap();
    let start = chrono::Utc::now() - chrono::Duration::days(3);
    let mut balance = 0i64;
    for chunk in 0..100 {
        let rows: Vec<entities::ledger_entry::ActiveModel> = (0..1000)
            .map(|i| {
                let n = chunk * 1000 + i;
                let amount = if n % 3 == 0 { 1_234_567 } else { -345_678 };
                balance += amount;
                entities::ledger_entry::ActiveModel {
                    org_id: sea_orm::Set(org_id.clone()),
                    kind: sea_orm::Set(if amount > 0 {
                        keel_core::domain::EntryKind::Manual
                    } else {
                        keel_core::domain::EntryKind::RunFee
                    }),
                    amount_microcents: sea_orm::Set(keel_core::domain::Microcents(amount)),
                    balance_after_microcents: sea_orm::Set(keel_core::domain::Microcents(balance)),
                    idempotency_key: sea_orm::Set(None),
                    reason: sea_orm::Set(if n == 7 {
                        "a \"quoted\", reason\nover two lines".into()
                    } else {
                        format!("row {n}")
                    }),
                    created_at: sea_orm::Set(start + chrono::Duration::milliseconds(n as i64)),
                    grants: sea_orm::Set(None),
                    ..Default::default()
                }
            })
            .collect();
        entities::ledger_entry::Entity::insert_many(rows)
            .exec_without_returning(&db)
            .await
            .unwrap();
    }
    db.close().await.ok();
    let response = app
        .get(
            &format!("/api/billing/ledger.csv?orgId={}", org.org_id),
            &org.api_key,
        )
        .await;
    assert_eq!(response.status(), StatusCode::OK);
    assert!(response.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/csv"));
    // Streamed: sent in chunks, its length not known before.
    assert!(response.headers().get("content-length").is_none());
    let body = response.bytes().await.unwrap();
    let mut reader = csv::Reader::from_reader(body.as_ref());
    assert_eq!(
        reader.headers().unwrap().iter().collect::<Vec<_>>(),
        [
            "id",
            "created_at",
            "kind",
            "amount_cents",
            "balance_after_cents",
            "reason",
            "idempotency_key"
        ]
    );
    let mut rows = 0;
    let mut sum = 0i64;
    let mut last_id = 0i64;
    for record in reader.records() {
        let record = record.unwrap();
        let id: i64 = record[0].parse().unwrap();
        assert!(id > last_id, "oldest first, each once");
        last_id = id;
        let (whole, micros) = record[3].trim_start_matches('-').split_once('.').unwrap();
        assert_eq!(micros.len(), 6);
        let value = whole.parse::<i64>().unwrap() * 1_000_000 + micros.parse::<i64>().unwrap();
        sum += if record[3].starts_with('-') { -value } else { value };
        if rows == 7 {
            assert_eq!(&record[5], "a \"quoted\", reason\nover two lines");
        }
        rows += 1;
    }
    assert_eq!(rows, 100_000);
    assert_eq!(
        sum, balance,
        "the amounts add up to the balance, to the microcent"
    );
    // A window: from and to.
    let from = (start + chrono::Duration::seconds(10)).to_rfc3339();
    let to = (start + chrono::Duration::seconds(20)).to_rfc3339();
    let windowed = app
        .request(
            reqwest::Method::GET,
            "/api/billing/ledger.csv",
            Some(&org.api_key),
        )
        .query(&[("orgId", org.org_id.as_str()), ("from", &from), ("to", &to)])
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(
        windowed.lines().count(),
        1 + 10_000,
        "10 s of rows, one a millisecond"
    );
}

#[actix_web::test]
async fn a_monthly_cap_stops_the_auto_top_up_that_would_pass_it_and_says_so_once() {
    use crate::fakes::{FakeJson, Reply};
    let app = spawn_app_with(|s| {
        s.billing.flat_run_fee_cents = keel_core::domain::Cents(500);
        s.webhooks.allow_http = true;
        s.webhooks.allow_private_destinations = true;
    })
    .await;
    let org = app.create_org("Acme").await;
    let (receiver, url) = FakeJson::start(|_| Reply::Json(204, json!({})));
    app.post(
        "/api/webhooks/endpoints",
        &org.api_key,
        &json!({"url": format!("{url}/in"), "events": ["billing.auto_topup.limit_reached"]}),
    )
    .await;
    app.fund(&org, 1000).await;
    let settings = json!({"orgId": org.org_id, "enabled": true, "thresholdCents": 950, "amountCents": 1000,
        "monthlyLimitCents": 2500});
    let saved = json_of(
        app.put("/api/billing/auto-topup", &org.api_key, &settings).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(saved["monthlyLimitCents"], 2500);
    assert_eq!(saved["chargedThisMonthCents"], 0);
    let fee = |run: String| {
        let app = &app;
        let org_id = org.org_id.clone();
        let key = org.api_key.clone();
        async move {
            app.post(
                "/api/billing/debit",
                &key,
                &json!({"orgId": org_id, "runId": run}),
            )
            .await
        }
    };
    let balance_is = |cents: i64| {
        let app = &app;
        let org = &org;
        async move { eventually(|| async { app.balance_microcents(org).await == cents * 1_000_000 }).await }
    };
    // 10.00 → 5.00: under 9.50, one auto top-up of 10.00; twice.
    assert_eq!(fee("r1".into()).await.status(), StatusCode::OK);
    assert!(balance_is(1500).await, "the first auto top-up");
    assert_eq!(fee("r2".into()).await.status(), StatusCode::OK);
    assert_eq!(fee("r3".into()).await.status(), StatusCode::OK);
    assert!(balance_is(1500).await, "the second auto top-up");
    // The third would charge 30.00 this month, past the cap of 25.00: none.
    assert_eq!(fee("r4".into()).await.status(), StatusCode::OK);
    assert_eq!(fee("r5".into()).await.status(), StatusCode::OK);
    assert!(balance_is(500).await);
    assert!(
        eventually(|| async { receiver.calls().len() == 1 }).await,
        "limit_reached sent"
    );
    let event = &receiver.calls()[0].body;
    assert_eq!(event["type"], "billing.auto_topup.limit_reached");
    assert_eq!(event["data"]["monthlyLimitCents"], 2500);
    assert_eq!(event["data"]["chargedCents"], 2000);
    actix_web::rt::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(app.balance_microcents(&org).await, 500_000_000, "no third charge");
    let billing = app.billing(&org).await;
    assert_eq!(billing["autoTopup"]["chargedThisMonthCents"], 2000);
    // As if auto top-up were off: a fee past the balance is refused, an estimate is not covered.
    assert_eq!(fee("r6".into()).await.status(), StatusCode::OK);
    assert_eq!(fee("r7".into()).await.status(), StatusCode::PAYMENT_REQUIRED);
    let precheck = app
        .post(
            "/api/billing/training-usage/precheck",
            INTERNAL_KEY,
            &json!({"orgId": org.org_id, "estimateCents": 400}),
        )
        .await;
    assert_eq!(precheck.status(), StatusCode::PAYMENT_REQUIRED);
    // Said once a month, however often the cap stops a charge.
    actix_web::rt::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert_eq!(receiver.calls().len(), 1);
    let metrics = app.metrics_text().await;
    assert!(
        metric(&metrics, "keel_auto_topup_limit_reached_total") >= 1.0,
        "{metrics}"
    );
    // Raising the cap lets it charge again.
    let mut raised = settings.clone();
    raised["monthlyLimitCents"] = json!(5000);
    assert_eq!(
        app.put("/api/billing/auto-topup", &org.api_key, &raised)
            .await
            .status(),
        StatusCode::OK
    );
    // The next refused fee finds the balance under the threshold: the third auto top-up now.
    assert_eq!(fee("r8".into()).await.status(), StatusCode::PAYMENT_REQUIRED);
    assert!(balance_is(1000).await, "charged under the raised cap");
    assert_eq!(
        app.billing(&org).await["autoTopup"]["chargedThisMonthCents"],
        3000
    );
    app.assert_ledger_invariant(&org.org_id).await;
}

#[actix_web::test]
async fn two_instances_under_concurrent_debits_never_charge_past_the_cap() {
    if !postgres_or_skip() {
        return;
    }
    let first = spawn_app_with(|s| s.billing.flat_run_fee_cents = keel_core::domain::Cents(100)).await;
    let mut settings = test_settings(&first.db_url);
    settings.billing.flat_run_fee_cents = keel_core::domain::Cents(100);
    let second = spawn_on(TestDb::reuse(&first.db_url), settings).await;
    let org = first.create_org("Acme").await;
    first.fund(&org, 1000).await;
    let capped = json!({"orgId": org.org_id, "enabled": true, "thresholdCents": 950, "amountCents": 1000,
        "monthlyLimitCents": 2500});
    assert_eq!(
        first
            .put("/api/billing/auto-topup", &org.api_key, &capped)
            .await
            .status(),
        StatusCode::OK
    );
    // Four waves of 20 fees of 1.00 at once, half through each instance: each wave takes the
    // balance under 9.50, and each instance's ledger may start an auto top-up.
    for wave in 0..4 {
        let fees = (0..20).map(|i| {
            let (app, org) = (if i % 2 == 0 { &first } else { &second }, &org);
            async move {
                app.post(
                    "/api/billing/debit",
                    &org.api_key,
                    &json!({"orgId": org.org_id, "runId": format!("w{wave}-r{i}")}),
                )
                .await
                .status()
            }
        });
        futures_util::future::join_all(fees).await;
        actix_web::rt::time::sleep(std::time::Duration::from_millis(800)).await;
    }
    use sea_orm::{ColumnTrait, EntityTrait, QueryFilter};
    let db = sea_orm::Database::connect(&first.db_url).await.unwrap();
    let auto: Vec<entities::payment::Model> = entities::payment::Entity::find()
        .filter(entities::payment::Column::Kind.eq(keel_core::domain::EntryKind::AutoTopup))
        .all(&db)
        .await
        .unwrap();
    db.close().await.ok();
    let charged: i64 = auto.iter().map(|p| p.amount_cents.get()).sum();
    assert_eq!(
        charged, 2000,
        "two auto top-ups of 10.00, the third stopped by the cap: {auto:?}"
    );
    assert_eq!(
        first.billing(&org).await["autoTopup"]["chargedThisMonthCents"],
        2000
    );
    first.assert_ledger_invariant(&org.org_id).await;
}

#[actix_web::test]
async fn the_console_shows_credits_the_cap_the_statement_and_the_csv_and_operators_grant_once_confirmed() {
    use crate::console::Console;
    let app = spawn_app_with(|s| {
        s.billing.promo_expires_days.insert("WELCOME10".into(), 5);
    })
    .await;
    let org = app.create_org("Acme").await;
    app.post(
        "/api/billing/promo-code",
        &org.api_key,
        &json!({"orgId": org.org_id, "code": "WELCOME10"}),
    )
    .await;
    app.fund(&org, 2000).await;
    let settings = json!({"orgId": org.org_id, "enabled": true, "thresholdCents": 500, "amountCents": 1000,
        "monthlyLimitCents": 5000});
    app.put("/api/billing/auto-topup", &org.api_key, &settings).await;
    let member = Console::sign_in(&app, &org.api_key).await;
    let home = format!("/console/o/{}", org.org_id);
    let overview = member.page(&home).await;
    assert!(
        overview.contains("$10.00</span> promotional credit expires in 4 d 23 h")
            || overview.contains("$10.00</span> promotional credit expires in 5 d 0 h"),
        "{overview}"
    );
    assert!(
        overview.contains("$20.00</span> top-up never expires"),
        "{overview}"
    );
    assert!(
        overview.contains("Charged this month: $0.00 of a $50.00 monthly cap"),
        "{overview}"
    );
    assert!(overview.contains("name=\"monthlyLimitCents\""));
    // The cap is saved from the form too.
    let html = member
        .submit(
            &format!("{home}/auto-topup"),
            &[
                ("enabled", "true"),
                ("thresholdCents", "500"),
                ("amountCents", "1000"),
                ("monthlyLimitCents", "3000"),
            ],
        )
        .await;
    assert!(html.contains("of a $30.00 monthly cap"), "{html}");

    // The ledger page: this month's statement, and the CSV the API streams.
    let month = chrono::Utc::now().format("%Y-%m").to_string();
    let ledger = member.page(&format!("{home}/ledger")).await;
    assert!(ledger.contains(&format!("value=\"{month}\"")), "{ledger}");
    assert!(
        ledger
            .contains("<td>Credits: promo</td><td class=\"num\" title=\"1000000000 microcents\">$10.00</td>"),
        "{ledger}"
    );
    assert!(
        ledger.contains(
            "<td>Closing balance</td><td class=\"num\" title=\"3000000000 microcents\">$30.00</td>"
        ),
        "{ledger}"
    );
    let old = member.page(&format!("{home}/ledger?month=2001-01")).await;
    assert!(
        old.contains("<td>Closing balance</td><td class=\"num\" title=\"0 microcents\">$0.00</td>"),
        "{old}"
    );
    assert_eq!(
        member.get(&format!("{home}/ledger?month=2001-13")).await.status(),
        StatusCode::BAD_REQUEST
    );
    let csv = member.get(&format!("{home}/ledger.csv")).await;
    assert_eq!(csv.status(), StatusCode::OK);
    let csv = csv.text().await.unwrap();
    let api = app
        .get(
            &format!("/api/billing/ledger.csv?orgId={}", org.org_id),
            &org.api_key,
        )
        .await
        .text()
        .await
        .unwrap();
    assert_eq!(csv, api);
    assert_eq!(csv.lines().count(), 3, "a header, the promo and the top-up");

    // The operator grants by hand, once confirmed; a resubmitted form grants once.
    let operator = Console::sign_in(&app, INTERNAL_KEY).await;
    let form = operator.page("/console/operator/grants").await;
    let marker = "name=\"key\" value=\"";
    let start = form.find(marker).unwrap() + marker.len();
    let key = form[start..start + 36].to_owned();
    let fields = [
        ("orgId", org.org_id.as_str()),
        ("amountCents", "750"),
        ("reason", "refund: <b>outage</b>"),
        ("key", key.as_str()),
    ];
    let (asked, done) = operator.confirm("/console/operator/grants", &fields).await;
    assert!(
        asked.contains("$7.50 is credited") && asked.contains("&#60;b&#62;outage"),
        "{asked}"
    );
    assert!(done.contains("$7.50 granted to"), "{done}");
    let mut again = fields.to_vec();
    again.push(("confirmed", "yes"));
    operator.submit("/console/operator/grants", &again).await;
    assert_eq!(app.balance_microcents(&org).await, 3_750_000_000);
    let manual: Vec<Value> = grants(&app, &org)
        .await
        .into_iter()
        .filter(|g| g["kind"] == "manual")
        .collect();
    assert_eq!(manual.len(), 1);
    // The form is held to the API body's bounds and rules: each refusal names its field, and
    // nothing is granted.
    for (field, value) in [
        ("amountCents", "0"),
        ("amountCents", "many"),
        ("priority", "1001"),
        ("expiresOn", "2020-01-01"),
        ("expiresOn", "soon"),
    ] {
        let mut bad: Vec<(&str, &str)> = fields
            .iter()
            .filter(|(name, _)| *name != field)
            .copied()
            .collect();
        bad.push((field, value));
        let page = operator.submit("/console/operator/grants", &bad).await;
        // Named in words, as the form's label would say it.
        let words = match field {
            "amountCents" => "amount cents",
            "expiresOn" => "expires at",
            other => other,
        };
        assert!(
            page.contains("flash error") && page.contains(&format!("{words}:")),
            "{field}={value}: {page}"
        );
    }
    assert_eq!(app.balance_microcents(&org).await, 3_750_000_000);
    // Members cannot.
    assert_eq!(
        member.post("/console/operator/grants", &fields).await.status(),
        StatusCode::NOT_FOUND
    );
}

#[actix_web::test]
async fn the_ledger_csv_never_hands_a_spreadsheet_a_formula() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let made = app
        .request(
            reqwest::Method::POST,
            "/api/internal/billing/grants",
            Some(INTERNAL_KEY),
        )
        .header("Idempotency-Key", "g-1")
        .json(&json!({"orgId": org.org_id, "amountCents": 250, "reason": "=HYPERLINK(\"http://evil.example\",\"refund\")"}))
        .send()
        .await
        .unwrap();
    assert_eq!(made.status(), StatusCode::CREATED);
    let fee = app
        .post(
            "/api/billing/debit",
            &org.api_key,
            &json!({"orgId": org.org_id, "runId": "-r1"}),
        )
        .await;
    assert_eq!(fee.status(), StatusCode::OK);
    let csv = app
        .get(
            &format!("/api/billing/ledger.csv?orgId={}", org.org_id),
            &org.api_key,
        )
        .await
        .text()
        .await
        .unwrap();
    let mut reader = csv::Reader::from_reader(csv.as_bytes());
    let rows: Vec<csv::StringRecord> = reader.records().map(Result::unwrap).collect();
    let grant = rows.iter().find(|r| &r[2] == "manual").unwrap();
    assert_eq!(&grant[3], "250.000000");
    assert_eq!(&grant[5], "'=HYPERLINK(\"http://evil.example\",\"refund\")");
    let debit = rows.iter().find(|r| &r[2] == "run_fee").unwrap();
    // Amounts stay numbers, a negative one too.
    assert_eq!(&debit[3], "-100.000000");
    assert!(
        debit[5].starts_with("run fee") || debit[5].starts_with('\''),
        "{:?}",
        &debit[5]
    );
    for row in &rows {
        for cell in [&row[5], &row[6]] {
            assert!(
                !cell.starts_with(['=', '+', '-', '@', '\t', '\r']),
                "a text cell a spreadsheet would run: {cell:?}"
            );
        }
    }
}

/// PostgreSQL: run fees drawn from one grant are written by the ledger's debit function on the
/// account as it locks it (`keel_ledger_debit`), so two instances charging one organization at
/// once write one after the other without planning again on each other's rows. A batch that
/// runs a grant out (two grants drawn) is not the function's: the planner's guarded or locked
/// writes take it. Every fee is charged once, a replay on the other instance answers as one,
/// the entries chain, and each grant comes to what its draws left.
#[actix_web::test]
async fn two_instances_charging_fees_at_once_write_each_once_on_the_current_account() {
    if !postgres_or_skip() {
        return;
    }
    let first = spawn_app().await;
    let org = first.create_org("Fees").await;
    let second = spawn_on(TestDb::reuse(&first.db_url), test_settings(&first.db_url)).await;
    let fee = test_settings(&first.db_url).billing.flat_run_fee_cents.get();
    // Drawn first (it expires sooner): three fees' worth; then the top-up.
    grant_expiring(&first, &org, 3 * fee, 3600).await;
    first.fund(&org, 50 * fee).await;
    let debit = |app: &TestApp, run: String| {
        app.post_later(
            "/api/billing/debit",
            &org.api_key,
            &json!({"orgId": org.org_id, "runId": run}),
        )
    };
    // Taking turns: each instance's last view of the account is one fee behind.
    for i in 0..10 {
        let app = if i % 2 == 0 { &first } else { &second };
        let answer = json_of(debit(app, format!("run-{i}")).await, StatusCode::OK).await;
        assert_eq!(answer["balanceCents"], (53 - i - 1) * fee, "fee {i}");
    }
    // At once.
    let mut calls = Vec::new();
    for i in 10..40 {
        calls.push(debit(
            if i % 2 == 0 { &first } else { &second },
            format!("run-{i}"),
        ));
    }
    // The first ten again, each on the other instance.
    for i in 0..10 {
        calls.push(debit(
            if i % 2 == 0 { &second } else { &first },
            format!("run-{i}"),
        ));
    }
    for answer in futures_util::future::join_all(calls).await {
        assert_eq!(
            answer.status(),
            StatusCode::OK,
            "{}",
            answer.text().await.unwrap()
        );
    }
    let (balance, entries) = first.assert_ledger_invariant(&org.org_id).await;
    assert_eq!(balance, (53 - 40) * fee * 1_000_000);
    // The grant, the top-up and one entry a fee.
    assert_eq!(entries, 2 + 40);
    // The first grant spent, the top-up drawn for the rest.
    let left: Vec<(String, i64)> = grants(&first, &org)
        .await
        .iter()
        .map(|g| {
            (
                g["kind"].as_str().unwrap().to_owned(),
                g["remainingMicrocents"].as_i64().unwrap(),
            )
        })
        .filter(|(_, left)| *left > 0)
        .collect();
    assert_eq!(left, [("topup".to_owned(), 13 * fee * 1_000_000)]);
    let mut on_current = 0.0;
    for app in [&first, &second] {
        let text = app.metrics_text().await;
        if text.contains("keel_ledger_guarded_writes_total{guard=\"current_account\"}") {
            on_current += metric(
                &text,
                "keel_ledger_guarded_writes_total{guard=\"current_account\"}",
            );
        }
    }
    assert!(on_current >= 1.0, "no fee went through the debit function");
}
