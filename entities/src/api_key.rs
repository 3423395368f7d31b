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
    /// `api`, `inference` or both, comma-separated (`keel_core::keys::Scopes`).
    pub scopes: String,
    pub requests_per_minute: Option<i32>,
    pub tokens_per_day: Option<i64>,
    pub concurrent_streams: Option<i32>,
    /// The models the key may call through the proxy and relay: a JSON array; `None` is any.
    pub models: Option<String>,
    pub expires_at: Option<DateTimeUtc>,
    pub last_used_at: Option<DateTimeUtc>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
