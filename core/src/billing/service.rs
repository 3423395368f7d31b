//! Billing flows, shared by every client of the domain (the JSON API, the console): each
//! runs the processor, the payment records and the ledger in the order that makes a retry
//! harmless.

use chrono::Utc;
use entities::{billing_account, credit_grant, ledger_entry, payment};
use serde_json::Value;

use super::charges;
use super::ledger::{
    EntryKind, GrantTerms, LedgerError, LedgerOp, Outcome, ServingUsageRow, SideEffect,
    MAX_AUTO_TOPUP_DECLINES,
};
use super::payments::Card;
use super::repo;
pub use super::topup_policy::{month_start, under_cap, AutoTopupSettings};
use super::webhook;
use super::{Billing, BillingError};
use crate::domain::{Cents, IdempotencyKey, Microcents, OrgId, PaymentState, RunId};

/// How many ledger entries the billing overview shows.
const RECENT_ENTRIES: u64 = 20;

/// The organization's billing account as of now (its lapsed grants expired first, so the
/// balance read is the one the ledger would check); 404 when the organization is unknown.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn account_of(billing: &Billing, org_id: &OrgId) -> Result<billing_account::Model, BillingError> {
    expire_lapsed(billing, org_id).await?;
    repo::account(&billing.db, org_id)
        .await?
        .ok_or(BillingError::OrgNotFound)
}

/// Ends the organization's grants whose expiry has passed, through the ledger (one
/// operation: the planner ends every lapsed grant before any operation, the sweep's keyed
/// entry included). One indexed read when none has lapsed.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn expire_lapsed(billing: &Billing, org_id: &OrgId) -> Result<(), BillingError> {
    let Some(grant) = repo::first_lapsed_grant(&billing.db, org_id, Utc::now()).await? else {
        return Ok(());
    };
    match billing.ledger.submit(org_id, LedgerOp::expiry(&grant)).await {
        // Duplicate: another operation (or instance) ended it first.
        Ok(_) | Err(LedgerError::Duplicate | LedgerError::UnknownOrg) => Ok(()),
        Err(err) => Err(err.into()),
    }
}

/// An account as its billing page shows it.
pub struct Overview {
    pub account: billing_account::Model,
    /// The most recent ledger entries, newest first.
    pub recent: Vec<ledger_entry::Model>,
    /// The active grants (something left), in draw order.
    pub grants: Vec<credit_grant::Model>,
    /// What auto top-ups have charged this UTC month.
    pub auto_topup_charged: Cents,
}

impl Overview {
    /// The soonest expiry of an active grant, and what lapses then.
    pub fn next_expiry(&self) -> Option<(chrono::DateTime<Utc>, Microcents)> {
        let at = self.grants.iter().filter_map(|g| g.expires_at).min()?;
        let lapsing = self
            .grants
            .iter()
            .filter(|g| g.expires_at == Some(at))
            .fold(Microcents::ZERO, |sum, g| sum + g.remaining_microcents);
        Some((at, lapsing))
    }
}

/// The account with its most recent ledger entries and its active grants.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn overview(billing: &Billing, org_id: &OrgId) -> Result<Overview, BillingError> {
    let account = account_of(billing, org_id).await?;
    let recent = repo::recent_ledger(&billing.db, org_id, RECENT_ENTRIES).await?;
    let grants = repo::grants(&billing.db, org_id)
        .await?
        .into_iter()
        .filter(|g| g.remaining_microcents > Microcents::ZERO)
        .collect();
    let auto_topup_charged = repo::auto_topup_charged(&billing.db, org_id, month_start(Utc::now())).await?;
    Ok(Overview {
        account,
        recent,
        grants,
        auto_topup_charged,
    })
}

/// The processor's customer of the account, created on first use.
#[tracing::instrument(level = "debug", skip_all)]
pub async fn ensure_customer(
    billing: &Billing,
    account: &billing_account::Model,
) -> Result<String, BillingError> {
    if let Some(customer) = &account.customer_id {
        return Ok(customer.clone());
    }
    let customer = billing.payments.create_customer(&account.org_id).await?;
    Ok(repo::save_customer(&billing.db, &account.org_id, &customer).await?)
}

/// A setup intent for saving a card: `(client secret, customer id)`.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn setup_intent(billing: &Billing, org_id: &OrgId) -> Result<(String, String), BillingError> {
    let account = account_of(billing, org_id).await?;
    let customer_id = ensure_customer(billing, &account).await?;
    let client_secret = billing.payments.create_setup_intent(&customer_id).await?;
    Ok((client_secret, customer_id))
}

/// Attaches the method to the customer and saves it as the card; a replaced card is
/// detached (best effort: the new one is saved regardless).
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn save_payment_method(
    billing: &Billing,
    org_id: &OrgId,
    payment_method_id: &str,
) -> Result<Card, BillingError> {
    let account = account_of(billing, org_id).await?;
    let customer_id = ensure_customer(billing, &account).await?;
    let card = billing
        .payments
        .attach_payment_method(&customer_id, payment_method_id)
        .await?;
    if let Some(old) = account
        .payment_method_id
        .as_deref()
        .filter(|old| *old != payment_method_id)
    {
        if let Err(err) = billing.payments.detach_payment_method(old).await {
            tracing::warn!(%org_id, error = %err, "detaching the replaced payment method");
        }
    }
    repo::save_card(
        &billing.db,
        org_id,
        repo::SavedCard {
            payment_method_id: Some(payment_method_id),
            brand: Some(&card.brand),
            last4: Some(&card.last4),
            exp_month: Some(card.exp_month),
            exp_year: Some(card.exp_year),
        },
    )
    .await?;
    Ok(card)
}

/// Detaches and forgets the saved card; answers whether that turned auto top-up off.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn delete_payment_method(billing: &Billing, org_id: &OrgId) -> Result<bool, BillingError> {
    let account = account_of(billing, org_id).await?;
    let Some(payment_method_id) = &account.payment_method_id else {
        return Err(BillingError::NoSavedCard);
    };
    billing.payments.detach_payment_method(payment_method_id).await?;
    repo::save_card(&billing.db, org_id, repo::SavedCard::NONE).await?;
    Ok(account.auto_topup_enabled)
}

/// What deleting the processor customer came to (best effort: failures are reported).
pub struct CustomerDeletion {
    pub deleted: bool,
    pub customer_id: Option<String>,
    pub error: Option<String>,
}

#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn delete_customer(billing: &Billing, org_id: &OrgId) -> Result<CustomerDeletion, BillingError> {
    let account = account_of(billing, org_id).await?;
    let Some(customer_id) = account.customer_id else {
        return Ok(CustomerDeletion {
            deleted: true,
            customer_id: None,
            error: None,
        });
    };
    match billing.payments.delete_customer(&customer_id).await {
        Ok(()) => {
            repo::clear_customer(&billing.db, org_id).await?;
            Ok(CustomerDeletion {
                deleted: true,
                customer_id: Some(customer_id),
                error: None,
            })
        }
        Err(err) => {
            tracing::error!(%org_id, error = %err, "deleting the billing customer failed");
            Ok(CustomerDeletion {
                deleted: false,
                customer_id: Some(customer_id),
                error: Some(err.to_string()),
            })
        }
    }
}

/// Saves auto top-up settings (which lifts a pause after declines); enabling needs a card.
/// Answers what auto top-up has charged this UTC month.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn set_auto_topup(
    billing: &Billing,
    org_id: &OrgId,
    settings: AutoTopupSettings,
) -> Result<Cents, BillingError> {
    let account = account_of(billing, org_id).await?;
    if settings.enabled && account.payment_method_id.is_none() {
        return Err(BillingError::CardNeededForAutoTopup);
    }
    repo::save_auto_topup(&billing.db, org_id, settings).await?;
    Ok(repo::auto_topup_charged(&billing.db, org_id, month_start(Utc::now())).await?)
}

/// What a top-up came to.
pub struct Topup {
    /// `succeeded`, or `processing` / `requires_action` (credited later by the webhook).
    pub status: PaymentState,
    pub payment_intent_id: String,
    pub balance: Microcents,
    pub client_secret: Option<String>,
}

/// Charges the saved card `amount` and credits it once the charge succeeds.
///
/// With a client `Idempotency-Key`, a retry answers the first attempt's result (its decline
/// included) and charges nothing; the same key for another amount is 409. Requests with the
/// same key that race each other reach the processor with the same key of its own, so they
/// get one payment intent, credited once by its ledger key.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn topup(
    billing: &Billing,
    org_id: &OrgId,
    amount: Cents,
    client_key: Option<&str>,
) -> Result<Topup, BillingError> {
    let account = account_of(billing, org_id).await?;
    let Some(payment_method_id) = account.payment_method_id.clone() else {
        return Err(BillingError::CardNeededForTopup);
    };
    if let Some(key) = client_key {
        if let Some(earlier) = repo::topup_by_key(&billing.db, org_id, key).await? {
            return replay_topup(billing, earlier, amount).await;
        }
    }
    let customer_id = ensure_customer(billing, &account).await?;
    let processor_key = match client_key {
        Some(key) => format!("keel-topup-{org_id}-{key}"),
        None => format!("keel-topup-{}", uuid::Uuid::new_v4()),
    };
    // Recorded before the card is charged: a crash after the charge is settled on restart.
    let pending = charges::pending(
        org_id,
        EntryKind::Topup,
        amount,
        &customer_id,
        &payment_method_id,
        processor_key,
        client_key,
    );
    let charged = charges::charge(&billing.db, &billing.payments, &pending)
        .await
        .map_err(|err| match err {
            charges::ChargeError::Database(err) => BillingError::Database(err),
            charges::ChargeError::Processor(err) => BillingError::Payment(err),
            charges::ChargeError::Mismatch(first_cents) => BillingError::KeyReused { first_cents },
        })?;
    match charged {
        charges::Charged::Succeeded { intent, credit } => {
            let outcome =
                charges::credit(&billing.db, &billing.ledger, &pending, &intent.id, *credit).await?;
            Ok(Topup {
                status: intent.status,
                payment_intent_id: intent.id,
                balance: outcome.balance,
                client_secret: intent.client_secret,
            })
        }
        charges::Charged::Waiting(intent) => Ok(Topup {
            status: intent.status,
            payment_intent_id: intent.id,
            balance: account_of(billing, org_id).await?.balance_microcents,
            client_secret: intent.client_secret,
        }),
        charges::Charged::Declined { message, .. } => Err(BillingError::Declined(message)),
    }
}

/// The first attempt's result for a retried `Idempotency-Key`.
async fn replay_topup(
    billing: &Billing,
    earlier: payment::Model,
    amount: Cents,
) -> Result<Topup, BillingError> {
    if earlier.amount_cents != amount {
        return Err(BillingError::KeyReused {
            first_cents: earlier.amount_cents,
        });
    }
    if earlier.status == PaymentState::Declined {
        return Err(BillingError::DeclinedBefore);
    }
    // A succeeded payment is credited here if a crash came between its record and its
    // credit; otherwise its ledger key makes this a replay.
    let balance = settle_topup(
        billing,
        &earlier.org_id,
        &earlier.payment_intent_id,
        amount,
        &earlier.status,
    )
    .await?;
    Ok(Topup {
        status: earlier.status,
        payment_intent_id: earlier.payment_intent_id,
        balance,
        client_secret: None,
    })
}

/// Credits a succeeded payment (once, by its ledger key); answers the balance.
async fn settle_topup(
    billing: &Billing,
    org_id: &OrgId,
    payment_intent_id: &str,
    amount: Cents,
    status: &PaymentState,
) -> Result<Microcents, BillingError> {
    if !status.is_succeeded() {
        return Ok(account_of(billing, org_id).await?.balance_microcents);
    }
    let op = LedgerOp::credit(
        EntryKind::Topup,
        amount.micros(),
        Some(IdempotencyKey::payment(payment_intent_id)),
        format!("top-up {payment_intent_id}"),
    );
    Ok(billing.ledger.submit(org_id, op).await?.balance)
}

/// When a credit granted now with `days` to live expires (0: never).
fn expires_after(days: u32) -> Option<chrono::DateTime<Utc>> {
    (days > 0).then(|| Utc::now() + chrono::Duration::days(i64::from(days)))
}

/// The organization's grants: the active ones first (in draw order), then the spent and
/// expired ones, newest first.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn grants(billing: &Billing, org_id: &OrgId) -> Result<Vec<credit_grant::Model>, BillingError> {
    account_of(billing, org_id).await?;
    Ok(repo::grants(&billing.db, org_id).await?)
}

/// An operator's goodwill credit or refund.
pub struct ManualGrant {
    pub amount: Cents,
    pub reason: String,
    pub expires_at: Option<chrono::DateTime<Utc>>,
    pub priority: Option<i32>,
    /// The client's `Idempotency-Key` (required).
    pub key: String,
    /// Who makes it (the internal key's label).
    pub created_by: String,
}

/// Grants `grant` once per key: a repeat answers the original grant; the same key with
/// another body is [`BillingError::GrantKeyReused`].
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn manual_grant(
    billing: &Billing,
    org_id: &OrgId,
    grant: ManualGrant,
) -> Result<credit_grant::Model, BillingError> {
    use sha2::Digest;
    account_of(billing, org_id).await?;
    let body = serde_json::json!([
        org_id,
        grant.amount,
        grant.reason,
        grant.expires_at,
        grant.priority
    ]);
    let hash = hex::encode(sha2::Sha256::digest(body.to_string().as_bytes()));
    let original = |found: credit_grant::Model| match found.request_hash.as_deref() == Some(hash.as_str()) {
        true => Ok(found),
        false => Err(BillingError::GrantKeyReused),
    };
    if let Some(found) = repo::grant_by_key(&billing.db, org_id, &grant.key).await? {
        return original(found);
    }
    let op = LedgerOp::credit(
        EntryKind::Manual,
        grant.amount.micros(),
        Some(IdempotencyKey::manual_grant(&grant.key)),
        grant.reason.clone(),
    )
    .granting(GrantTerms {
        kind: Some(crate::domain::GrantKind::Manual),
        priority: grant.priority,
        expires_at: grant.expires_at,
        created_by: Some(grant.created_by),
        idempotency_key: Some(grant.key.clone()),
        request_hash: Some(hash.clone()),
    });
    // A race with the same key: the ledger's key makes the second a replay.
    let outcome = billing.ledger.submit(org_id, op).await?;
    let found = repo::grant_by_key(&billing.db, org_id, &grant.key)
        .await?
        .ok_or_else(|| BillingError::Database(sea_orm::DbErr::RecordNotFound("the manual grant".into())))?;
    if !outcome.replayed {
        tracing::info!(
            target: "keel_event",
            event = "grant.issued",
            org_id = %org_id,
            grant_id = %found.id,
            kind = "manual",
            amount_cents = grant.amount.get(),
            expires_at = grant.expires_at.map(|at| at.to_rfc3339()).as_deref(),
            created_by = found.created_by.as_deref(),
            "credit granted by an operator"
        );
    }
    original(found)
}

/// Grants the configured starter credit, once per organization (a repeat is 409).
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn grant_starter_credit(
    billing: &Billing,
    org_id: &OrgId,
) -> Result<(Cents, Outcome), BillingError> {
    let cents = billing.settings.starter_credit_cents;
    let op = LedgerOp::credit(
        EntryKind::StarterCredit,
        cents.micros(),
        Some(IdempotencyKey::starter_credit()),
        "starter credit",
    )
    .once_only()
    .with_side(SideEffect::StarterCredit)
    .granting(GrantTerms {
        expires_at: expires_after(billing.settings.starter_credit_expires_days),
        ..GrantTerms::default()
    });
    let outcome = billing.ledger.submit(org_id, op).await.map_err(|err| match err {
        LedgerError::Duplicate => BillingError::StarterCreditGranted,
        other => other.into(),
    })?;
    tracing::info!(
        target: "keel_event",
        event = "grant.issued",
        org_id = %org_id,
        kind = "starter",
        amount_cents = cents.get(),
        "starter credit granted"
    );
    Ok((cents, outcome))
}

/// A redeemed promo code: its canonical spelling, what it credited, the ledger's answer.
pub struct PromoRedemption {
    pub code: String,
    pub credited: Cents,
    pub outcome: Outcome,
}

/// Redeems a configured promo code (case-insensitive), once per organization.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn redeem_promo(
    billing: &Billing,
    org_id: &OrgId,
    code: &str,
) -> Result<PromoRedemption, BillingError> {
    let code = code.trim().to_uppercase();
    let cents = billing
        .settings
        .promo_codes
        .iter()
        .find(|(known, _)| known.to_uppercase() == code)
        .map(|(_, cents)| *cents)
        .ok_or(BillingError::UnknownPromoCode)?;
    let op = LedgerOp::credit(
        EntryKind::Promo,
        cents.micros(),
        Some(IdempotencyKey::promo(&code)),
        format!("promo code {code}"),
    )
    .once_only()
    .with_side(SideEffect::PromoGrant {
        code: code.clone(),
        cents,
    })
    .granting(GrantTerms {
        expires_at: billing
            .settings
            .promo_expires_days
            .iter()
            .find(|(known, _)| known.to_uppercase() == code)
            .and_then(|(_, days)| expires_after(*days)),
        ..GrantTerms::default()
    });
    let outcome = billing.ledger.submit(org_id, op).await.map_err(|err| match err {
        LedgerError::Duplicate => BillingError::PromoRedeemed(code.clone()),
        other => other.into(),
    })?;
    tracing::info!(
        target: "keel_event",
        event = "grant.issued",
        org_id = %org_id,
        kind = "promo",
        code = %code,
        amount_cents = cents.get(),
        "promo code redeemed"
    );
    Ok(PromoRedemption {
        code,
        credited: cents,
        outcome,
    })
}

/// Verifies and applies a processor event; answers whether its id was already processed.
/// A succeeded payment intent is credited once, by its ledger key.
#[tracing::instrument(level = "debug", skip_all)]
pub async fn handle_webhook(
    billing: &Billing,
    signature: Option<&str>,
    body: &[u8],
) -> Result<bool, BillingError> {
    webhook::verify(
        &billing.payment_settings.stripe_webhook_secret,
        signature,
        body,
        Utc::now().timestamp(),
    )?;
    let event: Value =
        serde_json::from_slice(body).map_err(|_| BillingError::InvalidEvent("the event is not JSON"))?;
    let (Some(event_id), Some(event_type)) = (event["id"].as_str(), event["type"].as_str()) else {
        return Err(BillingError::InvalidEvent("the event has no id or type"));
    };
    if repo::webhook_event_seen(&billing.db, event_id).await? {
        return Ok(true);
    }
    if event_type == "payment_intent.succeeded" {
        credit_succeeded_payment(billing, &event["data"]["object"]).await?;
    }
    // Recorded after its effect: a crash in between means a redelivery, which the
    // payment's idempotency key makes harmless.
    repo::record_webhook_event(&billing.db, event_id, event_type).await?;
    Ok(false)
}

async fn credit_succeeded_payment(billing: &Billing, intent: &Value) -> Result<(), BillingError> {
    let Some(payment_intent_id) = intent["id"].as_str() else {
        return Err(BillingError::InvalidEvent("payment intent without id"));
    };
    let Some(org_id) = intent["metadata"]["orgId"]
        .as_str()
        .and_then(|raw| OrgId::parse(raw).ok())
    else {
        tracing::warn!(
            payment_intent_id,
            "payment_intent.succeeded without metadata.orgId; ignored"
        );
        return Ok(());
    };
    let cents = intent["amount_received"]
        .as_i64()
        .filter(|c| *c > 0)
        .or_else(|| intent["amount"].as_i64())
        .map_or(Cents(0), Cents);
    if cents <= Cents(0) {
        return Err(BillingError::InvalidEvent("payment intent without an amount"));
    }
    let kind = if intent["metadata"]["kind"] == "auto_topup" {
        EntryKind::AutoTopup
    } else {
        EntryKind::Topup
    };
    let mut op = LedgerOp::credit(
        kind,
        cents.micros(),
        Some(IdempotencyKey::payment(payment_intent_id)),
        format!("payment {payment_intent_id}"),
    );
    if kind == EntryKind::AutoTopup {
        op = op.with_side(SideEffect::AutoTopupCredited);
    }
    match billing.ledger.submit(&org_id, op).await {
        Ok(_) => {
            repo::record_payment(
                &billing.db,
                repo::PaymentRow {
                    payment_intent_id,
                    org_id: &org_id,
                    amount: cents,
                    status: PaymentState::Succeeded,
                    kind,
                    idempotency_key: None,
                },
            )
            .await?;
            Ok(())
        }
        Err(LedgerError::UnknownOrg) => {
            tracing::warn!(
                %org_id,
                payment_intent_id,
                "payment for an unknown organization; ignored"
            );
            Ok(())
        }
        Err(err) => Err(err.into()),
    }
}

/// The flat run fee; with a run id, charged once per (organization, run). 402 when short.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn charge_run_fee(
    billing: &Billing,
    org_id: &OrgId,
    run_id: Option<&RunId>,
) -> Result<Outcome, BillingError> {
    let fee = billing.settings.flat_run_fee_cents;
    let op = LedgerOp::debit(
        EntryKind::RunFee,
        fee.micros(),
        run_id.map(IdempotencyKey::run_fee),
        match run_id {
            Some(run) => format!("run fee {run}"),
            None => "run fee".into(),
        },
    );
    Ok(billing.ledger.submit(org_id, op).await?)
}

/// One generation's usage as the serving layer reports it.
pub struct ServingUsage<'a> {
    pub request_id: &'a str,
    pub org_id: Option<&'a OrgId>,
    pub adapter_id: Option<&'a str>,
    pub model: Option<&'a str>,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
}

/// Meters a serving request at cost plus markup. The adapter, when named, decides the
/// organization (an `orgId` that disagrees is 409) and the priced base model. A replayed
/// request id answers the original charge.
#[tracing::instrument(level = "debug", skip_all)]
pub async fn charge_serving(
    billing: &Billing,
    usage: ServingUsage<'_>,
) -> Result<(ServingUsageRow, Outcome), BillingError> {
    let (org_id, model) = match usage.adapter_id {
        Some(adapter_id) => {
            let adapter = billing
                .adapters
                .get(&billing.db, adapter_id)
                .await?
                .ok_or(BillingError::AdapterNotFound)?;
            if let Some(org) = usage.org_id {
                if *org != adapter.org_id {
                    return Err(BillingError::AdapterOfAnotherOrg);
                }
            }
            (adapter.org_id, adapter.base_model)
        }
        None => (
            usage
                .org_id
                .cloned()
                .ok_or(BillingError::Ledger(LedgerError::UnknownOrg))?,
            usage.model.unwrap_or_default().to_owned(),
        ),
    };
    let price = billing
        .pricing
        .models
        .get(&model)
        .ok_or_else(|| BillingError::ModelNotPriced(model.clone()))?;
    let priced = price.serving(
        usage.prompt_tokens,
        usage.completion_tokens,
        billing.settings.serving_markup_percent,
    );
    let row = ServingUsageRow {
        request_id: usage.request_id.to_owned(),
        org_id: org_id.clone(),
        adapter_id: usage.adapter_id.map(str::to_owned),
        model,
        prompt_tokens: usage.prompt_tokens,
        completion_tokens: usage.completion_tokens,
        cost_microcents: priced.cost,
        charged_microcents: priced.charged,
    };
    let op = LedgerOp::debit(
        EntryKind::ServingUsage,
        priced.charged,
        Some(IdempotencyKey::serving(usage.request_id)),
        format!("serving {}", usage.request_id),
    )
    .overdrawing()
    .with_side(SideEffect::ServingUsage(row.clone()));
    let outcome = billing.ledger.submit(&org_id, op).await?;
    let recorded = outcome.serving.clone().unwrap_or(row);
    Ok((recorded, outcome))
}

/// A training run's estimate, charged once per run id by the caller's organization; 402
/// when the balance is short.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id, run_id = %run_id))]
pub async fn charge_training_estimate(
    billing: &Billing,
    org_id: &OrgId,
    run_id: &RunId,
    estimate: Cents,
) -> Result<Outcome, BillingError> {
    let op = LedgerOp::debit(
        EntryKind::TrainingEstimate,
        estimate.micros(),
        Some(IdempotencyKey::training_usage(run_id)),
        format!("training estimate {run_id}"),
    );
    Ok(billing.ledger.submit(org_id, op).await?)
}

/// Whether the organization can pay `estimate`: from its balance, or by a card with auto
/// top-up that is not paused. 402 when neither.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn precheck_training(
    billing: &Billing,
    org_id: &OrgId,
    estimate: Cents,
) -> Result<(), BillingError> {
    let account = account_of(billing, org_id).await?;
    let covered_by_balance = account.balance_microcents >= estimate.micros();
    // A card under a cap the month has reached covers nothing (as if auto top-up were off).
    let charged = match account.auto_topup_monthly_limit_cents {
        Some(_) => repo::auto_topup_charged(&billing.db, org_id, month_start(Utc::now())).await?,
        None => Cents(0),
    };
    let covered_by_card = account.payment_method_id.is_some()
        && account.auto_topup_enabled
        && account.auto_topup_declines < MAX_AUTO_TOPUP_DECLINES
        && under_cap(
            &account,
            charged,
            account.auto_topup_amount_cents.unwrap_or(Cents(0)),
        );
    if !(covered_by_balance || covered_by_card) {
        return Err(BillingError::CannotCoverEstimate);
    }
    Ok(())
}

/// A completed training run's charge (work delivered: may overdraw), once per run id.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id, run_id = %run_id))]
pub async fn charge_training_run(
    billing: &Billing,
    org_id: &OrgId,
    run_id: &RunId,
    amount: Cents,
) -> Result<Outcome, BillingError> {
    let op = LedgerOp::debit(
        EntryKind::TrainingRun,
        amount.micros(),
        Some(IdempotencyKey::training_run(run_id)),
        format!("training run {run_id}"),
    )
    .overdrawing();
    Ok(billing.ledger.submit(org_id, op).await?)
}

/// Settles charges left pending (an instance died between the processor and the credit):
/// at start and every `payments.reconcile_interval_secs`, until the process stops.
pub async fn run_reconciler(billing: Billing) {
    let settings = &billing.payment_settings;
    let every = std::time::Duration::from_secs(settings.reconcile_interval_secs.max(1));
    let min_age = std::time::Duration::from_secs(settings.reconcile_min_age_secs);
    let stopping = billing.stopping.clone();
    loop {
        match charges::reconcile(
            &billing.db,
            &billing.payments,
            &billing.ledger,
            min_age,
            &billing.metrics,
        )
        .await
        {
            Ok(done) if done != charges::Reconciled::default() => {
                tracing::info!(?done, "pending payments reconciled");
            }
            Ok(_) => {}
            Err(err) => tracing::warn!(error = %err, "reconciling pending payments failed; next pass later"),
        }
        tokio::select! {
            _ = stopping.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// An organization's money over its last days, as the console's overview charts it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Spending {
    /// Each day, oldest first (`YYYY-MM-DD`, UTC).
    pub days: Vec<String>,
    /// Debits per day by what they paid for (µ¢, positive).
    pub serving: Vec<i64>,
    pub training: Vec<i64>,
    pub fees: Vec<i64>,
    /// Credits per day (µ¢).
    pub credits: Vec<i64>,
    /// Totals over the period (µ¢, positive).
    pub debited: i64,
    pub credited: i64,
    /// Serving usage per model over the period.
    pub usage: Vec<ModelUsage>,
}

/// One model's serving usage over a period.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelUsage {
    pub model: String,
    pub requests: i64,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub charged: Microcents,
}

/// The organization's spending over the `days` days up to today (UTC).
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn spending(billing: &Billing, org_id: &OrgId, days: i64) -> Result<Spending, BillingError> {
    let today = Utc::now().date_naive();
    let first = today - chrono::Duration::days(days - 1);
    let since = first.and_hms_opt(0, 0, 0).unwrap_or_default().and_utc();
    let names: Vec<String> = (0..days)
        .map(|d| (first + chrono::Duration::days(d)).format("%Y-%m-%d").to_string())
        .collect();
    let index: std::collections::BTreeMap<&str, usize> =
        names.iter().enumerate().map(|(i, d)| (d.as_str(), i)).collect();
    let zeros = vec![0i64; names.len()];
    let mut spent = Spending {
        serving: zeros.clone(),
        training: zeros.clone(),
        fees: zeros.clone(),
        credits: zeros,
        ..Spending::default()
    };
    for (day, kind, total) in repo::daily_totals(&billing.db, org_id, since).await? {
        let Some(&d) = index.get(day.as_str()) else {
            continue;
        };
        if total > 0 {
            spent.credits[d] += total;
            spent.credited += total;
            continue;
        }
        spent.debited -= total;
        match kind.as_str() {
            k if k == EntryKind::ServingUsage.as_str() => spent.serving[d] -= total,
            k if k == EntryKind::RunFee.as_str() => spent.fees[d] -= total,
            _ => spent.training[d] -= total,
        }
    }
    spent.usage = repo::usage_by_model(&billing.db, org_id, since)
        .await?
        .into_iter()
        .map(
            |(model, prompt_tokens, completion_tokens, charged, requests)| ModelUsage {
                model,
                requests,
                prompt_tokens,
                completion_tokens,
                charged: Microcents(charged),
            },
        )
        .collect();
    spent.days = names;
    Ok(spent)
}

/// Upserts a run's realized provider cost (re-pulled runs update the same row).
#[tracing::instrument(level = "debug", skip_all, fields(run_id = %run_id))]
pub async fn record_training_cost(
    billing: &Billing,
    run_id: &RunId,
    cost: crate::domain::Cents,
    provider: Option<&str>,
) -> Result<(), BillingError> {
    Ok(repo::upsert_training_cost(&billing.db, run_id, cost, provider).await?)
}

/// A page of the organization's ledger, newest first: entries of `kind` (any when `None`)
/// with ids below `before`, at most `limit`.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
/// How many entries the organization's ledger holds (of `kind`, if given).
pub async fn ledger_count(
    billing: &Billing,
    org_id: &OrgId,
    kind: Option<&str>,
) -> Result<u64, BillingError> {
    Ok(repo::ledger_count(&billing.db, org_id, kind).await?)
}

pub async fn ledger_page(
    billing: &Billing,
    org_id: &OrgId,
    kind: Option<&str>,
    before: Option<i64>,
    limit: u64,
) -> Result<Vec<ledger_entry::Model>, BillingError> {
    Ok(repo::ledger_page(&billing.db, org_id, kind, before, limit).await?)
}
