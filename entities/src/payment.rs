use keel_domain::{Cents, EntryKind, OrgId, PaymentState};
use sea_orm::entity::prelude::*;

/// A charge attempted on a saved card, by payment-intent id.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "payments")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub payment_intent_id: String,
    pub org_id: OrgId,
    pub amount_cents: Cents,
    /// `succeeded`, `declined`, `requires_action`, `processing`.
    pub status: PaymentState,
    /// `topup` or `auto_topup`.
    pub kind: EntryKind,
    /// The client's `Idempotency-Key` of a top-up; unique per organization.
    pub idempotency_key: Option<String>,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
