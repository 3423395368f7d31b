//! Recorded calls pushed to an OTLP/HTTP endpoint (issue 58): a project's destination
//! (`otlp_exports`: the `/v1/traces` URL, its headers sealed, the last answer and a backoff),
//! and the outbox of traces still to push (`otlp_outbox`), written in the trace writer's
//! transaction.

use sea_orm_migration::prelude::*;

use crate::cols::{index, project_fk, string, text_null, timestamp, timestamp_null};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table("otlp_exports")
                    .col(
                        ColumnDef::new("project_id")
                            .string_len(64)
                            .not_null()
                            .primary_key(),
                    )
                    .col(string("org_id", 64))
                    // The URL spans are posted to (the endpoint given, with /v1/traces).
                    .col(ColumnDef::new("url").text().not_null())
                    // The headers' names as a JSON list (what views show), and the headers
                    // themselves as JSON, sealed like training secrets (never shown).
                    .col(ColumnDef::new("header_names").text().not_null())
                    .col(text_null("headers_sealed"))
                    // Failed pushes in a row, and when the next may go (none: now).
                    .col(ColumnDef::new("failures").integer().not_null().default(0))
                    .col(timestamp_null("retry_at"))
                    .col(text_null("last_error"))
                    .col(timestamp_null("last_error_at"))
                    .col(timestamp_null("last_exported_at"))
                    .col(timestamp("created_at"))
                    .col(timestamp("updated_at"))
                    .foreign_key(&mut project_fk("otlp_exports"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("otlp_outbox")
                    .col(ColumnDef::new("trace_id").string_len(64).not_null().primary_key())
                    .col(string("project_id", 64))
                    .col(timestamp("created_at"))
                    // While an exporter sends it: until when (then another may).
                    .col(timestamp_null("leased_until"))
                    .foreign_key(&mut project_fk("otlp_outbox"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(index(
                "idx_otlp_outbox_project",
                "otlp_outbox",
                &["project_id", "created_at"],
            ))
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in ["otlp_outbox", "otlp_exports"] {
            manager
                .drop_table(Table::drop().table(table).if_exists().to_owned())
                .await?;
        }
        Ok(())
    }
}
