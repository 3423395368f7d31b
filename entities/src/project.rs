use keel_domain::{OrgId, ProjectId};
use sea_orm::entity::prelude::*;

#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "projects")]
pub struct Model {
    /// UUID string.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: ProjectId,
    pub org_id: OrgId,
    pub name: String,
    /// Unique within the organization.
    pub slug: String,
    pub description: Option<String>,
    pub active: bool,
    pub created_at: DateTimeUtc,
    /// Its traces are deleted this many days after they were recorded; `None`: kept.
    pub trace_retention_days: Option<i32>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
