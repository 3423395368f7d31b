use keel_domain::OrgId;
use sea_orm::entity::prelude::*;

/// Hub provisioning retry state of one organization.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "hub_backoff")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub org_id: OrgId,
    pub failures: i32,
    pub next_attempt_at: DateTimeUtc,
    pub last_error: Option<String>,
    pub updated_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
