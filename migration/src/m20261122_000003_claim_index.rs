//! The claim index also carries the job id: claims rank queued jobs by
//! (organization, created_at, id) from the index alone, without sorting.

use sea_orm_migration::prelude::*;

use crate::cols::index;

#[derive(DeriveMigrationName)]
pub struct Migration;

const NAME: &str = "idx_training_jobs_claim";

async fn replace(manager: &SchemaManager<'_>, columns: &[&'static str]) -> Result<(), DbErr> {
    manager
        // IF EXISTS: a SQLite database that an earlier keel migrated over several connections
        // lost the index here before the migration failed (it is run again whole).
        .drop_index(
            Index::drop()
                .name(NAME)
                .table("training_jobs")
                .if_exists()
                .to_owned(),
        )
        .await?;
    manager.create_index(index(NAME, "training_jobs", columns)).await
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        replace(manager, &["action", "status", "org_id", "created_at", "id"]).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        replace(manager, &["action", "status", "org_id", "created_at"]).await
    }
}
