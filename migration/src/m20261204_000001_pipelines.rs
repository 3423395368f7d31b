//! Pipelines (issue 62): `training_job_dependencies` (one row per edge: a job and a job it
//! waits for, both of one organization, gone with either), a job's mark that others wait for
//! it (`has_dependents`: a report of a job without one stays one statement), and the unique
//! key held by `waiting` jobs too (a job waiting for its dependencies is open).

use sea_orm_migration::prelude::*;

use crate::cols::{boolean, index, string, timestamp};

#[derive(DeriveMigrationName)]
pub struct Migration;

const JOBS: &str = "training_jobs";
const EDGES: &str = "training_job_dependencies";
const UNIQUE_KEY: &str = "uq_training_jobs_unique_key";

fn job_fk(column: &'static str) -> ForeignKeyCreateStatement {
    ForeignKey::create()
        .name(format!("fk_{EDGES}_{column}"))
        .from(EDGES, column)
        .to(JOBS, "id")
        .on_delete(ForeignKeyAction::Cascade)
        .to_owned()
}

fn unique_key(statuses: &[&'static str]) -> IndexCreateStatement {
    index(UNIQUE_KEY, JOBS, &["org_id", "unique_key"])
        .unique()
        .and_where(Expr::col("unique_key").is_not_null())
        .and_where(Expr::col("status").is_in(statuses.iter().copied()))
        .to_owned()
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(EDGES)
                    .if_not_exists()
                    .col(string("job_id", 64))
                    .col(string("depends_on_id", 64))
                    .col(timestamp("created_at"))
                    .primary_key(Index::create().col("job_id").col("depends_on_id"))
                    .foreign_key(&mut job_fk("job_id"))
                    .foreign_key(&mut job_fk("depends_on_id"))
                    .to_owned(),
            )
            .await?;
        // A job's dependents, read when it ends (and by a delete's cascade).
        manager
            .create_index(index(
                "idx_training_job_dependencies_depends_on",
                EDGES,
                &["depends_on_id", "job_id"],
            ))
            .await?;
        if !manager.has_column(JOBS, "has_dependents").await? {
            manager
                .alter_table(
                    Table::alter()
                        .table(JOBS)
                        .add_column(boolean("has_dependents", false))
                        .to_owned(),
                )
                .await?;
        }
        manager
            .drop_index(Index::drop().name(UNIQUE_KEY).table(JOBS).if_exists().to_owned())
            .await?;
        manager
            .create_index(unique_key(&[
                "queued",
                "scheduled",
                "running",
                "stopping",
                "waiting",
            ]))
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(Index::drop().name(UNIQUE_KEY).table(JOBS).if_exists().to_owned())
            .await?;
        manager
            .create_index(unique_key(&["queued", "scheduled", "running", "stopping"]))
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(JOBS)
                    .drop_column("has_dependents")
                    .to_owned(),
            )
            .await?;
        manager
            .drop_table(Table::drop().table(EDGES).if_exists().to_owned())
            .await
    }
}
