use keel_domain::{EntryKind, Microcents, OrgId};
use sea_orm::entity::prelude::*;

/// One change of a balance. Append-only; `(org_id, idempotency_key)` is unique.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "ledger_entries")]
pub struct Model {
    #[sea_orm(primary_key)]
    pub id: i64,
    pub org_id: OrgId,
    /// `topup`, `auto_topup`, `promo`, `starter_credit`, `run_fee`, `serving_usage`,
    /// `training_estimate`, `training_run`.
    pub kind: EntryKind,
    /// Signed: credits are positive, debits negative.
    pub amount_microcents: Microcents,
    pub balance_after_microcents: Microcents,
    pub idempotency_key: Option<String>,
    pub reason: String,
    /// JSON: the credit grants the entry changed, `[{grantId, microcents}]` (signed).
    pub grants: Option<String>,
    pub created_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
