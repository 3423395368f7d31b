//! SQLite's FTS5 index of trace words rebuilt to take keel's words as they are (issue 54,
//! the recording proxy's cost): the `ascii` tokenizer splits `search_text` at its spaces only
//! (keel's words are letters and digits of any script, already lowercase), where `unicode61`
//! decoded every character again and folded diacritics (`cafe` found `café` once indexed,
//! but not in the unindexed tail, nor on PostgreSQL); `columnsize=0` drops the per-row sizes
//! only a ranking reads (keel orders by time); `detail=none` keeps which traces hold a word,
//! not where, as PostgreSQL's `tsvector` of words does (a phrase's order is checked on the
//! trace's words, on both databases). The new table starts empty and the search
//! indexer fills it from the first trace (the mark back to 0), a batch at a time; searches
//! read the words of what it has not reached meanwhile. PostgreSQL: nothing.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DbBackend;

use crate::cols::execute_all;
use crate::m20261128_000004_sqlite_fts_off_the_writer::MARKED_TRIGGERS as TRIGGERS;

#[derive(DeriveMigrationName)]
pub struct Migration;

async fn rebuild(manager: &SchemaManager<'_>, create: &str) -> Result<(), DbErr> {
    if manager.get_database_backend() != DbBackend::Sqlite {
        return Ok(());
    }
    execute_all(
        manager,
        &[
            "DROP TRIGGER IF EXISTS traces_fts_delete",
            "DROP TRIGGER IF EXISTS traces_fts_update",
            "DROP TABLE IF EXISTS traces_fts",
            create,
            "UPDATE traces_fts_mark SET last_rowid = 0",
            TRIGGERS[0],
            TRIGGERS[1],
        ],
    )
    .await
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        rebuild(
            manager,
            "CREATE VIRTUAL TABLE traces_fts USING fts5(search_text, content='traces', \
             content_rowid='rowid', tokenize='ascii', columnsize=0, detail=none)",
        )
        .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        rebuild(
            manager,
            "CREATE VIRTUAL TABLE traces_fts USING fts5(search_text, content='traces', content_rowid='rowid')",
        )
        .await
    }
}
