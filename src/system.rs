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
    /// Present, `false`, only when ledger operations have waited `billing.stall_after_secs`
    /// without the ledger committing any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ledger: Option<bool>,
    /// Present, `true`, only once the process is shutting down (it still answers, with
    /// `Connection: close`, for `server.shutdown_grace_secs`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub draining: Option<bool>,
}

/// Health
///
/// 200 when the service, its database and its ledger answer; 503 when the database does
/// not, the ledger has committed nothing for a while although work waits, or the process is
/// shutting down (take it out of rotation).
#[utoipa::path(get, path = "/healthz", tag = "system",
    responses((status = 200, body = Health),
        (status = 503, description = "Database unreachable, ledger stalled, or shutting down", body = Health)))]
pub async fn healthz(state: web::Data<AppState>) -> HttpResponse {
    // Its own bound: an unreachable database is a prompt 503, never a probe that hangs.
    let readiness = state.readiness().await;
    let ok = readiness.ok();
    let body = Health {
        ok,
        database: readiness.database,
        ledger: (!readiness.ledger).then_some(false),
        draining: readiness.draining.then_some(true),
    };
    if ok {
        HttpResponse::Ok().json(body)
    } else {
        HttpResponse::ServiceUnavailable().json(body)
    }
}

/// This document
///
/// The OpenAPI 3.1 document of every route.
#[utoipa::path(get, path = "/openapi.json", tag = "system",
    responses((status = 200, description = "This OpenAPI 3.1 document", content_type = "application/json")))]
pub async fn openapi_json(doc: web::Data<OpenApiJson>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(doc.0.clone())
}

/// The served OpenAPI document, serialized once at startup (`crate::openapi::served`).
pub struct OpenApiJson(pub actix_web::web::Bytes);

/// Prometheus metrics
///
/// Internal key: HTTP, queue, money, proxy, cluster and trace-writer metrics in Prometheus
/// text format (docs/OPERATIONS.md lists them).
#[utoipa::path(get, path = "/metrics", tag = "system", security(("internalKey" = [])),
    responses((status = 200, description = "Prometheus text exposition", content_type = "text/plain"),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn metrics(
    _: Internal,
    state: web::Data<AppState>,
    registry: web::Data<Registry>,
) -> ApiResult<HttpResponse> {
    crate::telemetry::refresh_metrics();
    state.refresh_metrics().await;
    state
        .metrics
        .spans_export_lag
        .set(crate::telemetry::otlp::lag_seconds());
    let mut buffer = Vec::new();
    TextEncoder::new()
        .encode(&registry.gather(), &mut buffer)
        .map_err(|e| ApiError::Unexpected(e.into()))?;
    Ok(HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4")
        .body(buffer))
}
