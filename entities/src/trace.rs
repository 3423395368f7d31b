use keel_domain::{OrgId, ProjectId, TraceId};
use sea_orm::entity::prelude::*;

/// One recorded chat completion (request and response redacted).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "traces")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: TraceId,
    pub org_id: OrgId,
    pub project_id: ProjectId,
    pub provider: String,
    pub model: Option<String>,
    pub request: String,
    pub response: Option<String>,
    pub status_code: i32,
    pub stream: bool,
    pub complete: bool,
    pub latency_ms: i64,
    pub ttfb_ms: Option<i64>,
    pub prompt_tokens: Option<i64>,
    pub completion_tokens: Option<i64>,
    pub total_tokens: Option<i64>,
    /// The tokens were estimated from the text (the provider sent no usage).
    pub usage_estimated: bool,
    pub error: Option<String>,
    pub created_at: DateTimeUtc,
    /// Its searchable words (user and assistant messages, the reply; as stored), lowercase,
    /// space-separated (`keel_core::traces::search`).
    pub search_text: Option<String>,
    /// The last user message and the reply, 200 characters each.
    pub preview_input: Option<String>,
    pub preview_output: Option<String>,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
