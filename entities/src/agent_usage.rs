use sea_orm::entity::prelude::*;

/// The latest usage report of an agent account, by label.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "agent_usage")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub account_label: String,
    /// The whole report, as JSON.
    pub report: String,
    pub updated_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
