use keel_domain::JobAction;
use sea_orm::entity::prelude::*;

/// An action whose queue an operator paused: its jobs are not claimed until resumed.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "queue_pauses")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub action: JobAction,
    pub paused_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
