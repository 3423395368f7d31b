//! PostgreSQL's trace search index, filled off the trace writer's path (issue 44): the
//! `search` column becomes a plain `tsvector` that a background indexer sets from
//! `search_text` shortly after the insert (the generated column cost the writer more than
//! half its throughput, mostly in `to_tsvector`). The GIN index holds only indexed rows, and
//! a small partial index finds the rows still to index (searches read those directly).
//! Rows written before this migration are indexed by the indexer in the background. SQLite
//! is unchanged: its FTS5 table is kept by triggers.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

use crate::cols::execute_all;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::Postgres {
            return Ok(());
        }
        execute_all(
            manager,
            &[
                "DROP INDEX IF EXISTS idx_traces_search",
                "ALTER TABLE traces DROP COLUMN IF EXISTS search",
                "ALTER TABLE traces ADD COLUMN search tsvector",
                "CREATE INDEX idx_traces_search ON traces USING GIN (search) WHERE search IS NOT NULL",
                "CREATE INDEX idx_traces_unindexed ON traces (created_at, id) \
             WHERE search IS NULL AND search_text IS NOT NULL",
            ],
        )
        .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::Postgres {
            return Ok(());
        }
        execute_all(
            manager,
            &[
                "DROP INDEX IF EXISTS idx_traces_unindexed",
                "DROP INDEX IF EXISTS idx_traces_search",
                "ALTER TABLE traces DROP COLUMN IF EXISTS search",
                "ALTER TABLE traces ADD COLUMN search tsvector \
             GENERATED ALWAYS AS (to_tsvector('simple', coalesce(search_text, ''))) STORED",
                "CREATE INDEX idx_traces_search ON traces USING GIN (search)",
            ],
        )
        .await
    }
}
