use keel_domain::{HubStatus, OrgId, ProjectId};
use sea_orm::entity::prelude::*;

/// The mirror of a control-plane environment, unique by slug, and its hub provisioning state.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "flash_environments")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub org_id: OrgId,
    pub project_id: ProjectId,
    pub slug: String,
    pub name: String,
    pub hub_repo: String,
    pub hub_ref: String,
    pub hub_path: String,
    pub package_sha256: Option<String>,
    pub published_by_user_id: Option<String>,
    pub api_key_id: Option<String>,
    pub metadata: Option<String>,
    pub hub_status: HubStatus,
    pub hub_attempts: i32,
    pub hub_error: Option<String>,
    pub hub_lease_until: Option<DateTimeUtc>,
    pub hub_provisioned_at: Option<DateTimeUtc>,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
