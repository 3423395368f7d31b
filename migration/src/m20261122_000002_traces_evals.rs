//! Recorded chat completions (traces) and eval runs with their cases.

use sea_orm_migration::prelude::*;

use crate::cols::{
    boolean, id, index, org_fk, project_fk, string, string_null, text_null, timestamp, timestamp_null,
};

#[derive(DeriveMigrationName)]
pub struct Migration;

fn int_null(name: &'static str) -> ColumnDef {
    ColumnDef::new(name).big_integer().null().to_owned()
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table("traces")
                    .col(id("id"))
                    .col(string("org_id", 64))
                    .col(string("project_id", 64))
                    .col(string("provider", 16))
                    .col(string_null("model", 200))
                    .col(ColumnDef::new("request").text().not_null())
                    .col(text_null("response"))
                    .col(ColumnDef::new("status_code").integer().not_null())
                    .col(boolean("stream", false))
                    .col(boolean("complete", true))
                    .col(ColumnDef::new("latency_ms").big_integer().not_null())
                    .col(int_null("ttfb_ms"))
                    .col(int_null("prompt_tokens"))
                    .col(int_null("completion_tokens"))
                    .col(int_null("total_tokens"))
                    .col(text_null("error"))
                    .col(timestamp("created_at"))
                    .foreign_key(&mut org_fk("traces"))
                    .foreign_key(&mut project_fk("traces"))
                    .to_owned(),
            )
            .await?;
        // Export reads a project's newest traces.
        manager
            .create_index(index(
                "idx_traces_project_created",
                "traces",
                &["project_id", "created_at"],
            ))
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("eval_runs")
                    .col(id("id"))
                    .col(string("org_id", 64))
                    .col(string("project_id", 64))
                    .col(string("suite_name", 200))
                    .col(string("environment_reference", 512))
                    .col(string_null("model", 200))
                    .col(string("status", 16))
                    .col(text_null("error"))
                    .col(timestamp_null("started_at"))
                    .col(text_null("metadata"))
                    .col(ColumnDef::new("total_cases").integer().not_null())
                    .col(ColumnDef::new("passed_cases").integer().not_null())
                    .col(ColumnDef::new("graded_cases").integer().not_null())
                    .col(ColumnDef::new("errored_cases").integer().not_null())
                    .col(ColumnDef::new("mean_score").double().null())
                    .col(timestamp("created_at"))
                    .foreign_key(&mut org_fk("eval_runs"))
                    .foreign_key(&mut project_fk("eval_runs"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("eval_cases")
                    .col(string("eval_run_id", 64))
                    .col(ColumnDef::new("position").integer().not_null())
                    .col(string_null("case_id", 200))
                    .col(text_null("input"))
                    .col(text_null("expected"))
                    .col(text_null("actual"))
                    .col(ColumnDef::new("score").double().null())
                    .col(ColumnDef::new("success").boolean().null())
                    .col(text_null("reason"))
                    .col(text_null("error"))
                    .col(text_null("metrics"))
                    .col(int_null("latency_ms"))
                    .col(int_null("total_tokens"))
                    .primary_key(Index::create().col("eval_run_id").col("position"))
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_eval_cases_run")
                            .from("eval_cases", "eval_run_id")
                            .to("eval_runs", "id")
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in ["eval_cases", "eval_runs", "traces"] {
            manager
                .drop_table(Table::drop().table(table).if_exists().to_owned())
                .await?;
        }
        Ok(())
    }
}
