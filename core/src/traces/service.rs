//! The export walk, shared by the JSON API, the CLI (through the API) and the console.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use entities::trace;

use super::export::{self, Format};
use super::marks::{self, Marks};
use super::otlp;
use super::repo;
use super::TraceError;
use crate::domain::{OrgId, ProjectId, TraceId};
use sea_orm::ConnectionTrait;

/// What a page of an export wrote: its records' count, the traces skipped (no pair to
/// convert), and where the next page starts (`None` at the end).
#[derive(Default)]
pub struct PageStats {
    pub count: usize,
    pub skipped: usize,
    pub next_cursor: Option<Cursor>,
}

/// Content read from the database at once at most (a chunk of a page), in characters; a
/// trace larger than this is read alone.
const CHUNK_CHARS: i64 = 4 << 20;

/// Writes one trace's record after `sep` (none before the first), or counts it skipped.
fn write_record(
    t: &trace::Model,
    marks: Option<&Marks>,
    format: Format,
    out: &mut Vec<u8>,
    sep: &[u8],
    stats: &mut PageStats,
) -> Result<(), TraceError> {
    match export::convert(t, format, marks.unwrap_or(&Marks::default())) {
        Some(record) => {
            // OTLP: the page's spans make one document (`finish_page` closes it).
            match (format, stats.count) {
                (Format::OtlpJson, 0) => out.extend_from_slice(otlp::document_head().as_bytes()),
                (Format::OtlpJson, _) => out.push(b','),
                (_, 0) => {}
                _ => out.extend_from_slice(sep),
            }
            serde_json::to_writer(&mut *out, &record)?;
            stats.count += 1;
        }
        None => stats.skipped += 1,
    }
    Ok(())
}

/// Ends a page's records: an OTLP document is closed.
fn finish_page(format: Format, out: &mut Vec<u8>, stats: &PageStats) {
    if format == Format::OtlpJson && stats.count > 0 {
        out.extend_from_slice(otlp::DOCUMENT_TAIL.as_bytes());
    }
}

/// Where an export walk stands: the last trace it gave, `(created_at, id)`, exact to the
/// nanosecond so the next page starts right after it. Opaque to clients; written
/// `<seconds>-<nanoseconds>-<id without dashes>`, so that every string of that pattern (the
/// schema's) is a position to walk from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cursor {
    pub at: DateTime<Utc>,
    pub id: TraceId,
}

impl Cursor {
    pub fn after(trace: &trace::Model) -> Self {
        Self {
            at: trace.created_at,
            id: trace.id.clone(),
        }
    }

    /// The schema's pattern of a cursor.
    pub const PATTERN: &'static str = crate::paging::Keyset::PATTERN;

    pub fn encode(&self) -> String {
        crate::paging::Keyset::new(self.at, self.id.as_str()).encode()
    }

    pub fn decode(raw: &str) -> Option<Self> {
        let keyset = crate::paging::Keyset::decode(raw)?;
        Some(Self {
            at: keyset.at,
            id: TraceId::parse(&keyset.id).ok()?,
        })
    }
}

/// Writes the project's newest `limit` traces that `filter` keeps, after `cursor` when
/// given, to `out` as records separated by `sep`; 404 unless the project is one of `orgs'`.
/// A page also ends once `out` has grown by `traces.export_max_page_bytes` (its next cursor
/// then starts right after the last trace written). Content is read a chunk of a few MiB at a
/// time and each trace dropped once written, so a page holds about its own size in memory.
#[allow(clippy::too_many_arguments)]
#[tracing::instrument(level = "debug", skip_all, fields(project_id = %project_id))]
pub async fn export_project(
    db: &impl ConnectionTrait,
    max_page_bytes: usize,
    orgs: &[OrgId],
    project_id: &ProjectId,
    format: Format,
    limit: u64,
    mut filter: repo::TraceFilter,
    cursor: Option<Cursor>,
    out: &mut Vec<u8>,
    sep: &[u8],
) -> Result<PageStats, TraceError> {
    crate::projects::repo::find_in_orgs(db, project_id, orgs)
        .await?
        .ok_or(TraceError::ProjectNotFound)?;
    filter.before = cursor.map(|c| (c.at, c.id));
    let max_bytes = max_page_bytes.max(1);
    let mut sizes = repo::export_sizes(db, project_id, &filter, limit + 1).await?;
    let more = sizes.len() as u64 > limit;
    sizes.truncate(limit as usize);
    let start = out.len();
    let mut stats = PageStats::default();
    let mut last: Option<Cursor> = None;
    let mut next = 0;
    'page: while next < sizes.len() {
        let mut end = next;
        let mut chars = 0;
        while end < sizes.len() && (end == next || chars + sizes[end].2 <= CHUNK_CHARS) {
            chars += sizes[end].2;
            end += 1;
        }
        let ids: Vec<TraceId> = sizes[next..end].iter().map(|(id, _, _)| id.clone()).collect();
        let mut found: HashMap<TraceId, trace::Model> = repo::by_ids(db, &ids)
            .await?
            .into_iter()
            .map(|t| (t.id.clone(), t))
            .collect();
        // `raw` carries each trace's tags and scores.
        let marked = match format {
            Format::Raw | Format::OtlpJson => marks::marks_of(db, &ids).await?,
            _ => HashMap::new(),
        };
        for (id, at, _) in &sizes[next..end] {
            if out.len() - start >= max_bytes {
                break 'page;
            }
            // A trace deleted since the page was sized is simply gone.
            if let Some(t) = found.remove(id) {
                write_record(&t, marked.get(id), format, out, sep, &mut stats)?;
            }
            last = Some(Cursor {
                at: *at,
                id: id.clone(),
            });
            next += 1;
        }
    }
    finish_page(format, out, &stats);
    stats.next_cursor = if more || next < sizes.len() { last } else { None };
    Ok(stats)
}

/// Selected traces read from the database at once.
const SELECTION_CHUNK: usize = 8;

/// What a selection's export wrote.
pub struct Selection {
    pub stats: PageStats,
    /// Their one project, if they all share one.
    pub project_id: Option<ProjectId>,
    /// Asked ids that are not the caller's organizations'.
    pub not_found: usize,
}

/// Writes the selected traces (in the order asked, repeats once) to `out` as records
/// separated by `sep`. A selection whose records pass `traces.export_max_page_bytes` is 422:
/// it has no cursor to go on with, so the caller selects fewer.
#[allow(clippy::too_many_arguments)]
#[tracing::instrument(level = "debug", skip_all)]
pub async fn export_selection(
    db: &impl ConnectionTrait,
    max_page_bytes: usize,
    orgs: &[OrgId],
    trace_ids: &[TraceId],
    format: Format,
    filter: &repo::TraceFilter,
    out: &mut Vec<u8>,
    sep: &[u8],
) -> Result<Selection, TraceError> {
    let max_bytes = max_page_bytes.max(1);
    let mut seen = HashSet::new();
    let wanted: Vec<TraceId> = trace_ids.iter().filter(|id| seen.insert(*id)).cloned().collect();
    let start = out.len();
    let mut stats = PageStats::default();
    let mut project: Option<Option<ProjectId>> = None;
    let mut exported = 0;
    for ids in wanted.chunks(SELECTION_CHUNK) {
        let mut found: HashMap<TraceId, trace::Model> = repo::find_in_orgs(db, ids, orgs, filter)
            .await?
            .into_iter()
            .map(|t| (t.id.clone(), t))
            .collect();
        let marked = match format {
            Format::Raw | Format::OtlpJson => marks::marks_of(db, ids).await?,
            _ => HashMap::new(),
        };
        for id in ids {
            let Some(t) = found.remove(id) else { continue };
            exported += 1;
            project = Some(match project {
                None => Some(t.project_id.clone()),
                Some(p) => p.filter(|p| *p == t.project_id),
            });
            write_record(&t, marked.get(id), format, out, sep, &mut stats)?;
            if out.len() - start > max_bytes {
                return Err(TraceError::SelectionTooLarge { max_bytes });
            }
        }
    }
    finish_page(format, out, &stats);
    Ok(Selection {
        not_found: wanted.len() - exported,
        project_id: project.flatten(),
        stats,
    })
}

/// Every project of `orgs` that has traces: its id, name, trace count and newest trace's time.
#[tracing::instrument(level = "debug", skip_all)]
pub async fn projects_with_traces(
    db: &impl ConnectionTrait,
    orgs: &[OrgId],
) -> Result<Vec<super::ProjectTraces>, TraceError> {
    Ok(repo::projects_with_traces(db, orgs).await?)
}

/// The models the project's traces name, for a filter's choices.
#[tracing::instrument(level = "debug", skip_all, fields(project_id = %project_id))]
pub async fn models_of_project(
    db: &impl ConnectionTrait,
    project_id: &ProjectId,
) -> Result<Vec<String>, TraceError> {
    Ok(repo::models_of_project(db, project_id).await?)
}

#[cfg(test)]
mod tests {
    use super::{Cursor, TraceId};

    #[test]
    fn a_cursor_round_trips_to_the_nanosecond_and_nonsense_is_refused() {
        let at = chrono::DateTime::from_timestamp(1_795_000_000, 123_456_789).expect("a time");
        let cursor = Cursor {
            at,
            id: TraceId::parse("0192f0c4-7e1a-7c3b-8d2e-1f2a3b4c5d6e").unwrap(),
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
