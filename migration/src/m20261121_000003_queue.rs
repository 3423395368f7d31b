//! The training-job queue, organization secrets, agent logs, usage and timelines.

use sea_orm_migration::prelude::*;

use crate::cols::{
    boolean, id, index, org_fk, project_fk, string, string_null, text_null, timestamp, timestamp_null,
};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table("training_jobs")
                    .col(id("id"))
                    .col(string("org_id", 64))
                    .col(string("project_id", 64))
                    .col(string_null("training_task_id", 100))
                    .col(string("action", 16))
                    .col(string("status", 16))
                    .col(ColumnDef::new("payload").text().not_null())
                    .col(string_null("worker_id", 200))
                    .col(ColumnDef::new("attempts").integer().not_null().default(0))
                    .col(boolean("stop_requested", false))
                    .col(text_null("live_status"))
                    .col(text_null("result"))
                    .col(text_null("error"))
                    .col(timestamp("created_at"))
                    .col(timestamp("updated_at"))
                    .col(timestamp_null("claimed_at"))
                    .col(timestamp_null("heartbeat_at"))
                    .col(timestamp_null("finished_at"))
                    .foreign_key(&mut org_fk("training_jobs"))
                    .foreign_key(&mut project_fk("training_jobs"))
                    .to_owned(),
            )
            .await?;
        // Claims rank queued jobs of one action per organization, oldest first.
        manager
            .create_index(index(
                "idx_training_jobs_claim",
                "training_jobs",
                &["action", "status", "org_id", "created_at"],
            ))
            .await?;
        // Sweeps scan running jobs by heartbeat; requeue-interrupted by worker.
        manager
            .create_index(index(
                "idx_training_jobs_status_heartbeat",
                "training_jobs",
                &["status", "heartbeat_at"],
            ))
            .await?;
        manager
            .create_index(index(
                "idx_training_jobs_worker",
                "training_jobs",
                &["worker_id", "status"],
            ))
            .await?;
        manager
            .create_index(index(
                "idx_training_jobs_org_created",
                "training_jobs",
                &["org_id", "created_at"],
            ))
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("org_secrets")
                    .col(string("org_id", 64))
                    .col(string("name", 200))
                    .col(ColumnDef::new("sealed").text().not_null())
                    .col(timestamp("updated_at"))
                    .primary_key(Index::create().col("org_id").col("name"))
                    .foreign_key(&mut org_fk("org_secrets"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("agent_logs")
                    .col(id("id"))
                    .col(string("org_id", 64))
                    .col(string_null("job_id", 64))
                    .col(ColumnDef::new("content").text().not_null())
                    .col(string("source", 16))
                    .col(timestamp("created_at"))
                    .foreign_key(&mut org_fk("agent_logs"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(index(
                "idx_agent_logs_org_created",
                "agent_logs",
                &["org_id", "created_at"],
            ))
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("agent_usage")
                    .col(string("account_label", 200).primary_key().to_owned())
                    .col(ColumnDef::new("report").text().not_null())
                    .col(timestamp("updated_at"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("optimizer_timelines")
                    .col(string("org_id", 64))
                    .col(string("timeline_id", 200))
                    .col(string_null("job_id", 64))
                    .col(ColumnDef::new("events").text().not_null())
                    .col(timestamp("updated_at"))
                    .primary_key(Index::create().col("org_id").col("timeline_id"))
                    .foreign_key(&mut org_fk("optimizer_timelines"))
                    .to_owned(),
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in [
            "optimizer_timelines",
            "agent_usage",
            "agent_logs",
            "org_secrets",
            "training_jobs",
        ] {
            manager
                .drop_table(Table::drop().table(table).if_exists().to_owned())
                .await?;
        }
        Ok(())
    }
}
