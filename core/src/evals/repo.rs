//! Eval runs and their cases.

use chrono::Utc;
use entities::{eval_case, eval_run};
use sea_orm::{
    ActiveValue::Set, ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QueryOrder, QuerySelect,
    TransactionSession, TransactionTrait,
};
use serde_json::Value;

use super::{Derived, EvalUpload};
use crate::domain::OrgId;

/// Cases per insert statement (14 columns; SQLite allows 32,766 parameters).
const CASE_CHUNK: usize = 1000;

/// Stores the run and its cases, all or none.
pub async fn insert_run(
    db: &impl TransactionTrait,
    id: &str,
    project: &entities::project::Model,
    body: &EvalUpload,
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
        status: Set(body.status),
        error: Set(body.error.clone()),
        started_at: Set(body.started_at),
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

/// How many runs the organization has (of one project, if given).
pub async fn count_of_org(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    project_id: Option<&str>,
) -> Result<u64, DbErr> {
    let mut query = eval_run::Entity::find().filter(eval_run::Column::OrgId.eq(org_id));
    if let Some(project) = project_id {
        query = query.filter(eval_run::Column::ProjectId.eq(project));
    }
    sea_orm::PaginatorTrait::count(query, db).await
}

/// The organization's eval runs (of one project when given), newest first; at most `limit`.
pub async fn runs_of_org(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    project_id: Option<&str>,
    before: Option<&(chrono::DateTime<chrono::Utc>, String)>,
    limit: u64,
) -> Result<Vec<eval_run::Model>, DbErr> {
    let mut query = eval_run::Entity::find().filter(eval_run::Column::OrgId.eq(org_id));
    if let Some(project) = project_id {
        query = query.filter(eval_run::Column::ProjectId.eq(project));
    }
    // Keyset paging: only runs older than `before` (`created_at`, then id).
    if let Some((at, id)) = before {
        query = query.filter(
            sea_orm::Condition::any()
                .add(eval_run::Column::CreatedAt.lt(*at))
                .add(
                    sea_orm::Condition::all()
                        .add(eval_run::Column::CreatedAt.eq(*at))
                        .add(eval_run::Column::Id.lt(id.as_str())),
                ),
        );
    }
    query
        .order_by_desc(eval_run::Column::CreatedAt)
        .order_by_desc(eval_run::Column::Id)
        .limit(limit)
        .all(db)
        .await
}

/// The organization's eval run.
pub async fn find_run(
    db: &impl ConnectionTrait,
    org_id: &OrgId,
    run_id: &str,
) -> Result<Option<eval_run::Model>, DbErr> {
    eval_run::Entity::find_by_id(run_id.to_owned())
        .filter(eval_run::Column::OrgId.eq(org_id))
        .one(db)
        .await
}

/// Which cases of a run to list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaseFilter {
    All,
    /// Graded and not successful.
    Failed,
    Errored,
}

/// A run's cases in upload order, from `after` (a position), at most `limit`.
pub async fn cases(
    db: &impl ConnectionTrait,
    run_id: &str,
    filter: CaseFilter,
    after: Option<i32>,
    limit: u64,
) -> Result<Vec<eval_case::Model>, DbErr> {
    let mut query = eval_case::Entity::find().filter(eval_case::Column::EvalRunId.eq(run_id));
    query = match filter {
        CaseFilter::All => query,
        CaseFilter::Failed => query.filter(eval_case::Column::Success.eq(false)),
        CaseFilter::Errored => query.filter(eval_case::Column::Error.is_not_null()),
    };
    if let Some(after) = after {
        query = query.filter(eval_case::Column::Position.gt(after));
    }
    query
        .order_by_asc(eval_case::Column::Position)
        .limit(limit)
        .all(db)
        .await
}
