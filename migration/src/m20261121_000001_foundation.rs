//! Users, organizations, memberships, API keys, adapters and projects.

use sea_orm_migration::prelude::*;

use crate::cols::{
    boolean, id, index, org_fk, string, string_null, text_null, timestamp, timestamp_null, unique_index,
};

#[derive(DeriveMigrationName)]
pub struct Migration;

#[async_trait::async_trait]
impl MigrationTrait for Migration {
    async fn up(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        manager
            .create_table(
                Table::create()
                    .table("users")
                    .col(id("id"))
                    .col(string_null("email", 320))
                    .col(timestamp("created_at"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("organizations")
                    .col(id("id"))
                    .col(string("name", 200))
                    .col(string("slug", 100).unique_key().to_owned())
                    .col(timestamp("created_at"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("memberships")
                    .col(string("org_id", 64))
                    .col(string("user_id", 200))
                    .col(string("role", 16))
                    .col(timestamp("created_at"))
                    .primary_key(Index::create().col("org_id").col("user_id"))
                    .foreign_key(&mut org_fk("memberships"))
                    .foreign_key(
                        ForeignKey::create()
                            .name("fk_memberships_user")
                            .from("memberships", "user_id")
                            .to("users", "id")
                            .on_delete(ForeignKeyAction::Cascade),
                    )
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(index("idx_memberships_user", "memberships", &["user_id"]))
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("api_keys")
                    .col(id("id"))
                    .col(string("org_id", 64))
                    .col(string_null("name", 200))
                    .col(string("prefix", 32))
                    .col(string("key_hash", 64).unique_key().to_owned())
                    .col(timestamp("created_at"))
                    .col(timestamp_null("revoked_at"))
                    .foreign_key(&mut org_fk("api_keys"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("adapters")
                    .col(ColumnDef::new("id").string_len(512).not_null().primary_key())
                    .col(string("org_id", 64))
                    .col(string("base_model", 512))
                    .col(boolean("live", false))
                    .col(timestamp("created_at"))
                    .col(timestamp("updated_at"))
                    .foreign_key(&mut org_fk("adapters"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(index("idx_adapters_org", "adapters", &["org_id"]))
            .await?;
        manager
            .create_table(
                Table::create()
                    .table("projects")
                    .col(id("id"))
                    .col(string("org_id", 64))
                    .col(string("name", 200))
                    .col(string("slug", 100))
                    .col(text_null("description"))
                    .col(boolean("active", true))
                    .col(timestamp("created_at"))
                    .foreign_key(&mut org_fk("projects"))
                    .to_owned(),
            )
            .await?;
        manager
            .create_index(unique_index(
                "uq_projects_org_slug",
                "projects",
                &["org_id", "slug"],
            ))
            .await?;
        Ok(())
    }

    async fn down(&self, manager: &SchemaManager) -> Result<(), DbErr> {
        for table in [
            "projects",
            "adapters",
            "api_keys",
            "memberships",
            "organizations",
            "users",
        ] {
            manager
                .drop_table(Table::drop().table(table).if_exists().to_owned())
                .await?;
        }
        Ok(())
    }
}
