//! `GET /api/traces/projects`, `GET` and `POST /api/traces/export`; the list, one trace, its
//! tags and scores.

use actix_web::{web, HttpResponse};

use super::dto::{
    BulkTagged, BulkTagsBody, ExportQuery, ScoreBody, ScoresView, TagsBody, TagsView, TraceDetail, TraceList,
    TraceListQuery, TraceProject, TraceProjectsResponse, TraceSelectionBody, TraceView, TracesExportResponse,
};
use super::MAX_EXPORT;
use crate::auth::Caller;
use crate::error::{ApiResult, ErrorBody, ValidationErrorBody};
use crate::http::extract::{ValidJson, ValidQuery};
use keel_core::domain::{ProjectId, TraceId};
use keel_core::traces::export::Format;
use keel_core::traces::service;

/// List projects with traces
///
/// Projects of the caller's organizations with their trace counts and the time of their newest
/// trace.
#[utoipa::path(get, path = "/api/traces/projects", tag = "traces", security(("apiKey" = []), ("session" = [])),
    params(("orgId" = Option<String>, Query, description = "Only this organization's projects")),
    responses((status = 200, body = TraceProjectsResponse), (status = 401, body = ErrorBody)))]
pub async fn trace_projects(caller: Caller) -> ApiResult<HttpResponse> {
    let orgs = caller.named_or_all_orgs().await?;
    let projects = service::projects_with_traces(&caller.state().db, &orgs)
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
/// (`{input}`), `raw` rows or `otlp-json` (each record one OTLP/JSON
/// `ExportTraceServiceRequest`, a span per trace with the GenAI conventions' attributes);
/// traces with no extractable pair are skipped and counted. Follow
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
    let mut out = envelope_head(selection.project_id.as_ref().map(ProjectId::as_str), format)?;
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

fn trace_id(raw: &str) -> Result<TraceId, keel_core::traces::TraceError> {
    TraceId::parse(raw).map_err(|_| keel_core::traces::TraceError::TraceNotFound)
}

/// List a project's traces
///
/// Newest first, with previews (the last user message and the reply, 200 characters each),
/// tags and scores. `q` searches the words of the user and assistant messages (all words
/// required; "quoted phrases"); `model`, `status`, `since`, `until`, `tag` and `minScore`
/// narrow the list. Follow `nextCursor` (as `cursor`) for the next page.
#[utoipa::path(get, path = "/api/traces", tag = "traces", security(("apiKey" = []), ("session" = [])),
    params(TraceListQuery),
    responses(
        (status = 200, body = TraceList),
        (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 404, description = "No such project in the caller's organizations", body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn list_traces(caller: Caller, query: ValidQuery<TraceListQuery>) -> ApiResult<HttpResponse> {
    let query = query.0;
    let orgs = caller.organizations().await?;
    let project_id =
        ProjectId::parse(&query.project_id).map_err(|_| keel_core::traces::TraceError::ProjectNotFound)?;
    let cursor = query.cursor.as_deref().and_then(service::Cursor::decode);
    let limit = query.limit.map_or(50, |l| l as u64);
    let page = keel_core::traces::browse::list(
        &caller.state().db,
        &orgs,
        &project_id,
        query.to_filter(),
        cursor,
        limit,
    )
    .await?;
    Ok(HttpResponse::Ok().json(TraceList {
        traces: page.traces.into_iter().map(TraceView::from).collect(),
        next_cursor: page.next_cursor.map(|c| c.encode()),
    }))
}

/// Read a trace
///
/// One trace whole: the list's view with its request and response as stored (redacted).
/// Another organization's trace is 404.
#[utoipa::path(get, path = "/api/traces/{trace_id}", tag = "traces", security(("apiKey" = []), ("session" = [])),
    params(("trace_id" = String, Path)),
    responses((status = 200, body = TraceDetail), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
pub async fn get_trace(caller: Caller, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let id = trace_id(&path)?;
    let orgs = caller.organizations().await?;
    let (trace, marks) = keel_core::traces::browse::get(&caller.state().db, &orgs, &id).await?;
    Ok(HttpResponse::Ok().json(TraceDetail::of(trace, marks)))
}

/// Tag a trace
///
/// Adds and removes tags (1 to 50 of `a-z0-9_.:-`; at most 20 a trace); answers its tags.
#[utoipa::path(post, path = "/api/traces/{trace_id}/tags", tag = "traces", security(("apiKey" = []), ("session" = [])),
    params(("trace_id" = String, Path)),
    request_body = TagsBody,
    responses((status = 200, body = TagsView), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
pub async fn tag_trace(
    caller: Caller,
    path: web::Path<String>,
    body: ValidJson<TagsBody>,
) -> ApiResult<HttpResponse> {
    let id = trace_id(&path)?;
    let orgs = caller.organizations().await?;
    let body = body.0;
    let db = &caller.state().db;
    let tagged = keel_core::traces::marks::change_tags(
        db,
        &orgs,
        std::slice::from_ref(&id),
        &body.add.unwrap_or_default(),
        &body.remove.unwrap_or_default(),
    )
    .await?;
    if tagged.updated == 0 {
        return Err(keel_core::traces::TraceError::TraceNotFound.into());
    }
    let tags = keel_core::traces::marks::marks_of(db, std::slice::from_ref(&id))
        .await?
        .remove(&id)
        .unwrap_or_default()
        .tags;
    Ok(HttpResponse::Ok().json(TagsView { tags }))
}

/// Tag many traces
///
/// The same change of tags on up to 1,000 traces, all or nothing; ids that are not traces of
/// the caller's organizations are counted, not changed.
#[utoipa::path(post, path = "/api/traces/tags", tag = "traces", security(("apiKey" = []), ("session" = [])),
    request_body = BulkTagsBody,
    responses((status = 200, body = BulkTagged), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 422, body = ValidationErrorBody)))]
pub async fn tag_traces(caller: Caller, body: ValidJson<BulkTagsBody>) -> ApiResult<HttpResponse> {
    let orgs = caller.organizations().await?;
    let body = body.0;
    let tagged = keel_core::traces::marks::change_tags(
        &caller.state().db,
        &orgs,
        &body.trace_ids,
        &body.add.unwrap_or_default(),
        &body.remove.unwrap_or_default(),
    )
    .await?;
    Ok(HttpResponse::Ok().json(BulkTagged {
        updated: tagged.updated,
        not_found: tagged.not_found,
    }))
}

fn score_name(raw: &str) -> ApiResult<String> {
    if keel_core::traces::marks::is_name(raw) {
        Ok(raw.to_owned())
    } else {
        Err(crate::error::ApiError::validation(
            vec!["path".into(), "name".into()],
            "string_pattern_mismatch",
            format!(
                "String should match pattern '{}'",
                keel_core::traces::marks::NAME_PATTERN
            ),
        ))
    }
}

/// Score a trace
///
/// Sets the trace's score `name` (1 to 50 of `a-z0-9_.:-`; at most 20 a trace) to a number,
/// with an optional comment; answers its scores.
#[utoipa::path(put, path = "/api/traces/{trace_id}/scores/{name}", tag = "traces", security(("apiKey" = []), ("session" = [])),
    params(("trace_id" = String, Path), ("name" = String, Path, pattern = "^[a-z0-9_.:-]{1,50}$")),
    request_body = ScoreBody,
    responses((status = 200, body = ScoresView), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
pub async fn put_score(
    caller: Caller,
    path: web::Path<(String, String)>,
    body: ValidJson<ScoreBody>,
) -> ApiResult<HttpResponse> {
    let (id, name) = path.into_inner();
    let name = score_name(&name)?;
    let id = trace_id(&id)?;
    let orgs = caller.organizations().await?;
    let body = body.0;
    let scores =
        keel_core::traces::marks::set_score(&caller.state().db, &orgs, &id, &name, body.value, body.comment)
            .await?;
    Ok(HttpResponse::Ok().json(ScoresView::of(scores)))
}

/// Delete a trace's score
///
/// Removes the score `name` (none is no error); answers the trace's scores.
#[utoipa::path(delete, path = "/api/traces/{trace_id}/scores/{name}", tag = "traces", security(("apiKey" = []), ("session" = [])),
    params(("trace_id" = String, Path), ("name" = String, Path, pattern = "^[a-z0-9_.:-]{1,50}$")),
    responses((status = 200, body = ScoresView), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
pub async fn delete_score(caller: Caller, path: web::Path<(String, String)>) -> ApiResult<HttpResponse> {
    let (id, name) = path.into_inner();
    let name = score_name(&name)?;
    let id = trace_id(&id)?;
    let orgs = caller.organizations().await?;
    let scores = keel_core::traces::marks::delete_score(&caller.state().db, &orgs, &id, &name).await?;
    Ok(HttpResponse::Ok().json(ScoresView::of(scores)))
}
