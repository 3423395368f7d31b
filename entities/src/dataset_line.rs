use keel_domain::{DatasetId, ProjectId, TraceId};
use sea_orm::entity::prelude::*;

/// A trace's training lines as the dataset first took them: its versions read these, never
/// the trace (which retention may delete, and tags and redaction may change).
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "dataset_lines")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub dataset_id: DatasetId,
    #[sea_orm(primary_key, auto_increment = false)]
    pub trace_id: TraceId,
    pub project_id: ProjectId,
    pub trace_created_at: DateTimeUtc,
    /// SHA-256 (hex) of the request's messages.
    pub prompt_key: String,
    /// The `openai-chat`, `records` and `prompts` lines (JSON, no newline).
    pub chat: String,
    pub record: String,
    pub prompt: String,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
