//! What the console's pages keep and ask of their own rows.

use chrono::{DateTime, Utc};
use entities::{console_reveal, console_session};
use sea_orm::{ConnectionTrait, DbErr};

use super::repo;
use crate::domain::OrgId;

/// Starts a session (sessions and views past their end go at the same time).
#[tracing::instrument(level = "debug", skip_all)]
pub async fn start_session(db: &impl ConnectionTrait, session: console_session::Model) -> Result<(), DbErr> {
    repo::insert_session(db, session).await
}

/// Whether the session exists and has not ended by `now`.
#[tracing::instrument(level = "debug", skip_all)]
pub async fn session_alive(db: &impl ConnectionTrait, id: &str, now: DateTime<Utc>) -> Result<bool, DbErr> {
    repo::session_alive(db, id, now).await
}

/// Ends a session on every instance.
#[tracing::instrument(level = "debug", skip_all)]
pub async fn end_session(db: &impl ConnectionTrait, id: &str) -> Result<(), DbErr> {
    repo::end_session(db, id).await
}

/// Keeps a new key's sealed secret for its one view (within `db`'s transaction when it is one).
#[tracing::instrument(level = "debug", skip_all)]
pub async fn keep_reveal(db: &impl ConnectionTrait, reveal: console_reveal::Model) -> Result<(), DbErr> {
    repo::insert_reveal(db, reveal).await
}

/// The sealed secret of a view this session may take, once; `None` after.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn take_reveal(
    db: &impl ConnectionTrait,
    id: &str,
    session_id: &str,
    org_id: &OrgId,
) -> Result<Option<String>, DbErr> {
    repo::take_reveal(db, id, session_id, org_id).await
}
