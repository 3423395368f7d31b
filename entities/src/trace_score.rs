use keel_domain::TraceId;
use sea_orm::entity::prelude::*;

/// A named score of a trace (at most 20 a trace), with an optional comment.
#[derive(Clone, Debug, PartialEq, DeriveEntityModel)]
#[sea_orm(table_name = "trace_scores")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub trace_id: TraceId,
    #[sea_orm(primary_key, auto_increment = false)]
    pub name: String,
    pub value: f64,
    pub comment: Option<String>,
    pub updated_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
