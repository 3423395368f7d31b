//! Bounds checks that report every problem at once, as FastAPI's 422 `detail` items.
//! Types, required fields and unknown fields are checked by serde (see `extract`);
//! this covers what a type cannot say: lengths, ranges, patterns, allowed values.

use serde_json::{json, Value};

use crate::error::ValidationIssue;

/// A request body or query: the rules its schema cannot state. A body's bounds (lengths,
/// patterns, ranges, list sizes) are its schema attributes, checked against its OpenAPI
/// component (`http::schemas`); a body with no other rule keeps this default.
pub trait Validate {
    fn validate(&self, checks: &mut Checks) {
        let _ = checks;
    }
}

/// Collects validation issues under a location prefix (`["body"]`, `["query"]`).
pub struct Checks {
    prefix: Vec<Value>,
    issues: Vec<ValidationIssue>,
}

impl Checks {
    pub fn new(root: &str) -> Self {
        Self {
            prefix: vec![Value::from(root)],
            issues: Vec::new(),
        }
    }

    pub fn into_issues(self) -> Vec<ValidationIssue> {
        self.issues
    }

    fn loc(&self, field: &str) -> Vec<Value> {
        let mut loc = self.prefix.clone();
        loc.push(Value::from(field));
        loc
    }

    /// Records an issue at `field` under the current prefix.
    pub fn fail(&mut self, field: &str, kind: &str, msg: impl Into<String>) {
        let loc = self.loc(field);
        self.issues.push(ValidationIssue::new(loc, kind, msg));
    }

    /// Records an issue at item `index` of the list `field`.
    pub fn fail_item(&mut self, field: &str, index: usize, kind: &str, msg: impl Into<String>) {
        let mut loc = self.loc(field);
        loc.push(Value::from(index));
        self.issues.push(ValidationIssue::new(loc, kind, msg));
    }

    fn fail_ctx(&mut self, field: &str, kind: &str, msg: String, ctx: Value) {
        let loc = self.loc(field);
        self.issues
            .push(ValidationIssue::new(loc, kind, msg).with_ctx(ctx));
    }

    /// String length in characters (as Python counts them), within `min..=max`.
    pub fn str_len(&mut self, field: &str, value: &str, min: usize, max: usize) {
        let len = value.chars().count();
        if len < min {
            let unit = if min == 1 { "character" } else { "characters" };
            self.fail_ctx(
                field,
                "string_too_short",
                format!("String should have at least {min} {unit}"),
                json!({ "min_length": min }),
            );
        } else if len > max {
            let unit = if max == 1 { "character" } else { "characters" };
            self.fail_ctx(
                field,
                "string_too_long",
                format!("String should have at most {max} {unit}"),
                json!({ "max_length": max }),
            );
        }
    }

    /// A display name: 1 to `max` characters, not all of them whitespace.
    pub fn display_name(&mut self, field: &str, value: &str, max: usize) {
        let before = self.issues.len();
        self.str_len(field, value, 1, max);
        if self.issues.len() == before && value.trim().is_empty() {
            self.fail(
                field,
                "value_error",
                "Value error, a name needs at least one character that is not whitespace",
            );
        }
    }

    /// Integer within `min..=max`.
    pub fn int_range(&mut self, field: &str, value: i64, min: i64, max: i64) {
        if value < min {
            self.fail_ctx(
                field,
                "greater_than_equal",
                format!("Input should be greater than or equal to {min}"),
                json!({ "ge": min }),
            );
        } else if value > max {
            self.fail_ctx(
                field,
                "less_than_equal",
                format!("Input should be less than or equal to {max}"),
                json!({ "le": max }),
            );
        }
    }

    pub fn pattern(&mut self, field: &str, value: &str, re: &regex::Regex) {
        if !re.is_match(value) {
            self.fail_ctx(
                field,
                "string_pattern_mismatch",
                format!("String should match pattern '{}'", re.as_str()),
                json!({ "pattern": re.as_str() }),
            );
        }
    }

    /// One of a fixed set of literals.
    pub fn one_of(&mut self, field: &str, value: &str, allowed: &[&str]) {
        if !allowed.contains(&value) {
            let loc = self.loc(field);
            self.issues.push(ValidationIssue::not_one_of(loc, allowed));
        }
    }

    /// Validates a nested value under `field` (and `index`, for list items).
    pub fn nested<T: Validate>(&mut self, field: &str, index: Option<usize>, value: &T) {
        self.prefix.push(Value::from(field));
        if let Some(index) = index {
            self.prefix.push(Value::from(index));
        }
        value.validate(self);
        self.prefix.pop();
        if index.is_some() {
            self.prefix.pop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_count_characters_not_bytes() {
        let mut checks = Checks::new("body");
        checks.str_len("name", "ééé", 1, 3);
        assert!(checks.into_issues().is_empty());
    }

    #[test]
    fn every_problem_is_reported_with_its_location() {
        let mut checks = Checks::new("body");
        checks.str_len("name", "", 1, 10);
        checks.int_range("limit", 101, 1, 100);
        checks.one_of("status", "x", &["completed", "failed"]);
        let issues = checks.into_issues();
        assert_eq!(issues.len(), 3);
        assert_eq!(issues[0].kind, "string_too_short");
        assert_eq!(issues[0].loc, vec![json!("body"), json!("name")]);
        assert_eq!(issues[1].kind, "less_than_equal");
        assert_eq!(issues[2].msg, "Input should be 'completed' or 'failed'");
    }

    #[test]
    fn nested_items_carry_their_index() {
        struct Item(i64);
        impl Validate for Item {
            fn validate(&self, checks: &mut Checks) {
                checks.int_range("step", self.0, 0, i64::MAX);
            }
        }
        let mut checks = Checks::new("body");
        checks.nested("checkpoints", Some(2), &Item(-1));
        let issues = checks.into_issues();
        assert_eq!(
            issues[0].loc,
            vec![json!("body"), json!("checkpoints"), json!(2), json!("step")]
        );
    }
}
