//! A top-up's client `Idempotency-Key` is kept with its payment, so a retry with the same
//! key answers the first attempt's result instead of charging again.

use sea_orm_migration::prelude::*;

use crate::cols::{string_null, unique_index};

#[derive(DeriveMigrationName)]
pub struct Migration;

const TABLE: &str = "payments";
const INDEX: &str = "idx_payments_org_idempotency_key";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(TABLE)
                    .add_column(string_null("idempotency_key", 200))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(unique_index(INDEX, TABLE, &["org_id", "idempotency_key"]))
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(Index::drop().name(INDEX).table(TABLE).to_owned())
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(TABLE)
                    .drop_column("idempotency_key")
                    .to_owned(),
            )
            .await
    }
}
