//! Queries of a key's settings, its daily usage and the shared state of its limits.

use chrono::{DateTime, Duration, Utc};
use entities::{api_key, api_key_bucket, api_key_stream, api_key_usage};
use sea_orm::sea_query::{Expr, Func, OnConflict};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DbErr, EntityTrait, FromQueryResult, QueryFilter,
    QueryOrder, QuerySelect, QueryTrait, TransactionSession, TransactionTrait,
};

use super::{KeySettings, SettingsChange};
use crate::auth::keys::mint_api_key;
use crate::domain::{ApiKeyId, OrgId};

/// A key just minted: its id and its secret (shown once; only the hash is stored).
pub struct CreatedKey {
    pub api_key_id: ApiKeyId,
    pub secret: String,
}

/// Mints a key of the organization with its settings.
pub async fn insert(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    name: Option<&str>,
    settings: &KeySettings,
) -> Result<CreatedKey, DbErr> {
    let minted = mint_api_key();
    let api_key_id = ApiKeyId::generate();
    let clamp32 = |n: Option<u32>| n.map(|n| i32::try_from(n).unwrap_or(i32::MAX));
    api_key::Entity::insert(api_key::ActiveModel {
        id: Set(api_key_id.clone()),
        org_id: Set(org_id.to_owned()),
        name: Set(name.map(str::to_owned)),
        prefix: Set(minted.prefix),
        key_hash: Set(minted.hash),
        created_at: Set(Utc::now()),
        revoked_at: Set(None),
        scopes: Set(settings.scopes.encode()),
        requests_per_minute: Set(clamp32(settings.limits.requests_per_minute)),
        tokens_per_day: Set(settings
            .limits
            .tokens_per_day
            .map(|n| i64::try_from(n).unwrap_or(i64::MAX))),
        concurrent_streams: Set(clamp32(settings.limits.concurrent_streams)),
        models: Set(settings
            .models
            .as_ref()
            .map(|m| serde_json::Value::from(m.clone()).to_string())),
        expires_at: Set(settings.expires_at),
        last_used_at: Set(None),
    })
    .exec_without_returning(db)
    .await?;
    Ok(CreatedKey {
        api_key_id,
        secret: minted.secret,
    })
}

/// Revokes a key (of `org_id`, when given); `false` when there is no such key. Revoking
/// twice is harmless. Console sessions signed in with the key end with it, in the same
/// transaction.
pub async fn revoke(
    db: &impl TransactionTrait,
    org_id: Option<&OrgId>,
    key_id: &ApiKeyId,
) -> Result<bool, DbErr> {
    let txn = db.begin().await?;
    let found = api_key::Entity::update_many()
        .col_expr(
            api_key::Column::RevokedAt,
            // A key revoked already keeps its time (and still counts as found).
            Func::coalesce([Expr::col(api_key::Column::RevokedAt), Expr::value(Utc::now())]).into(),
        )
        .filter(api_key::Column::Id.eq(key_id))
        .apply_if(org_id, |update, org_id| {
            update.filter(api_key::Column::OrgId.eq(org_id))
        })
        .exec(&txn)
        .await?
        .rows_affected
        > 0;
    if found {
        entities::console_session::Entity::delete_many()
            .filter(entities::console_session::Column::KeyId.eq(key_id))
            .exec(&txn)
            .await?;
    }
    txn.commit().await?;
    Ok(found)
}

/// The organization's keys, newest first.
pub async fn keys_of(db: &impl ConnectionTrait, org_id: &OrgId) -> Result<Vec<api_key::Model>, DbErr> {
    api_key::Entity::find()
        .filter(api_key::Column::OrgId.eq(org_id))
        .order_by_desc(api_key::Column::CreatedAt)
        .all(db)
        .await
}

/// A key of the organization (revoked or not).
pub async fn key_of(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    key_id: &ApiKeyId,
) -> Result<Option<api_key::Model>, DbErr> {
    api_key::Entity::find_by_id(key_id.clone())
        .filter(api_key::Column::OrgId.eq(org_id))
        .one(db)
        .await
}

/// Writes a change of settings; `false` when the key is not the organization's.
pub async fn apply(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    key_id: &ApiKeyId,
    change: &SettingsChange,
) -> Result<bool, DbErr> {
    let mut update = api_key::Entity::update_many()
        .filter(api_key::Column::Id.eq(key_id))
        .filter(api_key::Column::OrgId.eq(org_id));
    let mut changed = false;
    if let Some(name) = &change.name {
        update = update.col_expr(api_key::Column::Name, Expr::value(name.clone()));
        changed = true;
    }
    if let Some(rpm) = change.requests_per_minute {
        update = update.col_expr(
            api_key::Column::RequestsPerMinute,
            Expr::value(rpm.map(|n| i32::try_from(n).unwrap_or(i32::MAX))),
        );
        changed = true;
    }
    if let Some(tokens) = change.tokens_per_day {
        update = update.col_expr(
            api_key::Column::TokensPerDay,
            Expr::value(tokens.map(|n| i64::try_from(n).unwrap_or(i64::MAX))),
        );
        changed = true;
    }
    if let Some(streams) = change.concurrent_streams {
        update = update.col_expr(
            api_key::Column::ConcurrentStreams,
            Expr::value(streams.map(|n| i32::try_from(n).unwrap_or(i32::MAX))),
        );
        changed = true;
    }
    if let Some(scopes) = change.scopes {
        update = update.col_expr(api_key::Column::Scopes, Expr::value(scopes.encode()));
        changed = true;
    }
    if let Some(models) = &change.models {
        let stored = models
            .as_ref()
            .map(|m| serde_json::Value::from(m.clone()).to_string());
        update = update.col_expr(api_key::Column::Models, Expr::value(stored));
        changed = true;
    }
    if let Some(expires_at) = change.expires_at {
        update = update.col_expr(api_key::Column::ExpiresAt, Expr::value(expires_at));
        changed = true;
    }
    if !changed {
        return Ok(key_of(db, org_id, key_id).await?.is_some());
    }
    Ok(update.exec(db).await?.rows_affected == 1)
}

/// Adds counts to a key's day (a row made at its first count).
pub async fn add_usage(
    db: &impl ConnectionTrait,
    key_id: &ApiKeyId,
    day: &str,
    requests: i64,
    tokens: i64,
) -> Result<(), DbErr> {
    use sea_orm::sea_query::ExprTrait;
    api_key_usage::Entity::insert(api_key_usage::ActiveModel {
        key_id: Set(key_id.clone()),
        day: Set(day.to_owned()),
        requests: Set(requests),
        tokens: Set(tokens),
    })
    .on_conflict(
        OnConflict::columns([api_key_usage::Column::KeyId, api_key_usage::Column::Day])
            .value(
                api_key_usage::Column::Requests,
                Expr::col((api_key_usage::Entity, api_key_usage::Column::Requests)).add(requests),
            )
            .value(
                api_key_usage::Column::Tokens,
                Expr::col((api_key_usage::Entity, api_key_usage::Column::Tokens)).add(tokens),
            )
            .to_owned(),
    )
    .exec_without_returning(db)
    .await?;
    Ok(())
}

/// When this instance last saw each key used: written once a minute at most.
pub async fn touch(db: &impl ConnectionTrait, key_id: &ApiKeyId, at: DateTime<Utc>) -> Result<(), DbErr> {
    use sea_orm::sea_query::ExprTrait;
    api_key::Entity::update_many()
        .col_expr(api_key::Column::LastUsedAt, Expr::value(at))
        .filter(api_key::Column::Id.eq(key_id))
        .filter(
            api_key::Column::LastUsedAt
                .is_null()
                .or(api_key::Column::LastUsedAt.lt(at)),
        )
        .exec(db)
        .await?;
    Ok(())
}

/// A key's usage on one day: (requests, tokens).
pub async fn usage_on(db: &impl ConnectionTrait, key_id: &ApiKeyId, day: &str) -> Result<(i64, i64), DbErr> {
    Ok(
        api_key_usage::Entity::find_by_id((key_id.clone(), day.to_owned()))
            .one(db)
            .await?
            .map_or((0, 0), |row| (row.requests, row.tokens)),
    )
}

/// The usage of several keys on one day.
pub async fn usage_of_keys(
    db: &impl ConnectionTrait,
    keys: &[ApiKeyId],
    day: &str,
) -> Result<Vec<api_key_usage::Model>, DbErr> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    api_key_usage::Entity::find()
        .filter(api_key_usage::Column::KeyId.is_in(keys.iter().cloned()))
        .filter(api_key_usage::Column::Day.eq(day))
        .all(db)
        .await
}

/// Millionths of a request: the bucket's unit.
pub const MICRO: i64 = 1_000_000;

/// What a draw from a key's request bucket gave: `granted` requests (up to those asked), and
/// when empty, the microseconds until one more is there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Draw {
    pub granted: u64,
    pub wait_us: i64,
}

/// The bucket's level at `now_us`: what it held at `updated_us` plus its refill since (a
/// minute fills it), never above its capacity (`rpm` requests).
pub fn level_at(level: i64, updated_us: i64, now_us: i64, rpm: u32) -> i64 {
    let capacity = i64::from(rpm) * MICRO;
    let elapsed = i128::from(now_us.saturating_sub(updated_us).max(0));
    // rpm requests a minute = rpm millionths a microsecond / 60.
    let refill = elapsed * i128::from(rpm) / 60;
    i64::try_from((i128::from(level) + refill).min(i128::from(capacity))).unwrap_or(capacity)
}

/// Microseconds until a bucket at `level` holds one whole request again.
pub fn wait_us(level: i64, rpm: u32) -> i64 {
    let missing = i128::from(MICRO - std::cmp::Ord::max(level, 0));
    let rate = i128::from(rpm.max(1));
    i64::try_from((missing * 60 + rate - 1) / rate).unwrap_or(i64::MAX)
}

/// Draws up to `want` requests from a key's shared bucket of `rpm` a minute at `now_us`
/// (Unix microseconds): a compare-and-set on its row, retried when another instance drew
/// in between, so no two instances spend the same request.
pub async fn draw(
    db: &impl ConnectionTrait,
    key_id: &ApiKeyId,
    rpm: u32,
    want: u64,
    now_us: i64,
) -> Result<Draw, DbErr> {
    let rpm = rpm.max(1);
    for _ in 0..20 {
        let Some(row) = api_key_bucket::Entity::find_by_id(key_id.clone()).one(db).await? else {
            // A full bucket to begin with.
            api_key_bucket::Entity::insert(api_key_bucket::ActiveModel {
                key_id: Set(key_id.clone()),
                level: Set(i64::from(rpm) * MICRO),
                updated_us: Set(now_us),
            })
            .on_conflict(
                OnConflict::column(api_key_bucket::Column::KeyId)
                    .do_nothing()
                    .to_owned(),
            )
            .exec_without_returning(db)
            .await?;
            continue;
        };
        let level = level_at(row.level, row.updated_us, now_us, rpm);
        let whole = u64::try_from(level / MICRO).unwrap_or(0);
        let granted = whole.min(want);
        if granted == 0 {
            return Ok(Draw {
                granted: 0,
                wait_us: wait_us(level, rpm),
            });
        }
        let left = level - i64::try_from(granted).unwrap_or(0) * MICRO;
        let swapped = api_key_bucket::Entity::update_many()
            .col_expr(api_key_bucket::Column::Level, Expr::value(left))
            .col_expr(
                api_key_bucket::Column::UpdatedUs,
                Expr::value(now_us.max(row.updated_us)),
            )
            .filter(api_key_bucket::Column::KeyId.eq(key_id))
            .filter(api_key_bucket::Column::Level.eq(row.level))
            .filter(api_key_bucket::Column::UpdatedUs.eq(row.updated_us))
            .exec(db)
            .await?
            .rows_affected;
        if swapped == 1 {
            return Ok(Draw { granted, wait_us: 0 });
        }
    }
    // Twenty instances drew in between each time: as good as empty for now.
    Ok(Draw {
        granted: 0,
        wait_us: 1_000_000,
    })
}

/// How long a stream row counts after its instance last refreshed it.
pub const STREAM_ROW_TTL_SECS: i64 = 30;

/// Opens one stream of a key on `instance` if the key's open streams (on every live instance)
/// stay within `limit`; `false` (and nothing written) otherwise. The instance's own count goes
/// up first, then the total is read: two instances racing each see at least their own, so the
/// key is over its limit by at most one stream per instance.
pub async fn open_stream(
    db: &impl TransactionTrait,
    key_id: &ApiKeyId,
    instance: &str,
    limit: u32,
    now: DateTime<Utc>,
) -> Result<bool, DbErr> {
    use sea_orm::sea_query::ExprTrait;
    #[derive(FromQueryResult)]
    struct Total {
        total: Option<i64>,
    }
    let txn = db.begin().await?;
    api_key_stream::Entity::insert(api_key_stream::ActiveModel {
        key_id: Set(key_id.clone()),
        instance: Set(instance.to_owned()),
        active: Set(1),
        seen_at: Set(now),
    })
    .on_conflict(
        OnConflict::columns([api_key_stream::Column::KeyId, api_key_stream::Column::Instance])
            .value(
                api_key_stream::Column::Active,
                Expr::col((api_key_stream::Entity, api_key_stream::Column::Active)).add(1),
            )
            .value(api_key_stream::Column::SeenAt, Expr::value(now))
            .to_owned(),
    )
    .exec_without_returning(&txn)
    .await?;
    let total = api_key_stream::Entity::find()
        .select_only()
        .column_as(Expr::cust("CAST(COALESCE(SUM(active), 0) AS BIGINT)"), "total")
        .filter(api_key_stream::Column::KeyId.eq(key_id))
        .filter(api_key_stream::Column::SeenAt.gt(now - Duration::seconds(STREAM_ROW_TTL_SECS)))
        .into_model::<Total>()
        .one(&txn)
        .await?
        .and_then(|t| t.total)
        .unwrap_or(0);
    if total > i64::from(limit) {
        txn.rollback().await?;
        return Ok(false);
    }
    txn.commit().await?;
    Ok(true)
}

/// The streams open now of each of `key_ids` that has any, summed over the instances that
/// counted them lately.
pub async fn open_streams(
    db: &impl ConnectionTrait,
    key_ids: &[ApiKeyId],
    now: DateTime<Utc>,
) -> Result<Vec<(ApiKeyId, i64)>, DbErr> {
    if key_ids.is_empty() {
        return Ok(Vec::new());
    }
    api_key_stream::Entity::find()
        .select_only()
        .column(api_key_stream::Column::KeyId)
        .column_as(Expr::cust("CAST(COALESCE(SUM(active), 0) AS BIGINT)"), "open")
        .filter(api_key_stream::Column::KeyId.is_in(key_ids.iter().cloned()))
        .filter(api_key_stream::Column::Active.gt(0))
        .filter(api_key_stream::Column::SeenAt.gt(now - Duration::seconds(STREAM_ROW_TTL_SECS)))
        .group_by(api_key_stream::Column::KeyId)
        .into_tuple()
        .all(db)
        .await
}

/// Closes one stream of a key on `instance`.
pub async fn close_stream(db: &impl ConnectionTrait, key_id: &ApiKeyId, instance: &str) -> Result<(), DbErr> {
    use sea_orm::sea_query::ExprTrait;
    api_key_stream::Entity::update_many()
        .col_expr(
            api_key_stream::Column::Active,
            Expr::col(api_key_stream::Column::Active).sub(1),
        )
        .filter(api_key_stream::Column::KeyId.eq(key_id))
        .filter(api_key_stream::Column::Instance.eq(instance))
        .filter(api_key_stream::Column::Active.gt(0))
        .exec(db)
        .await?;
    Ok(())
}

/// Keeps this instance's open streams counting (`seen_at`), and drops rows of instances gone
/// for an hour.
pub async fn refresh_streams(
    db: &impl ConnectionTrait,
    instance: &str,
    now: DateTime<Utc>,
) -> Result<(), DbErr> {
    api_key_stream::Entity::update_many()
        .col_expr(api_key_stream::Column::SeenAt, Expr::value(now))
        .filter(api_key_stream::Column::Instance.eq(instance))
        .filter(api_key_stream::Column::Active.gt(0))
        .exec(db)
        .await?;
    api_key_stream::Entity::delete_many()
        .filter(api_key_stream::Column::SeenAt.lt(now - Duration::hours(1)))
        .exec(db)
        .await?;
    Ok(())
}

/// Keys (not revoked) whose expiry is in `(since, until]`.
pub async fn expired_between(
    db: &impl ConnectionTrait,
    since: chrono::DateTime<chrono::Utc>,
    until: chrono::DateTime<chrono::Utc>,
) -> Result<Vec<api_key::Model>, DbErr> {
    api_key::Entity::find()
        .filter(api_key::Column::ExpiresAt.gt(since))
        .filter(api_key::Column::ExpiresAt.lte(until))
        .filter(api_key::Column::RevokedAt.is_null())
        .all(db)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_refills_in_a_minute_and_never_past_its_capacity() {
        let minute = 60 * 1_000_000;
        assert_eq!(level_at(0, 0, minute, 10), 10 * MICRO);
        assert_eq!(level_at(0, 0, minute / 2, 10), 5 * MICRO);
        assert_eq!(level_at(10 * MICRO, 0, minute, 10), 10 * MICRO);
        // A clock that went back refills nothing.
        assert_eq!(level_at(3 * MICRO, 100, 0, 10), 3 * MICRO);
    }
}
