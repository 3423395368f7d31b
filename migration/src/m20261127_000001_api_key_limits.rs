//! API keys people can hand out safely (issue 43): a key's scopes, model allow-list, expiry
//! and limits, when it was last used; what it used each UTC day; the shared state its limits
//! are kept in across instances (a token bucket of requests, the streams open on each
//! instance).

use sea_orm_migration::prelude::*;

use crate::cols::{string, text_null, timestamp, timestamp_null};

#[derive(DeriveMigrationName)]
pub struct Migration;

/// A reference to an API key whose rows go when the key goes.
fn key_fk(table: &'static str) -> ForeignKeyCreateStatement {
    ForeignKey::create()
        .name(format!("fk_{table}_key"))
        .from(table, "key_id")
        .to("api_keys", "id")
        .on_delete(ForeignKeyAction::Cascade)
        .to_owned()
}

fn new_columns() -> Vec<ColumnDef> {
    vec![
        ColumnDef::new("scopes")
            .string_len(40)
            .not_null()
            .default("api,inference")
            .to_owned(),
        ColumnDef::new("requests_per_minute").integer().null().to_owned(),
        ColumnDef::new("tokens_per_day").big_integer().null().to_owned(),
        ColumnDef::new("concurrent_streams").integer().null().to_owned(),
        text_null("models"),
        timestamp_null("expires_at"),
        timestamp_null("last_used_at"),
    ]
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        // One column at a time: SQLite alters one thing per statement.
        for mut column in new_columns() {
            manager
                .alter_table(
                    Table::alter()
                        .table("api_keys")
                        .add_column(&mut column)
                        .to_owned(),
                )
                .await?;
        }
        manager
            .create_table(
                Table::create()
                    .table("api_key_usage")
                    .col(string("key_id", 64))
                    .col(string("day", 10))
                    .col(ColumnDef::new("requests").big_integer().not_null().default(0))
                    .col(ColumnDef::new("tokens").big_integer().not_null().default(0))
                    .primary_key(Index::create().col("key_id").col("day"))
                    .foreign_key(&mut key_fk("api_key_usage"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("api_key_buckets")
                    .col(string("key_id", 64).primary_key().to_owned())
                    .col(ColumnDef::new("level").big_integer().not_null())
                    .col(ColumnDef::new("updated_us").big_integer().not_null())
                    .foreign_key(&mut key_fk("api_key_buckets"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("api_key_streams")
                    .col(string("key_id", 64))
                    .col(string("instance", 64))
                    .col(ColumnDef::new("active").integer().not_null().default(0))
                    .col(timestamp("seen_at"))
                    .primary_key(Index::create().col("key_id").col("instance"))
                    .foreign_key(&mut key_fk("api_key_streams"))
                    .to_owned(),
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in ["api_key_streams", "api_key_buckets", "api_key_usage"] {
            manager
                .drop_table(Table::drop().table(table).if_exists().to_owned())
                .await?;
        }
        for column in [
            "scopes",
            "requests_per_minute",
            "tokens_per_day",
            "concurrent_streams",
            "models",
            "expires_at",
            "last_used_at",
        ] {
            manager
                .alter_table(Table::alter().table("api_keys").drop_column(column).to_owned())
                .await?;
        }
        Ok(())
    }
}
