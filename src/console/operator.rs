//! Operator pages (internal key): the queue across organizations and the trace writer.

use std::collections::BTreeMap;

use actix_web::{web, HttpRequest, HttpResponse};
use chrono::DurationRound;

use super::chart::{self, Series};
use super::pages::{
    CountRow, FailedPage, FailedRow, GrantPage, HeldJob, HeldRow, LatencyRow, Layout, OrgShareRow, Pager,
    QueuePage, WriterPage,
};
use super::session::Viewer;
use super::{after_form, confirm_page, format, page, Confirm, ConsoleError, Flash, FormFields};
use keel_core::domain::{AttemptOutcome, JobAction, JobId, JobStatus, OrgId};
use keel_core::queue::FailedFilter;

fn operator_only(viewer: &Viewer) -> Result<(), ConsoleError> {
    match viewer.is_operator() {
        true => Ok(()),
        false => Err(ConsoleError::NotFound),
    }
}

fn held_job(
    job: &entities::training_job::Model,
    now: chrono::DateTime<chrono::Utc>,
    stale: bool,
    name_of: &dyn Fn(&str) -> String,
) -> HeldJob {
    HeldJob {
        org_name: name_of(job.org_id.as_str()),
        id: job.id.to_string(),
        org_id: job.org_id.to_string(),
        action: job.action.to_string(),
        status: job.status.to_string(),
        heartbeat: match job.heartbeat_at.or(job.claimed_at) {
            Some(at) => format!("{} ago", format::age(now - at)),
            None => "—".into(),
        },
        stale,
    }
}

/// Every organization's name by id (the operator's pages show names, ids on hover).
async fn org_names(viewer: &Viewer) -> Result<std::collections::HashMap<String, String>, ConsoleError> {
    Ok(keel_core::orgs::service::all(&viewer.state.db)
        .await
        .map_err(crate::error::ApiError::from)?
        .into_iter()
        .map(|o| (o.id.to_string(), o.name))
        .collect())
}

pub async fn queue(req: HttpRequest, viewer: Viewer) -> Result<HttpResponse, ConsoleError> {
    operator_only(&viewer)?;
    let names = org_names(&viewer).await?;
    let name_of = |id: &str| names.get(id).cloned().unwrap_or_else(|| id.to_owned());
    let overview = keel_core::queue::service::queue_overview(&viewer.state.jobs).await?;
    let paused: Vec<JobAction> = keel_core::queue::service::action_queues(&viewer.state.jobs)
        .await?
        .into_iter()
        .filter(|q| q.paused)
        .map(|q| q.action)
        .collect();
    let shares = keel_core::queue::service::org_shares(&viewer.state.jobs)
        .await?
        .into_iter()
        .map(|(share, queued)| OrgShareRow {
            org_name: name_of(share.org_id.as_str()),
            org_id: share.org_id.to_string(),
            max_running: share.max_running.map(|n| n.to_string()).unwrap_or_default(),
            weight: share.weight,
            queued,
            running: share.running,
            cap: match (share.effective_max_running, share.max_running) {
                (0, _) => "none".into(),
                (cap, None) => format!("{cap} (default)"),
                (cap, Some(_)) => cap.to_string(),
            },
            at_cap: share.effective_max_running > 0 && share.running >= share.effective_max_running,
        })
        .collect();
    let now = chrono::Utc::now();
    let counts = JobAction::NAMES
        .iter()
        .map(|action| CountRow {
            action: (*action).to_owned(),
            paused: paused.iter().any(|p| p.as_str() == *action),
            counts: JobStatus::ALL
                .iter()
                .map(|s| {
                    overview
                        .counts
                        .iter()
                        .filter(|(a, st, _)| a == action && st == s.as_str())
                        .map(|(_, _, n)| *n)
                        .sum()
                })
                .collect(),
            oldest: overview
                .oldest_queued
                .iter()
                .find(|(a, _)| a == action)
                .map(|(_, age)| format::age(*age))
                .unwrap_or_else(|| "—".into()),
        })
        .collect();
    let throughput = keel_core::queue::service::throughput(&viewer.state.jobs, now).await?;
    let (throughput_svg, throughput_summary, throughput_keys) = throughput_chart(&throughput);
    let latencies = viewer
        .state
        .metrics
        .queue_latencies()
        .into_iter()
        .map(|l| LatencyRow {
            action: l.action.to_string(),
            waits: l.wait.count,
            wait: [l.wait.p50, l.wait.p90, l.wait.p99].map(seconds),
            runs: l.run.count,
            run: [l.run.p50, l.run.p90, l.run.p99].map(seconds),
        })
        .collect();
    let stale_ids: Vec<&str> = overview.stale.iter().map(|j| j.id.as_str()).collect();
    let mut by_worker: BTreeMap<String, Vec<HeldJob>> = BTreeMap::new();
    for job in &overview.held {
        by_worker
            .entry(job.worker_id.clone().unwrap_or_else(|| "(none)".into()))
            .or_default()
            .push(held_job(job, now, stale_ids.contains(&job.id.as_str()), &name_of));
    }
    Ok(page(
        &req,
        &QueuePage {
            l: Layout::new("Queue", &viewer, "queue", Flash::read(&req)),
            statuses: JobStatus::ALL.iter().map(|s| s.as_str()).collect(),
            counts,
            shares,
            held: by_worker
                .into_iter()
                .map(|(worker, jobs)| HeldRow { worker, jobs })
                .collect(),
            stale: overview
                .stale
                .iter()
                .map(|j| held_job(j, now, true, &name_of))
                .collect(),
            stale_after: format::age(overview.stale_after),
            throughput_svg,
            throughput_summary,
            throughput_keys,
            latencies,
        },
    ))
}

/// A duration in seconds as the page writes it.
fn duration(s: f64) -> String {
    match s {
        s if s < 1.0 => format!("{} ms", (s * 1000.0).round()),
        s if s < 120.0 => format!("{s:.1} s").replace(".0 s", " s"),
        s => format::age(chrono::Duration::seconds(s as i64)),
    }
}

/// A percentile as the range of the histogram bucket that holds it ("—" without
/// observations): `10–50 ms`, `under 5 ms`, `over 2 min 0 s`.
fn seconds(value: Option<(f64, f64)>) -> String {
    match value {
        None => "—".into(),
        Some((lower, upper)) if upper.is_infinite() => format!("over {}", duration(lower)),
        Some((lower, upper)) if lower <= 0.0 => format!("under {}", duration(upper)),
        Some((lower, upper)) => format!("{}–{}", duration(lower), duration(upper)),
    }
}

/// The throughput chart's CSS class per outcome.
fn outcome_class(outcome: AttemptOutcome) -> &'static str {
    match outcome {
        AttemptOutcome::Succeeded => "o-succeeded",
        AttemptOutcome::Failed => "o-failed",
        AttemptOutcome::Retried => "o-retried",
        AttemptOutcome::Stale => "o-stale",
        AttemptOutcome::Interrupted => "o-interrupted",
        AttemptOutcome::Blocked => "o-blocked",
        AttemptOutcome::UserStopped => "o-user_stopped",
    }
}

/// Stacked bars of attempts ended per hour by outcome (24 bars that fit a phone's width),
/// a summary line and the key.
fn throughput_chart(
    t: &keel_core::queue::service::Throughput,
) -> (String, String, Vec<(&'static str, &'static str)>) {
    // The 5-minute buckets summed into the hours they start in.
    let mut hours: Vec<chrono::DateTime<chrono::Utc>> = Vec::new();
    let mut of_bucket: Vec<usize> = Vec::with_capacity(t.starts.len());
    for at in &t.starts {
        let hour = at.duration_trunc(chrono::Duration::hours(1)).unwrap_or(*at);
        if hours.last() != Some(&hour) {
            hours.push(hour);
        }
        of_bucket.push(hours.len() - 1);
    }
    let columns: Vec<String> = hours
        .iter()
        .map(|at| {
            format!(
                "{}–{} UTC",
                at.format("%Y-%m-%d %H:00"),
                (*at + chrono::Duration::hours(1)).format("%H:00")
            )
        })
        .collect();
    // A label under every sixth hour: four labels, readable at 390 px.
    let axis: Vec<String> = hours
        .iter()
        .map(|at| match at.timestamp() % (6 * 3600) == 0 {
            true => at.format("%H:00").to_string(),
            false => String::new(),
        })
        .collect();
    let series: Vec<Series> = t
        .counts
        .iter()
        .map(|(outcome, values)| {
            let mut per_hour = vec![0i64; hours.len()];
            for (bucket, n) in values.iter().enumerate() {
                if let Some(&hour) = of_bucket.get(bucket) {
                    per_hour[hour] += n;
                }
            }
            Series {
                name: outcome.as_str(),
                class: outcome_class(*outcome),
                values: per_hour,
            }
        })
        .collect();
    let svg = chart::stacked_bars(
        "Job attempts ended per hour over the last 24 hours, stacked by outcome",
        &columns,
        &axis,
        &series,
        &[],
        |v| v.to_string(),
    );
    let totals: Vec<String> = t
        .counts
        .iter()
        .map(|(outcome, values)| (outcome, values.iter().sum::<i64>()))
        .filter(|(_, n)| *n > 0)
        .map(|(outcome, n)| format!("{n} {outcome}"))
        .collect();
    let summary = match totals.is_empty() {
        true => "No attempt ended in the last 24 hours.".to_owned(),
        false => format!("Attempts ended in the last 24 hours: {}.", totals.join(", ")),
    };
    let keys = t
        .counts
        .iter()
        .map(|(outcome, _)| (outcome_class(*outcome), outcome.as_str()))
        .collect();
    (svg, summary, keys)
}

/// An operator's destructive form: its CSRF token checked, its fields read.
fn operator_form(viewer: &Viewer, body: &[u8]) -> Result<FormFields, ConsoleError> {
    let form = FormFields::parse(body);
    viewer.check_csrf(&form.csrf)?;
    operator_only(viewer)?;
    Ok(form)
}

/// The same sweep as `POST /api/training/internal/jobs/requeue-stale`, once confirmed.
pub async fn requeue_stale(viewer: Viewer, body: web::Bytes) -> Result<HttpResponse, ConsoleError> {
    let form = operator_form(&viewer, &body)?;
    if !form.confirmed() {
        let overview = keel_core::queue::service::queue_overview(&viewer.state.jobs).await?;
        return Ok(confirm_page(
            Layout::new("Requeue stale jobs?", &viewer, "queue", None),
            Confirm {
                title: "Requeue stale jobs?",
                question: format!(
                    "Jobs without a heartbeat for {} go back to the queue, or fail once their attempts are spent; their workers' reports will be refused. {} job(s) are past the threshold now.",
                    format::age(overview.stale_after),
                    overview.stale.len()
                ),
                details: overview.stale.iter().map(|j| format!("{} ({})", j.id, j.action)).collect(),
                action: "/console/operator/requeue-stale".into(),
                button: "Requeue stale jobs",
                back: "/console/operator/queue".into(),
            },
            form.carried(),
        ));
    }
    let outcome = keel_core::queue::service::requeue_stale(&viewer.state.jobs).await;
    after_form("/console/operator/queue", outcome, |c| {
        format!(
            "Stale sweep: {} requeued, {} failed, {} stopped.",
            c.requeued, c.failed, c.stopped
        )
    })
}

/// Sets an organization's weight and cap on running jobs, as
/// `PUT /api/internal/orgs/{id}/queue` does (the same body and bounds), once confirmed.
pub async fn set_share(
    viewer: Viewer,
    path: web::Path<String>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let form = operator_form(&viewer, &body)?;
    let back = "/console/operator/queue";
    let org_id = keel_core::domain::OrgId::parse(&path).map_err(|_| ConsoleError::NotFound)?;
    let org = keel_core::orgs::service::org(&viewer.state.db, &org_id)
        .await
        .map_err(|_| ConsoleError::NotFound)?;
    let mut json = serde_json::Map::new();
    if let Some(weight) = form.number("weight") {
        json.insert("weight".into(), weight);
    }
    json.insert(
        "maxRunning".into(),
        form.number("maxRunning").unwrap_or(serde_json::Value::Null),
    );
    let parsed = crate::http::extract::parse_checked_body::<crate::queue::internal::OrgQueueBody>(
        serde_json::Value::Object(json).to_string().as_bytes(),
    );
    let body = match parsed {
        Ok(body) => body,
        Err(err) => return after_form(back, Err::<(), _>(err), |()| String::new()),
    };
    let weight = body.weight.unwrap_or(1);
    let cap = match body.max_running {
        None => format!(
            "the default cap ({})",
            viewer.state.settings.queue.max_running_per_org
        ),
        Some(0) => "no cap".to_owned(),
        Some(n) => format!("a cap of {n} running jobs"),
    };
    if !form.confirmed() {
        return Ok(confirm_page(
            Layout::new("Change the organization's share?", &viewer, "queue", None),
            Confirm {
                title: "Change the organization's share?",
                question: format!(
                    "{}: weight {weight} and {cap}. Claims hand its jobs out by the new weight from the next claim on.",
                    org.name
                ),
                details: vec![org.id.to_string()],
                action: format!("/console/operator/orgs/{}/queue", org.id),
                button: "Save share",
                back: back.into(),
            },
            form.carried(),
        ));
    }
    let outcome =
        keel_core::queue::service::set_org_queue(&viewer.state.jobs, &org.id, weight, body.max_running).await;
    after_form(back, outcome, |_| {
        format!("{}: weight {weight}, {cap}.", org.name)
    })
}

/// Pauses an action's queue, as `POST /api/internal/queue/{action}/pause` does, once confirmed.
pub async fn pause(
    viewer: Viewer,
    path: web::Path<String>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    set_paused(viewer, &path, &body, true).await
}

/// Resumes an action's queue, as `POST /api/internal/queue/{action}/resume` does.
pub async fn resume(
    viewer: Viewer,
    path: web::Path<String>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    set_paused(viewer, &path, &body, false).await
}

async fn set_paused(
    viewer: Viewer,
    action: &str,
    body: &[u8],
    paused: bool,
) -> Result<HttpResponse, ConsoleError> {
    let form = operator_form(&viewer, body)?;
    let action = JobAction::parse(action).ok_or(ConsoleError::NotFound)?;
    if paused && !form.confirmed() {
        return Ok(confirm_page(
            Layout::new("Pause the queue?", &viewer, "queue", None),
            Confirm {
                title: "Pause the queue?",
                question: format!(
                    "Claims of {action} jobs will hand out nothing, on every instance, until the queue is resumed. Running jobs go on."
                ),
                details: Vec::new(),
                action: format!("/console/operator/queue/{action}/pause"),
                button: "Pause",
                back: "/console/operator/queue".into(),
            },
            form.carried(),
        ));
    }
    let jobs = &viewer.state.jobs;
    let outcome = match paused {
        true => keel_core::queue::service::pause(jobs, action).await,
        false => keel_core::queue::service::resume(jobs, action).await,
    };
    after_form("/console/operator/queue", outcome, |q| match q.paused {
        true => format!("{}: paused; its jobs are not claimed until resumed.", q.action),
        false => format!("{}: resumed.", q.action),
    })
}

#[derive(serde::Deserialize)]
pub struct FailedQuery {
    action: Option<String>,
    org: Option<String>,
    q: Option<String>,
    /// 1 for the first.
    page: Option<String>,
}

/// The filter a failed-jobs address or form names; an unknown action or a malformed
/// organization id is a 400 page saying so (never a filter quietly dropped).
fn failed_filter(
    action: Option<&str>,
    org: Option<&str>,
    q: Option<&str>,
) -> Result<FailedFilter, ConsoleError> {
    let action = match action.map(str::trim).filter(|a| !a.is_empty()) {
        Some(a) => Some(
            JobAction::parse(a)
                .ok_or_else(|| super::unknown_choice("action", a, JobAction::NAMES.iter().copied()))?,
        ),
        None => None,
    };
    let org_id = match org.map(str::trim).filter(|o| !o.is_empty()) {
        Some(o) => Some(OrgId::parse(o).map_err(|_| super::unreadable("organization id"))?),
        None => None,
    };
    let error_text = q
        .map(|q| q.trim().chars().take(200).collect::<String>())
        .filter(|q| !q.is_empty());
    Ok(FailedFilter {
        action,
        org_id,
        error_text,
    })
}

/// Failed jobs across organizations, filtered by action, organization and error text.
pub async fn failed(
    req: HttpRequest,
    viewer: Viewer,
    query: web::Query<FailedQuery>,
) -> Result<HttpResponse, ConsoleError> {
    operator_only(&viewer)?;
    let query = query.into_inner();
    let filter = failed_filter(query.action.as_deref(), query.org.as_deref(), query.q.as_deref())?;
    let per_page = keel_core::queue::service::FAILED_SHOWN;
    let number = Pager::number(query.page.as_deref(), per_page)?;
    let (jobs, total) = keel_core::queue::service::failed_jobs(
        &viewer.state.jobs,
        &filter,
        (number - 1) * per_page,
        per_page,
    )
    .await?;
    let names = org_names(&viewer).await?;
    let now = chrono::Utc::now();
    let jobs = jobs
        .iter()
        .map(|job| FailedRow {
            id: job.id.to_string(),
            org_id: job.org_id.to_string(),
            org_name: names
                .get(job.org_id.as_str())
                .cloned()
                .unwrap_or_else(|| job.org_id.to_string()),
            action: job.action.to_string(),
            attempts: job.attempts,
            error: format::clip(job.error.as_deref().unwrap_or(""), 500),
            failed: job
                .finished_at
                .map(|at| format!("{} ago", format::age(now - at)))
                .unwrap_or_else(|| "—".into()),
        })
        .collect();
    let clipped = |v: &Option<String>| {
        v.as_ref()
            .map(|v| v.trim().chars().take(200).collect())
            .unwrap_or_default()
    };
    let mut filters = form_urlencoded::Serializer::new(String::new());
    for (name, value) in [("action", &query.action), ("org", &query.org), ("q", &query.q)] {
        if let Some(value) = value.as_deref().map(str::trim).filter(|v| !v.is_empty()) {
            filters.append_pair(name, value);
        }
    }
    let filters = filters.finish();
    let link_to = |n: u64| match n {
        1 => format!("/console/operator/failed?{filters}"),
        n => {
            let mut link = form_urlencoded::Serializer::new(filters.clone());
            link.append_pair("page", &n.to_string());
            format!("/console/operator/failed?{}", link.finish())
        }
    };
    let mut orgs: Vec<(String, String)> = names.into_iter().collect();
    orgs.sort_by(|a, b| a.1.cmp(&b.1).then(a.0.cmp(&b.0)));
    Ok(page(
        &req,
        &FailedPage {
            l: Layout::new("Failed jobs", &viewer, "failed", Flash::read(&req)),
            actions: JobAction::NAMES.to_vec(),
            action: clipped(&query.action),
            org: clipped(&query.org),
            orgs,
            q: clipped(&query.q),
            jobs,
            pager: Pager::of(number, total, per_page, link_to),
            all_cap: (total > keel_core::queue::service::MAX_RETRIED_AT_ONCE as u64)
                .then(|| format::count(keel_core::queue::service::MAX_RETRIED_AT_ONCE as i64)),
        },
    ))
}

/// Retries one failed job, the selected ones, or all those a filter shows, once confirmed;
/// a job no longer failed, blocked or user-stopped is left alone and counted.
pub async fn retry_failed(viewer: Viewer, body: web::Bytes) -> Result<HttpResponse, ConsoleError> {
    let form = operator_form(&viewer, &body)?;
    let ids: Vec<JobId> = match form.get("scope") {
        Some("all") => {
            let filter = failed_filter(
                form.get("filter_action"),
                form.get("filter_org"),
                form.get("filter_q"),
            )?;
            // Every failed job the filter keeps, the newest a retry of many takes.
            keel_core::queue::service::failed_jobs(
                &viewer.state.jobs,
                &filter,
                0,
                keel_core::queue::service::MAX_RETRIED_AT_ONCE as u64,
            )
            .await?
            .0
            .into_iter()
            .map(|job| job.id)
            .collect()
        }
        _ => form
            .all("job")
            .into_iter()
            .filter_map(|id| JobId::parse(id).ok())
            .collect(),
    };
    let back = "/console/operator/failed";
    if ids.is_empty() {
        return after_form(back, Ok::<_, crate::error::ApiError>(()), |_| {
            "Select the jobs to retry first.".into()
        });
    }
    let ids = &ids[..ids.len().min(keel_core::queue::service::MAX_RETRIED_AT_ONCE)];
    if !form.confirmed() {
        return Ok(confirm_page(
            Layout::new("Retry failed jobs?", &viewer, "failed", None),
            Confirm {
                title: "Retry failed jobs?",
                question: format!(
                    "{} job(s) go back to the queue and will be claimed again; each keeps counting its attempts.",
                    ids.len()
                ),
                details: ids.iter().map(ToString::to_string).collect(),
                action: "/console/operator/failed/retry".into(),
                button: "Retry",
                back: back.into(),
            },
            ids.iter().map(|id| ("job".to_owned(), id.to_string())).collect(),
        ));
    }
    let outcome = keel_core::queue::service::retry_jobs(&viewer.state.jobs, ids).await;
    after_form(back, outcome, |r| {
        match r.skipped {
        0 => format!("{} job(s) queued again.", r.retried.len()),
        skipped => format!(
            "{} job(s) queued again; {skipped} left alone (no longer failed, blocked or stopped, or their uniqueKey held by an open job).",
            r.retried.len()
        ),
    }
    })
}

pub async fn writer(req: HttpRequest, viewer: Viewer) -> Result<HttpResponse, ConsoleError> {
    operator_only(&viewer)?;
    let traces = &viewer.state.traces;
    let m = &traces.metrics;
    let figures = vec![
        ("Recorded (handed to the writer)", m.recorded.get().to_string()),
        ("Written", m.written.get().to_string()),
        ("Batches committed", m.batches.get().to_string()),
        ("Dropped (queue full)", m.dropped.get().to_string()),
        (
            "Refused (project or organization gone)",
            m.refused.get().to_string(),
        ),
        ("Failed after retries", m.write_failures.get().to_string()),
        ("Queue depth now", traces.queue_depth().to_string()),
    ];
    Ok(page(
        &req,
        &WriterPage {
            l: Layout::new("Trace writer", &viewer, "writer", Flash::read(&req)),
            figures,
        },
    ))
}

/// The form to grant credit by hand (a goodwill credit or a refund).
pub async fn grants(req: HttpRequest, viewer: Viewer) -> Result<HttpResponse, ConsoleError> {
    operator_only(&viewer)?;
    Ok(page(
        &req,
        &GrantPage {
            l: Layout::new("Grant credit", &viewer, "grants", Flash::read(&req)),
            key: uuid::Uuid::new_v4().to_string(),
        },
    ))
}

/// Grants credit once confirmed: the same flow as `POST /api/internal/billing/grants`, the
/// form's key making a resubmitted form one grant.
pub async fn grant(viewer: Viewer, body: web::Bytes) -> Result<HttpResponse, ConsoleError> {
    let form = operator_form(&viewer, &body)?;
    let back = "/console/operator/grants";
    // The form as the API's body, held to that body's bounds and rules (one place for them):
    // the date input's day is its first instant (UTC).
    let parsed = (|| {
        let mut body = serde_json::Map::new();
        if let Some(org) = form.get("orgId") {
            body.insert("orgId".into(), org.trim().into());
        }
        if let Some(amount) = form.number("amountCents") {
            body.insert("amountCents".into(), amount);
        }
        if let Some(reason) = form.get("reason") {
            body.insert("reason".into(), reason.trim().into());
        }
        if let Some(priority) = form.number("priority") {
            body.insert("priority".into(), priority);
        }
        if let Some(day) = form.get("expiresOn") {
            let at = crate::billing::dto::instant(day.trim())
                .map_or_else(|| day.into(), |at| at.to_rfc3339().into());
            body.insert("expiresAt".into(), at);
        }
        let json = serde_json::Value::Object(body).to_string();
        let body: crate::billing::dto::ManualGrantBody =
            crate::http::extract::parse_checked_body(json.as_bytes())?;
        Ok::<_, crate::error::ApiError>((
            body.org_id,
            body.amount_cents,
            body.reason,
            body.expires_at,
            body.priority,
        ))
    })();
    let (org_id, amount, reason, expires_at, priority) = match parsed {
        Ok(parsed) => parsed,
        Err(err) => return after_form(back, Err::<(), _>(err), |_| String::new()),
    };
    // An unknown organization is refused before anything is asked; a known one is named.
    let org = match keel_core::orgs::service::org(&viewer.state.db, &org_id).await {
        Ok(org) => org,
        Err(err) => return after_form(back, Err::<(), _>(err), |_| String::new()),
    };
    if !form.confirmed() {
        return Ok(confirm_page(
            Layout::new("Grant credit?", &viewer, "grants", None),
            Confirm {
                title: "Grant credit?",
                question: format!(
                    "{} is credited to the organization now, as a manual grant{}.",
                    format::cents(amount.get()),
                    expires_at
                        .map(|at| format!(" that expires {}", format::time(at)))
                        .unwrap_or_default()
                ),
                details: vec![
                    format!("organization {} ({org_id})", org.name),
                    format!("reason: {reason}"),
                ],
                action: back.into(),
                button: "Grant credit",
                back: back.into(),
            },
            form.carried(),
        ));
    }
    let key = form.get("key").unwrap_or_default().to_owned();
    let outcome = keel_core::billing::service::manual_grant(
        &viewer.state.billing,
        &org_id,
        keel_core::billing::service::ManualGrant {
            amount,
            reason,
            expires_at,
            priority,
            key,
            created_by: viewer.operator_label(),
        },
    )
    .await;
    after_form(back, outcome, |grant| {
        format!(
            "{} granted to {} ({}, grant {}).",
            format::dollars(grant.original_microcents),
            org.name,
            grant.org_id,
            grant.id
        )
    })
}
