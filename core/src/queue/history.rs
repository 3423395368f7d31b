//! A job's history: its ended attempts (and claims refused for funds), in their order. Read
//! by the job views and by the events that announce an ended job.

use std::collections::HashMap;

use entities::training_job_attempt;
use sea_orm::{ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QueryOrder};

use crate::domain::JobId;

/// The jobs' ended attempts, oldest first, by job.
pub async fn histories(
    db: &impl ConnectionTrait,
    job_ids: &[JobId],
) -> Result<HashMap<JobId, Vec<training_job_attempt::Model>>, DbErr> {
    let mut by_job: HashMap<JobId, Vec<training_job_attempt::Model>> = HashMap::new();
    for chunk in job_ids.chunks(500) {
        let rows = training_job_attempt::Entity::find()
            .filter(training_job_attempt::Column::JobId.is_in(chunk.iter().cloned()))
            .order_by_asc(training_job_attempt::Column::JobId)
            .order_by_asc(training_job_attempt::Column::Ordinal)
            .all(db)
            .await?;
        for row in rows {
            by_job.entry(row.job_id.clone()).or_default().push(row);
        }
    }
    Ok(by_job)
}
