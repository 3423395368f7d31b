use keel_domain::OrgId;
use sea_orm::entity::prelude::*;

/// Where an organization wants its events sent, signed with its secret (sealed at rest).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "webhook_endpoints")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    pub org_id: OrgId,
    pub url: String,
    pub description: Option<String>,
    /// A JSON array of event names (`"*"`: all).
    pub events: String,
    pub secret_sealed: String,
    /// Secrets rotated out, each signing beside the current one until its own deadline: a
    /// JSON list of `{"sealed", "until"}` (none: none).
    pub previous_secrets: Option<String>,
    pub enabled: bool,
    pub disabled_reason: Option<String>,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
    /// Since when every attempt at its deliveries failed (none since a success).
    pub failing_since: Option<DateTimeUtc>,
    /// When it was last disabled (by a member, or by keel after five days of failures).
    pub disabled_at: Option<DateTimeUtc>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
