//! Looking at traces: a project's list (filtered, searched, paged newest first) and one
//! trace whole, each with its tags and scores.

use entities::trace;
use sea_orm::ConnectionTrait;

use super::marks::{self, Marks};
use super::repo::{self, ListedTrace, TraceFilter};
use super::service::Cursor;
use super::TraceError;
use crate::domain::{OrgId, ProjectId, TraceId};

/// A listed trace with its marks.
pub struct Listed {
    pub trace: ListedTrace,
    pub marks: Marks,
}

/// A page of the list and where the next starts.
pub struct Page {
    pub traces: Vec<Listed>,
    pub next_cursor: Option<Cursor>,
}

/// The project's newest `limit` traces that `filter` keeps, after `cursor`; 404 unless the
/// project is one of `orgs'`.
pub async fn list(
    db: &impl ConnectionTrait,
    orgs: &[OrgId],
    project_id: &ProjectId,
    mut filter: TraceFilter,
    cursor: Option<Cursor>,
    limit: u64,
) -> Result<Page, TraceError> {
    crate::projects::repo::find_in_orgs(db, project_id, orgs)
        .await?
        .ok_or(TraceError::ProjectNotFound)?;
    filter.before = cursor.map(|c| (c.at, c.id));
    let mut rows = repo::list_page(db, project_id, &filter, limit + 1).await?;
    let more = rows.len() as u64 > limit;
    rows.truncate(limit as usize);
    let ids: Vec<TraceId> = rows.iter().map(|t| t.id.clone()).collect();
    let mut marks = marks::marks_of(db, &ids).await?;
    let next_cursor = more
        .then(|| {
            rows.last().map(|t| Cursor {
                at: t.created_at,
                id: t.id.clone(),
            })
        })
        .flatten();
    Ok(Page {
        traces: rows
            .into_iter()
            .map(|trace| Listed {
                marks: marks.remove(&trace.id).unwrap_or_default(),
                trace,
            })
            .collect(),
        next_cursor,
    })
}

/// One trace of `orgs`, whole, with its marks (404 for another organization's).
pub async fn get(
    db: &impl ConnectionTrait,
    orgs: &[OrgId],
    id: &TraceId,
) -> Result<(trace::Model, Marks), TraceError> {
    let trace = repo::find_in_orgs(db, std::slice::from_ref(id), orgs, &TraceFilter::default())
        .await?
        .into_iter()
        .next()
        .ok_or(TraceError::TraceNotFound)?;
    let marks = marks::marks_of(db, std::slice::from_ref(id))
        .await?
        .remove(id)
        .unwrap_or_default();
    Ok((trace, marks))
}

/// How many of the project's traces `filter` keeps; 404 unless the project is one of
/// `orgs'`.
pub async fn count(
    db: &impl ConnectionTrait,
    orgs: &[OrgId],
    project_id: &ProjectId,
    filter: &TraceFilter,
) -> Result<u64, TraceError> {
    crate::projects::repo::find_in_orgs(db, project_id, orgs)
        .await?
        .ok_or(TraceError::ProjectNotFound)?;
    Ok(repo::count_matching(db, project_id, filter).await?)
}

/// The newest `limit` of the project's traces `filter` keeps, their ids only (a selection
/// of "every trace the filter keeps").
pub async fn ids_matching(
    db: &impl ConnectionTrait,
    orgs: &[OrgId],
    project_id: &ProjectId,
    filter: TraceFilter,
    limit: u64,
) -> Result<Vec<TraceId>, TraceError> {
    let page = list(db, orgs, project_id, filter, None, limit).await?;
    Ok(page.traces.into_iter().map(|l| l.trace.id).collect())
}

/// The traces either side of `trace` in its project's list under `filter` (newest first):
/// `(newer, older)`.
pub async fn neighbours(
    db: &impl ConnectionTrait,
    trace: &trace::Model,
    filter: &TraceFilter,
) -> Result<(Option<TraceId>, Option<TraceId>), TraceError> {
    let newer = repo::neighbour(db, &trace.project_id, filter, trace.created_at, &trace.id, false).await?;
    let older = repo::neighbour(db, &trace.project_id, filter, trace.created_at, &trace.id, true).await?;
    Ok((newer, older))
}
