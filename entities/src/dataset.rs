use keel_domain::{DatasetId, OrgId, ProjectId};
use sea_orm::entity::prelude::*;

/// A named selection of a project's traces, in versions that never change.
#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "datasets")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: DatasetId,
    pub org_id: OrgId,
    pub project_id: ProjectId,
    /// Unique in the project.
    pub name: String,
    pub description: Option<String>,
    /// The share of each version's lines in validation (0 to 0.5).
    pub split_validation: f64,
    /// With a trace's id, which side of the split it is on.
    pub split_seed: i64,
    /// `none` or `prompt` (one trace per identical request messages).
    pub dedupe: String,
    pub latest_version: i32,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
