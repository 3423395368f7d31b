use keel_domain::ApiKeyId;
use sea_orm::entity::prelude::*;

/// The token bucket of an API key's `requestsPerMinute`, shared by every instance: `level`
/// in millionths of a request, as it stood at `updated_us` (Unix microseconds).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "api_key_buckets")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub key_id: ApiKeyId,
    pub level: i64,
    pub updated_us: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
