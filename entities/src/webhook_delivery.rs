use keel_domain::{DeliveryStatus, OrgId};
use sea_orm::entity::prelude::*;

/// One event on its way to one endpoint.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "webhook_deliveries")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub event_id: String,
    pub endpoint_id: String,
    pub org_id: OrgId,
    pub status: DeliveryStatus,
    pub attempts: i32,
    /// Pending: when it is due (while a dispatcher sends it: when that claim lapses).
    pub next_attempt_at: Option<DateTimeUtc>,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
    /// While a dispatcher sends it: until when it is that dispatcher's (none otherwise).
    pub leased_until: Option<DateTimeUtc>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
