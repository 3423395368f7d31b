//! An organization's training jobs: the list (filters, counts per status, sorting, pages
//! both ways), one job, and stopping or retrying one or many.

use std::collections::HashMap;

use actix_web::{web, HttpRequest, HttpResponse};
use entities::training_job;
use serde::Deserialize;

use super::org::org_layout;
use super::pages::{
    AttemptRow, Event, JobDetail, JobPage, JobRow, JobsPage, JobsTable, Pager, PipelineDrawing, PipelineEdge,
    PipelineNode, StatusChip,
};
use super::session::{OrgView, Viewer};
use super::{after_form, confirm_page, format, html, page, wants_partial, Confirm, ConsoleError, FormFields};
use keel_core::domain::{JobAction, JobId, JobStatus};
use keel_core::queue::bulk::{BulkAction, Selection};
use keel_core::queue::{JobFilter, JobSort};

/// Rows per page of jobs.
const PAGE: u64 = 50;
/// Characters of a job's payload, live status or result its page shows (then an ellipsis).
const SHOWN: usize = 20_000;

/// Project names by id, for the ids a page shows.
type Names = HashMap<String, String>;

async fn project_names(viewer: &Viewer, org: &OrgView) -> Result<Names, ConsoleError> {
    let projects =
        keel_core::projects::service::projects_in(&viewer.state.db, std::slice::from_ref(&org.org_id))
            .await
            .map_err(crate::error::ApiError::from)?;
    Ok(projects.into_iter().map(|p| (p.id.to_string(), p.name)).collect())
}

fn job_row(job: &training_job::Model, names: &Names, max_attempts: u32) -> JobRow {
    let project = job.project_id.to_string();
    JobRow {
        id: job.id.to_string(),
        action: job.action.to_string(),
        status: job.status.to_string(),
        project_name: names.get(&project).cloned().unwrap_or_else(|| project.clone()),
        project,
        task: job.training_task_id.clone().unwrap_or_default(),
        worker: job.worker_id.clone().unwrap_or_default(),
        attempts: job.attempts,
        max_attempts,
        priority: job.priority,
        scheduled: job
            .scheduled_at
            .filter(|_| job.status == JobStatus::Scheduled)
            .map(format::time)
            .unwrap_or_default(),
        created: format::time(job.created_at),
        updated: format::time(job.updated_at),
    }
}

/// A jobs filter as a page's address or a form carries it: `status` (repeated), `action`,
/// `project`, `task`. Unknown values are a 400 page naming the choices.
struct Filters {
    status: Vec<JobStatus>,
    action: Option<JobAction>,
    project: Option<String>,
    task: Option<String>,
}

impl Filters {
    fn read<'a>(
        status: impl Iterator<Item = &'a str>,
        action: Option<&str>,
        project: Option<&str>,
        task: Option<&str>,
    ) -> Result<Self, ConsoleError> {
        let nonempty = |v: Option<&str>| v.map(str::trim).filter(|v| !v.is_empty()).map(str::to_owned);
        let mut statuses = Vec::new();
        for s in status.map(str::trim).filter(|s| !s.is_empty()) {
            let parsed = JobStatus::parse(s).ok_or_else(|| {
                super::unknown_choice("status", s, JobStatus::ALL.iter().map(|s| s.as_str()))
            })?;
            if !statuses.contains(&parsed) {
                statuses.push(parsed);
            }
        }
        let action = match nonempty(action) {
            None => None,
            Some(a) => Some(
                JobAction::parse(&a)
                    .ok_or_else(|| super::unknown_choice("action", &a, JobAction::NAMES.into_iter()))?,
            ),
        };
        Ok(Filters {
            status: statuses,
            action,
            project: nonempty(project),
            task: nonempty(task),
        })
    }

    fn job_filter(&self) -> JobFilter {
        JobFilter {
            project_id: self.project.clone(),
            training_task_id: self.task.clone(),
            status: self.status.clone(),
            action: self.action,
            schedule_id: None,
            pipeline: None,
            before: None,
        }
    }

    /// The filter as `(name, value)` pairs, as a link or a form carries it.
    fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut pairs: Vec<(&'static str, String)> = self
            .status
            .iter()
            .map(|s| ("status", s.as_str().to_owned()))
            .collect();
        for (name, value) in [
            ("action", self.action.map(|a| a.as_str().to_owned())),
            ("project", self.project.clone()),
            ("task", self.task.clone()),
        ] {
            if let Some(value) = value {
                pairs.push((name, value));
            }
        }
        pairs
    }
}

/// `pairs` and then `more` as a query string.
fn query_of(pairs: &[(&str, String)], more: &[(&str, String)]) -> String {
    let mut link = form_urlencoded::Serializer::new(String::new());
    for (name, value) in pairs.iter().chain(more) {
        link.append_pair(name, value);
    }
    link.finish()
}

#[derive(Deserialize, Default)]
pub struct JobsQuery {
    /// Any of these statuses (repeated: `status=failed&status=blocked`).
    #[serde(default)]
    status: Vec<String>,
    action: Option<String>,
    project: Option<String>,
    task: Option<String>,
    sort: Option<String>,
    /// 1 for the first.
    page: Option<String>,
}

pub async fn jobs(
    req: HttpRequest,
    viewer: Viewer,
    path: web::Path<String>,
) -> Result<HttpResponse, ConsoleError> {
    let query: JobsQuery =
        serde_html_form::from_str(req.query_string()).map_err(|_| super::unreadable("filter"))?;
    let org = viewer.org(&path).await?;
    let filters = Filters::read(
        query.status.iter().map(String::as_str),
        query.action.as_deref(),
        query.project.as_deref(),
        query.task.as_deref(),
    )?;
    let sort = match query.sort.as_deref().map(str::trim).filter(|s| !s.is_empty()) {
        None => JobSort::default(),
        Some(s) => JobSort::parse(s)
            .ok_or_else(|| super::unknown_choice("sort", s, JobSort::ALL.iter().map(|s| s.as_str())))?,
    };
    let number = Pager::number(query.page.as_deref(), PAGE)?;
    let filter = filters.job_filter();
    let listing = keel_core::queue::bulk::listing(
        &viewer.state.jobs,
        std::slice::from_ref(&org.org_id),
        &filter,
        sort,
        (number - 1) * PAGE,
        PAGE,
    )
    .await?;
    let names = project_names(&viewer, &org).await?;
    let max_attempts = viewer.state.settings.queue.max_attempts;
    let org_id = org.org_id.to_string();
    let pairs = filters.pairs();
    let sorted: Vec<(&str, String)> = match sort {
        JobSort::Created => Vec::new(),
        other => vec![("sort", other.as_str().to_owned())],
    };
    let base = format!("/console/o/{org_id}/jobs");
    let link_to = |n: u64| {
        let mut more = sorted.clone();
        if n > 1 {
            more.push(("page", n.to_string()));
        }
        format!("{base}?{}", query_of(&pairs, &more))
    };
    let pager = Pager::of(number, listing.total, PAGE, link_to);
    let table = JobsTable {
        org_id: org_id.clone(),
        jobs: listing
            .jobs
            .iter()
            .map(|j| job_row(j, &names, max_attempts))
            .collect(),
        selectable: org.can_act(),
        pager,
        filtered: !pairs.is_empty(),
    };
    if wants_partial(&req) {
        return Ok(html(actix_web::http::StatusCode::OK, &table));
    }
    // Each status with its count under the rest of the filter; a chip adds or removes it.
    let chips = JobStatus::ALL
        .iter()
        .map(|status| {
            let count = listing
                .by_status
                .iter()
                .find(|(s, _)| s == status)
                .map_or(0, |(_, n)| *n);
            let chosen = filters.status.contains(status);
            let mut toggled: Vec<(&str, String)> = pairs
                .iter()
                .filter(|(name, value)| !(*name == "status" && value == status.as_str()))
                .cloned()
                .collect();
            if !chosen {
                toggled.push(("status", status.as_str().to_owned()));
            }
            StatusChip {
                status: status.as_str(),
                count: format::count(count as i64),
                chosen,
                link: format!("{base}?{}", query_of(&toggled, &sorted)),
            }
        })
        .collect();
    let sorts = JobSort::ALL
        .iter()
        .map(|s| {
            let more = match s {
                JobSort::Created => Vec::new(),
                other => vec![("sort", other.as_str().to_owned())],
            };
            (
                s.as_str(),
                format!("{base}?{}", query_of(&pairs, &more)),
                *s == sort,
            )
        })
        .collect();
    let mut projects: Vec<(String, String)> = names.into_iter().collect();
    projects.sort_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)));
    let l = org_layout(&viewer, &org, "Jobs", "jobs", &req).await?;
    Ok(page(
        &req,
        &JobsPage {
            l,
            statuses: JobStatus::ALL.iter().map(|s| s.as_str()).collect(),
            actions: JobAction::NAMES.to_vec(),
            status: filters.status.iter().map(|s| s.as_str()).collect(),
            action: filters.action.map(|a| a.as_str()).unwrap_or_default().to_owned(),
            project: filters.project.clone().unwrap_or_default(),
            project_listed: filters
                .project
                .as_ref()
                .is_some_and(|p| projects.iter().any(|(id, _)| id == p)),
            projects,
            task: filters.task.clone().unwrap_or_default(),
            sort: sort.as_str(),
            sorts,
            chips,
            carried: pairs.iter().map(|(n, v)| ((*n).to_owned(), v.clone())).collect(),
            // The page refreshes in place, as it is (its page and order kept).
            refresh_url: format!(
                "{base}?{}",
                query_of(&pairs, &{
                    let mut more = sorted.clone();
                    if number > 1 {
                        more.push(("page", number.to_string()));
                    }
                    more
                })
            ),
            refresh_secs: viewer.state.settings.console.refresh_secs,
            table,
        },
    ))
}

/// Stops or retries the jobs picked on the list (`job`, repeated), or with `scope=matching`
/// every job the list's filter keeps; after a confirmation that says how many it changes.
pub async fn bulk(
    req: HttpRequest,
    viewer: Viewer,
    path: web::Path<String>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let form = FormFields::parse(&body);
    let org = viewer.act_in(&path, &form.csrf, false).await?;
    let filters = Filters::read(
        form.all("status").into_iter(),
        form.get("action"),
        form.get("project"),
        form.get("task"),
    )?;
    let back = format!(
        "/console/o/{}/jobs?{}",
        org.org_id,
        query_of(&filters.pairs(), &[])
    );
    let action = match form.get("do") {
        Some("stop") => BulkAction::Stop,
        Some("retry") => BulkAction::Retry,
        other => {
            return Err(super::unknown_choice(
                "do",
                other.unwrap_or(""),
                ["stop", "retry"].into_iter(),
            ))
        }
    };
    let selection = match form.get("scope") {
        Some("matching") => Selection::Matching(filters.job_filter()),
        _ => Selection::Ids(
            form.all("job")
                .into_iter()
                .filter_map(|id| JobId::parse(id).ok())
                .collect(),
        ),
    };
    if matches!(&selection, Selection::Ids(ids) if ids.is_empty()) {
        return after_form(&back, Ok::<_, crate::error::ApiError>(()), |_| {
            "Select the jobs first (or every job the filter keeps).".into()
        });
    }
    let (verb, changes) = match action {
        BulkAction::Stop => ("Stop", "queued, scheduled or running: queued and scheduled ones end now, running ones are told to stop at their next heartbeat"),
        BulkAction::Retry => ("Retry", "failed, blocked or stopped: they go back to the queue, their attempts counting on"),
    };
    if !form.confirmed() {
        let selected =
            keel_core::queue::bulk::select(&viewer.state.jobs, &org.org_id, &selection, action).await?;
        let title = match action {
            BulkAction::Stop => "Stop these jobs?",
            BulkAction::Retry => "Retry these jobs?",
        };
        let capped = match selected.capped {
            true => format!(
                " (the newest {} of those the filter keeps: one action takes no more)",
                selected.ids.len()
            ),
            false => String::new(),
        };
        let question = format!(
            "{verb} {} job(s): {} of the {} selected{capped} are {changes}; the others are left alone.",
            selected.actionable,
            selected.actionable,
            selected.ids.len(),
        );
        return Ok(confirm_page(
            org_layout(&viewer, &org, title, "jobs", &req).await?,
            Confirm {
                title,
                question,
                details: selected.ids.iter().map(ToString::to_string).collect(),
                action: format!("/console/o/{}/jobs/bulk", org.org_id),
                button: match action {
                    BulkAction::Stop => "Stop jobs",
                    BulkAction::Retry => "Retry jobs",
                },
                back: back.clone(),
            },
            // The jobs found carried on, not the ids sent (another organization's, say).
            form.carried()
                .into_iter()
                .filter(|(name, _)| name != "job")
                .chain(match &selection {
                    Selection::Ids(_) => selected
                        .ids
                        .iter()
                        .map(|id| ("job".to_owned(), id.to_string()))
                        .collect(),
                    Selection::Matching(_) => Vec::new(),
                })
                .collect(),
        ));
    }
    let reason = form.get("reason").map(|r| format::clip(r, 2000));
    let outcome = keel_core::queue::bulk::act(
        &viewer.state.jobs,
        &org.org_id,
        &selection,
        action,
        reason.as_deref(),
    )
    .await;
    after_form(&back, outcome, |acted| {
        let done = match action {
            BulkAction::Stop => "stopped (or told to stop)",
            BulkAction::Retry => "queued again",
        };
        match acted.left {
            0 => format!("{} job(s) {done}.", acted.changed),
            left => format!(
                "{} job(s) {done}; {left} left alone (not {}).",
                acted.changed,
                match action {
                    BulkAction::Stop => "queued, scheduled or running",
                    BulkAction::Retry => "failed, blocked or stopped, or their uniqueKey held by an open job",
                }
            ),
        }
    })
}

#[derive(Deserialize)]
pub struct JobPath {
    org: String,
    job: String,
}

fn is_live(job: &training_job::Model) -> bool {
    [
        JobStatus::Queued,
        JobStatus::Scheduled,
        JobStatus::Waiting,
        JobStatus::Running,
        JobStatus::Stopping,
    ]
    .contains(&job.status)
}

/// A node's size and the gaps between them, in the drawing's units.
const NODE_W: i64 = 190;
const NODE_H: i64 = 46;
const GAP_X: i64 = 60;
const GAP_Y: i64 = 16;

/// The pipeline's jobs laid out: a job's column is one past the furthest column of the jobs
/// it waits for (the first jobs in column 0), each column's jobs in creation order.
pub(super) fn draw_pipeline(
    current: &JobId,
    jobs: &[training_job::Model],
    edges: &[(JobId, JobId)],
    more: bool,
) -> Option<PipelineDrawing> {
    if jobs.len() < 2 {
        return None;
    }
    let index: HashMap<&JobId, usize> = jobs.iter().enumerate().map(|(i, j)| (&j.id, i)).collect();
    let mut waits_for: Vec<Vec<usize>> = vec![Vec::new(); jobs.len()];
    for (job, on) in edges {
        if let (Some(&j), Some(&o)) = (index.get(job), index.get(on)) {
            waits_for[j].push(o);
        }
    }
    // Columns by longest path, relaxed until stable (a pipeline has no cycles; the bound
    // guards the drawing anyway).
    let mut column = vec![0usize; jobs.len()];
    for _ in 0..jobs.len() {
        let mut changed = false;
        for j in 0..jobs.len() {
            let want = waits_for[j].iter().map(|&o| column[o] + 1).max().unwrap_or(0);
            if want > column[j] {
                column[j] = want;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let mut rows: HashMap<usize, i64> = HashMap::new();
    let mut place = vec![(0i64, 0i64); jobs.len()];
    for (j, c) in column.iter().enumerate() {
        let row = rows.entry(*c).or_default();
        place[j] = (*c as i64 * (NODE_W + GAP_X), *row * (NODE_H + GAP_Y));
        *row += 1;
    }
    let columns = column.iter().max().copied().unwrap_or(0) as i64 + 1;
    let tallest = rows.values().max().copied().unwrap_or(1);
    let nodes = jobs
        .iter()
        .zip(&place)
        .map(|(job, (x, y))| PipelineNode {
            id: job.id.to_string(),
            short: job.id.as_str().chars().take(8).collect(),
            action: job.action.to_string(),
            status: job.status.to_string(),
            x: *x,
            y: *y,
            current: job.id == *current,
            fill: match job.status {
                JobStatus::Succeeded => "#d3f0da",
                JobStatus::Failed | JobStatus::Blocked | JobStatus::Cancelled => "#fbdde2",
                JobStatus::Running | JobStatus::Stopping => "#dbe9f7",
                _ => "#f3ead2",
            },
        })
        .collect();
    let edges = waits_for
        .iter()
        .enumerate()
        .flat_map(|(j, ons)| {
            let place = &place;
            ons.iter().map(move |&o| PipelineEdge {
                x1: place[o].0 + NODE_W,
                y1: place[o].1 + NODE_H / 2,
                x2: place[j].0,
                y2: place[j].1 + NODE_H / 2,
                done: jobs[o].status == JobStatus::Succeeded,
            })
        })
        .collect();
    Some(PipelineDrawing {
        width: columns * (NODE_W + GAP_X) - GAP_X,
        height: tallest * (NODE_H + GAP_Y) - GAP_Y,
        nodes,
        edges,
        more,
        node_w: NODE_W,
        node_h: NODE_H,
    })
}

pub async fn job(
    req: HttpRequest,
    viewer: Viewer,
    path: web::Path<JobPath>,
) -> Result<HttpResponse, ConsoleError> {
    let org = viewer.org(&path.org).await?;
    let job_id = keel_core::domain::JobId::parse(&path.job).map_err(|_| ConsoleError::NotFound)?;
    let job = keel_core::queue::service::job_of_org(&viewer.state.jobs, &org.org_id, &job_id)
        .await
        .map_err(|_| ConsoleError::NotFound)?;
    let mut timeline = vec![Event {
        at: format::time(job.created_at),
        what: "created (queued)".into(),
    }];
    if let Some(at) = job.claimed_at {
        timeline.push(Event {
            at: format::time(at),
            what: format!(
                "claimed by {} (attempt {})",
                job.worker_id.as_deref().unwrap_or("a worker"),
                job.attempts
            ),
        });
    }
    if let Some(at) = job.heartbeat_at {
        timeline.push(Event {
            at: format::time(at),
            what: "last heartbeat".into(),
        });
    }
    if let Some(at) = job.finished_at {
        timeline.push(Event {
            at: format::time(at),
            what: format!("finished: {}", job.status),
        });
    }
    let live = is_live(&job);
    let history = keel_core::queue::service::histories(&viewer.state.jobs, std::slice::from_ref(&job.id))
        .await?
        .remove(&job.id)
        .unwrap_or_default()
        .iter()
        .map(|a| AttemptRow {
            attempt: a.attempt,
            worker: a.worker_id.clone().unwrap_or_default(),
            claimed: a.claimed_at.map(format::time).unwrap_or_default(),
            ended: format::time(a.ended_at),
            outcome: a.outcome.to_string(),
            error: a
                .error
                .as_deref()
                .map(|e| format::clip(e, 500))
                .unwrap_or_default(),
        })
        .collect();
    let detail = JobDetail {
        org_id: org.org_id.to_string(),
        csrf: viewer.csrf.clone(),
        priority: job.priority,
        scheduled_at: job
            .scheduled_at
            .filter(|_| job.status == JobStatus::Scheduled)
            .map(format::time),
        history,
        can_stop: org.can_act()
            && [
                JobStatus::Queued,
                JobStatus::Scheduled,
                JobStatus::Waiting,
                JobStatus::Running,
            ]
            .contains(&job.status),
        can_retry: org.can_act()
            && [JobStatus::Failed, JobStatus::Blocked, JobStatus::UserStopped].contains(&job.status),
        stop_requested: job.stop_requested,
        stop_reason: job.stop_reason.clone(),
        timeline,
        live_status: job
            .live_status
            .as_deref()
            .map(|t| format::clip(&format::pretty_json(t), SHOWN)),
        result: job
            .result
            .as_deref()
            .map(|t| format::clip(&format::pretty_json(t), SHOWN)),
        error: job.error.clone(),
        payload: format::clip(&format::pretty_json(&job.payload), SHOWN),
        pipeline: {
            let (jobs, edges, more) =
                keel_core::queue::service::pipeline_graph(&viewer.state.jobs, &job.id).await?;
            draw_pipeline(&job.id, &jobs, &edges, more)
        },
        job: job_row(
            &job,
            &project_names(&viewer, &org).await?,
            viewer.state.settings.queue.max_attempts,
        ),
    };
    if wants_partial(&req) {
        return Ok(html(actix_web::http::StatusCode::OK, &detail));
    }
    let l = org_layout(&viewer, &org, &format!("Job {}", job.id), "jobs", &req).await?;
    Ok(page(
        &req,
        &JobPage {
            l,
            refresh_url: format!("/console/o/{}/jobs/{}", org.org_id, job.id),
            refresh_secs: viewer.state.settings.console.refresh_secs,
            id: job.id.to_string(),
            live,
            detail: askama::Template::render(&detail)
                .map_err(anyhow::Error::from)
                .map_err(crate::error::ApiError::from)?,
        },
    ))
}

/// The job a console form acts on: the form read, the caller's right to act in the
/// organization checked (its CSRF token included), the job found in it.
async fn job_to_act_on(
    viewer: &Viewer,
    path: &JobPath,
    body: &[u8],
) -> Result<(FormFields, OrgView, training_job::Model), ConsoleError> {
    let form = FormFields::parse(body);
    let org = viewer.act_in(&path.org, &form.csrf, false).await?;
    let job_id = keel_core::domain::JobId::parse(&path.job).map_err(|_| ConsoleError::NotFound)?;
    let job = keel_core::queue::service::job_of_org(&viewer.state.jobs, &org.org_id, &job_id)
        .await
        .map_err(|_| ConsoleError::NotFound)?;
    Ok((form, org, job))
}

/// The page that asks before stopping or retrying `job`, carrying the form on.
async fn confirm_job_action(
    viewer: &Viewer,
    req: &HttpRequest,
    org: &OrgView,
    job: &training_job::Model,
    form: &FormFields,
    verb: &'static str,
    question: String,
) -> Result<HttpResponse, ConsoleError> {
    let title = match verb {
        "stop" => "Stop the job?",
        _ => "Retry the job?",
    };
    let back = format!("/console/o/{}/jobs/{}", job.org_id, job.id);
    Ok(confirm_page(
        org_layout(viewer, org, title, "jobs", req).await?,
        Confirm {
            title,
            question,
            details: vec![format!("{} ({}, {})", job.id, job.action, job.status)],
            action: format!("{back}/{verb}"),
            button: match verb {
                "stop" => "Stop job",
                _ => "Retry job",
            },
            back,
        },
        form.carried(),
    ))
}

/// Stops the job by the API's rules (queued ends at once, running is asked to stop).
pub async fn stop_job(
    req: HttpRequest,
    viewer: Viewer,
    path: web::Path<JobPath>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let (form, org, job) = job_to_act_on(&viewer, &path, &body).await?;
    if !form.confirmed() {
        let question = match job.status {
            keel_core::domain::JobStatus::Running => {
                "Its worker is told to stop at its next heartbeat; the work done so far may be lost."
            }
            _ => "It ends now and will not run.",
        };
        return confirm_job_action(&viewer, &req, &org, &job, &form, "stop", question.into()).await;
    }
    let reason = form.get("reason").map(|r| format::clip(r, 2000));
    let outcome = keel_core::queue::service::stop_job(&viewer.state.jobs, &job, reason.as_deref()).await;
    after_form(
        &format!("/console/o/{}/jobs/{}", job.org_id, job.id),
        outcome,
        |job| match job.status {
            keel_core::domain::JobStatus::Stopping => {
                "Stop requested: the worker is told at its next heartbeat.".into()
            }
            _ => "Job stopped.".into(),
        },
    )
}

/// Puts a failed, blocked or stopped job back in the queue, by the API's rules.
pub async fn retry_job(
    req: HttpRequest,
    viewer: Viewer,
    path: web::Path<JobPath>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let (form, org, job) = job_to_act_on(&viewer, &path, &body).await?;
    if !form.confirmed() {
        let question = "It goes back to the queue and will be claimed again; its attempts keep counting.";
        return confirm_job_action(&viewer, &req, &org, &job, &form, "retry", question.into()).await;
    }
    let outcome = keel_core::queue::service::retry_job(&viewer.state.jobs, &job).await;
    after_form(
        &format!("/console/o/{}/jobs/{}", job.org_id, job.id),
        outcome,
        |_| "Job queued again.".into(),
    )
}
