//! Traces: the recorded chat completions of a project, listed per project and exported as
//! training datasets (`GET /api/traces/export` for a project's newest, `POST` for an explicit
//! selection). Traces are written by [`writer::TraceWriter`].

pub mod cli;
pub mod export;
pub mod writer;

use std::collections::HashMap;

use actix_web::{web, HttpResponse};
use chrono::{DateTime, Utc};
use entities::{project, trace};
use sea_orm::sea_query::{Expr, Func};
use sea_orm::{ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::{OpenApi, ToSchema};

use crate::auth::Caller;
use crate::error::{ApiError, ApiResult, ErrorBody, ValidationErrorBody};
use crate::http::extract::{canonical_uuid, ValidJson, ValidQuery};
use crate::http::resource;
use crate::http::validate::{Checks, Validate};
use export::Format;

pub const MAX_EXPORT: u64 = 1000;

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(resource("/api/traces/projects").route(web::get().to(trace_projects)))
        .service(
            resource("/api/traces/export")
                .route(web::get().to(export_project))
                .route(web::post().to(export_selection)),
        );
}

#[derive(OpenApi)]
#[openapi(paths(trace_projects, export_project, export_selection))]
pub struct Doc;

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TraceProject {
    pub project_id: String,
    pub name: String,
    pub trace_count: i64,
    pub last_trace_at: DateTime<Utc>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TraceProjectsResponse {
    /// Projects with at least one trace, most recently recorded first.
    pub projects: Vec<TraceProject>,
}

#[utoipa::path(get, path = "/api/traces/projects", tag = "traces", security(("bearer" = [])),
    params(("orgId" = Option<String>, Query, description = "Only this organization's projects")),
    responses((status = 200, body = TraceProjectsResponse), (status = 401, body = ErrorBody)))]
pub async fn trace_projects(caller: Caller) -> ApiResult<HttpResponse> {
    let orgs = if caller.named_org() {
        vec![caller.member(None).await?.org_id]
    } else {
        caller.organizations().await?
    };
    let projects = projects_with_traces(&caller.state().db, &orgs).await?;
    Ok(HttpResponse::Ok().json(TraceProjectsResponse { projects }))
}

async fn projects_with_traces(
    db: &impl ConnectionTrait,
    orgs: &[String],
) -> Result<Vec<TraceProject>, DbErr> {
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
    let names: HashMap<String, String> = project::Entity::find()
        .filter(project::Column::Id.is_in(counts.iter().map(|(id, _, _)| id.clone())))
        .all(db)
        .await?
        .into_iter()
        .map(|p| (p.id, p.name))
        .collect();
    let mut projects: Vec<TraceProject> = counts
        .into_iter()
        .map(|(project_id, trace_count, last)| TraceProject {
            name: names.get(&project_id).cloned().unwrap_or_default(),
            project_id,
            trace_count,
            last_trace_at: last,
        })
        .collect();
    projects.sort_by_key(|p| std::cmp::Reverse(p.last_trace_at));
    Ok(projects)
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ExportQuery {
    pub project_id: String,
    /// 1..1000, default 1000: the newest traces.
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<i64>,
    /// `records` (default), `prompts` or `raw`.
    pub format: Option<String>,
}

impl Validate for ExportQuery {
    fn validate(&self, c: &mut Checks) {
        c.str_len("project_id", &self.project_id, 1, 100);
        c.opt_int_range("limit", self.limit, 1, MAX_EXPORT as i64);
        if let Some(format) = &self.format {
            c.one_of("format", format, Format::NAMES);
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TracesExportResponse {
    /// The project exported (for a selection: their one project, else null).
    pub project_id: Option<String>,
    pub format: String,
    /// Rows in `records`.
    pub count: usize,
    /// Traces without an extractable request/response pair.
    pub skipped: usize,
    /// Selected trace ids that are not the caller's (selection only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_found: Option<usize>,
    #[schema(value_type = Vec<Object>)]
    pub records: Vec<Value>,
}

fn convert_all(traces: &[trace::Model], format: Format) -> (Vec<Value>, usize) {
    let records: Vec<Value> = traces.iter().filter_map(|t| export::convert(t, format)).collect();
    let skipped = traces.len() - records.len();
    (records, skipped)
}

#[utoipa::path(get, path = "/api/traces/export", tag = "traces", security(("bearer" = [])),
    params(ExportQuery),
    responses(
        (status = 200, body = TracesExportResponse),
        (status = 404, description = "No such project in the caller's organizations", body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn export_project(caller: Caller, query: ValidQuery<ExportQuery>) -> ApiResult<HttpResponse> {
    let query = query.0;
    let format = query
        .format
        .as_deref()
        .and_then(Format::parse)
        .unwrap_or(Format::Records);
    let orgs = caller.organizations().await?;
    let db = &caller.state().db;
    let project_id = canonical_uuid(&query.project_id);
    crate::projects::repo::find_in_orgs(db, &project_id, &orgs)
        .await?
        .ok_or_else(|| ApiError::not_found("project"))?;
    let limit = query.limit.map_or(MAX_EXPORT, |l| l as u64);
    let traces = trace::Entity::find()
        .filter(trace::Column::ProjectId.eq(&project_id))
        .order_by_desc(trace::Column::CreatedAt)
        .order_by_desc(trace::Column::Id)
        .limit(limit)
        .all(db)
        .await?;
    let (records, skipped) = convert_all(&traces, format);
    Ok(HttpResponse::Ok().json(TracesExportResponse {
        project_id: Some(project_id),
        format: format.as_str().to_owned(),
        count: records.len(),
        skipped,
        not_found: None,
        records,
    }))
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TraceSelectionBody {
    /// The selected traces, exported in this order.
    #[schema(min_items = 1, max_items = 1000)]
    pub trace_ids: Vec<String>,
    /// `records` (default), `prompts` or `raw`.
    pub format: Option<String>,
}

impl Validate for TraceSelectionBody {
    fn validate(&self, c: &mut Checks) {
        c.min_items("traceIds", self.trace_ids.len(), 1);
        c.max_items("traceIds", self.trace_ids.len(), MAX_EXPORT as usize);
        for (i, id) in self.trace_ids.iter().enumerate() {
            if uuid::Uuid::parse_str(id).is_err() {
                c.fail_item("traceIds", i, "uuid_parsing", "Input should be a valid UUID");
            }
        }
        if let Some(format) = &self.format {
            c.one_of("format", format, Format::NAMES);
        }
    }
}

#[utoipa::path(post, path = "/api/traces/export", tag = "traces", security(("bearer" = [])),
    request_body = TraceSelectionBody,
    responses((status = 200, body = TracesExportResponse), (status = 422, body = ValidationErrorBody)))]
pub async fn export_selection(
    caller: Caller,
    body: ValidJson<TraceSelectionBody>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    let format = body
        .format
        .as_deref()
        .and_then(Format::parse)
        .unwrap_or(Format::Records);
    let orgs = caller.organizations().await?;
    let mut wanted: Vec<String> = body.trace_ids.iter().map(|id| canonical_uuid(id)).collect();
    let mut seen = std::collections::HashSet::new();
    wanted.retain(|id| seen.insert(id.clone()));
    let mut found: HashMap<String, trace::Model> = trace::Entity::find()
        .filter(trace::Column::Id.is_in(wanted.iter().cloned()))
        .filter(trace::Column::OrgId.is_in(orgs))
        .all(&caller.state().db)
        .await?
        .into_iter()
        .map(|t| (t.id.clone(), t))
        .collect();
    let traces: Vec<trace::Model> = wanted.iter().filter_map(|id| found.remove(id)).collect();
    let not_found = wanted.len() - traces.len();
    let project_id = traces
        .first()
        .map(|t| t.project_id.clone())
        .filter(|p| traces.iter().all(|t| &t.project_id == p));
    let (records, skipped) = convert_all(&traces, format);
    Ok(HttpResponse::Ok().json(TracesExportResponse {
        project_id,
        format: format.as_str().to_owned(),
        count: records.len(),
        skipped,
        not_found: Some(not_found),
        records,
    }))
}
