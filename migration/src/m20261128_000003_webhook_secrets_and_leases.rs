//! Webhooks (issue 54): every rotated-out secret keeps signing until its own deadline (a
//! second rotation within 24 hours used to drop the first one's secret at once), so the
//! previous secrets are a JSON list of `{"sealed", "until"}` instead of one secret and one
//! deadline; and a delivery a dispatcher is sending says until when (`leased_until`), so a
//! manual retry can tell it is in flight.

use sea_orm_migration::prelude::*;
use sea_orm_migration::sea_orm::prelude::ChronoDateTimeUtc;
use sea_orm_migration::sea_orm::{ConnectionTrait, JsonValue, Statement};

use crate::cols::{text_null, timestamp_null};

#[derive(DeriveMigrationName)]
pub struct Migration;

const TABLE: &str = "webhook_endpoints";

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table(TABLE)
                    .add_column(text_null("previous_secrets"))
                    .to_owned(),
            )
            .await?;
        let db = manager.get_connection();
        let backend = db.get_database_backend();
        let select = Query::select()
            .columns(["id", "old_secret_sealed", "old_secret_until"])
            .from(TABLE)
            .and_where(Expr::col("old_secret_sealed").is_not_null())
            .to_owned();
        for row in db.query_all(&select).await? {
            let id: String = row.try_get("", "id")?;
            let sealed: String = row.try_get("", "old_secret_sealed")?;
            let until: Option<ChronoDateTimeUtc> = row.try_get("", "old_secret_until")?;
            let Some(until) = until else { continue };
            let entry = [
                ("sealed".to_owned(), JsonValue::from(sealed)),
                ("until".to_owned(), JsonValue::from(until.to_rfc3339())),
            ];
            let list = JsonValue::Array(vec![JsonValue::Object(entry.into_iter().collect())]).to_string();
            let update = Query::update()
                .table(TABLE)
                .value("previous_secrets", list)
                .and_where(Expr::col("id").eq(id))
                .to_owned();
            let (sql, values) = match backend {
                sea_orm_migration::sea_orm::DbBackend::Postgres => update.build(PostgresQueryBuilder),
                _ => update.build(SqliteQueryBuilder),
            };
            db.execute_raw(Statement::from_sql_and_values(backend, sql, values))
                .await?;
        }
        for column in ["old_secret_sealed", "old_secret_until"] {
            manager
                .alter_table(Table::alter().table(TABLE).drop_column(column).to_owned())
                .await?;
        }
        manager
            .alter_table(
                Table::alter()
                    .table("webhook_deliveries")
                    .add_column(timestamp_null("leased_until"))
                    .to_owned(),
            )
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .alter_table(
                Table::alter()
                    .table("webhook_deliveries")
                    .drop_column("leased_until")
                    .to_owned(),
            )
            .await?;
        // The rotation in progress is forgotten (receivers keep the current secret).
        manager
            .alter_table(
                Table::alter()
                    .table(TABLE)
                    .add_column(text_null("old_secret_sealed"))
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(TABLE)
                    .add_column(timestamp_null("old_secret_until"))
                    .to_owned(),
            )
            .await?;
        manager
            .alter_table(
                Table::alter()
                    .table(TABLE)
                    .drop_column("previous_secrets")
                    .to_owned(),
            )
            .await
    }
}
