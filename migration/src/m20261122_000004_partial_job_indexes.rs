//! Job indexes hold only the jobs they serve: the claim index only queued jobs, the
//! heartbeat and worker indexes only held (running or stopping) ones. A job's status
//! changes twice in its life; with full indexes each change wrote an entry into every
//! index, now a finished job is no longer in any of them but the primary key and the
//! organization's list.

use sea_orm_migration::prelude::*;

use crate::cols::index;

#[derive(DeriveMigrationName)]
pub struct Migration;

const TABLE: &str = "training_jobs";
const CLAIM: &str = "idx_training_jobs_claim";
const HEARTBEAT: &str = "idx_training_jobs_status_heartbeat";
const WORKER: &str = "idx_training_jobs_worker";

/// Held jobs, spelled as the queries spell it (SQLite matches a partial index's
/// condition term by term).
fn held() -> SimpleExpr {
    Expr::col("status").is_in(["running", "stopping"])
}

async fn drop(manager: &SchemaManager<'_>, name: &'static str) -> Result<(), DbErr> {
    manager
        .drop_index(Index::drop().name(name).table(TABLE).if_exists().to_owned())
        .await
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for name in [CLAIM, HEARTBEAT, WORKER] {
            drop(manager, name).await?;
        }
        manager
            .create_index(
                index(CLAIM, TABLE, &["action", "org_id", "created_at", "id"])
                    .and_where(Expr::col("status").eq("queued"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                index(HEARTBEAT, TABLE, &["status", "heartbeat_at"])
                    .and_where(held())
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                index(WORKER, TABLE, &["worker_id", "status"])
                    .and_where(held())
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for name in [CLAIM, HEARTBEAT, WORKER] {
            drop(manager, name).await?;
        }
        manager
            .create_index(index(
                CLAIM,
                TABLE,
                &["action", "status", "org_id", "created_at", "id"],
            ))
            .await?;
        manager
            .create_index(index(HEARTBEAT, TABLE, &["status", "heartbeat_at"]))
            .await?;
        manager
            .create_index(index(WORKER, TABLE, &["worker_id", "status"]))
            .await
    }
}
