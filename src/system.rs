//! `GET /healthz`, `GET /openapi.json`, `GET /metrics`.

use actix_web::{web, HttpResponse};
use prometheus::{Encoder, Registry, TextEncoder};
use serde::Serialize;
use utoipa::ToSchema;

use crate::auth::Internal;
use crate::error::{ApiError, ApiResult, ErrorBody};
use crate::state::AppState;

#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    pub ok: bool,
    pub database: bool,
}

#[utoipa::path(get, path = "/healthz", tag = "system",
    responses((status = 200, body = Health), (status = 503, description = "Database unreachable", body = Health)))]
pub async fn healthz(state: web::Data<AppState>) -> HttpResponse {
    let database = state.db.ping().await.is_ok();
    let body = Health {
        ok: database,
        database,
    };
    if database {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}

#[utoipa::path(get, path = "/openapi.json", tag = "system",
    responses((status = 200, description = "This OpenAPI 3.1 document", content_type = "application/json")))]
pub async fn openapi_json(doc: web::Data<utoipa::openapi::OpenApi>) -> HttpResponse {
    HttpResponse::Ok().json(doc.get_ref())
}

#[utoipa::path(get, path = "/metrics", tag = "system", security(("bearer" = [])),
    responses((status = 200, description = "Prometheus text exposition", content_type = "text/plain"),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn metrics(_: Internal, registry: web::Data<Registry>) -> ApiResult<HttpResponse> {
    crate::telemetry::refresh_metrics();
    let mut buffer = Vec::new();
    TextEncoder::new()
        .encode(&registry.gather(), &mut buffer)
        .map_err(|e| ApiError::Unexpected(e.into()))?;
    Ok(HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(buffer))
}
