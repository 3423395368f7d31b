use keel_domain::{Cents, EntryKind, OrgId};
use sea_orm::entity::prelude::*;

/// A charge recorded before the processor was called and not settled yet.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "pending_payments")]
pub struct Model {
    /// The idempotency key the processor is called with (one payment per key).
    #[sea_orm(primary_key, auto_increment = false)]
    pub processor_key: String,
    pub org_id: OrgId,
    /// `topup` or `auto_topup`.
    pub kind: EntryKind,
    pub amount_cents: Cents,
    pub customer_id: String,
    pub payment_method_id: String,
    /// The client's `Idempotency-Key` of a top-up.
    pub client_key: Option<String>,
    pub created_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
