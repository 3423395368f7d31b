//! Console sessions on the server: a row per sign-in, which the signed cookie names; signing
//! out or revoking the API key it was made with deletes it, and every instance then refuses
//! the cookie. And the one-time view of a new API key's secret: sealed, read once, within
//! ten minutes, by the session that made it.

use sea_orm_migration::prelude::*;

use crate::cols::{id, index, string, string_null, timestamp};

#[derive(DeriveMigrationName)]
pub struct Migration;

const SESSIONS: &str = "console_sessions";
const REVEALS: &str = "console_reveals";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(SESSIONS)
                    .if_not_exists()
                    .col(id("id"))
                    .col(string("kind", 20))
                    .col(string_null("key_id", 64))
                    .col(string_null("user_id", 200))
                    .col(timestamp("created_at"))
                    .col(timestamp("expires_at"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(index("idx_console_sessions_key", SESSIONS, &["key_id"]))
            .await?;
        manager
            .create_index(index("idx_console_sessions_expires", SESSIONS, &["expires_at"]))
            .await?;
        manager
            .create_table(
                Table::create()
                    .table(REVEALS)
                    .if_not_exists()
                    .col(id("id"))
                    .col(string("session_id", 64))
                    .col(string("org_id", 64))
                    .col(ColumnDef::new("sealed").text().not_null())
                    .col(timestamp("created_at"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(index("idx_console_reveals_created", REVEALS, &["created_at"]))
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table(REVEALS).to_owned())
            .await?;
        manager.drop_table(Table::drop().table(SESSIONS).to_owned()).await
    }
}
