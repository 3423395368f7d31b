//! Traces recorded before keel kept their words (`search_text` null) get them in the
//! background (`keel_core::traces::indexer`): a partial index finds them (the writer never
//! adds to it), and on SQLite a trigger brings the FTS5 table up to date when a trace's words
//! are set after its insert.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, DbBackend};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        db.execute_unprepared(
            "CREATE INDEX idx_traces_unworded ON traces (created_at, id) WHERE search_text IS NULL",
        )
        .await?;
        if manager.get_database_backend() == DbBackend::Sqlite {
            db.execute_unprepared(
                "CREATE TRIGGER traces_fts_update AFTER UPDATE OF search_text ON traces BEGIN \
                 INSERT INTO traces_fts(traces_fts, rowid, search_text) VALUES ('delete', old.rowid, old.search_text); \
                 INSERT INTO traces_fts(rowid, search_text) VALUES (new.rowid, new.search_text); END",
            )
            .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        let db = manager.get_connection();
        if manager.get_database_backend() == DbBackend::Sqlite {
            db.execute_unprepared("DROP TRIGGER IF EXISTS traces_fts_update")
                .await?;
        }
        db.execute_unprepared("DROP INDEX IF EXISTS idx_traces_unworded")
            .await?;
        Ok(())
    }
}
