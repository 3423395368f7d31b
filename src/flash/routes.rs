//! Flash routes (internal key): the control plane's mirrors and events, hub provisioning.

use super::dto::*;
use crate::auth::Internal;
use crate::error::{ApiResult, ErrorBody, ValidationErrorBody};
use crate::http::extract::{parse_checked_body, parse_json_body, RawBody, ValidJson, ValidQuery};
use crate::http::validate::Validate;
use crate::state::AppState;
use actix_web::{web, HttpResponse};
use keel_core::flash::service::{self, Mirrored};
use keel_core::flash::{hub, EnvironmentPublish};
use serde::de::DeserializeOwned;
use serde_json::{json, Map, Value};
use utoipa::ToSchema;

/// Check a project is active
///
/// Internal key: answers the project's id and slug when it is active in the organization; 404
/// otherwise.
#[utoipa::path(post, path = "/api/flash/projects/validate/internal", tag = "flash", security(("internalKey" = [])),
    request_body = FlashProjectValidateBody,
    responses(
        (status = 200, body = ProjectValid),
        (status = 404, description = "No such active project in the organization", body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn validate_project(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<FlashProjectValidateBody>,
) -> ApiResult<HttpResponse> {
    let project = service::active_project(&state.db, &body.0.org_id, &body.0.project_id).await?;
    Ok(HttpResponse::Ok().json(ProjectValid {
        valid: true,
        project_id: project.id.into(),
        org_id: project.org_id.into(),
        slug: project.slug,
    }))
}

/// Run a hub provisioning pass
///
/// Internal key: one bounded pass (`limit`, default 25) over environments waiting for their hub
/// repository, optionally for one organization (`orgId`) so its backoff alone advances. With no
/// hub configured nothing is called: the environments the pass would have tried are counted as
/// `skipped`.
#[utoipa::path(post, path = "/api/flash/environments/hub/provision/internal", tag = "flash",
    security(("internalKey" = [])),
    params(ProvisionQuery),
    responses(
        (status = 200, body = ProvisionReport),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn provision_hub(
    _: Internal,
    state: web::Data<AppState>,
    query: ValidQuery<ProvisionQuery>,
) -> ApiResult<HttpResponse> {
    let limit = query.0.limit.unwrap_or(25) as u64;
    let report = hub::run_pass(
        &state.db,
        &state.http,
        &state.settings.hub,
        limit,
        query.0.org_id.as_ref(),
    )
    .await?;
    Ok(HttpResponse::Ok().json(ProvisionReport::from(report)))
}

/// Publish an environment
///
/// Internal key: creates or updates the mirror of an environment by its slug
/// `<org>/<project>/<name>`; a new one waits for hub provisioning.
#[utoipa::path(post, path = "/api/flash/environments/internal", tag = "flash", security(("internalKey" = [])),
    request_body = FlashEnvironmentPublishBody,
    responses(
        (status = 200, body = EnvironmentPublished),
        (status = 404, description = "No such active project in the organization", body = ErrorBody),
        (status = 409, description = "The slug is another organization's environment", body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn publish_environment(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<FlashEnvironmentPublishBody>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    let environment = EnvironmentPublish::from(&body);
    let (env, created) = service::publish_environment(
        &state.db,
        &body.org_id,
        &body.project_id,
        &environment,
        &state.settings.hub.default_repo,
    )
    .await?;
    Ok(HttpResponse::Ok().json(EnvironmentPublished {
        created,
        environment: env.into(),
    }))
}

/// Delete an environment's mirror
///
/// Internal key: drops the mirror row after the control plane removed the environment from hub
/// storage; never calls the control plane back.
#[utoipa::path(delete, path = "/api/flash/environments/internal", tag = "flash", security(("internalKey" = [])),
    request_body = FlashEnvironmentRefBody,
    responses((status = 200, body = EnvironmentDeleted), (status = 422, body = ValidationErrorBody)))]
pub async fn delete_environment(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<FlashEnvironmentRefBody>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    let deleted = service::delete_environment(&state.db, &body.org_id, &body.project_id, &body.slug).await?;
    Ok(HttpResponse::Ok().json(EnvironmentDeleted {
        deleted,
        slug: body.slug,
    }))
}

/// Check an environment belongs to a project
///
/// Internal key: `{valid: true}` when the slug is that project's environment; 404 otherwise.
/// Changes nothing.
#[utoipa::path(post, path = "/api/flash/environments/validate/internal", tag = "flash",
    security(("internalKey" = [])),
    request_body = FlashEnvironmentRefBody,
    responses(
        (status = 200, body = Valid),
        (status = 404, description = "The slug is not an environment of that project", body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn validate_environment(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<FlashEnvironmentRefBody>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    service::check_environment(&state.db, &body.org_id, &body.project_id, &body.slug).await?;
    Ok(HttpResponse::Ok().json(Valid { valid: true }))
}

/// Record an environment's use
///
/// Internal key: records that a run referenced the environment slug.
#[utoipa::path(post, path = "/api/flash/environments/use/internal", tag = "flash", security(("internalKey" = [])),
    request_body = FlashEnvironmentUseBody,
    responses(
        (status = 200, body = Recorded),
        (status = 404, description = "No such active project in the organization", body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn use_environment(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<FlashEnvironmentUseBody>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    service::record_use(
        &state.db,
        &body.org_id,
        &body.project_id,
        &body.slug,
        body.run_id.as_deref(),
    )
    .await?;
    Ok(HttpResponse::Ok().json(Recorded { recorded: true }))
}

/// Mirror a managed run
///
/// Internal key: stores the latest status and fields of a managed (flash) run; an update older
/// than the stored one is ignored (`stale`). A run of another project is 409.
#[utoipa::path(post, path = "/api/flash/runs/internal", tag = "flash", security(("internalKey" = [])),
    request_body = FlashRunUpsertBody,
    responses(
        (status = 200, body = MirrorUpserted),
        (status = 404, description = "No such active project in the organization", body = ErrorBody),
        (status = 409, description = "The run belongs to another project", body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn upsert_run(_: Internal, state: web::Data<AppState>, body: RawBody) -> ApiResult<HttpResponse> {
    let (body, raw) = typed_and_raw::<FlashRunUpsertBody>(&body.0)?;
    let patch = pick(raw, RUN_FIELDS);
    let (Mirrored { project, result }, status) = service::upsert_run(
        &state.db,
        &body.org_id,
        &body.project_id,
        &body.run_id,
        &body.status,
        patch,
    )
    .await?;
    Ok(HttpResponse::Ok().json(MirrorUpserted {
        org_id: project.org_id.into(),
        project_id: project.id.into(),
        run_id: body.run_id,
        status: Some(status),
        checkpoint_id: None,
        result: result.as_str().to_owned(),
    }))
}

/// Mirror a run's checkpoint
///
/// Internal key: stores a checkpoint or artifact snapshot of a managed run.
#[utoipa::path(post, path = "/api/flash/runs/checkpoints/internal", tag = "flash", security(("internalKey" = [])),
    request_body = FlashCheckpointUpsertBody,
    responses(
        (status = 200, body = MirrorUpserted),
        (status = 404, description = "No such active project in the organization", body = ErrorBody),
        (status = 409, description = "The checkpoint belongs to another project", body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn upsert_checkpoint(
    _: Internal,
    state: web::Data<AppState>,
    body: RawBody,
) -> ApiResult<HttpResponse> {
    let (body, raw) = typed_and_raw::<FlashCheckpointUpsertBody>(&body.0)?;
    let patch = pick(raw, CHECKPOINT_FIELDS);
    let Mirrored { project, result } = service::upsert_checkpoint(
        &state.db,
        &body.org_id,
        &body.project_id,
        &body.run_id,
        &body.checkpoint_id,
        patch,
    )
    .await?;
    Ok(HttpResponse::Ok().json(MirrorUpserted {
        org_id: project.org_id.into(),
        project_id: project.id.into(),
        run_id: body.run_id,
        status: None,
        checkpoint_id: Some(body.checkpoint_id),
        result: result.as_str().to_owned(),
    }))
}

/// Record a product event
///
/// Internal key: stores a product-analytics event whose name is on the allowlist; any other
/// name is 422.
#[utoipa::path(post, path = "/api/flash/events/internal", tag = "flash", security(("internalKey" = [])),
    request_body = FlashProductEventBody,
    responses(
        (status = 200, body = Accepted),
        (status = 404, description = "Unknown organization", body = ErrorBody),
        (status = 422, description = "Invalid body or an event outside the allowlist", body = ValidationErrorBody),
    ))]
pub async fn record_event(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<FlashProductEventBody>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    let properties = body.properties.map(|p| json!(p).to_string());
    service::record_event(
        &state.db,
        &state.settings.flash.event_allowlist,
        &body.org_id,
        &body.event,
        body.user_id.as_deref(),
        properties,
    )
    .await?;
    Ok(HttpResponse::Ok().json(Accepted { accepted: true }))
}

/// Reads a body twice: typed (types and bounds, 422 on failure) and as the object it is,
/// so an upsert can tell an absent field (keep) from a `null` one (clear).
fn typed_and_raw<T: DeserializeOwned + Validate + ToSchema>(
    bytes: &[u8],
) -> ApiResult<(T, Map<String, Value>)> {
    let typed: T = parse_checked_body(bytes)?;
    let raw: Map<String, Value> = parse_json_body(bytes)?;
    Ok((typed, raw))
}

/// The named fields of a body, as sent (including `null`s).
fn pick(mut raw: Map<String, Value>, fields: &[&str]) -> Map<String, Value> {
    raw.retain(|k, _| fields.contains(&k.as_str()));
    raw
}
