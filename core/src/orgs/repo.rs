//! Organizations, their members and adapters.

use chrono::Utc;
use entities::{adapter, membership, organization, user};
use sea_orm::sea_query::OnConflict;
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect,
    QueryTrait, SqlErr, TransactionSession, TransactionTrait,
};

use crate::auth::Role;
use crate::domain::{OrgId, UserId};

pub fn is_unique_violation(err: &DbErr) -> bool {
    matches!(err.sql_err(), Some(SqlErr::UniqueConstraintViolation(_)))
}

/// A slug from a display name: transliterated to ASCII (`中文` → `zhong-wen`), then lowercase
/// letters, digits and single dashes, at most 80 characters; `None` when nothing is left.
pub fn slugify(name: &str) -> Option<String> {
    let mut slug = String::new();
    for c in deunicode::deunicode(name).chars().flat_map(char::to_lowercase) {
        if c.is_ascii_alphanumeric() {
            slug.push(c);
        } else if !slug.is_empty() && !slug.ends_with('-') {
            slug.push('-');
        }
    }
    let slug: String = slug.trim_end_matches('-').chars().take(80).collect();
    let slug = slug.trim_end_matches('-').to_owned();
    (!slug.is_empty()).then_some(slug)
}

/// The slug a name derives, or `<fallback>-<6 hex>` for a name of which nothing is left.
pub fn derived_slug(name: &str, fallback: &str) -> String {
    slugify(name).unwrap_or_else(|| with_suffix(fallback))
}

/// `base` with a short random suffix, for a derived slug that is taken.
pub fn with_suffix(base: &str) -> String {
    format!("{base}-{}", &uuid::Uuid::new_v4().simple().to_string()[..6])
}

pub async fn upsert_user(
    db: &impl ConnectionTrait,
    user_id: &UserId,
    email: Option<&str>,
) -> Result<(), DbErr> {
    let row = user::ActiveModel {
        id: Set(user_id.to_owned()),
        email: Set(email.map(str::to_owned)),
        created_at: Set(Utc::now()),
    };
    let mut on_conflict = OnConflict::column(user::Column::Id);
    if email.is_some() {
        on_conflict.update_column(user::Column::Email);
    } else {
        on_conflict.do_nothing();
    }
    user::Entity::insert(row)
        .on_conflict(on_conflict.to_owned())
        .exec_without_returning(db)
        .await?;
    Ok(())
}

pub struct CreatedOrg {
    pub org_id: OrgId,
    pub slug: String,
}

pub async fn org_exists(db: &impl ConnectionTrait, org_id: &OrgId) -> Result<bool, DbErr> {
    Ok(organization::Entity::find_by_id(org_id.to_owned())
        .one(db)
        .await?
        .is_some())
}

/// Deletes the organization and, by its foreign keys' cascades, everything it owns; its jobs'
/// attempts (a table without a foreign key, for the report path's sake) go in the same
/// transaction.
pub async fn delete_org(db: &impl TransactionTrait, org_id: &OrgId) -> Result<bool, DbErr> {
    let txn = db.begin().await?;
    let jobs = entities::training_job::Entity::find()
        .select_only()
        .column(entities::training_job::Column::Id)
        .filter(entities::training_job::Column::OrgId.eq(org_id))
        .into_query();
    entities::training_job_attempt::Entity::delete_many()
        .filter(entities::training_job_attempt::Column::JobId.in_subquery(jobs))
        .exec(&txn)
        .await?;
    let result = organization::Entity::delete_by_id(org_id.to_owned())
        .exec(&txn)
        .await?;
    txn.commit().await?;
    Ok(result.rows_affected > 0)
}

pub async fn set_role(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    user_id: &UserId,
    role: Role,
) -> Result<(), DbErr> {
    membership::Entity::insert(membership::ActiveModel {
        org_id: Set(org_id.to_owned()),
        user_id: Set(user_id.to_owned()),
        role: Set(role.as_str().to_owned()),
        created_at: Set(Utc::now()),
    })
    .on_conflict(
        OnConflict::columns([membership::Column::OrgId, membership::Column::UserId])
            .update_column(membership::Column::Role)
            .to_owned(),
    )
    .exec_without_returning(db)
    .await?;
    Ok(())
}

/// Creates or re-attributes an adapter. `live: None` keeps the stored value (false when new).
pub async fn upsert_adapter(
    db: &impl ConnectionTrait,
    adapter_id: &str,
    org_id: &OrgId,
    base_model: &str,
    live: Option<bool>,
) -> Result<adapter::Model, DbErr> {
    let existing = adapter::Entity::find_by_id(adapter_id.to_owned()).one(db).await?;
    let now = Utc::now();
    let live = live.unwrap_or_else(|| existing.as_ref().is_some_and(|a| a.live));
    let row = adapter::ActiveModel {
        id: Set(adapter_id.to_owned()),
        org_id: Set(org_id.to_owned()),
        base_model: Set(base_model.to_owned()),
        live: Set(live),
        created_at: Set(existing.as_ref().map_or(now, |a| a.created_at)),
        updated_at: Set(now),
    };
    adapter::Entity::insert(row)
        .on_conflict(
            OnConflict::column(adapter::Column::Id)
                .update_columns([
                    adapter::Column::OrgId,
                    adapter::Column::BaseModel,
                    adapter::Column::Live,
                    adapter::Column::UpdatedAt,
                ])
                .to_owned(),
        )
        .exec_without_returning(db)
        .await?;
    adapter::Entity::find_by_id(adapter_id.to_owned())
        .one(db)
        .await?
        .ok_or_else(|| DbErr::RecordNotFound(adapter_id.to_owned()))
}

pub async fn find_adapter(
    db: &impl ConnectionTrait,
    adapter_id: &str,
) -> Result<Option<adapter::Model>, DbErr> {
    adapter::Entity::find_by_id(adapter_id.to_owned()).one(db).await
}

/// The ids of the organization's live adapters, in order.
pub async fn live_adapter_ids(db: &impl ConnectionTrait, org_id: &OrgId) -> Result<Vec<String>, DbErr> {
    Ok(adapter::Entity::find()
        .filter(adapter::Column::OrgId.eq(org_id))
        .filter(adapter::Column::Live.eq(true))
        .order_by_asc(adapter::Column::Id)
        .all(db)
        .await?
        .into_iter()
        .map(|a| a.id)
        .collect())
}

/// Marks the organization's adapter as no longer live.
pub async fn mark_undeployed(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    adapter_id: &str,
) -> Result<(), DbErr> {
    adapter::Entity::update_many()
        .col_expr(adapter::Column::Live, false.into())
        .col_expr(adapter::Column::UpdatedAt, Utc::now().into())
        .filter(adapter::Column::Id.eq(adapter_id))
        .filter(adapter::Column::OrgId.eq(org_id))
        .exec(db)
        .await?;
    Ok(())
}

pub async fn delete_adapter(db: &impl ConnectionTrait, adapter_id: &str) -> Result<bool, DbErr> {
    let result = adapter::Entity::delete_by_id(adapter_id.to_owned())
        .exec(db)
        .await?;
    Ok(result.rows_affected > 0)
}

pub async fn find_org(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
) -> Result<Option<organization::Model>, DbErr> {
    organization::Entity::find_by_id(org_id.to_owned()).one(db).await
}

/// The oldest organization with exactly this name, if any.
pub async fn find_org_by_name(
    db: &impl ConnectionTrait,
    name: &str,
) -> Result<Option<organization::Model>, DbErr> {
    organization::Entity::find()
        .filter(organization::Column::Name.eq(name))
        .order_by_asc(organization::Column::CreatedAt)
        .one(db)
        .await
}

/// Every organization, by name.
pub async fn all_orgs(db: &impl ConnectionTrait) -> Result<Vec<organization::Model>, DbErr> {
    organization::Entity::find()
        .order_by_asc(organization::Column::Name)
        .all(db)
        .await
}

/// The organization's members with their e-mail, owners first.
pub async fn members_of(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
) -> Result<Vec<(membership::Model, Option<String>)>, DbErr> {
    let members = membership::Entity::find()
        .filter(membership::Column::OrgId.eq(org_id))
        .order_by_desc(membership::Column::Role)
        .order_by_asc(membership::Column::CreatedAt)
        .all(db)
        .await?;
    let emails: std::collections::HashMap<UserId, Option<String>> = user::Entity::find()
        .filter(user::Column::Id.is_in(members.iter().map(|m| m.user_id.clone())))
        .all(db)
        .await?
        .into_iter()
        .map(|u| (u.id, u.email))
        .collect();
    Ok(members
        .into_iter()
        .map(|m| {
            let email = emails.get(&m.user_id).cloned().flatten();
            (m, email)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_transliterated_and_nothing_left_falls_back_to_a_suffix() {
        assert_eq!(slugify("Acme Robotics!").as_deref(), Some("acme-robotics"));
        assert_eq!(slugify("中文").as_deref(), Some("zhong-wen"));
        assert_eq!(slugify("Café Zoë").as_deref(), Some("cafe-zoe"));
        for nothing in ["%", "   ", "--", ""] {
            assert_eq!(slugify(nothing), None, "{nothing:?}");
        }
        let fallback = derived_slug("%", "project");
        assert!(
            fallback.starts_with("project-") && fallback.len() == 14,
            "{fallback}"
        );
        assert_ne!(derived_slug("%", "project"), fallback);
        let long = slugify(&"ab ".repeat(60)).unwrap();
        assert!(long.len() <= 80 && !long.ends_with('-'), "{long}");
    }
}
