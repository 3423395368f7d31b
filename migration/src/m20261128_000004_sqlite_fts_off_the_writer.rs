//! SQLite's FTS5 index of trace words, kept off the trace writer's path (issue 54): entering
//! a trace's words in FTS5 from an insert trigger doubled the writer's cost per trace, most of
//! what the recording proxy had lost on SQLite. The writer now only inserts; the search indexer
//! enters the traces past a mark (`traces_fts_mark`: the last rowid indexed) in batches, and a
//! search reads the words of the traces past it directly, as PostgreSQL's does. The delete and
//! update triggers act only on indexed rows (an FTS5 `delete` of a row it never indexed would
//! corrupt it). PostgreSQL: nothing.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

use crate::cols::execute_all;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// The delete and update triggers, on indexed rows only (the mark's); a later rebuild of the
/// table (`m20261128_000005`) makes them again.
pub(crate) const MARKED_TRIGGERS: [&str; 2] = [
    "CREATE TRIGGER traces_fts_delete AFTER DELETE ON traces \
     WHEN old.rowid <= (SELECT last_rowid FROM traces_fts_mark) BEGIN \
     INSERT INTO traces_fts(traces_fts, rowid, search_text) VALUES ('delete', old.rowid, old.search_text); END",
    "CREATE TRIGGER traces_fts_update AFTER UPDATE OF search_text ON traces \
     WHEN old.rowid <= (SELECT last_rowid FROM traces_fts_mark) BEGIN \
     INSERT INTO traces_fts(traces_fts, rowid, search_text) VALUES ('delete', old.rowid, old.search_text); \
     INSERT INTO traces_fts(rowid, search_text) VALUES (new.rowid, new.search_text); END",
];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::Sqlite {
            return Ok(());
        }
        execute_all(
            manager,
            &[
                "CREATE TABLE traces_fts_mark (id INTEGER PRIMARY KEY CHECK (id = 1), last_rowid INTEGER NOT NULL)",
                // Every trace so far was indexed by the insert trigger.
                "INSERT INTO traces_fts_mark (id, last_rowid) SELECT 1, coalesce(max(rowid), 0) FROM traces",
                "DROP TRIGGER IF EXISTS traces_fts_insert",
                "DROP TRIGGER IF EXISTS traces_fts_delete",
                "DROP TRIGGER IF EXISTS traces_fts_update",
                MARKED_TRIGGERS[0],
                MARKED_TRIGGERS[1],
            ],
        )
        .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != DbBackend::Sqlite {
            return Ok(());
        }
        execute_all(
            manager,
            &[
                // What the indexer had not reached yet, indexed now, as the trigger did.
                "INSERT INTO traces_fts(rowid, search_text) SELECT rowid, search_text FROM traces \
                 WHERE rowid > (SELECT last_rowid FROM traces_fts_mark)",
                "DROP TRIGGER IF EXISTS traces_fts_delete",
                "DROP TRIGGER IF EXISTS traces_fts_update",
                "CREATE TRIGGER traces_fts_insert AFTER INSERT ON traces BEGIN \
                 INSERT INTO traces_fts(rowid, search_text) VALUES (new.rowid, new.search_text); END",
                "CREATE TRIGGER traces_fts_delete AFTER DELETE ON traces BEGIN \
                 INSERT INTO traces_fts(traces_fts, rowid, search_text) VALUES ('delete', old.rowid, old.search_text); END",
                "CREATE TRIGGER traces_fts_update AFTER UPDATE OF search_text ON traces BEGIN \
                 INSERT INTO traces_fts(traces_fts, rowid, search_text) VALUES ('delete', old.rowid, old.search_text); \
                 INSERT INTO traces_fts(rowid, search_text) VALUES (new.rowid, new.search_text); END",
                "DROP TABLE traces_fts_mark",
            ],
        )
        .await
    }
}
