//! Run routes: create, update and link runs; record and read checkpoints (internal key);
//! `GET /api/tracker`.

use actix_web::{web, HttpResponse};
use keel_core::runs::{service, Checkpoint, NewRun, RunChanges};

use super::dto::{
    CheckpointItem, CheckpointsQuery, CheckpointsUpserted, RunCheckpoints, RunCheckpointsBody,
    RunCreateRequest, RunCreateResponse, RunUpdateRequest, RunView, TrackerLink, TrackerLinked, TrackerQuery,
    TrackerRunEntry, TrackerRuns,
};
use crate::auth::{Caller, Internal};
use crate::error::{ApiResult, ErrorBody, ValidationErrorBody};
use crate::http::extract::{path_str, ValidJson, ValidQuery};
use crate::state::AppState;

/// Create a run
///
/// Creates a training run in a project of the caller's organization.
#[utoipa::path(post, path = "/api/runs", tag = "runs", security(("apiKey" = []), ("session" = [])),
    request_body = RunCreateRequest,
    responses(
        (status = 200, body = RunCreateResponse),
        (status = 404, description = "Project not in the caller's organizations", body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn create_run(caller: Caller, body: ValidJson<RunCreateRequest>) -> ApiResult<HttpResponse> {
    let orgs = caller.organizations().await?;
    let run = service::create_run(&caller.state().db, &orgs, &NewRun::from(body.0)).await?;
    Ok(HttpResponse::Ok().json(RunCreateResponse {
        run_id: run.id.into(),
        project_id: run.project_id.into(),
        status: run.status,
    }))
}

/// Update a run
///
/// Changes a run's status, summary, metrics or error; `null` clears a field.
#[utoipa::path(patch, path = "/api/runs/{run_id}", tag = "runs", security(("apiKey" = []), ("session" = [])),
    params(("run_id" = String, Path, min_length = 1, max_length = 128)),
    request_body = RunUpdateRequest,
    responses(
        (status = 200, description = "RunUpdateResponse: the run after the update", body = RunView),
        (status = 404, description = "No such run in the caller's organizations", body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn update_run(
    caller: Caller,
    path: web::Path<String>,
    body: ValidJson<RunUpdateRequest>,
) -> ApiResult<HttpResponse> {
    let run_id = run_id(&path_str("run_id", &path, 1, 128)?)?;
    let orgs = caller.organizations().await?;
    let run = service::update_run(&caller.state().db, &orgs, &run_id, RunChanges::from(body.0)).await?;
    Ok(HttpResponse::Ok().json(RunView::from(run)))
}

/// Link a run to a tracker
///
/// Records the experiment tracker (entity, project, run id) of a run.
#[utoipa::path(post, path = "/api/runs/{run_id}/tracker", tag = "runs", security(("apiKey" = []), ("session" = [])),
    params(("run_id" = String, Path, min_length = 1, max_length = 128)),
    request_body = TrackerLink,
    responses(
        (status = 200, body = TrackerLinked),
        (status = 404, body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn link_tracker(
    caller: Caller,
    path: web::Path<String>,
    body: ValidJson<TrackerLink>,
) -> ApiResult<HttpResponse> {
    let run_id = run_id(&path_str("run_id", &path, 1, 128)?)?;
    let orgs = caller.organizations().await?;
    let link = keel_core::runs::TrackerLink::from(body.0);
    let run_id = service::link_tracker(&caller.state().db, &orgs, &run_id, &link).await?;
    Ok(HttpResponse::Ok().json(TrackerLinked {
        run_id: run_id.into(),
        entity: link.entity,
        project: link.project,
        tracker_run_id: link.tracker_run_id,
        url: link.url,
    }))
}

/// Record a run's checkpoints
///
/// Internal key: upserts checkpoints of a run by step.
#[utoipa::path(post, path = "/api/runs/internal/checkpoints", tag = "runs", security(("internalKey" = [])),
    request_body = RunCheckpointsBody,
    responses(
        (status = 200, body = CheckpointsUpserted),
        (status = 404, description = "The project is not that organization's", body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn upsert_checkpoints(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<RunCheckpointsBody>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    let checkpoints: Vec<Checkpoint> = body.checkpoints.into_iter().map(Checkpoint::from).collect();
    let (upserted, total) = service::record_checkpoints(
        &state.db,
        &body.org_id,
        &body.project_id,
        &run_id(&body.run_id)?,
        &checkpoints,
    )
    .await?;
    Ok(HttpResponse::Ok().json(CheckpointsUpserted {
        run_id: body.run_id,
        upserted,
        total,
    }))
}

/// Read a run's checkpoints
///
/// Internal key: the checkpoints of a run, by step.
#[utoipa::path(get, path = "/api/runs/internal/checkpoints", tag = "runs", security(("internalKey" = [])),
    params(CheckpointsQuery),
    responses(
        (status = 200, body = RunCheckpoints),
        (status = 404, description = "The project is not that organization's", body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn list_checkpoints(
    _: Internal,
    state: web::Data<AppState>,
    query: ValidQuery<CheckpointsQuery>,
) -> ApiResult<HttpResponse> {
    let query = query.0;
    let checkpoints = service::checkpoints(
        &state.db,
        &query.org_id,
        &query.project_id,
        &run_id(&query.run_id)?,
    )
    .await?;
    Ok(HttpResponse::Ok().json(RunCheckpoints {
        run_id: query.run_id,
        checkpoints: checkpoints.into_iter().map(CheckpointItem::from).collect(),
    }))
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
    let settings = &state.settings.tracker;
    let runs = service::read_tracker(
        &state.db,
        &state.http,
        settings,
        &orgs,
        &query.entity,
        &query.project,
        query.run_id,
    )
    .await?;
    Ok(HttpResponse::Ok().json(TrackerRuns {
        entity: query.entity,
        project: query.project,
        tracker_configured: !settings.url.trim_end_matches('/').is_empty(),
        runs: runs.into_iter().map(TrackerRunEntry::from).collect(),
    }))
}

/// A run id as the caller sent it (its bounds and NUL were checked first); one that is no
/// run id names no run.
fn run_id(raw: &str) -> ApiResult<keel_core::domain::RunId> {
    keel_core::domain::RunId::parse(raw).map_err(|_| crate::error::ApiError::not_found("run"))
}
