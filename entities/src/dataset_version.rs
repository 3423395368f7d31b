use keel_domain::DatasetId;
use sea_orm::entity::prelude::*;

/// One version of a dataset: what it selected and the digests of its lines.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "dataset_versions")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub dataset_id: DatasetId,
    #[sea_orm(primary_key, auto_increment = false)]
    pub version: i32,
    /// The filter this version ran (JSON), if any.
    pub filter: Option<String>,
    pub train_lines: i64,
    pub validation_lines: i64,
    /// Selected traces left out: not trainable, or a duplicate prompt.
    pub skipped: i64,
    /// SHA-256 (hex) of each format's lines per split, JSON `{format: {split: hex}}`.
    pub digests: String,
    pub created_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
