//! Cron schedules (issue 61): `training_schedules` (a job body enqueued at each tick of a
//! cron in a time zone) and `training_schedule_ticks` (one row per enqueued tick, unique per
//! schedule: written in the transaction that makes the tick's job, it is what keeps a tick to
//! one job across instances, restarts and kill -9); a job's schedule and tick.

use sea_orm_migration::prelude::*;

use crate::cols::{boolean, id, index, project_fk, string, string_null, timestamp, timestamp_null};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table("training_schedules")
                    .col(id("id"))
                    .col(string("org_id", 64))
                    .col(string("project_id", 64))
                    .col(string("name", 200))
                    .col(string("cron", 200))
                    .col(string("timezone", 64))
                    // The job's create body as given (JSON), and what each tick enqueues from
                    // it (JSON: the checked job without its organization).
                    .col(ColumnDef::new("job").text().not_null())
                    .col(ColumnDef::new("template").text().not_null())
                    .col(boolean("enabled", true))
                    .col(string("catch_up", 16))
                    // The next tick not enqueued yet (none while disabled).
                    .col(timestamp_null("next_run_at"))
                    .col(timestamp_null("last_tick_at"))
                    .col(timestamp("created_at"))
                    .col(timestamp("updated_at"))
                    .foreign_key(&mut project_fk("training_schedules"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(index(
                "idx_training_schedules_due",
                "training_schedules",
                &["enabled", "next_run_at"],
            ))
            .await?;
        manager
            .create_index(index(
                "idx_training_schedules_org",
                "training_schedules",
                &["org_id", "created_at"],
            ))
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("training_schedule_ticks")
                    .col(string("schedule_id", 64))
                    .col(timestamp("tick_at"))
                    // The tick's job: the one it made, or the open job holding its unique key.
                    .col(string_null("job_id", 64))
                    .col(timestamp("created_at"))
                    .primary_key(Index::create().col("schedule_id").col("tick_at"))
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_training_schedule_ticks_schedule")
                            .from("training_schedule_ticks", "schedule_id")
                            .to("training_schedules", "id")
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        for column in [string_null("schedule_id", 64), timestamp_null("schedule_tick")] {
            manager
                .alter_table(
                    Table::alter()
                        .table("training_jobs")
                        .add_column(column)
                        .to_owned(),
                )
                .await?;
        }
        manager
            .create_index(index(
                "idx_training_jobs_schedule",
                "training_jobs",
                &["schedule_id", "created_at"],
            ))
            .await
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .drop_index(
                Index::drop()
                    .name("idx_training_jobs_schedule")
                    .table("training_jobs")
                    .to_owned(),
            )
            .await?;
        for column in ["schedule_tick", "schedule_id"] {
            manager
                .alter_table(
                    Table::alter()
                        .table("training_jobs")
                        .drop_column(column)
                        .to_owned(),
                )
                .await?;
        }
        for table in ["training_schedule_ticks", "training_schedules"] {
            manager
                .drop_table(Table::drop().table(table).if_exists().to_owned())
                .await?;
        }
        Ok(())
    }
}
