use keel_domain::{OrgId, ProjectId};
use sea_orm::entity::prelude::*;

/// A run's (or an anonymous) reference to an environment slug.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "flash_environment_uses")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub org_id: OrgId,
    pub project_id: ProjectId,
    pub slug: String,
    pub run_id: Option<String>,
    pub created_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
