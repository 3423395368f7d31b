use keel_domain::{DatasetId, TraceId};
use sea_orm::entity::prelude::*;

/// A line of a dataset version: its place, its trace and its side of the split.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "dataset_items")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub dataset_id: DatasetId,
    #[sea_orm(primary_key, auto_increment = false)]
    pub version: i32,
    #[sea_orm(primary_key, auto_increment = false)]
    pub ordinal: i32,
    pub trace_id: TraceId,
    pub validation: bool,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
