//! The export walk, shared by the JSON API, the CLI (through the API) and the console.

use std::collections::{HashMap, HashSet};

use entities::trace;
use serde_json::Value;

use super::export::{self, Format};
use super::repo;
use crate::domain::{OrgId, TraceId};
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// Converted traces: the records and how many traces had no pair to convert.
pub struct Export {
    pub records: Vec<Value>,
    pub skipped: usize,
}

fn convert_all(traces: &[trace::Model], format: Format) -> Export {
    let records: Vec<Value> = traces.iter().filter_map(|t| export::convert(t, format)).collect();
    Export {
        skipped: traces.len() - records.len(),
        records,
    }
}

/// The project's newest `limit` traces; 404 unless the project is one of `orgs`'.
pub async fn export_project(
    state: &AppState,
    orgs: &[OrgId],
    project_id: &str,
    format: Format,
    limit: u64,
) -> ApiResult<Export> {
    crate::projects::repo::find_in_orgs(&state.db, project_id, orgs)
        .await?
        .ok_or_else(|| ApiError::not_found("project"))?;
    let traces = repo::newest_of_project(&state.db, project_id, limit).await?;
    Ok(convert_all(&traces, format))
}

/// A selection of traces, exported in the order asked (repeats once).
pub struct Selection {
    pub export: Export,
    /// Their one project, if they all share one.
    pub project_id: Option<String>,
    /// Asked ids that are not the caller's organizations'.
    pub not_found: usize,
}

pub async fn export_selection(
    state: &AppState,
    orgs: &[OrgId],
    trace_ids: &[TraceId],
    format: Format,
) -> ApiResult<Selection> {
    let mut seen = HashSet::new();
    let wanted: Vec<String> = trace_ids
        .iter()
        .filter(|id| seen.insert(*id))
        .map(|id| id.as_str().to_owned())
        .collect();
    let mut found: HashMap<String, trace::Model> = repo::find_in_orgs(&state.db, &wanted, orgs)
        .await?
        .into_iter()
        .map(|t| (t.id.clone(), t))
        .collect();
    let traces: Vec<trace::Model> = wanted.iter().filter_map(|id| found.remove(id)).collect();
    let project_id = traces
        .first()
        .map(|t| t.project_id.clone())
        .filter(|p| traces.iter().all(|t| &t.project_id == p));
    Ok(Selection {
        not_found: wanted.len() - traces.len(),
        project_id,
        export: convert_all(&traces, format),
    })
}
