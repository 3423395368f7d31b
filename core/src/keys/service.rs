//! Key flows shared by the JSON API and the console: minting a key with its settings,
//! changing them, listing keys with what they used today.

use chrono::{DateTime, Utc};
use entities::api_key;
use sea_orm::DatabaseConnection;

use super::repo::CreatedKey;
use super::{day_of, repo, KeyError, KeySettings, Limiter, SettingsChange, StreamPermit};
use crate::cluster::{Cluster, Event};
use crate::domain::{ApiKeyId, OrgId};

/// Mints a key of the organization with `settings`; its secret is in the answer only.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn create(
    db: &DatabaseConnection,
    org_id: &OrgId,
    name: Option<&str>,
    settings: &KeySettings,
    now: DateTime<Utc>,
) -> Result<CreatedKey, KeyError> {
    create_in(db, org_id, name, settings, now).await
}

/// As [`create`], within the caller's transaction (the console keeps the new secret for its
/// one view in the same one: a key whose view could not be kept is not created).
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn create_in(
    db: &impl sea_orm::ConnectionTrait,
    org_id: &OrgId,
    name: Option<&str>,
    settings: &KeySettings,
    now: DateTime<Utc>,
) -> Result<CreatedKey, KeyError> {
    settings.check_new(now)?;
    if !crate::orgs::repo::org_exists(db, org_id).await? {
        return Err(KeyError::OrgNotFound);
    }
    let created = repo::insert(db, org_id, name, settings).await?;
    tracing::info!(
        target: "keel_event",
        event = "key.created",
        org_id = %org_id,
        api_key_id = %created.api_key_id,
        expires_at = settings.expires_at.map(|at| at.to_rfc3339()).as_deref(),
        "API key created"
    );
    Ok(created)
}

/// Revokes one of the organization's keys; not found when it is another organization's or
/// unknown. Every instance's proxy forgets it at once.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id, api_key_id = %key_id))]
pub async fn revoke(
    db: &DatabaseConnection,
    cluster: &Cluster,
    org_id: &OrgId,
    key_id: &ApiKeyId,
) -> Result<(), KeyError> {
    revoked(db, cluster, Some(org_id), key_id).await
}

/// Revokes any organization's key (the operator's route); every instance forgets it.
#[tracing::instrument(level = "debug", skip_all, fields(api_key_id = %key_id))]
pub async fn revoke_any(
    db: &DatabaseConnection,
    cluster: &Cluster,
    key_id: &ApiKeyId,
) -> Result<(), KeyError> {
    revoked(db, cluster, None, key_id).await
}

async fn revoked(
    db: &DatabaseConnection,
    cluster: &Cluster,
    org_id: Option<&OrgId>,
    key_id: &ApiKeyId,
) -> Result<(), KeyError> {
    if !repo::revoke(db, org_id, key_id).await? {
        return Err(KeyError::NotFound);
    }
    tracing::info!(
        target: "keel_event",
        event = "key.revoked",
        org_id = org_id.map(OrgId::as_str),
        api_key_id = %key_id,
        "API key revoked"
    );
    cluster.publish(Event::KeyChanged(key_id.clone())).await;
    Ok(())
}

/// Until `stop`, every `every`: one line for each key whose expiry passed since the last
/// look (from this process's start; each instance says it once).
pub async fn log_expiries(
    db: DatabaseConnection,
    every: std::time::Duration,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut since = Utc::now();
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(every) => {}
        }
        let until = Utc::now();
        match repo::expired_between(&db, since, until).await {
            Ok(keys) => {
                for key in keys {
                    tracing::info!(
                        target: "keel_event",
                        event = "key.expired",
                        org_id = %key.org_id,
                        api_key_id = %key.id,
                        expires_at = %key.expires_at.map(|at| at.to_rfc3339()).unwrap_or_default(),
                        "API key expired"
                    );
                }
                since = until;
            }
            Err(err) => tracing::warn!(error = %err, "reading the keys that expired failed; next look later"),
        }
    }
}

/// One of the organization's keys (another organization's is not found).
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id, api_key_id = %key_id))]
pub async fn key(
    db: &DatabaseConnection,
    org_id: &OrgId,
    key_id: &ApiKeyId,
) -> Result<api_key::Model, KeyError> {
    repo::key_of(db, org_id, key_id).await?.ok_or(KeyError::NotFound)
}

/// Changes an active key's settings; every instance forgets what it held of the key.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id, api_key_id = %key_id))]
pub async fn update(
    db: &DatabaseConnection,
    cluster: &Cluster,
    org_id: &OrgId,
    key_id: &ApiKeyId,
    change: &SettingsChange,
    now: DateTime<Utc>,
) -> Result<KeyUse, KeyError> {
    if change.expires_at.flatten().is_some_and(|at| at <= now) {
        return Err(KeyError::ExpiryInPast);
    }
    let active = repo::key_of(db, org_id, key_id)
        .await?
        .is_some_and(|key| key.revoked_at.is_none());
    if !active || !repo::apply(db, org_id, key_id, change).await? {
        return Err(KeyError::NotFound);
    }
    cluster.publish(Event::KeyChanged(key_id.clone())).await;
    let key = repo::key_of(db, org_id, key_id)
        .await?
        .ok_or(KeyError::NotFound)?;
    let (requests, tokens) = repo::usage_on(db, key_id, &day_of(now)).await?;
    Ok(KeyUse::new(key, requests, tokens))
}

/// A key with its settings and what it used today (UTC).
#[derive(Debug, Clone)]
pub struct KeyUse {
    pub key: api_key::Model,
    pub settings: KeySettings,
    pub requests_today: i64,
    pub tokens_today: i64,
    /// Streams open now, on every instance (counted for keys with a `concurrentStreams`
    /// limit; 0 for the others).
    pub streams_open: i64,
}

impl KeyUse {
    fn new(key: api_key::Model, requests_today: i64, tokens_today: i64) -> Self {
        Self {
            settings: KeySettings::of(&key),
            key,
            requests_today,
            tokens_today,
            streams_open: 0,
        }
    }
}

/// The organization's keys, newest first, with today's usage.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn list(
    db: &DatabaseConnection,
    org_id: &OrgId,
    now: DateTime<Utc>,
) -> Result<Vec<KeyUse>, KeyError> {
    let keys = repo::keys_of(db, org_id).await?;
    let ids: Vec<ApiKeyId> = keys.iter().map(|k| k.id.clone()).collect();
    let usage = repo::usage_of_keys(db, &ids, &day_of(now)).await?;
    let streams = repo::open_streams(db, &ids, now).await?;
    Ok(keys
        .into_iter()
        .map(|key| {
            let used = usage.iter().find(|u| u.key_id == key.id);
            let (requests, tokens) = used.map_or((0, 0), |u| (u.requests, u.tokens));
            let open = streams
                .iter()
                .find(|(id, _)| *id == key.id)
                .map_or(0, |(_, n)| *n);
            KeyUse {
                streams_open: open,
                ..KeyUse::new(key, requests, tokens)
            }
        })
        .collect())
}

/// The model a proxied or relayed call names, as far as the key's `models` list cares.
#[derive(Debug, Clone, Copy)]
pub enum CallModel<'a> {
    /// The call names this model.
    Named(&'a str),
    /// The call would run a model but names none keel can read (a batch, a multipart upload).
    Unnamed,
    /// The call runs no model (a read: listing models, fetching a file).
    NoModel,
}

/// Why a call of a key was not let through.
#[derive(Debug, thiserror::Error)]
pub enum Denied {
    #[error("this API key may not call model {0:?}")]
    ModelNotAllowed(String),
    #[error("this API key may only call the models it lists, and this call names none keel can read")]
    ModelUnknown,
    #[error(transparent)]
    Limited(#[from] super::limiter::Limited),
}

/// Lets a call of a key through its `models` list and limits, before any provider is called:
/// the model first, then (for a stream) `concurrentStreams`, then `tokensPerDay` and
/// `requestsPerMinute`. The call is counted; a stream holds the permit it answers until it ends.
#[tracing::instrument(level = "debug", skip_all, fields(api_key_id = %key_id))]
pub async fn admit(
    limiter: &Limiter,
    key_id: &ApiKeyId,
    settings: &KeySettings,
    model: CallModel<'_>,
    stream: bool,
    now: DateTime<Utc>,
) -> Result<Option<StreamPermit>, Denied> {
    if settings.models.is_some() {
        match model {
            CallModel::Named(name) if settings.allows_model(name) => {}
            CallModel::Named(name) => return Err(Denied::ModelNotAllowed(name.chars().take(200).collect())),
            CallModel::Unnamed => return Err(Denied::ModelUnknown),
            CallModel::NoModel => {}
        }
    }
    let permit = match settings.limits.concurrent_streams {
        Some(limit) if stream => Some(limiter.open_stream(key_id, limit).await?),
        _ => None,
    };
    limiter.admit(key_id, &settings.limits, now).await?;
    Ok(permit)
}
