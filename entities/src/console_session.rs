use keel_domain::{ApiKeyId, UserId};
use sea_orm::entity::prelude::*;

/// A console sign-in; the signed cookie names it, and holds only while it is here.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "console_sessions")]
pub struct Model {
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: String,
    /// `key`, `user` or `operator`.
    pub kind: String,
    /// The API key it was made with (revoking the key deletes it).
    pub key_id: Option<ApiKeyId>,
    pub user_id: Option<UserId>,
    pub created_at: DateTimeUtc,
    pub expires_at: DateTimeUtc,
}

#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
