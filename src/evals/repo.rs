//! Eval runs and their cases.

use chrono::Utc;
use entities::{eval_case, eval_run};
use sea_orm::{ActiveValue::Set, DbErr, EntityTrait, TransactionSession, TransactionTrait};
use serde_json::Value;

use super::{parse_datetime, Derived, EvalRunUploadRequest};

/// Cases per insert statement (14 columns; SQLite allows 32,766 parameters).
const CASE_CHUNK: usize = 1000;

/// Stores the run and its cases, all or none.
pub async fn insert_run(
    db: &impl TransactionTrait,
    id: &str,
    project: &entities::project::Model,
    body: &EvalRunUploadRequest,
    derived: Derived,
) -> Result<(), DbErr> {
    let txn = db.begin().await?;
    eval_run::Entity::insert(eval_run::ActiveModel {
        id: Set(id.to_owned()),
        org_id: Set(project.org_id.clone()),
        project_id: Set(project.id.clone()),
        suite_name: Set(body.suite_name.clone()),
        environment_reference: Set(body.environment_reference.clone()),
        model: Set(body.model.clone()),
        status: Set(body.status.clone().unwrap_or_else(|| "completed".into())),
        error: Set(body.error.clone()),
        started_at: Set(body.started_at.as_deref().and_then(parse_datetime)),
        metadata: Set(body
            .metadata
            .as_ref()
            .map(|m| Value::Object(m.clone()).to_string())),
        total_cases: Set(derived.total),
        passed_cases: Set(derived.passed),
        graded_cases: Set(derived.graded),
        errored_cases: Set(derived.errored),
        mean_score: Set(derived.mean_score),
        created_at: Set(Utc::now()),
    })
    .exec_without_returning(&txn)
    .await?;
    let rows: Vec<eval_case::ActiveModel> = body
        .cases
        .iter()
        .enumerate()
        .map(|(position, c)| eval_case::ActiveModel {
            eval_run_id: Set(id.to_owned()),
            position: Set(position as i32),
            case_id: Set(c.case_id.clone()),
            input: Set(c.input.clone()),
            expected: Set(c.expected.clone()),
            actual: Set(c.actual.clone()),
            score: Set(c.score),
            success: Set(c.success),
            reason: Set(c.reason.clone()),
            error: Set(c.error.clone()),
            metrics: Set(c.metrics.as_ref().map(|m| Value::Object(m.clone()).to_string())),
            latency_ms: Set(c.latency_ms),
            total_tokens: Set(c.total_tokens),
        })
        .collect();
    for chunk in rows.chunks(CASE_CHUNK) {
        eval_case::Entity::insert_many(chunk.to_vec())
            .exec_without_returning(&txn)
            .await?;
    }
    txn.commit().await
}
