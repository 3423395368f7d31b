//! Bodies and views of the eval routes.

use keel_core::domain::EvalStatus as Status;
use keel_core::evals::{parse_datetime, EvalCase, EvalError, EvalUpload};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

use crate::http::validate::{Checks, Validate};
use keel_core::domain::ProjectId;

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
    fn validate(&self, _c: &mut Checks) {}
}

/// An uploaded eval run's status: the names of [`Status`], spelled there once.
pub struct EvalStatus;

impl utoipa::PartialSchema for EvalStatus {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .enum_values(Some(Status::ALL.map(Status::as_str)))
            .into()
    }
}

impl ToSchema for EvalStatus {}

#[derive(Debug, Deserialize, ToSchema)]
pub struct EvalRunUploadRequest {
    /// Text that is no project id names no project (404, as an unknown one).
    #[schema(min_length = 1, max_length = 100)]
    pub project_id: String,
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

impl Validate for EvalRunUploadRequest {
    fn validate(&self, c: &mut Checks) {
        if let Some(status) = &self.status {
            c.one_of("status", status, &Status::ALL.map(Status::as_str));
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

impl From<EvalCasePayload> for EvalCase {
    fn from(c: EvalCasePayload) -> Self {
        Self {
            case_id: c.case_id,
            input: c.input,
            expected: c.expected,
            actual: c.actual,
            score: c.score,
            success: c.success,
            reason: c.reason,
            error: c.error,
            metrics: c.metrics,
            latency_ms: c.latency_ms,
            total_tokens: c.total_tokens,
        }
    }
}

impl TryFrom<EvalRunUploadRequest> for EvalUpload {
    type Error = EvalError;

    fn try_from(body: EvalRunUploadRequest) -> Result<Self, EvalError> {
        Ok(Self {
            started_at: body.started_at.as_deref().and_then(parse_datetime),
            project_id: ProjectId::parse(&body.project_id).map_err(|_| EvalError::ProjectNotFound)?,
            suite_name: body.suite_name,
            environment_reference: body.environment_reference,
            model: body.model,
            // Checked by `validate`: absent is `completed`.
            status: body.status.as_deref().and_then(Status::parse).unwrap_or_default(),
            error: body.error,
            metadata: body.metadata,
            cases: body.cases.into_iter().map(EvalCase::from).collect(),
        })
    }
}
