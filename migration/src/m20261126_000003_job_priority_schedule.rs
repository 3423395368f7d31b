//! A job's priority (0 first) and the time a scheduled job becomes due. The claim index
//! orders an organization's queued jobs by priority, then age; scheduled jobs have a
//! partial index of their own, read by the promoter that queues them when due.

use sea_orm_migration::prelude::*;

use crate::cols::{index, timestamp_null};

#[derive(DeriveMigrationName)]
pub struct Migration;

const TABLE: &str = "training_jobs";
const CLAIM: &str = "idx_training_jobs_claim";
const SCHEDULED: &str = "idx_training_jobs_scheduled";

async fn drop(manager: &SchemaManager<'_>, name: &'static str) -> Result<(), DbErr> {
    manager
        .drop_index(Index::drop().name(name).table(TABLE).to_owned())
        .await
}

async fn claim_index(manager: &SchemaManager<'_>, columns: &[&'static str]) -> Result<(), DbErr> {
    manager
        .create_index(
            index(CLAIM, TABLE, columns)
                .and_where(Expr::col("status").eq("queued"))
                .to_owned(),
        )
        .await
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // One column a statement: SQLite alters one thing at a time.
        manager
            .alter_table(
                Table::alter()
                    .table(TABLE)
                    .add_column(ColumnDef::new("priority").integer().not_null().default(5))
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(TABLE)
                    .add_column(timestamp_null("scheduled_at"))
                    .to_owned(),
            )
            .await?;
        drop(manager, CLAIM).await?;
        claim_index(manager, &["action", "org_id", "priority", "created_at", "id"]).await?;
        manager
            .create_index(
                index(SCHEDULED, TABLE, &["scheduled_at"])
                    .and_where(Expr::col("status").eq("scheduled"))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        drop(manager, SCHEDULED).await?;
        drop(manager, CLAIM).await?;
        claim_index(manager, &["action", "org_id", "created_at", "id"]).await?;
        for column in ["scheduled_at", "priority"] {
            manager
                .alter_table(Table::alter().table(TABLE).drop_column(column).to_owned())
                .await?;
        }
        Ok(())
    }
}
