//! Indexes for the console's paged reads: the ledger filtered by kind, an organization's
//! eval runs and a project's runs, newest first.

use sea_orm_migration::prelude::*;

use crate::cols::index;

#[derive(DeriveMigrationName)]
pub struct Migration;

const INDEXES: &[(&str, &str, &[&str])] = &[
    (
        "idx_ledger_org_kind_id",
        "ledger_entries",
        &["org_id", "kind", "id"],
    ),
    (
        "idx_eval_runs_org_created",
        "eval_runs",
        &["org_id", "created_at"],
    ),
    ("idx_runs_project_created", "runs", &["project_id", "created_at"]),
];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for (name, table, columns) in INDEXES {
            manager.create_index(index(name, table, columns)).await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for (name, table, _) in INDEXES {
            manager
                .drop_index(Index::drop().name(*name).table(*table).to_owned())
                .await?;
        }
        Ok(())
    }
}
