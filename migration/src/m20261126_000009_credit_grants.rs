//! Credit grants (issue 42): every credit is a grant that debits draw from in order (lower
//! priority first, then the soonest expiry, then the oldest); a ledger entry records the
//! grants it changed. Each existing positive balance becomes one grant of kind `migrated`
//! (paid priority, never expires), so balance = the remaining grants less the overdraft
//! from the first change after this migration. Auto top-up gains a monthly cap.

use sea_orm_migration::prelude::*;

use crate::cols::{id, index, org_fk, string, string_null, text_null, timestamp, timestamp_null};

#[derive(DeriveMigrationName)]
pub struct Migration;

const ACTIVE: &str = "idx_credit_grants_active";
const DUE: &str = "idx_credit_grants_due";
const MANUAL_KEY: &str = "idx_credit_grants_key";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table("credit_grants")
                    .col(id("id"))
                    .col(string("org_id", 64))
                    // starter, promo, topup, auto_topup, manual, refund, migrated
                    .col(string("kind", 20))
                    .col(ColumnDef::new("original_microcents").big_integer().not_null())
                    .col(ColumnDef::new("remaining_microcents").big_integer().not_null())
                    .col(ColumnDef::new("priority").integer().not_null())
                    .col(timestamp_null("expires_at"))
                    .col(ColumnDef::new("reason").text().not_null())
                    // Who made a manual grant (the internal key's label).
                    .col(string_null("created_by", 200))
                    // A manual grant's Idempotency-Key and its body's hash.
                    .col(string_null("idempotency_key", 255))
                    .col(string_null("request_hash", 64))
                    .col(timestamp_null("expiring_notified_at"))
                    .col(timestamp_null("expired_at"))
                    .col(timestamp("created_at"))
                    .foreign_key(&mut org_fk("credit_grants"))
                    .to_owned(),
            )
            .await?;
        // A debit reads its organization's active grants (something left).
        manager
            .create_index(
                index(ACTIVE, "credit_grants", &["org_id"])
                    .and_where(Expr::col("remaining_microcents").gt(0))
                    .to_owned(),
            )
            .await?;
        // The expiry sweep: grants with an expiry and something left.
        manager
            .create_index(
                index(DUE, "credit_grants", &["expires_at"])
                    .and_where(Expr::col("remaining_microcents").gt(0))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(
                index(MANUAL_KEY, "credit_grants", &["org_id", "idempotency_key"])
                    .unique()
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table("ledger_entries")
                    // JSON: the grants the entry changed, `[{grantId, microcents}]` (signed).
                    .add_column(text_null("grants"))
                    .to_owned(),
            )
            .await?;
        for column in [
            ColumnDef::new("auto_topup_monthly_limit_cents")
                .big_integer()
                .null()
                .to_owned(),
            // The UTC month (YYYY-MM) whose limit_reached event was sent.
            string_null("auto_topup_limit_notified_month", 7),
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table("billing_accounts")
                        .add_column(column)
                        .to_owned(),
                )
                .await?;
        }
        // Every positive balance as it stands: one paid grant that never expires.
        let db = manager.get_connection();
        db.execute_unprepared(
            "INSERT INTO credit_grants (id, org_id, kind, original_microcents, remaining_microcents, priority, \
                 reason, created_at) \
             SELECT 'migrated-' || org_id, org_id, 'migrated', balance_microcents, balance_microcents, 50, \
                 'the balance before credit grants', updated_at \
             FROM billing_accounts WHERE balance_microcents > 0",
        )
        .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for column in [
            "auto_topup_monthly_limit_cents",
            "auto_topup_limit_notified_month",
        ] {
            manager
                .alter_table(
                    Table::alter()
                        .table("billing_accounts")
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        manager
            .alter_table(
                Table::alter()
                    .table("ledger_entries")
                    .drop_column("grants")
                    .to_owned(),
            )
            .await?;
        manager
            .drop_table(Table::drop().table("credit_grants").to_owned())
            .await
    }
}
