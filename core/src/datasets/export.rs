//! A version's lines as JSONL, streamed page by page (bounded memory, any size), with the
//! count and SHA-256 the version recorded for that format and split.

use futures_util::stream::{self, BoxStream, StreamExt};
use sea_orm::{DatabaseConnection, DbErr};

use super::lines::column_of;
use super::{repo, service, DatasetError, LineFormat, SplitPart};
use crate::domain::{DatasetId, OrgId};

/// Items read at a time.
const PAGE: u64 = 500;

/// An export about to stream.
pub struct Export {
    pub dataset_id: DatasetId,
    pub version: i32,
    pub format: LineFormat,
    pub part: SplitPart,
    /// Lines the body holds, and the SHA-256 (hex) of its bytes.
    pub lines: i64,
    pub sha256: String,
    pub body: BoxStream<'static, Result<Vec<u8>, DbErr>>,
}

/// The lines of `version` of a dataset of `orgs` (its latest when `None`), of `part`, in
/// `format`, after the first `offset` (a download resumed: `lines` and `sha256` are still
/// the whole part's).
#[allow(clippy::too_many_arguments)]
pub async fn export(
    db: &DatabaseConnection,
    orgs: &[OrgId],
    id: &DatasetId,
    version: Option<i32>,
    format: LineFormat,
    part: SplitPart,
    offset: u64,
    meter: crate::metrics::Metrics,
) -> Result<Export, DatasetError> {
    let dataset = service::get(db, orgs, id).await?;
    let chosen = match version {
        Some(v) => dataset.version(v),
        None => dataset.latest(),
    }
    .ok_or(DatasetError::VersionNotFound)?;
    let sha256 = chosen.digest(format, part).unwrap_or_default().to_owned();
    Ok(Export {
        dataset_id: id.clone(),
        version: chosen.version,
        format,
        part,
        lines: chosen.lines(part),
        sha256,
        body: stream_lines(
            db.clone(),
            id.clone(),
            chosen.version,
            format,
            part,
            offset,
            meter,
        ),
    })
}

/// The lines of the dataset version a job pinned, for the worker that holds the job while
/// it runs (`job_not_held` for any other, or none named).
pub async fn for_job(
    db: &DatabaseConnection,
    job_id: &crate::domain::JobId,
    worker_id: Option<&str>,
    format: LineFormat,
    part: SplitPart,
    offset: u64,
    meter: crate::metrics::Metrics,
) -> Result<Export, DatasetError> {
    use crate::domain::JobStatus;
    use sea_orm::EntityTrait;
    let job = entities::training_job::Entity::find_by_id(job_id.clone())
        .one(db)
        .await?
        .ok_or(DatasetError::JobNotFound)?;
    let running = matches!(job.status, JobStatus::Running | JobStatus::Stopping);
    if !running || worker_id.is_none() || job.worker_id.as_deref() != worker_id {
        return Err(DatasetError::JobNotHeld);
    }
    let (Some(id), Some(pinned)) = (job.dataset_id.as_ref(), job.dataset.as_deref()) else {
        return Err(DatasetError::DatasetNotFound);
    };
    let version = serde_json::from_str::<serde_json::Value>(pinned)
        .ok()
        .and_then(|p| p["version"].as_i64())
        .ok_or(DatasetError::VersionNotFound)? as i32;
    export(
        db,
        std::slice::from_ref(&job.org_id),
        id,
        Some(version),
        format,
        part,
        offset,
        meter,
    )
    .await
}

struct Walk {
    db: DatabaseConnection,
    id: DatasetId,
    version: i32,
    after: Option<i32>,
    /// Lines still to leave out (the first page's).
    skip: u64,
    done: bool,
}

fn stream_lines(
    db: DatabaseConnection,
    id: DatasetId,
    version: i32,
    format: LineFormat,
    part: SplitPart,
    skip: u64,
    meter: crate::metrics::Metrics,
) -> BoxStream<'static, Result<Vec<u8>, DbErr>> {
    let walk = Walk {
        db,
        id,
        version,
        after: None,
        skip,
        done: false,
    };
    stream::try_unfold(walk, move |mut walk| {
        let meter = meter.clone();
        async move {
            if walk.done {
                return Ok(None);
            }
            let lines = repo::page_lines(
                &walk.db,
                &walk.id,
                walk.version,
                part.validation(),
                walk.after,
                std::mem::take(&mut walk.skip),
                PAGE,
                column_of(format),
            )
            .await?;
            let Some((last, _)) = lines.last() else {
                return Ok(None);
            };
            walk.after = Some(*last);
            walk.done = (lines.len() as u64) < PAGE;
            let mut out = Vec::with_capacity(64 * 1024);
            for (_, line) in &lines {
                out.extend_from_slice(line.as_bytes());
                out.push(b'\n');
            }
            meter.dataset_exported(format.as_str(), lines.len() as u64, out.len() as u64);
            Ok(Some((out, walk)))
        }
    })
    .boxed()
}
