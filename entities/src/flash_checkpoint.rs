use keel_domain::{OrgId, ProjectId};
use sea_orm::entity::prelude::*;

/// A managed run's checkpoint or artifact snapshot.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "flash_checkpoints")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub org_id: OrgId,
    #[sea_orm(primary_key, auto_increment = false)]
    pub run_id: String,
    #[sea_orm(primary_key, auto_increment = false)]
    pub checkpoint_id: String,
    pub project_id: ProjectId,
    pub data: String,
    pub source_updated_at: Option<String>,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
