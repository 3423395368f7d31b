//! `POST|GET /api/datasets`, `GET|PATCH|DELETE /api/datasets/{id}`, its versions and their
//! export; and the worker's read of its job's dataset.

use actix_web::{web, HttpResponse};
use futures_util::StreamExt;

use super::dto::{
    DatasetCreateBody, DatasetList, DatasetListQuery, DatasetPatchBody, DatasetVersionBody, DatasetView,
    ExportQuery, JobDatasetQuery,
};
use crate::auth::{Caller, Internal};
use crate::error::{ApiResult, ErrorBody, ValidationErrorBody};
use crate::http::extract::{ValidJson, ValidQuery};
use crate::state::AppState;
use keel_core::datasets::export::Export;
use keel_core::datasets::{export, service, DatasetError, DatasetPatch, SplitPart};
use keel_core::domain::{DatasetId, ProjectId};

fn dataset_id(raw: &str) -> Result<DatasetId, DatasetError> {
    DatasetId::parse(raw).map_err(|_| DatasetError::DatasetNotFound)
}

/// Create a dataset
///
/// A named, frozen selection of a project's traces (any member): the filter's matches (as
/// `GET /api/traces` reads it) and the listed ids, keeping the traces the training formats
/// take (complete, no error, a request with messages and an answer with a choice), deduped
/// by prompt if asked, split by trace id and seed. Version 1's lines never change.
#[utoipa::path(post, path = "/api/datasets", tag = "datasets", security(("apiKey" = []), ("session" = [])),
    request_body = DatasetCreateBody,
    responses(
        (status = 201, body = DatasetView),
        (status = 401, body = ErrorBody),
        (status = 403, body = ErrorBody),
        (status = 404, description = "No such project in the caller's organizations", body = ErrorBody),
        (status = 409, description = "The project has a dataset of this name", body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn create_dataset(caller: Caller, body: ValidJson<DatasetCreateBody>) -> ApiResult<HttpResponse> {
    let orgs = caller.organizations().await?;
    let dataset = service::create(&caller.state().db, &orgs, body.0.into_core()).await?;
    Ok(HttpResponse::Created().json(DatasetView::from(dataset)))
}

/// List a project's datasets
///
/// Newest first, each with its versions and the jobs that used them.
#[utoipa::path(get, path = "/api/datasets", tag = "datasets", security(("apiKey" = []), ("session" = [])),
    params(DatasetListQuery),
    responses((status = 200, body = DatasetList), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, description = "No such project in the caller's organizations", body = ErrorBody),
        (status = 422, body = ValidationErrorBody)))]
pub async fn list_datasets(caller: Caller, query: ValidQuery<DatasetListQuery>) -> ApiResult<HttpResponse> {
    let orgs = caller.organizations().await?;
    let project_id = ProjectId::parse(&query.0.project_id).map_err(|_| DatasetError::ProjectNotFound)?;
    let datasets = service::list(&caller.state().db, &orgs, &project_id).await?;
    Ok(HttpResponse::Ok().json(DatasetList {
        datasets: datasets.into_iter().map(DatasetView::from).collect(),
    }))
}

/// Read a dataset
///
/// Its versions (counts, split digests, the filter each ran) and, for each, the jobs that
/// trained on it with their states. Another organization's dataset is 404.
#[utoipa::path(get, path = "/api/datasets/{dataset_id}", tag = "datasets", security(("apiKey" = []), ("session" = [])),
    params(("dataset_id" = String, Path)),
    responses((status = 200, body = DatasetView), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
pub async fn get_dataset(caller: Caller, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let id = dataset_id(&path)?;
    let orgs = caller.organizations().await?;
    let dataset = service::get(&caller.state().db, &orgs, &id).await?;
    Ok(HttpResponse::Ok().json(DatasetView::from(dataset)))
}

/// Rename a dataset
///
/// Changes its name (unique in the project) or description; its versions stay as they are.
#[utoipa::path(patch, path = "/api/datasets/{dataset_id}", tag = "datasets", security(("apiKey" = []), ("session" = [])),
    params(("dataset_id" = String, Path)),
    request_body = DatasetPatchBody,
    responses((status = 200, body = DatasetView), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "The project has a dataset of this name", body = ErrorBody),
        (status = 422, body = ValidationErrorBody)))]
pub async fn patch_dataset(
    caller: Caller,
    path: web::Path<String>,
    body: ValidJson<DatasetPatchBody>,
) -> ApiResult<HttpResponse> {
    let id = dataset_id(&path)?;
    let orgs = caller.organizations().await?;
    let body = body.0;
    let patch = DatasetPatch {
        name: body.name,
        description: body.description,
    };
    let dataset = service::update(&caller.state().db, &orgs, &id, patch).await?;
    Ok(HttpResponse::Ok().json(DatasetView::from(dataset)))
}

/// Delete a dataset
///
/// With its versions and lines. A dataset a job that is not over trains on is 409.
#[utoipa::path(delete, path = "/api/datasets/{dataset_id}", tag = "datasets", security(("apiKey" = []), ("session" = [])),
    params(("dataset_id" = String, Path)),
    responses((status = 204, description = "Deleted"), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "A job that is not over trains on it", body = ErrorBody),
        (status = 422, body = ValidationErrorBody)))]
pub async fn delete_dataset(caller: Caller, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let id = dataset_id(&path)?;
    let orgs = caller.organizations().await?;
    service::delete(&caller.state().db, &orgs, &id).await?;
    Ok(HttpResponse::NoContent().finish())
}

/// Make a dataset version
///
/// The latest version's selection with `filter`'s matches and `traceIds.add`, less
/// `traceIds.remove`; an empty body runs the last filter a version ran again (new traces
/// join, those already in keep their lines). The split and dedupe are the dataset's.
#[utoipa::path(post, path = "/api/datasets/{dataset_id}/versions", tag = "datasets", security(("apiKey" = []), ("session" = [])),
    params(("dataset_id" = String, Path)),
    request_body = DatasetVersionBody,
    responses((status = 201, body = DatasetView), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "Another version was made meanwhile", body = ErrorBody),
        (status = 422, body = ValidationErrorBody)))]
pub async fn create_version(
    caller: Caller,
    path: web::Path<String>,
    body: ValidJson<DatasetVersionBody>,
) -> ApiResult<HttpResponse> {
    let id = dataset_id(&path)?;
    let orgs = caller.organizations().await?;
    let dataset = service::new_version(&caller.state().db, &orgs, &id, body.0.into_core()).await?;
    Ok(HttpResponse::Created().json(DatasetView::from(dataset)))
}

/// Export a dataset version
///
/// Its lines as JSONL (`application/x-ndjson`), streamed, in the version's order: each as
/// the trace export's same format writes it. `X-Dataset-Lines` and `X-Dataset-Sha256` (of
/// the body's bytes) say what to expect; the same bytes every time.
#[utoipa::path(get, path = "/api/datasets/{dataset_id}/versions/{version}/export", tag = "datasets", security(("apiKey" = []), ("session" = [])),
    params(("dataset_id" = String, Path), ("version" = i32, Path, minimum = 1), ExportQuery),
    responses(
        (status = 200, description = "JSONL, a line each", content_type = "application/x-ndjson", body = String,
            headers(("X-Dataset-Lines" = i64, description = "Lines of the split (the body's, from offset 0)"),
                    ("X-Dataset-Sha256" = String, description = "SHA-256 (hex) of the split's lines (the body's, from offset 0)"))),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 422, body = ValidationErrorBody)))]
pub async fn export_version(
    caller: Caller,
    path: web::Path<(String, String)>,
    query: ValidQuery<ExportQuery>,
) -> ApiResult<HttpResponse> {
    let (id, version) = path.into_inner();
    let id = dataset_id(&id)?;
    // Text that is no version number names no version (404, as an unknown one).
    let version: i32 = version.parse().map_err(|_| DatasetError::VersionNotFound)?;
    let orgs = caller.organizations().await?;
    let state = caller.state();
    let query = query.0;
    let export = export::export(
        &state.db,
        &orgs,
        &id,
        Some(version),
        query.format(),
        query.part(SplitPart::All),
        query.offset(),
        state.metrics.clone(),
    )
    .await?;
    Ok(streamed(export))
}

/// Read the job's dataset
///
/// Internal key (the worker that holds the job while it runs, named by `worker_id`; any
/// other, or none, is 409): the lines of the dataset version the job pinned, as JSONL,
/// `openai-chat` by default, the train split by default.
#[utoipa::path(get, path = "/api/training/internal/jobs/{job_id}/dataset", tag = "training-internal", security(("internalKey" = [])),
    params(("job_id" = String, Path), JobDatasetQuery),
    responses(
        (status = 200, description = "JSONL, a line each", content_type = "application/x-ndjson", body = String,
            headers(("X-Dataset-Lines" = i64, description = "Lines of the split (the body's, from offset 0)"),
                    ("X-Dataset-Sha256" = String, description = "SHA-256 (hex) of the split's lines (the body's, from offset 0)"))),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
pub async fn job_dataset(
    _: Internal,
    state: web::Data<AppState>,
    path: web::Path<String>,
    query: ValidQuery<JobDatasetQuery>,
) -> ApiResult<HttpResponse> {
    let job_id = crate::queue::known_job(&path)?;
    let asked = query.0.export();
    let export = export::for_job(
        &state.db,
        &job_id,
        query.0.worker_id.as_deref(),
        asked.format(),
        asked.part(SplitPart::Train),
        asked.offset(),
        state.metrics.clone(),
    )
    .await?;
    Ok(streamed(export))
}

pub(crate) fn streamed(export: Export) -> HttpResponse {
    let filename = format!(
        "dataset-{}-v{}-{}.{}.jsonl",
        export.dataset_id,
        export.version,
        export.part.as_str(),
        export.format.as_str()
    );
    let dataset_id = export.dataset_id.clone();
    let body = export.body.map(move |page| {
        page.map(actix_web::web::Bytes::from).map_err(|err| {
            tracing::error!(dataset_id = %dataset_id, error = %err, "a dataset export broke off");
            actix_web::error::ErrorInternalServerError("the export broke off")
        })
    });
    HttpResponse::Ok()
        .content_type("application/x-ndjson")
        .insert_header(("X-Dataset-Lines", export.lines.to_string()))
        .insert_header(("X-Dataset-Sha256", export.sha256))
        .insert_header(("X-Dataset-Version", export.version.to_string()))
        .insert_header((
            "Content-Disposition",
            format!("attachment; filename=\"{filename}\""),
        ))
        .streaming(body)
}
