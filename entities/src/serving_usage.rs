use keel_domain::{Microcents, OrgId};
use sea_orm::entity::prelude::*;

/// One metered serving request; `request_id` makes the charge idempotent.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "serving_usage")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub request_id: String,
    pub org_id: OrgId,
    pub adapter_id: Option<String>,
    pub model: String,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub cost_microcents: Microcents,
    pub charged_microcents: Microcents,
    pub created_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
