//! `POST /api/serving/authorize`, `POST /api/serving/teardown`, `POST /api/sample`.

use actix_web::{web, HttpResponse};

use super::dto::{
    SampleErrorResponse, SampleRequest, SampleResponse, ServingAuthorizeBody, ServingAuthorized,
    ServingTeardownBody, TeardownReport,
};
use crate::auth::{Internal, Owner};
use crate::error::{ApiResult, Code, ErrorBody, ValidationErrorBody};
use crate::http::extract::ValidJson;
use crate::state::AppState;
use keel_core::serving::client::SampleFailure;
use keel_core::serving::service;
use keel_core::serving::Sample;

/// Authorize a serving call
///
/// Internal key (the serving layer): resolves a user API key's organization and requires it to
/// own the requested adapter (403 otherwise). A priced base model is authorized for any valid
/// key and billed to its organization. The key's settings hold here as on the proxy: its
/// `models` list (the adapter's id or its base model; 403 `model_not_allowed`) and its
/// `requestsPerMinute` and `tokensPerDay` (429 `rate_limit_exceeded` with `Retry-After`).
#[utoipa::path(post, path = "/api/serving/authorize", tag = "serving", security(("internalKey" = [])),
    request_body = ServingAuthorizeBody,
    responses(
        (status = 200, body = ServingAuthorized),
        (status = 401, description = "Invalid API key (or no internal key)", body = ErrorBody),
        (status = 403, description = "The key's organization does not own the adapter, or the key may not call it", body = ErrorBody),
        (status = 404, description = "Unknown or unattributed adapter", body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
        (status = 429, description = "A limit of the key refused the call (`Retry-After` says when to try again)", body = ErrorBody),
    ))]
pub async fn authorize(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<ServingAuthorizeBody>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    let (org_id, base_model) = service::authorize(&state.serving, &body.api_key, &body.adapter_id).await?;
    Ok(HttpResponse::Ok().json(ServingAuthorized {
        org_id: org_id.into(),
        adapter_id: body.adapter_id,
        base_model,
    }))
}

/// Tear down an organization's adapters
///
/// Owner's session: undeploys every live adapter of the organization, best-effort per adapter,
/// and answers per-adapter counts.
#[utoipa::path(post, path = "/api/serving/teardown", tag = "serving", security(("session" = [])),
    request_body = ServingTeardownBody,
    responses(
        (status = 200, body = TeardownReport),
        (status = 403, description = "Not an owner's session", body = ErrorBody),
        (status = 503, description = "Live adapters but no serving layer configured", body = ErrorBody),
    ))]
pub async fn teardown(owner: Owner<ValidJson<ServingTeardownBody>>) -> ApiResult<HttpResponse> {
    let report = service::teardown(&owner.state.serving, &owner.access.org_id).await?;
    Ok(HttpResponse::Ok().json(TeardownReport::from(report)))
}

/// Sample a served model
///
/// Machine-to-machine (the operator internal key, as the sample proxy calls it): sends the
/// conversation to the serving layer's chat completions for `model`, an adapter of any
/// organization or a priced base model, and answers the reply's text. A user credential is
/// 403. A failure of the serving layer (unreachable, timed out, an error status, or none
/// configured) is a 500 naming the failure in `error`.
#[utoipa::path(post, path = "/api/sample", tag = "serving", security(("internalKey" = [])),
    request_body = SampleRequest,
    responses(
        (status = 200, body = SampleResponse),
        (status = 403, description = "A user credential: this route takes the internal key", body = ErrorBody),
        (status = 404, description = "No adapter and no priced base model of that name", body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
        (status = 500, description = "The serving layer failed, timed out or is not configured", body = SampleErrorResponse),
    ))]
pub async fn sample(
    _: Internal,
    state: web::Data<AppState>,
    body: ValidJson<SampleRequest>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    let owner = service::sample_target(&state.serving, &body.model).await?;
    match service::sample(
        &state.serving,
        owner.as_ref().map(keel_core::domain::OrgId::as_str),
        Sample::from(body),
    )
    .await
    {
        Ok(sampled) => Ok(HttpResponse::Ok().json(SampleResponse::from(sampled))),
        Err(failure) => {
            tracing::warn!(
                error = &failure as &dyn std::error::Error,
                code = sample_code(&failure).as_str(),
                "sample failed"
            );
            Ok(sample_failed(&failure))
        }
    }
}

fn sample_failed(failure: &SampleFailure) -> HttpResponse {
    let code = sample_code(failure);
    HttpResponse::InternalServerError().json(SampleErrorResponse {
        error: code.as_str().to_owned(),
        detail: failure.to_string(),
        code,
    })
}

/// How a sample failed, as `error` and `code` name it.
fn sample_code(failure: &SampleFailure) -> Code {
    use keel_core::peer::{CallFailure, PeerError};
    match failure {
        SampleFailure::NotConfigured => Code::ServingNotConfigured,
        SampleFailure::Call(PeerError::Call {
            failure: CallFailure::Timeout,
            ..
        }) => Code::ServingTimeout,
        SampleFailure::Call(_) => Code::ServingUnreachable,
        SampleFailure::Status { .. } => Code::ServingError,
        SampleFailure::BadResponse => Code::ServingBadResponse,
    }
}
