//! Who a credential is and where its holder belongs: the reads the web's authentication and
//! the console's session make (a credential's secret is never stored; keys are found by hash).

use entities::api_key;
use keel_domain::{ApiKeyId, OrgId, UserId};
use sea_orm::{ConnectionTrait, DbErr};

use super::{repo, Role};

/// The active API key whose secret hashes (SHA-256, hex) to `hash`.
#[tracing::instrument(level = "debug", skip_all)]
pub async fn api_key_by_hash(db: &impl ConnectionTrait, hash: &str) -> Result<Option<api_key::Model>, DbErr> {
    repo::active_api_key(db, hash).await
}

/// The active API key with this id (a console session signed in with it).
#[tracing::instrument(level = "debug", skip_all, fields(api_key_id = %key_id))]
pub async fn api_key_by_id(
    db: &impl ConnectionTrait,
    key_id: &ApiKeyId,
) -> Result<Option<api_key::Model>, DbErr> {
    repo::active_api_key_by_id(db, key_id).await
}

#[tracing::instrument(level = "debug", skip_all, fields(user_id = %user_id))]
pub async fn user_exists(db: &impl ConnectionTrait, user_id: &UserId) -> Result<bool, DbErr> {
    repo::user_exists(db, user_id).await
}

/// The user named by id or e-mail (the operator's `keel admin session`).
#[tracing::instrument(level = "debug", skip_all)]
pub async fn find_user(
    db: &impl ConnectionTrait,
    id_or_email: &str,
) -> Result<Option<entities::user::Model>, DbErr> {
    repo::user_by_id_or_email(db, id_or_email).await
}

/// Every organization the user belongs to, with the role held there.
#[tracing::instrument(level = "debug", skip_all, fields(user_id = %user_id))]
pub async fn memberships_of(
    db: &impl ConnectionTrait,
    user_id: &UserId,
) -> Result<Vec<(OrgId, Role)>, DbErr> {
    repo::memberships_of(db, user_id).await
}

/// The user's role in the organization; `None` when not a member.
#[tracing::instrument(level = "debug", skip_all, fields(user_id = %user_id, org_id = %org_id))]
pub async fn role_in(
    db: &impl ConnectionTrait,
    user_id: &UserId,
    org_id: &OrgId,
) -> Result<Option<Role>, DbErr> {
    repo::role_in(db, user_id, org_id).await
}
