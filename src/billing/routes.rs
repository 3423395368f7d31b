//! The billing routes: the spec's sixteen, and the credit grants' listing.

use actix_web::{web, HttpResponse};

use super::dto::*;
use crate::auth::{ApiKeyCaller, Internal, Member, Owner};
use crate::error::{ApiError, ApiResult, Code, ErrorBody, ValidationErrorBody};
use crate::http::extract::{DeferredBody, IdempotencyKeyHeader, ValidJson, ValidQuery};
use crate::state::AppState;
use keel_core::billing::service;

// Handlers: each extracts, calls one service or repo function, answers.

/// Read an organization's billing
///
/// Balance (cents and exact microcents), saved card, auto top-up settings, starter-credit state
/// and recent ledger entries of the organization named by `orgId` (or the API key's own).
#[utoipa::path(get, path = "/api/billing", tag = "billing", security(("apiKey" = []), ("session" = [])),
    params(OrgQuery),
    responses((status = 200, body = BillingView), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 422, body = ValidationErrorBody)))]
pub async fn get_billing(member: Member<ValidQuery<OrgQuery>>) -> ApiResult<HttpResponse> {
    let overview = service::overview(&member.state.billing, &member.access.org_id).await?;
    Ok(HttpResponse::Ok().json(BillingView::new(overview)))
}

/// Grant credit by hand (operators)
///
/// A goodwill credit or a refund: a grant of kind `manual` with its reason and who made it
/// (the internal key's label), drawn by `priority` (default: the promotional one) and lapsing
/// at `expiresAt` if given. The `Idempotency-Key` header is required: a repeat answers the
/// original grant; the same key with another body is 409.
#[utoipa::path(post, path = "/api/internal/billing/grants", tag = "billing", security(("internalKey" = [])),
    request_body = ManualGrantBody,
    params(("Idempotency-Key" = String, Header, min_length = 1, max_length = 200, pattern = "^[!-~]+$",
        description = "Required: one grant per key")),
    responses((status = 201, body = ManualGrantView), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The Idempotency-Key was used with another body", body = ErrorBody),
        (status = 422, body = ValidationErrorBody)))]
pub async fn manual_grant(
    caller: crate::auth::InternalCaller,
    key: IdempotencyKeyHeader,
    body: ValidJson<ManualGrantBody>,
    state: web::Data<AppState>,
) -> ApiResult<HttpResponse> {
    let key = key.0.ok_or_else(|| {
        ApiError::validation(
            vec!["header".into(), "Idempotency-Key".into()],
            "missing",
            "Field required",
        )
    })?;
    let body = body.0;
    let grant = service::manual_grant(
        &state.billing,
        &body.org_id,
        service::ManualGrant {
            amount: body.amount_cents,
            reason: body.reason,
            expires_at: body.expires_at,
            priority: body.priority,
            key,
            created_by: caller.label,
        },
    )
    .await?;
    Ok(HttpResponse::Created().json(ManualGrantView {
        reason: grant.reason.clone(),
        created_by: grant.created_by.clone(),
        grant: GrantView::from(grant),
    }))
}

/// A month's statement
///
/// The UTC month's opening balance, credits and debits by ledger kind, expired credit and
/// closing balance, in microcents: opening + credits − debits − expired = closing, exactly.
#[utoipa::path(get, path = "/api/billing/statement", tag = "billing", security(("apiKey" = []), ("session" = [])),
    params(StatementQuery),
    responses((status = 200, body = StatementView), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
pub async fn statement(member: Member<ValidQuery<StatementQuery>>) -> ApiResult<HttpResponse> {
    let statement = keel_core::billing::statement::statement(
        &member.state.billing,
        &member.access.org_id,
        &member.input.0.month,
    )
    .await?;
    Ok(HttpResponse::Ok().json(StatementView::from(statement)))
}

/// The ledger as CSV
///
/// Every entry (no row limit), oldest first, streamed: RFC 4180, a header row, amounts in
/// cents with six decimals (exact). `from` and `to` (RFC 3339) narrow it.
#[utoipa::path(get, path = "/api/billing/ledger.csv", tag = "billing", security(("apiKey" = []), ("session" = [])),
    params(LedgerCsvQuery),
    responses((status = 200, description = "text/csv", content_type = "text/csv", body = String),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
pub async fn ledger_csv(member: Member<ValidQuery<LedgerCsvQuery>>) -> ApiResult<HttpResponse> {
    let query = &member.input.0;
    service::account_of(&member.state.billing, &member.access.org_id).await?;
    Ok(super::export::ledger_csv(
        &member.state.billing,
        member.access.org_id.clone(),
        query.from.as_deref().and_then(instant),
        query.to.as_deref().and_then(instant),
    ))
}

/// List an organization's credit grants
///
/// Every credit is a grant. The active ones (something left) come first, in the order debits
/// draw from them (lower priority, then the soonest expiry, then the oldest), then the spent
/// and expired ones, newest first.
#[utoipa::path(get, path = "/api/billing/grants", tag = "billing", security(("apiKey" = []), ("session" = [])),
    params(OrgQuery),
    responses((status = 200, body = GrantsPage), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
pub async fn list_grants(member: Member<ValidQuery<OrgQuery>>) -> ApiResult<HttpResponse> {
    let grants = service::grants(&member.state.billing, &member.access.org_id).await?;
    Ok(HttpResponse::Ok().json(GrantsPage {
        grants: grants.into_iter().map(GrantView::from).collect(),
    }))
}

/// Start saving a card
///
/// Creates the payment processor's customer for the organization if needed and a setup intent
/// whose client secret a card form confirms. With the simulated processor the card numbers of
/// the README stand for the cards.
#[utoipa::path(post, path = "/api/billing/setup-intent", tag = "billing", security(("apiKey" = []), ("session" = [])),
    request_body = OrgBody,
    responses((status = 200, body = SetupIntentView), (status = 403, body = ErrorBody), (status = 502, body = ErrorBody)))]
pub async fn setup_intent(member: Member<ValidJson<OrgBody>>) -> ApiResult<HttpResponse> {
    let (client_secret, customer_id) =
        service::setup_intent(&member.state.billing, &member.access.org_id).await?;
    Ok(HttpResponse::Ok().json(SetupIntentView {
        client_secret,
        customer_id,
    }))
}

/// Save a card
///
/// Attaches a confirmed payment method (with the simulated processor: one of its test cards,
/// such as `pm_card_visa`) as the organization's card for top-ups and auto top-up.
#[utoipa::path(post, path = "/api/billing/payment-method", tag = "billing", security(("apiKey" = []), ("session" = [])),
    request_body = PaymentMethodBody,
    responses((status = 200, body = CardView), (status = 404, description = "Unknown payment method", body = ErrorBody)))]
pub async fn save_payment_method(member: Member<ValidJson<PaymentMethodBody>>) -> ApiResult<HttpResponse> {
    let payment_method_id = &member.input.0.payment_method_id;
    let card =
        service::save_payment_method(&member.state.billing, &member.access.org_id, payment_method_id).await?;
    Ok(HttpResponse::Ok().json(CardView::from(card)))
}

/// Remove the saved card
///
/// Detaches the organization's saved card; auto top-up stops until a new card is saved.
#[utoipa::path(delete, path = "/api/billing/payment-method", tag = "billing", security(("apiKey" = []), ("session" = [])),
    params(OrgQuery),
    responses((status = 200, body = PaymentMethodDeleted), (status = 404, description = "No saved payment method", body = ErrorBody)))]
pub async fn delete_payment_method(member: Member<ValidQuery<OrgQuery>>) -> ApiResult<HttpResponse> {
    let auto_topup_disabled =
        service::delete_payment_method(&member.state.billing, &member.access.org_id).await?;
    Ok(HttpResponse::Ok().json(PaymentMethodDeleted {
        deleted: true,
        auto_topup_disabled,
    }))
}

/// Delete the payment customer
///
/// Owner-gated: deletes the organization's payment-processor customer and its saved cards, as
/// the organization-delete flow does first. Best-effort: a processor failure is reported, never
/// blocking.
#[utoipa::path(delete, path = "/api/billing/customer", tag = "billing", security(("session" = [])),
    params(OrgQuery),
    responses((status = 200, description = "Best effort: failures are reported, never raised", body = CustomerDeleted),
        (status = 403, description = "Not an owner's session", body = ErrorBody)))]
pub async fn delete_customer(owner: Owner<ValidQuery<OrgQuery>>) -> ApiResult<HttpResponse> {
    let deletion = service::delete_customer(&owner.state.billing, &owner.access.org_id).await?;
    Ok(HttpResponse::Ok().json(CustomerDeleted {
        deleted: deletion.deleted,
        customer_id: deletion.customer_id,
        error: deletion.error,
    }))
}

/// Top up the balance
///
/// Charges the saved card `amountCents` and credits the balance once the charge succeeds. An
/// `Idempotency-Key` header makes a retry the same payment: it is charged and credited once. A
/// declined card is 402.
#[utoipa::path(post, path = "/api/billing/topup", tag = "billing", security(("apiKey" = []), ("session" = [])),
    request_body = TopupBody,
    params(("Idempotency-Key" = Option<String>, Header, min_length = 1, max_length = 200, pattern = "^[!-~]+$",
        description = "Makes a retried top-up charge once: a retry answers the first attempt's result")),
    responses((status = 200, body = TopupView), (status = 402, description = "Card declined", body = ErrorBody),
        (status = 409, description = "No saved payment method, or the Idempotency-Key was used for another amount", body = ErrorBody),
        (status = 422, body = ValidationErrorBody)))]
pub async fn topup(
    member: Member<ValidJson<TopupBody>>,
    key: IdempotencyKeyHeader,
) -> ApiResult<HttpResponse> {
    let amount = member.input.0.amount_cents;
    let topup = service::topup(
        &member.state.billing,
        &member.access.org_id,
        amount,
        key.0.as_deref(),
    )
    .await?;
    Ok(HttpResponse::Ok().json(TopupView {
        status: topup.status.to_string(),
        payment_intent_id: topup.payment_intent_id,
        balance_cents: topup.balance.floor_cents(),
        client_secret: topup.client_secret,
    }))
}

/// Set auto top-up
///
/// Turns automatic top-up on or off: when a charge takes the balance under `thresholdCents`,
/// the saved card is charged `amountCents`.
#[utoipa::path(put, path = "/api/billing/auto-topup", tag = "billing", security(("apiKey" = []), ("session" = [])),
    request_body = AutoTopupBody,
    responses((status = 200, body = AutoTopupView), (status = 409, description = "No saved payment method", body = ErrorBody),
        (status = 422, body = ValidationErrorBody)))]
pub async fn put_auto_topup(member: Member<ValidJson<AutoTopupBody>>) -> ApiResult<HttpResponse> {
    let body = &member.input.0;
    let charged =
        service::set_auto_topup(&member.state.billing, &member.access.org_id, body.settings()).await?;
    Ok(HttpResponse::Ok().json(AutoTopupView {
        enabled: body.enabled,
        threshold_cents: body.threshold_cents,
        amount_cents: body.amount_cents,
        monthly_limit_cents: body.monthly_limit_cents,
        charged_this_month_cents: charged,
    }))
}

/// Claim the starter credit
///
/// Credits the organization's one-time starter credit; a second claim answers the first grant
/// and credits nothing.
#[utoipa::path(post, path = "/api/billing/starter-credit", tag = "billing", security(("apiKey" = []), ("session" = [])),
    request_body = OrgBody,
    responses((status = 200, body = CreditView), (status = 409, description = "Already granted", body = ErrorBody)))]
pub async fn starter_credit(member: Member<ValidJson<OrgBody>>) -> ApiResult<HttpResponse> {
    let (credited, outcome) =
        service::grant_starter_credit(&member.state.billing, &member.access.org_id).await?;
    Ok(HttpResponse::Ok().json(CreditView {
        credited_cents: credited,
        balance_cents: outcome.balance.floor_cents(),
        code: None,
    }))
}

/// Redeem a promo code
///
/// Any member may redeem: credits the code's fixed amount with no card, once per organization
/// and code. An unknown code is 404.
#[utoipa::path(post, path = "/api/billing/promo-code", tag = "billing", security(("apiKey" = []), ("session" = [])),
    request_body = PromoCodeBody,
    responses((status = 200, body = CreditView), (status = 404, description = "Unknown code", body = ErrorBody),
        (status = 409, description = "Already redeemed by this organization", body = ErrorBody)))]
pub async fn promo_code(member: Member<ValidJson<PromoCodeBody>>) -> ApiResult<HttpResponse> {
    let promo =
        service::redeem_promo(&member.state.billing, &member.access.org_id, &member.input.0.code).await?;
    Ok(HttpResponse::Ok().json(CreditView {
        credited_cents: promo.credited,
        balance_cents: promo.outcome.balance.floor_cents(),
        code: Some(promo.code),
    }))
}

/// The payment webhook's `Stripe-Signature` header, required: a call without one is 400
/// (the signature check's own answer) before its body is read.
pub struct StripeSignature(pub String);

impl actix_web::FromRequest for StripeSignature {
    type Error = ApiError;
    type Future = std::future::Ready<Result<Self, ApiError>>;

    fn from_request(req: &actix_web::HttpRequest, _: &mut actix_web::dev::Payload) -> Self::Future {
        std::future::ready(
            req.headers()
                .get("stripe-signature")
                .and_then(|v| v.to_str().ok())
                .map(|v| Self(v.to_owned()))
                .ok_or_else(|| {
                    ApiError::Coded(
                        Code::InvalidSignature,
                        keel_core::billing::webhook::SignatureError::Malformed.to_string(),
                    )
                }),
        )
    }
}

/// Receive a payment processor event
///
/// Stripe's signed webhook (`Stripe-Signature`): confirms payments and saved cards. Each event
/// is applied once; an unsigned or badly signed call is 400.
#[utoipa::path(post, path = "/api/billing/webhook", tag = "billing",
    params(("Stripe-Signature" = String, Header, description = "t=<unix>,v1=<hex HMAC-SHA256 of \"t.body\">")),
    request_body(content = Object, description = "A payment-processor event"),
    responses((status = 200, body = WebhookAck), (status = 400, description = "Bad or missing signature", body = ErrorBody)))]
pub async fn stripe_webhook(
    state: web::Data<AppState>,
    signature: StripeSignature,
    body: DeferredBody,
) -> ApiResult<HttpResponse> {
    // The signature header is there (checked before the body is read); now the body.
    let body = body.read().await?;
    let duplicate = service::handle_webhook(&state.billing, Some(&signature.0), &body).await?;
    Ok(HttpResponse::Ok().json(WebhookAck {
        received: true,
        duplicate,
    }))
}

/// Charge the run fee
///
/// Debits the flat custom-model run fee from the prepaid balance before the run is created,
/// idempotently by `runId`. Insufficient balance is 402.
#[utoipa::path(post, path = "/api/billing/debit", tag = "billing", security(("apiKey" = []), ("session" = [])),
    request_body = DebitBody,
    responses((status = 200, body = ChargeView), (status = 402, description = "Balance too low", body = ErrorBody)))]
pub async fn debit(member: Member<ValidJson<DebitBody>>) -> ApiResult<HttpResponse> {
    let run_id = member.input.0.run_id.as_ref();
    let outcome = service::charge_run_fee(&member.state.billing, &member.access.org_id, run_id).await?;
    Ok(HttpResponse::Ok().json(ChargeView::from(&outcome)))
}

/// Meter a serving request
///
/// Internal key (the serving layer): bills a generation's tokens at the model's price plus 20%
/// and records the usage. `adapterId` names the billed organization (a supplied `orgId` must
/// match it); `orgId` alone is honored without an adapter. A replay of `requestId` answers the
/// first charge.
#[utoipa::path(post, path = "/api/billing/serving-usage", tag = "billing", security(("internalKey" = [])),
    request_body = ServingUsageBody,
    responses((status = 200, body = ServingChargeView),
        (status = 404, description = "Unknown adapter or organization, or unpriced model", body = ErrorBody),
        (status = 409, description = "orgId disagrees with the adapter's owner", body = ErrorBody),
        (status = 422, body = ValidationErrorBody)))]
pub async fn serving_usage(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<ServingUsageBody>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    let usage = service::ServingUsage {
        request_id: &body.request_id,
        org_id: body.org_id.as_ref(),
        adapter_id: body.adapter_id.as_deref(),
        model: body.model.as_deref(),
        prompt_tokens: body.prompt_tokens,
        completion_tokens: body.completion_tokens,
    };
    let (recorded, outcome) = service::charge_serving(&state.billing, usage).await?;
    Ok(HttpResponse::Ok().json(ServingChargeView::new(recorded, &outcome)))
}

/// Charge a training run's estimate
///
/// With the submitting user's API key: debits the run's pre-flight cost estimate, idempotently
/// by `runId`. Insufficient balance is 402, which blocks the run.
#[utoipa::path(post, path = "/api/billing/training-usage", tag = "billing", security(("apiKey" = []), ("session" = [])),
    request_body = TrainingUsageBody,
    responses((status = 200, body = RunChargeView), (status = 402, description = "Balance too low", body = ErrorBody),
        (status = 403, description = "Not a user API key", body = ErrorBody)))]
pub async fn training_usage(
    key: ApiKeyCaller,
    state: web::Data<AppState>,
    body: ValidJson<TrainingUsageBody>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    let outcome =
        service::charge_training_estimate(&state.billing, &key.org_id, &body.run_id, body.estimate_cents)
            .await?;
    Ok(HttpResponse::Ok().json(RunChargeView::new(body.run_id, &outcome)))
}

/// Check a run is affordable
///
/// Internal key: verify-only. 402 when the organization can cover the estimate neither from its
/// balance nor by auto top-up; moves no money.
#[utoipa::path(post, path = "/api/billing/training-usage/precheck", tag = "billing", security(("internalKey" = [])),
    request_body = TrainingPrecheckBody,
    responses((status = 200, body = PrecheckView),
        (status = 402, description = "Neither the balance nor a card with auto top-up covers the estimate", body = ErrorBody),
        (status = 404, body = ErrorBody)))]
pub async fn training_precheck(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<TrainingPrecheckBody>,
) -> ApiResult<HttpResponse> {
    service::precheck_training(&state.billing, &body.0.org_id, body.0.estimate_cents).await?;
    Ok(HttpResponse::Ok().json(PrecheckView { ok: true }))
}

/// Charge a completed managed run
///
/// Internal key: charges a finished managed training run's cost to the named organization,
/// idempotently by `runId`.
#[utoipa::path(post, path = "/api/billing/training-usage/internal", tag = "billing", security(("internalKey" = [])),
    request_body = InternalTrainingUsageBody,
    responses((status = 200, body = RunChargeView), (status = 404, body = ErrorBody)))]
pub async fn training_usage_internal(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<InternalTrainingUsageBody>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    let outcome =
        service::charge_training_run(&state.billing, &body.org_id, &body.run_id, body.amount_cents).await?;
    Ok(HttpResponse::Ok().json(RunChargeView::new(body.run_id, &outcome)))
}

/// Record a run's realized cost
///
/// Internal key: upserts the provider cost of a run by `runId`; no organization is needed.
/// Re-pulled runs update the same row.
#[utoipa::path(post, path = "/api/billing/training-cost", tag = "billing", security(("internalKey" = [])),
    request_body = TrainingCostBody,
    responses((status = 200, body = TrainingCostView), (status = 403, description = "Not the internal key", body = ErrorBody)))]
pub async fn training_cost(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<TrainingCostBody>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    service::record_training_cost(
        &state.billing,
        &body.run_id,
        body.cost_cents,
        body.provider.as_deref(),
    )
    .await?;
    Ok(HttpResponse::Ok().json(TrainingCostView {
        run_id: body.run_id.into_string(),
        cost_cents: body.cost_cents,
    }))
}
