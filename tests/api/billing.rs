//! Billing: each rule of the spec's billing section and each status of the contract.

use std::collections::HashSet;

use futures_util::future::join_all;
use keel_core::billing::webhook;
use keel_core::domain::OrgId;
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::fakes::FakeStripe;
use crate::helpers::*;

const LLAMA: &str = "meta-llama/Llama-3.1-8B-Instruct";

#[actix_web::test]
async fn a_new_organization_starts_at_zero() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let billing = app.billing(&org).await;
    assert_eq!(billing["orgId"], org.org_id.as_str());
    assert_eq!(billing["balanceCents"], 0);
    assert_eq!(billing["balanceMicrocents"], 0);
    assert_eq!(billing["paymentMethod"], Value::Null);
    assert_eq!(
        billing["autoTopup"],
        json!({"enabled": false, "thresholdCents": null, "amountCents": null, "monthlyLimitCents": null,
               "chargedThisMonthCents": 0})
    );
    assert_eq!(billing["starterCreditGranted"], false);
    assert_eq!(billing["recentLedger"], json!([]));
}

#[actix_web::test]
async fn the_billing_view_needs_an_org_id_and_membership() {
    let app = spawn_app().await;
    let acme = app.create_org("Acme").await;
    let globex = app.create_org("Globex").await;
    let issues = validation_issues(app.get("/api/billing", &acme.owner_token).await).await;
    assert_eq!(issues[0]["loc"], json!(["query", "orgId"]));
    let other = app
        .get(
            &format!("/api/billing?orgId={}", globex.org_id),
            &acme.owner_token,
        )
        .await;
    assert_error(other, StatusCode::FORBIDDEN).await;
    let by_member = app
        .get(&format!("/api/billing?orgId={}", acme.org_id), &acme.member_token)
        .await;
    assert_eq!(by_member.status(), StatusCode::OK);
}

#[actix_web::test]
async fn the_starter_credit_is_granted_once() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let body = json!({"orgId": org.org_id});
    let granted = json_of(
        app.post("/api/billing/starter-credit", &org.member_token, &body)
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(granted["creditedCents"], 500);
    assert_eq!(granted["balanceCents"], 500);
    assert_error(
        app.post("/api/billing/starter-credit", &org.api_key, &body).await,
        StatusCode::CONFLICT,
    )
    .await;
    let billing = app.billing(&org).await;
    assert_eq!(billing["balanceCents"], 500);
    assert_eq!(billing["starterCreditGranted"], true);
    assert_eq!(billing["recentLedger"][0]["kind"], "starter_credit");
    app.assert_ledger_invariant(&org.org_id).await;
}

#[actix_web::test]
async fn promo_codes_credit_once_per_organization_and_code() {
    let app = spawn_app().await;
    let acme = app.create_org("Acme").await;
    let globex = app.create_org("Globex").await;
    // Any member may redeem; codes are case-insensitive.
    let redeemed = json_of(
        app.post(
            "/api/billing/promo-code",
            &acme.member_token,
            &json!({"orgId": acme.org_id, "code": "welcome10"}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(redeemed["creditedCents"], 1000);
    assert_eq!(redeemed["balanceCents"], 1000);
    assert_eq!(redeemed["code"], "WELCOME10");
    let again = app
        .post(
            "/api/billing/promo-code",
            &acme.api_key,
            &json!({"orgId": acme.org_id, "code": "WELCOME10"}),
        )
        .await;
    assert_error(again, StatusCode::CONFLICT).await;
    let unknown = app
        .post(
            "/api/billing/promo-code",
            &acme.api_key,
            &json!({"orgId": acme.org_id, "code": "FREE-MONEY"}),
        )
        .await;
    assert_error(unknown, StatusCode::NOT_FOUND).await;
    // Another organization redeems the same code for itself.
    let other = app
        .post(
            "/api/billing/promo-code",
            &globex.api_key,
            &json!({"orgId": globex.org_id, "code": "Welcome10"}),
        )
        .await;
    assert_eq!(other.status(), StatusCode::OK);
    assert_eq!(app.balance_microcents(&acme).await, 1_000_000_000);
    app.assert_ledger_invariant(&acme.org_id).await;
}

#[actix_web::test]
async fn concurrent_promo_redemptions_credit_once() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let body = json!({"orgId": org.org_id, "code": "WELCOME10"});
    let responses = join_all((0..20).map(|_| app.post("/api/billing/promo-code", &org.api_key, &body))).await;
    let ok = responses.iter().filter(|r| r.status() == StatusCode::OK).count();
    let conflict = responses
        .iter()
        .filter(|r| r.status() == StatusCode::CONFLICT)
        .count();
    assert_eq!((ok, conflict), (1, 19));
    assert_eq!(app.balance_microcents(&org).await, 1_000_000_000);
}

#[actix_web::test]
async fn the_flat_run_fee_is_debited_once_per_run_and_refused_when_short() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let short = app
        .post(
            "/api/billing/debit",
            &org.api_key,
            &json!({"orgId": org.org_id, "runId": "r1"}),
        )
        .await;
    assert_error(short, StatusCode::PAYMENT_REQUIRED).await;
    app.post(
        "/api/billing/starter-credit",
        &org.api_key,
        &json!({"orgId": org.org_id}),
    )
    .await;

    let first = json_of(
        app.post(
            "/api/billing/debit",
            &org.api_key,
            &json!({"orgId": org.org_id, "runId": "r1"}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        first,
        json!({"chargedCents": 100, "balanceCents": 400, "replayed": false})
    );
    let replay = json_of(
        app.post(
            "/api/billing/debit",
            &org.member_token,
            &json!({"orgId": org.org_id, "runId": "r1"}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        replay,
        json!({"chargedCents": 100, "balanceCents": 400, "replayed": true})
    );
    // Without a run id every call is a fee.
    for expected in [300, 200] {
        let body = json_of(
            app.post("/api/billing/debit", &org.api_key, &json!({"orgId": org.org_id}))
                .await,
            StatusCode::OK,
        )
        .await;
        assert_eq!(body["balanceCents"], expected);
    }
    let (balance, entries) = app.assert_ledger_invariant(&org.org_id).await;
    assert_eq!((balance, entries), (200_000_000, 4));
}

#[actix_web::test]
async fn concurrent_debits_never_overdraw() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    // 500 cents cover exactly five fees of 100.
    app.post(
        "/api/billing/starter-credit",
        &org.api_key,
        &json!({"orgId": org.org_id}),
    )
    .await;
    let responses = join_all((0..100).map(|i| {
        app.post_later(
            "/api/billing/debit",
            &org.api_key,
            &json!({"orgId": org.org_id, "runId": format!("run-{i}")}),
        )
    }))
    .await;
    let ok = responses.iter().filter(|r| r.status() == StatusCode::OK).count();
    let refused = responses
        .iter()
        .filter(|r| r.status() == StatusCode::PAYMENT_REQUIRED)
        .count();
    assert_eq!((ok, refused), (5, 95));
    let (balance, entries) = app.assert_ledger_invariant(&org.org_id).await;
    assert_eq!((balance, entries), (0, 6));
}

async fn setup_adapter(app: &TestApp, org: &TestOrg, adapter: &str) {
    let put = app
        .put(
            &format!("/api/internal/adapters/{adapter}"),
            INTERNAL_KEY,
            &json!({"orgId": org.org_id, "baseModel": LLAMA, "live": true}),
        )
        .await;
    assert_eq!(put.status(), StatusCode::OK);
}

#[actix_web::test]
async fn serving_usage_bills_the_adapters_owner_at_cost_plus_twenty_percent() {
    let app = spawn_app().await;
    let owner = app.create_org("Owner").await;
    setup_adapter(&app, &owner, "owner-bot").await;
    let body = json!({"requestId": "gen-1", "adapterId": "owner-bot", "promptTokens": 1000, "completionTokens": 500});
    let charged = json_of(
        app.post("/api/billing/serving-usage", INTERNAL_KEY, &body).await,
        StatusCode::OK,
    )
    .await;
    // 1000 × 10 µ¢ + 500 × 20 µ¢ = 20,000 µ¢ upstream; × 1.2 = 24,000 µ¢.
    assert_eq!(
        charged,
        json!({"requestId": "gen-1", "orgId": owner.org_id, "costMicrocents": 20000, "chargedMicrocents": 24000,
               "balanceMicrocents": -24000, "replayed": false})
    );
    // Work already delivered may take the balance below zero; the view floors the cents.
    let billing = app.billing(&owner).await;
    assert_eq!(billing["balanceMicrocents"], -24000);
    assert_eq!(billing["balanceCents"], -1);

    // A replay answers the original charge without debiting again.
    let replay = json_of(
        app.post("/api/billing/serving-usage", INTERNAL_KEY, &body).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(replay["replayed"], true);
    assert_eq!(replay["chargedMicrocents"], 24000);
    assert_eq!(replay["balanceMicrocents"], -24000);
    let (balance, entries) = app.assert_ledger_invariant(&owner.org_id).await;
    assert_eq!((balance, entries), (-24000, 1));
}

#[actix_web::test]
async fn serving_usage_with_an_org_and_a_base_model() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let body = json!({"requestId": "gen-b", "orgId": org.org_id, "model": LLAMA, "promptTokens": 1, "completionTokens": 0});
    let charged = json_of(
        app.post("/api/billing/serving-usage", INTERNAL_KEY, &body).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(charged["orgId"], org.org_id.as_str());
    assert_eq!(charged["costMicrocents"], 10);
    assert_eq!(charged["chargedMicrocents"], 12);
    let unpriced = json!({"requestId": "gen-c", "orgId": org.org_id, "model": "gpt-unknown", "promptTokens": 1, "completionTokens": 1});
    assert_error(
        app.post("/api/billing/serving-usage", INTERNAL_KEY, &unpriced)
            .await,
        StatusCode::NOT_FOUND,
    )
    .await;
    let unknown_org = json!({"requestId": "gen-d", "orgId": uuid::Uuid::new_v4(), "model": LLAMA, "promptTokens": 1, "completionTokens": 1});
    assert_error(
        app.post("/api/billing/serving-usage", INTERNAL_KEY, &unknown_org)
            .await,
        StatusCode::NOT_FOUND,
    )
    .await;
}

#[actix_web::test]
async fn the_adapter_decides_the_billed_organization() {
    let app = spawn_app().await;
    let owner = app.create_org("Owner").await;
    let other = app.create_org("Other").await;
    setup_adapter(&app, &owner, "owned").await;
    let mismatch = json!({"requestId": "g1", "adapterId": "owned", "orgId": other.org_id, "promptTokens": 5, "completionTokens": 5});
    assert_error(
        app.post("/api/billing/serving-usage", INTERNAL_KEY, &mismatch)
            .await,
        StatusCode::CONFLICT,
    )
    .await;
    let matching = json!({"requestId": "g2", "adapterId": "owned", "orgId": owner.org_id, "promptTokens": 5, "completionTokens": 5});
    assert_eq!(
        app.post("/api/billing/serving-usage", INTERNAL_KEY, &matching)
            .await
            .status(),
        StatusCode::OK
    );
    let unknown = json!({"requestId": "g3", "adapterId": "nobody", "promptTokens": 5, "completionTokens": 5});
    assert_error(
        app.post("/api/billing/serving-usage", INTERNAL_KEY, &unknown)
            .await,
        StatusCode::NOT_FOUND,
    )
    .await;
    assert_eq!(app.balance_microcents(&other).await, 0);
    assert_eq!(app.balance_microcents(&owner).await, -(5 * 10 + 5 * 20) * 12 / 10);
}

#[actix_web::test]
async fn serving_usage_validation_and_credentials() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let neither = json!({"requestId": "g", "orgId": org.org_id, "promptTokens": 1, "completionTokens": 1});
    let issues = validation_issues(
        app.post("/api/billing/serving-usage", INTERNAL_KEY, &neither)
            .await,
    )
    .await;
    assert_eq!(issues[0]["loc"], json!(["body", "adapterId"]));
    let negative = json!({"requestId": "", "model": LLAMA, "orgId": org.org_id, "promptTokens": -1, "completionTokens": 1});
    let issues = validation_issues(
        app.post("/api/billing/serving-usage", INTERNAL_KEY, &negative)
            .await,
    )
    .await;
    let locs: Vec<_> = issues.iter().map(|i| i["loc"].clone()).collect();
    assert!(locs.contains(&json!(["body", "requestId"])));
    assert!(locs.contains(&json!(["body", "promptTokens"])));
    let body = json!({"requestId": "g", "orgId": org.org_id, "model": LLAMA, "promptTokens": 1, "completionTokens": 1});
    assert_error(
        app.post("/api/billing/serving-usage", &org.api_key, &body).await,
        StatusCode::FORBIDDEN,
    )
    .await;
}

#[actix_web::test]
async fn fifty_concurrent_replays_of_one_request_debit_once() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    setup_adapter(&app, &org, "bot").await;
    let body = json!({"requestId": "same", "adapterId": "bot", "promptTokens": 100, "completionTokens": 100});
    let responses =
        join_all((0..50).map(|_| app.post("/api/billing/serving-usage", INTERNAL_KEY, &body))).await;
    let mut fresh = 0;
    for response in responses {
        let body = json_of(response, StatusCode::OK).await;
        assert_eq!(body["chargedMicrocents"], 3600);
        if body["replayed"] == false {
            fresh += 1;
        }
    }
    assert_eq!(fresh, 1);
    let (balance, entries) = app.assert_ledger_invariant(&org.org_id).await;
    assert_eq!((balance, entries), (-3600, 1));
}

#[actix_web::test]
async fn new_charges_and_replays_arriving_together_are_each_answered_right() {
    // Groups that mix new request ids with replays: on PostgreSQL a group is first tried
    // without looking its keys up, and a replay in it sends the whole group back to be
    // planned with the look-up. Either way: each new charge once, each replay as a replay.
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    setup_adapter(&app, &org, "bot").await;
    let body = |i: usize| json!({"requestId": format!("req-{i}"), "adapterId": "bot", "promptTokens": 100, "completionTokens": 100});
    for i in 0..20 {
        let first = json_of(
            app.post("/api/billing/serving-usage", INTERNAL_KEY, &body(i))
                .await,
            StatusCode::OK,
        )
        .await;
        assert_eq!(first["replayed"], false);
    }
    // Interleaved: 20 replays (0..20) and 20 new ids (20..40), twice each.
    let requests: Vec<_> = (0..40)
        .chain(0..40)
        .map(|i| app.post_later("/api/billing/serving-usage", INTERNAL_KEY, &body(i)))
        .collect();
    let mut fresh = HashSet::new();
    for response in join_all(requests).await {
        let answer = json_of(response, StatusCode::OK).await;
        assert_eq!(answer["chargedMicrocents"], 3600);
        if answer["replayed"] == false {
            let id = answer["requestId"].as_str().unwrap().to_owned();
            assert!(fresh.insert(id.clone()), "{id} was charged twice");
        }
    }
    let expected: HashSet<String> = (20..40).map(|i| format!("req-{i}")).collect();
    assert_eq!(fresh, expected);
    let (balance, entries) = app.assert_ledger_invariant(&org.org_id).await;
    assert_eq!((balance, entries), (-3600 * 40, 40));
}

#[actix_web::test]
async fn a_request_id_metered_for_another_organization_is_a_replay_among_new_charges() {
    // Request ids are unique across organizations. A batch of new charges that carries ids
    // another organization already used: on PostgreSQL the group's one write statement
    // skips those usage rows, counts them out and sends the group back to be planned again;
    // either way each new id is charged once and each reused one answered as a replay,
    // billing nobody a second time.
    let app = spawn_app().await;
    let first = app.create_org("First").await;
    let second = app.create_org("Second").await;
    setup_adapter(&app, &first, "first-bot").await;
    setup_adapter(&app, &second, "second-bot").await;
    let body = |id: &str, adapter: &str| json!({"requestId": id, "adapterId": adapter, "promptTokens": 100, "completionTokens": 100});
    for i in 0..5 {
        let answer = json_of(
            app.post(
                "/api/billing/serving-usage",
                INTERNAL_KEY,
                &body(&format!("shared-{i}"), "first-bot"),
            )
            .await,
            StatusCode::OK,
        )
        .await;
        assert_eq!(answer["replayed"], false);
    }
    let ids: Vec<String> = (0..5)
        .map(|i| format!("shared-{i}"))
        .chain((0..20).map(|i| format!("second-{i}")))
        .collect();
    let requests: Vec<_> = ids
        .iter()
        .map(|id| {
            app.post_later(
                "/api/billing/serving-usage",
                INTERNAL_KEY,
                &body(id, "second-bot"),
            )
        })
        .collect();
    for (id, response) in ids.iter().zip(join_all(requests).await) {
        let answer = json_of(response, StatusCode::OK).await;
        assert_eq!(answer["requestId"], id.as_str());
        assert_eq!(answer["replayed"], id.starts_with("shared-"), "{id}");
    }
    assert_eq!(app.assert_ledger_invariant(&first.org_id).await, (-3600 * 5, 5));
    assert_eq!(
        app.assert_ledger_invariant(&second.org_id).await,
        (-3600 * 20, 20)
    );
}

#[actix_web::test]
async fn new_run_fees_and_replays_arriving_together_are_each_answered_right() {
    // As above, for keyed charges with no usage row behind them (whose primary key would
    // otherwise catch a replay too): the ledger's own key check must.
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    for _ in 0..4 {
        app.fund(&org, 1000).await;
    }
    let (_, funded_entries) = app.assert_ledger_invariant(&org.org_id).await;
    let body = |i: usize| json!({"orgId": org.org_id, "runId": format!("run-{i}")});
    for i in 0..20 {
        let first = json_of(
            app.post("/api/billing/debit", &org.api_key, &body(i)).await,
            StatusCode::OK,
        )
        .await;
        assert_eq!(first["replayed"], false);
    }
    let requests: Vec<_> = (0..40)
        .chain(0..40)
        .map(|i| app.post_later("/api/billing/debit", &org.api_key, &body(i)))
        .collect();
    let mut fresh = 0;
    for response in join_all(requests).await {
        let answer = json_of(response, StatusCode::OK).await;
        assert_eq!(answer["chargedCents"], 100);
        if answer["replayed"] == false {
            fresh += 1;
        }
    }
    assert_eq!(
        fresh, 20,
        "each new run charged once, each replay answered as one"
    );
    let (balance, entries) = app.assert_ledger_invariant(&org.org_id).await;
    assert_eq!((balance, entries), (0, funded_entries + 40));
}

#[actix_web::test]
async fn training_usage_takes_a_user_api_key_and_bills_once_per_run() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let body = json!({"runId": "train-1", "estimateCents": 300});
    assert_error(
        app.post("/api/billing/training-usage", &org.api_key, &body).await,
        StatusCode::PAYMENT_REQUIRED,
    )
    .await;
    app.post(
        "/api/billing/starter-credit",
        &org.api_key,
        &json!({"orgId": org.org_id}),
    )
    .await;
    let charged = json_of(
        app.post("/api/billing/training-usage", &org.api_key, &body).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        charged,
        json!({"runId": "train-1", "chargedCents": 300, "balanceCents": 200, "replayed": false})
    );
    let replay = json_of(
        app.post("/api/billing/training-usage", &org.api_key, &body).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(replay["replayed"], true);
    assert_eq!(replay["balanceCents"], 200);
    assert_error(
        app.post("/api/billing/training-usage", &org.owner_token, &body)
            .await,
        StatusCode::FORBIDDEN,
    )
    .await;
    assert_error(
        app.post("/api/billing/training-usage", INTERNAL_KEY, &body).await,
        StatusCode::FORBIDDEN,
    )
    .await;
    let zero = app
        .post(
            "/api/billing/training-usage",
            &org.api_key,
            &json!({"runId": "x", "estimateCents": 0}),
        )
        .await;
    assert_eq!(validation_issues(zero).await[0]["type"], "greater_than");
    app.assert_ledger_invariant(&org.org_id).await;
}

#[actix_web::test]
async fn precheck_verifies_without_moving_money() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let body = json!({"orgId": org.org_id, "estimateCents": 400});
    assert_error(
        app.post("/api/billing/training-usage/precheck", INTERNAL_KEY, &body)
            .await,
        StatusCode::PAYMENT_REQUIRED,
    )
    .await;
    app.post(
        "/api/billing/starter-credit",
        &org.api_key,
        &json!({"orgId": org.org_id}),
    )
    .await;
    let ok = app
        .post("/api/billing/training-usage/precheck", INTERNAL_KEY, &body)
        .await;
    assert_eq!(json_of(ok, StatusCode::OK).await, json!({"ok": true}));
    let too_much = json!({"orgId": org.org_id, "estimateCents": 10_000});
    assert_error(
        app.post("/api/billing/training-usage/precheck", INTERNAL_KEY, &too_much)
            .await,
        StatusCode::PAYMENT_REQUIRED,
    )
    .await;
    // A card with auto top-up covers any estimate.
    app.save_card(&org, "pm_card_visa").await;
    let card_only = app
        .post("/api/billing/training-usage/precheck", INTERNAL_KEY, &too_much)
        .await;
    assert_error(card_only, StatusCode::PAYMENT_REQUIRED).await;
    app.put(
        "/api/billing/auto-topup",
        &org.api_key,
        &json!({"orgId": org.org_id, "enabled": true, "thresholdCents": 100, "amountCents": 1000}),
    )
    .await;
    let covered = app
        .post("/api/billing/training-usage/precheck", INTERNAL_KEY, &too_much)
        .await;
    assert_eq!(covered.status(), StatusCode::OK);
    assert_eq!(app.balance_microcents(&org).await, 500_000_000, "no money moved");
    let unknown = json!({"orgId": uuid::Uuid::new_v4(), "estimateCents": 1});
    assert_error(
        app.post("/api/billing/training-usage/precheck", INTERNAL_KEY, &unknown)
            .await,
        StatusCode::NOT_FOUND,
    )
    .await;
    assert_error(
        app.post("/api/billing/training-usage/precheck", &org.api_key, &body)
            .await,
        StatusCode::FORBIDDEN,
    )
    .await;
}

#[actix_web::test]
async fn internal_training_usage_charges_completed_runs_once_even_below_zero() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let body = json!({"orgId": org.org_id, "runId": "managed-1", "amountCents": 250});
    let charged = json_of(
        app.post("/api/billing/training-usage/internal", INTERNAL_KEY, &body)
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        charged,
        json!({"runId": "managed-1", "chargedCents": 250, "balanceCents": -250, "replayed": false})
    );
    let replay = json_of(
        app.post("/api/billing/training-usage/internal", INTERNAL_KEY, &body)
            .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(replay["replayed"], true);
    assert_eq!(app.balance_microcents(&org).await, -250_000_000);
    assert_error(
        app.post("/api/billing/training-usage/internal", &org.api_key, &body)
            .await,
        StatusCode::FORBIDDEN,
    )
    .await;
}

#[actix_web::test]
async fn training_cost_is_upserted_by_run() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let first = app
        .post(
            "/api/billing/training-cost",
            INTERNAL_KEY,
            &json!({"runId": "r", "costCents": 120, "provider": "modal"}),
        )
        .await;
    assert_eq!(
        json_of(first, StatusCode::OK).await,
        json!({"runId": "r", "costCents": 120})
    );
    let repulled = app
        .post(
            "/api/billing/training-cost",
            INTERNAL_KEY,
            &json!({"runId": "r", "costCents": 135}),
        )
        .await;
    assert_eq!(
        json_of(repulled, StatusCode::OK).await,
        json!({"runId": "r", "costCents": 135})
    );
    let db = sea_orm::Database::connect(&app.db_url).await.unwrap();
    use sea_orm::EntityTrait;
    let rows = entities::training_run_cost::Entity::find()
        .all(&db)
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].cost_cents, keel_core::domain::Cents(135));
    db.close().await.unwrap();
    let user = app
        .post(
            "/api/billing/training-cost",
            &org.api_key,
            &json!({"runId": "r", "costCents": 1}),
        )
        .await;
    assert_error(user, StatusCode::FORBIDDEN).await;
    let negative = app
        .post(
            "/api/billing/training-cost",
            INTERNAL_KEY,
            &json!({"runId": "r", "costCents": -1}),
        )
        .await;
    assert_eq!(
        validation_issues(negative).await[0]["loc"],
        json!(["body", "costCents"])
    );
}

#[actix_web::test]
async fn cards_and_top_ups_with_the_simulated_processor() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let intent = json_of(
        app.post(
            "/api/billing/setup-intent",
            &org.api_key,
            &json!({"orgId": org.org_id}),
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert!(intent["clientSecret"].as_str().unwrap().contains("_secret_"));
    assert!(intent["customerId"].is_string());

    let no_card = app.topup(&org, 1000).await;
    assert_error(no_card, StatusCode::CONFLICT).await;
    let unknown = app.save_card(&org, "pm_nope").await;
    assert_error(unknown, StatusCode::NOT_FOUND).await;
    let card = json_of(app.save_card(&org, "pm_card_visa").await, StatusCode::OK).await;
    assert_eq!(card["brand"], "visa");
    assert_eq!(card["last4"], "4242");

    for bad in [99, 1_000_001] {
        let response = app.topup(&org, bad).await;
        assert_eq!(
            validation_issues(response).await[0]["loc"],
            json!(["body", "amountCents"])
        );
    }
    let topped = json_of(app.topup(&org, 2500).await, StatusCode::OK).await;
    assert_eq!(topped["status"], "succeeded");
    assert_eq!(topped["balanceCents"], 2500);
    assert!(topped["paymentIntentId"].as_str().unwrap().starts_with("pi_"));
    let billing = app.billing(&org).await;
    assert_eq!(billing["balanceMicrocents"], 2_500_000_000i64);
    assert_eq!(billing["paymentMethod"]["last4"], "4242");

    // A declining card saves, but its charges answer 402 and move nothing.
    app.save_card(&org, "pm_card_chargeDeclined").await;
    let declined = app.topup(&org, 500).await;
    assert_error(declined, StatusCode::PAYMENT_REQUIRED).await;
    assert_eq!(app.balance_microcents(&org).await, 2_500_000_000);
    app.assert_ledger_invariant(&org.org_id).await;
}

#[actix_web::test]
async fn auto_top_up_needs_a_card_and_complete_settings() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let body = json!({"orgId": org.org_id, "enabled": true, "thresholdCents": 500, "amountCents": 1000});
    assert_error(
        app.put("/api/billing/auto-topup", &org.api_key, &body).await,
        StatusCode::CONFLICT,
    )
    .await;
    app.save_card(&org, "pm_card_visa").await;
    let incomplete = app
        .put(
            "/api/billing/auto-topup",
            &org.api_key,
            &json!({"orgId": org.org_id, "enabled": true}),
        )
        .await;
    let issues = validation_issues(incomplete).await;
    assert_eq!(issues.len(), 2);
    let saved = json_of(
        app.put("/api/billing/auto-topup", &org.api_key, &body).await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(
        saved,
        json!({"enabled": true, "thresholdCents": 500, "amountCents": 1000, "monthlyLimitCents": null,
               "chargedThisMonthCents": 0})
    );
    // Disabling needs no card; removing the card turns auto top-up off.
    let removed = json_of(
        app.delete(
            &format!("/api/billing/payment-method?orgId={}", org.org_id),
            &org.api_key,
        )
        .await,
        StatusCode::OK,
    )
    .await;
    assert_eq!(removed, json!({"deleted": true, "autoTopupDisabled": true}));
    assert_eq!(app.billing(&org).await["autoTopup"]["enabled"], false);
    let again = app
        .delete(
            &format!("/api/billing/payment-method?orgId={}", org.org_id),
            &org.api_key,
        )
        .await;
    assert_error(again, StatusCode::NOT_FOUND).await;
}

#[actix_web::test]
async fn auto_top_up_charges_the_card_once_when_a_debit_crosses_the_threshold() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    app.fund(&org, 1000).await;
    app.put(
        "/api/billing/auto-topup",
        &org.api_key,
        &json!({"orgId": org.org_id, "enabled": true, "thresholdCents": 950, "amountCents": 2000}),
    )
    .await;
    // Ten fees at once: the balance crosses the threshold, and one top-up follows.
    join_all((0..10).map(|i| {
        app.post_later(
            "/api/billing/debit",
            &org.api_key,
            &json!({"orgId": org.org_id, "runId": format!("r{i}")}),
        )
    }))
    .await;
    assert!(
        eventually(|| async {
            let billing = app.billing(&org).await;
            billing["recentLedger"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["kind"] == "auto_topup")
        })
        .await,
        "auto top-up credited"
    );
    // 1000 − 10 × 100 + 2000: one top-up only.
    actix_web::rt::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(app.balance_microcents(&org).await, 2_000_000_000);
    let billing = app.billing(&org).await;
    let topups = billing["recentLedger"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["kind"] == "auto_topup")
        .count();
    assert_eq!(topups, 1);
    app.assert_ledger_invariant(&org.org_id).await;
}

#[actix_web::test]
async fn auto_top_up_never_charges_twice_under_a_burst_of_debits() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    app.fund(&org, 1000).await;
    // One top-up lifts the balance far above the threshold: a second one is always a bug.
    app.put(
        "/api/billing/auto-topup",
        &org.api_key,
        &json!({"orgId": org.org_id, "enabled": true, "thresholdCents": 950, "amountCents": 100000}),
    )
    .await;
    for wave in 0..3 {
        join_all((0..30).map(|i| {
            app.post_later(
                "/api/billing/debit",
                &org.api_key,
                &json!({"orgId": org.org_id, "runId": format!("w{wave}-r{i}")}),
            )
        }))
        .await;
    }
    // Counted in the ledger itself (the billing view shows only recent entries).
    let topups = || async {
        use sea_orm::{ColumnTrait, EntityTrait, PaginatorTrait, QueryFilter};
        let db = sea_orm::Database::connect(&app.db_url).await.unwrap();
        let count = entities::ledger_entry::Entity::find()
            .filter(entities::ledger_entry::Column::OrgId.eq(&org.org_id))
            .filter(entities::ledger_entry::Column::Kind.eq("auto_topup"))
            .count(&db)
            .await
            .unwrap();
        db.close().await.ok();
        count
    };
    assert!(eventually(|| async { topups().await == 1 }).await, "one top-up");
    actix_web::rt::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(topups().await, 1);
    app.assert_ledger_invariant(&org.org_id).await;
}

/// The race behind a double top-up, replayed deterministically: a top-up decided on a stale
/// balance (the previous top-up has settled since) must not charge.
#[actix_web::test]
async fn a_top_up_decided_on_a_stale_balance_charges_nothing() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    app.fund(&org, 5000).await;
    app.put(
        "/api/billing/auto-topup",
        &org.api_key,
        &json!({"orgId": org.org_id, "enabled": true, "thresholdCents": 950, "amountCents": 2000}),
    )
    .await;
    let db = sea_orm::Database::connect(&app.db_url).await.unwrap();
    let payments = keel_core::billing::payments::Payments::from_settings(
        &test_settings(&app.db_url).payments,
        &native_tls::TlsConnector::new().unwrap(),
    )
    .unwrap();
    // The balance (5,000 cents) is above the threshold: the claim is free, but nothing is charged.
    let credit = keel_core::billing::auto_topup::charge(
        &db,
        &payments,
        &keel_core::metrics::Metrics::new().unwrap(),
        &OrgId::parse(&org.org_id).unwrap(),
        keel_core::domain::Cents(2000),
    )
    .await;
    assert!(credit.is_none());
    use sea_orm::EntityTrait;
    let account = entities::billing_account::Entity::find_by_id(OrgId::parse(&org.org_id).unwrap())
        .one(&db)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(account.auto_topup_started_at, None, "the claim is released");
    let payments_made = entities::payment::Entity::find().all(&db).await.unwrap();
    assert!(
        payments_made.iter().all(|p| p.kind.as_str() != "auto_topup"),
        "{payments_made:?}"
    );
    db.close().await.ok();
}

#[actix_web::test]
async fn auto_top_up_pauses_after_three_declines_until_saved_again() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    app.post(
        "/api/billing/promo-code",
        &org.api_key,
        &json!({"orgId": org.org_id, "code": "WELCOME10"}),
    )
    .await;
    app.save_card(&org, "pm_card_chargeDeclined").await;
    let settings = json!({"orgId": org.org_id, "enabled": true, "thresholdCents": 5000, "amountCents": 1000});
    app.put("/api/billing/auto-topup", &org.api_key, &settings).await;
    let declines = || async {
        let db = sea_orm::Database::connect(&app.db_url).await.unwrap();
        use sea_orm::EntityTrait;
        let account = entities::billing_account::Entity::find_by_id(OrgId::parse(&org.org_id).unwrap())
            .one(&db)
            .await
            .unwrap()
            .unwrap();
        db.close().await.ok();
        (
            account.auto_topup_declines,
            account.auto_topup_started_at.is_none(),
        )
    };
    for i in 1..=3 {
        app.post("/api/billing/debit", &org.api_key, &json!({"orgId": org.org_id}))
            .await;
        assert!(
            eventually(|| async { declines().await == (i, true) }).await,
            "decline {i} recorded"
        );
    }
    assert_eq!(app.billing(&org).await["autoTopupPaused"], true);
    app.post("/api/billing/debit", &org.api_key, &json!({"orgId": org.org_id}))
        .await;
    actix_web::rt::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(declines().await.0, 3, "paused: no fourth attempt");
    app.put("/api/billing/auto-topup", &org.api_key, &settings).await;
    assert_eq!(app.billing(&org).await["autoTopupPaused"], false);
    assert_eq!(app.balance_microcents(&org).await, 600_000_000);
}

fn signed(secret: &str, event: &Value) -> (String, String) {
    let body = event.to_string();
    let header = webhook::sign(secret, body.as_bytes(), chrono::Utc::now().timestamp());
    (body, header)
}

async fn post_webhook(app: &TestApp, body: &str, signature: Option<&str>) -> reqwest::Response {
    let mut request = app
        .request(reqwest::Method::POST, "/api/billing/webhook", None)
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(signature) = signature {
        request = request.header("Stripe-Signature", signature);
    }
    request.send().await.unwrap()
}

fn succeeded_event(event_id: &str, intent_id: &str, org_id: &str, cents: i64) -> Value {
    json!({"id": event_id, "type": "payment_intent.succeeded",
           "data": {"object": {"id": intent_id, "object": "payment_intent", "amount": cents, "amount_received": cents,
                               "metadata": {"orgId": org_id, "kind": "topup"}}}})
}

#[actix_web::test]
async fn webhooks_need_a_valid_signature() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    let event = succeeded_event("evt_1", "pi_1", &org.org_id, 500);
    // No secret configured: every webhook is 400.
    let (body, header) = signed("whsec_test", &event);
    assert_error(
        post_webhook(&app, &body, Some(&header)).await,
        StatusCode::BAD_REQUEST,
    )
    .await;

    let app = spawn_app_with(|s| s.payments.stripe_webhook_secret = "whsec_test".into()).await;
    let org = app.create_org("Acme").await;
    let event = succeeded_event("evt_1", "pi_1", &org.org_id, 500);
    let (body, header) = signed("whsec_test", &event);
    assert_error(post_webhook(&app, &body, None).await, StatusCode::BAD_REQUEST).await;
    let (_, wrong) = signed("whsec_other", &event);
    assert_error(
        post_webhook(&app, &body, Some(&wrong)).await,
        StatusCode::BAD_REQUEST,
    )
    .await;
    let stale = webhook::sign(
        "whsec_test",
        body.as_bytes(),
        chrono::Utc::now().timestamp() - 301,
    );
    assert_error(
        post_webhook(&app, &body, Some(&stale)).await,
        StatusCode::BAD_REQUEST,
    )
    .await;
    let tampered = body.replace("500", "50000");
    assert_error(
        post_webhook(&app, &tampered, Some(&header)).await,
        StatusCode::BAD_REQUEST,
    )
    .await;
    assert_eq!(app.balance_microcents(&org).await, 0);
    let ok = post_webhook(&app, &body, Some(&header)).await;
    assert_eq!(
        json_of(ok, StatusCode::OK).await,
        json!({"received": true, "duplicate": false})
    );
    assert_eq!(app.balance_microcents(&org).await, 500_000_000);
}

#[actix_web::test]
async fn a_payment_is_credited_once_across_replays_and_the_synchronous_path() {
    let app = spawn_app_with(|s| s.payments.stripe_webhook_secret = "whsec_test".into()).await;
    let org = app.create_org("Acme").await;
    // Replayed event: credited once.
    let (body, header) = signed("whsec_test", &succeeded_event("evt_a", "pi_a", &org.org_id, 700));
    for _ in 0..3 {
        post_webhook(&app, &body, Some(&header)).await;
    }
    let dup = json_of(post_webhook(&app, &body, Some(&header)).await, StatusCode::OK).await;
    assert_eq!(dup["duplicate"], true);
    // Another event about the same payment intent: still once.
    let (body, header) = signed("whsec_test", &succeeded_event("evt_b", "pi_a", &org.org_id, 700));
    assert_eq!(
        post_webhook(&app, &body, Some(&header)).await.status(),
        StatusCode::OK
    );
    assert_eq!(app.balance_microcents(&org).await, 700_000_000);

    // The synchronous top-up, then the processor's webhook for the same intent.
    app.fund(&org, 1000).await;
    let intent = app.billing(&org).await["recentLedger"][0]["reason"]
        .as_str()
        .unwrap()
        .trim_start_matches("top-up ")
        .to_owned();
    let (body, header) = signed(
        "whsec_test",
        &succeeded_event("evt_c", &intent, &org.org_id, 1000),
    );
    assert_eq!(
        post_webhook(&app, &body, Some(&header)).await.status(),
        StatusCode::OK
    );
    assert_eq!(app.balance_microcents(&org).await, 1_700_000_000);
    // Unknown event types are acknowledged and ignored.
    let (body, header) = signed(
        "whsec_test",
        &json!({"id": "evt_x", "type": "customer.created", "data": {"object": {}}}),
    );
    assert_eq!(
        post_webhook(&app, &body, Some(&header)).await.status(),
        StatusCode::OK
    );
    app.assert_ledger_invariant(&org.org_id).await;
}

#[actix_web::test]
async fn deleting_the_customer_is_owner_gated_and_best_effort() {
    let (stripe, url) = FakeStripe::start();
    let app = spawn_app_with(|s| {
        s.payments.mode = keel_core::config::PaymentsMode::Stripe;
        s.payments.stripe_api_url = url.clone();
        s.payments.stripe_secret_key = "sk_test_123".into();
    })
    .await;
    let org = app.create_org("Acme").await;
    app.save_card(&org, "pm_card_mastercard").await;
    let path = format!("/api/billing/customer?orgId={}", org.org_id);
    assert_error(app.delete(&path, &org.member_token).await, StatusCode::FORBIDDEN).await;
    assert_error(app.delete(&path, &org.api_key).await, StatusCode::FORBIDDEN).await;

    stripe.state.lock().unwrap().fail_customer_delete = true;
    let failed = json_of(app.delete(&path, &org.owner_token).await, StatusCode::OK).await;
    assert_eq!(failed["deleted"], false);
    assert!(failed["error"].as_str().unwrap().contains("processor"));
    stripe.state.lock().unwrap().fail_customer_delete = false;
    let deleted = json_of(app.delete(&path, &org.owner_token).await, StatusCode::OK).await;
    assert_eq!(deleted["deleted"], true);
    assert_eq!(deleted["customerId"], "cus_fake_1");
    let billing = app.billing(&org).await;
    assert_eq!(billing["paymentMethod"], Value::Null);
    assert_eq!(billing["customerId"], Value::Null);
    // The organization delete that follows still works.
    app.delete_org(&org).await;
}

#[actix_web::test]
async fn the_stripe_processor_gets_form_requests_with_idempotency_keys() {
    let (stripe, url) = FakeStripe::start();
    let app = spawn_app_with(|s| {
        s.payments.mode = keel_core::config::PaymentsMode::Stripe;
        s.payments.stripe_api_url = url.clone();
        s.payments.stripe_secret_key = "sk_test_123".into();
    })
    .await;
    let org = app.create_org("Acme").await;
    let card = json_of(app.save_card(&org, "pm_card_mastercard").await, StatusCode::OK).await;
    assert_eq!(
        card,
        json!({"brand": "mastercard", "last4": "4444", "expMonth": 1, "expYear": 2031})
    );
    let unknown = app.save_card(&org, "pm_unknown_1").await;
    assert_error(unknown, StatusCode::NOT_FOUND).await;

    // A retried top-up with the same Idempotency-Key charges and credits once.
    for _ in 0..2 {
        let response = app
            .request(reqwest::Method::POST, "/api/billing/topup", Some(&org.api_key))
            .header("Idempotency-Key", "client-retry-1")
            .json(&json!({"orgId": org.org_id, "amountCents": 1500}))
            .send()
            .await
            .unwrap();
        let body = json_of(response, StatusCode::OK).await;
        assert_eq!(body["balanceCents"], 1500);
    }
    assert_eq!(stripe.charges(), 1);

    let requests = stripe.requests();
    assert!(requests
        .iter()
        .all(|r| r.authorization.as_deref() == Some("Bearer sk_test_123")));
    assert!(
        requests
            .iter()
            .filter(|r| r.method == "POST")
            .all(|r| r.idempotency_key.is_some()),
        "every POST carries an Idempotency-Key"
    );
    let charge = requests.iter().find(|r| r.path == "/v1/payment_intents").unwrap();
    assert_eq!(charge.form["amount"], "1500");
    assert_eq!(charge.form["currency"], "usd");
    assert_eq!(charge.form["customer"], "cus_fake_1");
    assert_eq!(charge.form["payment_method"], "pm_card_mastercard");
    assert_eq!(charge.form["off_session"], "true");
    assert_eq!(charge.form["confirm"], "true");
    assert_eq!(charge.form["metadata[orgId]"], org.org_id);
    assert!(requests
        .iter()
        .any(|r| r.path == "/v1/payment_methods/pm_card_mastercard/attach"));

    // A decline is a 402.
    app.save_card(&org, "pm_decline").await;
    let declined = app.topup(&org, 500).await;
    assert_error(declined, StatusCode::PAYMENT_REQUIRED).await;
    assert_eq!(app.balance_microcents(&org).await, 1_500_000_000);
    // The replaced card was detached.
    assert!(stripe
        .requests()
        .iter()
        .any(|r| r.path == "/v1/payment_methods/pm_card_mastercard/detach"));
}

#[actix_web::test]
async fn two_instances_on_one_database_never_double_charge() {
    let first = spawn_app().await;
    let org = first.create_org("Acme").await;
    let served = first.create_org("Served").await;
    let second = spawn_on(TestDb::reuse(&first.db_url), test_settings(&first.db_url)).await;
    first
        .post(
            "/api/billing/starter-credit",
            &org.api_key,
            &json!({"orgId": org.org_id}),
        )
        .await;
    setup_adapter(&first, &served, "bot").await;

    let mut calls = Vec::new();
    for i in 0..40 {
        let app = if i % 2 == 0 { &first } else { &second };
        // Fees on one organization: its 500 cents cover exactly five.
        calls.push(app.post_later(
            "/api/billing/debit",
            &org.api_key,
            &json!({"orgId": org.org_id, "runId": format!("r{i}")}),
        ));
        // Serving usage on another, each request id sent to both instances.
        calls.push(app.post_later(
            "/api/billing/serving-usage",
            INTERNAL_KEY,
            &json!({"requestId": format!("g{}", i / 2), "adapterId": "bot", "promptTokens": 10, "completionTokens": 10}),
        ));
    }
    let responses = join_all(calls).await;
    let fees_ok = responses
        .iter()
        .filter(|r| r.url().path() == "/api/billing/debit" && r.status() == StatusCode::OK)
        .count();
    assert_eq!(fees_ok, 5);
    assert!(responses
        .iter()
        .filter(|r| r.url().path() == "/api/billing/serving-usage")
        .all(|r| r.status() == StatusCode::OK));
    assert_eq!(first.assert_ledger_invariant(&org.org_id).await, (0, 6));
    // 20 distinct serving requests at 360 µ¢ each, whichever instance saw them first.
    assert_eq!(
        first.assert_ledger_invariant(&served.org_id).await,
        (-20 * 360, 20)
    );
}

#[actix_web::test]
async fn instances_taking_turns_on_one_organization_each_see_the_others_charges() {
    // On PostgreSQL a ledger plans a batch on the account as it last left it and writes it
    // in one statement guarded by the row's version. Two instances taking turns each find
    // the row moved by the other; a settings change made outside the ledger moves it too.
    let first = spawn_app().await;
    let org = first.create_org("Acme").await;
    setup_adapter(&first, &org, "bot").await;
    let second = spawn_on(TestDb::reuse(&first.db_url), test_settings(&first.db_url)).await;
    let charge = |app: &TestApp, id: String| {
        let body = json!({"requestId": id, "adapterId": "bot", "promptTokens": 10, "completionTokens": 10});
        app.post_later("/api/billing/serving-usage", INTERNAL_KEY, &body)
    };
    for i in 0..10 {
        for (n, app) in [(2 * i + 1, &first), (2 * i + 2, &second)] {
            let answer = json_of(charge(app, format!("turn-{n}")).await, StatusCode::OK).await;
            assert_eq!(answer["balanceMicrocents"], -360 * n, "charge {n}");
        }
    }
    assert_eq!(first.assert_ledger_invariant(&org.org_id).await, (-360 * 20, 20));

    // A card and auto top-up saved outside the ledger: the next charge through the first
    // instance (whose last view of the account has neither) must see them and top up.
    first.save_card(&org, "pm_card_visa").await;
    let saved = first
        .put(
            "/api/billing/auto-topup",
            &org.api_key,
            &json!({"orgId": org.org_id, "enabled": true, "thresholdCents": 100, "amountCents": 1000}),
        )
        .await;
    assert_eq!(saved.status(), StatusCode::OK);
    json_of(charge(&first, "after-settings".into()).await, StatusCode::OK).await;
    assert!(
        eventually(|| async { first.balance_microcents(&org).await == 1000 * 1_000_000 - 360 * 21 }).await,
        "the charge after the settings change tops up once"
    );
    first.assert_ledger_invariant(&org.org_id).await;
}

#[actix_web::test]
async fn many_organizations_charged_at_once_each_keep_their_own_rules() {
    // Their batches share transactions (cross-organization group commit); every
    // organization's balance rules and invariant still hold on their own.
    let app = spawn_app().await;
    let mut orgs = Vec::new();
    for i in 0..12 {
        let org = app.create_org(&format!("Org {i}")).await;
        app.post(
            "/api/billing/starter-credit",
            &org.api_key,
            &json!({"orgId": org.org_id}),
        )
        .await;
        orgs.push(org);
    }
    let app = &app;
    let calls = orgs.iter().flat_map(|org| {
        (0..8).map(move |i| {
            app.post_later(
                "/api/billing/debit",
                &org.api_key,
                &json!({"orgId": org.org_id, "runId": format!("r{i}")}),
            )
        })
    });
    let responses = join_all(calls).await;
    let ok = responses.iter().filter(|r| r.status() == StatusCode::OK).count();
    assert_eq!(ok, 12 * 5, "500 cents cover five fees in each organization");
    for org in &orgs {
        assert_eq!(app.assert_ledger_invariant(&org.org_id).await, (0, 6));
    }
}

/// A top-up with an `Idempotency-Key` header.
fn keyed_topup(app: &TestApp, org: &TestOrg, key: &str, cents: i64) -> reqwest::RequestBuilder {
    app.request(reqwest::Method::POST, "/api/billing/topup", Some(&org.api_key))
        .header("Idempotency-Key", key)
        .json(&json!({"orgId": org.org_id, "amountCents": cents}))
}

#[actix_web::test]
async fn a_retried_top_up_with_the_same_idempotency_key_charges_and_credits_once() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    app.save_card(&org, "pm_card_visa").await;
    let mut answers = Vec::new();
    for _ in 0..3 {
        answers.push(
            json_of(
                keyed_topup(&app, &org, "same-key-1", 100).send().await.unwrap(),
                StatusCode::OK,
            )
            .await,
        );
    }
    assert!(
        answers.iter().all(|a| a == &answers[0]),
        "the original result: {answers:?}"
    );
    assert_eq!(answers[0]["status"], "succeeded");
    assert_eq!(answers[0]["balanceCents"], 100);
    // Racing retries too.
    let racing = join_all((0..5).map(|_| keyed_topup(&app, &org, "same-key-2", 200).send())).await;
    let mut intents = HashSet::new();
    for response in racing {
        let body = json_of(response.unwrap(), StatusCode::OK).await;
        intents.insert(body["paymentIntentId"].as_str().unwrap().to_owned());
    }
    assert_eq!(intents.len(), 1, "one payment intent per key");
    assert_eq!(app.billing(&org).await["balanceCents"], 300);
    // The same key for another amount is a conflict, and charges nothing.
    assert_error(
        keyed_topup(&app, &org, "same-key-1", 500).send().await.unwrap(),
        StatusCode::CONFLICT,
    )
    .await;
    // Without a key, every call is a new top-up.
    app.fund(&org, 100).await;
    app.fund(&org, 100).await;
    assert_eq!(app.billing(&org).await["balanceCents"], 500);
    let (_, entries) = app.assert_ledger_invariant(&org.org_id).await;
    assert_eq!(entries, 4);
}

#[actix_web::test]
async fn racing_top_ups_with_one_key_and_different_amounts_credit_the_first_and_refuse_the_others() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    app.save_card(&org, "pm_card_visa").await;
    for round in 0..3 {
        let key = format!("mixed-{round}");
        let racing = join_all((0..10).map(|i| {
            let cents = if i % 2 == 0 { 300 } else { 700_000 };
            let request = keyed_topup(&app, &org, &key, cents).send();
            async move { (cents, request.await.unwrap()) }
        }))
        .await;
        let mut credited: Option<i64> = None;
        for (cents, response) in racing {
            match response.status() {
                StatusCode::OK => {
                    // Every 200 is the one payment of this key, for its caller's own amount.
                    assert_eq!(
                        *credited.get_or_insert(cents),
                        cents,
                        "a call answered with another amount's payment"
                    );
                }
                StatusCode::CONFLICT => {}
                other => panic!("{other}: {}", response.text().await.unwrap()),
            }
        }
        assert!(credited.is_some(), "one amount went through");
    }
    // Each key credited once, its first amount.
    let (_, entries) = app.assert_ledger_invariant(&org.org_id).await;
    assert_eq!(entries, 3);
}

#[actix_web::test]
async fn a_declined_top_up_retried_with_its_key_is_declined_again_without_a_new_charge() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    app.save_card(&org, "pm_card_chargeDeclined").await;
    for _ in 0..2 {
        assert_error(
            keyed_topup(&app, &org, "declined-1", 100).send().await.unwrap(),
            StatusCode::PAYMENT_REQUIRED,
        )
        .await;
    }
    let db = sea_orm::Database::connect(app.db_url.as_str()).await.unwrap();
    use sea_orm::{EntityTrait, PaginatorTrait};
    assert_eq!(entities::payment::Entity::find().count(&db).await.unwrap(), 1);
    assert_eq!(app.billing(&org).await["balanceCents"], 0);
}

#[actix_web::test]
async fn an_idempotency_key_out_of_bounds_is_a_422_naming_the_header() {
    let app = spawn_app().await;
    let org = app.create_org("Acme").await;
    app.save_card(&org, "pm_card_visa").await;
    for key in ["k".repeat(201), String::new(), "two words".into()] {
        let issues = validation_issues(keyed_topup(&app, &org, &key, 100).send().await.unwrap()).await;
        assert_eq!(issues[0]["loc"], json!(["header", "Idempotency-Key"]), "{key:?}");
    }
    assert_eq!(app.billing(&org).await["balanceCents"], 0, "nothing was charged");
    json_of(
        keyed_topup(&app, &org, &"k".repeat(200), 100)
            .send()
            .await
            .unwrap(),
        StatusCode::OK,
    )
    .await;
}
