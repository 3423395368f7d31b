//! Actions whose queue an operator paused (a row while paused).

use sea_orm_migration::prelude::*;

use crate::cols::timestamp;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table("queue_pauses")
                    .col(ColumnDef::new("action").string_len(32).not_null().primary_key())
                    .col(timestamp("paused_at"))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table("queue_pauses").to_owned())
            .await
    }
}
