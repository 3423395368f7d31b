//! The sixteen billing routes of the spec.

use actix_web::{web, HttpRequest, HttpResponse};
use utoipa::OpenApi;

use super::dto::*;
use super::{repo, service};
use crate::auth::{ApiKeyCaller, Caller, Internal};
use crate::error::{ApiResult, ErrorBody, ValidationErrorBody};
use crate::http::extract::{IdempotencyKeyHeader, RawBody, ValidJson, ValidQuery};
use crate::http::resource;
use crate::state::AppState;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(resource("/api/billing").route(web::get().to(get_billing)))
        .service(resource("/api/billing/setup-intent").route(web::post().to(setup_intent)))
        .service(
            resource("/api/billing/payment-method")
                .route(web::post().to(save_payment_method))
                .route(web::delete().to(delete_payment_method)),
        )
        .service(resource("/api/billing/customer").route(web::delete().to(delete_customer)))
        .service(resource("/api/billing/topup").route(web::post().to(topup)))
        .service(resource("/api/billing/auto-topup").route(web::put().to(put_auto_topup)))
        .service(resource("/api/billing/starter-credit").route(web::post().to(starter_credit)))
        .service(resource("/api/billing/promo-code").route(web::post().to(promo_code)))
        .service(resource("/api/billing/webhook").route(web::post().to(stripe_webhook)))
        .service(resource("/api/billing/debit").route(web::post().to(debit)))
        .service(resource("/api/billing/serving-usage").route(web::post().to(serving_usage)))
        .service(resource("/api/billing/training-usage").route(web::post().to(training_usage)))
        .service(resource("/api/billing/training-usage/precheck").route(web::post().to(training_precheck)))
        .service(
            resource("/api/billing/training-usage/internal").route(web::post().to(training_usage_internal)),
        )
        .service(resource("/api/billing/training-cost").route(web::post().to(training_cost)));
}

#[derive(OpenApi)]
#[openapi(paths(
    get_billing,
    setup_intent,
    save_payment_method,
    delete_payment_method,
    delete_customer,
    topup,
    put_auto_topup,
    starter_credit,
    promo_code,
    stripe_webhook,
    debit,
    serving_usage,
    training_usage,
    training_precheck,
    training_usage_internal,
    training_cost
))]
pub struct Doc;

// Handlers: each extracts, calls one service or repo function, answers.

#[utoipa::path(get, path = "/api/billing", tag = "billing", security(("bearer" = [])),
    params(OrgQuery),
    responses((status = 200, body = BillingView), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 422, body = ValidationErrorBody)))]
pub async fn get_billing(caller: Caller, query: ValidQuery<OrgQuery>) -> ApiResult<HttpResponse> {
    let access = caller.member(Some(&query.0.org_id)).await?;
    let (account, recent) = service::overview(caller.state(), &access.org_id).await?;
    Ok(HttpResponse::Ok().json(BillingView::new(account, recent)))
}

#[utoipa::path(post, path = "/api/billing/setup-intent", tag = "billing", security(("bearer" = [])),
    request_body = OrgBody,
    responses((status = 200, body = SetupIntentView), (status = 403, body = ErrorBody), (status = 502, body = ErrorBody)))]
pub async fn setup_intent(caller: Caller, body: ValidJson<OrgBody>) -> ApiResult<HttpResponse> {
    let access = caller.member(Some(&body.0.org_id)).await?;
    let (client_secret, customer_id) = service::setup_intent(caller.state(), &access.org_id).await?;
    Ok(HttpResponse::Ok().json(SetupIntentView {
        client_secret,
        customer_id,
    }))
}

#[utoipa::path(post, path = "/api/billing/payment-method", tag = "billing", security(("bearer" = [])),
    request_body = PaymentMethodBody,
    responses((status = 200, body = CardView), (status = 404, description = "Unknown payment method", body = ErrorBody)))]
pub async fn save_payment_method(
    caller: Caller,
    body: ValidJson<PaymentMethodBody>,
) -> ApiResult<HttpResponse> {
    let access = caller.member(Some(&body.0.org_id)).await?;
    let card =
        service::save_payment_method(caller.state(), &access.org_id, &body.0.payment_method_id).await?;
    Ok(HttpResponse::Ok().json(CardView::from(card)))
}

#[utoipa::path(delete, path = "/api/billing/payment-method", tag = "billing", security(("bearer" = [])),
    params(OrgQuery),
    responses((status = 200, body = PaymentMethodDeleted), (status = 404, description = "No saved payment method", body = ErrorBody)))]
pub async fn delete_payment_method(caller: Caller, query: ValidQuery<OrgQuery>) -> ApiResult<HttpResponse> {
    let access = caller.member(Some(&query.0.org_id)).await?;
    let auto_topup_disabled = service::delete_payment_method(caller.state(), &access.org_id).await?;
    Ok(HttpResponse::Ok().json(PaymentMethodDeleted {
        deleted: true,
        auto_topup_disabled,
    }))
}

#[utoipa::path(delete, path = "/api/billing/customer", tag = "billing", security(("bearer" = [])),
    params(OrgQuery),
    responses((status = 200, description = "Best effort: failures are reported, never raised", body = CustomerDeleted),
        (status = 403, description = "Not an owner's session", body = ErrorBody)))]
pub async fn delete_customer(caller: Caller, query: ValidQuery<OrgQuery>) -> ApiResult<HttpResponse> {
    let access = caller.owner(Some(&query.0.org_id)).await?;
    let deletion = service::delete_customer(caller.state(), &access.org_id).await?;
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
    caller: Caller,
    key: IdempotencyKeyHeader,
    body: ValidJson<TopupBody>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    let access = caller.member(Some(&body.org_id)).await?;
    let topup = service::topup(
        caller.state(),
        &access.org_id,
        body.amount_cents,
        key.0.as_deref(),
    )
    .await?;
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
pub async fn put_auto_topup(caller: Caller, body: ValidJson<AutoTopupBody>) -> ApiResult<HttpResponse> {
    let body = body.0;
    let access = caller.member(Some(&body.org_id)).await?;
    service::set_auto_topup(
        caller.state(),
        &access.org_id,
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
pub async fn starter_credit(caller: Caller, body: ValidJson<OrgBody>) -> ApiResult<HttpResponse> {
    let access = caller.member(Some(&body.0.org_id)).await?;
    let (credited, outcome) = service::grant_starter_credit(caller.state(), &access.org_id).await?;
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
pub async fn promo_code(caller: Caller, body: ValidJson<PromoCodeBody>) -> ApiResult<HttpResponse> {
    let access = caller.member(Some(&body.0.org_id)).await?;
    let promo = service::redeem_promo(caller.state(), &access.org_id, &body.0.code).await?;
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
pub async fn debit(caller: Caller, body: ValidJson<DebitBody>) -> ApiResult<HttpResponse> {
    let access = caller.member(Some(&body.0.org_id)).await?;
    let outcome = service::charge_run_fee(caller.state(), &access.org_id, body.0.run_id.as_ref()).await?;
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
