//! Trace queries (the writer's inserts are in [`super::writer`]'s statements module).

use chrono::{DateTime, Utc};
use entities::{project, trace};
use sea_orm::sea_query::{Expr, Func};
use sea_orm::{ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect};

/// A project with traces: `(project id, its name, how many, the newest's time)`.
pub type ProjectTraces = (String, String, i64, DateTime<Utc>);

/// The organizations' projects that have traces, most recently recorded first.
pub async fn projects_with_traces(
    db: &impl ConnectionTrait,
    orgs: &[String],
) -> Result<Vec<ProjectTraces>, DbErr> {
    if orgs.is_empty() {
        return Ok(Vec::new());
    }
    let counts: Vec<(String, i64, DateTime<Utc>)> = trace::Entity::find()
        .select_only()
        .column(trace::Column::ProjectId)
        .column_as(
            Expr::from(Func::count(Expr::col(trace::Column::Id))),
            "trace_count",
        )
        .column_as(
            Expr::from(Func::max(Expr::col(trace::Column::CreatedAt))),
            "last_trace_at",
        )
        .filter(trace::Column::OrgId.is_in(orgs.iter().cloned()))
        .group_by(trace::Column::ProjectId)
        .into_tuple()
        .all(db)
        .await?;
    let names: std::collections::HashMap<String, String> = project::Entity::find()
        .filter(project::Column::Id.is_in(counts.iter().map(|(id, _, _)| id.clone())))
        .all(db)
        .await?
        .into_iter()
        .map(|p| (p.id, p.name))
        .collect();
    let mut projects: Vec<ProjectTraces> = counts
        .into_iter()
        .map(|(project_id, count, last)| {
            let name = names.get(&project_id).cloned().unwrap_or_default();
            (project_id, name, count, last)
        })
        .collect();
    projects.sort_by_key(|p| std::cmp::Reverse(p.3));
    Ok(projects)
}

/// The project's newest traces, newest first.
pub async fn newest_of_project(
    db: &impl ConnectionTrait,
    project_id: &str,
    limit: u64,
) -> Result<Vec<trace::Model>, DbErr> {
    trace::Entity::find()
        .filter(trace::Column::ProjectId.eq(project_id))
        .order_by_desc(trace::Column::CreatedAt)
        .order_by_desc(trace::Column::Id)
        .limit(limit)
        .all(db)
        .await
}

/// Those of `ids` that belong to one of `orgs`, in no particular order.
pub async fn find_in_orgs(
    db: &impl ConnectionTrait,
    ids: &[String],
    orgs: &[String],
) -> Result<Vec<trace::Model>, DbErr> {
    trace::Entity::find()
        .filter(trace::Column::Id.is_in(ids.iter().cloned()))
        .filter(trace::Column::OrgId.is_in(orgs.iter().cloned()))
        .all(db)
        .await
}
