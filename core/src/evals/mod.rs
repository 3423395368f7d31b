//! Eval runs uploaded in one piece: keel derives their counts and mean score from the cases
//! and stores each run with its cases.

pub(crate) mod repo;
pub mod service;

pub use repo::CaseFilter;

use chrono::{DateTime, NaiveDateTime, Utc};
use serde_json::{Map, Value};

use crate::domain::ProjectId;

/// Most cases one upload may carry.
pub const MAX_CASES: usize = 5000;

/// An eval run as uploaded.
#[derive(Debug, Clone)]
pub struct EvalUpload {
    pub project_id: ProjectId,
    pub suite_name: String,
    pub environment_reference: String,
    pub model: Option<String>,
    pub status: crate::domain::EvalStatus,
    pub error: Option<String>,
    pub started_at: Option<DateTime<Utc>>,
    pub metadata: Option<Map<String, Value>>,
    pub cases: Vec<EvalCase>,
}

/// One case of an uploaded run; every field optional.
#[derive(Debug, Clone, Default)]
pub struct EvalCase {
    pub case_id: Option<String>,
    pub input: Option<String>,
    pub expected: Option<String>,
    pub actual: Option<String>,
    pub score: Option<f64>,
    pub success: Option<bool>,
    pub reason: Option<String>,
    pub error: Option<String>,
    pub metrics: Option<Map<String, Value>>,
    pub latency_ms: Option<i64>,
    pub total_tokens: Option<i64>,
}

/// What keel derives from a run's cases.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Derived {
    pub total: i32,
    pub passed: i32,
    pub graded: i32,
    pub errored: i32,
    pub mean_score: Option<f64>,
}

/// Counts and mean: passed = `success == true`; graded = has a score; errored = a non-empty
/// error; the mean over graded cases (none without one).
pub fn derive(cases: &[EvalCase]) -> Derived {
    let count = |f: &dyn Fn(&EvalCase) -> bool| cases.iter().filter(|c| f(c)).count() as i32;
    let scores: Vec<f64> = cases.iter().filter_map(|c| c.score).collect();
    Derived {
        total: cases.len() as i32,
        passed: count(&|c| c.success == Some(true)),
        graded: scores.len() as i32,
        errored: count(&|c| c.error.as_deref().is_some_and(|e| !e.is_empty())),
        mean_score: (!scores.is_empty()).then(|| scores.iter().sum::<f64>() / scores.len() as f64),
    }
}

/// An RFC 3339 time, or one without an offset (taken as UTC).
pub fn parse_datetime(text: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .ok()
        .or_else(|| {
            NaiveDateTime::parse_from_str(text, "%Y-%m-%dT%H:%M:%S%.f")
                .ok()
                .map(|t| t.and_utc())
        })
}

/// Why an eval run was not stored.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("project not found")]
    ProjectNotFound,
    #[error(transparent)]
    Database(#[from] sea_orm::DbErr),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn case(score: Option<f64>, success: Option<bool>, error: Option<&str>) -> EvalCase {
        EvalCase {
            score,
            success,
            error: error.map(str::to_owned),
            ..EvalCase::default()
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
