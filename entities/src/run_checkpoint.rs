use keel_domain::{OrgId, ProjectId, RunId};
use sea_orm::entity::prelude::*;

/// A run's checkpoint at one step (upserted by organization, run and step).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "run_checkpoints")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub org_id: OrgId,
    #[sea_orm(primary_key, auto_increment = false)]
    pub run_id: RunId,
    #[sea_orm(primary_key, auto_increment = false)]
    pub step: i64,
    pub project_id: ProjectId,
    pub subfolder: String,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
