//! Datasets (issue 60): a project's named selections of traces, each version frozen.
//! `datasets` (name unique in the project, its split and dedupe), `dataset_versions` (the
//! filter run, counts and digests), `dataset_lines` (a trace's training lines as first
//! taken into the dataset: what outlives the trace's retention), `dataset_items` (which
//! lines a version holds, in order, and their split); and a job's pinned dataset.

use sea_orm_migration::prelude::*;

use crate::cols::{index, project_fk, string, string_null, text_null, timestamp, unique_index};

#[derive(DeriveMigrationName)]
pub struct Migration;

fn dataset_fk(table: &'static str) -> ForeignKeyCreateStatement {
    ForeignKey::create()
        .name(format!("fk_{table}_dataset"))
        .from(table, "dataset_id")
        .to("datasets", "id")
        .on_delete(ForeignKeyAction::Cascade)
        .to_owned()
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table("datasets")
                    .col(crate::cols::id("id"))
                    .col(string("org_id", 64))
                    .col(string("project_id", 64))
                    .col(string("name", 200))
                    .col(text_null("description"))
                    // The share of each version's lines in validation (0 to 0.5), and the
                    // seed that, with a trace's id, puts it on one side.
                    .col(
                        ColumnDef::new("split_validation")
                            .double()
                            .not_null()
                            .default(0.0),
                    )
                    .col(ColumnDef::new("split_seed").big_integer().not_null().default(0))
                    .col(string("dedupe", 16))
                    .col(ColumnDef::new("latest_version").integer().not_null())
                    .col(timestamp("created_at"))
                    .col(timestamp("updated_at"))
                    .foreign_key(&mut project_fk("datasets"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(unique_index(
                "idx_datasets_project_name",
                "datasets",
                &["project_id", "name"],
            ))
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("dataset_versions")
                    .col(string("dataset_id", 64))
                    .col(ColumnDef::new("version").integer().not_null())
                    // The filter this version ran (JSON), if any.
                    .col(text_null("filter"))
                    .col(ColumnDef::new("train_lines").big_integer().not_null())
                    .col(ColumnDef::new("validation_lines").big_integer().not_null())
                    // Selected traces left out: not trainable, or a duplicate prompt.
                    .col(ColumnDef::new("skipped").big_integer().not_null())
                    // SHA-256 (hex) of each format's lines per split: {format: {split: hex}}.
                    .col(ColumnDef::new("digests").text().not_null())
                    .col(timestamp("created_at"))
                    .primary_key(Index::create().col("dataset_id").col("version"))
                    .foreign_key(&mut dataset_fk("dataset_versions"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("dataset_lines")
                    .col(string("dataset_id", 64))
                    .col(string("trace_id", 64))
                    // The project's: its lines go with it (not with the trace).
                    .col(string("project_id", 64))
                    .col(timestamp("trace_created_at"))
                    // SHA-256 (hex) of the request's messages (dedupe: "prompt").
                    .col(string("prompt_key", 64))
                    .col(ColumnDef::new("chat").text().not_null())
                    .col(ColumnDef::new("record").text().not_null())
                    .col(ColumnDef::new("prompt").text().not_null())
                    .primary_key(Index::create().col("dataset_id").col("trace_id"))
                    .foreign_key(&mut project_fk("dataset_lines"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("dataset_items")
                    .col(string("dataset_id", 64))
                    .col(ColumnDef::new("version").integer().not_null())
                    .col(ColumnDef::new("ordinal").integer().not_null())
                    .col(string("trace_id", 64))
                    .col(ColumnDef::new("validation").boolean().not_null())
                    .primary_key(Index::create().col("dataset_id").col("version").col("ordinal"))
                    .foreign_key(&mut dataset_fk("dataset_items"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(index(
                "idx_dataset_items_split",
                "dataset_items",
                &["dataset_id", "version", "validation", "ordinal"],
            ))
            .await?;
        // A job's pinned dataset version: its id (the dataset's jobs) and its view as pinned.
        manager
            .alter_table(
                Table::alter()
                    .table("training_jobs")
                    .add_column(string_null("dataset_id", 64))
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table("training_jobs")
                    .add_column(text_null("dataset"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(index(
                "idx_training_jobs_dataset",
                "training_jobs",
                &["dataset_id"],
            ))
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(
                Index::drop()
                    .name("idx_training_jobs_dataset")
                    .table("training_jobs")
                    .to_owned(),
            )
            .await?;
        for column in ["dataset", "dataset_id"] {
            manager
                .alter_table(
                    Table::alter()
                        .table("training_jobs")
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        for table in ["dataset_items", "dataset_lines", "dataset_versions", "datasets"] {
            manager
                .drop_table(Table::drop().table(table).if_exists().to_owned())
                .await?;
        }
        Ok(())
    }
}
