use keel_domain::TraceId;
use sea_orm::entity::prelude::*;

/// A tag on a trace (`a-z0-9_.:-`, 1 to 50 characters; at most 20 a trace).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "trace_tags")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub trace_id: TraceId,
    #[sea_orm(primary_key, auto_increment = false)]
    pub tag: String,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
