//! Billing's bodies (with their bounds) and views.

use chrono::{DateTime, Utc};
use entities::{credit_grant, ledger_entry};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::http::validate::{Checks, Validate};
use keel_core::billing::ledger::{Outcome, ServingUsageRow, MAX_AUTO_TOPUP_DECLINES};
use keel_core::billing::payments::Card;
use keel_core::domain::{Cents, Microcents, OrgId, RunId};

pub const MIN_TOPUP_CENTS: i64 = 100;
pub const MAX_TOPUP_CENTS: i64 = 1_000_000;

// ---------------------------------------------------------------------------------------
// Bodies

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct OrgQuery {
    /// The organization (UUID).
    #[param(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
}

impl Validate for OrgQuery {}

/// A month's statement: `month` is `YYYY-MM` (UTC).
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct StatementQuery {
    /// The organization (UUID).
    #[param(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
    /// The UTC month, `YYYY-MM`.
    #[param(pattern = "^[0-9]{4}-(0[1-9]|1[0-2])$")]
    pub month: String,
}

impl Validate for StatementQuery {
    fn validate(&self, c: &mut Checks) {
        if keel_core::billing::statement::month_bounds(&self.month).is_none() {
            c.fail("month", "value_error", "month must be YYYY-MM");
        }
    }
}

/// The ledger as CSV: entries created from `from` (inclusive) to `to` (exclusive), either
/// open; each an RFC 3339 date-time.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct LedgerCsvQuery {
    /// The organization (UUID).
    #[param(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
    /// Entries created at or after this time (RFC 3339).
    #[param(format = DateTime)]
    pub from: Option<String>,
    /// Entries created before this time (RFC 3339).
    #[param(format = DateTime)]
    pub to: Option<String>,
}

/// An RFC 3339 date-time.
pub fn instant(text: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .ok()
}

impl Validate for LedgerCsvQuery {
    fn validate(&self, c: &mut Checks) {
        for (name, value) in [("from", &self.from), ("to", &self.to)] {
            if value
                .as_deref()
                .is_some_and(|v| !v.is_empty() && instant(v).is_none())
            {
                c.fail(name, "value_error", "an RFC 3339 date-time");
            }
        }
        // A `to` before `from` is an empty window, not an error (the schema cannot relate the
        // two, and an export of nothing harms nothing).
    }
}

/// A UTC month's statement, in microcents: `openingMicrocents + Σ credits − Σ debits −
/// expiredMicrocents = closingMicrocents`, exactly.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct StatementView {
    pub month: String,
    pub opening_microcents: i64,
    /// Credits by ledger kind (positive).
    pub credits: std::collections::BTreeMap<String, i64>,
    /// Debits by ledger kind (positive).
    pub debits: std::collections::BTreeMap<String, i64>,
    /// Credit that expired (positive).
    pub expired_microcents: i64,
    pub closing_microcents: i64,
}

impl From<keel_core::billing::statement::Statement> for StatementView {
    fn from(s: keel_core::billing::statement::Statement) -> Self {
        Self {
            month: s.month,
            opening_microcents: s.opening,
            credits: s.credits,
            debits: s.debits,
            expired_microcents: s.expired,
            closing_microcents: s.closing,
        }
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OrgBody {
    #[schema(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
}

impl Validate for OrgBody {
    fn validate(&self, _c: &mut Checks) {}
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
    fn validate(&self, _c: &mut Checks) {}
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopupBody {
    #[schema(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
    #[schema(value_type = i64, minimum = 100, maximum = 1000000)]
    pub amount_cents: Cents,
}

impl Validate for TopupBody {}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AutoTopupBody {
    #[schema(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
    pub enabled: bool,
    /// Required when enabled: top up once the balance falls under this.
    #[schema(value_type = Option<i64>, minimum = 0, maximum = 1000000000)]
    pub threshold_cents: Option<Cents>,
    /// Required when enabled: how much each top-up charges.
    #[schema(value_type = Option<i64>, minimum = 100, maximum = 1000000)]
    pub amount_cents: Option<Cents>,
    /// The most auto top-ups may charge in a UTC month; absent or null: no cap.
    #[schema(value_type = Option<i64>, minimum = 100, maximum = 100000000)]
    pub monthly_limit_cents: Option<Cents>,
}

impl AutoTopupBody {
    pub fn settings(&self) -> keel_core::billing::service::AutoTopupSettings {
        keel_core::billing::service::AutoTopupSettings {
            enabled: self.enabled,
            threshold: self.threshold_cents,
            amount: self.amount_cents,
            monthly_limit: self.monthly_limit_cents,
        }
    }
}

impl Validate for AutoTopupBody {
    fn validate(&self, c: &mut Checks) {
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
    fn validate(&self, _c: &mut Checks) {}
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DebitBody {
    #[schema(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
    /// With a run id the fee is charged once per (organization, run).
    #[schema(value_type = Option<String>, min_length = 1, max_length = 200)]
    pub run_id: Option<RunId>,
}

impl Validate for DebitBody {
    fn validate(&self, _c: &mut Checks) {}
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServingUsageBody {
    /// Per-generation id: a replay answers the original charge.
    #[schema(min_length = 1, max_length = 200)]
    pub request_id: String,
    /// Must match the adapter's owner when `adapterId` is given.
    #[schema(value_type = Option<String>, min_length = 1, max_length = 100)]
    #[serde(default, deserialize_with = "OrgId::optional")]
    pub org_id: Option<OrgId>,
    /// Authoritative for the billed organization.
    #[schema(min_length = 1, max_length = 512)]
    pub adapter_id: Option<String>,
    /// A priced base model (when no adapter is involved).
    #[schema(min_length = 1, max_length = 512)]
    pub model: Option<String>,
    #[schema(minimum = 0, maximum = 2147483647)]
    pub prompt_tokens: i64,
    #[schema(minimum = 0, maximum = 2147483647)]
    pub completion_tokens: i64,
}

impl Validate for ServingUsageBody {
    fn validate(&self, c: &mut Checks) {
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
    #[schema(value_type = String, min_length = 1, max_length = 128)]
    pub run_id: RunId,
    #[schema(value_type = i64, exclusive_minimum = 0, maximum = 1000000000)]
    pub estimate_cents: Cents,
}

impl Validate for TrainingUsageBody {}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrainingPrecheckBody {
    #[schema(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
    #[schema(value_type = i64, exclusive_minimum = 0, maximum = 1000000000)]
    pub estimate_cents: Cents,
}

impl Validate for TrainingPrecheckBody {}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct InternalTrainingUsageBody {
    #[schema(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
    #[schema(value_type = String, min_length = 1, max_length = 128)]
    pub run_id: RunId,
    #[schema(value_type = i64, minimum = 0, maximum = 1000000000)]
    pub amount_cents: Cents,
}

impl Validate for InternalTrainingUsageBody {}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrainingCostBody {
    #[schema(value_type = String, min_length = 1, max_length = 128)]
    pub run_id: RunId,
    #[schema(value_type = i64, minimum = 0, maximum = 1000000000)]
    pub cost_cents: Cents,
    #[schema(min_length = 1, max_length = 100)]
    pub provider: Option<String>,
}

impl Validate for TrainingCostBody {}

crate::org_scoped!(
    OrgQuery,
    StatementQuery,
    LedgerCsvQuery,
    OrgBody,
    PaymentMethodBody,
    TopupBody,
    AutoTopupBody,
    PromoCodeBody,
    DebitBody,
);

// ---------------------------------------------------------------------------------------
// Views

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CardView {
    pub brand: String,
    pub last4: String,
    pub exp_month: i32,
    pub exp_year: i32,
}

impl From<Card> for CardView {
    fn from(card: Card) -> Self {
        Self {
            brand: card.brand,
            last4: card.last4,
            exp_month: card.exp_month,
            exp_year: card.exp_year,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AutoTopupView {
    pub enabled: bool,
    #[schema(value_type = Option<i64>)]
    pub threshold_cents: Option<Cents>,
    #[schema(value_type = Option<i64>)]
    pub amount_cents: Option<Cents>,
    /// The most auto top-ups may charge in a UTC month (null: no cap).
    #[schema(value_type = Option<i64>)]
    pub monthly_limit_cents: Option<Cents>,
    /// What auto top-ups have charged this UTC month.
    #[schema(value_type = i64)]
    pub charged_this_month_cents: Cents,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LedgerEntryView {
    pub id: i64,
    pub kind: String,
    #[schema(value_type = i64)]
    pub amount_microcents: Microcents,
    #[schema(value_type = i64)]
    pub balance_after_microcents: Microcents,
    pub reason: String,
    pub created_at: DateTime<Utc>,
}

impl From<ledger_entry::Model> for LedgerEntryView {
    fn from(e: ledger_entry::Model) -> Self {
        Self {
            id: e.id,
            kind: e.kind.to_string(),
            amount_microcents: e.amount_microcents,
            balance_after_microcents: e.balance_after_microcents,
            reason: e.reason,
            created_at: e.created_at,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BillingView {
    pub org_id: String,
    #[schema(value_type = i64)]
    pub balance_cents: Cents,
    #[schema(value_type = i64)]
    pub balance_microcents: Microcents,
    pub customer_id: Option<String>,
    pub payment_method: Option<CardView>,
    pub auto_topup: AutoTopupView,
    /// Auto top-up is paused after three consecutive declines until its settings are saved.
    pub auto_topup_paused: bool,
    pub starter_credit_granted: bool,
    pub recent_ledger: Vec<LedgerEntryView>,
    /// The active credit grants (something left), in the order debits draw from them.
    pub grants: Vec<GrantView>,
    /// The soonest expiry of an active grant and what lapses then; null when none expires.
    pub next_expiry: Option<NextExpiryView>,
}

/// A credit: what it was, what is left, the order it is drawn in, when it lapses.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GrantView {
    pub grant_id: String,
    /// starter, promo, topup, auto_topup, manual, refund or migrated.
    pub kind: String,
    #[schema(value_type = i64)]
    pub original_microcents: Microcents,
    #[schema(value_type = i64)]
    pub remaining_microcents: Microcents,
    /// Lower is drawn first.
    pub priority: i32,
    pub expires_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

impl From<credit_grant::Model> for GrantView {
    fn from(g: credit_grant::Model) -> Self {
        Self {
            grant_id: g.id,
            kind: g.kind.to_string(),
            original_microcents: g.original_microcents,
            remaining_microcents: g.remaining_microcents,
            priority: g.priority,
            expires_at: g.expires_at,
            created_at: g.created_at,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NextExpiryView {
    pub at: DateTime<Utc>,
    #[schema(value_type = i64)]
    pub microcents: Microcents,
}

/// An operator's goodwill credit or refund.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ManualGrantBody {
    #[schema(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
    #[schema(value_type = i64, minimum = 1, maximum = 100000000)]
    pub amount_cents: Cents,
    /// Why (shown with the grant and its ledger entry).
    #[schema(min_length = 1, max_length = 500)]
    pub reason: String,
    /// When it lapses (in the future); absent: never.
    pub expires_at: Option<DateTime<Utc>>,
    /// Lower is drawn first; absent: the promotional priority (`billing.promotional_priority`).
    #[schema(minimum = 0, maximum = 1000)]
    pub priority: Option<i32>,
}

impl Validate for ManualGrantBody {
    fn validate(&self, c: &mut Checks) {
        if self.expires_at.is_some_and(|at| at <= Utc::now()) {
            c.fail("expiresAt", "value_error", "expiresAt must be in the future");
        }
    }
}

/// A manual grant as made, with who made it and why.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ManualGrantView {
    #[serde(flatten)]
    pub grant: GrantView,
    pub reason: String,
    /// The internal key's label (`internal:` and 12 hex digits of its SHA-256).
    pub created_by: Option<String>,
}

/// An organization's grants: the active ones first, in draw order, then the rest.
#[derive(Debug, Serialize, ToSchema)]
pub struct GrantsPage {
    pub grants: Vec<GrantView>,
}

impl BillingView {
    pub fn new(overview: keel_core::billing::service::Overview) -> Self {
        let next_expiry = overview
            .next_expiry()
            .map(|(at, microcents)| NextExpiryView { at, microcents });
        let keel_core::billing::service::Overview {
            account,
            recent,
            grants,
            auto_topup_charged,
        } = overview;
        let balance = account.balance_microcents;
        let payment_method = match (&account.payment_method_id, account.pm_brand, account.pm_last4) {
            (Some(_), Some(brand), Some(last4)) => Some(CardView {
                brand,
                last4,
                exp_month: account.pm_exp_month.unwrap_or(0),
                exp_year: account.pm_exp_year.unwrap_or(0),
            }),
            _ => None,
        };
        Self {
            org_id: account.org_id.into(),
            balance_cents: balance.floor_cents(),
            balance_microcents: balance,
            customer_id: account.customer_id,
            payment_method,
            auto_topup: AutoTopupView {
                enabled: account.auto_topup_enabled,
                threshold_cents: account.auto_topup_threshold_cents,
                amount_cents: account.auto_topup_amount_cents,
                monthly_limit_cents: account.auto_topup_monthly_limit_cents,
                charged_this_month_cents: auto_topup_charged,
            },
            auto_topup_paused: account.auto_topup_enabled
                && account.auto_topup_declines >= MAX_AUTO_TOPUP_DECLINES,
            starter_credit_granted: account.starter_credit_granted,
            recent_ledger: recent.into_iter().map(LedgerEntryView::from).collect(),
            grants: grants.into_iter().map(GrantView::from).collect(),
            next_expiry,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChargeView {
    #[schema(value_type = i64)]
    pub charged_cents: Cents,
    #[schema(value_type = i64)]
    pub balance_cents: Cents,
    pub replayed: bool,
}

impl From<&Outcome> for ChargeView {
    fn from(outcome: &Outcome) -> Self {
        Self {
            charged_cents: outcome.charged_cents(),
            balance_cents: outcome.balance.floor_cents(),
            replayed: outcome.replayed,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunChargeView {
    pub run_id: String,
    #[schema(value_type = i64)]
    pub charged_cents: Cents,
    #[schema(value_type = i64)]
    pub balance_cents: Cents,
    pub replayed: bool,
}

impl RunChargeView {
    pub fn new(run_id: RunId, outcome: &Outcome) -> Self {
        Self {
            run_id: run_id.into_string(),
            charged_cents: outcome.charged_cents(),
            balance_cents: outcome.balance.floor_cents(),
            replayed: outcome.replayed,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServingChargeView {
    pub request_id: String,
    pub org_id: String,
    #[schema(value_type = i64)]
    pub cost_microcents: Microcents,
    #[schema(value_type = i64)]
    pub charged_microcents: Microcents,
    #[schema(value_type = i64)]
    pub balance_microcents: Microcents,
    pub replayed: bool,
}

impl ServingChargeView {
    pub fn new(recorded: ServingUsageRow, outcome: &Outcome) -> Self {
        Self {
            request_id: recorded.request_id,
            org_id: recorded.org_id.into(),
            cost_microcents: recorded.cost_microcents,
            charged_microcents: recorded.charged_microcents,
            balance_microcents: outcome.balance,
            replayed: outcome.replayed,
        }
    }
}

/// The organization's processor customer, created on first need.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SetupIntentView {
    pub client_secret: String,
    pub customer_id: String,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct PaymentMethodDeleted {
    pub deleted: bool,
    /// Auto top-up needs a card: removing it turns auto top-up off.
    pub auto_topup_disabled: bool,
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

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopupView {
    /// `succeeded` (credited now) or the processor's pending status.
    pub status: String,
    pub payment_intent_id: String,
    #[schema(value_type = i64)]
    pub balance_cents: Cents,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreditView {
    #[schema(value_type = i64)]
    pub credited_cents: Cents,
    #[schema(value_type = i64)]
    pub balance_cents: Cents,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct WebhookAck {
    pub received: bool,
    /// The event id was already processed.
    pub duplicate: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PrecheckView {
    pub ok: bool,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrainingCostView {
    pub run_id: String,
    #[schema(value_type = i64)]
    pub cost_cents: Cents,
}

#[cfg(test)]
mod entry_tests {
    use chrono::{TimeZone, Utc};
    use entities::ledger_entry;
    use keel_core::domain::{EntryKind, Microcents, OrgId};

    use super::LedgerEntryView;

    /// A top-up event's `data` is the ledger entry as the ledger page shows it.
    #[test]
    fn a_top_up_events_data_is_the_ledger_entry_view() {
        let entry = ledger_entry::Model {
            id: 42,
            org_id: OrgId::parse("1b6f5f0e-4c1a-4a44-9d5c-2f1c3e0a7b11").unwrap(),
            kind: EntryKind::AutoTopup,
            amount_microcents: Microcents(25_000_000),
            balance_after_microcents: Microcents(26_500_000),
            idempotency_key: Some("payment:pi_1".into()),
            reason: "auto top-up pi_1".into(),
            grants: None,
            created_at: Utc.with_ymd_and_hms(2026, 11, 26, 12, 0, 0).unwrap(),
        };
        assert_eq!(
            serde_json::to_value(LedgerEntryView::from(entry.clone())).unwrap(),
            keel_core::billing::entry_data(&entry)
        );
    }
}
