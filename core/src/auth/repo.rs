//! Credential and membership look-ups.

use entities::{api_key, membership, user};
use keel_domain::{ApiKeyId, OrgId, UserId};
use sea_orm::{ColumnTrait, ConnectionTrait, EntityTrait, QueryFilter};

use super::Role;

/// A key that has not expired (or never does).
fn unexpired() -> sea_orm::Condition {
    sea_orm::Condition::any()
        .add(api_key::Column::ExpiresAt.is_null())
        .add(api_key::Column::ExpiresAt.gt(chrono::Utc::now()))
}

/// An active (not revoked, not expired) API key by the hash of its secret.
pub async fn active_api_key(
    db: &impl ConnectionTrait,
    hash: &str,
) -> Result<Option<api_key::Model>, sea_orm::DbErr> {
    api_key::Entity::find()
        .filter(api_key::Column::KeyHash.eq(hash))
        .filter(api_key::Column::RevokedAt.is_null())
        .filter(unexpired())
        .one(db)
        .await
}

pub async fn user_exists(db: &impl ConnectionTrait, user_id: &UserId) -> Result<bool, sea_orm::DbErr> {
    Ok(user::Entity::find_by_id(user_id.clone()).one(db).await?.is_some())
}

/// The user with this id, else the one with this e-mail (case-insensitive).
pub async fn user_by_id_or_email(
    db: &impl ConnectionTrait,
    wanted: &str,
) -> Result<Option<user::Model>, sea_orm::DbErr> {
    use sea_orm::sea_query::{Expr, ExprTrait, Func};
    use sea_orm::QueryFilter;
    if let Ok(id) = UserId::parse(wanted) {
        if let Some(user) = user::Entity::find_by_id(id).one(db).await? {
            return Ok(Some(user));
        }
    }
    user::Entity::find()
        .filter(Func::lower(Expr::col(user::Column::Email)).eq(wanted.to_lowercase()))
        .one(db)
        .await
}

/// Every organization the user belongs to, with the role held there.
pub async fn memberships_of(
    db: &impl ConnectionTrait,
    user_id: &UserId,
) -> Result<Vec<(OrgId, Role)>, sea_orm::DbErr> {
    Ok(membership::Entity::find()
        .filter(membership::Column::UserId.eq(user_id))
        .all(db)
        .await?
        .into_iter()
        .filter_map(|m| Role::parse(&m.role).map(|role| (m.org_id, role)))
        .collect())
}

pub async fn role_in(
    db: &impl ConnectionTrait,
    user_id: &UserId,
    org_id: &OrgId,
) -> Result<Option<Role>, sea_orm::DbErr> {
    Ok(membership::Entity::find_by_id((org_id.clone(), user_id.clone()))
        .one(db)
        .await?
        .and_then(|m| Role::parse(&m.role)))
}

/// An active (not revoked, not expired) API key by its id.
pub async fn active_api_key_by_id(
    db: &impl ConnectionTrait,
    key_id: &ApiKeyId,
) -> Result<Option<api_key::Model>, sea_orm::DbErr> {
    api_key::Entity::find_by_id(key_id.clone())
        .filter(api_key::Column::RevokedAt.is_null())
        .filter(unexpired())
        .one(db)
        .await
}
