//! Bodies and views of the flash routes.

use crate::http::validate::Validate;
use chrono::{DateTime, Utc};
use entities::flash_environment;
use keel_core::domain::{OrgId, ProjectId};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlashProjectValidateBody {
    #[schema(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
    #[schema(value_type = String, format = Uuid)]
    pub project_id: ProjectId,
}

impl Validate for FlashProjectValidateBody {}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProjectValid {
    pub valid: bool,
    pub project_id: String,
    pub org_id: String,
    pub slug: String,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(rename_all = "camelCase")]
#[into_params(parameter_in = Query)]
pub struct ProvisionQuery {
    /// Environments attempted at most in this pass: 1..100, default 25.
    #[param(minimum = 1, maximum = 100)]
    pub limit: Option<i64>,
    /// Only this organization's environments (its backoff alone advances).
    #[param(value_type = Option<String>, format = Uuid)]
    #[serde(default, deserialize_with = "OrgId::optional")]
    pub org_id: Option<OrgId>,
}

impl Validate for ProvisionQuery {}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlashEnvironmentPublishBody {
    #[schema(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
    #[schema(value_type = String, format = Uuid)]
    pub project_id: ProjectId,
    #[schema(
        min_length = 3,
        max_length = 512,
        pattern = r"^[a-z0-9][a-z0-9._-]*/[a-z0-9][a-z0-9._-]*/[a-z0-9][a-z0-9._-]*$"
    )]
    pub slug: String,
    #[schema(min_length = 1, max_length = 120)]
    pub name: String,
    /// Default: `hub.default_repo` from config.
    #[schema(min_length = 1, max_length = 512)]
    pub hub_repo: Option<String>,
    /// Default `main`.
    #[schema(min_length = 1, max_length = 512)]
    pub hub_ref: Option<String>,
    #[schema(min_length = 1, max_length = 4096)]
    pub hub_path: String,
    #[schema(pattern = r"^[0-9a-f]{64}$")]
    pub package_sha256: Option<String>,
    #[schema(max_length = 200)]
    pub published_by_user_id: Option<String>,
    #[schema(max_length = 200)]
    pub api_key_id: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Map<String, Value>>,
}

impl Validate for FlashEnvironmentPublishBody {}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvironmentView {
    pub id: String,
    pub org_id: String,
    pub project_id: String,
    pub slug: String,
    pub name: String,
    pub hub_repo: String,
    pub hub_ref: String,
    pub hub_path: String,
    pub package_sha256: Option<String>,
    pub published_by_user_id: Option<String>,
    pub api_key_id: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Value>,
    /// `pending` (waiting for its hub repository) or `provisioned`.
    pub hub_status: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl From<flash_environment::Model> for EnvironmentView {
    fn from(e: flash_environment::Model) -> Self {
        Self {
            metadata: e.metadata.as_deref().and_then(|m| serde_json::from_str(m).ok()),
            id: e.id,
            org_id: e.org_id.into(),
            project_id: e.project_id.into(),
            slug: e.slug,
            name: e.name,
            hub_repo: e.hub_repo,
            hub_ref: e.hub_ref,
            hub_path: e.hub_path,
            package_sha256: e.package_sha256,
            published_by_user_id: e.published_by_user_id,
            api_key_id: e.api_key_id,
            hub_status: e.hub_status.as_str().to_owned(),
            created_at: e.created_at,
            updated_at: e.updated_at,
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct EnvironmentPublished {
    /// Whether this call created the mirror row (false: it replaced it).
    pub created: bool,
    #[serde(flatten)]
    pub environment: EnvironmentView,
}

/// Body of environment delete and validate.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlashEnvironmentRefBody {
    #[schema(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
    #[schema(value_type = String, format = Uuid)]
    pub project_id: ProjectId,
    #[schema(
        min_length = 3,
        max_length = 512,
        pattern = r"^[a-z0-9][a-z0-9._-]*/[a-z0-9][a-z0-9._-]*/[a-z0-9][a-z0-9._-]*$"
    )]
    pub slug: String,
}

impl Validate for FlashEnvironmentRefBody {}

#[derive(Debug, Serialize, ToSchema)]
pub struct EnvironmentDeleted {
    /// False when there was no such mirror row (deleting twice is harmless).
    pub deleted: bool,
    pub slug: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Valid {
    pub valid: bool,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlashEnvironmentUseBody {
    #[schema(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
    #[schema(value_type = String, format = Uuid)]
    pub project_id: ProjectId,
    #[schema(
        min_length = 3,
        max_length = 512,
        pattern = r"^[a-z0-9][a-z0-9._-]*/[a-z0-9][a-z0-9._-]*/[a-z0-9][a-z0-9._-]*$"
    )]
    pub slug: String,
    #[schema(min_length = 1, max_length = 128)]
    pub run_id: Option<String>,
}

impl Validate for FlashEnvironmentUseBody {}

#[derive(Debug, Serialize, ToSchema)]
pub struct Recorded {
    pub recorded: bool,
}

/// The optional fields of a run upsert, kept as they were sent.
pub const RUN_FIELDS: &[&str] = &[
    "userId",
    "apiKeyId",
    "environmentSlug",
    "model",
    "algorithm",
    "phase",
    "gpuType",
    "adapterRef",
    "artifactsDir",
    "error",
    "costUsd",
    "realizedCostUsd",
    "spec",
    "deployment",
    "lastHeartbeat",
    "gpuStatus",
    "metadata",
    "createdAt",
    "updatedAt",
];

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlashRunUpsertBody {
    #[schema(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
    #[schema(value_type = String, format = Uuid)]
    pub project_id: ProjectId,
    #[schema(min_length = 1, max_length = 128)]
    pub run_id: String,
    #[schema(min_length = 1, max_length = 64)]
    pub status: String,
    pub user_id: Option<String>,
    pub api_key_id: Option<String>,
    pub environment_slug: Option<String>,
    pub model: Option<String>,
    pub algorithm: Option<String>,
    pub phase: Option<String>,
    pub gpu_type: Option<String>,
    pub adapter_ref: Option<String>,
    pub artifacts_dir: Option<String>,
    pub error: Option<String>,
    pub cost_usd: Option<f64>,
    pub realized_cost_usd: Option<f64>,
    #[schema(value_type = Option<Object>)]
    pub spec: Option<Map<String, Value>>,
    #[schema(value_type = Option<Object>)]
    pub deployment: Option<Map<String, Value>>,
    #[schema(value_type = Option<Object>)]
    pub last_heartbeat: Option<Map<String, Value>>,
    #[schema(value_type = Option<Object>)]
    pub gpu_status: Option<Map<String, Value>>,
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Map<String, Value>>,
    pub created_at: Option<String>,
    /// When the control plane changed the run; an upsert older than the stored one is ignored.
    #[schema(max_length = 64)]
    pub updated_at: Option<String>,
}

impl Validate for FlashRunUpsertBody {}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct MirrorUpserted {
    pub org_id: String,
    pub project_id: String,
    pub run_id: String,
    /// The run's status (run upserts) after this call.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub checkpoint_id: Option<String>,
    /// `created`, `updated`, or `stale` (older than what is stored; nothing changed).
    pub result: String,
}

pub const CHECKPOINT_FIELDS: &[&str] = &[
    "seed",
    "phase",
    "adapterRef",
    "artifactPath",
    "createdAt",
    "updatedAt",
    "metrics",
    "metadata",
];

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlashCheckpointUpsertBody {
    #[schema(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
    #[schema(value_type = String, format = Uuid)]
    pub project_id: ProjectId,
    #[schema(min_length = 1, max_length = 128)]
    pub run_id: String,
    #[schema(min_length = 1, max_length = 256)]
    pub checkpoint_id: String,
    pub seed: Option<i64>,
    pub phase: Option<String>,
    pub adapter_ref: Option<String>,
    pub artifact_path: Option<String>,
    pub created_at: Option<String>,
    #[schema(max_length = 64)]
    pub updated_at: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub metrics: Option<Map<String, Value>>,
    #[schema(value_type = Option<Object>)]
    pub metadata: Option<Map<String, Value>>,
}

impl Validate for FlashCheckpointUpsertBody {}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlashProductEventBody {
    #[schema(value_type = String, min_length = 1, max_length = 100)]
    pub org_id: OrgId,
    /// On the allowlist (`flash.event_allowlist`).
    #[schema(min_length = 1, max_length = 64)]
    pub event: String,
    #[schema(max_length = 200)]
    pub user_id: Option<String>,
    #[schema(value_type = Option<Object>)]
    pub properties: Option<Map<String, Value>>,
}

impl Validate for FlashProductEventBody {}

#[derive(Debug, Serialize, ToSchema)]
pub struct Accepted {
    pub accepted: bool,
}

/// What a hub provisioning pass did.
#[derive(Debug, Serialize, ToSchema)]
pub struct ProvisionReport {
    /// Hub calls made.
    pub attempted: u64,
    pub provisioned: u64,
    pub failed: u64,
    /// Waiting environments not tried: their organization is backing off (or failed earlier
    /// in this pass), or another instance holds them.
    pub skipped: u64,
}

impl From<keel_core::flash::hub::PassReport> for ProvisionReport {
    fn from(r: keel_core::flash::hub::PassReport) -> Self {
        Self {
            attempted: r.attempted,
            provisioned: r.provisioned,
            failed: r.failed,
            skipped: r.skipped,
        }
    }
}

impl From<&FlashEnvironmentPublishBody> for keel_core::flash::EnvironmentPublish {
    fn from(body: &FlashEnvironmentPublishBody) -> Self {
        Self {
            slug: body.slug.clone(),
            name: body.name.clone(),
            hub_repo: body.hub_repo.clone(),
            hub_ref: body.hub_ref.clone(),
            hub_path: body.hub_path.clone(),
            package_sha256: body.package_sha256.clone(),
            published_by_user_id: body.published_by_user_id.clone(),
            api_key_id: body.api_key_id.clone(),
            metadata: body.metadata.clone(),
        }
    }
}
