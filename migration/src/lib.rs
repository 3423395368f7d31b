//! Schema migrations, applied in order by `keel serve` and `keel migrate up`.
#![forbid(unsafe_code)]

pub use sea_orm_migration::prelude::*;

mod m20261121_000001_foundation;
mod m20261121_000002_billing;
mod m20261121_000003_queue;
mod m20261122_000001_runs_flash;
mod m20261122_000002_traces_evals;
mod m20261122_000003_claim_index;
mod m20261122_000004_partial_job_indexes;
mod m20261124_000001_payment_idempotency;
mod m20261124_000002_console_indexes;
mod m20261124_000003_user_id_length;
mod m20261125_000001_pending_payments;
mod m20261125_000002_trace_export_index;
mod m20261125_000003_trace_project_org_fk;
mod m20261126_000001_console_sessions;
mod m20261126_000002_trace_usage_estimated;
mod m20261126_000003_job_priority_schedule;
mod m20261126_000004_queue_pauses;
mod m20261126_000005_queue_attempts_uniqueness;
mod m20261126_000006_operator_queue_indexes;
mod m20261126_000007_webhook_endpoints;
mod m20261126_000008_webhook_endpoint_health;
mod m20261126_000009_credit_grants;
mod m20261127_000001_api_key_limits;
mod m20261127_000002_trace_search_tags;
mod m20261127_000003_trace_search_indexer;
mod m20261127_000004_trace_words_backfill;
mod m20261128_000001_claim_refusals;
mod m20261128_000002_job_stop_reason;
mod m20261128_000003_webhook_secrets_and_leases;
mod m20261128_000004_sqlite_fts_off_the_writer;
mod m20261128_000005_sqlite_fts_keel_words;
mod m20261128_000006_event_request_id;
mod m20261202_000001_otlp_exports;
mod m20261203_000001_datasets;
mod m20261203_000002_schedules;
mod m20261204_000001_pipelines;

pub struct Migrator;

#[async_trait::async_trait]
impl MigratorTrait for Migrator {
    fn migrations() -> Vec<Box<dyn MigrationTrait>> {
        vec![
            Box::new(m20261121_000001_foundation::Migration),
            Box::new(m20261121_000002_billing::Migration),
            Box::new(m20261121_000003_queue::Migration),
            Box::new(m20261122_000001_runs_flash::Migration),
            Box::new(m20261122_000002_traces_evals::Migration),
            Box::new(m20261122_000003_claim_index::Migration),
            Box::new(m20261122_000004_partial_job_indexes::Migration),
            Box::new(m20261124_000001_payment_idempotency::Migration),
            Box::new(m20261124_000002_console_indexes::Migration),
            Box::new(m20261124_000003_user_id_length::Migration),
            Box::new(m20261125_000001_pending_payments::Migration),
            Box::new(m20261125_000002_trace_export_index::Migration),
            Box::new(m20261125_000003_trace_project_org_fk::Migration),
            Box::new(m20261126_000001_console_sessions::Migration),
            Box::new(m20261126_000002_trace_usage_estimated::Migration),
            Box::new(m20261126_000003_job_priority_schedule::Migration),
            Box::new(m20261126_000004_queue_pauses::Migration),
            Box::new(m20261126_000005_queue_attempts_uniqueness::Migration),
            Box::new(m20261126_000006_operator_queue_indexes::Migration),
            Box::new(m20261126_000007_webhook_endpoints::Migration),
            Box::new(m20261126_000008_webhook_endpoint_health::Migration),
            Box::new(m20261126_000009_credit_grants::Migration),
            Box::new(m20261127_000001_api_key_limits::Migration),
            Box::new(m20261127_000002_trace_search_tags::Migration),
            Box::new(m20261127_000003_trace_search_indexer::Migration),
            Box::new(m20261127_000004_trace_words_backfill::Migration),
            Box::new(m20261128_000001_claim_refusals::Migration),
            Box::new(m20261128_000002_job_stop_reason::Migration),
            Box::new(m20261128_000003_webhook_secrets_and_leases::Migration),
            Box::new(m20261128_000004_sqlite_fts_off_the_writer::Migration),
            Box::new(m20261128_000005_sqlite_fts_keel_words::Migration),
            Box::new(m20261128_000006_event_request_id::Migration),
            Box::new(m20261202_000001_otlp_exports::Migration),
            Box::new(m20261203_000001_datasets::Migration),
            Box::new(m20261203_000002_schedules::Migration),
            Box::new(m20261204_000001_pipelines::Migration),
        ]
    }
}

/// Column helpers shared by the migrations, so every table spells time and ids alike.
pub(crate) mod cols {
    use sea_orm_migration::prelude::*;
    use sea_orm_migration::sea_orm::ConnectionTrait;

    /// Runs `statements` in order (raw SQL a schema builder does not express).
    pub async fn execute_all(manager: &SchemaManager<'_>, statements: &[&str]) -> Result<(), DbErr> {
        let db = manager.get_connection();
        for statement in statements {
            db.execute_unprepared(statement).await?;
        }
        Ok(())
    }

    /// A string primary key (UUIDs and caller-chosen ids).
    pub fn id(name: &'static str) -> ColumnDef {
        ColumnDef::new(name)
            .string_len(64)
            .not_null()
            .primary_key()
            .to_owned()
    }

    pub fn string(name: &'static str, len: u32) -> ColumnDef {
        ColumnDef::new(name).string_len(len).not_null().to_owned()
    }

    pub fn string_null(name: &'static str, len: u32) -> ColumnDef {
        ColumnDef::new(name).string_len(len).null().to_owned()
    }

    pub fn text_null(name: &'static str) -> ColumnDef {
        ColumnDef::new(name).text().null().to_owned()
    }

    pub fn timestamp(name: &'static str) -> ColumnDef {
        ColumnDef::new(name)
            .timestamp_with_time_zone()
            .not_null()
            .to_owned()
    }

    pub fn timestamp_null(name: &'static str) -> ColumnDef {
        ColumnDef::new(name).timestamp_with_time_zone().null().to_owned()
    }

    pub fn boolean(name: &'static str, default: bool) -> ColumnDef {
        ColumnDef::new(name)
            .boolean()
            .not_null()
            .default(default)
            .to_owned()
    }

    /// An index made only if it is not there (a migration run again after a crash in its
    /// middle finds the indexes it made).
    pub fn index(name: &'static str, table: &'static str, columns: &[&'static str]) -> IndexCreateStatement {
        let mut index = Index::create();
        index.name(name).table(table).if_not_exists();
        for column in columns {
            index.col(*column);
        }
        index.to_owned()
    }

    pub fn unique_index(
        name: &'static str,
        table: &'static str,
        columns: &[&'static str],
    ) -> IndexCreateStatement {
        index(name, table, columns).unique().to_owned()
    }

    /// A reference to a project whose rows go when the project goes.
    pub fn project_fk(table: &'static str) -> ForeignKeyCreateStatement {
        ForeignKey::create()
            .name(format!("fk_{table}_project"))
            .from(table, "project_id")
            .to("projects", "id")
            .on_delete(ForeignKeyAction::Cascade)
            .to_owned()
    }

    /// A reference to an organization whose rows go when the organization goes.
    pub fn org_fk(table: &'static str) -> ForeignKeyCreateStatement {
        ForeignKey::create()
            .name(format!("fk_{table}_org"))
            .from(table, "org_id")
            .to("organizations", "id")
            .on_delete(ForeignKeyAction::Cascade)
            .to_owned()
    }
}
