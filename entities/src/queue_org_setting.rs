use keel_domain::OrgId;
use sea_orm::entity::prelude::*;

/// An operator's queue settings for one organization: its share weight and running cap.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "queue_org_settings")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub org_id: OrgId,
    /// 1..100: claims hand it jobs in proportion to this among backlogged organizations.
    pub weight: i32,
    /// At most this many running jobs (none: `queue.max_running_per_org`; 0: no cap).
    pub max_running: Option<i32>,
    pub updated_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
