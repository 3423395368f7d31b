//! New jobs: one at a time, in batches, with unique and idempotency keys.

use entities::training_job;
use sea_orm::{EntityTrait, QueryFilter, TransactionSession, TransactionTrait};

use super::*;
use crate::domain::ProjectId;

#[derive(Clone)]
pub struct NewJob {
    pub org_id: OrgId,
    pub project_id: ProjectId,
    pub training_task_id: Option<String>,
    pub action: JobAction,
    pub payload: serde_json::Value,
    /// 0 (most urgent) to 9.
    pub priority: i32,
    /// A time in the future makes the job `scheduled` until then.
    pub run_at: Option<DateTime<Utc>>,
    /// While this job is not terminal, its organization's creates with the same key answer it.
    pub unique_key: Option<String>,
    /// The `Idempotency-Key` it was submitted with, and the SHA-256 (hex) of its body.
    pub idempotency: Option<(String, String)>,
    /// The dataset it trains on (its version pinned at create).
    pub dataset: Option<JobDataset>,
    /// The cron schedule that enqueues it, and the tick (none for a "run now").
    pub schedule: Option<(crate::domain::ScheduleId, Option<DateTime<Utc>>)>,
}

/// A job's dataset: the one named, and the version's view once pinned.
#[derive(Clone, Debug)]
pub struct JobDataset {
    pub id: crate::domain::DatasetId,
    /// `None`: the latest.
    pub version: Option<i32>,
    /// `{datasetId, version, counts, sha256}`, set by the create flow.
    pub pinned: Option<serde_json::Value>,
}

/// The priority of a job created without one.
pub const DEFAULT_PRIORITY: i32 = 5;

fn queued_job(job: NewJob, now: DateTime<Utc>) -> training_job::Model {
    let scheduled_at = job.run_at.filter(|at| *at > now);
    let (dataset_id, dataset) = match job.dataset {
        Some(d) => (Some(d.id), d.pinned.map(|p| p.to_string())),
        None => (None, None),
    };
    let (schedule_id, schedule_tick) = match job.schedule {
        Some((id, tick)) => (Some(id), tick),
        None => (None, None),
    };
    training_job::Model {
        id: JobId::generate(),
        schedule_id,
        schedule_tick,
        org_id: job.org_id,
        project_id: job.project_id,
        training_task_id: job.training_task_id,
        action: job.action,
        status: match scheduled_at {
            Some(_) => JobEvent::Schedule,
            None => JobEvent::Create,
        }
        .to()
        .unwrap_or(JobStatus::Queued),
        priority: job.priority,
        queued_at: match scheduled_at {
            Some(_) => None,
            None => Some(now),
        },
        scheduled_at,
        unique_key: job.unique_key,
        idempotency_key: job.idempotency.as_ref().map(|(key, _)| key.clone()),
        request_hash: job.idempotency.map(|(_, hash)| hash),
        blocked_for_funds: false,
        refusals: 0,
        stop_reason: None,
        dataset_id,
        dataset,
        payload: job.payload.to_string(),
        worker_id: None,
        attempts: 0,
        stop_requested: false,
        live_status: None,
        result: None,
        error: None,
        created_at: now,
        updated_at: now,
        claimed_at: None,
        heartbeat_at: None,
        finished_at: None,
    }
}

/// Queues `jobs` in one statement (one commit for all), in order. If that fails (say one
/// job's project was deleted meanwhile), each is inserted on its own, so only the failing
/// job fails.
pub async fn insert_jobs(
    db: &impl ConnectionTrait,
    jobs: Vec<NewJob>,
) -> Vec<Result<training_job::Model, DbErr>> {
    // One clock reading per batch; the id breaks ties, so claim order stays total.
    let now = Utc::now();
    let models: Vec<training_job::Model> = jobs.into_iter().map(|job| queued_job(job, now)).collect();
    let rows = models.iter().map(|m| training_job::ActiveModel::from(m.clone()));
    match training_job::Entity::insert_many(rows)
        .exec_without_returning(db)
        .await
    {
        Ok(_) => models.into_iter().map(Ok).collect(),
        Err(err) if models.len() == 1 => vec![Err(err)],
        Err(_) => {
            let mut results = Vec::with_capacity(models.len());
            for model in models {
                let row = training_job::ActiveModel::from(model.clone());
                results.push(
                    training_job::Entity::insert(row)
                        .exec_without_returning(db)
                        .await
                        .map(|_| model),
                );
            }
            results
        }
    }
}

/// What a create with a unique key or an idempotency key made of it.
pub enum Inserted {
    New(training_job::Model),
    /// An open job of the organization already has the unique key: no new one.
    Unique(training_job::Model),
    /// The job first created with this idempotency key and the same body.
    Replayed(training_job::Model),
    /// The idempotency key came with another body.
    KeyReused,
}

/// The statuses a job with a unique key holds it in (the unique index's condition).
const OPEN: [JobStatus; 4] = [
    JobStatus::Queued,
    JobStatus::Scheduled,
    JobStatus::Running,
    JobStatus::Stopping,
];

/// Creates a job with a unique key or an idempotency key. The database's unique indexes
/// decide between instances: the insert does nothing on a conflict, then the job it
/// conflicted with is read. (If that one ended in between, the insert is tried again.)
pub async fn insert_keyed(db: &impl ConnectionTrait, job: NewJob) -> Result<Inserted, DbErr> {
    for _ in 0..3 {
        let model = queued_job(job.clone(), Utc::now());
        let inserted = training_job::Entity::insert(training_job::ActiveModel::from(model.clone()))
            .on_conflict(OnConflict::new().do_nothing().to_owned())
            .exec_without_returning(db)
            .await?;
        if inserted > 0 {
            return Ok(Inserted::New(model));
        }
        if let Some((key, hash)) = &job.idempotency {
            let first = training_job::Entity::find()
                .filter(training_job::Column::OrgId.eq(&job.org_id))
                .filter(training_job::Column::IdempotencyKey.eq(key.as_str()))
                .one(db)
                .await?;
            if let Some(first) = first {
                return Ok(match first.request_hash.as_deref() == Some(hash.as_str()) {
                    true => Inserted::Replayed(first),
                    false => Inserted::KeyReused,
                });
            }
        }
        if let Some(unique_key) = &job.unique_key {
            let open = training_job::Entity::find()
                .filter(training_job::Column::OrgId.eq(&job.org_id))
                .filter(training_job::Column::UniqueKey.eq(unique_key.as_str()))
                .filter(training_job::Column::Status.is_in(OPEN.map(JobStatus::as_str)))
                .one(db)
                .await?;
            if let Some(open) = open {
                return Ok(Inserted::Unique(open));
            }
        }
    }
    Err(DbErr::Custom(
        "a job's unique key kept conflicting with jobs that ended".into(),
    ))
}

/// Creates many jobs at once, all or none, in order: the ones without a unique key in
/// multi-row statements, each with one as [`insert_keyed`] does (an earlier item of the
/// batch with the same key counts).
pub async fn insert_batch(db: &impl TransactionTrait, jobs: Vec<NewJob>) -> Result<Vec<Inserted>, DbErr> {
    let txn = db.begin().await?;
    let now = Utc::now();
    let mut results: Vec<Option<Inserted>> = Vec::with_capacity(jobs.len());
    let mut plain = Vec::new();
    for job in jobs {
        if job.unique_key.is_some() || job.idempotency.is_some() {
            results.push(Some(insert_keyed(&txn, job).await?));
        } else {
            plain.push((results.len(), queued_job(job, now)));
            results.push(None);
        }
    }
    // 500 rows of the table's columns stay under both databases' bound-parameter limits.
    for chunk in plain.chunks(500) {
        training_job::Entity::insert_many(
            chunk
                .iter()
                .map(|(_, model)| training_job::ActiveModel::from(model.clone())),
        )
        .exec_without_returning(&txn)
        .await?;
    }
    txn.commit().await?;
    for (index, model) in plain {
        results[index] = Some(Inserted::New(model));
    }
    Ok(results.into_iter().flatten().collect())
}
