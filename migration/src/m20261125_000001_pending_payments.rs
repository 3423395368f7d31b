//! A charge is recorded before the processor is called: a row of `pending_payments` with the
//! processor idempotency key, removed in the transaction that settles it (credit, decline or
//! a processor status to wait on). A row left behind (the instance died mid-charge) is settled
//! by the reconciler, which asks the processor again with the same key.

use sea_orm_migration::prelude::*;

use crate::cols::{index, string, string_null, timestamp};

#[derive(DeriveMigrationName)]
pub struct Migration;

const TABLE: &str = "pending_payments";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table(TABLE)
                    .if_not_exists()
                    .col(
                        ColumnDef::new("processor_key")
                            .string_len(300)
                            .not_null()
                            .primary_key(),
                    )
                    .col(string("org_id", 64))
                    .col(string("kind", 20))
                    .col(ColumnDef::new("amount_cents").big_integer().not_null())
                    .col(string("customer_id", 255))
                    .col(string("payment_method_id", 255))
                    .col(string_null("client_key", 200))
                    .col(timestamp("created_at"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(index("idx_pending_payments_created", TABLE, &["created_at"]))
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager.drop_table(Table::drop().table(TABLE).to_owned()).await
    }
}
