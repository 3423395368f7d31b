//! `POST /api/serving/authorize`, `POST /api/serving/teardown`, `POST /api/sample`.

use actix_web::{web, HttpResponse};

use super::client::SampleFailure;
use super::dto::{
    SampleErrorResponse, SampleRequest, SampleResponse, ServingAuthorizeBody, ServingAuthorized,
    ServingTeardownBody, TeardownReport,
};
use super::service;
use crate::auth::{Internal, Member, Owner};
use crate::error::{ApiResult, ErrorBody, ValidationErrorBody};
use crate::http::extract::ValidJson;
use crate::state::AppState;

#[utoipa::path(post, path = "/api/serving/authorize", tag = "serving", security(("bearer" = [])),
    request_body = ServingAuthorizeBody,
    responses(
        (status = 200, body = ServingAuthorized),
        (status = 401, description = "Invalid API key (or no internal key)", body = ErrorBody),
        (status = 403, description = "The key's organization does not own the adapter", body = ErrorBody),
        (status = 404, description = "Unknown or unattributed adapter", body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn authorize(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<ServingAuthorizeBody>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    let (org_id, base_model) = service::authorize(&state, &body.api_key, &body.adapter_id).await?;
    Ok(HttpResponse::Ok().json(ServingAuthorized {
        org_id,
        adapter_id: body.adapter_id,
        base_model,
    }))
}

#[utoipa::path(post, path = "/api/serving/teardown", tag = "serving", security(("bearer" = [])),
    request_body = ServingTeardownBody,
    responses(
        (status = 200, body = TeardownReport),
        (status = 403, description = "Not an owner's session", body = ErrorBody),
        (status = 503, description = "Live adapters but no serving layer configured", body = ErrorBody),
    ))]
pub async fn teardown(owner: Owner<ValidJson<ServingTeardownBody>>) -> ApiResult<HttpResponse> {
    let report = service::teardown(&owner.state, &owner.access.org_id).await?;
    Ok(HttpResponse::Ok().json(report))
}

#[utoipa::path(post, path = "/api/sample", tag = "serving", security(("bearer" = [])),
    request_body = SampleRequest,
    responses(
        (status = 200, body = SampleResponse),
        (status = 403, description = "The caller's organization does not own the adapter", body = ErrorBody),
        (status = 404, description = "Unknown adapter", body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
        (status = 500, description = "The serving layer failed or timed out", body = SampleErrorResponse),
    ))]
pub async fn sample(member: Member<ValidJson<SampleRequest>>) -> ApiResult<HttpResponse> {
    let (access, body, state) = (member.access, member.input.0, &member.state);
    service::resolve_model(state, &access.org_id, &body.model).await?;
    match service::sample(state, &access.org_id, body).await {
        Ok(sampled) => Ok(HttpResponse::Ok().json(sampled)),
        Err(failure) => {
            tracing::warn!(
                error = &failure as &dyn std::error::Error,
                code = failure.code(),
                "sample failed"
            );
            Ok(sample_failed(&failure))
        }
    }
}

fn sample_failed(failure: &SampleFailure) -> HttpResponse {
    HttpResponse::InternalServerError().json(SampleErrorResponse {
        error: failure.code().to_owned(),
        detail: failure.to_string(),
    })
}
