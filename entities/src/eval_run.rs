use keel_domain::{EvalStatus, OrgId, ProjectId};
use sea_orm::entity::prelude::*;

/// An uploaded eval run with the counts derived from its cases.
#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "eval_runs")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub org_id: OrgId,
    pub project_id: ProjectId,
    pub suite_name: String,
    pub environment_reference: String,
    pub model: Option<String>,
    pub status: EvalStatus,
    pub error: Option<String>,
    pub started_at: Option<DateTimeUtc>,
    pub metadata: Option<String>,
    pub total_cases: i32,
    pub passed_cases: i32,
    pub graded_cases: i32,
    pub errored_cases: i32,
    pub mean_score: Option<f64>,
    pub created_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
