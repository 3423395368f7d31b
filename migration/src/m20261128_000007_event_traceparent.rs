//! The trace of the request that caused an outbound event (issue 57): its deliveries continue
//! it (W3C `traceparent`, kept only while keel exports its spans).

use sea_orm_migration::prelude::*;

use crate::cols::text_null;

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table("outbound_events")
                    .add_column(text_null("traceparent"))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table("outbound_events")
                    .drop_column("traceparent")
                    .to_owned(),
            )
            .await
    }
}
