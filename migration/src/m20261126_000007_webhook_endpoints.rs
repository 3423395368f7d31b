//! Outbound webhooks (issue 41): an organization's endpoints, the events its changes
//! announce (written in the transaction of the change: the outbox), one delivery per event
//! and subscribed endpoint, and every attempt at a delivery.

use sea_orm_migration::prelude::*;

use crate::cols::{boolean, id, index, org_fk, string, string_null, text_null, timestamp, timestamp_null};

#[derive(DeriveMigrationName)]
pub struct Migration;

const DUE: &str = "idx_webhook_deliveries_due";
const BY_ENDPOINT: &str = "idx_webhook_deliveries_endpoint";
const ENDPOINTS_BY_ORG: &str = "idx_webhook_endpoints_org";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table("webhook_endpoints")
                    .col(id("id"))
                    .col(string("org_id", 64))
                    .col(ColumnDef::new("url").text().not_null())
                    .col(string_null("description", 500))
                    // A JSON array of event names ("*": all).
                    .col(ColumnDef::new("events").text().not_null())
                    .col(ColumnDef::new("secret_sealed").text().not_null())
                    // During a rotation, the previous secret, which keeps signing until then.
                    .col(text_null("old_secret_sealed"))
                    .col(timestamp_null("old_secret_until"))
                    .col(boolean("enabled", true))
                    .col(string_null("disabled_reason", 500))
                    .col(timestamp("created_at"))
                    .col(timestamp("updated_at"))
                    .foreign_key(&mut org_fk("webhook_endpoints"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(index(
                ENDPOINTS_BY_ORG,
                "webhook_endpoints",
                &["org_id", "created_at"],
            ))
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("outbound_events")
                    .col(id("id"))
                    .col(string("org_id", 64))
                    .col(string("event_type", 64))
                    // The body every endpoint receives: {id, type, createdAt, orgId, data}.
                    .col(ColumnDef::new("body").text().not_null())
                    .col(timestamp("created_at"))
                    .foreign_key(&mut org_fk("outbound_events"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("webhook_deliveries")
                    .col(id("id"))
                    .col(string("event_id", 64))
                    .col(string("endpoint_id", 64))
                    .col(string("org_id", 64))
                    // pending, succeeded or failed.
                    .col(string("status", 16))
                    .col(ColumnDef::new("attempts").integer().not_null().default(0))
                    // Pending: when it is due (or, while a dispatcher sends it, when its claim
                    // lapses).
                    .col(timestamp_null("next_attempt_at"))
                    .col(timestamp("created_at"))
                    .col(timestamp("updated_at"))
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_webhook_deliveries_event")
                            .from("webhook_deliveries", "event_id")
                            .to("outbound_events", "id")
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_webhook_deliveries_endpoint")
                            .from("webhook_deliveries", "endpoint_id")
                            .to("webhook_endpoints", "id")
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        // What dispatchers claim: pending deliveries by due time (only pending rows).
        manager
            .create_index(
                index(DUE, "webhook_deliveries", &["next_attempt_at"])
                    .and_where(Expr::col("status").eq("pending"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(index(
                BY_ENDPOINT,
                "webhook_deliveries",
                &["endpoint_id", "created_at", "id"],
            ))
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("webhook_delivery_attempts")
                    .col(string("delivery_id", 64))
                    .col(ColumnDef::new("attempt").integer().not_null())
                    .col(timestamp("attempted_at"))
                    .col(ColumnDef::new("status_code").integer().null())
                    .col(ColumnDef::new("latency_ms").integer().not_null())
                    // The first 1 KiB of the answer's body (no header is kept).
                    .col(text_null("response"))
                    .col(text_null("error"))
                    .primary_key(Index::create().col("delivery_id").col("attempt"))
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_webhook_delivery_attempts_delivery")
                            .from("webhook_delivery_attempts", "delivery_id")
                            .to("webhook_deliveries", "id")
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in [
            "webhook_delivery_attempts",
            "webhook_deliveries",
            "outbound_events",
            "webhook_endpoints",
        ] {
            manager.drop_table(Table::drop().table(table).to_owned()).await?;
        }
        Ok(())
    }
}
