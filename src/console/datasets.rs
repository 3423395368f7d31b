//! A project's datasets in the console: "Save as dataset" from the traces page (its filter,
//! or the ticked rows), the datasets page (versions, counts, digests, the jobs that trained
//! on each, downloads per split, a new version from the filter), and a version's page (its
//! traces, paged). Every action goes through the same service and body as the JSON API.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;

use super::org::org_layout;
use super::pages::{
    DatasetRow, DatasetVersionPage, DatasetVersionRow, DatasetsPage, VersionItemRow, VersionJobRow,
};
use super::session::{OrgView, Viewer};
use super::trace_filter::TraceFilters;
use super::work::{project_of, selected_traces, ProjectPath};
use super::{after_form, format, page, ConsoleError, FormFields};
use crate::datasets::dto::DatasetCreateBody;
use crate::error::ApiError;
use keel_core::datasets::{export, service, DatasetError, LineFormat, SplitPart, VersionChange};
use keel_core::domain::{DatasetId, OrgId};

/// Traces a version's page lists at a time.
const ITEMS_PAGE: u64 = 50;

#[derive(Deserialize)]
pub struct DatasetPath {
    org: String,
    dataset: String,
}

#[derive(Deserialize)]
pub struct VersionPath {
    org: String,
    dataset: String,
    version: i32,
}

#[derive(Deserialize)]
pub struct ItemsQuery {
    /// The last ordinal of the previous page.
    after: Option<i32>,
}

#[derive(Deserialize)]
pub struct DownloadQuery {
    split: Option<String>,
    format: Option<String>,
}

fn orgs(org: &OrgView) -> &[OrgId] {
    std::slice::from_ref(&org.org_id)
}

fn dataset_id(raw: &str) -> Result<DatasetId, ConsoleError> {
    DatasetId::parse(raw).map_err(|_| ConsoleError::NotFound)
}

/// A dataset of another organization, or a version it does not have, is the console's 404.
fn not_found(err: DatasetError) -> ConsoleError {
    match err {
        DatasetError::DatasetNotFound | DatasetError::VersionNotFound | DatasetError::ProjectNotFound => {
            ConsoleError::NotFound
        }
        err => ApiError::from(err).into(),
    }
}

/// The API's dataset body for what the traces page's form asked: the filter it carries
/// (`scope=matching`) or the ticked rows, a name, a validation share and dedupe.
async fn create_body(
    viewer: &Viewer,
    org: &OrgView,
    project: &entities::project::Model,
    form: &FormFields,
) -> Result<String, ConsoleError> {
    let mut body = serde_json::json!({
        "projectId": project.id,
        "name": form.get("datasetName").unwrap_or_default(),
        "dedupe": if form.get("dedupe") == Some("prompt") { "prompt" } else { "none" },
    });
    if let Some(share) = form.get("validation").map(str::trim).filter(|v| !v.is_empty()) {
        // As typed: a share the body refuses is its 422, said on the page.
        body["split"] = serde_json::json!({"validation": share.parse::<f64>().map_or_else(
            |_| serde_json::Value::from(share),
            serde_json::Value::from,
        )});
    }
    match form.get("scope") {
        Some("matching") => {
            // The filter itself, so that a new version runs it again (not its matches today).
            let (filters, read) = TraceFilters::read(|name| form.get(&format!("filter_{name}")))?;
            let mut filter = serde_json::Map::new();
            for (name, value) in [
                ("q", &filters.q),
                ("model", &filters.model),
                ("status", &filters.status),
                ("tag", &filters.tag),
                ("minScore", &filters.min_score),
            ] {
                if let Some(value) = value {
                    filter.insert(name.into(), value.clone().into());
                }
            }
            for (name, at) in [("since", read.since), ("until", read.until)] {
                if let Some(at) = at {
                    filter.insert(name.into(), at.to_rfc3339().into());
                }
            }
            body["filter"] = filter.into();
        }
        _ => body["traceIds"] = selected_traces(viewer, org, project, form).await?.into(),
    }
    Ok(body.to_string())
}

/// Saves the traces page's filter (or its ticked rows) as a new dataset (any member), then
/// shows the project's datasets.
pub async fn save(
    viewer: Viewer,
    path: web::Path<ProjectPath>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let form = FormFields::parse(&body);
    let org = viewer.act_in(&path.org, &form.csrf, false).await?;
    let project = project_of(&viewer, &org.org_id, &path.project).await?;
    let json = create_body(&viewer, &org, &project, &form).await?;
    let outcome = async {
        let body = crate::http::extract::parse_checked_body::<DatasetCreateBody>(json.as_bytes())?;
        Ok::<_, ApiError>(service::create(&viewer.state.db, orgs(&org), body.into_core()).await?)
    }
    .await;
    let to = match &outcome {
        Ok(_) => format!("/console/o/{}/projects/{}/datasets", org.org_id, project.id),
        Err(_) => format!("/console/o/{}/projects/{}/traces", org.org_id, project.id),
    };
    after_form(&to, outcome, |dataset| {
        let (train, validation) = dataset
            .latest()
            .map_or((0, 0), |v| (v.counts.train, v.counts.validation));
        format!(
            "Saved dataset {}: version 1 has {} training and {} validation lines.",
            dataset.dataset.name,
            format::count(train),
            format::count(validation)
        )
    })
}

/// A project's datasets, newest first.
pub async fn list(
    req: HttpRequest,
    viewer: Viewer,
    path: web::Path<ProjectPath>,
) -> Result<HttpResponse, ConsoleError> {
    let org = viewer.org(&path.org).await?;
    let project = project_of(&viewer, &org.org_id, &path.project).await?;
    let datasets = service::list(&viewer.state.db, orgs(&org), &project.id)
        .await
        .map_err(not_found)?;
    let l = org_layout(
        &viewer,
        &org,
        &format!("Datasets of {}", project.name),
        "traces",
        &req,
    )
    .await?;
    let base = format!("/console/o/{}/datasets", org.org_id);
    let rows = datasets
        .into_iter()
        .map(|d| {
            let id = d.dataset.id.to_string();
            DatasetRow {
                versions: d
                    .versions
                    .iter()
                    .rev()
                    .map(|v| DatasetVersionRow {
                        version: v.version,
                        created: format::time(v.created_at),
                        train: format::count(v.counts.train),
                        validation: format::count(v.counts.validation),
                        skipped: format::count(v.skipped),
                        sha_train: v.sha256.train.clone(),
                        sha_validation: v.sha256.validation.clone(),
                        link: format!("{base}/{id}/versions/{}", v.version),
                        jobs: d
                            .jobs
                            .iter()
                            .filter(|j| j.version == v.version)
                            .map(|j| VersionJobRow {
                                link: format!("/console/o/{}/jobs/{}", org.org_id, j.job_id),
                                id: j.job_id.to_string(),
                                action: j.action.to_string(),
                                status: j.status.as_str(),
                            })
                            .collect(),
                    })
                    .collect(),
                refreshable: d.versions.iter().any(|v| v.filter.is_some()),
                name: d.dataset.name,
                description: d.dataset.description.unwrap_or_default(),
                created: format::time(d.dataset.created_at),
                id,
            }
        })
        .collect();
    Ok(page(
        &req,
        &DatasetsPage {
            l,
            project_id: project.id.to_string(),
            project_name: project.name,
            can_act: org.can_act(),
            datasets: rows,
        },
    ))
}

/// A new version of a dataset (any member): the last filter run again over the latest
/// version's selection.
pub async fn refresh(
    viewer: Viewer,
    path: web::Path<DatasetPath>,
    body: web::Bytes,
) -> Result<HttpResponse, ConsoleError> {
    let form = FormFields::parse(&body);
    let org = viewer.act_in(&path.org, &form.csrf, false).await?;
    let id = dataset_id(&path.dataset)?;
    let current = service::get(&viewer.state.db, orgs(&org), &id)
        .await
        .map_err(not_found)?;
    let to = format!(
        "/console/o/{}/projects/{}/datasets",
        org.org_id, current.dataset.project_id
    );
    let outcome = service::new_version(&viewer.state.db, orgs(&org), &id, VersionChange::default()).await;
    after_form(&to, outcome, |dataset| match dataset.latest() {
        Some(v) => format!(
            "Made version {} of {}: {} training and {} validation lines.",
            v.version,
            dataset.dataset.name,
            format::count(v.counts.train),
            format::count(v.counts.validation)
        ),
        None => format!("Made a version of {}.", dataset.dataset.name),
    })
}

/// A version's traces, in its order, a page at a time, each with its side of the split and
/// the question and answer its line keeps.
pub async fn version(
    req: HttpRequest,
    viewer: Viewer,
    path: web::Path<VersionPath>,
    query: web::Query<ItemsQuery>,
) -> Result<HttpResponse, ConsoleError> {
    let org = viewer.org(&path.org).await?;
    let id = dataset_id(&path.dataset)?;
    let db = &viewer.state.db;
    let dataset = service::get(db, orgs(&org), &id).await.map_err(not_found)?;
    let version = dataset
        .version(path.version)
        .cloned()
        .ok_or(ConsoleError::NotFound)?;
    let (items, more) = service::version_items(db, &dataset, path.version, query.after, ITEMS_PAGE)
        .await
        .map_err(not_found)?;
    let base = format!(
        "/console/o/{}/datasets/{id}/versions/{}",
        org.org_id, path.version
    );
    let older = match (more, items.last()) {
        (true, Some(last)) => Some(format!("{base}?after={}", last.ordinal)),
        _ => None,
    };
    let title = format!("{} version {}", dataset.dataset.name, path.version);
    let l = org_layout(&viewer, &org, &title, "traces", &req).await?;
    let rows = items
        .into_iter()
        .map(|item| {
            let (question, answer) = question_and_answer(&item.chat);
            VersionItemRow {
                place: format::count(i64::from(item.ordinal) + 1),
                split: if item.validation { "validation" } else { "train" },
                link: item
                    .trace_kept
                    .then(|| format!("/console/o/{}/traces/{}", org.org_id, item.trace_id)),
                trace_id: item.trace_id.to_string(),
                question,
                answer,
            }
        })
        .collect();
    Ok(page(
        &req,
        &DatasetVersionPage {
            l,
            dataset_id: id.to_string(),
            name: dataset.dataset.name,
            project_id: dataset.dataset.project_id.to_string(),
            version: version.version,
            created: format::time(version.created_at),
            train: format::count(version.counts.train),
            validation: format::count(version.counts.validation),
            sha_train: version.sha256.train,
            sha_validation: version.sha256.validation,
            filter: version
                .filter
                .as_ref()
                .and_then(|f| serde_json::to_string(f).ok())
                .unwrap_or_default(),
            first_page: query.after.map(|_| base.clone()),
            items: rows,
            older,
        },
    ))
}

/// Characters of a line's question and answer a version's page shows.
const PREVIEW: usize = 160;

/// The last user message and the reply of an `openai-chat` line, shortened.
fn question_and_answer(chat: &str) -> (String, String) {
    let line: serde_json::Value = serde_json::from_str(chat).unwrap_or_default();
    let messages = line["messages"].as_array().map(Vec::as_slice).unwrap_or_default();
    let text = |m: Option<&serde_json::Value>| {
        let content = m.map(|m| &m["content"]);
        let text = match content {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Null) | None => m
                .filter(|m| m.get("tool_calls").is_some())
                .map(|_| "(tool calls)".to_owned())
                .unwrap_or_default(),
            Some(other) => other.to_string(),
        };
        format::clip(&text, PREVIEW)
    };
    let question = messages.iter().rev().find(|m| m["role"] == "user");
    (text(question), text(messages.last()))
}

/// A version's lines of one split as a JSONL download (`openai-chat` unless asked), the same
/// bytes as the API's export.
pub async fn download(
    viewer: Viewer,
    path: web::Path<VersionPath>,
    query: web::Query<DownloadQuery>,
) -> Result<HttpResponse, ConsoleError> {
    let org = viewer.org(&path.org).await?;
    let id = dataset_id(&path.dataset)?;
    let part = match query.split.as_deref() {
        None => SplitPart::All,
        Some(raw) => SplitPart::parse(raw)
            .ok_or_else(|| super::unknown_choice("split", raw, SplitPart::NAMES.iter().copied()))?,
    };
    let format = match query.format.as_deref() {
        None => LineFormat::OpenaiChat,
        Some(raw) => LineFormat::parse(raw)
            .ok_or_else(|| super::unknown_choice("format", raw, LineFormat::NAMES.iter().copied()))?,
    };
    let state = &viewer.state;
    let export = export::export(
        &state.db,
        orgs(&org),
        &id,
        Some(path.version),
        format,
        part,
        0,
        state.metrics.clone(),
    )
    .await
    .map_err(not_found)?;
    Ok(crate::datasets::routes::streamed(export))
}
