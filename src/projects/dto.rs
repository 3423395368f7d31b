//! Bodies and views of the project routes.

use crate::http::validate::{Checks, Validate};
use crate::orgs::SLUG_RE;
use chrono::{DateTime, Utc};
use entities::project;
use keel_core::domain::OrgId;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProjectCreateBody {
    /// The organization; with an API key it may be omitted (the key's own).
    #[schema(value_type = Option<String>, min_length = 1, max_length = 100)]
    #[serde(default, deserialize_with = "OrgId::optional")]
    pub org_id: Option<OrgId>,
    /// Not only whitespace.
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\u0000]*[^\\u0000\\t-\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000][^\\u0000]*$"
    )]
    pub name: String,
    /// Unique within the organization; derived from the name when absent.
    #[schema(min_length = 1, max_length = 100, pattern = r"^[a-z0-9][a-z0-9._-]*$")]
    pub slug: Option<String>,
    #[schema(max_length = 2000)]
    pub description: Option<String>,
}

impl Validate for ProjectCreateBody {
    fn validate(&self, c: &mut Checks) {
        c.display_name("name", &self.name, 200);
        if let Some(slug) = &self.slug {
            c.pattern("slug", slug, &SLUG_RE);
        }
    }
}

/// The answer to a create: strings and a boolean only.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProjectCreated {
    pub id: String,
    pub org_id: String,
    pub name: String,
    pub slug: String,
    pub active: bool,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProjectView {
    pub id: String,
    pub org_id: String,
    pub name: String,
    pub slug: String,
    pub description: Option<String>,
    pub active: bool,
    pub created_at: DateTime<Utc>,
    /// Its traces are deleted this many days after they were recorded; null: kept.
    pub trace_retention_days: Option<i32>,
}

/// A change to a project: how long it keeps its traces.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProjectPatchBody {
    /// Days (1 to 3650) its traces are kept; `null`: forever (the default).
    #[serde(deserialize_with = "crate::http::extract::present")]
    #[schema(value_type = Option<i32>, minimum = 1, maximum = 3650, required = true)]
    pub trace_retention_days: Option<Option<i32>>,
}

impl crate::http::validate::Validate for ProjectPatchBody {
    fn validate(&self, _c: &mut crate::http::validate::Checks) {}
}

impl From<project::Model> for ProjectView {
    fn from(p: project::Model) -> Self {
        Self {
            id: p.id.into(),
            org_id: p.org_id.into(),
            name: p.name,
            slug: p.slug,
            description: p.description,
            active: p.active,
            created_at: p.created_at,
            trace_retention_days: p.trace_retention_days,
        }
    }
}

crate::org_scoped!(ProjectCreateBody);
