use keel_domain::{JobAction, OrgId};
use sea_orm::entity::prelude::*;

/// An organization's place in an action's turn order (stride scheduling): the claim hands
/// the next job to the backlogged organization with the lowest `pass`, which then grows by
/// 1 / weight.
#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "queue_shares")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub action: JobAction,
    #[sea_orm(primary_key, auto_increment = false)]
    pub org_id: OrgId,
    pub pass: f64,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
