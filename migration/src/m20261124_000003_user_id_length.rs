//! A user id is as long as the API lets it be (200 characters, like `memberships.user_id`);
//! `users.id` was 64 on PostgreSQL, so a longer owner id failed at the database. SQLite does
//! not enforce lengths.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::DatabaseBackend;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        set_user_id_length(manager, 200).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        set_user_id_length(manager, 64).await
    }
}

/// `users.id` as a `varchar(len)`, on PostgreSQL only.
async fn set_user_id_length(manager: &SchemaManager<'_>, len: u32) -> Result<(), DbErr> {
    if manager.get_database_backend() != DatabaseBackend::Postgres {
        return Ok(());
    }
    manager
        .alter_table(
            Table::alter()
                .table("users")
                .modify_column(ColumnDef::new("id").string_len(len).not_null())
                .to_owned(),
        )
        .await
}
