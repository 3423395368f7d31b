//! The sixteen billing routes of the spec.

use actix_web::{web, HttpRequest, HttpResponse};

use super::dto::*;
use super::{repo, service};
use crate::auth::{ApiKeyCaller, Internal, Member, Owner};
use crate::error::{ApiResult, ErrorBody, ValidationErrorBody};
use crate::http::extract::{IdempotencyKeyHeader, RawBody, ValidJson, ValidQuery};
use crate::state::AppState;

// Handlers: each extracts, calls one service or repo function, answers.

#[utoipa::path(get, path = "/api/billing", tag = "billing", security(("bearer" = [])),
    params(OrgQuery),
    responses((status = 200, body = BillingView), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 422, body = ValidationErrorBody)))]
pub async fn get_billing(member: Member<ValidQuery<OrgQuery>>) -> ApiResult<HttpResponse> {
    let (account, recent) = service::overview(&member.state, &member.access.org_id).await?;
    Ok(HttpResponse::Ok().json(BillingView::new(account, recent)))
}

#[utoipa::path(post, path = "/api/billing/setup-intent", tag = "billing", security(("bearer" = [])),
    request_body = OrgBody,
    responses((status = 200, body = SetupIntentView), (status = 403, body = ErrorBody), (status = 502, body = ErrorBody)))]
pub async fn setup_intent(member: Member<ValidJson<OrgBody>>) -> ApiResult<HttpResponse> {
    let (client_secret, customer_id) = service::setup_intent(&member.state, &member.access.org_id).await?;
    Ok(HttpResponse::Ok().json(SetupIntentView {
        client_secret,
        customer_id,
    }))
}

#[utoipa::path(post, path = "/api/billing/payment-method", tag = "billing", security(("bearer" = [])),
    request_body = PaymentMethodBody,
    responses((status = 200, body = CardView), (status = 404, description = "Unknown payment method", body = ErrorBody)))]
pub async fn save_payment_method(member: Member<ValidJson<PaymentMethodBody>>) -> ApiResult<HttpResponse> {
    let payment_method_id = &member.input.0.payment_method_id;
    let card = service::save_payment_method(&member.state, &member.access.org_id, payment_method_id).await?;
    Ok(HttpResponse::Ok().json(CardView::from(card)))
}

#[utoipa::path(delete, path = "/api/billing/payment-method", tag = "billing", security(("bearer" = [])),
    params(OrgQuery),
    responses((status = 200, body = PaymentMethodDeleted), (status = 404, description = "No saved payment method", body = ErrorBody)))]
pub async fn delete_payment_method(member: Member<ValidQuery<OrgQuery>>) -> ApiResult<HttpResponse> {
    let auto_topup_disabled = service::delete_payment_method(&member.state, &member.access.org_id).await?;
    Ok(HttpResponse::Ok().json(PaymentMethodDeleted {
        deleted: true,
        auto_topup_disabled,
    }))
}

#[utoipa::path(delete, path = "/api/billing/customer", tag = "billing", security(("bearer" = [])),
    params(OrgQuery),
    responses((status = 200, description = "Best effort: failures are reported, never raised", body = CustomerDeleted),
        (status = 403, description = "Not an owner's session", body = ErrorBody)))]
pub async fn delete_customer(owner: Owner<ValidQuery<OrgQuery>>) -> ApiResult<HttpResponse> {
    let deletion = service::delete_customer(&owner.state, &owner.access.org_id).await?;
    Ok(HttpResponse::Ok().json(CustomerDeleted {
        deleted: deletion.deleted,
        customer_id: deletion.customer_id,
        error: deletion.error,
    }))
}

#[utoipa::path(post, path = "/api/billing/topup", tag = "billing", security(("bearer" = [])),
    request_body = TopupBody,
    params(("Idempotency-Key" = Option<String>, Header, min_length = 1, max_length = 200,
        description = "Makes a retried top-up charge once: a retry answers the first attempt's result")),
    responses((status = 200, body = TopupView), (status = 402, description = "Card declined", body = ErrorBody),
        (status = 409, description = "No saved payment method, or the Idempotency-Key was used for another amount", body = ErrorBody),
        (status = 422, body = ValidationErrorBody)))]
pub async fn topup(
    member: Member<ValidJson<TopupBody>>,
    key: IdempotencyKeyHeader,
) -> ApiResult<HttpResponse> {
    let amount = member.input.0.amount_cents;
    let topup = service::topup(&member.state, &member.access.org_id, amount, key.0.as_deref()).await?;
    Ok(HttpResponse::Ok().json(TopupView {
        status: topup.status,
        payment_intent_id: topup.payment_intent_id,
        balance_cents: topup.balance.floor_cents(),
        client_secret: topup.client_secret,
    }))
}

#[utoipa::path(put, path = "/api/billing/auto-topup", tag = "billing", security(("bearer" = [])),
    request_body = AutoTopupBody,
    responses((status = 200, body = AutoTopupView), (status = 409, description = "No saved payment method", body = ErrorBody),
        (status = 422, body = ValidationErrorBody)))]
pub async fn put_auto_topup(member: Member<ValidJson<AutoTopupBody>>) -> ApiResult<HttpResponse> {
    let body = &member.input.0;
    service::set_auto_topup(
        &member.state,
        &member.access.org_id,
        body.enabled,
        body.threshold_cents,
        body.amount_cents,
    )
    .await?;
    Ok(HttpResponse::Ok().json(AutoTopupView {
        enabled: body.enabled,
        threshold_cents: body.threshold_cents,
        amount_cents: body.amount_cents,
    }))
}

#[utoipa::path(post, path = "/api/billing/starter-credit", tag = "billing", security(("bearer" = [])),
    request_body = OrgBody,
    responses((status = 200, body = CreditView), (status = 409, description = "Already granted", body = ErrorBody)))]
pub async fn starter_credit(member: Member<ValidJson<OrgBody>>) -> ApiResult<HttpResponse> {
    let (credited, outcome) = service::grant_starter_credit(&member.state, &member.access.org_id).await?;
    Ok(HttpResponse::Ok().json(CreditView {
        credited_cents: credited,
        balance_cents: outcome.balance.floor_cents(),
        code: None,
    }))
}

#[utoipa::path(post, path = "/api/billing/promo-code", tag = "billing", security(("bearer" = [])),
    request_body = PromoCodeBody,
    responses((status = 200, body = CreditView), (status = 404, description = "Unknown code", body = ErrorBody),
        (status = 409, description = "Already redeemed by this organization", body = ErrorBody)))]
pub async fn promo_code(member: Member<ValidJson<PromoCodeBody>>) -> ApiResult<HttpResponse> {
    let promo = service::redeem_promo(&member.state, &member.access.org_id, &member.input.0.code).await?;
    Ok(HttpResponse::Ok().json(CreditView {
        credited_cents: promo.credited,
        balance_cents: promo.outcome.balance.floor_cents(),
        code: Some(promo.code),
    }))
}

#[utoipa::path(post, path = "/api/billing/webhook", tag = "billing",
    params(("Stripe-Signature" = String, Header, description = "t=<unix>,v1=<hex HMAC-SHA256 of \"t.body\">")),
    request_body(content = Object, description = "A payment-processor event"),
    responses((status = 200, body = WebhookAck), (status = 400, description = "Bad or missing signature", body = ErrorBody)))]
pub async fn stripe_webhook(
    state: web::Data<AppState>,
    req: HttpRequest,
    body: RawBody,
) -> ApiResult<HttpResponse> {
    let signature = req
        .headers()
        .get("stripe-signature")
        .and_then(|v| v.to_str().ok());
    let duplicate = service::handle_webhook(&state, signature, &body.0).await?;
    Ok(HttpResponse::Ok().json(WebhookAck {
        received: true,
        duplicate,
    }))
}

#[utoipa::path(post, path = "/api/billing/debit", tag = "billing", security(("bearer" = [])),
    request_body = DebitBody,
    responses((status = 200, body = ChargeView), (status = 402, description = "Balance too low", body = ErrorBody)))]
pub async fn debit(member: Member<ValidJson<DebitBody>>) -> ApiResult<HttpResponse> {
    let run_id = member.input.0.run_id.as_ref();
    let outcome = service::charge_run_fee(&member.state, &member.access.org_id, run_id).await?;
    Ok(HttpResponse::Ok().json(ChargeView::from(&outcome)))
}

#[utoipa::path(post, path = "/api/billing/serving-usage", tag = "billing", security(("bearer" = [])),
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
    let (recorded, outcome) = service::charge_serving(&state, usage).await?;
    Ok(HttpResponse::Ok().json(ServingChargeView::new(recorded, &outcome)))
}

#[utoipa::path(post, path = "/api/billing/training-usage", tag = "billing", security(("bearer" = [])),
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
        service::charge_training_estimate(&state, &key.org_id, &body.run_id, body.estimate_cents).await?;
    Ok(HttpResponse::Ok().json(RunChargeView::new(body.run_id, &outcome)))
}

#[utoipa::path(post, path = "/api/billing/training-usage/precheck", tag = "billing", security(("bearer" = [])),
    request_body = TrainingPrecheckBody,
    responses((status = 200, body = PrecheckView),
        (status = 402, description = "Neither the balance nor a card with auto top-up covers the estimate", body = ErrorBody),
        (status = 404, body = ErrorBody)))]
pub async fn training_precheck(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<TrainingPrecheckBody>,
) -> ApiResult<HttpResponse> {
    service::precheck_training(&state, &body.0.org_id, body.0.estimate_cents).await?;
    Ok(HttpResponse::Ok().json(PrecheckView { ok: true }))
}

#[utoipa::path(post, path = "/api/billing/training-usage/internal", tag = "billing", security(("bearer" = [])),
    request_body = InternalTrainingUsageBody,
    responses((status = 200, body = RunChargeView), (status = 404, body = ErrorBody)))]
pub async fn training_usage_internal(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<InternalTrainingUsageBody>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    let outcome = service::charge_training_run(&state, &body.org_id, &body.run_id, body.amount_cents).await?;
    Ok(HttpResponse::Ok().json(RunChargeView::new(body.run_id, &outcome)))
}

#[utoipa::path(post, path = "/api/billing/training-cost", tag = "billing", security(("bearer" = [])),
    request_body = TrainingCostBody,
    responses((status = 200, body = TrainingCostView), (status = 403, description = "Not the internal key", body = ErrorBody)))]
pub async fn training_cost(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<TrainingCostBody>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    repo::upsert_training_cost(&state.db, &body.run_id, body.cost_cents, body.provider.as_deref()).await?;
    Ok(HttpResponse::Ok().json(TrainingCostView {
        run_id: body.run_id.into_string(),
        cost_cents: body.cost_cents,
    }))
}
