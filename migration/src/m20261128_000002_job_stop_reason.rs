//! A user's reason for stopping a job, kept apart from the worker's report (issue 54): a
//! running job's stop used to lose it when its worker reported.

use sea_orm_migration::prelude::*;

use crate::cols::text_null;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table("training_jobs")
                    .add_column(text_null("stop_reason"))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table("training_jobs")
                    .drop_column("stop_reason")
                    .to_owned(),
            )
            .await
    }
}
