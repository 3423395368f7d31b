//! `GET /api/tracker`: the caller's runs linked to a tracker project, read live from the
//! experiment tracker (`tracker.url`) when one is configured.
//!
//! Tracker API used: `GET <tracker>/api/runs/{entity}/{project}/{trackerRunId}` with
//! `Authorization: Bearer <tracker.api_key>`, answering the run as a JSON object. Each run
//! is read on its own with a timeout; a failing read is reported in that run's entry and
//! never fails the answer. Only runs linked in the caller's organizations are read, so the
//! tracker key cannot be used to browse other projects.

use std::collections::HashSet;
use std::time::Duration;

use actix_web::HttpResponse;
use futures_util::{stream, StreamExt};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::repo;
use crate::auth::Caller;
use crate::error::{ApiResult, ErrorBody, ValidationErrorBody};
use crate::http::extract::ValidQuery;
use crate::http::validate::{Checks, Validate};
use crate::http::PeerError;

/// Tracker reads in flight at once for one request.
const READ_CONCURRENCY: usize = 16;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct TrackerQuery {
    /// The tracker's entity (team or user).
    #[param(min_length = 1, max_length = 200)]
    pub entity: String,
    /// The tracker's project.
    #[param(min_length = 1, max_length = 200)]
    pub project: String,
    /// Repeatable, 1..500 values: a tracker run id or a keel run id linked to one.
    #[param(schema_with = run_ids_schema)]
    pub run_id: Vec<String>,
}

/// 1..500 run ids of 1..200 characters each.
fn run_ids_schema() -> utoipa::openapi::Array {
    use utoipa::openapi::{ArrayBuilder, ObjectBuilder, Type};
    ArrayBuilder::new()
        .items(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .min_length(Some(1))
                .max_length(Some(200)),
        )
        .min_items(Some(1))
        .max_items(Some(500))
        .build()
}

impl Validate for TrackerQuery {
    fn validate(&self, c: &mut Checks) {
        c.str_len("entity", &self.entity, 1, 200);
        c.str_len("project", &self.project, 1, 200);
        c.min_items("runId", self.run_id.len(), 1);
        c.max_items("runId", self.run_id.len(), 500);
        for id in &self.run_id {
            c.str_len("runId", id, 1, 200);
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrackerRunEntry {
    /// As asked.
    pub run_id: String,
    /// `ok` (read from the tracker), `linked` (no tracker configured: the stored link),
    /// `not_linked` (no run of the caller's is linked to it) or `error` (the read failed).
    pub status: String,
    pub keel_run_id: Option<String>,
    pub project_id: Option<String>,
    pub tracker_run_id: Option<String>,
    pub url: Option<String>,
    /// The tracker's answer for the run (status `ok` only).
    #[schema(value_type = Option<Object>)]
    pub run: Option<Value>,
    pub error: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrackerRuns {
    pub entity: String,
    pub project: String,
    /// Whether a tracker is configured (otherwise only stored links are answered).
    pub tracker_configured: bool,
    /// One entry per distinct asked run id, in the order asked.
    pub runs: Vec<TrackerRunEntry>,
}

/// Read runs from the tracker
///
/// The tracker's view of the named runs of an entity and project the caller's runs are linked
/// to.
#[utoipa::path(get, path = "/api/tracker", tag = "runs", security(("apiKey" = []), ("session" = [])),
    params(TrackerQuery),
    responses(
        (status = 200, body = TrackerRuns),
        (status = 401, body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn read_tracker(caller: Caller, query: ValidQuery<TrackerQuery>) -> ApiResult<HttpResponse> {
    let query = query.0;
    let state = caller.state();
    let orgs = caller.organizations().await?;
    let linked = repo::linked_runs(&state.db, &orgs, &query.entity, &query.project).await?;
    let mut seen = HashSet::new();
    let asked: Vec<String> = query
        .run_id
        .into_iter()
        .filter(|id| seen.insert(id.clone()))
        .collect();
    let settings = &state.settings.tracker;
    let base = settings.url.trim_end_matches('/');
    let timeout = Duration::from_millis(settings.timeout_ms);
    let (entity, project) = (&query.entity, &query.project);

    let runs: Vec<TrackerRunEntry> = stream::iter(asked)
        .map(|asked_id| {
            let link = linked
                .iter()
                .find(|r| r.tracker_run_id.as_deref() == Some(&asked_id))
                .or_else(|| linked.iter().find(|r| r.id == asked_id));
            async move {
                let mut entry = TrackerRunEntry {
                    run_id: asked_id,
                    status: "not_linked".into(),
                    keel_run_id: None,
                    project_id: None,
                    tracker_run_id: None,
                    url: None,
                    run: None,
                    error: None,
                };
                let Some(link) = link else {
                    return entry;
                };
                let tracker_run_id = link.tracker_run_id.clone().unwrap_or_default();
                entry.keel_run_id = Some(link.id.clone());
                entry.project_id = Some(link.project_id.clone());
                entry.url = link.tracker_url.clone();
                entry.tracker_run_id = Some(tracker_run_id.clone());
                if base.is_empty() {
                    entry.status = "linked".into();
                    return entry;
                }
                match read_run(
                    &state.http,
                    base,
                    &settings.api_key,
                    timeout,
                    entity,
                    project,
                    &tracker_run_id,
                )
                .await
                {
                    Ok(run) => {
                        entry.status = "ok".into();
                        entry.run = Some(run);
                    }
                    Err(error) => {
                        entry.status = "error".into();
                        entry.error = Some(error.to_string());
                    }
                }
                entry
            }
        })
        .buffered(READ_CONCURRENCY)
        .collect()
        .await;

    Ok(HttpResponse::Ok().json(TrackerRuns {
        entity: query.entity.clone(),
        project: query.project.clone(),
        tracker_configured: !base.is_empty(),
        runs,
    }))
}

async fn read_run(
    http: &reqwest::Client,
    base: &str,
    api_key: &str,
    timeout: Duration,
    entity: &str,
    project: &str,
    run_id: &str,
) -> Result<Value, PeerError> {
    const TRACKER: &str = "the tracker";
    let mut url = reqwest::Url::parse(base).map_err(|_| PeerError::BadUrl { peer: TRACKER })?;
    url.path_segments_mut()
        .map_err(|()| PeerError::BadUrl { peer: TRACKER })?
        .pop_if_empty()
        .extend(["api", "runs", entity, project, run_id]);
    let mut request = http.get(url).timeout(timeout);
    if !api_key.is_empty() {
        request = request.bearer_auth(api_key);
    }
    let response = request.send().await.map_err(|e| PeerError::call(TRACKER, e))?;
    let status = response.status();
    if !status.is_success() {
        return Err(PeerError::Status {
            peer: TRACKER,
            status,
        });
    }
    response
        .json::<Value>()
        .await
        .map_err(|source| PeerError::NotJson {
            peer: TRACKER,
            source,
        })
}
