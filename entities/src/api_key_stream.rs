use keel_domain::ApiKeyId;
use sea_orm::entity::prelude::*;

/// The streams an API key has open on one instance; rows an instance stopped refreshing
/// (`seen_at`) count for nothing.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "api_key_streams")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub key_id: ApiKeyId,
    #[sea_orm(primary_key, auto_increment = false)]
    pub instance: String,
    pub active: i32,
    pub seen_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
