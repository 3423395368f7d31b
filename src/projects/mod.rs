//! `GET/POST /api/projects`, `GET /api/projects/{project_id}`.

pub mod repo;
pub mod service;

use actix_web::{web, HttpResponse};
use chrono::{DateTime, Utc};
use entities::project;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::auth::{Caller, Member};
use crate::domain::OrgId;
use crate::error::{ApiError, ApiResult, ErrorBody, ValidationErrorBody};
use crate::http::extract::{path_uuid, ValidJson};
use crate::http::validate::{Checks, Validate};
use crate::orgs::SLUG_RE;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProjectCreateBody {
    /// The organization; with an API key it may be omitted (the key's own).
    #[schema(value_type = Option<String>, min_length = 1, max_length = 100)]
    pub org_id: Option<OrgId>,
    /// Not only whitespace.
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\u0000]*[^\\u0000\\t-\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000][^\\u0000]*$"
    )]
    pub name: String,
    /// Unique within the organization; derived from the name when absent.
    #[schema(min_length = 1, max_length = 100, pattern = r"^[a-z0-9][a-z0-9._-]*$")]
    pub slug: Option<String>,
    #[schema(max_length = 2000)]
    pub description: Option<String>,
}

impl Validate for ProjectCreateBody {
    fn validate(&self, c: &mut Checks) {
        c.opt_str_len("orgId", self.org_id.as_deref(), 1, 100);
        c.display_name("name", &self.name, 200);
        if let Some(slug) = &self.slug {
            c.str_len("slug", slug, 1, 100);
            c.pattern("slug", slug, &SLUG_RE);
        }
        c.opt_str_len("description", self.description.as_deref(), 0, 2000);
    }
}

/// The answer to a create: strings and a boolean only.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProjectCreated {
    pub id: String,
    pub org_id: String,
    pub name: String,
    pub slug: String,
    pub active: bool,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProjectView {
    pub id: String,
    pub org_id: String,
    pub name: String,
    pub slug: String,
    pub description: Option<String>,
    pub active: bool,
    pub created_at: DateTime<Utc>,
}

impl From<project::Model> for ProjectView {
    fn from(p: project::Model) -> Self {
        Self {
            id: p.id,
            org_id: p.org_id,
            name: p.name,
            slug: p.slug,
            description: p.description,
            active: p.active,
            created_at: p.created_at,
        }
    }
}

crate::org_scoped!(ProjectCreateBody);

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
        id: project.id,
        org_id: project.org_id,
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
    let orgs = if caller.named_org() {
        vec![caller.member(None).await?.org_id]
    } else {
        caller.organizations().await?
    };
    let projects = repo::list_for_orgs(&caller.state().db, &orgs).await?;
    Ok(HttpResponse::Ok().json(projects.into_iter().map(ProjectView::from).collect::<Vec<_>>()))
}

/// Read a project
///
/// One project of the caller's organizations; another organization's project is 404.
#[utoipa::path(get, path = "/api/projects/{project_id}", tag = "projects", security(("apiKey" = []), ("session" = [])),
    params(("project_id" = String, Path, format = Uuid)),
    responses((status = 200, body = ProjectView), (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
pub async fn get_project(caller: Caller, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let project_id = path_uuid("project_id", &path)?;
    let orgs = caller.organizations().await?;
    let project = repo::find_in_orgs(&caller.state().db, &project_id, &orgs)
        .await?
        .ok_or_else(|| ApiError::not_found("project"))?;
    Ok(HttpResponse::Ok().json(ProjectView::from(project)))
}
