//! Bodies and views of the organization routes.

use std::sync::LazyLock;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::auth::Role;
use crate::domain::OrgId;
use crate::http::validate::{Checks, Validate};

/// Organization and project slugs: the parts of `<org-slug>/<project-slug>/<name>`.
pub static SLUG_RE: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new(r"^[a-z0-9][a-z0-9._-]*$").unwrap_or_else(|_| unreachable!()));

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateOrgBody {
    /// Not only whitespace.
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = "^[^\\u0000]*[^\\u0000\\t-\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000][^\\u0000]*$"
    )]
    pub name: String,
    /// Derived from the name when absent.
    #[schema(min_length = 1, max_length = 100, pattern = r"^[a-z0-9][a-z0-9._-]*$")]
    pub slug: Option<String>,
    #[schema(min_length = 1, max_length = 200)]
    pub owner_user_id: String,
    #[schema(min_length = 1, max_length = 320)]
    pub owner_email: Option<String>,
}

impl Validate for CreateOrgBody {
    fn validate(&self, c: &mut Checks) {
        c.display_name("name", &self.name, 200);
        if let Some(slug) = &self.slug {
            c.str_len("slug", slug, 1, 100);
            c.pattern("slug", slug, &SLUG_RE);
        }
        c.str_len("ownerUserId", &self.owner_user_id, 1, 200);
        c.opt_str_len("ownerEmail", self.owner_email.as_deref(), 1, 320);
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreatedOrgResponse {
    pub org_id: String,
    pub slug: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Deleted {
    pub deleted: bool,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MemberBody {
    #[schema(value_type = crate::schemas::Role)]
    pub role: Role,
    #[schema(min_length = 1, max_length = 320)]
    pub email: Option<String>,
}

impl Validate for MemberBody {
    fn validate(&self, c: &mut Checks) {
        c.opt_str_len("email", self.email.as_deref(), 1, 320);
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct OkResponse {
    pub ok: bool,
}

#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyBody {
    #[schema(min_length = 1, max_length = 200)]
    pub name: Option<String>,
}

impl Validate for ApiKeyBody {
    fn validate(&self, c: &mut Checks) {
        c.opt_str_len("name", self.name.as_deref(), 1, 200);
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreatedKeyResponse {
    pub api_key_id: String,
    /// The secret, shown this once; only its hash is stored.
    pub key: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Revoked {
    pub revoked: bool,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AdapterBody {
    #[schema(value_type = String, format = Uuid)]
    pub org_id: OrgId,
    #[schema(min_length = 1, max_length = 512)]
    pub base_model: String,
    /// Kept as stored when absent (false for a new adapter).
    pub live: Option<bool>,
}

impl Validate for AdapterBody {
    fn validate(&self, c: &mut Checks) {
        c.uuid("orgId", &self.org_id);
        c.str_len("baseModel", &self.base_model, 1, 512);
    }
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdapterView {
    pub adapter_id: String,
    pub org_id: String,
    pub base_model: String,
    pub live: bool,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApiKeyView {
    pub api_key_id: String,
    pub org_id: String,
    pub name: Option<String>,
    /// The first characters of the key, for recognizing it.
    pub prefix: String,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ApiKeyList {
    pub keys: Vec<ApiKeyView>,
}

crate::org_scoped!(unnamed: ApiKeyBody);
