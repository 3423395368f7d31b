//! Bodies and views of the project routes.

use crate::http::validate::{Checks, Validate};
use crate::orgs::SLUG_RE;
use chrono::{DateTime, Utc};
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
    // Its pattern (not blank) is set on the document: openapi::refine::NOT_BLANK.
    #[schema(min_length = 1, max_length = 200)]
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
    /// Where its recorded calls are pushed as OpenTelemetry spans; null: nowhere.
    pub otlp_export: Option<OtlpExportView>,
}

/// A project's push, as anyone who reads the project sees it: the URL and the headers'
/// names, never their values.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OtlpExportView {
    /// The URL spans are posted to (the endpoint given, with `/v1/traces`).
    pub endpoint: String,
    /// The names of the headers sent with each push (their values are never shown).
    pub header_names: Vec<String>,
    /// The last failed push's error (the endpoint's answer, bounded), and when.
    pub last_error: Option<String>,
    pub last_error_at: Option<DateTime<Utc>>,
    /// When a push last went through.
    pub last_exported_at: Option<DateTime<Utc>>,
    /// Recorded calls waiting to be pushed.
    pub pending: u64,
}

/// A change to a project: only the fields given change (at least one).
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProjectPatchBody {
    /// Days (1 to 3650) its traces are kept; `null`: forever (the default).
    #[serde(default, deserialize_with = "crate::http::extract::present")]
    #[schema(value_type = Option<i32>, minimum = 1, maximum = 3650)]
    pub trace_retention_days: Option<Option<i32>>,
    /// Where to push its recorded calls (OTLP/HTTP, protobuf); `null`: nowhere. Owners only.
    #[serde(default, deserialize_with = "crate::http::extract::present")]
    #[schema(value_type = Option<OtlpExportBody>)]
    pub otlp_export: Option<Option<OtlpExportBody>>,
}

/// An OTLP/HTTP destination, as `OTEL_EXPORTER_OTLP_ENDPOINT` and `..._HEADERS` name it.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OtlpExportBody {
    /// A base URL (`https://collector:4318`, Langfuse's `https://cloud.langfuse.com/api/public/otel`);
    /// keel appends `/v1/traces` unless it ends so. `https://` unless `webhooks.allow_http`.
    #[schema(min_length = 8, max_length = 2000)]
    pub endpoint: String,
    /// Headers sent with each push (`Authorization: Basic ...` for Langfuse); stored
    /// encrypted, never shown again.
    /// Absent or `null`: none.
    #[serde(default, deserialize_with = "null_as_none")]
    #[schema(schema_with = headers_schema)]
    pub headers: std::collections::BTreeMap<String, String>,
}

/// The `headers` map as keel reads it: at most 20 HTTP header names (tokens of 1 to 100
/// characters) to visible-ASCII values of at most 4,096 characters; `null` for none.
fn headers_schema() -> utoipa::openapi::Object {
    use utoipa::openapi::schema::SchemaType;
    use utoipa::openapi::{ObjectBuilder, Type};
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Object, Type::Null]))
        .max_properties(Some(keel_core::traces::push::MAX_HEADERS))
        .property_names(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,100}$")),
        ))
        .additional_properties(Some(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .pattern(Some(r"^[\t\x20-\x7e]{0,4096}$")),
        ))
        .description(Some(
            "Header name → value, sent with each push (not Content-Type, Content-Length, Host, Transfer-Encoding or Connection, which keel sets).",
        ))
        .build()
}

/// `null` read as no headers, as the schema allows it.
fn null_as_none<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<std::collections::BTreeMap<String, String>, D::Error> {
    use serde::Deserialize;
    Ok(Option::<std::collections::BTreeMap<String, String>>::deserialize(deserializer)?.unwrap_or_default())
}

impl crate::http::validate::Validate for ProjectPatchBody {
    fn validate(&self, c: &mut crate::http::validate::Checks) {
        if self.trace_retention_days.is_none() && self.otlp_export.is_none() {
            c.fail(
                "traceRetentionDays",
                "missing",
                "Field required: a change names traceRetentionDays, otlpExport or both",
            );
        }
        if let Some(Some(export)) = &self.otlp_export {
            c.nested("otlpExport", None, export);
        }
    }
}

impl crate::http::validate::Validate for OtlpExportBody {
    fn validate(&self, c: &mut crate::http::validate::Checks) {
        if self.headers.len() > keel_core::traces::push::MAX_HEADERS {
            c.fail("headers", "too_long", "at most 20 headers");
        }
        for (name, value) in &self.headers {
            if let Some(reason) = keel_core::traces::push::header_problem(name, value) {
                c.nested("headers", None, &HeaderIssue { name, reason });
            }
        }
    }
}

/// A header keel cannot send, located at `[.., headers, <name>]`.
struct HeaderIssue<'a> {
    name: &'a str,
    reason: &'static str,
}

impl crate::http::validate::Validate for HeaderIssue<'_> {
    fn validate(&self, c: &mut crate::http::validate::Checks) {
        c.fail(self.name, "value_error", format!("Value error, {}", self.reason));
    }
}

impl From<keel_core::traces::settings::ProjectDetail> for ProjectView {
    fn from(detail: keel_core::traces::settings::ProjectDetail) -> Self {
        let p = detail.project;
        Self {
            id: p.id.into(),
            org_id: p.org_id.into(),
            name: p.name,
            slug: p.slug,
            description: p.description,
            active: p.active,
            created_at: p.created_at,
            trace_retention_days: p.trace_retention_days,
            otlp_export: detail.otlp_export.map(|e| OtlpExportView {
                endpoint: e.url,
                header_names: e.header_names,
                last_error: e.last_error,
                last_error_at: e.last_error_at,
                last_exported_at: e.last_exported_at,
                pending: e.pending,
            }),
        }
    }
}

impl ProjectPatchBody {
    /// The change the body asks for, in the core's words.
    pub fn change(&self) -> keel_core::traces::settings::TraceSettingsChange {
        keel_core::traces::settings::TraceSettingsChange {
            trace_retention_days: self.trace_retention_days,
            otlp_export: self.otlp_export.as_ref().map(|export| {
                export.as_ref().map(|e| keel_core::traces::push::Destination {
                    endpoint: e.endpoint.clone(),
                    headers: e.headers.clone(),
                })
            }),
        }
    }
}

crate::org_scoped!(ProjectCreateBody);
