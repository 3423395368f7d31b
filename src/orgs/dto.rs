//! Bodies and views of the organization routes.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::auth::Role;
use crate::http::validate::{Checks, Validate};
use keel_core::domain::{OrgId, UserId};

/// Organization and project slugs: the parts of `<org-slug>/<project-slug>/<name>`.
pub static SLUG_RE: lazy_regex::Lazy<regex::Regex> = lazy_regex::lazy_regex!(r"^[a-z0-9][a-z0-9._-]*$");

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CreateOrgBody {
    /// Not only whitespace.
    // Its pattern (not blank) is set on the document: openapi::refine::NOT_BLANK.
    #[schema(min_length = 1, max_length = 200)]
    pub name: String,
    /// Derived from the name when absent.
    #[schema(min_length = 1, max_length = 100, pattern = r"^[a-z0-9][a-z0-9._-]*$")]
    pub slug: Option<String>,
    #[schema(value_type = String, min_length = 1, max_length = 200)]
    pub owner_user_id: UserId,
    #[schema(min_length = 1, max_length = 320)]
    pub owner_email: Option<String>,
}

impl Validate for CreateOrgBody {
    fn validate(&self, c: &mut Checks) {
        c.display_name("name", &self.name, 200);
        if let Some(slug) = &self.slug {
            c.pattern("slug", slug, &SLUG_RE);
        }
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
    fn validate(&self, _c: &mut Checks) {}
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
    fn validate(&self, _c: &mut Checks) {}
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
    fn validate(&self, _c: &mut Checks) {}
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdapterView {
    pub adapter_id: String,
    pub org_id: String,
    pub base_model: String,
    pub live: bool,
}

crate::org_scoped!(unnamed: ApiKeyBody);
