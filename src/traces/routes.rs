//! `GET /api/traces/projects`, `GET` and `POST /api/traces/export`.

use actix_web::HttpResponse;

use super::dto::{
    ExportQuery, TraceProject, TraceProjectsResponse, TraceSelectionBody, TracesExportResponse,
};
use super::export::Format;
use super::{repo, service, MAX_EXPORT};
use crate::auth::Caller;
use crate::domain::ProjectId;
use crate::error::{ApiResult, ErrorBody, ValidationErrorBody};
use crate::http::extract::{ValidJson, ValidQuery};

/// List projects with traces
///
/// Projects of the caller's organizations with their trace counts and the time of their newest
/// trace.
#[utoipa::path(get, path = "/api/traces/projects", tag = "traces", security(("apiKey" = []), ("session" = [])),
    params(("orgId" = Option<String>, Query, description = "Only this organization's projects")),
    responses((status = 200, body = TraceProjectsResponse), (status = 401, body = ErrorBody)))]
pub async fn trace_projects(caller: Caller) -> ApiResult<HttpResponse> {
    let orgs = if caller.named_org() {
        vec![caller.member(None).await?.org_id]
    } else {
        caller.organizations().await?
    };
    let projects = repo::projects_with_traces(&caller.state().db, &orgs)
        .await?
        .into_iter()
        .map(|(project_id, name, trace_count, last_trace_at)| TraceProject {
            project_id: project_id.into(),
            name,
            trace_count,
            last_trace_at,
        })
        .collect();
    Ok(HttpResponse::Ok().json(TraceProjectsResponse { projects }))
}

fn format_of(name: Option<&str>) -> Format {
    name.and_then(Format::parse).unwrap_or(Format::Records)
}

/// Export a project's traces
///
/// The newest `limit` traces of a project as `records` (`{input, output}`), `prompts`
/// (`{input}`) or `raw` rows; traces with no extractable pair are skipped and counted. Follow
/// `nextCursor` (as `cursor`) to walk every trace, newest to oldest, one page at a time;
/// `since`, `until`, `model` and `status` narrow the walk.
#[utoipa::path(get, path = "/api/traces/export", tag = "traces", security(("apiKey" = []), ("session" = [])),
    params(ExportQuery),
    responses(
        (status = 200, body = TracesExportResponse),
        (status = 404, description = "No such project in the caller's organizations", body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn export_project(caller: Caller, query: ValidQuery<ExportQuery>) -> ApiResult<HttpResponse> {
    let query = query.0;
    let format = format_of(query.format.as_deref());
    let orgs = caller.organizations().await?;
    let filter = query.filters().to_filter();
    let project_id =
        ProjectId::parse(&query.project_id).map_err(|_| keel_core::traces::TraceError::ProjectNotFound)?;
    let limit = query.limit.map_or(MAX_EXPORT, |l| l as u64);
    let cursor = query.cursor.as_deref().and_then(service::Cursor::decode);
    let mut out = envelope_head(Some(project_id.as_str()), format)?;
    let state = caller.state();
    let page = service::export_project(
        &state.db,
        state.settings.traces.export_max_page_bytes,
        &orgs,
        &project_id,
        format,
        limit,
        filter,
        cursor,
        &mut out,
        b",",
    )
    .await?;
    envelope_end(out, page, None)
}

/// Export selected traces
///
/// Exactly the selected traces of one project, in the same three formats as the project export.
#[utoipa::path(post, path = "/api/traces/export", tag = "traces", security(("apiKey" = []), ("session" = [])),
    request_body = TraceSelectionBody,
    responses((status = 200, body = TracesExportResponse), (status = 422, body = ValidationErrorBody)))]
pub async fn export_selection(
    caller: Caller,
    body: ValidJson<TraceSelectionBody>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    let format = format_of(body.format.as_deref());
    let orgs = caller.organizations().await?;
    let filter = body.filters.to_filter();
    let mut records = Vec::new();
    let state = caller.state();
    let selection = service::export_selection(
        &state.db,
        state.settings.traces.export_max_page_bytes,
        &orgs,
        &body.trace_ids,
        format,
        &filter,
        &mut records,
        b",",
    )
    .await?;
    let mut out = envelope_head(selection.project_id.as_deref(), format)?;
    out.extend_from_slice(&records);
    drop(records);
    envelope_end(out, selection.stats, Some(selection.not_found))
}

/// A [`TracesExportResponse`] written as its records are: everything before the records...
fn envelope_head(project_id: Option<&str>, format: Format) -> ApiResult<Vec<u8>> {
    let mut out = Vec::with_capacity(64 * 1024);
    out.extend_from_slice(b"{\"projectId\":");
    serde_json::to_writer(&mut out, &project_id).map_err(anyhow::Error::from)?;
    out.extend_from_slice(b",\"format\":\"");
    out.extend_from_slice(format.as_str().as_bytes());
    out.extend_from_slice(b"\",\"records\":[");
    Ok(out)
}

/// ...and after them.
#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct EnvelopeTail {
    count: usize,
    skipped: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    not_found: Option<usize>,
    next_cursor: Option<String>,
}

fn envelope_end(
    mut out: Vec<u8>,
    page: service::PageStats,
    not_found: Option<usize>,
) -> ApiResult<HttpResponse> {
    let tail = serde_json::to_vec(&EnvelopeTail {
        count: page.count,
        skipped: page.skipped,
        not_found,
        next_cursor: page.next_cursor.map(|c| c.encode()),
    })
    .map_err(anyhow::Error::from)?;
    out.extend_from_slice(b"],");
    out.extend_from_slice(tail.get(1..).unwrap_or_default());
    Ok(HttpResponse::Ok().content_type("application/json").body(out))
}
