use keel_domain::{Cents, Microcents, OrgId};
use sea_orm::entity::prelude::*;

/// An organization's billing record: processor customer, prepaid balance, saved card,
/// auto top-up settings.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "billing_accounts")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub org_id: OrgId,
    pub customer_id: Option<String>,
    /// Always equal to the sum of the organization's ledger entries.
    pub balance_microcents: Microcents,
    pub payment_method_id: Option<String>,
    pub pm_brand: Option<String>,
    pub pm_last4: Option<String>,
    pub pm_exp_month: Option<i32>,
    pub pm_exp_year: Option<i32>,
    pub auto_topup_enabled: bool,
    pub auto_topup_threshold_cents: Option<Cents>,
    pub auto_topup_amount_cents: Option<Cents>,
    /// Consecutive declined auto top-ups; 3 pause auto top-up until the settings are saved.
    pub auto_topup_declines: i32,
    /// Set while an auto top-up charge is in flight (one at a time per organization).
    pub auto_topup_started_at: Option<DateTimeUtc>,
    pub starter_credit_granted: bool,
    /// The most auto top-ups may charge in a UTC month (none: no cap).
    pub auto_topup_monthly_limit_cents: Option<Cents>,
    /// The UTC month (`YYYY-MM`) whose `billing.auto_topup.limit_reached` was sent.
    pub auto_topup_limit_notified_month: Option<String>,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
