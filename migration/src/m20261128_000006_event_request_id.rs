//! The request that caused an outbound event (issue 57): its id, which a failed delivery's log
//! line names, and its W3C `traceparent` (kept while keel exports its spans), which each
//! delivery's span continues and the receiver gets.

use sea_orm_migration::prelude::*;

use crate::cols::text_null;

#[derive(DeriveMigrationName)]
pub struct Migration;

/// The columns added, one statement each (SQLite alters one column at a time).
const COLUMNS: [&str; 2] = ["request_id", "traceparent"];

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for column in COLUMNS {
            manager
                .alter_table(
                    Table::alter()
                        .table("outbound_events")
                        .add_column(text_null(column))
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for column in COLUMNS.into_iter().rev() {
            manager
                .alter_table(
                    Table::alter()
                        .table("outbound_events")
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        Ok(())
    }
}
