use keel_domain::{Cents, RunId};
use sea_orm::entity::prelude::*;

/// A managed training run's realized provider cost, keyed by run id.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "training_run_cost")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub run_id: RunId,
    pub cost_cents: Cents,
    pub provider: Option<String>,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
