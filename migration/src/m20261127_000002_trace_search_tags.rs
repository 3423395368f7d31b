//! Traces as data (issue 44): each trace's searchable words and previews (written with it);
//! the words indexed (PostgreSQL: a generated `tsvector` with a GIN index; SQLite: an FTS5
//! table kept by triggers); tags and scores; a project's trace retention.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::{ConnectionTrait, DbBackend};

use crate::cols::{index, string, text_null, timestamp};

#[derive(DeriveMigrationName)]
pub struct Migration;

fn trace_fk(table: &'static str) -> ForeignKeyCreateStatement {
    ForeignKey::create()
        .name(format!("fk_{table}_trace"))
        .from(table, "trace_id")
        .to("traces", "id")
        .on_delete(ForeignKeyAction::Cascade)
        .to_owned()
}

const TRACE_COLUMNS: [&str; 3] = ["search_text", "preview_input", "preview_output"];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for column in TRACE_COLUMNS {
            manager
                .alter_table(
                    Table::alter()
                        .table("traces")
                        .add_column(text_null(column))
                        .to_owned(),
                )
                .await?;
        }
        let db = manager.get_connection();
        match manager.get_database_backend() {
            DbBackend::Postgres => {
                db.execute_unprepared(
                    "ALTER TABLE traces ADD COLUMN search tsvector \
                     GENERATED ALWAYS AS (to_tsvector('simple', coalesce(search_text, ''))) STORED",
                )
                .await?;
                db.execute_unprepared("CREATE INDEX idx_traces_search ON traces USING GIN (search)")
                    .await?;
            }
            _ => {
                db.execute_unprepared(
                    "CREATE VIRTUAL TABLE traces_fts USING fts5(search_text, content='traces', content_rowid='rowid')",
                )
                .await?;
                db.execute_unprepared(
                    "CREATE TRIGGER traces_fts_insert AFTER INSERT ON traces BEGIN \
                     INSERT INTO traces_fts(rowid, search_text) VALUES (new.rowid, new.search_text); END",
                )
                .await?;
                db.execute_unprepared(
                    "CREATE TRIGGER traces_fts_delete AFTER DELETE ON traces BEGIN \
                     INSERT INTO traces_fts(traces_fts, rowid, search_text) VALUES ('delete', old.rowid, old.search_text); END",
                )
                .await?;
            }
        }
        manager
            .create_table(
                Table::create()
                    .table("trace_tags")
                    .col(string("trace_id", 64))
                    .col(string("tag", 50))
                    .primary_key(Index::create().col("trace_id").col("tag"))
                    .foreign_key(&mut trace_fk("trace_tags"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(index("idx_trace_tags_tag", "trace_tags", &["tag", "trace_id"]))
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("trace_scores")
                    .col(string("trace_id", 64))
                    .col(string("name", 50))
                    .col(ColumnDef::new("value").double().not_null())
                    .col(text_null("comment"))
                    .col(timestamp("updated_at"))
                    .primary_key(Index::create().col("trace_id").col("name"))
                    .foreign_key(&mut trace_fk("trace_scores"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(index("idx_trace_scores_name", "trace_scores", &["name", "value"]))
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table("projects")
                    .add_column(ColumnDef::new("trace_retention_days").integer().null())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table("projects")
                    .drop_column("trace_retention_days")
                    .to_owned(),
            )
            .await?;
        for table in ["trace_scores", "trace_tags"] {
            manager
                .drop_table(Table::drop().table(table).if_exists().to_owned())
                .await?;
        }
        let db = manager.get_connection();
        match manager.get_database_backend() {
            DbBackend::Postgres => {
                db.execute_unprepared("DROP INDEX IF EXISTS idx_traces_search")
                    .await?;
                db.execute_unprepared("ALTER TABLE traces DROP COLUMN IF EXISTS search")
                    .await?;
            }
            _ => {
                crate::cols::execute_all(
                    manager,
                    &[
                        "DROP TRIGGER IF EXISTS traces_fts_insert",
                        "DROP TRIGGER IF EXISTS traces_fts_delete",
                        "DROP TABLE IF EXISTS traces_fts",
                    ],
                )
                .await?
            }
        }
        for column in TRACE_COLUMNS {
            manager
                .alter_table(Table::alter().table("traces").drop_column(column).to_owned())
                .await?;
        }
        Ok(())
    }
}
