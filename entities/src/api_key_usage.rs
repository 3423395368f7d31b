use keel_domain::ApiKeyId;
use sea_orm::entity::prelude::*;

/// What an API key used in one UTC day (`YYYY-MM-DD`): requests it made through the proxy and
/// relay, tokens of its recorded calls. Each instance adds its counts every second or so.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "api_key_usage")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub key_id: ApiKeyId,
    #[sea_orm(primary_key, auto_increment = false)]
    pub day: String,
    pub requests: i64,
    pub tokens: i64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
