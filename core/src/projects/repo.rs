//! Projects of organizations.

use chrono::Utc;
use entities::project;
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect,
};

use crate::domain::{OrgId, ProjectId};

pub async fn insert(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    name: &str,
    slug: &str,
    description: Option<&str>,
) -> Result<project::Model, DbErr> {
    let row = project::Model {
        id: ProjectId::generate(),
        org_id: org_id.to_owned(),
        name: name.to_owned(),
        slug: slug.to_owned(),
        description: description.map(str::to_owned),
        active: true,
        created_at: Utc::now(),
        trace_retention_days: None,
    };
    project::Entity::insert(project::ActiveModel {
        id: Set(row.id.clone()),
        org_id: Set(row.org_id.clone()),
        name: Set(row.name.clone()),
        slug: Set(row.slug.clone()),
        description: Set(row.description.clone()),
        active: Set(row.active),
        created_at: Set(row.created_at),
        trace_retention_days: Set(None),
    })
    .exec_without_returning(db)
    .await?;
    Ok(row)
}

pub async fn list_for_orgs(
    db: &impl ConnectionTrait,
    org_ids: &[OrgId],
) -> Result<Vec<project::Model>, DbErr> {
    if org_ids.is_empty() {
        return Ok(Vec::new());
    }
    project::Entity::find()
        .filter(project::Column::OrgId.is_in(org_ids.iter().cloned()))
        .order_by_asc(project::Column::CreatedAt)
        .order_by_asc(project::Column::Id)
        .all(db)
        .await
}

/// A project of one of `org_ids`; another organization's project is "not found".
pub async fn find_in_orgs(
    db: &impl ConnectionTrait,
    project_id: &ProjectId,
    org_ids: &[OrgId],
) -> Result<Option<project::Model>, DbErr> {
    Ok(project::Entity::find_by_id(project_id.clone())
        .one(db)
        .await?
        .filter(|p| org_ids.contains(&p.org_id)))
}

/// Which of `project_ids` are projects of the organization.
pub async fn ids_in_org(
    db: &impl ConnectionTrait,
    project_ids: &[ProjectId],
    org_id: &OrgId,
) -> Result<std::collections::HashSet<ProjectId>, DbErr> {
    let mut known = std::collections::HashSet::new();
    for chunk in project_ids.chunks(500) {
        let found: Vec<ProjectId> = project::Entity::find()
            .select_only()
            .column(project::Column::Id)
            .filter(project::Column::Id.is_in(chunk.iter().cloned()))
            .filter(project::Column::OrgId.eq(org_id))
            .into_tuple()
            .all(db)
            .await?;
        known.extend(found);
    }
    Ok(known)
}

/// The project of one organization (project ids in any UUID spelling); another
/// organization's is "not found".
pub async fn find_in_org(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    project_id: &ProjectId,
) -> Result<Option<project::Model>, DbErr> {
    find_in_orgs(db, project_id, std::slice::from_ref(org_id)).await
}

/// A project by id, whichever organization's.
pub async fn find(
    db: &impl ConnectionTrait,
    project_id: &ProjectId,
) -> Result<Option<project::Model>, DbErr> {
    project::Entity::find_by_id(project_id.clone()).one(db).await
}

/// Sets how many days the project keeps its traces (`None`: forever).
pub async fn set_trace_retention(
    db: &impl ConnectionTrait,
    project_id: &ProjectId,
    days: Option<i32>,
) -> Result<(), DbErr> {
    project::Entity::update_many()
        .col_expr(
            project::Column::TraceRetentionDays,
            sea_orm::sea_query::Expr::value(days),
        )
        .filter(project::Column::Id.eq(project_id))
        .exec(db)
        .await?;
    Ok(())
}
