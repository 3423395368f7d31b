//! The operator's queue pages: failed jobs across organizations, newest first (a partial
//! index: only failed rows are in it, so the queue's hot updates do not maintain it), and
//! attempts by the time they ended (throughput over the last 24 hours).

use sea_orm_migration::prelude::*;

use crate::cols::index;

#[derive(DeriveMigrationName)]
pub struct Migration;

const FAILED: &str = "idx_training_jobs_failed";
const ENDED: &str = "idx_training_job_attempts_ended";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_index(
                index(FAILED, "training_jobs", &["finished_at"])
                    .and_where(Expr::col("status").eq("failed"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(index(ENDED, "training_job_attempts", &["ended_at"]))
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(
                Index::drop()
                    .name(ENDED)
                    .table("training_job_attempts")
                    .to_owned(),
            )
            .await?;
        manager
            .drop_index(Index::drop().name(FAILED).table("training_jobs").to_owned())
            .await
    }
}
