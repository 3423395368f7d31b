//! Organization flows shared by the JSON API, the console and the CLI.

use chrono::Utc;
use entities::{adapter, organization};
use sea_orm::{ActiveValue::Set, DatabaseConnection, EntityTrait, TransactionSession, TransactionTrait};

use super::repo::{self, CreatedOrg};
use super::OrgError;
use crate::auth::Role;
use crate::cluster::{Cluster, Event};
use crate::domain::{OrgId, UserId};

/// Creates an organization with its owner. An explicit slug already taken is 409; a
/// slug derived from the name gets a short suffix instead.
#[tracing::instrument(level = "debug", skip_all)]
pub async fn create_org(
    db: &impl TransactionTrait,
    name: &str,
    slug: Option<&str>,
    owner_user_id: &UserId,
    owner_email: Option<&str>,
) -> Result<CreatedOrg, OrgError> {
    let org_id = OrgId::generate();
    let base = slug.map_or_else(|| repo::derived_slug(name, "org"), str::to_owned);
    for attempt in 0..5 {
        let candidate = if attempt == 0 {
            base.clone()
        } else {
            repo::with_suffix(&base)
        };
        let txn = db.begin().await?;
        let inserted = organization::Entity::insert(organization::ActiveModel {
            id: Set(org_id.clone()),
            name: Set(name.to_owned()),
            slug: Set(candidate.clone()),
            created_at: Set(Utc::now()),
        })
        .exec_without_returning(&txn)
        .await;
        match inserted {
            Ok(_) => {}
            Err(err) if repo::is_unique_violation(&err) => {
                txn.rollback().await?;
                if slug.is_some() {
                    return Err(OrgError::SlugTaken(candidate));
                }
                continue;
            }
            Err(err) => return Err(err.into()),
        }
        repo::upsert_user(&txn, owner_user_id, owner_email).await?;
        repo::set_role(&txn, &org_id, owner_user_id, Role::Owner).await?;
        txn.commit().await?;
        return Ok(CreatedOrg {
            org_id,
            slug: candidate,
        });
    }
    Err(OrgError::NoFreeSlug)
}

/// An organization by id; not found when there is none.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn org(db: &DatabaseConnection, org_id: &OrgId) -> Result<entities::organization::Model, OrgError> {
    repo::find_org(db, org_id).await?.ok_or(OrgError::OrgNotFound)
}

/// Whether the organization exists.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn exists(db: &DatabaseConnection, org_id: &OrgId) -> Result<bool, OrgError> {
    Ok(repo::org_exists(db, org_id).await?)
}

/// The oldest organization with exactly this name, if any (the CLI's bootstrap asks first).
#[tracing::instrument(level = "debug", skip_all)]
pub async fn named(db: &DatabaseConnection, name: &str) -> Result<Option<organization::Model>, OrgError> {
    Ok(repo::find_org_by_name(db, name).await?)
}

/// Every organization, by name (the operator's list).
#[tracing::instrument(level = "debug", skip_all)]
pub async fn all(db: &DatabaseConnection) -> Result<Vec<organization::Model>, OrgError> {
    Ok(repo::all_orgs(db).await?)
}

/// The organization's members with their e-mail, owners first.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn members(
    db: &DatabaseConnection,
    org_id: &OrgId,
) -> Result<Vec<(entities::membership::Model, Option<String>)>, OrgError> {
    Ok(repo::members_of(db, org_id).await?)
}

/// Deletes an organization with everything it owns; every instance forgets it at once.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn delete_org(db: &DatabaseConnection, cluster: &Cluster, org_id: &OrgId) -> Result<(), OrgError> {
    if !repo::delete_org(db, org_id).await? {
        return Err(OrgError::OrgNotFound);
    }
    cluster.publish(Event::OrgChanged(org_id.clone())).await;
    Ok(())
}

/// Gives `user_id` (created if new) `role` in the organization.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id, user_id = %user_id))]
pub async fn set_member(
    db: &DatabaseConnection,
    cluster: &Cluster,
    org_id: &OrgId,
    user_id: &UserId,
    email: Option<&str>,
    role: Role,
) -> Result<(), OrgError> {
    if !repo::org_exists(db, org_id).await? {
        return Err(OrgError::OrgNotFound);
    }
    repo::upsert_user(db, user_id, email).await?;
    repo::set_role(db, org_id, user_id, role).await?;
    cluster.publish(Event::OrgChanged(org_id.clone())).await;
    Ok(())
}

/// Registers or updates an adapter of the organization; every instance reloads it.
#[tracing::instrument(level = "debug", skip_all, fields(org_id = %org_id))]
pub async fn put_adapter(
    db: &DatabaseConnection,
    cluster: &Cluster,
    adapter_id: &str,
    org_id: &OrgId,
    base_model: &str,
    live: Option<bool>,
) -> Result<adapter::Model, OrgError> {
    if !repo::org_exists(db, org_id).await? {
        return Err(OrgError::OrgNotFound);
    }
    let adapter = repo::upsert_adapter(db, adapter_id, org_id, base_model, live).await?;
    cluster
        .publish(Event::AdapterChanged(adapter_id.to_owned()))
        .await;
    Ok(adapter)
}

/// Removes an adapter; every instance forgets it.
#[tracing::instrument(level = "debug", skip_all)]
pub async fn delete_adapter(
    db: &DatabaseConnection,
    cluster: &Cluster,
    adapter_id: &str,
) -> Result<(), OrgError> {
    if !repo::delete_adapter(db, adapter_id).await? {
        return Err(OrgError::AdapterNotFound);
    }
    cluster
        .publish(Event::AdapterChanged(adapter_id.to_owned()))
        .await;
    Ok(())
}
