use keel_domain::OrgId;
use sea_orm::entity::prelude::*;

/// A training secret of an organization, AES-256-GCM encrypted at rest.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "org_secrets")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub org_id: OrgId,
    #[sea_orm(primary_key, auto_increment = false)]
    pub name: String,
    /// Hex of nonce (12 bytes) followed by ciphertext and tag.
    pub sealed: String,
    pub updated_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
