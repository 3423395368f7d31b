use keel_domain::OrgId;
use sea_orm::entity::prelude::*;

/// An optimizer run's timeline, synced by the worker (latest sync wins).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "optimizer_timelines")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub org_id: OrgId,
    #[sea_orm(primary_key, auto_increment = false)]
    pub timeline_id: String,
    pub job_id: Option<String>,
    /// JSON array of events.
    pub events: String,
    pub updated_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
