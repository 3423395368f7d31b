//! A streamed call whose provider sent no usage has its tokens estimated from the text;
//! `usage_estimated` says so.

use sea_orm_migration::prelude::*;

use crate::cols::boolean;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table("traces")
                    .add_column(boolean("usage_estimated", false))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table("traces")
                    .drop_column("usage_estimated")
                    .to_owned(),
            )
            .await
    }
}
