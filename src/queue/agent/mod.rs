//! Agent logs (user and worker), agent account usage and optimizer timelines.

use actix_web::{web, HttpResponse};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::auth::{Internal, Member};
use crate::error::{ApiResult, ErrorBody, ValidationErrorBody};
use crate::http::extract::{ValidJson, ValidQuery};
use crate::http::validate::{Checks, Validate};
use crate::state::AppState;
use keel_core::domain::OrgId;
use keel_core::queue::agent::service::{self, LogSource};

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AgentLogCreateRequest {
    #[schema(min_length = 1, max_length = 50000)]
    pub content: String,
}

impl Validate for AgentLogCreateRequest {
    fn validate(&self, _c: &mut Checks) {}
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AgentLogCreated {
    pub ok: bool,
    pub agent_log_id: String,
}

crate::org_scoped!(unnamed: AgentLogCreateRequest);

/// Write an agent log line
///
/// Stores a log line of a training agent for the caller's organization.
#[utoipa::path(post, path = "/api/agent-logs", tag = "agent", security(("apiKey" = []), ("session" = [])),
    request_body = AgentLogCreateRequest,
    responses((status = 200, body = AgentLogCreated), (status = 401, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
pub async fn create_agent_log(member: Member<ValidJson<AgentLogCreateRequest>>) -> ApiResult<HttpResponse> {
    let content = &member.input.0.content;
    let id = service::write_log(
        &member.state.db,
        &member.access.org_id,
        content,
        None,
        LogSource::Api,
    )
    .await?;
    Ok(HttpResponse::Ok().json(AgentLogCreated {
        ok: true,
        agent_log_id: id,
    }))
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct InternalAgentLogCreateRequest {
    #[schema(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
    #[schema(min_length = 1, max_length = 50000)]
    pub content: String,
    #[schema(min_length = 1, max_length = 64)]
    pub job_id: Option<String>,
}

impl Validate for InternalAgentLogCreateRequest {
    fn validate(&self, _c: &mut Checks) {}
}

/// Write an agent log line (worker)
///
/// Internal key: stores a log line for the named organization.
#[utoipa::path(post, path = "/api/training/internal/agent-logs", tag = "training-internal", security(("internalKey" = [])),
    request_body = InternalAgentLogCreateRequest,
    responses((status = 200, body = AgentLogCreated), (status = 404, description = "Unknown organization", body = ErrorBody)))]
pub async fn create_agent_log_internal(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<InternalAgentLogCreateRequest>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    let org_id = body.org_id;
    let id = service::write_log(
        &state.db,
        &org_id,
        &body.content,
        body.job_id.as_deref(),
        LogSource::Internal,
    )
    .await?;
    Ok(HttpResponse::Ok().json(AgentLogCreated {
        ok: true,
        agent_log_id: id,
    }))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AgentLogQuery {
    #[param(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
    /// 1..500, default 200.
    #[param(minimum = 1, maximum = 500)]
    pub limit: Option<i64>,
}

impl Validate for AgentLogQuery {}

#[derive(Debug, Serialize, ToSchema)]
pub struct AgentLogView {
    pub agent_log_id: String,
    pub org_id: String,
    pub job_id: Option<String>,
    pub content: String,
    /// `api` or `internal`.
    pub source: String,
    pub created_at: DateTime<Utc>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AgentLogList {
    pub logs: Vec<AgentLogView>,
    pub count: usize,
}

/// Read an organization's agent logs
///
/// Internal key: the newest agent log lines of an organization (`limit`, default 200).
#[utoipa::path(get, path = "/api/training/internal/agent-logs", tag = "training-internal", security(("internalKey" = [])),
    params(AgentLogQuery),
    responses((status = 200, body = AgentLogList), (status = 422, body = ValidationErrorBody)))]
pub async fn list_agent_logs_internal(
    _: Internal,
    state: web::Data<AppState>,
    query: ValidQuery<AgentLogQuery>,
) -> ApiResult<HttpResponse> {
    let query = query.0;
    let org_id = query.org_id;
    let logs: Vec<AgentLogView> = service::newest_logs(&state.db, &org_id, query.limit.unwrap_or(200) as u64)
        .await?
        .into_iter()
        .map(|l| AgentLogView {
            agent_log_id: l.id,
            org_id: l.org_id.into(),
            job_id: l.job_id,
            content: l.content,
            source: l.source,
            created_at: l.created_at,
        })
        .collect();
    Ok(HttpResponse::Ok().json(AgentLogList {
        count: logs.len(),
        logs,
    }))
}

/// When an agent account's window resets: a number (epoch seconds) or a text (the schema of
/// `primary_resets_at`, kept as sent).
#[derive(Serialize, ToSchema)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum ResetsAt {
    Number(f64),
    Text(String),
}

/// An agent account's usage report; members beyond these are kept as sent.
#[derive(Debug, Deserialize, ToSchema)]
pub struct AgentUsageReport {
    #[schema(min_length = 1, max_length = 200)]
    pub account_label: String,
    #[schema(max_length = 200)]
    pub limit_id: Option<String>,
    #[schema(max_length = 200)]
    pub limit_name: Option<String>,
    #[schema(max_length = 100)]
    pub plan_type: Option<String>,
    pub primary_used_percent: Option<f64>,
    pub primary_window_minutes: Option<i64>,
    /// Integer, number or string.
    #[schema(value_type = Option<ResetsAt>)]
    pub primary_resets_at: Option<Value>,
    #[serde(flatten)]
    #[schema(value_type = Object)]
    pub rest: Map<String, Value>,
}

impl Validate for AgentUsageReport {
    fn validate(&self, c: &mut Checks) {
        if let Some(v) = &self.primary_resets_at {
            if !(v.is_number() || v.is_string()) {
                c.fail(
                    "primary_resets_at",
                    "value_error",
                    "Input should be an integer, a number or a string",
                );
            }
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Upserted {
    pub upserted: i64,
}

/// Report agent account usage
///
/// Internal key: upserts the usage reports of agent accounts; members beyond the named fields
/// are kept as sent.
#[utoipa::path(post, path = "/api/training/internal/agent-usage", tag = "training-internal", security(("internalKey" = [])),
    request_body = AgentUsageReport,
    responses((status = 200, body = Upserted), (status = 422, body = ValidationErrorBody)))]
pub async fn report_agent_usage(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<AgentUsageReport>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    let mut report = body.rest.clone();
    report.insert("account_label".into(), Value::from(body.account_label.clone()));
    for (key, value) in [
        ("limit_id", body.limit_id.map(Value::from)),
        ("limit_name", body.limit_name.map(Value::from)),
        ("plan_type", body.plan_type.map(Value::from)),
        ("primary_used_percent", body.primary_used_percent.map(Value::from)),
        (
            "primary_window_minutes",
            body.primary_window_minutes.map(Value::from),
        ),
        ("primary_resets_at", body.primary_resets_at),
    ] {
        report.insert(key.into(), value.unwrap_or(Value::Null));
    }
    service::record_usage(&state.db, &body.account_label, &Value::Object(report)).await?;
    Ok(HttpResponse::Ok().json(Upserted { upserted: 1 }))
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct Timeline {
    #[schema(min_length = 1, max_length = 200)]
    pub timeline_id: String,
    #[schema(value_type = Vec<Object>, max_items = 10000)]
    pub events: Vec<Value>,
}

/// The worker's optimizer timelines for an organization; the latest sync of a timeline wins.
#[derive(Debug, Deserialize, ToSchema)]
pub struct TimelineSyncRequest {
    #[schema(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
    #[schema(min_length = 1, max_length = 64)]
    pub job_id: Option<String>,
    #[schema(max_items = 500)]
    pub timelines: Vec<Timeline>,
}

impl Validate for TimelineSyncRequest {
    fn validate(&self, c: &mut Checks) {
        for (i, t) in self.timelines.iter().enumerate() {
            c.nested("timelines", Some(i), t);
        }
    }
}

impl Validate for Timeline {}

#[derive(Debug, Serialize, ToSchema)]
pub struct Synced {
    pub synced: usize,
}

/// Sync optimizer timelines
///
/// Internal key: upserts optimizer timelines by id.
#[utoipa::path(post, path = "/api/training/internal/optimizer-timelines/sync", tag = "training-internal",
    security(("internalKey" = [])),
    request_body = TimelineSyncRequest,
    responses((status = 200, body = Synced), (status = 404, description = "Unknown organization", body = ErrorBody)))]
pub async fn sync_optimizer_timelines(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<TimelineSyncRequest>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    let org_id = body.org_id;
    let timelines: Vec<(String, Value)> = body
        .timelines
        .iter()
        .map(|t| (t.timeline_id.clone(), Value::Array(t.events.clone())))
        .collect();
    service::sync_timelines(&state.db, &org_id, body.job_id.as_deref(), &timelines).await?;
    Ok(HttpResponse::Ok().json(Synced {
        synced: body.timelines.len(),
    }))
}
