//! The Webhooks page of an organization (its endpoints, each one's delivery log) and the
//! operator's failing endpoints. Every action goes through the same service as the JSON API.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;

use super::org::{keep_for_one_view, org_layout, take_one_view, Reveal};
use super::pages::{
    ConsoleEventRow, DeliveryAttemptRow, DeliveryPage, EndpointDraft, EndpointRow, FailingEndpointRow,
    HookDeliveryRow, Layout, OperatorWebhooksPage, WebhookLogPage, WebhooksPage,
};
use super::session::{OrgView, Viewer};
use super::{after_form, confirm_page, format, page, redirect, Confirm, ConsoleError, Flash, FormFields};
use crate::error::ApiError;
use keel_core::domain::OrgId;
use keel_core::webhooks::service::{self, EndpointChange, NewEndpoint};

/// Deliveries shown on one page of an endpoint's log.
const LOG_PAGE: u64 = 50;
/// Characters of an event's body a delivery's page shows (then an ellipsis).
const BODY_SHOWN: usize = 20_000;
/// Characters of each attempt's answer a delivery's page shows.
const ANSWER_SHOWN: usize = 2_000;

#[derive(Deserialize)]
pub struct RevealQuery {
    reveal: Option<String>,
}

#[derive(Deserialize)]
pub struct EndpointPath {
    org: String,
    endpoint: String,
}

#[derive(Deserialize)]
pub struct DeliveryPath {
    org: String,
    delivery: String,
}

#[derive(Deserialize)]
pub struct LogQuery {
    cursor: Option<String>,
    /// `pending`, `succeeded` or `failed` (none: any).
    status: Option<String>,
    /// An event type (none: any).
    event: Option<String>,
}

fn orgs(org: &OrgView) -> &[OrgId] {
    std::slice::from_ref(&org.org_id)
}

fn base(org_id: &OrgId) -> String {
    format!("/console/o/{org_id}/webhooks")
}

fn endpoint_row(e: entities::webhook_endpoint::Model) -> EndpointRow {
    EndpointRow {
        events: service::events_of(&e).join(", "),
        status: match (e.enabled, &e.failing_since) {
            (false, _) => "disabled".into(),
            (true, Some(since)) => format!("failing since {}", format::time(*since)),
            (true, None) => "enabled".into(),
        },
        disabled_reason: e.disabled_reason.clone(),
        description: e.description.clone().unwrap_or_default(),
        created: format::time(e.created_at),
        enabled: e.enabled,
        url: e.url,
        id: e.id,
    }
}

/// The events a form ticked (`every event` stands alone).
fn ticked_events(form: &FormFields) -> Vec<String> {
    let events: Vec<String> = form.all("events").into_iter().map(str::to_owned).collect();
    match events.iter().any(|e| e == keel_core::webhooks::ALL_EVENTS) {
        true => vec![keel_core::webhooks::ALL_EVENTS.to_owned()],
        false => events,
    }
}

/// The organization's endpoints, what keel did to them on its own, and the form to add one;
/// a secret just made (a new endpoint's, a rotation's) is shown this once.
pub async fn webhooks(
    req: HttpRequest,
    viewer: Viewer,
    path: web::Path<String>,
    query: web::Query<RevealQuery>,
) -> Result<HttpResponse, ConsoleError> {
    let org = viewer.org(&path).await?;
    let reveal = match query.reveal.as_deref().filter(|r| !r.is_empty()) {
        None => None,
        Some(reveal) => Some(take_one_view(&viewer, &org.org_id, reveal).await?),
    };
    webhooks_page(&req, &viewer, &org, reveal, None).await
}

/// The webhooks page; with `refused`, the new-endpoint form refused (422): its message
/// shown and what was typed kept in the form.
async fn webhooks_page(
    req: &HttpRequest,
    viewer: &Viewer,
    org: &OrgView,
    reveal: Option<Reveal>,
    refused: Option<(String, EndpointDraft)>,
) -> Result<HttpResponse, ConsoleError> {
    let webhooks = &viewer.state.webhooks;
    let endpoints = service::endpoints(webhooks, orgs(org))
        .await
        .map_err(ApiError::from)?
        .into_iter()
        .map(endpoint_row)
        .collect();
    let events = service::console_events(webhooks, &org.org_id)
        .await
        .map_err(ApiError::from)?
        .into_iter()
        .map(|e| ConsoleEventRow {
            at: format::time(e.created_at),
            message: e.message,
        })
        .collect();
    let (new_secret, secret_gone) = Reveal::shown(reveal);
    let mut l = org_layout(viewer, org, "Webhooks", "webhooks", req).await?;
    let (message, draft) = refused.unzip();
    if let Some(message) = message.clone() {
        l.flash = Some(Flash { ok: false, message });
    }
    let webhooks_page = WebhooksPage {
        l,
        endpoints,
        events,
        event_types: keel_core::domain::EventType::ALL
            .map(keel_core::domain::EventType::as_str)
            .to_vec(),
        secret_gone,
        new_secret,
        can_act: org.can_act(),
        draft: draft.unwrap_or_default(),
    };
    Ok(match message {
        None => page(req, &webhooks_page),
        Some(_) => super::html(actix_web::http::StatusCode::UNPROCESSABLE_ENTITY, &webhooks_page),
    })
}

/// Adds an endpoint (the URL and events checked as the API checks them) and shows its secret
/// once, on the page the redirect leads to.
pub async fn create(
    req: HttpRequest,
    viewer: Viewer,
    path: web::Path<String>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let form = FormFields::parse(&body);
    let org = viewer.act_in(&path, &form.csrf, false).await?;
    let events = ticked_events(&form);
    // The form as the API's body, held to that body's bounds and rules (one place for them).
    let new = (|| {
        let mut body = serde_json::Map::new();
        body.insert("url".into(), form.get("url").unwrap_or_default().trim().into());
        body.insert("events".into(), events.into());
        if let Some(description) = form.get("description") {
            body.insert("description".into(), description.trim().into());
        }
        let json = serde_json::Value::Object(body).to_string();
        let body: crate::webhooks::dto::EndpointCreateBody =
            crate::http::extract::parse_checked_body(json.as_bytes())?;
        Ok::<_, ApiError>(NewEndpoint {
            url: body.url,
            events: body.events,
            description: body.description,
        })
    })();
    // Refused: the page again, the form holding what was typed.
    let refused = |err: ApiError| async {
        if !actix_web::ResponseError::status_code(&err).is_client_error() {
            return Err(err.into());
        }
        let draft = EndpointDraft {
            url: form.get("url").unwrap_or_default().chars().take(2000).collect(),
            description: form
                .get("description")
                .unwrap_or_default()
                .chars()
                .take(500)
                .collect(),
            events: form.all("events").into_iter().map(str::to_owned).collect(),
        };
        webhooks_page(&req, &viewer, &org, None, Some((super::describe(&err), draft))).await
    };
    let new = match new {
        Ok(new) => new,
        Err(err) => return refused(err).await,
    };
    match service::create_endpoint(&viewer.state.webhooks, &org.org_id, new).await {
        Ok((_, secret)) => show_once(&viewer, &org.org_id, Ok::<_, ApiError>(secret)).await,
        Err(err) => refused(err.into()).await,
    }
}

/// Enables or disables an endpoint (`enabled=yes|no`).
pub async fn set_enabled(
    viewer: Viewer,
    path: web::Path<EndpointPath>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let form = FormFields::parse(&body);
    let org = viewer.act_in(&path.org, &form.csrf, false).await?;
    let enabled = form.get("enabled") == Some("yes");
    let change = EndpointChange {
        enabled: Some(enabled),
        ..EndpointChange::default()
    };
    let outcome = service::update_endpoint(&viewer.state.webhooks, orgs(&org), &path.endpoint, change).await;
    after_form(&base(&org.org_id), outcome, |_| match enabled {
        true => "Endpoint enabled: deliveries go out again.".into(),
        false => "Endpoint disabled: nothing is sent to it until it is enabled.".into(),
    })
}

/// Sends the endpoint a `webhook.test` event.
pub async fn send_test(
    viewer: Viewer,
    path: web::Path<EndpointPath>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let form = FormFields::parse(&body);
    let org = viewer.act_in(&path.org, &form.csrf, false).await?;
    let outcome = service::send_test(&viewer.state.webhooks, orgs(&org), &path.endpoint).await;
    after_form(
        &format!("{}/{}", base(&org.org_id), path.endpoint),
        outcome,
        |_| "Test event queued: it shows in the log below once sent.".into(),
    )
}

/// The endpoint a destructive form names, its organization and the form; unless the form
/// is confirmed, the page that asks first (`verb` is the form's last path segment).
async fn endpoint_to_act_on(
    req: &HttpRequest,
    viewer: &Viewer,
    path: &EndpointPath,
    body: &[u8],
    verb: &str,
    ask: Confirm,
) -> Result<Result<(OrgView, entities::webhook_endpoint::Model), HttpResponse>, ConsoleError> {
    let form = FormFields::parse(body);
    let org = viewer.act_in(&path.org, &form.csrf, false).await?;
    let endpoint = service::endpoint(&viewer.state.webhooks, orgs(&org), &path.endpoint)
        .await
        .map_err(ApiError::from)?;
    if form.confirmed() {
        return Ok(Ok((org, endpoint)));
    }
    let confirm = Confirm {
        details: vec![endpoint.url.clone()],
        action: format!("{}/{}/{verb}", base(&org.org_id), endpoint.id),
        back: base(&org.org_id),
        ..ask
    };
    Ok(Err(confirm_page(
        org_layout(viewer, &org, confirm.title, "webhooks", req).await?,
        confirm,
        form.carried(),
    )))
}

/// A secret just made (a new endpoint's, a rotation's), kept for one view on the page the
/// redirect leads to; a refusal is said on the Webhooks page.
async fn show_once<E: Into<ApiError>>(
    viewer: &Viewer,
    org_id: &OrgId,
    secret: Result<String, E>,
) -> Result<HttpResponse, ConsoleError> {
    let secret = match secret {
        Ok(secret) => secret,
        Err(err) => return after_form(&base(org_id), Err::<(), _>(err), |_| String::new()),
    };
    // Sealed until that view (a reload never shows it again).
    let reveal = keep_for_one_view(viewer, &viewer.state.db, org_id, &secret).await?;
    Ok(redirect(&format!("{}?reveal={reveal}", base(org_id))).finish())
}

/// Asks first; then a new secret, shown once (the old one keeps signing for 24 hours).
pub async fn rotate(
    req: HttpRequest,
    viewer: Viewer,
    path: web::Path<EndpointPath>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let ask = Confirm {
        title: "Rotate the secret?",
        question: format!(
            "A new secret signs every delivery from now on; the current one signs beside it for {} hours, so the receiver can switch without missing one.",
            service::ROTATION_OVERLAP_HOURS
        ),
        details: Vec::new(),
        action: String::new(),
        button: "Rotate secret",
        back: String::new(),
    };
    let (org, endpoint) = match endpoint_to_act_on(&req, &viewer, &path, &body, "rotate", ask).await? {
        Ok(confirmed) => confirmed,
        Err(asked) => return Ok(asked),
    };
    let rotated = service::rotate_secret(&viewer.state.webhooks, orgs(&org), &endpoint.id).await;
    show_once(&viewer, &org.org_id, rotated.map(|(secret, _)| secret)).await
}

/// Asks first; then deletes the endpoint with its deliveries.
pub async fn delete(
    req: HttpRequest,
    viewer: Viewer,
    path: web::Path<EndpointPath>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let ask = Confirm {
        title: "Delete the endpoint?",
        question: "Nothing more is sent to it, and its delivery log goes with it.".into(),
        details: Vec::new(),
        action: String::new(),
        button: "Delete endpoint",
        back: String::new(),
    };
    let (org, endpoint) = match endpoint_to_act_on(&req, &viewer, &path, &body, "delete", ask).await? {
        Ok(confirmed) => confirmed,
        Err(asked) => return Ok(asked),
    };
    let outcome = service::delete_endpoint(&viewer.state.webhooks, orgs(&org), &endpoint.id).await;
    after_form(&base(&org.org_id), outcome, |()| "Endpoint deleted.".into())
}

/// An endpoint's delivery log, newest first, each delivery with its attempts.
pub async fn log(
    req: HttpRequest,
    viewer: Viewer,
    path: web::Path<EndpointPath>,
    query: web::Query<LogQuery>,
) -> Result<HttpResponse, ConsoleError> {
    let org = viewer.org(&path.org).await?;
    let webhooks = &viewer.state.webhooks;
    let endpoint = service::endpoint(webhooks, orgs(&org), &path.endpoint)
        .await
        .map_err(ApiError::from)?;
    let before = match query.cursor.as_deref().filter(|c| !c.is_empty()) {
        None => None,
        Some(raw) => {
            Some(crate::webhooks::routes::decode_cursor(raw).ok_or_else(|| super::unreadable("cursor"))?)
        }
    };
    use keel_core::domain::{DeliveryStatus, EventType};
    let status = match query.status.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
        None => None,
        Some(s) => Some(DeliveryStatus::parse(s).ok_or_else(|| {
            super::unknown_choice("status", s, DeliveryStatus::ALL.iter().map(|s| s.as_str()))
        })?),
    };
    let event =
        match query.event.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
            None => None,
            Some(e) => Some(EventType::parse(e).ok_or_else(|| {
                super::unknown_choice("event", e, EventType::ALL.iter().map(|t| t.as_str()))
            })?),
        };
    let total = service::count_deliveries(webhooks, orgs(&org), &endpoint.id, status, event)
        .await
        .map_err(ApiError::from)?;
    let (log, next) = service::deliveries(
        webhooks,
        orgs(&org),
        &endpoint.id,
        status,
        event,
        before,
        LOG_PAGE,
    )
    .await
    .map_err(ApiError::from)?;
    let mut filters = form_urlencoded::Serializer::new(String::new());
    if let Some(status) = status {
        filters.append_pair("status", status.as_str());
    }
    if let Some(event) = event {
        filters.append_pair("event", event.as_str());
    }
    let filters = filters.finish();
    let subscribed = service::events_of(&endpoint);
    let deliveries = log
        .into_iter()
        .map(|entry| {
            let last = entry.attempts.last();
            HookDeliveryRow {
                id: entry.delivery.id.clone(),
                event_id: entry.delivery.event_id.clone(),
                event_type: entry.event_type.clone(),
                status: entry.delivery.status.as_str().to_owned(),
                created: format::time(entry.delivery.created_at),
                attempts: entry.attempts.len(),
                last_code: last
                    .and_then(|a| a.status_code)
                    .map_or_else(|| "—".into(), |c| c.to_string()),
                last_latency: last.map_or_else(|| "—".into(), |a| format!("{} ms", a.latency_ms)),
                last_answer: last
                    .and_then(|a| a.response.clone().or_else(|| a.error.clone()))
                    .map(|text| format::clip(&text, 300))
                    .unwrap_or_default(),
                next_attempt: match entry.delivery.status {
                    keel_core::domain::DeliveryStatus::Pending => {
                        format::opt_time(entry.delivery.next_attempt_at)
                    }
                    _ => "—".into(),
                },
            }
        })
        .collect();
    Ok(page(
        &req,
        &WebhookLogPage {
            l: org_layout(&viewer, &org, "Webhook deliveries", "webhooks", &req).await?,
            endpoint: endpoint_row(endpoint),
            deliveries,
            total: format::count(i64::try_from(total).unwrap_or(i64::MAX)),
            older: next.map(|(at, id)| {
                let mut link = form_urlencoded::Serializer::new(filters.clone());
                link.append_pair("cursor", &crate::webhooks::routes::encode_cursor(at, &id));
                link.finish()
            }),
            can_act: org.can_act(),
            statuses: DeliveryStatus::ALL.iter().map(|s| s.as_str()).collect(),
            status: status.map(|s| s.as_str()).unwrap_or_default(),
            event_types: EventType::ALL.iter().map(|t| t.as_str()).collect(),
            event: event.map(|t| t.as_str()).unwrap_or_default(),
            subscribed,
            filtered: !filters.is_empty(),
        },
    ))
}

/// Changes an endpoint from its page: `url`, `events` (repeated), `description` (empty
/// clears it) and `enabled` (`yes`, `no`), held to the API's body for the same change.
pub async fn edit(
    viewer: Viewer,
    path: web::Path<EndpointPath>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let form = FormFields::parse(&body);
    let org = viewer.act_in(&path.org, &form.csrf, false).await?;
    let back = format!("{}/{}", base(&org.org_id), path.endpoint);
    let events = ticked_events(&form);
    let change = (|| {
        let mut body = serde_json::Map::new();
        body.insert("url".into(), form.get("url").unwrap_or_default().trim().into());
        body.insert("events".into(), events.into());
        body.insert(
            "description".into(),
            match form.get("description").map(str::trim).filter(|d| !d.is_empty()) {
                Some(d) => d.into(),
                None => serde_json::Value::Null,
            },
        );
        match form.get("enabled") {
            Some("yes") => body.insert("enabled".into(), true.into()),
            Some("no") => body.insert("enabled".into(), false.into()),
            Some(other) => body.insert("enabled".into(), other.into()),
            None => None,
        };
        let json = serde_json::Value::Object(body).to_string();
        let body: crate::webhooks::dto::EndpointPatchBody =
            crate::http::extract::parse_checked_body(json.as_bytes())?;
        Ok::<_, ApiError>(EndpointChange {
            url: body.url,
            events: body.events,
            description: body.description,
            enabled: body.enabled,
        })
    })();
    let outcome = match change {
        Ok(change) => service::update_endpoint(&viewer.state.webhooks, orgs(&org), &path.endpoint, change)
            .await
            .map_err(ApiError::from),
        Err(err) => Err(err),
    };
    after_form(&back, outcome, |_| "Endpoint saved.".into())
}

/// One delivery: its event as sent (pretty-printed, bounded), every attempt, and Retry.
pub async fn delivery(
    req: HttpRequest,
    viewer: Viewer,
    path: web::Path<DeliveryPath>,
) -> Result<HttpResponse, ConsoleError> {
    let org = viewer.org(&path.org).await?;
    let detail = service::delivery_detail(&viewer.state.webhooks, orgs(&org), &path.delivery)
        .await
        .map_err(ApiError::from)?;
    let endpoint = service::endpoint(&viewer.state.webhooks, orgs(&org), &detail.delivery.endpoint_id)
        .await
        .map_err(ApiError::from)?;
    let attempts = detail
        .attempts
        .iter()
        .map(|a| DeliveryAttemptRow {
            attempt: a.attempt,
            at: format::time(a.attempted_at),
            code: a.status_code.map_or_else(|| "—".into(), |c| c.to_string()),
            latency: format!("{} ms", a.latency_ms),
            answer: a
                .response
                .clone()
                .or_else(|| a.error.clone())
                .map(|text| format::clip(&text, ANSWER_SHOWN))
                .unwrap_or_default(),
        })
        .collect();
    let d = &detail.delivery;
    Ok(page(
        &req,
        &DeliveryPage {
            l: org_layout(&viewer, &org, "Webhook delivery", "webhooks", &req).await?,
            id: d.id.clone(),
            endpoint_id: endpoint.id.clone(),
            endpoint_url: endpoint.url.clone(),
            event_id: d.event_id.clone(),
            event_type: detail
                .event
                .as_ref()
                .map(|e| e.event_type.clone())
                .unwrap_or_default(),
            body: detail
                .event
                .as_ref()
                .map(|e| format::clip(&format::pretty_json(&e.body), BODY_SHOWN))
                .unwrap_or_default(),
            status: d.status.as_str().to_owned(),
            created: format::time(d.created_at),
            next_attempt: match d.status {
                keel_core::domain::DeliveryStatus::Pending => format::opt_time(d.next_attempt_at),
                _ => "—".into(),
            },
            attempts,
            can_act: org.can_act(),
        },
    ))
}

/// Sends a delivery again now (the same `webhook-id`).
pub async fn retry(
    viewer: Viewer,
    path: web::Path<DeliveryPath>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let form = FormFields::parse(&body);
    let org = viewer.act_in(&path.org, &form.csrf, false).await?;
    let back = match (form.get("back"), form.get("endpoint")) {
        (Some("delivery"), _) => format!("{}/deliveries/{}", base(&org.org_id), path.delivery),
        (_, Some(endpoint)) if uuid::Uuid::try_parse(endpoint).is_ok() => {
            format!("{}/{endpoint}", base(&org.org_id))
        }
        _ => base(&org.org_id),
    };
    let outcome = service::retry_delivery(&viewer.state.webhooks, orgs(&org), &path.delivery).await;
    after_form(&back, outcome, |()| {
        "Delivery queued to be sent again now.".into()
    })
}

/// Every organization's endpoints that keep failing or were disabled for it (operators).
pub async fn failing(req: HttpRequest, viewer: Viewer) -> Result<HttpResponse, ConsoleError> {
    if !viewer.is_operator() {
        return Err(ConsoleError::NotFound);
    }
    let now = chrono::Utc::now();
    let rows = service::failing_endpoints(&viewer.state.webhooks, 200)
        .await
        .map_err(ApiError::from)?
        .into_iter()
        .map(|(e, pending)| FailingEndpointRow {
            org_id: e.org_id.to_string(),
            url: e.url.clone(),
            failing_for: e
                .failing_since
                .map_or_else(|| "—".into(), |since| format::age(now - since)),
            status: match e.enabled {
                true => "enabled".into(),
                false => format!("disabled: {}", e.disabled_reason.clone().unwrap_or_default()),
            },
            pending,
            log: format!("/console/o/{}/webhooks/{}", e.org_id, e.id),
        })
        .collect();
    Ok(page(
        &req,
        &OperatorWebhooksPage {
            l: Layout::new("Failing webhook endpoints", &viewer, "hooks", Flash::read(&req)),
            rows,
        },
    ))
}
