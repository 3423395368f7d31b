//! The export walk, shared by the JSON API, the CLI (through the API) and the console.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
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

/// Where an export walk stands: the last trace it gave, `(created_at, id)`, exact to the
/// nanosecond so the next page starts right after it. Opaque to clients; written
/// `<seconds>-<nanoseconds>-<id without dashes>`, so that every string of that pattern (the
/// schema's) is a position to walk from.
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

    /// The schema's pattern of a cursor.
    pub const PATTERN: &'static str = "^[0-9]{1,12}-[0-9]{9}-[0-9a-f]{32}$";

    pub fn encode(&self) -> String {
        let id =
            uuid::Uuid::parse_str(&self.id).map_or_else(|_| self.id.clone(), |id| id.simple().to_string());
        format!(
            "{}-{:09}-{id}",
            self.at.timestamp(),
            self.at.timestamp_subsec_nanos()
        )
    }

    pub fn decode(raw: &str) -> Option<Self> {
        let mut parts = raw.splitn(3, '-');
        let (secs, nanos, id) = (parts.next()?, parts.next()?, parts.next()?);
        let digits =
            |s: &str, max: usize| !s.is_empty() && s.len() <= max && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(secs, 12) || nanos.len() != 9 || !digits(nanos, 9) || id.len() != 32 {
            return None;
        }
        if !id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return None;
        }
        let at = DateTime::from_timestamp(secs.parse().ok()?, nanos.parse().ok()?)?;
        let id = uuid::Uuid::parse_str(id).ok()?.hyphenated().to_string();
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
    let mut found: HashMap<String, trace::Model> = repo::find_in_orgs(&state.db, &wanted, orgs, filter)
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

#[cfg(test)]
mod tests {
    use super::Cursor;

    #[test]
    fn a_cursor_round_trips_to_the_nanosecond_and_nonsense_is_refused() {
        let at = chrono::DateTime::from_timestamp(1_795_000_000, 123_456_789).expect("a time");
        let cursor = Cursor {
            at,
            id: "0192f0c4-7e1a-7c3b-8d2e-1f2a3b4c5d6e".into(),
        };
        let encoded = cursor.encode();
        assert_eq!(encoded, "1795000000-123456789-0192f0c47e1a7c3b8d2e1f2a3b4c5d6e");
        assert!(regex::Regex::new(Cursor::PATTERN)
            .expect("a regex")
            .is_match(&encoded));
        assert_eq!(Cursor::decode(&encoded), Some(cursor));
        for bad in [
            "",
            "x",
            "1-2-3",
            "1795000000-12345678-0192f0c47e1a7c3b8d2e1f2a3b4c5d6e",
            "1-123456789-0192F0C47E1A7C3B8D2E1F2A3B4C5D6E",
        ] {
            assert_eq!(Cursor::decode(bad), None, "{bad}");
        }
    }
}
