use keel_domain::OrgId;
use sea_orm::entity::prelude::*;

/// Something keel did on its own that an organization's members should see in the console
/// (an endpoint disabled after days of failures).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "console_events")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub org_id: OrgId,
    /// `webhook.endpoint_disabled`.
    pub kind: String,
    pub message: String,
    pub created_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
