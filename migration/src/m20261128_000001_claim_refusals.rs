//! A claim refused for want of funds gives its attempt back (issue 54): a job counts its
//! refusals apart from its attempts, and a history row is keyed by its place in the history
//! (`ordinal`) instead of its attempt number, so a refusal and the attempt handed after it
//! (both attempt 1, say) are two rows. Before this, refusals used attempts up, so every row's
//! attempt number was its place: the renamed column keeps its values and its key.

use sea_orm_migration::prelude::*;

use crate::cols::execute_all;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table("training_jobs")
                    .add_column(ColumnDef::new("refusals").integer().not_null().default(0))
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table("training_job_attempts")
                    .rename_column("attempt", "ordinal")
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table("training_job_attempts")
                    .add_column(ColumnDef::new("attempt").integer().not_null().default(0))
                    .to_owned(),
            )
            .await?;
        execute_all(manager, &["UPDATE training_job_attempts SET attempt = ordinal"]).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table("training_job_attempts")
                    .drop_column("attempt")
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table("training_job_attempts")
                    .rename_column("ordinal", "attempt")
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table("training_jobs")
                    .drop_column("refusals")
                    .to_owned(),
            )
            .await
    }
}
