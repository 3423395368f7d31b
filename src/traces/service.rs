//! The export walk, shared by the JSON API, the CLI (through the API) and the console.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, SecondsFormat, Utc};
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

/// Where an export walk stands: the last trace it gave, `(created_at, id)`. Opaque to
/// clients (hex), exact to the nanosecond, so the next page starts right after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub at: DateTime<Utc>,
    pub id: String,
}

impl Cursor {
    pub fn after(trace: &trace::Model) -> Self {
        Self {
            at: trace.created_at,
            id: trace.id.clone(),
        }
    }

    pub fn encode(&self) -> String {
        hex::encode(format!(
            "{}|{}",
            self.at.to_rfc3339_opts(SecondsFormat::Nanos, true),
            self.id
        ))
    }

    pub fn decode(raw: &str) -> Option<Self> {
        let text = String::from_utf8(hex::decode(raw).ok()?).ok()?;
        let (at, id) = text.split_once('|')?;
        let id = uuid::Uuid::parse_str(id).ok()?.hyphenated().to_string();
        let at = DateTime::parse_from_rfc3339(at).ok()?.with_timezone(&Utc);
        Some(Self { at, id })
    }
}

/// A page of an export and the cursor of the next one (`None` at the end).
pub struct ExportPage {
    pub export: Export,
    pub next_cursor: Option<Cursor>,
}

/// The project's newest `limit` traces that `filter` keeps, after `cursor` when given; 404
/// unless the project is one of `orgs`'.
pub async fn export_project(
    state: &AppState,
    orgs: &[OrgId],
    project_id: &str,
    format: Format,
    limit: u64,
    mut filter: repo::TraceFilter,
    cursor: Option<Cursor>,
) -> ApiResult<ExportPage> {
    crate::projects::repo::find_in_orgs(&state.db, project_id, orgs)
        .await?
        .ok_or_else(|| ApiError::not_found("project"))?;
    filter.before = cursor.map(|c| (c.at, c.id));
    let mut traces = repo::export_page(&state.db, project_id, &filter, limit + 1).await?;
    let more = traces.len() as u64 > limit;
    traces.truncate(limit as usize);
    let next_cursor = more.then(|| traces.last().map(Cursor::after)).flatten();
    Ok(ExportPage {
        export: convert_all(&traces, format),
        next_cursor,
    })
}

/// A selection of traces, exported in the order asked (repeats once).
pub struct Selection {
    pub export: Export,
    /// Their one project, if they all share one.
    pub project_id: Option<String>,
    /// Asked ids that are not the caller's organizations'.
    pub not_found: usize,
}

/// Whether `filter` keeps the trace (a selection's filters, applied to what was found).
fn keeps(filter: &repo::TraceFilter, t: &trace::Model) -> bool {
    filter.model.as_ref().is_none_or(|m| t.model.as_ref() == Some(m))
        && filter
            .ok
            .is_none_or(|ok| (200..300).contains(&t.status_code) == ok)
        && filter.since.is_none_or(|since| t.created_at >= since)
        && filter.until.is_none_or(|until| t.created_at < until)
}

pub async fn export_selection(
    state: &AppState,
    orgs: &[OrgId],
    trace_ids: &[TraceId],
    format: Format,
    filter: &repo::TraceFilter,
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
    let traces: Vec<trace::Model> = wanted
        .iter()
        .filter_map(|id| found.remove(id))
        .filter(|t| keeps(filter, t))
        .collect();
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
