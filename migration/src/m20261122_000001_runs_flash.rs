//! Runs and their checkpoints, and the control plane's mirrors: flash environments, their
//! uses, managed runs and checkpoints, product events, and hub provisioning backoff.

use sea_orm_migration::prelude::*;

use crate::cols::{
    id, index, org_fk, project_fk, string, string_null, text_null, timestamp, timestamp_null, unique_index,
};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table("runs")
                    .col(id("id"))
                    .col(string("org_id", 64))
                    .col(string("project_id", 64))
                    .col(string_null("name", 200))
                    .col(string_null("model", 200))
                    .col(string_null("environment_slug", 512))
                    .col(text_null("config"))
                    .col(string("status", 64))
                    .col(text_null("summary"))
                    .col(text_null("metrics"))
                    .col(text_null("error"))
                    .col(string_null("tracker_entity", 200))
                    .col(string_null("tracker_project", 200))
                    .col(string_null("tracker_run_id", 200))
                    .col(string_null("tracker_url", 2048))
                    .col(timestamp("created_at"))
                    .col(timestamp("updated_at"))
                    .foreign_key(&mut org_fk("runs"))
                    .foreign_key(&mut project_fk("runs"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(index(
                "idx_runs_tracker",
                "runs",
                &["org_id", "tracker_entity", "tracker_project"],
            ))
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("run_checkpoints")
                    .col(string("org_id", 64))
                    .col(string("run_id", 300))
                    .col(ColumnDef::new("step").big_integer().not_null())
                    .col(string("project_id", 64))
                    .col(string("subfolder", 300))
                    .col(timestamp("created_at"))
                    .col(timestamp("updated_at"))
                    .primary_key(Index::create().col("org_id").col("run_id").col("step"))
                    .foreign_key(&mut org_fk("run_checkpoints"))
                    .foreign_key(&mut project_fk("run_checkpoints"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("flash_environments")
                    .col(id("id"))
                    .col(string("org_id", 64))
                    .col(string("project_id", 64))
                    .col(string("slug", 512))
                    .col(string("name", 120))
                    .col(string("hub_repo", 512))
                    .col(string("hub_ref", 512))
                    .col(ColumnDef::new("hub_path").text().not_null())
                    .col(string_null("package_sha256", 64))
                    .col(string_null("published_by_user_id", 200))
                    .col(string_null("api_key_id", 200))
                    .col(text_null("metadata"))
                    .col(string("hub_status", 16))
                    .col(ColumnDef::new("hub_attempts").integer().not_null().default(0))
                    .col(text_null("hub_error"))
                    .col(timestamp_null("hub_lease_until"))
                    .col(timestamp_null("hub_provisioned_at"))
                    .col(timestamp("created_at"))
                    .col(timestamp("updated_at"))
                    .foreign_key(&mut org_fk("flash_environments"))
                    .foreign_key(&mut project_fk("flash_environments"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(unique_index(
                "uq_flash_environments_slug",
                "flash_environments",
                &["slug"],
            ))
            .await?;
        // Hub provisioning scans pending environments per organization, oldest first.
        manager
            .create_index(index(
                "idx_flash_environments_hub",
                "flash_environments",
                &["hub_status", "org_id", "created_at"],
            ))
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("flash_environment_uses")
                    .col(id("id"))
                    .col(string("org_id", 64))
                    .col(string("project_id", 64))
                    .col(string("slug", 512))
                    .col(string_null("run_id", 128))
                    .col(timestamp("created_at"))
                    .foreign_key(&mut org_fk("flash_environment_uses"))
                    .foreign_key(&mut project_fk("flash_environment_uses"))
                    .to_owned(),
            )
            .await?;
        // A run's reference to a slug is recorded once (NULL run ids are distinct).
        manager
            .create_index(unique_index(
                "uq_flash_environment_uses_run",
                "flash_environment_uses",
                &["project_id", "slug", "run_id"],
            ))
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("flash_runs")
                    .col(string("org_id", 64))
                    .col(string("run_id", 128))
                    .col(string("project_id", 64))
                    .col(string("status", 64))
                    .col(ColumnDef::new("data").text().not_null())
                    .col(string_null("source_updated_at", 64))
                    .col(timestamp("created_at"))
                    .col(timestamp("updated_at"))
                    .primary_key(Index::create().col("org_id").col("run_id"))
                    .foreign_key(&mut org_fk("flash_runs"))
                    .foreign_key(&mut project_fk("flash_runs"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("flash_checkpoints")
                    .col(string("org_id", 64))
                    .col(string("run_id", 128))
                    .col(string("checkpoint_id", 256))
                    .col(string("project_id", 64))
                    .col(ColumnDef::new("data").text().not_null())
                    .col(string_null("source_updated_at", 64))
                    .col(timestamp("created_at"))
                    .col(timestamp("updated_at"))
                    .primary_key(Index::create().col("org_id").col("run_id").col("checkpoint_id"))
                    .foreign_key(&mut org_fk("flash_checkpoints"))
                    .foreign_key(&mut project_fk("flash_checkpoints"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("product_events")
                    .col(id("id"))
                    .col(string("org_id", 64))
                    .col(string("event", 64))
                    .col(string_null("user_id", 200))
                    .col(text_null("properties"))
                    .col(timestamp("created_at"))
                    .foreign_key(&mut org_fk("product_events"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(index(
                "idx_product_events_org_created",
                "product_events",
                &["org_id", "created_at"],
            ))
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("hub_backoff")
                    .col(string("org_id", 64).primary_key().to_owned())
                    .col(ColumnDef::new("failures").integer().not_null().default(0))
                    .col(timestamp("next_attempt_at"))
                    .col(text_null("last_error"))
                    .col(timestamp("updated_at"))
                    .foreign_key(&mut org_fk("hub_backoff"))
                    .to_owned(),
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in [
            "hub_backoff",
            "product_events",
            "flash_checkpoints",
            "flash_runs",
            "flash_environment_uses",
            "flash_environments",
            "run_checkpoints",
            "runs",
        ] {
            manager
                .drop_table(Table::drop().table(table).if_exists().to_owned())
                .await?;
        }
        Ok(())
    }
}
