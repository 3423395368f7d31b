//! An organization's training secrets, sealed.

use entities::org_secret;
use sea_orm::ActiveValue::Set;
use sea_orm::{EntityTrait, QueryOrder, TransactionSession, TransactionTrait};

use super::*;

/// One change to an organization's training secrets: a sealed value to store, or `None` to
/// delete the name.
pub struct SecretChange {
    pub name: String,
    pub sealed: Option<String>,
}

/// Applies every change in one transaction (all or none) and answers every name the
/// organization has afterwards, in order.
pub async fn apply_secret_changes(
    db: &impl TransactionTrait,
    org_id: &OrgId,
    changes: Vec<SecretChange>,
) -> Result<Vec<String>, DbErr> {
    let txn = db.begin().await?;
    let now = Utc::now();
    for change in changes {
        match change.sealed {
            None => {
                org_secret::Entity::delete_by_id((org_id.to_owned(), change.name))
                    .exec(&txn)
                    .await?;
            }
            Some(sealed) => {
                org_secret::Entity::insert(org_secret::ActiveModel {
                    org_id: Set(org_id.to_owned()),
                    name: Set(change.name),
                    sealed: Set(sealed),
                    updated_at: Set(now),
                })
                .on_conflict(
                    OnConflict::columns([org_secret::Column::OrgId, org_secret::Column::Name])
                        .update_columns([org_secret::Column::Sealed, org_secret::Column::UpdatedAt])
                        .to_owned(),
                )
                .exec_without_returning(&txn)
                .await?;
            }
        }
    }
    let names = org_secret::Entity::find()
        .filter(org_secret::Column::OrgId.eq(org_id))
        .order_by_asc(org_secret::Column::Name)
        .all(&txn)
        .await?
        .into_iter()
        .map(|s| s.name)
        .collect();
    txn.commit().await?;
    Ok(names)
}

/// The organization's sealed secrets.
pub async fn sealed_secrets(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
) -> Result<Vec<org_secret::Model>, DbErr> {
    org_secret::Entity::find()
        .filter(org_secret::Column::OrgId.eq(org_id))
        .all(db)
        .await
}
