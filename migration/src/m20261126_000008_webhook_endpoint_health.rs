//! Endpoints that only fail are disabled (issue 41): since when an endpoint's deliveries have
//! all failed (cleared by a success), when it was disabled; and the console's events (what
//! keel did on its own that an organization should see, such as disabling an endpoint).

use sea_orm_migration::prelude::*;

use crate::cols::{id, index, org_fk, string, timestamp, timestamp_null};

#[derive(DeriveMigrationName)]
pub struct Migration;

const EVENTS_BY_ORG: &str = "idx_console_events_org";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for column in ["failing_since", "disabled_at"] {
            manager
                .alter_table(
                    Table::alter()
                        .table("webhook_endpoints")
                        .add_column(timestamp_null(column))
                        .to_owned(),
                )
                .await?;
        }
        manager
            .create_table(
                Table::create()
                    .table("console_events")
                    .col(id("id"))
                    .col(string("org_id", 64))
                    .col(string("kind", 100))
                    .col(ColumnDef::new("message").text().not_null())
                    .col(timestamp("created_at"))
                    .foreign_key(&mut org_fk("console_events"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(index(EVENTS_BY_ORG, "console_events", &["org_id", "created_at"]))
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_table(Table::drop().table("console_events").to_owned())
            .await?;
        for column in ["failing_since", "disabled_at"] {
            manager
                .alter_table(
                    Table::alter()
                        .table("webhook_endpoints")
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}
