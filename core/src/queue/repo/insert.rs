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
    /// The jobs it waits for (`dependsOn`): it is `waiting` until all have succeeded.
    pub depends_on: Vec<super::pipeline::Dependency>,
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
    // A job with dependencies waits for them; its `runAt`, if ahead, counts once they succeed.
    let event = match (job.depends_on.is_empty(), scheduled_at) {
        (false, _) => JobEvent::CreateWaiting,
        (true, Some(_)) => JobEvent::Schedule,
        (true, None) => JobEvent::Create,
    };
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
        status: event.to().unwrap_or(JobStatus::Queued),
        priority: job.priority,
        queued_at: match event {
            JobEvent::Create => Some(now),
            _ => None,
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
        has_dependents: false,
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
/// batch with the same key counts). Items with dependencies are created `waiting`, their
/// edges written (an item answered by an open job with its unique key, or replayed, keeps
/// the edges it has), then settled by their dependencies as they are now, all in the same
/// transaction (the settling changes none but the batch's own items, which have no
/// dependents yet); answers the jobs as they are at its commit.
pub async fn insert_batch(db: &impl TransactionTrait, jobs: Vec<NewJob>) -> Result<Vec<Inserted>, DbErr> {
    use super::pipeline::{self, Dependency};
    let txn = db.begin().await?;
    let now = Utc::now();
    let dependencies: Vec<Vec<Dependency>> = jobs.iter().map(|job| job.depends_on.clone()).collect();
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
    for (index, model) in plain {
        results[index] = Some(Inserted::New(model));
    }
    let mut results: Vec<Inserted> = results.into_iter().flatten().collect();
    let id_of = |result: &Inserted| match result {
        Inserted::New(job) | Inserted::Unique(job) | Inserted::Replayed(job) => Some(job.id.clone()),
        Inserted::KeyReused => None,
    };
    let mut edges = Vec::new();
    let mut waiting = Vec::new();
    for (index, depends_on) in dependencies.iter().enumerate() {
        let Inserted::New(job) = &results[index] else {
            continue;
        };
        if depends_on.is_empty() {
            continue;
        }
        waiting.push(job.id.clone());
        for dependency in depends_on {
            let on = match dependency {
                Dependency::Job(id) => Some(id.clone()),
                Dependency::Item(item) => results.get(*item).and_then(id_of),
            };
            if let Some(on) = on {
                edges.push((job.id.clone(), on));
            }
        }
    }
    if !waiting.is_empty() {
        pipeline::insert_edges(&txn, &edges, now).await?;
        let settled = pipeline::settle_new(&txn, &waiting, now).await?;
        let mut by_id: HashMap<JobId, training_job::Model> =
            settled.into_iter().map(|job| (job.id.clone(), job)).collect();
        for result in &mut results {
            if let Inserted::New(job) = result {
                if let Some(now) = by_id.remove(&job.id) {
                    *job = now;
                }
            }
        }
        crate::queue::events::announce_ended(
            &txn,
            &results
                .iter()
                .filter_map(|r| match r {
                    Inserted::New(job) if job.status == JobStatus::Cancelled => Some(job.id.clone()),
                    _ => None,
                })
                .collect::<Vec<_>>(),
        )
        .await?;
    }
    txn.commit().await?;
    Ok(results)
}
