use keel_domain::{OrgId, ProjectId};
use sea_orm::entity::prelude::*;

/// Where a project's recorded calls are pushed as OpenTelemetry spans (OTLP/HTTP protobuf).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "otlp_exports")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub project_id: ProjectId,
    pub org_id: OrgId,
    /// The URL spans are posted to (the endpoint given, with `/v1/traces`).
    pub url: String,
    /// The headers' names, a JSON list (what views show).
    pub header_names: String,
    /// The headers (a JSON object), sealed like training secrets; never shown.
    pub headers_sealed: Option<String>,
    /// Failed pushes in a row, and when the next may go (`None`: now).
    pub failures: i32,
    pub retry_at: Option<DateTimeUtc>,
    pub last_error: Option<String>,
    pub last_error_at: Option<DateTimeUtc>,
    pub last_exported_at: Option<DateTimeUtc>,
    pub created_at: DateTimeUtc,
    pub updated_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
