//! An organization's cron schedules in the console: each one's cron and zone, its next
//! ticks, its latest jobs and their outcomes; enable, disable and run now. Every action goes
//! through the same service as the JSON API.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;

use super::org::org_layout;
use super::pages::{ScheduleJobRow, ScheduleRow, SchedulesPage};
use super::session::Viewer;
use super::{after_form, format, page, ConsoleError, FormFields};
use crate::error::ApiError;
use keel_core::domain::{OrgId, ScheduleId};
use keel_core::queue::schedules::cadence::on_clock;
use keel_core::queue::schedules::{service, ScheduleChange, ScheduleError};
use keel_core::queue::service::Created;

#[derive(Deserialize)]
pub struct OrgPath {
    org: String,
}

#[derive(Deserialize)]
pub struct SchedulePath {
    org: String,
    schedule: String,
}

/// The organization's schedules, oldest first.
pub async fn list(
    req: HttpRequest,
    viewer: Viewer,
    path: web::Path<OrgPath>,
) -> Result<HttpResponse, ConsoleError> {
    let org = viewer.org(&path.org).await?;
    let schedules = service::list(&viewer.state.schedules, std::slice::from_ref(&org.org_id))
        .await
        .map_err(ApiError::from)?;
    let l = org_layout(&viewer, &org, "Schedules", "schedules", &req).await?;
    let rows = schedules
        .into_iter()
        .map(|s| {
            let row = s.row;
            let next_runs = s
                .upcoming
                .into_iter()
                .map(|at| match on_clock(at, &row.timezone) {
                    Some(local) if row.timezone != "UTC" => format!("{local} ({})", format::time(at)),
                    _ => format::time(at),
                })
                .collect();
            ScheduleRow {
                id: row.id.to_string(),
                name: row.name,
                cron: row.cron,
                timezone: row.timezone,
                enabled: row.enabled,
                catch_up: row.catch_up,
                action: serde_json::from_str::<serde_json::Value>(&row.job)
                    .ok()
                    .and_then(|job| job["action"].as_str().map(str::to_owned))
                    .unwrap_or_default(),
                next_runs,
                jobs: s
                    .recent_jobs
                    .into_iter()
                    .map(|job| ScheduleJobRow {
                        link: format!("/console/o/{}/jobs/{}", org.org_id, job.id),
                        id: job.id.to_string(),
                        status: job.status.to_string(),
                        tick: job
                            .schedule_tick
                            .map(format::time)
                            .unwrap_or_else(|| "run now".into()),
                        error: job
                            .error
                            .as_deref()
                            .map(|e| format::clip(e, 200))
                            .unwrap_or_default(),
                    })
                    .collect(),
            }
        })
        .collect();
    Ok(page(
        &req,
        &SchedulesPage {
            l,
            can_act: org.can_act(),
            schedules: rows,
        },
    ))
}

/// The schedule a form acts on: the form read and the caller's right to act checked (its
/// CSRF token included).
async fn to_act_on(
    viewer: &Viewer,
    path: &SchedulePath,
    body: &[u8],
) -> Result<(FormFields, OrgId, ScheduleId), ConsoleError> {
    let form = FormFields::parse(body);
    let org = viewer.act_in(&path.org, &form.csrf, false).await?;
    let id = ScheduleId::parse(&path.schedule).map_err(|_| ConsoleError::NotFound)?;
    Ok((form, org.org_id, id))
}

fn back(org_id: &OrgId) -> String {
    format!("/console/o/{org_id}/schedules")
}

/// Enables or disables a schedule (`enabled` = `true` | `false`).
pub async fn set_enabled(
    viewer: Viewer,
    path: web::Path<SchedulePath>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let (form, org_id, id) = to_act_on(&viewer, &path, &body).await?;
    let enabled = match form.get("enabled") {
        Some("true") => true,
        Some("false") => false,
        other => {
            return Err(super::unknown_choice(
                "enabled",
                other.unwrap_or(""),
                ["true", "false"].into_iter(),
            ))
        }
    };
    let change = ScheduleChange {
        enabled: Some(enabled),
        ..Default::default()
    };
    let outcome = service::update(
        &viewer.state.schedules,
        std::slice::from_ref(&org_id),
        &id,
        change,
    )
    .await;
    if matches!(outcome, Err(ScheduleError::NotFound)) {
        return Err(ConsoleError::NotFound);
    }
    after_form(&back(&org_id), outcome, |s| match s.row.enabled {
        true => format!(
            "Schedule {} enabled: next tick {}.",
            s.row.name,
            s.row
                .next_run_at
                .map(format::time)
                .unwrap_or_else(|| "never".into())
        ),
        false => format!(
            "Schedule {} disabled: no tick enqueues until it is enabled.",
            s.row.name
        ),
    })
}

/// One job of the schedule now.
pub async fn run_now(
    viewer: Viewer,
    path: web::Path<SchedulePath>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let (_, org_id, id) = to_act_on(&viewer, &path, &body).await?;
    let outcome = service::run_now(&viewer.state.schedules, std::slice::from_ref(&org_id), &id).await;
    if matches!(outcome, Err(ScheduleError::NotFound)) {
        return Err(ConsoleError::NotFound);
    }
    after_form(&back(&org_id), outcome, |created| match created {
        Created::New(job) => format!("Job {} queued.", job.id),
        Created::Existing(job) | Created::Replayed(job) => {
            format!("An open job holds its unique key: {} (no new job).", job.id)
        }
    })
}
