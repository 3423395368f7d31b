//! Signs of life from the worker holding a job: heartbeats and live status. Neither changes
//! a job's status ([`JobEvent::Heartbeat`] keeps it); both apply only while the worker holds
//! the job.

use entities::training_job;
use sea_orm::{EntityTrait, QuerySelect};

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    Yes { stop_requested: bool },
    NotHeld,
    NotFound,
}

/// Applies `update` to those of `job_ids` that `worker_id` holds (running or stopping), in
/// one statement; answers, in order, whether each was held and its stop request.
async fn update_held(
    db: &impl ConnectionTrait,
    job_ids: &[JobId],
    worker_id: &str,
    update: sea_orm::UpdateMany<training_job::Entity>,
) -> Result<Vec<Held>, DbErr> {
    if job_ids.is_empty() {
        return Ok(Vec::new());
    }
    let updated: HashMap<JobId, bool> = update
        .filter(training_job::Column::Id.is_in(job_ids.iter().cloned()))
        .filter(training_job::Column::WorkerId.eq(worker_id))
        .filter(guard(JobEvent::Heartbeat))
        .exec_with_returning(db)
        .await?
        .into_iter()
        .map(|job| (job.id, job.stop_requested))
        .collect();
    let missing: Vec<JobId> = job_ids
        .iter()
        .filter(|id| !updated.contains_key(*id))
        .cloned()
        .collect();
    let known: std::collections::HashSet<JobId> = match missing.is_empty() {
        true => Default::default(),
        false => training_job::Entity::find()
            .select_only()
            .column(training_job::Column::Id)
            .filter(training_job::Column::Id.is_in(missing))
            .into_tuple::<JobId>()
            .all(db)
            .await?
            .into_iter()
            .collect(),
    };
    Ok(job_ids
        .iter()
        .map(|id| match updated.get(id) {
            Some(stop_requested) => Held::Yes {
                stop_requested: *stop_requested,
            },
            None if known.contains(id) => Held::NotHeld,
            None => Held::NotFound,
        })
        .collect())
}

/// The worker still works on the job.
pub async fn heartbeat(db: &impl ConnectionTrait, job_id: &JobId, worker_id: &str) -> Result<Held, DbErr> {
    Ok(heartbeats(db, std::slice::from_ref(job_id), worker_id)
        .await?
        .pop()
        .unwrap_or(Held::NotFound))
}

/// The worker still works on each of `job_ids` (one statement for all); answers in order.
pub async fn heartbeats(
    db: &impl ConnectionTrait,
    job_ids: &[JobId],
    worker_id: &str,
) -> Result<Vec<Held>, DbErr> {
    let update = training_job::Entity::update_many()
        .col_expr(training_job::Column::HeartbeatAt, Expr::value(Utc::now()));
    update_held(db, job_ids, worker_id, update).await
}

pub async fn set_live_status(
    db: &impl ConnectionTrait,
    job_id: &JobId,
    worker_id: &str,
    live_status: &serde_json::Value,
) -> Result<Held, DbErr> {
    let update = training_job::Entity::update_many()
        .col_expr(
            training_job::Column::LiveStatus,
            Expr::value(live_status.to_string()),
        )
        .col_expr(training_job::Column::UpdatedAt, Expr::value(Utc::now()));
    Ok(update_held(db, std::slice::from_ref(job_id), worker_id, update)
        .await?
        .pop()
        .unwrap_or(Held::NotFound))
}
