use keel_domain::{ProjectId, TraceId};
use sea_orm::entity::prelude::*;

/// A recorded trace still to be pushed to its project's OTLP endpoint (written with the trace).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "otlp_outbox")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub trace_id: TraceId,
    pub project_id: ProjectId,
    pub created_at: DateTimeUtc,
    /// While an exporter sends it: until when it is that exporter's.
    pub leased_until: Option<DateTimeUtc>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
