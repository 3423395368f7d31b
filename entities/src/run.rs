use keel_domain::{OrgId, ProjectId, RunId};
use sea_orm::entity::prelude::*;

/// A run of a project, created by a user; optionally linked to an experiment-tracker run.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "runs")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: RunId,
    pub org_id: OrgId,
    pub project_id: ProjectId,
    pub name: Option<String>,
    pub model: Option<String>,
    pub environment_slug: Option<String>,
    pub config: Option<String>,
    pub status: String,
    pub summary: Option<String>,
    pub metrics: Option<String>,
    pub error: Option<String>,
    pub tracker_entity: Option<String>,
    pub tracker_project: Option<String>,
    pub tracker_run_id: Option<String>,
    pub tracker_url: Option<String>,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
