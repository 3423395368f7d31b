//! The sixteen billing routes of the spec.

use actix_web::{web, HttpRequest, HttpResponse};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{OpenApi, ToSchema};

use super::ledger::{EntryKind, LedgerOp, Outcome, ServingUsageRow, SideEffect};
use super::money::{cents_to_micros, micros_to_cents_ceil, micros_to_cents_floor, price_serving};
use super::service::{account_of, ensure_customer};
use super::{repo, service, webhook};
use crate::auth::{ApiKeyCaller, Caller, Internal};
use crate::domain::{IdempotencyKey, OrgId};
use crate::error::{ApiError, ApiResult, ErrorBody, ValidationErrorBody};
use crate::http::extract::{IdempotencyKeyHeader, RawBody, ValidJson, ValidQuery};
use crate::http::resource;
use crate::http::validate::{Checks, Validate};
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

// ---------------------------------------------------------------------------------------
// Bodies

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct OrgQuery {
    /// The organization (UUID).
    #[param(value_type = String)]
    pub org_id: OrgId,
}

impl Validate for OrgQuery {
    fn validate(&self, c: &mut Checks) {
        c.str_len("orgId", &self.org_id, 1, 100);
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OrgBody {
    #[schema(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
}

impl Validate for OrgBody {
    fn validate(&self, c: &mut Checks) {
        c.str_len("orgId", &self.org_id, 1, 100);
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PaymentMethodBody {
    #[schema(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
    #[schema(min_length = 1, max_length = 255)]
    pub payment_method_id: String,
}

impl Validate for PaymentMethodBody {
    fn validate(&self, c: &mut Checks) {
        c.str_len("orgId", &self.org_id, 1, 100);
        c.str_len("paymentMethodId", &self.payment_method_id, 1, 255);
    }
}

pub const MIN_TOPUP_CENTS: i64 = 100;
pub const MAX_TOPUP_CENTS: i64 = 1_000_000;
/// Estimates and charges above this many cents are refused as input mistakes.
const MAX_CHARGE_CENTS: i64 = 1_000_000_000;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopupBody {
    #[schema(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
    #[schema(minimum = 100, maximum = 1000000)]
    pub amount_cents: i64,
}

impl Validate for TopupBody {
    fn validate(&self, c: &mut Checks) {
        c.str_len("orgId", &self.org_id, 1, 100);
        c.int_range("amountCents", self.amount_cents, MIN_TOPUP_CENTS, MAX_TOPUP_CENTS);
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AutoTopupBody {
    #[schema(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
    pub enabled: bool,
    /// Required when enabled: top up once the balance falls under this.
    #[schema(minimum = 0, maximum = 1000000000)]
    pub threshold_cents: Option<i64>,
    /// Required when enabled: how much each top-up charges.
    #[schema(minimum = 100, maximum = 1000000)]
    pub amount_cents: Option<i64>,
}

impl Validate for AutoTopupBody {
    fn validate(&self, c: &mut Checks) {
        c.str_len("orgId", &self.org_id, 1, 100);
        c.opt_int_range("thresholdCents", self.threshold_cents, 0, MAX_CHARGE_CENTS);
        c.opt_int_range("amountCents", self.amount_cents, MIN_TOPUP_CENTS, MAX_TOPUP_CENTS);
        if self.enabled {
            if self.threshold_cents.is_none() {
                c.fail(
                    "thresholdCents",
                    "missing",
                    "Field required when auto top-up is enabled",
                );
            }
            if self.amount_cents.is_none() {
                c.fail(
                    "amountCents",
                    "missing",
                    "Field required when auto top-up is enabled",
                );
            }
        }
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PromoCodeBody {
    #[schema(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
    /// Case-insensitive.
    #[schema(min_length = 1, max_length = 100)]
    pub code: String,
}

impl Validate for PromoCodeBody {
    fn validate(&self, c: &mut Checks) {
        c.str_len("orgId", &self.org_id, 1, 100);
        c.str_len("code", &self.code, 1, 100);
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DebitBody {
    #[schema(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
    /// With a run id the fee is charged once per (organization, run).
    #[schema(min_length = 1, max_length = 200)]
    pub run_id: Option<String>,
}

impl Validate for DebitBody {
    fn validate(&self, c: &mut Checks) {
        c.str_len("orgId", &self.org_id, 1, 100);
        c.opt_str_len("runId", self.run_id.as_deref(), 1, 200);
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServingUsageBody {
    /// Per-generation id: a replay answers the original charge.
    #[schema(min_length = 1, max_length = 200)]
    pub request_id: String,
    /// Must match the adapter's owner when `adapterId` is given.
    #[schema(value_type = Option<String>)]
    pub org_id: Option<OrgId>,
    /// Authoritative for the billed organization.
    #[schema(min_length = 1, max_length = 512)]
    pub adapter_id: Option<String>,
    /// A priced base model (when no adapter is involved).
    #[schema(min_length = 1, max_length = 512)]
    pub model: Option<String>,
    #[schema(minimum = 0)]
    pub prompt_tokens: i64,
    #[schema(minimum = 0)]
    pub completion_tokens: i64,
}

impl Validate for ServingUsageBody {
    fn validate(&self, c: &mut Checks) {
        c.str_len("requestId", &self.request_id, 1, 200);
        c.opt_str_len("orgId", self.org_id.as_deref(), 1, 100);
        c.opt_str_len("adapterId", self.adapter_id.as_deref(), 1, 512);
        c.opt_str_len("model", self.model.as_deref(), 1, 512);
        c.int_range("promptTokens", self.prompt_tokens, 0, i64::from(i32::MAX));
        c.int_range("completionTokens", self.completion_tokens, 0, i64::from(i32::MAX));
        if self.adapter_id.is_none() && self.model.is_none() {
            c.fail("adapterId", "missing", "Either adapterId or model is required");
        }
        if self.adapter_id.is_none() && self.model.is_some() && self.org_id.is_none() {
            c.fail("orgId", "missing", "orgId is required when no adapterId is given");
        }
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrainingUsageBody {
    #[schema(min_length = 1, max_length = 128)]
    pub run_id: String,
    #[schema(exclusive_minimum = 0, maximum = 1000000000)]
    pub estimate_cents: i64,
}

impl Validate for TrainingUsageBody {
    fn validate(&self, c: &mut Checks) {
        c.str_len("runId", &self.run_id, 1, 128);
        c.int_gt("estimateCents", self.estimate_cents, 0);
        c.int_range("estimateCents", self.estimate_cents, i64::MIN, MAX_CHARGE_CENTS);
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrainingPrecheckBody {
    #[schema(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
    #[schema(exclusive_minimum = 0, maximum = 1000000000)]
    pub estimate_cents: i64,
}

impl Validate for TrainingPrecheckBody {
    fn validate(&self, c: &mut Checks) {
        c.str_len("orgId", &self.org_id, 1, 100);
        c.int_gt("estimateCents", self.estimate_cents, 0);
        c.int_range("estimateCents", self.estimate_cents, i64::MIN, MAX_CHARGE_CENTS);
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct InternalTrainingUsageBody {
    #[schema(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
    #[schema(min_length = 1, max_length = 128)]
    pub run_id: String,
    #[schema(minimum = 0, maximum = 1000000000)]
    pub amount_cents: i64,
}

impl Validate for InternalTrainingUsageBody {
    fn validate(&self, c: &mut Checks) {
        c.str_len("orgId", &self.org_id, 1, 100);
        c.str_len("runId", &self.run_id, 1, 128);
        c.int_range("amountCents", self.amount_cents, 0, MAX_CHARGE_CENTS);
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrainingCostBody {
    #[schema(min_length = 1, max_length = 128)]
    pub run_id: String,
    #[schema(minimum = 0, maximum = 1000000000)]
    pub cost_cents: i64,
    #[schema(max_length = 100)]
    pub provider: Option<String>,
}

impl Validate for TrainingCostBody {
    fn validate(&self, c: &mut Checks) {
        c.str_len("runId", &self.run_id, 1, 128);
        c.int_range("costCents", self.cost_cents, 0, MAX_CHARGE_CENTS);
        c.opt_str_len("provider", self.provider.as_deref(), 1, 100);
    }
}

// ---------------------------------------------------------------------------------------
// Answers

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CardView {
    pub brand: String,
    pub last4: String,
    pub exp_month: i32,
    pub exp_year: i32,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AutoTopupView {
    pub enabled: bool,
    pub threshold_cents: Option<i64>,
    pub amount_cents: Option<i64>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LedgerEntryView {
    pub id: i64,
    pub kind: String,
    pub amount_microcents: i64,
    pub balance_after_microcents: i64,
    pub reason: String,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BillingView {
    pub org_id: String,
    pub balance_cents: i64,
    pub balance_microcents: i64,
    pub customer_id: Option<String>,
    pub payment_method: Option<CardView>,
    pub auto_topup: AutoTopupView,
    /// Auto top-up is paused after three consecutive declines until its settings are saved.
    pub auto_topup_paused: bool,
    pub starter_credit_granted: bool,
    pub recent_ledger: Vec<LedgerEntryView>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChargeView {
    pub charged_cents: i64,
    pub balance_cents: i64,
    pub replayed: bool,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunChargeView {
    pub run_id: String,
    pub charged_cents: i64,
    pub balance_cents: i64,
    pub replayed: bool,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServingChargeView {
    pub request_id: String,
    pub org_id: String,
    pub cost_microcents: i64,
    pub charged_microcents: i64,
    pub balance_microcents: i64,
    pub replayed: bool,
}

// ---------------------------------------------------------------------------------------
// Handlers

#[utoipa::path(get, path = "/api/billing", tag = "billing", security(("bearer" = [])),
    params(OrgQuery),
    responses((status = 200, body = BillingView), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 422, body = ValidationErrorBody)))]
pub async fn get_billing(caller: Caller, query: ValidQuery<OrgQuery>) -> ApiResult<HttpResponse> {
    let access = caller.member(Some(&query.0.org_id)).await?;
    let state = caller.state();
    let account = account_of(state, &access.org_id).await?;
    let recent_ledger = repo::recent_ledger(&state.db, &access.org_id, 20)
        .await?
        .into_iter()
        .map(|e| LedgerEntryView {
            id: e.id,
            kind: e.kind,
            amount_microcents: e.amount_microcents,
            balance_after_microcents: e.balance_after_microcents,
            reason: e.reason,
            created_at: e.created_at,
        })
        .collect();
    let payment_method = match (&account.payment_method_id, account.pm_brand, account.pm_last4) {
        (Some(_), Some(brand), Some(last4)) => Some(CardView {
            brand,
            last4,
            exp_month: account.pm_exp_month.unwrap_or(0),
            exp_year: account.pm_exp_year.unwrap_or(0),
        }),
        _ => None,
    };
    Ok(HttpResponse::Ok().json(BillingView {
        org_id: access.org_id.into_string(),
        balance_cents: micros_to_cents_floor(account.balance_microcents),
        balance_microcents: account.balance_microcents,
        customer_id: account.customer_id,
        payment_method,
        auto_topup: AutoTopupView {
            enabled: account.auto_topup_enabled,
            threshold_cents: account.auto_topup_threshold_cents,
            amount_cents: account.auto_topup_amount_cents,
        },
        auto_topup_paused: account.auto_topup_enabled
            && account.auto_topup_declines >= super::ledger::MAX_AUTO_TOPUP_DECLINES,
        starter_credit_granted: account.starter_credit_granted,
        recent_ledger,
    }))
}

/// The organization's processor customer, created on first need.

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SetupIntentView {
    pub client_secret: String,
    pub customer_id: String,
}

#[utoipa::path(post, path = "/api/billing/setup-intent", tag = "billing", security(("bearer" = [])),
    request_body = OrgBody,
    responses((status = 200, body = SetupIntentView), (status = 403, body = ErrorBody), (status = 502, body = ErrorBody)))]
pub async fn setup_intent(caller: Caller, body: ValidJson<OrgBody>) -> ApiResult<HttpResponse> {
    let access = caller.member(Some(&body.0.org_id)).await?;
    let state = caller.state();
    let account = account_of(state, &access.org_id).await?;
    let customer_id = ensure_customer(state, &account).await?;
    let client_secret = state.payments.create_setup_intent(&customer_id).await?;
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
    let body = body.0;
    let access = caller.member(Some(&body.org_id)).await?;
    let state = caller.state();
    let account = account_of(state, &access.org_id).await?;
    let customer_id = ensure_customer(state, &account).await?;
    let card = state
        .payments
        .attach_payment_method(&customer_id, &body.payment_method_id)
        .await?;
    if let Some(old) = account
        .payment_method_id
        .as_deref()
        .filter(|old| *old != body.payment_method_id)
    {
        if let Err(err) = state.payments.detach_payment_method(old).await {
            tracing::warn!(org_id = %access.org_id, error = %err, "detaching the replaced payment method");
        }
    }
    repo::save_card(
        &state.db,
        &access.org_id,
        repo::SavedCard {
            payment_method_id: Some(&body.payment_method_id),
            brand: Some(&card.brand),
            last4: Some(&card.last4),
            exp_month: Some(card.exp_month),
            exp_year: Some(card.exp_year),
        },
    )
    .await?;
    Ok(HttpResponse::Ok().json(CardView {
        brand: card.brand,
        last4: card.last4,
        exp_month: card.exp_month,
        exp_year: card.exp_year,
    }))
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PaymentMethodDeleted {
    pub deleted: bool,
    /// Auto top-up needs a card: removing it turns auto top-up off.
    pub auto_topup_disabled: bool,
}

#[utoipa::path(delete, path = "/api/billing/payment-method", tag = "billing", security(("bearer" = [])),
    params(OrgQuery),
    responses((status = 200, body = PaymentMethodDeleted), (status = 404, description = "No saved payment method", body = ErrorBody)))]
pub async fn delete_payment_method(caller: Caller, query: ValidQuery<OrgQuery>) -> ApiResult<HttpResponse> {
    let access = caller.member(Some(&query.0.org_id)).await?;
    let state = caller.state();
    let account = account_of(state, &access.org_id).await?;
    let Some(payment_method_id) = &account.payment_method_id else {
        return Err(ApiError::not_found("saved payment method"));
    };
    state.payments.detach_payment_method(payment_method_id).await?;
    repo::save_card(
        &state.db,
        &access.org_id,
        repo::SavedCard {
            payment_method_id: None,
            brand: None,
            last4: None,
            exp_month: None,
            exp_year: None,
        },
    )
    .await?;
    Ok(HttpResponse::Ok().json(PaymentMethodDeleted {
        deleted: true,
        auto_topup_disabled: account.auto_topup_enabled,
    }))
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CustomerDeleted {
    /// Whether the processor customer (and its saved methods) is gone.
    pub deleted: bool,
    pub customer_id: Option<String>,
    /// Why the deletion failed; the organization's teardown may go on regardless.
    pub error: Option<String>,
}

#[utoipa::path(delete, path = "/api/billing/customer", tag = "billing", security(("bearer" = [])),
    params(OrgQuery),
    responses((status = 200, description = "Best effort: failures are reported, never raised", body = CustomerDeleted),
        (status = 403, description = "Not an owner's session", body = ErrorBody)))]
pub async fn delete_customer(caller: Caller, query: ValidQuery<OrgQuery>) -> ApiResult<HttpResponse> {
    let access = caller.owner(Some(&query.0.org_id)).await?;
    let state = caller.state();
    let account = account_of(state, &access.org_id).await?;
    let Some(customer_id) = account.customer_id.clone() else {
        return Ok(HttpResponse::Ok().json(CustomerDeleted {
            deleted: true,
            customer_id: None,
            error: None,
        }));
    };
    match state.payments.delete_customer(&customer_id).await {
        Ok(()) => {
            repo::clear_customer(&state.db, &access.org_id).await?;
            Ok(HttpResponse::Ok().json(CustomerDeleted {
                deleted: true,
                customer_id: Some(customer_id),
                error: None,
            }))
        }
        Err(err) => {
            tracing::error!(org_id = %access.org_id, error = %err, "deleting the billing customer failed");
            Ok(HttpResponse::Ok().json(CustomerDeleted {
                deleted: false,
                customer_id: Some(customer_id),
                error: Some(err.to_string()),
            }))
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopupView {
    /// `succeeded` (credited now) or the processor's pending status.
    pub status: String,
    pub payment_intent_id: String,
    pub balance_cents: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<String>,
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
        balance_cents: micros_to_cents_floor(topup.balance_microcents),
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
    let state = caller.state();
    let account = account_of(state, &access.org_id).await?;
    if body.enabled && account.payment_method_id.is_none() {
        return Err(ApiError::Conflict(
            "save a payment method before enabling auto top-up".into(),
        ));
    }
    repo::save_auto_topup(
        &state.db,
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

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreditView {
    pub credited_cents: i64,
    pub balance_cents: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
}

#[utoipa::path(post, path = "/api/billing/starter-credit", tag = "billing", security(("bearer" = [])),
    request_body = OrgBody,
    responses((status = 200, body = CreditView), (status = 409, description = "Already granted", body = ErrorBody)))]
pub async fn starter_credit(caller: Caller, body: ValidJson<OrgBody>) -> ApiResult<HttpResponse> {
    let access = caller.member(Some(&body.0.org_id)).await?;
    let state = caller.state();
    let cents = state.settings.billing.starter_credit_cents;
    let op = LedgerOp::credit(
        EntryKind::StarterCredit,
        cents_to_micros(cents),
        Some(IdempotencyKey::starter_credit()),
        "starter credit",
    )
    .once_only()
    .with_side(SideEffect::StarterCredit);
    let outcome = state
        .ledger
        .submit(&access.org_id, op)
        .await
        .map_err(|err| match err {
            super::ledger::LedgerError::Duplicate => {
                ApiError::Conflict("the starter credit was already granted".into())
            }
            other => other.into(),
        })?;
    Ok(HttpResponse::Ok().json(CreditView {
        credited_cents: cents,
        balance_cents: micros_to_cents_floor(outcome.balance_microcents),
        code: None,
    }))
}

#[utoipa::path(post, path = "/api/billing/promo-code", tag = "billing", security(("bearer" = [])),
    request_body = PromoCodeBody,
    responses((status = 200, body = CreditView), (status = 404, description = "Unknown code", body = ErrorBody),
        (status = 409, description = "Already redeemed by this organization", body = ErrorBody)))]
pub async fn promo_code(caller: Caller, body: ValidJson<PromoCodeBody>) -> ApiResult<HttpResponse> {
    let body = body.0;
    let access = caller.member(Some(&body.org_id)).await?;
    let state = caller.state();
    let code = body.code.trim().to_uppercase();
    let cents = state
        .settings
        .billing
        .promo_codes
        .iter()
        .find(|(known, _)| known.to_uppercase() == code)
        .map(|(_, cents)| *cents)
        .ok_or_else(|| ApiError::not_found("promo code"))?;
    let op = LedgerOp::credit(
        EntryKind::Promo,
        cents_to_micros(cents),
        Some(IdempotencyKey::promo(&code)),
        format!("promo code {code}"),
    )
    .once_only()
    .with_side(SideEffect::PromoGrant {
        code: code.clone(),
        cents,
    });
    let outcome = state
        .ledger
        .submit(&access.org_id, op)
        .await
        .map_err(|err| match err {
            super::ledger::LedgerError::Duplicate => ApiError::Conflict(format!(
                "promo code {code} was already redeemed by this organization"
            )),
            other => other.into(),
        })?;
    Ok(HttpResponse::Ok().json(CreditView {
        credited_cents: cents,
        balance_cents: micros_to_cents_floor(outcome.balance_microcents),
        code: Some(code),
    }))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct WebhookAck {
    pub received: bool,
    /// The event id was already processed.
    pub duplicate: bool,
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
    webhook::verify(
        &state.settings.payments.stripe_webhook_secret,
        signature,
        &body.0,
        Utc::now().timestamp(),
    )
    .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    let event: Value =
        serde_json::from_slice(&body.0).map_err(|_| ApiError::BadRequest("the event is not JSON".into()))?;
    let (Some(event_id), Some(event_type)) = (event["id"].as_str(), event["type"].as_str()) else {
        return Err(ApiError::BadRequest("the event has no id or type".into()));
    };
    if repo::webhook_event_seen(&state.db, event_id).await? {
        return Ok(HttpResponse::Ok().json(WebhookAck {
            received: true,
            duplicate: true,
        }));
    }
    if event_type == "payment_intent.succeeded" {
        credit_succeeded_payment(&state, &event["data"]["object"]).await?;
    }
    // Recorded after its effect: a crash in between means a redelivery, which the
    // payment's idempotency key makes harmless.
    repo::record_webhook_event(&state.db, event_id, event_type).await?;
    Ok(HttpResponse::Ok().json(WebhookAck {
        received: true,
        duplicate: false,
    }))
}

async fn credit_succeeded_payment(state: &AppState, intent: &Value) -> ApiResult<()> {
    let Some(payment_intent_id) = intent["id"].as_str() else {
        return Err(ApiError::BadRequest("payment intent without id".into()));
    };
    let Some(org_id) = intent["metadata"]["orgId"].as_str().map(str::to_ascii_lowercase) else {
        tracing::warn!(
            payment_intent_id,
            "payment_intent.succeeded without metadata.orgId; ignored"
        );
        return Ok(());
    };
    let org_id = org_id.as_str();
    let cents = intent["amount_received"]
        .as_i64()
        .filter(|c| *c > 0)
        .or_else(|| intent["amount"].as_i64())
        .unwrap_or(0);
    if cents <= 0 {
        return Err(ApiError::BadRequest("payment intent without an amount".into()));
    }
    let kind = if intent["metadata"]["kind"] == "auto_topup" {
        EntryKind::AutoTopup
    } else {
        EntryKind::Topup
    };
    let mut op = LedgerOp::credit(
        kind,
        cents_to_micros(cents),
        Some(IdempotencyKey::payment(payment_intent_id)),
        format!("payment {payment_intent_id}"),
    );
    if kind == EntryKind::AutoTopup {
        op = op.with_side(SideEffect::AutoTopupCredited);
    }
    match state.ledger.submit(org_id, op).await {
        Ok(_) => {
            repo::record_payment(
                &state.db,
                repo::PaymentRow {
                    payment_intent_id,
                    org_id,
                    amount_cents: cents,
                    status: "succeeded",
                    kind: kind.as_str(),
                    idempotency_key: None,
                },
            )
            .await?;
            Ok(())
        }
        Err(super::ledger::LedgerError::UnknownOrg) => {
            tracing::warn!(
                org_id,
                payment_intent_id,
                "payment for an unknown organization; ignored"
            );
            Ok(())
        }
        Err(err) => Err(err.into()),
    }
}

fn charge_view(outcome: &Outcome) -> ChargeView {
    ChargeView {
        charged_cents: micros_to_cents_ceil(-outcome.amount_microcents),
        balance_cents: micros_to_cents_floor(outcome.balance_microcents),
        replayed: outcome.replayed,
    }
}

#[utoipa::path(post, path = "/api/billing/debit", tag = "billing", security(("bearer" = [])),
    request_body = DebitBody,
    responses((status = 200, body = ChargeView), (status = 402, description = "Balance too low", body = ErrorBody)))]
pub async fn debit(caller: Caller, body: ValidJson<DebitBody>) -> ApiResult<HttpResponse> {
    let body = body.0;
    let access = caller.member(Some(&body.org_id)).await?;
    let state = caller.state();
    let fee = state.settings.billing.flat_run_fee_cents;
    let op = LedgerOp::debit(
        EntryKind::RunFee,
        cents_to_micros(fee),
        body.run_id.as_deref().map(IdempotencyKey::run_fee),
        match &body.run_id {
            Some(run) => format!("run fee {run}"),
            None => "run fee".into(),
        },
    );
    let outcome = state.ledger.submit(&access.org_id, op).await?;
    Ok(HttpResponse::Ok().json(charge_view(&outcome)))
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
    let (org_id, model) = match &body.adapter_id {
        Some(adapter_id) => {
            let adapter = state
                .adapters
                .get(&state.db, adapter_id)
                .await?
                .ok_or_else(|| ApiError::not_found("adapter"))?;
            if let Some(org) = &body.org_id {
                if !org.is(&adapter.org_id) {
                    return Err(ApiError::Conflict(
                        "orgId does not match the adapter's owning organization".into(),
                    ));
                }
            }
            (adapter.org_id, adapter.base_model)
        }
        None => (
            body.org_id.clone().map(String::from).unwrap_or_default(),
            body.model.clone().unwrap_or_default(),
        ),
    };
    let price = state
        .settings
        .pricing
        .models
        .get(&model)
        .ok_or_else(|| ApiError::NotFound(format!("model {model} is not priced")))?;
    let priced = price_serving(
        price,
        body.prompt_tokens,
        body.completion_tokens,
        state.settings.billing.serving_markup_percent,
    );
    let row = ServingUsageRow {
        request_id: body.request_id.clone(),
        org_id: org_id.clone(),
        adapter_id: body.adapter_id.clone(),
        model,
        prompt_tokens: body.prompt_tokens,
        completion_tokens: body.completion_tokens,
        cost_microcents: priced.cost_microcents,
        charged_microcents: priced.charged_microcents,
    };
    let op = LedgerOp::debit(
        EntryKind::ServingUsage,
        priced.charged_microcents,
        Some(IdempotencyKey::serving(&body.request_id)),
        format!("serving {}", body.request_id),
    )
    .overdrawing()
    .with_side(SideEffect::ServingUsage(row.clone()));
    let outcome = state.ledger.submit(&org_id, op).await?;
    let recorded = outcome.serving.clone().unwrap_or(row);
    Ok(HttpResponse::Ok().json(ServingChargeView {
        request_id: recorded.request_id,
        org_id: recorded.org_id,
        cost_microcents: recorded.cost_microcents,
        charged_microcents: recorded.charged_microcents,
        balance_microcents: outcome.balance_microcents,
        replayed: outcome.replayed,
    }))
}

fn run_charge_view(run_id: String, outcome: &Outcome) -> RunChargeView {
    let view = charge_view(outcome);
    RunChargeView {
        run_id,
        charged_cents: view.charged_cents,
        balance_cents: view.balance_cents,
        replayed: view.replayed,
    }
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
    let op = LedgerOp::debit(
        EntryKind::TrainingEstimate,
        cents_to_micros(body.estimate_cents),
        Some(IdempotencyKey::training_usage(&body.run_id)),
        format!("training estimate {}", body.run_id),
    );
    let outcome = state.ledger.submit(&key.org_id, op).await?;
    Ok(HttpResponse::Ok().json(run_charge_view(body.run_id, &outcome)))
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PrecheckView {
    pub ok: bool,
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
    let body = body.0;
    let account = account_of(&state, &body.org_id).await?;
    let covered_by_balance = account.balance_microcents >= cents_to_micros(body.estimate_cents);
    let covered_by_card = account.payment_method_id.is_some()
        && account.auto_topup_enabled
        && account.auto_topup_declines < super::ledger::MAX_AUTO_TOPUP_DECLINES;
    if !(covered_by_balance || covered_by_card) {
        return Err(ApiError::PaymentRequired(
            "the organization cannot cover the estimate: top up or save a card with auto top-up".into(),
        ));
    }
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
    let op = LedgerOp::debit(
        EntryKind::TrainingRun,
        cents_to_micros(body.amount_cents),
        Some(IdempotencyKey::training_run(&body.run_id)),
        format!("training run {}", body.run_id),
    )
    .overdrawing();
    let outcome = state.ledger.submit(&body.org_id, op).await?;
    Ok(HttpResponse::Ok().json(run_charge_view(body.run_id, &outcome)))
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrainingCostView {
    pub run_id: String,
    pub cost_cents: i64,
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
        run_id: body.run_id,
        cost_cents: body.cost_cents,
    }))
}
