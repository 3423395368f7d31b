//! `POST /api/evals/runs`.

use actix_web::HttpResponse;
use keel_core::evals::{service, EvalUpload};

use super::dto::{EvalRunUploadRequest, EvalRunUploadResponse};
use crate::auth::Caller;
use crate::error::{ApiResult, ErrorBody, ValidationErrorBody};
use crate::http::extract::ValidJson;

/// Upload an eval run
///
/// Stores an eval run with its cases for a project of the caller's organization and derives
/// total, passed, graded and errored counts and the mean score.
#[utoipa::path(post, path = "/api/evals/runs", tag = "evals", security(("apiKey" = []), ("session" = [])),
    request_body = EvalRunUploadRequest,
    responses(
        (status = 200, body = EvalRunUploadResponse),
        (status = 404, description = "No such project in the caller's organization", body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn upload_eval_run(
    caller: Caller,
    body: ValidJson<EvalRunUploadRequest>,
) -> ApiResult<HttpResponse> {
    let orgs = caller.organizations().await?;
    let upload = EvalUpload::try_from(body.0)?;
    let (id, derived) = service::upload_run(&caller.state().db, &orgs, &upload).await?;
    Ok(HttpResponse::Ok().json(EvalRunUploadResponse {
        ok: true,
        eval_run_id: id,
        total_cases: derived.total,
        passed_cases: derived.passed,
        graded_cases: derived.graded,
        errored_cases: derived.errored,
        mean_score: derived.mean_score,
    }))
}
