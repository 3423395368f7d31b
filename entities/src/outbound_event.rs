use keel_domain::OrgId;
use sea_orm::entity::prelude::*;

/// An event an organization's change announced, written in the change's own transaction.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "outbound_events")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub org_id: OrgId,
    pub event_type: String,
    /// The JSON every endpoint receives: `{id, type, createdAt, orgId, data}`.
    pub body: String,
    pub created_at: DateTimeUtc,
    /// The id of the request whose change announced it (none for background work).
    pub request_id: Option<String>,
    /// That request's W3C trace context (kept while keel exports its spans): each delivery's
    /// span continues its trace, and the receiver gets it as `traceparent`.
    pub traceparent: Option<String>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
