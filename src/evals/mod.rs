//! `POST /api/evals/runs`: an eval run uploaded in one piece; keel derives its counts and
//! mean score from the cases and stores the run with its cases.

pub mod repo;

use actix_web::HttpResponse;
use chrono::{DateTime, NaiveDateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::auth::Caller;
use crate::domain::ProjectId;
use crate::error::{ApiError, ApiResult, ErrorBody, ValidationErrorBody};
use crate::http::extract::ValidJson;
use crate::http::validate::{Checks, Validate};

pub const MAX_CASES: usize = 5000;
const STATUSES: &[&str] = &["completed", "failed"];

/// EvalCasePayload: every field optional and nullable.
#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct EvalCasePayload {
    #[schema(max_length = 200)]
    pub case_id: Option<String>,
    pub input: Option<String>,
    pub expected: Option<String>,
    pub actual: Option<String>,
    pub score: Option<f64>,
    pub success: Option<bool>,
    pub reason: Option<String>,
    pub error: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub metrics: Option<Map<String, Value>>,
    #[schema(minimum = 0, maximum = 2147483647)]
    pub latency_ms: Option<i64>,
    #[schema(minimum = 0, maximum = 2147483647)]
    pub total_tokens: Option<i64>,
}

impl Validate for EvalCasePayload {
    fn validate(&self, c: &mut Checks) {
        c.opt_str_len("case_id", self.case_id.as_deref(), 0, 200);
        c.opt_int_range("latency_ms", self.latency_ms, 0, 2_147_483_647);
        c.opt_int_range("total_tokens", self.total_tokens, 0, 2_147_483_647);
    }
}

/// An uploaded eval run's status (the schema of `status`; the field stays a string).
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
#[allow(dead_code)]
pub enum EvalStatus {
    Completed,
    Failed,
}

#[derive(Debug, Deserialize, ToSchema)]
pub struct EvalRunUploadRequest {
    #[schema(value_type = String, min_length = 1, max_length = 100)]
    pub project_id: ProjectId,
    #[schema(min_length = 1, max_length = 200)]
    pub suite_name: String,
    #[schema(min_length = 1, max_length = 512)]
    pub environment_reference: String,
    #[schema(max_length = 200)]
    pub model: Option<String>,
    /// `completed` (default) or `failed`.
    #[schema(value_type = Option<EvalStatus>)]
    pub status: Option<String>,
    pub error: Option<String>,
    #[schema(format = DateTime)]
    pub started_at: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Map<String, Value>>,
    #[schema(max_items = 5000)]
    #[serde(default)]
    pub cases: Vec<EvalCasePayload>,
}

/// An ISO 8601 date-time; without an offset it is taken as UTC.
pub(crate) fn parse_datetime(text: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .ok()
        .or_else(|| {
            NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M:%S%.f")
                .ok()
                .map(|t| t.and_utc())
        })
}

impl Validate for EvalRunUploadRequest {
    fn validate(&self, c: &mut Checks) {
        c.str_len("project_id", &self.project_id, 1, 100);
        c.str_len("suite_name", &self.suite_name, 1, 200);
        c.str_len("environment_reference", &self.environment_reference, 1, 512);
        c.opt_str_len("model", self.model.as_deref(), 0, 200);
        if let Some(status) = &self.status {
            c.one_of("status", status, STATUSES);
        }
        if let Some(started) = &self.started_at {
            if parse_datetime(started).is_none() {
                c.fail(
                    "started_at",
                    "datetime_from_date_parsing",
                    "Input should be a valid datetime",
                );
            }
        }
        c.max_items("cases", self.cases.len(), MAX_CASES);
        for (i, case) in self.cases.iter().enumerate() {
            c.nested("cases", Some(i), case);
        }
    }
}

#[derive(Debug, Serialize, ToSchema, PartialEq)]
pub struct EvalRunUploadResponse {
    pub ok: bool,
    pub eval_run_id: String,
    pub total_cases: i32,
    pub passed_cases: i32,
    pub graded_cases: i32,
    pub errored_cases: i32,
    pub mean_score: Option<f64>,
}

/// The counts rule 1 derives: passed = `success` true, graded = a score, errored = a
/// non-empty error, mean over the graded (null when none is).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Derived {
    pub total: i32,
    pub passed: i32,
    pub graded: i32,
    pub errored: i32,
    pub mean_score: Option<f64>,
}

pub fn derive(cases: &[EvalCasePayload]) -> Derived {
    let count = |f: &dyn Fn(&EvalCasePayload) -> bool| cases.iter().filter(|c| f(c)).count() as i32;
    let scores: Vec<f64> = cases.iter().filter_map(|c| c.score).collect();
    Derived {
        total: cases.len() as i32,
        passed: count(&|c| c.success == Some(true)),
        graded: scores.len() as i32,
        errored: count(&|c| c.error.as_deref().is_some_and(|e| !e.is_empty())),
        mean_score: (!scores.is_empty()).then(|| scores.iter().sum::<f64>() / scores.len() as f64),
    }
}

/// Upload an eval run
///
/// Stores an eval run with its cases for a project of the caller's organization and derives
/// total, passed, graded and errored counts and the mean score.
#[utoipa::path(post, path = "/api/evals/runs", tag = "evals", security(("apiKey" = []), ("session" = [])),
    request_body = EvalRunUploadRequest,
    responses(
        (status = 200, body = EvalRunUploadResponse),
        (status = 404, description = "No such project in the caller's organization", body = ErrorBody),
        (status = 422, body = ValidationErrorBody),
    ))]
pub async fn upload_eval_run(
    caller: Caller,
    body: ValidJson<EvalRunUploadRequest>,
) -> ApiResult<HttpResponse> {
    let body = body.0;
    let orgs = caller.organizations().await?;
    let db = &caller.state().db;
    let project = crate::projects::repo::find_in_orgs(db, &body.project_id, &orgs)
        .await?
        .ok_or_else(|| ApiError::not_found("project"))?;
    let derived = derive(&body.cases);
    let id = uuid::Uuid::new_v4().to_string();
    repo::insert_run(db, &id, &project, &body, derived).await?;
    Ok(HttpResponse::Ok().json(EvalRunUploadResponse {
        ok: true,
        eval_run_id: id,
        total_cases: derived.total,
        passed_cases: derived.passed,
        graded_cases: derived.graded,
        errored_cases: derived.errored,
        mean_score: derived.mean_score,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(score: Option<f64>, success: Option<bool>, error: Option<&str>) -> EvalCasePayload {
        EvalCasePayload {
            score,
            success,
            error: error.map(str::to_owned),
            ..EvalCasePayload::default()
        }
    }

    #[test]
    fn counts_and_mean_follow_the_rule() {
        let cases = [
            case(Some(1.0), Some(true), None),
            case(Some(0.5), Some(false), Some("")),
            case(None, None, Some("timeout")),
            case(Some(0.0), Some(true), None),
        ];
        let d = derive(&cases);
        assert_eq!((d.total, d.passed, d.graded, d.errored), (4, 2, 3, 1));
        assert_eq!(d.mean_score, Some(0.5));
    }

    #[test]
    fn no_cases_and_no_scores_have_no_mean() {
        assert_eq!(
            derive(&[]),
            Derived {
                total: 0,
                passed: 0,
                graded: 0,
                errored: 0,
                mean_score: None
            }
        );
        assert_eq!(derive(&[case(None, Some(true), None)]).mean_score, None);
    }
}
