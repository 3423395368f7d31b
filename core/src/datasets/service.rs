//! Dataset flows: create (version 1), new versions, read, rename, delete, and the version a
//! job pins.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use entities::{dataset, dataset_item, dataset_line, dataset_version};
use sea_orm::{ConnectionTrait, DatabaseConnection, TransactionTrait};

use super::lines::{self, Hashers};
use super::{
    repo, Counts, Dataset, DatasetError, DatasetFilter, DatasetJob, DatasetPatch, Dedupe, LineFormat,
    NewDataset, Sha256s, Split, Version, VersionChange,
};
use crate::domain::{DatasetId, EventType, OrgId, ProjectId, TraceId};
use crate::orgs::repo::is_unique_violation;
use crate::webhooks::outbox::{self, Announcement};

/// Traces read at a time while a version is built.
const TRACE_PAGE: u64 = 200;
/// Lines read at a time while a version's digests are made.
const LINE_PAGE: usize = 500;

/// Makes a dataset of a project of `orgs` with its first version; 404 for another
/// organization's project (or one `new.org_id` does not own).
#[tracing::instrument(level = "debug", skip_all, fields(project_id = %new.project_id))]
pub async fn create(
    db: &DatabaseConnection,
    orgs: &[OrgId],
    new: NewDataset,
) -> Result<Dataset, DatasetError> {
    let project = crate::projects::repo::find_in_orgs(db, &new.project_id, orgs)
        .await?
        .filter(|p| new.org_id.as_ref().is_none_or(|org| *org == p.org_id))
        .ok_or(DatasetError::ProjectNotFound)?;
    if repo::find_by_name(db, &project.id, &new.name).await?.is_some() {
        return Err(DatasetError::NameTaken(new.name));
    }
    let now = Utc::now();
    let model = dataset::Model {
        id: DatasetId::generate(),
        org_id: project.org_id.clone(),
        project_id: project.id.clone(),
        name: new.name.clone(),
        description: new.description.clone(),
        split_validation: new.split.validation,
        split_seed: new.split.seed,
        dedupe: new.dedupe.as_str().to_owned(),
        latest_version: 1,
        created_at: now,
        updated_at: now,
    };
    let built = build(db, &model, &[], new.filter.as_ref(), &new.trace_ids, &[], true).await;
    let result = match built {
        Ok(built) => commit(db, model.clone(), built, None).await,
        Err(err) => Err(err),
    };
    if let Err(err) = result {
        // Lines taken for a dataset that did not come to be.
        if let Err(cleanup) = repo::delete_lines(db, &model.id).await {
            tracing::warn!(error = %cleanup, "the lines of a dataset not made were left");
        }
        return Err(match err {
            DatasetError::Database(db_err) if is_unique_violation(&db_err) => {
                DatasetError::NameTaken(new.name)
            }
            other => other,
        });
    }
    get(db, orgs, &model.id).await
}

/// A new version of a dataset of `orgs`: the latest one's selection changed by `change`.
#[tracing::instrument(level = "debug", skip_all, fields(dataset_id = %id))]
pub async fn new_version(
    db: &DatabaseConnection,
    orgs: &[OrgId],
    id: &DatasetId,
    change: VersionChange,
) -> Result<Dataset, DatasetError> {
    let current = get(db, orgs, id).await?;
    let latest = current.latest().cloned().ok_or(DatasetError::VersionNotFound)?;
    let previous = repo::selection(db, id, latest.version).await?;
    // No filter and no ids: the last filter a version ran, run again (a refresh).
    let filter = match (&change.filter, change.add.is_empty() && change.remove.is_empty()) {
        (Some(filter), _) => Some(filter.clone()),
        (None, true) => current.versions.iter().rev().find_map(|v| v.filter.clone()),
        (None, false) => None,
    };
    let built = build(
        db,
        &current.dataset,
        &previous,
        filter.as_ref(),
        &change.add,
        &change.remove,
        false,
    )
    .await?;
    let mut model = current.dataset.clone();
    model.latest_version = latest.version + 1;
    commit(db, model, built, Some(latest.version)).await?;
    get(db, orgs, id).await
}

/// What a build made: the version's row and its items.
struct Built {
    filter: Option<DatasetFilter>,
    items: Vec<(TraceId, bool)>,
    skipped: i64,
    digests: std::collections::BTreeMap<String, super::Digests>,
}

/// The selection of a version: `previous` with the filter's matches and `add`, less
/// `remove`; each trace's lines taken (once per dataset) as they are now; deduped, ordered
/// by the traces' time, split, and hashed. Listed ids must be traces of the project
/// (`strict`: all of them; otherwise those the dataset never took).
async fn build(
    db: &DatabaseConnection,
    dataset: &dataset::Model,
    previous: &[TraceId],
    filter: Option<&DatasetFilter>,
    add: &[TraceId],
    remove: &[TraceId],
    strict: bool,
) -> Result<Built, DatasetError> {
    let mut keys = repo::line_keys(db, &dataset.id).await?;
    let mut selected: HashSet<TraceId> = previous.iter().cloned().collect();
    if let Some(filter) = filter {
        let mut trace_filter = filter.to_trace_filter();
        loop {
            let page =
                crate::traces::repo::export_page(db, &dataset.project_id, &trace_filter, TRACE_PAGE).await?;
            let Some(last) = page.last() else {
                break;
            };
            trace_filter.before = Some((last.created_at, last.id.clone()));
            let done = (page.len() as u64) < TRACE_PAGE;
            take(db, dataset, page, &mut keys, &mut selected).await?;
            if done {
                break;
            }
        }
    }
    for chunk in add.chunks(LINE_PAGE) {
        let found: Vec<entities::trace::Model> = crate::traces::repo::by_ids(db, chunk)
            .await?
            .into_iter()
            .filter(|t| t.project_id == dataset.project_id)
            .collect();
        let known: HashSet<&TraceId> = found.iter().map(|t| &t.id).collect();
        let unknown: Vec<TraceId> = chunk
            .iter()
            .filter(|id| !known.contains(id) && (strict || !keys.contains_key(*id)))
            .take(10)
            .cloned()
            .collect();
        if !unknown.is_empty() {
            return Err(DatasetError::UnknownTraces(unknown));
        }
        // Ids the dataset took before, whose traces retention deleted since, stay frozen.
        selected.extend(chunk.iter().filter(|id| keys.contains_key(*id)).cloned());
        take(db, dataset, found, &mut keys, &mut selected).await?;
    }
    for id in remove {
        selected.remove(id);
    }
    let mut kept: Vec<(TraceId, DateTime<Utc>, &str)> = selected
        .iter()
        .filter_map(|id| keys.get(id).map(|(at, key)| (id.clone(), *at, key.as_str())))
        .collect();
    let mut skipped = (selected.len() - kept.len()) as i64;
    if Dedupe::parse(&dataset.dedupe) == Some(Dedupe::Prompt) {
        // The latest trace of each prompt.
        let mut latest: HashMap<&str, (DateTime<Utc>, TraceId)> = HashMap::new();
        for (id, at, key) in &kept {
            let entry = latest.entry(key).or_insert((*at, id.clone()));
            if (*at, id) > (entry.0, &entry.1) {
                *entry = (*at, id.clone());
            }
        }
        let before = kept.len();
        kept.retain(|(id, _, key)| latest.get(key).is_some_and(|(_, keep)| keep == id));
        skipped += (before - kept.len()) as i64;
    }
    kept.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
    let split = Split {
        validation: dataset.split_validation,
        seed: dataset.split_seed,
    };
    let items: Vec<(TraceId, bool)> = kept
        .into_iter()
        .map(|(id, _, _)| {
            let validation = split.is_validation(&id);
            (id, validation)
        })
        .collect();
    let mut hashers = Hashers::default();
    for chunk in items.chunks(LINE_PAGE) {
        let ids: Vec<TraceId> = chunk.iter().map(|(id, _)| id.clone()).collect();
        let mut by_id: HashMap<TraceId, dataset_line::Model> = repo::lines(db, &dataset.id, &ids)
            .await?
            .into_iter()
            .map(|line| (line.trace_id.clone(), line))
            .collect();
        for (id, validation) in chunk {
            let line = by_id
                .remove(id)
                .ok_or_else(|| sea_orm::DbErr::RecordNotFound(format!("the dataset's line of trace {id}")))?;
            for format in LineFormat::ALL {
                hashers.add(format, lines::line_of(&line, format), *validation);
            }
        }
    }
    Ok(Built {
        filter: filter.cloned(),
        items,
        skipped,
        digests: hashers.finish(),
    })
}

/// Takes the lines of `traces` the dataset has not taken yet, and selects them.
async fn take(
    db: &impl ConnectionTrait,
    dataset: &dataset::Model,
    traces: Vec<entities::trace::Model>,
    keys: &mut HashMap<TraceId, (DateTime<Utc>, String)>,
    selected: &mut HashSet<TraceId>,
) -> Result<(), DatasetError> {
    let mut new_lines = Vec::new();
    for trace in traces {
        selected.insert(trace.id.clone());
        if keys.contains_key(&trace.id) {
            continue;
        }
        // A trace the formats cannot take stays selected without lines: counted as skipped.
        if let Some(made) = lines::of(&trace) {
            {
                keys.insert(trace.id.clone(), (trace.created_at, made.prompt_key.clone()));
                new_lines.push(dataset_line::Model {
                    dataset_id: dataset.id.clone(),
                    trace_id: trace.id,
                    project_id: dataset.project_id.clone(),
                    trace_created_at: trace.created_at,
                    prompt_key: made.prompt_key,
                    chat: made.chat,
                    record: made.record,
                    prompt: made.prompt,
                });
            }
        }
    }
    repo::insert_lines(db, new_lines).await?;
    Ok(())
}

/// Writes the version (and, for a new dataset, the dataset) and its event, in one
/// transaction. `from`: the version it follows (guarded: a version made meanwhile is 409).
async fn commit(
    db: &DatabaseConnection,
    model: dataset::Model,
    built: Built,
    from: Option<i32>,
) -> Result<(), DatasetError> {
    let version = model.latest_version;
    let now = Utc::now();
    let train = built.items.iter().filter(|(_, v)| !v).count() as i64;
    let row = dataset_version::Model {
        dataset_id: model.id.clone(),
        version,
        filter: built
            .filter
            .as_ref()
            .map(|f| serde_json::to_string(f).unwrap_or_default()),
        train_lines: train,
        validation_lines: built.items.len() as i64 - train,
        skipped: built.skipped,
        digests: serde_json::to_string(&built.digests).unwrap_or_default(),
        created_at: now,
    };
    let items: Vec<dataset_item::Model> = built
        .items
        .into_iter()
        .enumerate()
        .map(|(ordinal, (trace_id, validation))| dataset_item::Model {
            dataset_id: model.id.clone(),
            version,
            ordinal: ordinal as i32,
            trace_id,
            validation,
        })
        .collect();
    let view = version_of(&row);
    let txn = db.begin().await?;
    match from {
        None => repo::insert_dataset(&txn, model.clone()).await?,
        Some(from) => {
            if !repo::bump_version(&txn, &model.id, from).await? {
                return Err(DatasetError::Concurrent);
            }
        }
    }
    repo::insert_version(&txn, row, items).await?;
    outbox::emit(
        &txn,
        vec![Announcement {
            org_id: model.org_id.clone(),
            event_type: EventType::DatasetVersionCreated,
            data: super::version_event(&model, &view),
        }],
    )
    .await?;
    txn.commit().await?;
    Ok(())
}

/// A version's view from its row.
fn version_of(row: &dataset_version::Model) -> Version {
    let digests: std::collections::BTreeMap<String, super::Digests> =
        serde_json::from_str(&row.digests).unwrap_or_default();
    let chat = digests.get(LineFormat::OpenaiChat.as_str());
    Version {
        version: row.version,
        created_at: row.created_at,
        filter: row.filter.as_deref().and_then(|f| serde_json::from_str(f).ok()),
        counts: Counts {
            train: row.train_lines,
            validation: row.validation_lines,
        },
        skipped: row.skipped,
        sha256: Sha256s {
            train: chat.map(|d| d.train.clone()).unwrap_or_default(),
            validation: chat.map(|d| d.validation.clone()).unwrap_or_default(),
        },
        digests,
    }
}

/// The datasets' views, in the order given.
async fn views(db: &impl ConnectionTrait, models: Vec<dataset::Model>) -> Result<Vec<Dataset>, DatasetError> {
    let ids: Vec<DatasetId> = models.iter().map(|d| d.id.clone()).collect();
    let mut versions: HashMap<DatasetId, Vec<Version>> = HashMap::new();
    for row in repo::versions_of(db, &ids).await? {
        versions
            .entry(row.dataset_id.clone())
            .or_default()
            .push(version_of(&row));
    }
    let mut jobs: HashMap<DatasetId, Vec<DatasetJob>> = HashMap::new();
    for job in repo::jobs_of(db, &ids).await? {
        let Some(dataset_id) = job.dataset_id.clone() else {
            continue;
        };
        let version = job
            .dataset
            .as_deref()
            .and_then(|d| serde_json::from_str::<serde_json::Value>(d).ok())
            .and_then(|d| d["version"].as_i64())
            .unwrap_or_default() as i32;
        jobs.entry(dataset_id).or_default().push(DatasetJob {
            job_id: job.id,
            version,
            status: job.status,
            action: job.action,
            created_at: job.created_at,
        });
    }
    Ok(models
        .into_iter()
        .map(|dataset| Dataset {
            versions: versions.remove(&dataset.id).unwrap_or_default(),
            jobs: jobs.remove(&dataset.id).unwrap_or_default(),
            dataset,
        })
        .collect())
}

/// A dataset of `orgs` (404 for another organization's).
pub async fn get(db: &impl ConnectionTrait, orgs: &[OrgId], id: &DatasetId) -> Result<Dataset, DatasetError> {
    let model = repo::find(db, id)
        .await?
        .filter(|d| orgs.contains(&d.org_id))
        .ok_or(DatasetError::DatasetNotFound)?;
    views(db, vec![model])
        .await?
        .pop()
        .ok_or(DatasetError::DatasetNotFound)
}

/// The datasets of a project of `orgs`, newest first.
pub async fn list(
    db: &impl ConnectionTrait,
    orgs: &[OrgId],
    project_id: &ProjectId,
) -> Result<Vec<Dataset>, DatasetError> {
    crate::projects::repo::find_in_orgs(db, project_id, orgs)
        .await?
        .ok_or(DatasetError::ProjectNotFound)?;
    views(db, repo::of_project(db, project_id).await?).await
}

/// Renames a dataset or changes its description.
pub async fn update(
    db: &DatabaseConnection,
    orgs: &[OrgId],
    id: &DatasetId,
    patch: DatasetPatch,
) -> Result<Dataset, DatasetError> {
    let current = get(db, orgs, id).await?;
    if let Some(name) = &patch.name {
        if let Some(other) = repo::find_by_name(db, &current.dataset.project_id, name).await? {
            if other.id != *id {
                return Err(DatasetError::NameTaken(name.clone()));
            }
        }
    }
    match repo::update(db, current.dataset, patch.name.clone(), patch.description).await {
        Err(err) if is_unique_violation(&err) => {
            return Err(DatasetError::NameTaken(patch.name.unwrap_or_default()))
        }
        other => other?,
    };
    get(db, orgs, id).await
}

/// Deletes a dataset that no job not over trains on (409 otherwise).
pub async fn delete(db: &DatabaseConnection, orgs: &[OrgId], id: &DatasetId) -> Result<(), DatasetError> {
    get(db, orgs, id).await?;
    let txn = db.begin().await?;
    if let Some(job) = repo::open_job(&txn, id).await? {
        return Err(DatasetError::InUse(job));
    }
    repo::delete(&txn, id).await?;
    txn.commit().await?;
    Ok(())
}

/// The version a job of `org_id` pins: `version`, or the latest (404 for another
/// organization's dataset or a version it does not have).
pub async fn pin(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    id: &DatasetId,
    version: Option<i32>,
) -> Result<serde_json::Value, DatasetError> {
    repo::find(db, id)
        .await?
        .filter(|d| d.org_id == *org_id)
        .ok_or(DatasetError::DatasetNotFound)?;
    let row = repo::version_one(db, id, version)
        .await?
        .ok_or(DatasetError::VersionNotFound)?;
    Ok(version_of(&row).pinned(id))
}

/// A line of a version as a page of its traces lists it.
#[derive(Debug, Clone)]
pub struct VersionItem {
    pub ordinal: i32,
    pub trace_id: crate::domain::TraceId,
    pub validation: bool,
    /// The `openai-chat` line as the version keeps it (not the trace: it may be gone).
    pub chat: String,
    /// The trace is still kept (retention may have deleted it since).
    pub trace_kept: bool,
}

/// `limit` lines of version `version` of `dataset` (as [`get`] read it for its caller) after
/// the ordinal `after`, in the version's order, and whether more follow.
pub async fn version_items(
    db: &impl ConnectionTrait,
    dataset: &Dataset,
    version: i32,
    after: Option<i32>,
    limit: u64,
) -> Result<(Vec<VersionItem>, bool), DatasetError> {
    dataset.version(version).ok_or(DatasetError::VersionNotFound)?;
    let id = &dataset.dataset.id;
    let mut items = repo::items_page(db, id, version, None, after, limit + 1).await?;
    let more = items.len() as u64 > limit;
    items.truncate(limit as usize);
    let ids: Vec<crate::domain::TraceId> = items.iter().map(|i| i.trace_id.clone()).collect();
    let mut chats: std::collections::HashMap<_, _> = repo::lines(db, id, &ids)
        .await?
        .into_iter()
        .map(|l| (l.trace_id, l.chat))
        .collect();
    let kept = repo::traces_kept(db, &ids).await?;
    Ok((
        items
            .into_iter()
            .map(|item| VersionItem {
                ordinal: item.ordinal,
                chat: chats.remove(&item.trace_id).unwrap_or_default(),
                trace_kept: kept.contains(&item.trace_id),
                trace_id: item.trace_id,
                validation: item.validation,
            })
            .collect(),
        more,
    ))
}
