use keel_domain::JobId;
use sea_orm::entity::prelude::*;

/// A pipeline's edge: `job_id` waits until `depends_on_id` has succeeded (both jobs of one
/// organization).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "training_job_dependencies")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub job_id: JobId,
    #[sea_orm(primary_key, auto_increment = false)]
    pub depends_on_id: JobId,
    pub created_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
