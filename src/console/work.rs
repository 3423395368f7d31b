//! An organization's work: training jobs, recorded traces, eval runs and runs.

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use serde_json::Value;

use super::org::org_layout;
use super::pages::{
    CaseRow, EvalRow, EvalRunPage, EvalsPage, Message, Part, ProjectRow, RunRow, RunsPage, ScoreRow,
    SuiteChart, TracePage, TraceProjectsPage, TraceRow, TracesPage,
};
use super::session::{OrgView, Viewer};
use super::{after_form, chart, confirm_page, format, page, Confirm, ConsoleError, FormFields};
use crate::error::ApiError;
use keel_core::traces::export::Format;
use keel_core::traces::TraceFilter;

use super::trace_filter::TraceFilters;

/// Rows per page of jobs and traces.
const PAGE: u64 = 50;
/// Eval runs and runs listed at most.
/// Runs (training runs, eval runs) a page shows.
const RUNS_PAGE: u64 = 50;
/// Eval cases per page.
const CASES_PAGE: u64 = 100;

/// A runs or eval-runs page's cursor `(time, id)` as it travels in a link: `<rfc3339>_<id>`
/// (their ids are the clients' own text, which the shared keyset cursor, made for keel's
/// UUIDs, cannot carry; jobs and traces page by `keel_core::paging::Keyset`).
fn text_cursor_of(at: chrono::DateTime<chrono::Utc>, id: &str) -> String {
    format!("{}_{id}", at.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true))
}

/// A runs page's `before` cursor: none, or one [`text_cursor_of`] wrote (else a 400 page).
fn text_cursor(raw: Option<&str>) -> Result<Option<(chrono::DateTime<chrono::Utc>, String)>, ConsoleError> {
    let Some(raw) = raw.filter(|r| !r.is_empty()) else {
        return Ok(None);
    };
    let (at, id) = raw
        .split_once('_')
        .ok_or_else(|| super::unreadable("\"before\""))?;
    let at = chrono::DateTime::parse_from_rfc3339(at).map_err(|_| super::unreadable("\"before\""))?;
    Ok(Some((at.with_timezone(&chrono::Utc), id.to_owned())))
}

/// A jobs or traces page's `before` cursor: none, or the shared keyset cursor the API's
/// lists give (else a 400 page).
fn keyset_cursor(raw: Option<&str>) -> Result<Option<keel_core::paging::Keyset>, ConsoleError> {
    match raw.filter(|r| !r.is_empty()) {
        None => Ok(None),
        Some(raw) => keel_core::paging::Keyset::decode(raw)
            .map(Some)
            .ok_or_else(|| super::unreadable("\"before\"")),
    }
}

pub async fn trace_projects(
    req: HttpRequest,
    viewer: Viewer,
    path: web::Path<String>,
) -> Result<HttpResponse, ConsoleError> {
    let org = viewer.org(&path).await?;
    let orgs = std::slice::from_ref(&org.org_id);
    let mut projects: Vec<ProjectRow> =
        keel_core::traces::service::projects_with_traces(&viewer.state.db, orgs)
            .await?
            .into_iter()
            .map(|(id, name, count, last)| ProjectRow {
                id: id.into(),
                name,
                count,
                last: format::time(last),
            })
            .collect();
    // Every project, its first trace yet to come included (its retention set beforehand).
    for p in keel_core::projects::service::projects_in(&viewer.state.db, orgs)
        .await
        .map_err(ApiError::from)?
    {
        if !projects.iter().any(|row| row.id == p.id.as_str()) {
            projects.push(ProjectRow {
                id: p.id.into(),
                name: p.name,
                count: 0,
                last: "no traces yet".into(),
            });
        }
    }
    let l = org_layout(&viewer, &org, "Traces", "traces", &req).await?;
    Ok(page(&req, &TraceProjectsPage { l, projects }))
}

#[derive(Deserialize)]
pub struct ProjectPath {
    pub(super) org: String,
    pub(super) project: String,
}

fn trace_row(t: &keel_core::traces::ListedTrace, marks: &keel_core::traces::marks::Marks) -> TraceRow {
    TraceRow {
        id: t.id.to_string(),
        at: format::time(t.created_at),
        provider: t.provider.clone(),
        model: t.model.clone().unwrap_or_default(),
        status: t.status_code,
        ok: (200..300).contains(&t.status_code),
        latency: t.latency_ms,
        ttfb: t.ttfb_ms.map(|v| format!("{v} ms")).unwrap_or_else(|| "—".into()),
        tokens: match (t.prompt_tokens, t.completion_tokens) {
            (Some(p), Some(c)) => format!("{p} / {c}"),
            (Some(p), None) => format!("{p} / —"),
            _ => "—".into(),
        },
        stream: t.stream,
        preview_input: t.preview_input.clone().unwrap_or_default(),
        preview_output: t.preview_output.clone().unwrap_or_default(),
        tags: marks.tags.clone(),
        scores: marks
            .scores
            .iter()
            .map(|(name, score)| (name.clone(), score.value.to_string()))
            .collect(),
    }
}

/// The project, if it is the organization's.
pub(super) async fn project_of(
    viewer: &Viewer,
    org_id: &keel_core::domain::OrgId,
    raw: &str,
) -> Result<entities::project::Model, ConsoleError> {
    let id = keel_core::domain::ProjectId::parse(raw).map_err(|_| ConsoleError::NotFound)?;
    keel_core::projects::service::project_of(&viewer.state.db, std::slice::from_ref(org_id), &id)
        .await
        .map_err(|err| match err {
            keel_core::projects::ProjectError::NotFound => ConsoleError::NotFound,
            err => err.into(),
        })
}

/// How many traces an action on "every trace the filter keeps" takes at most (the newest).
const MATCHING_AT_ONCE: u64 = 1000;

pub async fn traces(
    req: HttpRequest,
    viewer: Viewer,
    path: web::Path<ProjectPath>,
) -> Result<HttpResponse, ConsoleError> {
    let org = viewer.org(&path.org).await?;
    let project = project_of(&viewer, &org.org_id, &path.project).await?;
    let pairs: Vec<(String, String)> = form_urlencoded::parse(req.query_string().as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let get = |name: &str| pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str());
    let (filters, filter) = TraceFilters::read(get)?;
    let before = match keyset_cursor(get("before"))? {
        None => None,
        Some(k) => Some(keel_core::traces::service::Cursor {
            at: k.at,
            id: keel_core::domain::TraceId::parse(&k.id).map_err(|_| super::unreadable("\"before\""))?,
        }),
    };
    let db = &viewer.state.db;
    let orgs = std::slice::from_ref(&org.org_id);
    let total = keel_core::traces::browse::count(db, orgs, &project.id, &filter).await?;
    let listed = keel_core::traces::browse::list(db, orgs, &project.id, filter, before.clone(), PAGE).await?;
    let query = filters.query();
    let base = format!("/console/o/{}/projects/{}/traces", org.org_id, project.id);
    let next = listed.next_cursor.map(|cursor| {
        let mut link = form_urlencoded::Serializer::new(query.clone());
        link.append_pair("before", &cursor.encode());
        format!("{base}?{}", link.finish())
    });
    let l = org_layout(
        &viewer,
        &org,
        &format!("Traces of {}", project.name),
        "traces",
        &req,
    )
    .await?;
    let field = |v: &Option<String>| v.clone().unwrap_or_default();
    Ok(page(
        &req,
        &TracesPage {
            l,
            models: keel_core::traces::service::models_of_project(db, &project.id).await?,
            project_id: project.id.clone().into(),
            project_name: project.name,
            model: field(&filters.model),
            status: field(&filters.status),
            q: field(&filters.q),
            tag: field(&filters.tag),
            since: field(&filters.since),
            until: field(&filters.until),
            min_score: field(&filters.min_score),
            carried: filters
                .pairs()
                .into_iter()
                .map(|(n, v)| (format!("filter_{n}"), v))
                .collect(),
            total: format::count(i64::try_from(total).unwrap_or(i64::MAX)),
            matching_cap: (total > MATCHING_AT_ONCE).then(|| format::count(MATCHING_AT_ONCE as i64)),
            filter_query: query.clone(),
            first_page: before.as_ref().map(|_| format!("{base}?{query}")),
            traces: listed
                .traces
                .iter()
                .map(|l| trace_row(&l.trace, &l.marks))
                .collect(),
            next,
            retention_days: project
                .trace_retention_days
                .map(|d| d.to_string())
                .unwrap_or_default(),
            otlp_export: keel_core::traces::push::service::view(db, &project.id)
                .await?
                .map(|e| super::pages::OtlpExportRow {
                    endpoint: e.url,
                    header_names: e.header_names.join(", "),
                    last_exported_at: e.last_exported_at.map(format::time).unwrap_or_default(),
                    last_error: e.last_error.unwrap_or_default(),
                    last_error_at: e.last_error_at.map(format::time).unwrap_or_default(),
                    pending: format::count(i64::try_from(e.pending).unwrap_or(i64::MAX)),
                }),
        },
    ))
}

/// The traces a project form acts on: with `scope=matching`, the newest
/// [`MATCHING_AT_ONCE`] the form's filter keeps; else the ticked `traceIds`.
pub(super) async fn selected_traces(
    viewer: &Viewer,
    org: &OrgView,
    project: &entities::project::Model,
    form: &FormFields,
) -> Result<Vec<String>, ConsoleError> {
    match form.get("scope") {
        Some("matching") => {
            // Carried as `filter_<name>`: the form's own fields (an export's `since`, say)
            // keep their meaning.
            let (_, filter) = TraceFilters::read(|name| form.get(&format!("filter_{name}")))?;
            let ids = keel_core::traces::browse::ids_matching(
                &viewer.state.db,
                std::slice::from_ref(&org.org_id),
                &project.id,
                filter,
                MATCHING_AT_ONCE,
            )
            .await?;
            Ok(ids.into_iter().map(|id| id.to_string()).collect())
        }
        _ => Ok(form.all("traceIds").into_iter().map(str::to_owned).collect()),
    }
}

/// Downloads the selected traces (or the newest N) as JSON Lines: each line is a row the
/// API's export gives for the same selection.
pub async fn export(
    viewer: Viewer,
    path: web::Path<ProjectPath>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let form = FormFields::parse(&body);
    viewer.check_csrf(&form.csrf)?;
    let org = viewer.org(&path.org).await?;
    let project = project_of(&viewer, &org.org_id, &path.project).await?;
    let back = format!("/console/o/{}/projects/{}/traces", org.org_id, project.id);
    let orgs = std::slice::from_ref(&org.org_id);
    let format = form
        .get("format")
        .and_then(Format::parse)
        .unwrap_or(Format::Records);
    // The records as JSON lines, written as they are read.
    let mut body: Vec<u8> = Vec::new();
    let outcome = match form.get("newest") {
        Some(_) => {
            let limit = form.get("limit").unwrap_or("100");
            let query = form_urlencoded::Serializer::new(String::new())
                .append_pair("project_id", project.id.as_str())
                .append_pair("limit", limit)
                .append_pair("format", format.as_str())
                .finish();
            // Held to the export route's bounds, as the JSON API holds the same query.
            let pairs: Vec<(String, String)> = form_urlencoded::parse(query.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect();
            let bounds = crate::http::schemas::query_issues("get", "/api/traces/export", &pairs);
            let parsed = crate::http::extract::parse_query::<crate::traces::dto::ExportQuery>(&query)
                .and_then(|q| {
                    if bounds.is_empty() {
                        Ok(q)
                    } else {
                        Err(crate::error::ApiError::Validation(bounds))
                    }
                });
            match parsed {
                Ok(q) => {
                    let limit = q.limit.unwrap_or(crate::traces::MAX_EXPORT as i64) as u64;
                    let filter = TraceFilter::default();
                    keel_core::traces::service::export_project(
                        &viewer.state.db,
                        viewer.state.settings.traces.export_max_page_bytes,
                        orgs,
                        &project.id,
                        format,
                        limit,
                        filter,
                        None,
                        &mut body,
                        b"\n",
                    )
                    .await
                    .map(|page| page.count)
                    .map_err(crate::error::ApiError::from)
                }
                Err(err) => Err(err),
            }
        }
        None => match match form.get("scope") {
            Some("matching") => {
                let ids = selected_traces(&viewer, &org, &project, &form).await?;
                let json = serde_json::json!({"traceIds": ids}).to_string();
                crate::http::extract::parse_checked_body::<crate::traces::dto::TraceSelectionBody>(
                    json.as_bytes(),
                )
            }
            _ => form.plain_body::<crate::traces::dto::TraceSelectionBody>(),
        } {
            Ok(selection) => {
                let filter = TraceFilter::default();
                keel_core::traces::service::export_selection(
                    &viewer.state.db,
                    viewer.state.settings.traces.export_max_page_bytes,
                    orgs,
                    &selection.trace_ids,
                    format,
                    &filter,
                    &mut body,
                    b"\n",
                )
                .await
                .map(|s| s.stats.count)
                .map_err(crate::error::ApiError::from)
            }
            Err(err) => Err(err),
        },
    };
    match outcome {
        Ok(count) if count > 0 => body.push(b'\n'),
        Ok(_) => {}
        Err(err) => return after_form(&back, Err::<(), _>(err), |()| String::new()),
    }
    Ok(HttpResponse::Ok()
        .insert_header((header::CONTENT_TYPE, "application/x-ndjson"))
        .insert_header((
            header::CONTENT_DISPOSITION,
            format!(
                "attachment; filename=\"keel-traces-{}-{}.jsonl\"",
                project.id,
                format.as_str()
            ),
        ))
        .body(body))
}

#[derive(Deserialize)]
pub struct TracePath {
    org: String,
    trace: String,
}

/// A message's content as parts: text, images, tool calls.
fn parts_of(message: &Value) -> Vec<Part> {
    let mut parts = Vec::new();
    match message.get("content") {
        Some(Value::String(text)) => parts.push(Part {
            kind: "text",
            text: text.clone(),
        }),
        Some(Value::Array(items)) => {
            for item in items {
                let kind = item.get("type").and_then(Value::as_str).unwrap_or("");
                parts.push(match kind {
                    "text" => Part {
                        kind: "text",
                        text: item.get("text").and_then(Value::as_str).unwrap_or("").to_owned(),
                    },
                    "image_url" => Part {
                        kind: "image",
                        text: item
                            .pointer("/image_url/url")
                            .and_then(Value::as_str)
                            .map(|u| format::clip(u, 120))
                            .unwrap_or_default(),
                    },
                    _ => Part {
                        kind: "other",
                        text: format::clip(&item.to_string(), 2000),
                    },
                });
            }
        }
        _ => {}
    }
    for call in message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = call
            .pointer("/function/name")
            .and_then(Value::as_str)
            .unwrap_or("?");
        let args = call
            .pointer("/function/arguments")
            .and_then(Value::as_str)
            .unwrap_or("");
        parts.push(Part {
            kind: "tool_call",
            text: format!("{name}({})", format::pretty_json(args)),
        });
    }
    parts
}

fn message_of(message: &Value) -> Message {
    Message {
        role: message
            .get("role")
            .and_then(Value::as_str)
            .unwrap_or("assistant")
            .to_owned(),
        parts: parts_of(message),
    }
}

pub async fn trace(
    req: HttpRequest,
    viewer: Viewer,
    path: web::Path<TracePath>,
) -> Result<HttpResponse, ConsoleError> {
    let org = viewer.org(&path.org).await?;
    let id = keel_core::domain::TraceId::parse(&path.trace).map_err(|_| ConsoleError::NotFound)?;
    let (t, marks) = keel_core::traces::browse::get(&viewer.state.db, std::slice::from_ref(&org.org_id), &id)
        .await
        .map_err(|err| match err {
            keel_core::traces::TraceError::TraceNotFound => ConsoleError::NotFound,
            other => other.into(),
        })?;
    let request: Value = serde_json::from_str(&t.request).unwrap_or(Value::Null);
    let response: Value = t
        .response
        .as_deref()
        .and_then(|r| serde_json::from_str(r).ok())
        .unwrap_or(Value::Null);
    let conversation = request
        .get("messages")
        .and_then(Value::as_array)
        .map(|m| m.iter().map(message_of).collect())
        .unwrap_or_default();
    let reply = response
        .get("choices")
        .and_then(Value::as_array)
        .map(|choices| {
            choices
                .iter()
                .filter_map(|c| c.get("message").or_else(|| c.get("delta")))
                .map(message_of)
                .collect()
        })
        .unwrap_or_default();
    // Previous and next within the list it was opened from (its filter in the address).
    let pairs: Vec<(String, String)> = form_urlencoded::parse(req.query_string().as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect();
    let (filters, filter) =
        TraceFilters::read(|name| pairs.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str()))?;
    let query = filters.query();
    let (newer, older) = keel_core::traces::browse::neighbours(&viewer.state.db, &t, &filter).await?;
    let link = |id: Option<keel_core::domain::TraceId>| {
        id.map(|id| match query.is_empty() {
            true => format!("/console/o/{}/traces/{id}", org.org_id),
            false => format!("/console/o/{}/traces/{id}?{query}", org.org_id),
        })
    };
    let l = org_layout(&viewer, &org, &format!("Trace {}", t.id), "traces", &req).await?;
    Ok(page(
        &req,
        &TracePage {
            l,
            newer: link(newer),
            older: link(older),
            list: format!(
                "/console/o/{}/projects/{}/traces?{query}",
                org.org_id, t.project_id
            ),
            row: trace_row(&keel_core::traces::ListedTrace::of(&t), &marks),
            scores: marks
                .scores
                .iter()
                .map(|(name, score)| ScoreRow {
                    name: name.clone(),
                    value: score.value.to_string(),
                    comment: score.comment.clone().unwrap_or_default(),
                })
                .collect(),
            conversation,
            reply,
            request: format::pretty_json(&t.request),
            response: t.response.as_deref().map(format::pretty_json).unwrap_or_default(),
            error: t.error.clone(),
        },
    ))
}

fn eval_row(r: &entities::eval_run::Model) -> EvalRow {
    EvalRow {
        id: r.id.clone(),
        project: r.project_id.to_string(),
        suite: r.suite_name.clone(),
        model: r.model.clone().unwrap_or_default(),
        status: r.status.as_str().to_owned(),
        total: r.total_cases,
        passed: r.passed_cases,
        graded: r.graded_cases,
        errored: r.errored_cases,
        mean: r
            .mean_score
            .map(|m| format!("{m:.3}"))
            .unwrap_or_else(|| "—".into()),
        at: format::time(r.created_at),
    }
}

#[derive(Deserialize, Default)]
pub struct EvalsQuery {
    project: Option<String>,
    /// The last page's last run: the page goes on after it (older).
    before: Option<String>,
}

/// A page of runs (fetched one more, to tell whether another follows), and the link to the
/// next (older) page when there is one.
fn runs_page<T>(
    mut runs: Vec<T>,
    key: impl Fn(&T) -> (chrono::DateTime<chrono::Utc>, String),
    link: impl Fn(&str) -> String,
) -> (Vec<T>, Option<String>) {
    let more = runs.len() as u64 > RUNS_PAGE;
    runs.truncate(RUNS_PAGE as usize);
    let next = more.then(|| runs.last()).flatten().map(|last| {
        let (at, id) = key(last);
        link(&form_urlencoded::byte_serialize(text_cursor_of(at, &id).as_bytes()).collect::<String>())
    });
    (runs, next)
}

/// The link to the page after `before` of a runs list, narrowed to `project` when it is.
fn runs_link(org: &keel_core::domain::OrgId, page: &str, project: Option<&str>, before: &str) -> String {
    match project {
        Some(project) => format!(
            "/console/o/{org}/{page}?project={}&before={before}",
            form_urlencoded::byte_serialize(project.as_bytes()).collect::<String>()
        ),
        None => format!("/console/o/{org}/{page}?before={before}"),
    }
}

pub async fn evals(
    req: HttpRequest,
    viewer: Viewer,
    path: web::Path<String>,
    query: web::Query<EvalsQuery>,
) -> Result<HttpResponse, ConsoleError> {
    let org = viewer.org(&path).await?;
    let project = query.project.as_deref().filter(|p| !p.is_empty());
    let before = text_cursor(query.before.as_deref())?;
    let total = keel_core::evals::service::count_of_org(&viewer.state.db, &org.org_id, project).await?;
    let runs = keel_core::evals::service::runs_of_org(
        &viewer.state.db,
        &org.org_id,
        project,
        before.as_ref(),
        RUNS_PAGE + 1,
    )
    .await?;
    let (runs, next) = runs_page(
        runs,
        |r| (r.created_at, r.id.clone()),
        |before| runs_link(&org.org_id, "evals", project, before),
    );
    // Per suite, oldest first: pass rate (passed of graded, else of total) and mean score.
    let mut suites: std::collections::BTreeMap<&str, Vec<chart::RatePoint>> = Default::default();
    for r in runs.iter().rev() {
        let base = if r.graded_cases > 0 {
            r.graded_cases
        } else {
            r.total_cases
        };
        if base == 0 {
            continue;
        }
        suites.entry(&r.suite_name).or_default().push((
            format::time(r.created_at),
            f64::from(r.passed_cases) / f64::from(base),
            r.mean_score,
        ));
    }
    let charts = suites
        .into_iter()
        .map(|(suite, points)| {
            let last = points.last().map(|p| p.1 * 100.0).unwrap_or(0.0);
            SuiteChart {
                suite: suite.to_owned(),
                summary: format!("{} runs; latest pass rate {last:.1}%", points.len()),
                svg: chart::rate_lines(&points, &format!("{suite}: pass rate and mean score per run")),
            }
        })
        .collect();
    let l = org_layout(&viewer, &org, "Evals", "evals", &req).await?;
    Ok(page(
        &req,
        &EvalsPage {
            l,
            runs: runs.iter().map(eval_row).collect(),
            total: format::count(i64::try_from(total).unwrap_or(i64::MAX)),
            charts,
            next,
        },
    ))
}

#[derive(Deserialize)]
pub struct EvalPath {
    org: String,
    run: String,
}

#[derive(Deserialize, Default)]
pub struct CasesQuery {
    filter: Option<String>,
    after: Option<i32>,
}

pub async fn eval_run(
    req: HttpRequest,
    viewer: Viewer,
    path: web::Path<EvalPath>,
    query: web::Query<CasesQuery>,
) -> Result<HttpResponse, ConsoleError> {
    use keel_core::evals::CaseFilter;
    let org = viewer.org(&path.org).await?;
    let run = keel_core::evals::service::run_of_org(&viewer.state.db, &org.org_id, &path.run)
        .await?
        .ok_or(ConsoleError::NotFound)?;
    let (filter, name) = match query.filter.as_deref() {
        Some("failed") => (CaseFilter::Failed, "failed"),
        Some("errored") => (CaseFilter::Errored, "errored"),
        _ => (CaseFilter::All, ""),
    };
    let mut cases =
        keel_core::evals::service::cases(&viewer.state.db, &run.id, filter, query.after, CASES_PAGE + 1)
            .await?;
    let more = cases.len() as u64 > CASES_PAGE;
    cases.truncate(CASES_PAGE as usize);
    let next = more.then(|| cases.last()).flatten().map(|last| {
        format!(
            "/console/o/{}/evals/{}?filter={name}&after={}",
            org.org_id, run.id, last.position
        )
    });
    let text = |v: &Option<String>| v.as_deref().map(format::pretty_json).unwrap_or_default();
    let cases = cases
        .iter()
        .map(|c| CaseRow {
            position: c.position,
            case_id: c.case_id.clone().unwrap_or_default(),
            outcome: match (c.error.is_some(), c.success) {
                (true, _) => "errored",
                (false, Some(true)) => "passed",
                (false, Some(false)) => "failed",
                (false, None) => "ungraded",
            },
            score: c.score.map(|s| format!("{s:.3}")).unwrap_or_default(),
            input: text(&c.input),
            expected: text(&c.expected),
            actual: text(&c.actual),
            reason: c.reason.clone().unwrap_or_default(),
            error: c.error.clone().unwrap_or_default(),
        })
        .collect();
    let l = org_layout(
        &viewer,
        &org,
        &format!("Eval run {}", run.suite_name),
        "evals",
        &req,
    )
    .await?;
    Ok(page(
        &req,
        &EvalRunPage {
            l,
            run: eval_row(&run),
            filter: name.to_owned(),
            cases,
            next,
        },
    ))
}

pub async fn runs(
    req: HttpRequest,
    viewer: Viewer,
    path: web::Path<String>,
    query: web::Query<EvalsQuery>,
) -> Result<HttpResponse, ConsoleError> {
    let org = viewer.org(&path).await?;
    let project = query.project.as_deref().filter(|p| !p.is_empty());
    let db = &viewer.state.db;
    let before = text_cursor(query.before.as_deref())?;
    let total = keel_core::runs::service::count_of_org(db, &org.org_id, project).await?;
    let runs =
        keel_core::runs::service::runs_of_org(db, &org.org_id, project, before.as_ref(), RUNS_PAGE + 1)
            .await?;
    let (runs, next) = runs_page(
        runs,
        |r| (r.created_at, r.id.to_string()),
        |before| runs_link(&org.org_id, "runs", project, before),
    );
    let ids: Vec<keel_core::domain::RunId> = runs.iter().map(|r| r.id.clone()).collect();
    let mut checkpoints: std::collections::HashMap<keel_core::domain::RunId, Vec<(i64, String)>> =
        Default::default();
    for c in keel_core::runs::service::checkpoints_of_runs(db, &org.org_id, &ids).await? {
        checkpoints
            .entry(c.run_id)
            .or_default()
            .push((c.step, c.subfolder));
    }
    let rows = runs
        .into_iter()
        .map(|r| RunRow {
            checkpoints: checkpoints.remove(&r.id).unwrap_or_default(),
            name: r.name.unwrap_or_default(),
            project: r.project_id.into(),
            model: r.model.unwrap_or_default(),
            status: r.status,
            metrics: r
                .summary
                .or(r.metrics)
                .map(|m| format::clip(&format::pretty_json(&m), 600))
                .unwrap_or_default(),
            tracker: r
                .tracker_url
                .filter(|u| u.starts_with("https://") || u.starts_with("http://")),
            updated: format::time(r.updated_at),
            id: r.id.into(),
        })
        .collect();
    let l = org_layout(&viewer, &org, "Runs", "runs", &req).await?;
    Ok(page(
        &req,
        &RunsPage {
            l,
            runs: rows,
            total: format::count(i64::try_from(total).unwrap_or(i64::MAX)),
            next,
        },
    ))
}

/// A member's form about a project's traces: its fields, the organization, the project, and
/// the traces page it returns to.
async fn project_form(
    viewer: &Viewer,
    path: &ProjectPath,
    body: &[u8],
) -> Result<(FormFields, OrgView, entities::project::Model, String), ConsoleError> {
    let form = FormFields::parse(body);
    let org = viewer.act_in(&path.org, &form.csrf, false).await?;
    let project = project_of(viewer, &org.org_id, &path.project).await?;
    let back = format!("/console/o/{}/projects/{}/traces", org.org_id, project.id);
    Ok((form, org, project, back))
}

/// A member's form about one trace: its fields, the organization, the trace's id, and the
/// trace's page it returns to.
async fn trace_form(
    viewer: &Viewer,
    org: &str,
    trace: &str,
    body: &[u8],
) -> Result<(FormFields, OrgView, keel_core::domain::TraceId, String), ConsoleError> {
    let form = FormFields::parse(body);
    let org = viewer.act_in(org, &form.csrf, false).await?;
    let id = keel_core::domain::TraceId::parse(trace).map_err(|_| ConsoleError::NotFound)?;
    let back = format!("/console/o/{}/traces/{}", org.org_id, id);
    Ok((form, org, id, back))
}

/// Tags the selected traces of a project (any member): the form's tag added to each.
pub async fn tag_traces(
    viewer: Viewer,
    path: web::Path<ProjectPath>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let (form, org, project, back) = project_form(&viewer, &path, &body).await?;
    let ids = selected_traces(&viewer, &org, &project, &form).await?;
    // Held to the API's body: the same bounds, in one place.
    let json = serde_json::json!({
        "traceIds": ids,
        "add": form.get("bulkTag").map(|t| vec![t.trim()]).unwrap_or_default(),
    })
    .to_string();
    let outcome = async {
        let body =
            crate::http::extract::parse_checked_body::<crate::traces::dto::BulkTagsBody>(json.as_bytes())?;
        Ok::<_, ApiError>(
            keel_core::traces::marks::change_tags(
                &viewer.state.db,
                std::slice::from_ref(&org.org_id),
                &body.trace_ids,
                &body.add.unwrap_or_default(),
                &[],
            )
            .await?,
        )
    }
    .await;
    after_form(&back, outcome, |tagged| {
        format!("Tagged {} traces.", tagged.updated)
    })
}

/// A score's value as typed: a JSON number when it is a finite one, else the text as it is
/// (for the score body's own 422).
fn score_value(raw: Option<&str>) -> Option<serde_json::Value> {
    raw.map(|v| {
        v.trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .map_or_else(|| serde_json::Value::from(v), serde_json::Value::from)
    })
}

/// A score's name, refused (at `loc`) as the API refuses it unless it is a mark's name.
fn check_score_name(name: &str, loc: [&str; 2]) -> Result<(), ApiError> {
    match keel_core::traces::marks::is_name(name) {
        true => Ok(()),
        false => Err(ApiError::validation(
            vec![loc[0].into(), loc[1].into()],
            "string_pattern_mismatch",
            format!(
                "String should match pattern '{}'",
                keel_core::traces::marks::NAME_PATTERN
            ),
        )),
    }
}

/// Sets one score (`scoreName`, `scoreValue`) on the ticked traces, or on every trace the
/// filter keeps (`scope=matching`), held to the API's score body.
pub async fn score_traces(
    viewer: Viewer,
    path: web::Path<ProjectPath>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let (form, org, project, back) = project_form(&viewer, &path, &body).await?;
    let ids = selected_traces(&viewer, &org, &project, &form).await?;
    let name = form.get("scoreName").unwrap_or_default().trim().to_owned();
    let value = score_value(form.get("scoreValue"));
    let outcome = async {
        check_score_name(&name, ["body", "scoreName"])?;
        let selection = serde_json::json!({"traceIds": ids}).to_string();
        let selection = crate::http::extract::parse_checked_body::<crate::traces::dto::TraceSelectionBody>(
            selection.as_bytes(),
        )?;
        let json = serde_json::json!({"value": value}).to_string();
        let score =
            crate::http::extract::parse_checked_body::<crate::traces::dto::ScoreBody>(json.as_bytes())?;
        Ok::<_, ApiError>(
            keel_core::traces::marks::set_scores(
                &viewer.state.db,
                std::slice::from_ref(&org.org_id),
                &selection.trace_ids,
                &name,
                score.value,
                None,
            )
            .await?,
        )
    }
    .await;
    after_form(&back, outcome, |scored| {
        format!(
            "Scored {} traces ({name} = {}).",
            scored.updated,
            form.get("scoreValue").unwrap_or_default().trim()
        )
    })
}

/// Sets how long a project keeps its traces (any member; empty: forever). A retention that
/// would delete traces asks first, saying how many.
pub async fn set_retention(
    req: HttpRequest,
    viewer: Viewer,
    path: web::Path<ProjectPath>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let (form, org, project, back) = project_form(&viewer, &path, &body).await?;
    let json = serde_json::json!({
        "traceRetentionDays": form.number("retentionDays").unwrap_or(serde_json::Value::Null),
    })
    .to_string();
    let parsed =
        crate::http::extract::parse_checked_body::<crate::projects::dto::ProjectPatchBody>(json.as_bytes());
    if let (Ok(body), false) = (&parsed, form.confirmed()) {
        if let Some(days) = body.trace_retention_days.flatten() {
            let doomed = keel_core::traces::retention::traces_past_retention(
                &viewer.state.db,
                std::slice::from_ref(&org.org_id),
                &project.id,
                days,
            )
            .await
            .map_err(ApiError::from)?;
            if doomed > 0 {
                let title = "Delete the older traces?";
                return Ok(confirm_page(
                    org_layout(&viewer, &org, title, "traces", &req).await?,
                    Confirm {
                        title,
                        question: format!(
                            "Keeping traces {days} days deletes the {} trace{} of {} older than that at the next sweep; they cannot be brought back.",
                            format::count(i64::try_from(doomed).unwrap_or(i64::MAX)),
                            if doomed == 1 { "" } else { "s" },
                            project.name
                        ),
                        details: Vec::new(),
                        action: format!("/console/o/{}/projects/{}/retention", org.org_id, project.id),
                        button: "Keep fewer days",
                        back,
                    },
                    form.carried(),
                ));
            }
        }
    }
    let outcome = async {
        let body = parsed?;
        let change = keel_core::traces::settings::TraceSettingsChange {
            trace_retention_days: Some(body.trace_retention_days.flatten()),
            otlp_export: None,
        };
        Ok::<_, ApiError>(
            keel_core::traces::settings::change(
                &viewer.state.db,
                &viewer.state.push,
                std::slice::from_ref(&org.org_id),
                &project.id,
                change,
            )
            .await?
            .project,
        )
    }
    .await;
    after_form(&back, outcome, |project| match project.trace_retention_days {
        Some(days) => format!("Traces of this project are kept {days} days."),
        None => "Traces of this project are kept forever.".into(),
    })
}

/// Adds (`add`) or removes (`remove`) a tag of a trace (any member).
pub async fn trace_tags(
    viewer: Viewer,
    path: web::Path<TracePath>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let (form, org, id, back) = trace_form(&viewer, &path.org, &path.trace, &body).await?;
    let one = |name: &str| form.get(name).map(|t| vec![t.trim()]);
    let json = serde_json::json!({"add": one("add"), "remove": one("remove")}).to_string();
    let outcome = async {
        let body = crate::http::extract::parse_checked_body::<crate::traces::dto::TagsBody>(json.as_bytes())?;
        let tagged = keel_core::traces::marks::change_tags(
            &viewer.state.db,
            std::slice::from_ref(&org.org_id),
            std::slice::from_ref(&id),
            &body.add.unwrap_or_default(),
            &body.remove.unwrap_or_default(),
        )
        .await?;
        match tagged.updated {
            0 => Err(ApiError::from(keel_core::traces::TraceError::TraceNotFound)),
            _ => Ok(()),
        }
    }
    .await;
    after_form(&back, outcome, |()| "Tags saved.".into())
}

#[derive(Deserialize)]
pub struct ScorePath {
    org: String,
    trace: String,
    name: String,
}

/// Sets a score of a trace (any member): `name`, `value`, `comment`.
pub async fn set_score(
    viewer: Viewer,
    path: web::Path<TracePath>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let (form, org, id, back) = trace_form(&viewer, &path.org, &path.trace, &body).await?;
    let name = form.get("name").unwrap_or_default().trim().to_owned();
    let value = score_value(form.get("value"));
    let json = serde_json::json!({"value": value, "comment": form.get("comment")}).to_string();
    let outcome = async {
        check_score_name(&name, ["path", "name"])?;
        let body =
            crate::http::extract::parse_checked_body::<crate::traces::dto::ScoreBody>(json.as_bytes())?;
        keel_core::traces::marks::set_score(
            &viewer.state.db,
            std::slice::from_ref(&org.org_id),
            &id,
            &name,
            body.value,
            body.comment,
        )
        .await?;
        Ok::<(), ApiError>(())
    }
    .await;
    after_form(&back, outcome, |()| "Score saved.".into())
}

/// Deletes a score of a trace (any member).
pub async fn delete_score(
    viewer: Viewer,
    path: web::Path<ScorePath>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let (_form, org, id, back) = trace_form(&viewer, &path.org, &path.trace, &body).await?;
    let outcome = keel_core::traces::marks::delete_score(
        &viewer.state.db,
        std::slice::from_ref(&org.org_id),
        &id,
        &path.name,
    )
    .await;
    after_form(&back, outcome, |_| "Score deleted.".into())
}
