//! The console's own rows: sessions (one per sign-in) and the one-time views of new API
//! keys' secrets.

use chrono::{DateTime, Utc};
use entities::{console_event, console_reveal, console_session};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DbErr, EntityTrait, IntoActiveModel, QueryFilter,
};

use crate::domain::OrgId;

/// How long a new key's secret waits for its one view.
pub const REVEAL_SECS: i64 = 600;

/// Deletes the one-time views older than [`REVEAL_SECS`] (their sealed secrets with them).
async fn purge_reveals(db: &impl ConnectionTrait) -> Result<(), DbErr> {
    console_reveal::Entity::delete_many()
        .filter(console_reveal::Column::CreatedAt.lt(Utc::now() - chrono::Duration::seconds(REVEAL_SECS)))
        .exec(db)
        .await
        .map(drop)
}

pub async fn insert_session(db: &impl ConnectionTrait, session: console_session::Model) -> Result<(), DbErr> {
    // Sessions past their end, and views past theirs, go whenever a session starts.
    console_session::Entity::delete_many()
        .filter(console_session::Column::ExpiresAt.lt(Utc::now()))
        .exec(db)
        .await?;
    purge_reveals(db).await?;
    session.into_active_model().reset_all().insert(db).await.map(drop)
}

/// Whether the session is there and has not ended.
pub async fn session_alive(db: &impl ConnectionTrait, id: &str, now: DateTime<Utc>) -> Result<bool, DbErr> {
    Ok(console_session::Entity::find_by_id(id.to_owned())
        .one(db)
        .await?
        .is_some_and(|s| s.expires_at > now))
}

pub async fn end_session(db: &impl ConnectionTrait, id: &str) -> Result<(), DbErr> {
    console_session::Entity::delete_by_id(id.to_owned())
        .exec(db)
        .await
        .map(drop)
}

pub async fn insert_reveal(db: &impl ConnectionTrait, reveal: console_reveal::Model) -> Result<(), DbErr> {
    purge_reveals(db).await?;
    reveal.into_active_model().reset_all().insert(db).await.map(drop)
}

/// Takes (reads and deletes) a reveal of `session_id` in `org_id` made within
/// [`REVEAL_SECS`].
pub async fn take_reveal(
    db: &impl ConnectionTrait,
    id: &str,
    session_id: &str,
    org_id: &OrgId,
) -> Result<Option<String>, DbErr> {
    purge_reveals(db).await?;
    let since: DateTime<Utc> = Utc::now() - chrono::Duration::seconds(REVEAL_SECS);
    let found = console_reveal::Entity::find_by_id(id.to_owned())
        .filter(console_reveal::Column::SessionId.eq(session_id))
        .filter(console_reveal::Column::OrgId.eq(org_id))
        .one(db)
        .await?;
    let Some(found) = found else {
        return Ok(None);
    };
    // Deleted by this read; a read that raced it and lost gets nothing.
    let deleted = console_reveal::Entity::delete_by_id(id.to_owned())
        .exec(db)
        .await?;
    Ok((deleted.rows_affected == 1 && found.created_at >= since).then_some(found.sealed))
}

/// Records something keel did on its own that the organization's members should see.
pub async fn insert_event(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    kind: &str,
    message: String,
    at: DateTime<Utc>,
) -> Result<(), DbErr> {
    console_event::Entity::insert(console_event::ActiveModel {
        id: sea_orm::ActiveValue::Set(uuid::Uuid::new_v4().to_string()),
        org_id: sea_orm::ActiveValue::Set(org_id.clone()),
        kind: sea_orm::ActiveValue::Set(kind.to_owned()),
        message: sea_orm::ActiveValue::Set(message),
        created_at: sea_orm::ActiveValue::Set(at),
    })
    .exec_without_returning(db)
    .await
    .map(drop)
}

/// The organization's latest console events, newest first.
pub async fn events(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    limit: u64,
) -> Result<Vec<console_event::Model>, DbErr> {
    use sea_orm::{QueryOrder, QuerySelect};
    console_event::Entity::find()
        .filter(console_event::Column::OrgId.eq(org_id.clone()))
        .order_by_desc(console_event::Column::CreatedAt)
        .limit(limit)
        .all(db)
        .await
}
