use keel_domain::{Cents, OrgId};
use sea_orm::entity::prelude::*;

/// A redeemed promo code: one per (organization, code).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "promo_grants")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub org_id: OrgId,
    #[sea_orm(primary_key, auto_increment = false)]
    pub code: String,
    pub amount_cents: Cents,
    pub created_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
