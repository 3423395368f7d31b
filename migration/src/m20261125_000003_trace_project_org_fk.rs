//! PostgreSQL: a trace's project and organization checked by one foreign key,
//! `(project_id, org_id)` to the project's `(id, org_id)`, instead of one to the
//! organization and one to the project. Every inserted row runs one referential check
//! (a locking lookup) per foreign key: two of them were about two fifths of PostgreSQL's
//! CPU per trace written (docs/BENCHMARKS.md). One check keeps what the two kept (the
//! project exists; an organization's deletion removes its traces, through its projects)
//! and also holds a trace's organization to its project's. SQLite keeps the two keys: its
//! checks cost little, and it cannot change a table's keys without rebuilding the table.

use sea_orm_migration::prelude::*;

use crate::cols::{org_fk, project_fk, unique_index};

#[derive(DeriveMigrationName)]
pub struct Migration;

const PROJECT_ORG: &str = "fk_traces_project_org";
const PROJECT_ID_ORG: &str = "uq_projects_id_org";

fn project_org_fk() -> ForeignKeyCreateStatement {
    ForeignKey::create()
        .name(PROJECT_ORG)
        .from("traces", ("project_id", "org_id"))
        .to("projects", ("id", "org_id"))
        .on_delete(ForeignKeyAction::Cascade)
        .to_owned()
}

fn drop_fk(name: &str) -> ForeignKeyDropStatement {
    ForeignKey::drop().name(name).table("traces").to_owned()
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != sea_orm::DbBackend::Postgres {
            return Ok(());
        }
        // A foreign key's target must be unique as a whole.
        manager
            .create_index(unique_index(PROJECT_ID_ORG, "projects", &["id", "org_id"]))
            .await?;
        manager.create_foreign_key(project_org_fk()).await?;
        manager.drop_foreign_key(drop_fk("fk_traces_org")).await?;
        manager.drop_foreign_key(drop_fk("fk_traces_project")).await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        if manager.get_database_backend() != sea_orm::DbBackend::Postgres {
            return Ok(());
        }
        manager.create_foreign_key(org_fk("traces")).await?;
        manager.create_foreign_key(project_fk("traces")).await?;
        manager.drop_foreign_key(drop_fk(PROJECT_ORG)).await?;
        manager
            .drop_index(Index::drop().name(PROJECT_ID_ORG).table("projects").to_owned())
            .await
    }
}
