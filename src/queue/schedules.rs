//! `/api/training/schedules`: cron schedules of jobs (any member of the organization).

use actix_web::{web, HttpResponse};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::routes::schedule_job;
use super::JobView;
use crate::auth::Caller;
use crate::error::{ApiResult, ErrorBody, ValidationErrorBody};
use crate::http::extract::ValidJson;
use crate::http::validate::{Checks, Validate};
use keel_core::domain::{OrgId, ScheduleId};
use keel_core::queue::schedules::{self as core, service, CatchUp, Schedule, ScheduleChange, ScheduleError};
use keel_core::queue::service::Created;

/// What a tick missed while no instance ran makes: `none` (nothing; the default) or `latest`
/// (one job, for the latest missed tick).
#[derive(Debug, Clone, Copy, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum CatchUpName {
    None,
    Latest,
}

impl From<CatchUpName> for CatchUp {
    fn from(name: CatchUpName) -> Self {
        match name {
            CatchUpName::None => CatchUp::None,
            CatchUpName::Latest => CatchUp::Latest,
        }
    }
}

/// A cron expression and a zone, checked together (422 naming the field at fault).
fn check_cadence(c: &mut Checks, cron: &str, timezone: &str) {
    if let Err(err) = core::Cadence::parse(cron, timezone) {
        c.fail(err.field(), "value_error", format!("Value error, {err}"));
    }
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScheduleCreateBody {
    /// The organization (optional: the caller's key, `X-Org-Id` or `job.orgId` says).
    #[schema(value_type = Option<String>, min_length = 1, max_length = 100)]
    #[serde(default, deserialize_with = "OrgId::optional")]
    pub org_id: Option<OrgId>,
    #[schema(min_length = 1, max_length = 200)]
    pub name: String,
    /// Five fields (minute hour day-of-month month day-of-week) with ranges, steps and lists
    /// (`*/15 9-17 * * MON-FRI`), six with seconds first, or `@hourly`, `@daily`, `@weekly`,
    /// `@monthly`, `@yearly`.
    #[schema(min_length = 1, max_length = 200, example = "0 3 * * *")]
    pub cron: String,
    /// The IANA zone whose wall clock the fields are read on (default `UTC`).
    #[schema(min_length = 1, max_length = 64, example = "Europe/Berlin")]
    pub timezone: Option<String>,
    /// What each tick enqueues: a body exactly as `POST /api/training/jobs` takes it, with
    /// the same checks, but no `runAt` (each job runs at its tick).
    #[schema(value_type = super::routes::JobCreateBody)]
    pub job: Value,
    /// `false`: no tick enqueues until it is enabled (default `true`).
    pub enabled: Option<bool>,
    pub catch_up: Option<CatchUpName>,
}

impl Validate for ScheduleCreateBody {
    fn validate(&self, c: &mut Checks) {
        c.display_name("name", &self.name, 200);
        check_cadence(c, &self.cron, self.timezone.as_deref().unwrap_or("UTC"));
    }
}

/// Only the fields given change.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SchedulePatchBody {
    #[schema(min_length = 1, max_length = 200)]
    pub name: Option<String>,
    /// As at creation; a new cron or zone starts from the first tick after now.
    #[schema(min_length = 1, max_length = 200)]
    pub cron: Option<String>,
    #[schema(min_length = 1, max_length = 64, example = "UTC")]
    pub timezone: Option<String>,
    /// A new job body, checked as at creation; its `orgId`, if any, must be the schedule's.
    #[schema(value_type = Option<super::routes::JobCreateBody>)]
    pub job: Option<Value>,
    /// `false` stops its ticks; `true` starts them again from the first tick after now
    /// (ticks while it was disabled are not caught up).
    pub enabled: Option<bool>,
    pub catch_up: Option<CatchUpName>,
}

impl Validate for SchedulePatchBody {
    fn validate(&self, c: &mut Checks) {
        if let Some(name) = &self.name {
            c.display_name("name", name, 200);
        }
        if let Some(cron) = &self.cron {
            // The zone is checked with it when both change; alone, against UTC (a stored zone
            // is always valid, so the cron's own faults are what this finds).
            check_cadence(c, cron, self.timezone.as_deref().unwrap_or("UTC"));
        } else if let Some(timezone) = &self.timezone {
            check_cadence(c, "@daily", timezone);
        }
    }
}

/// A job a schedule enqueued, as its list shows it.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleJob {
    pub job_id: String,
    pub status: String,
    /// The tick it was enqueued for (none for a "run now").
    pub schedule_tick: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub error: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScheduleView {
    pub schedule_id: String,
    pub org_id: String,
    /// The job's project.
    pub project_id: String,
    pub name: String,
    pub cron: String,
    pub timezone: String,
    /// The job body each tick enqueues, as given.
    #[schema(value_type = Object)]
    pub job: Value,
    pub enabled: bool,
    /// `none` or `latest`.
    pub catch_up: String,
    /// The next tick (none while disabled).
    pub next_run_at: Option<DateTime<Utc>>,
    /// The next five ticks (none while disabled).
    pub next_runs: Vec<DateTime<Utc>>,
    /// The last tick enqueued.
    pub last_tick_at: Option<DateTime<Utc>>,
    /// Its latest five jobs, newest first, with their states (every one:
    /// `GET /api/training/jobs?scheduleId=`).
    pub recent_jobs: Vec<ScheduleJob>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<Schedule> for ScheduleView {
    fn from(s: Schedule) -> Self {
        let row = s.row;
        Self {
            schedule_id: row.id.to_string(),
            org_id: row.org_id.to_string(),
            project_id: row.project_id.to_string(),
            name: row.name,
            cron: row.cron,
            timezone: row.timezone,
            job: serde_json::from_str(&row.job).unwrap_or(Value::Null),
            enabled: row.enabled,
            catch_up: row.catch_up,
            next_run_at: row.next_run_at,
            next_runs: s.upcoming,
            last_tick_at: row.last_tick_at,
            recent_jobs: s
                .recent_jobs
                .into_iter()
                .map(|job| ScheduleJob {
                    job_id: job.id.to_string(),
                    status: job.status.to_string(),
                    schedule_tick: job.schedule_tick,
                    created_at: job.created_at,
                    finished_at: job.finished_at,
                    error: job.error,
                })
                .collect(),
            created_at: row.created_at,
            updated_at: row.updated_at,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ScheduleList {
    pub schedules: Vec<ScheduleView>,
}

fn schedule_id(raw: &str) -> Result<ScheduleId, ScheduleError> {
    ScheduleId::parse(raw).map_err(|_| ScheduleError::NotFound)
}

/// Create a schedule
///
/// Any member: at each tick of `cron` on `timezone`'s wall clock, keel enqueues `job` (a
/// create body as `POST /api/training/jobs` takes it) in the organization, once per tick
/// across every instance; the job's view carries `scheduleId` and `scheduleTick`. The first
/// tick is the first after now (`nextRunAt`). A tick missed while no instance ran enqueues
/// nothing (`catchUp: "none"`) or only the latest missed one (`"latest"`). An organization
/// that cannot pay the run fee still gets its jobs (their claims wait for funds).
#[utoipa::path(post, path = "/api/training/schedules", tag = "training", security(("apiKey" = []), ("session" = [])),
    request_body = ScheduleCreateBody,
    responses((status = 201, body = ScheduleView), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, description = "The job's project or dataset is not the organization's", body = ErrorBody),
        (status = 409, description = "The organization has 100 schedules (`schedule_limit_reached`)", body = ErrorBody),
        (status = 422, body = ValidationErrorBody)))]
pub async fn create_schedule(caller: Caller, body: ValidJson<ScheduleCreateBody>) -> ApiResult<HttpResponse> {
    let body = body.0;
    let (job_org, template) = schedule_job(&body.job)?;
    if body.org_id.is_some() && job_org.is_some() && body.org_id != job_org {
        return Err(ScheduleError::JobOrgMismatch.into());
    }
    let access = caller.member(body.org_id.as_ref().or(job_org.as_ref())).await?;
    let new = core::NewSchedule {
        org_id: access.org_id,
        name: body.name,
        cron: body.cron,
        timezone: body.timezone.unwrap_or_else(|| "UTC".into()),
        job_body: body.job,
        template,
        enabled: body.enabled.unwrap_or(true),
        catch_up: body.catch_up.map(CatchUp::from).unwrap_or_default(),
    };
    let schedule = service::create(&caller.state().schedules, new).await?;
    Ok(HttpResponse::Created().json(ScheduleView::from(schedule)))
}

/// List schedules
///
/// The schedules of the organization named by `orgId` or `X-Org-Id`, else of every
/// organization the caller belongs to; oldest first, each with its next ticks and latest jobs.
#[utoipa::path(get, path = "/api/training/schedules", tag = "training", security(("apiKey" = []), ("session" = [])),
    params(("orgId" = Option<String>, Query, description = "Only this organization's schedules")),
    responses((status = 200, body = ScheduleList), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn list_schedules(caller: Caller) -> ApiResult<HttpResponse> {
    let orgs = caller.named_or_all_orgs().await?;
    let schedules = service::list(&caller.state().schedules, &orgs).await?;
    Ok(HttpResponse::Ok().json(ScheduleList {
        schedules: schedules.into_iter().map(ScheduleView::from).collect(),
    }))
}

/// Read a schedule
///
/// One schedule of the caller's organizations (another organization's is 404): its next
/// five ticks and its latest five jobs with their states.
#[utoipa::path(get, path = "/api/training/schedules/{schedule_id}", tag = "training", security(("apiKey" = []), ("session" = [])),
    params(("schedule_id" = String, Path)),
    responses((status = 200, body = ScheduleView), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
pub async fn get_schedule(caller: Caller, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let id = schedule_id(&path)?;
    let orgs = caller.named_or_all_orgs().await?;
    let schedule = service::get(&caller.state().schedules, &orgs, &id).await?;
    Ok(HttpResponse::Ok().json(ScheduleView::from(schedule)))
}

/// Change a schedule
///
/// Sets the fields given, each checked as at creation. A new `cron` or `timezone`, or
/// `enabled: true`, starts from the first tick after now; `enabled: false` stops its ticks.
#[utoipa::path(patch, path = "/api/training/schedules/{schedule_id}", tag = "training", security(("apiKey" = []), ("session" = [])),
    params(("schedule_id" = String, Path)),
    request_body(content = SchedulePatchBody, description = "Only the fields given change; an empty body changes nothing."),
    responses((status = 200, body = ScheduleView), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, description = "No such schedule, or the job's project or dataset is not the organization's", body = ErrorBody),
        (status = 422, body = ValidationErrorBody)))]
pub async fn update_schedule(
    caller: Caller,
    path: web::Path<String>,
    body: ValidJson<SchedulePatchBody>,
) -> ApiResult<HttpResponse> {
    let id = schedule_id(&path)?;
    let orgs = caller.named_or_all_orgs().await?;
    let body = body.0;
    let job = match body.job {
        Some(job) => {
            let (job_org, template) = schedule_job(&job)?;
            Some((job, job_org, template))
        }
        None => None,
    };
    let change = ScheduleChange {
        name: body.name,
        cron: body.cron,
        timezone: body.timezone,
        job,
        enabled: body.enabled,
        catch_up: body.catch_up.map(CatchUp::from),
    };
    let schedule = service::update(&caller.state().schedules, &orgs, &id, change).await?;
    Ok(HttpResponse::Ok().json(ScheduleView::from(schedule)))
}

/// Delete a schedule
///
/// No tick of it enqueues again; the jobs it enqueued stay as they are.
#[utoipa::path(delete, path = "/api/training/schedules/{schedule_id}", tag = "training", security(("apiKey" = []), ("session" = [])),
    params(("schedule_id" = String, Path)),
    responses((status = 204), (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ValidationErrorBody)))]
pub async fn delete_schedule(caller: Caller, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let id = schedule_id(&path)?;
    let orgs = caller.named_or_all_orgs().await?;
    service::delete(&caller.state().schedules, &orgs, &id).await?;
    Ok(HttpResponse::NoContent().finish())
}

/// Run a schedule now
///
/// One job of the schedule now, outside its ticks (a disabled schedule too): 202 with the
/// job's view (`scheduleId` set, `scheduleTick` null). If the job body has a `uniqueKey` an
/// open job holds, that job is the answer (200), as for a job's create.
#[utoipa::path(post, path = "/api/training/schedules/{schedule_id}/run", tag = "training", security(("apiKey" = []), ("session" = [])),
    params(("schedule_id" = String, Path)),
    responses((status = 202, body = JobView), (status = 200, description = "An open job with the job body's uniqueKey", body = JobView),
        (status = 401, body = ErrorBody), (status = 403, body = ErrorBody),
        (status = 404, description = "No such schedule, or its job's project or dataset is gone", body = ErrorBody),
        (status = 422, body = ValidationErrorBody)))]
pub async fn run_schedule(caller: Caller, path: web::Path<String>) -> ApiResult<HttpResponse> {
    let id = schedule_id(&path)?;
    let orgs = caller.named_or_all_orgs().await?;
    let state = caller.state();
    Ok(match service::run_now(&state.schedules, &orgs, &id).await? {
        Created::New(job) => HttpResponse::Accepted().json(JobView::from(&job)),
        Created::Existing(job) | Created::Replayed(job) => {
            HttpResponse::Ok().json(super::view(&state.jobs, &job).await?)
        }
    })
}
