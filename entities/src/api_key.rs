use keel_domain::{ApiKeyId, OrgId};
use sea_orm::entity::prelude::*;

/// A user API key. Only its SHA-256 hash is stored; `prefix` is for display.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "api_keys")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: ApiKeyId,
    pub org_id: OrgId,
    pub name: Option<String>,
    pub prefix: String,
    #[sea_orm(unique)]
    pub key_hash: String,
    pub created_at: DateTimeUtc,
    pub revoked_at: Option<DateTimeUtc>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
