//! The queue's second round: every attempt of a job kept (`training_job_attempts`), the
//! time a job last became claimable (`queued_at`, for the wait metric), submits made
//! idempotent (`idempotency_key` and the body's hash, unique per organization) and unique
//! while open (`unique_key`, unique per organization among non-terminal jobs), jobs blocked
//! at their claim for want of funds marked (`blocked_for_funds`), and fair shares: an
//! operator's weight and cap per organization (`queue_org_settings`) and each organization's
//! place in an action's turn order (`queue_shares`).

use sea_orm_migration::prelude::*;

use crate::cols::{boolean, index, org_fk, string, string_null, text_null, timestamp, timestamp_null};

#[derive(DeriveMigrationName)]
pub struct Migration;

const JOBS: &str = "training_jobs";
const UNIQUE_KEY: &str = "uq_training_jobs_unique_key";
const IDEMPOTENCY: &str = "uq_training_jobs_idempotency";
const BLOCKED_FOR_FUNDS: &str = "idx_training_jobs_blocked_for_funds";
const WAITING: &str = "idx_training_jobs_waiting";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // One column a statement: SQLite alters one thing at a time.
        for column in [
            timestamp_null("queued_at"),
            string_null("unique_key", 200),
            string_null("idempotency_key", 255),
            string_null("request_hash", 64),
            boolean("blocked_for_funds", false),
        ] {
            manager
                .alter_table(Table::alter().table(JOBS).add_column(column).to_owned())
                .await?;
        }
        // A job queued before this migration was claimable from its creation.
        manager
            .get_connection()
            .execute_unprepared("UPDATE training_jobs SET queued_at = created_at WHERE status = 'queued'")
            .await?;
        // At most one open job per organization and unique key: the database decides
        // between two instances creating the same one at once.
        manager
            .create_index(
                index(UNIQUE_KEY, JOBS, &["org_id", "unique_key"])
                    .unique()
                    .and_where(Expr::col("unique_key").is_not_null())
                    .and_where(Expr::col("status").is_in(["queued", "scheduled", "running", "stopping"]))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                index(IDEMPOTENCY, JOBS, &["org_id", "idempotency_key"])
                    .unique()
                    .and_where(Expr::col("idempotency_key").is_not_null())
                    .to_owned(),
            )
            .await?;
        // The longest-waiting queued jobs (the oldest-queued gauge reads it per action, from
        // the front). Not led by `action`: with a young table's statistics PostgreSQL took an
        // `(action, queued_at)` index for claims, read every queued job of the action and
        // sorted them, each claim.
        manager
            .create_index(
                index(WAITING, JOBS, &["queued_at"])
                    .and_where(Expr::col("status").eq("queued"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                index(BLOCKED_FOR_FUNDS, JOBS, &["org_id"])
                    .and_where(Expr::col("status").eq("blocked"))
                    .and_where(Expr::col("blocked_for_funds").eq(true))
                    .to_owned(),
            )
            .await?;
        // No foreign key to the job: its check per row made a report batch's history
        // insert ten times slower (26 ms for 500 rows against 2.4 on PostgreSQL). Deleting
        // an organization deletes its jobs' attempts in the same transaction instead.
        manager
            .create_table(
                Table::create()
                    .table("training_job_attempts")
                    .col(string("job_id", 64))
                    .col(ColumnDef::new("attempt").integer().not_null())
                    .col(string_null("worker_id", 200))
                    .col(timestamp_null("claimed_at"))
                    .col(timestamp("ended_at"))
                    .col(string("outcome", 32))
                    .col(text_null("error"))
                    .primary_key(Index::create().col("job_id").col("attempt"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("queue_org_settings")
                    .col(ColumnDef::new("org_id").string_len(64).not_null().primary_key())
                    .col(ColumnDef::new("weight").integer().not_null().default(1))
                    .col(ColumnDef::new("max_running").integer().null())
                    .col(timestamp("updated_at"))
                    .foreign_key(&mut org_fk("queue_org_settings"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("queue_shares")
                    .col(string("action", 32))
                    .col(string("org_id", 64))
                    .col(ColumnDef::new("pass").double().not_null())
                    .primary_key(Index::create().col("action").col("org_id"))
                    .foreign_key(&mut org_fk("queue_shares"))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in ["queue_shares", "queue_org_settings", "training_job_attempts"] {
            manager.drop_table(Table::drop().table(table).to_owned()).await?;
        }
        for name in [BLOCKED_FOR_FUNDS, WAITING, IDEMPOTENCY, UNIQUE_KEY] {
            manager
                .drop_index(Index::drop().name(name).table(JOBS).to_owned())
                .await?;
        }
        for column in [
            "blocked_for_funds",
            "request_hash",
            "idempotency_key",
            "unique_key",
            "queued_at",
        ] {
            manager
                .alter_table(Table::alter().table(JOBS).drop_column(column).to_owned())
                .await?;
        }
        Ok(())
    }
}
