use keel_domain::OrgId;
use sea_orm::entity::prelude::*;

/// A new API key's secret, sealed, for its one view in the console.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "console_reveals")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    /// The console session that created the key (only it may see it).
    pub session_id: String,
    pub org_id: OrgId,
    pub sealed: String,
    pub created_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
