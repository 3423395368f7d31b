//! Billing: accounts, the append-only ledger and the rows that make charges idempotent.

use sea_orm_migration::prelude::*;

use crate::cols::{boolean, index, org_fk, string, string_null, timestamp, timestamp_null, unique_index};

#[derive(DeriveMigrationName)]
pub struct Migration;

fn big(name: &'static str) -> ColumnDef {
    ColumnDef::new(name).big_integer().not_null().to_owned()
}

fn big_null(name: &'static str) -> ColumnDef {
    ColumnDef::new(name).big_integer().null().to_owned()
}

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table("billing_accounts")
                    .col(string("org_id", 64).primary_key().to_owned())
                    .col(string_null("customer_id", 255))
                    .col(big("balance_microcents").default(0).to_owned())
                    .col(string_null("payment_method_id", 255))
                    .col(string_null("pm_brand", 32))
                    .col(string_null("pm_last4", 4))
                    .col(ColumnDef::new("pm_exp_month").integer().null())
                    .col(ColumnDef::new("pm_exp_year").integer().null())
                    .col(boolean("auto_topup_enabled", false))
                    .col(big_null("auto_topup_threshold_cents"))
                    .col(big_null("auto_topup_amount_cents"))
                    .col(
                        ColumnDef::new("auto_topup_declines")
                            .integer()
                            .not_null()
                            .default(0),
                    )
                    .col(timestamp_null("auto_topup_started_at"))
                    .col(boolean("starter_credit_granted", false))
                    .col(timestamp("created_at"))
                    .col(timestamp("updated_at"))
                    .foreign_key(&mut org_fk("billing_accounts"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("ledger_entries")
                    .col(
                        ColumnDef::new("id")
                            .big_integer()
                            .not_null()
                            .auto_increment()
                            .primary_key(),
                    )
                    .col(string("org_id", 64))
                    .col(string("kind", 32))
                    .col(big("amount_microcents"))
                    .col(big("balance_after_microcents"))
                    .col(string_null("idempotency_key", 300))
                    .col(ColumnDef::new("reason").text().not_null())
                    .col(timestamp("created_at"))
                    .foreign_key(&mut org_fk("ledger_entries"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(unique_index(
                "uq_ledger_org_key",
                "ledger_entries",
                &["org_id", "idempotency_key"],
            ))
            .await?;
        manager
            .create_index(index("idx_ledger_org_id", "ledger_entries", &["org_id", "id"]))
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("serving_usage")
                    .col(string("request_id", 200).primary_key().to_owned())
                    .col(string("org_id", 64))
                    .col(string_null("adapter_id", 512))
                    .col(string("model", 512))
                    .col(big("prompt_tokens"))
                    .col(big("completion_tokens"))
                    .col(big("cost_microcents"))
                    .col(big("charged_microcents"))
                    .col(timestamp("created_at"))
                    .foreign_key(&mut org_fk("serving_usage"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(index(
                "idx_serving_usage_org",
                "serving_usage",
                &["org_id", "created_at"],
            ))
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("promo_grants")
                    .col(string("org_id", 64))
                    .col(string("code", 100))
                    .col(big("amount_cents"))
                    .col(timestamp("created_at"))
                    .primary_key(Index::create().col("org_id").col("code"))
                    .foreign_key(&mut org_fk("promo_grants"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("training_run_cost")
                    .col(string("run_id", 128).primary_key().to_owned())
                    .col(big("cost_cents"))
                    .col(string_null("provider", 100))
                    .col(timestamp("created_at"))
                    .col(timestamp("updated_at"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("payments")
                    .col(string("payment_intent_id", 255).primary_key().to_owned())
                    .col(string("org_id", 64))
                    .col(big("amount_cents"))
                    .col(string("status", 32))
                    .col(string("kind", 32))
                    .col(timestamp("created_at"))
                    .col(timestamp("updated_at"))
                    .foreign_key(&mut org_fk("payments"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("webhook_events")
                    .col(string("event_id", 255).primary_key().to_owned())
                    .col(string("event_type", 100))
                    .col(timestamp("received_at"))
                    .to_owned(),
            )
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in [
            "webhook_events",
            "payments",
            "training_run_cost",
            "promo_grants",
            "serving_usage",
            "ledger_entries",
            "billing_accounts",
        ] {
            manager
                .drop_table(Table::drop().table(table).if_exists().to_owned())
                .await?;
        }
        Ok(())
    }
}
