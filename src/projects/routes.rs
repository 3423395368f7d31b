//! `GET/POST /api/projects`, `GET|PATCH /api/projects/{project_id}`.

use super::dto::{ProjectCreateBody, ProjectCreated, ProjectPatchBody, ProjectView};
use crate::auth::{Caller, Member};
use crate::error::{ApiResult, ErrorBody, ValidationErrorBody};
use crate::http::extract::{path_id, ValidJson};
use actix_web::{web, HttpResponse};
use keel_core::projects::service;

/// Create a project
///
/// Creates a project in the caller's organization; its slug is derived from the name unless
/// given, and is unique within the organization (409 otherwise).
#[utoipa::path(post, path = "/api/projects", tag = "projects", security(("apiKey" = []), ("session" = [])),
    request_body = ProjectCreateBody,
    responses(
        (status = 201, body = ProjectCreated),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 409, description = "Slug taken in this organization", body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn create_project(member: Member<ValidJson<ProjectCreateBody>>) -> ApiResult<HttpResponse> {
    let body = &member.input.0;
    let project = service::create_project(
        &member.state.db,
        &member.access.org_id,
        &body.name,
        body.slug.as_deref(),
        body.description.as_deref(),
    )
    .await?;
    Ok(HttpResponse::Created().json(ProjectCreated {
        id: project.id.into(),
        org_id: project.org_id.into(),
        name: project.name,
        slug: project.slug,
        active: project.active,
    }))
}

/// List projects
///
/// Projects of every organization the caller reaches, or of the one named by `orgId` or
/// `X-Org-Id`.
#[utoipa::path(get, path = "/api/projects", tag = "projects", security(("apiKey" = []), ("session" = [])),
    params(("orgId" = Option<String>, Query, description = "Only this organization's projects")),
    responses((status = 200, body = Vec<ProjectView>), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn list_projects(caller: Caller) -> ApiResult<HttpResponse> {
    let orgs = caller.named_or_all_orgs().await?;
    let projects = keel_core::traces::settings::list(&caller.state().db, &orgs).await?;
    Ok(HttpResponse::Ok().json(projects.into_iter().map(ProjectView::from).collect::<Vec<_>>()))
}

/// Read a project
///
/// One project of the caller's organizations; another organization's project is 404.
#[utoipa::path(get, path = "/api/projects/{project_id}", tag = "projects", security(("apiKey" = []), ("session" = [])),
    params(("project_id" = String, Path, format = Uuid)),
    responses((status = 200, body = ProjectView), (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
pub async fn get_project(caller: Caller, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let project_id = path_id("project_id", &path, keel_core::domain::ProjectId::parse)?;
    let orgs = caller.organizations().await?;
    let project = keel_core::traces::settings::detail(&caller.state().db, &orgs, &project_id).await?;
    Ok(HttpResponse::Ok().json(ProjectView::from(project)))
}

/// Change a project
///
/// Only the fields given change. Any member sets how many days the project keeps its traces
/// (`traceRetentionDays`, 1 to 3650; `null` keeps them forever; a sweep on every instance
/// deletes older traces in batches). An owner's session sets where its recorded calls are
/// pushed as OpenTelemetry spans (`otlpExport: {endpoint, headers}`, OTLP/HTTP protobuf to
/// `<endpoint>/v1/traces`; `null`: nowhere, and what waited is dropped): a body that carries
/// `otlpExport` from anyone else is 403 and changes nothing. The headers are stored
/// encrypted and never shown again; the view shows their names. Another organization's
/// project is 404.
#[utoipa::path(patch, path = "/api/projects/{project_id}", tag = "projects", security(("apiKey" = []), ("session" = [])),
    params(("project_id" = String, Path, format = Uuid)),
    request_body = ProjectPatchBody,
    responses((status = 200, body = ProjectView), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody),
        (status = 503, description = "Headers given and no secrets key configured", body = ErrorBody)))]
pub async fn patch_project(
    caller: Caller,
    path: web::Path<String>,
    body: ValidJson<ProjectPatchBody>,
) -> ApiResult<HttpResponse> {
    let project_id = path_id("project_id", &path, keel_core::domain::ProjectId::parse)?;
    let orgs = caller.organizations().await?;
    let state = caller.state();
    if body.0.otlp_export.is_some() {
        // Where a project's calls go is the owner's to say: checked before anything changes.
        let project = service::project_of(&state.db, &orgs, &project_id).await?;
        caller.owner(Some(&project.org_id)).await?;
    }
    let project =
        keel_core::traces::settings::change(&state.db, &state.push, &orgs, &project_id, body.0.change())
            .await?;
    Ok(HttpResponse::Ok().json(ProjectView::from(project)))
}
