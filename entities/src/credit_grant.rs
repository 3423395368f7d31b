use keel_domain::{GrantKind, Microcents, OrgId};
use sea_orm::entity::prelude::*;

/// A credit: what it was, what is left of it, the order debits draw from it in, and when it
/// lapses (its remainder then becomes an `expiry` entry).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "credit_grants")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub org_id: OrgId,
    pub kind: GrantKind,
    pub original_microcents: Microcents,
    pub remaining_microcents: Microcents,
    /// Lower first.
    pub priority: i32,
    pub expires_at: Option<DateTimeUtc>,
    pub reason: String,
    /// Who made a manual grant (the internal key's label).
    pub created_by: Option<String>,
    pub idempotency_key: Option<String>,
    pub request_hash: Option<String>,
    /// When `billing.credit.expiring` was sent for it.
    pub expiring_notified_at: Option<DateTimeUtc>,
    /// When the sweep expired it.
    pub expired_at: Option<DateTimeUtc>,
    pub created_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
