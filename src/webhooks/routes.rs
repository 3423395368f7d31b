//! `/api/webhooks/...`: any member manages its organization's endpoints (API keys included).

use actix_web::{web, HttpResponse};
use chrono::{DateTime, Utc};
use keel_core::domain::DeliveryStatus;
use keel_core::paging::Keyset;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::dto::{
    DeliveryPage, DeliveryView, EndpointCreateBody, EndpointCreated, EndpointList, EndpointPatchBody,
    EndpointView, RotatedSecret,
};
use crate::auth::{Caller, Member};
use crate::error::{ApiResult, ErrorBody, ValidationErrorBody};
use crate::http::extract::{path_str, ValidJson, ValidQuery};
use crate::http::validate::{Checks, Validate};
use keel_core::webhooks::service::{self, EndpointChange, NewEndpoint};

fn endpoint_id(raw: &str) -> ApiResult<String> {
    path_str("endpoint_id", raw, 1, 64)
}

/// Create a webhook endpoint
///
/// Any member: keel will POST the organization's `events` (or `"*"`: all) to `url`, signed
/// as Standard Webhooks. The answer carries the endpoint's `secret`, shown this once. The URL
/// must be `https://` and must not point at a loopback, private, link-local or other
/// non-public address (unless the operator allows them): 422 otherwise.
#[utoipa::path(post, path = "/api/webhooks/endpoints", tag = "webhooks", security(("apiKey" = []), ("session" = [])),
    request_body = EndpointCreateBody,
    responses((status = 201, body = EndpointCreated), (status = 403, body = ErrorBody),
        (status = 409, description = "The organization has `webhooks.max_endpoints_per_org` endpoints already (`endpoint_limit_reached`)", body = ErrorBody),
        (status = 422, body = ValidationErrorBody), (status = 503, description = "No encryption key configured", body = ErrorBody)))]
pub async fn create_endpoint(member: Member<ValidJson<EndpointCreateBody>>) -> ApiResult<HttpResponse> {
    let body = member.input.0;
    let new = NewEndpoint {
        url: body.url,
        events: body.events,
        description: body.description,
    };
    let (endpoint, secret) =
        service::create_endpoint(&member.state.webhooks, &member.access.org_id, new).await?;
    Ok(HttpResponse::Created().json(EndpointCreated {
        endpoint: EndpointView::from(endpoint),
        secret,
    }))
}

/// List webhook endpoints
///
/// The endpoints of the organization named by `orgId` or `X-Org-Id`, else of every
/// organization the caller belongs to; oldest first.
#[utoipa::path(get, path = "/api/webhooks/endpoints", tag = "webhooks", security(("apiKey" = []), ("session" = [])),
    params(("orgId" = Option<String>, Query, description = "Only this organization's endpoints")),
    responses((status = 200, body = EndpointList), (status = 403, body = ErrorBody)))]
pub async fn list_endpoints(caller: Caller) -> ApiResult<HttpResponse> {
    let orgs = caller.named_or_all_orgs().await?;
    let endpoints = service::endpoints(&caller.state().webhooks, &orgs).await?;
    Ok(HttpResponse::Ok().json(EndpointList {
        endpoints: endpoints.into_iter().map(EndpointView::from).collect(),
    }))
}

/// Read a webhook endpoint
///
/// One endpoint of the caller's organizations (another organization's is 404).
#[utoipa::path(get, path = "/api/webhooks/endpoints/{endpoint_id}", tag = "webhooks", security(("apiKey" = []), ("session" = [])),
    params(("endpoint_id" = String, Path)),
    responses((status = 200, body = EndpointView), (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
pub async fn get_endpoint(caller: Caller, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let orgs = caller.named_or_all_orgs().await?;
    let endpoint = service::endpoint(&caller.state().webhooks, &orgs, &endpoint_id(&path)?).await?;
    Ok(HttpResponse::Ok().json(EndpointView::from(endpoint)))
}

/// Change a webhook endpoint
///
/// Sets the fields given: `url` (checked as at creation), `events`, `description` (`null`
/// clears it), `enabled` (false stops its deliveries; true resumes them and clears
/// `disabledReason`).
#[utoipa::path(patch, path = "/api/webhooks/endpoints/{endpoint_id}", tag = "webhooks", security(("apiKey" = []), ("session" = [])),
    params(("endpoint_id" = String, Path)),
    request_body(content = EndpointPatchBody, description = "Only the fields given change; an empty body changes nothing."),
    responses((status = 200, body = EndpointView), (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
pub async fn update_endpoint(
    caller: Caller,
    path: web::Path<String>,
    body: ValidJson<EndpointPatchBody>,
) -> ApiResult<HttpResponse> {
    let orgs = caller.named_or_all_orgs().await?;
    let body = body.0;
    let change = EndpointChange {
        url: body.url,
        events: body.events,
        description: body.description,
        enabled: body.enabled,
    };
    let endpoint =
        service::update_endpoint(&caller.state().webhooks, &orgs, &endpoint_id(&path)?, change).await?;
    Ok(HttpResponse::Ok().json(EndpointView::from(endpoint)))
}

/// Delete a webhook endpoint
///
/// The endpoint and its delivery log go; nothing more is sent to it.
#[utoipa::path(delete, path = "/api/webhooks/endpoints/{endpoint_id}", tag = "webhooks", security(("apiKey" = []), ("session" = [])),
    params(("endpoint_id" = String, Path)),
    responses((status = 204), (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
pub async fn delete_endpoint(caller: Caller, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let orgs = caller.named_or_all_orgs().await?;
    service::delete_endpoint(&caller.state().webhooks, &orgs, &endpoint_id(&path)?).await?;
    Ok(HttpResponse::NoContent().finish())
}

/// Rotate a webhook endpoint's secret
///
/// A new secret, shown this once; the one it replaces keeps signing beside it for 24 hours
/// (two signatures in `webhook-signature`), so receivers switch without missing a delivery.
#[utoipa::path(post, path = "/api/webhooks/endpoints/{endpoint_id}/rotate-secret", tag = "webhooks", security(("apiKey" = []), ("session" = [])),
    params(("endpoint_id" = String, Path)),
    responses((status = 200, body = RotatedSecret), (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
pub async fn rotate_secret(caller: Caller, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let orgs = caller.named_or_all_orgs().await?;
    let (secret, until) =
        service::rotate_secret(&caller.state().webhooks, &orgs, &endpoint_id(&path)?).await?;
    Ok(HttpResponse::Ok().json(RotatedSecret {
        secret,
        previous_secret_until: until,
    }))
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeliveryQueued {
    pub delivery_id: String,
}

/// Send a test event
///
/// Queues a `webhook.test` event (`data: {endpointId}`) for the endpoint, whatever it
/// subscribes to; its delivery shows in the endpoint's log.
#[utoipa::path(post, path = "/api/webhooks/endpoints/{endpoint_id}/test", tag = "webhooks", security(("apiKey" = []), ("session" = [])),
    params(("endpoint_id" = String, Path)),
    responses((status = 202, body = DeliveryQueued), (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody),
        (status = 429, description = "More than 10 test deliveries of this endpoint in a minute (`Retry-After` says when)", body = ErrorBody)))]
pub async fn send_test(caller: Caller, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let orgs = caller.named_or_all_orgs().await?;
    let delivery_id = service::send_test(&caller.state().webhooks, &orgs, &endpoint_id(&path)?).await?;
    Ok(HttpResponse::Accepted().json(DeliveryQueued { delivery_id }))
}

/// A page of deliveries: `status` narrows them; `cursor` is the last page's `nextCursor`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(rename_all = "camelCase")]
pub struct DeliveriesQuery {
    /// `pending`, `succeeded` or `failed`.
    #[param(value_type = Option<crate::schemas::DeliveryStatus>)]
    pub status: Option<String>,
    /// The previous page's `nextCursor`.
    #[param(pattern = "^[0-9]{1,12}-[0-9]{9}-[0-9a-f]{32}$")]
    pub cursor: Option<String>,
    /// 1..100, default 50.
    #[param(minimum = 1, maximum = 100)]
    pub limit: Option<u64>,
    /// The organization (else any of the caller's).
    #[serde(rename = "orgId")]
    pub org_id: Option<String>,
}

impl Validate for DeliveriesQuery {
    fn validate(&self, c: &mut Checks) {
        if let Some(status) = &self.status {
            c.one_of("status", status, &DeliveryStatus::ALL.map(DeliveryStatus::as_str));
        }
        if let Some(limit) = self.limit {
            if !(1..=100).contains(&limit) {
                c.fail("limit", "less_than_equal", "1 to 100");
            }
        }
        if let Some(cursor) = &self.cursor {
            if decode_cursor(cursor).is_none() {
                c.fail("cursor", "value_error", "not a cursor this listing gave");
            }
        }
    }
}

/// A delivery page's cursor: the shared keyset cursor of keel's lists.
pub(crate) fn decode_cursor(raw: &str) -> Option<(DateTime<Utc>, String)> {
    Keyset::decode(raw).map(|k| (k.at, k.id))
}

pub(crate) fn encode_cursor(at: DateTime<Utc>, id: &str) -> String {
    Keyset::new(at, id).encode()
}

/// List an endpoint's deliveries
///
/// Newest first, each with its attempts (time, status code, latency, the first 1 KiB of the
/// answer); `status` narrows them; `nextCursor` pages on.
#[utoipa::path(get, path = "/api/webhooks/endpoints/{endpoint_id}/deliveries", tag = "webhooks", security(("apiKey" = []), ("session" = [])),
    params(("endpoint_id" = String, Path), DeliveriesQuery),
    responses((status = 200, body = DeliveryPage), (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
pub async fn list_deliveries(
    caller: Caller,
    path: web::Path<String>,
    query: ValidQuery<DeliveriesQuery>,
) -> ApiResult<HttpResponse> {
    let orgs = caller.named_or_all_orgs().await?;
    let query = query.0;
    let before = query.cursor.as_deref().and_then(decode_cursor);
    let (log, next) = service::deliveries(
        &caller.state().webhooks,
        &orgs,
        &endpoint_id(&path)?,
        query.status.as_deref().and_then(DeliveryStatus::parse),
        None,
        before,
        query.limit.unwrap_or(50),
    )
    .await?;
    Ok(HttpResponse::Ok().json(DeliveryPage {
        deliveries: log.into_iter().map(DeliveryView::from).collect(),
        next_cursor: next.map(|(at, id)| encode_cursor(at, &id)),
    }))
}

/// Send a delivery again
///
/// Due now, whatever it came to (its attempts keep counting); the same event id, so a
/// receiver can tell it may have had it.
#[utoipa::path(post, path = "/api/webhooks/deliveries/{delivery_id}/retry", tag = "webhooks", security(("apiKey" = []), ("session" = [])),
    params(("delivery_id" = String, Path)),
    responses((status = 202, body = DeliveryQueued), (status = 404, body = ErrorBody),
        (status = 409, description = "The delivery is being sent right now (`delivery_in_flight`)", body = ErrorBody),
        (status = 422, body = ValidationErrorBody)))]
pub async fn retry_delivery(caller: Caller, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let orgs = caller.named_or_all_orgs().await?;
    let id = path_str("delivery_id", &path, 1, 64)?;
    service::retry_delivery(&caller.state().webhooks, &orgs, &id).await?;
    Ok(HttpResponse::Accepted().json(DeliveryQueued { delivery_id: id }))
}
