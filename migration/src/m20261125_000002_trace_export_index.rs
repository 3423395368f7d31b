//! The export walks a project's traces newest to oldest by `(created_at, id)` (keyset
//! pages): one index with both keys, which also serves what the old `(project_id,
//! created_at)` index did.

use sea_orm_migration::prelude::*;

use crate::cols::index;

#[derive(DeriveMigrationName)]
pub struct Migration;

const TABLE: &str = "traces";
const OLD: &str = "idx_traces_project_created";
const NEW: &str = "idx_traces_project_created_id";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_index(index(NEW, TABLE, &["project_id", "created_at", "id"]))
            .await?;
        manager
            .drop_index(Index::drop().name(OLD).table(TABLE).to_owned())
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_index(index(OLD, TABLE, &["project_id", "created_at"]))
            .await?;
        manager
            .drop_index(Index::drop().name(NEW).table(TABLE).to_owned())
            .await
    }
}
