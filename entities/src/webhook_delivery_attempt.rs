use sea_orm::entity::prelude::*;

/// One try at a delivery: the answer's status and the first 1 KiB of its body, or the error.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "webhook_delivery_attempts")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub delivery_id: String,
    #[sea_orm(primary_key, auto_increment = false)]
    pub attempt: i32,
    pub attempted_at: DateTimeUtc,
    pub status_code: Option<i32>,
    pub latency_ms: i32,
    pub response: Option<String>,
    pub error: Option<String>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
