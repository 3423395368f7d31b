//! The OpenAPI 3.1 document of every route, generated from the route table (`crate::routes`).
//!
//! Each handler declares what is particular to it (body, parameters, its own answers, which
//! credentials it takes). What every route shares is added here, from what the route
//! declares, so the two cannot disagree: a route that takes a credential can answer 401
//! and (unless it takes every kind) 403, one with a body or a query or path parameter can
//! answer 422, one with a path parameter can answer 404.

use utoipa::openapi::path::{Operation, ParameterIn};
use utoipa::openapi::response::ResponseBuilder;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Content, OpenApi as Document, Ref, RefOr};
use utoipa::{Modify, OpenApi};

use crate::error::{ErrorBody, ValidationErrorBody};

mod examples;
mod refine;

pub use refine::{ORG_ID, STORABLE};

/// The three kinds of credential (CONTRACT §2), all sent as `Authorization: Bearer`.
pub const INTERNAL_KEY: &str = "internalKey";
pub const API_KEY: &str = "apiKey";
pub const SESSION: &str = "session";

#[derive(OpenApi)]
#[openapi(
    info(
        title = "keel",
        version = "0.1.0",
        description = "Organization-scoped model-training platform: prepaid billing, projects and runs, a \
training-job queue for workers, serving authorization and metering, and a recording proxy for \
OpenAI-compatible chat completions whose traces export as training datasets.\n\n\
Every credential travels as `Authorization: Bearer <token>`; each operation names the kinds it \
takes. A session names its organization with `orgId` (body or query) or the `X-Org-Id` header. \
Errors are `{\"detail\": \"...\"}`, and 422 is FastAPI's list of `{loc, msg, type}`."
    ),
    components(schemas(ErrorBody, ValidationErrorBody, crate::schemas::DeliveryStatus, crate::schemas::JobStatus)),
    modifiers(&Credentials)
)]
struct Root;

struct Credentials;

impl Modify for Credentials {
    fn modify(&self, openapi: &mut Document) {
        let components = openapi.components.get_or_insert_with(Default::default);
        let bearer = |format: Option<&str>, description: &str| {
            let builder = HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some(description));
            let builder = match format {
                Some(format) => builder.bearer_format(format),
                None => builder,
            };
            SecurityScheme::Http(builder.build())
        };
        components.add_security_scheme(
            INTERNAL_KEY,
            bearer(
                None,
                "An operator internal key (one of KEEL_INTERNAL_KEYS): workers, the control plane, \
                 the serving layer and operators.",
            ),
        );
        components.add_security_scheme(
            API_KEY,
            bearer(
                None,
                "A user API key, `keel_sk_...`: acts as a member of its own organization.",
            ),
        );
        components.add_security_scheme(
            SESSION,
            bearer(
                Some("JWT"),
                "A session token (HS256 JWT, `sub` = user id). Name the organization with `orgId` \
                 or the `X-Org-Id` header when the user belongs to several.",
            ),
        );
        let json = |schema: &str| Content::new(Some(Ref::from_schema_name(schema)));
        for (name, description, schema) in SHARED {
            components.responses.insert(
                (*name).to_owned(),
                RefOr::T(
                    ResponseBuilder::new()
                        .description(*description)
                        .content("application/json", json(schema))
                        .build(),
                ),
            );
        }
    }
}

/// Shared answers: (component name, description, body schema).
const SHARED: &[(&str, &str, &str)] = &[
    (
        "Unauthorized",
        "No credential, or one that is unknown, revoked or expired",
        "ErrorBody",
    ),
    (
        "Forbidden",
        "A credential of a kind this operation does not take, another organization's orgId, or a role too low",
        "ErrorBody",
    ),
    ("NotFound", "No such resource in the caller's organizations", "ErrorBody"),
    (
        "ValidationError",
        "Bad JSON, wrong types, out-of-bounds values, unknown fields, bad path or query parameters",
        "ValidationErrorBody",
    ),
    (
        "RequestTimeout",
        "The request's body did not arrive within `server.body_timeout_secs` (the connection closes)",
        "ErrorBody",
    ),
    (
        "UriTooLong",
        "The request's path and query are longer than 16 KiB",
        "ErrorBody",
    ),
    (
        "Unavailable",
        "The database (or the ledger, or the queue) cannot be reached now: retry",
        "ErrorBody",
    ),
];

/// Adds to `operation` the shared answers its declaration implies, keeping those it declares.
fn add_shared_answers(operation: &mut Operation) {
    let schemes: Vec<String> = operation
        .security
        .iter()
        .flatten()
        .filter_map(|requirement| serde_json::to_value(requirement).ok())
        .filter_map(|value| value.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>()))
        .flatten()
        .collect();
    let params = operation.parameters.iter().flatten();
    let has_path = params
        .clone()
        .any(|p| matches!(p.parameter_in, ParameterIn::Path));
    let has_input = operation.request_body.is_some()
        || params
            .clone()
            .any(|p| matches!(p.parameter_in, ParameterIn::Path | ParameterIn::Query));
    let every_kind = [INTERNAL_KEY, API_KEY, SESSION]
        .iter()
        .all(|kind| schemes.iter().any(|s| s == kind));
    let mut add = |status: &str, name: &str| {
        operation
            .responses
            .responses
            .entry(status.to_owned())
            .or_insert_with(|| RefOr::Ref(Ref::from_response_name(name)));
    };
    if !schemes.is_empty() {
        add("401", "Unauthorized");
        if !every_kind {
            add("403", "Forbidden");
        }
    }
    if has_path {
        add("404", "NotFound");
    }
    if has_input {
        add("422", "ValidationError");
    }
    if operation.request_body.is_some() {
        add("408", "RequestTimeout");
    }
    add("414", "UriTooLong");
    add("503", "Unavailable");
}

/// [`document_json`], built once per process.
pub fn document_value() -> &'static serde_json::Value {
    static DOCUMENT: std::sync::LazyLock<serde_json::Value> = std::sync::LazyLock::new(document_json);
    &DOCUMENT
}

/// Hands the document to the bound checks that follow it (`http::schemas`), which sit
/// below the route table the document is built from.
pub fn install_components() {
    crate::http::schemas::install(document_value());
}

/// The document as served: [`document`] with the tagged bodies' discriminators, the strings
/// the service refuses NUL in, the links between operations, and every body's example.
pub fn document_json() -> serde_json::Value {
    let mut doc = serde_json::to_value(document()).unwrap_or_default();
    refine::tagged_unions(&mut doc);
    refine::alternatives(&mut doc);
    refine::org_ids(&mut doc);
    refine::names(&mut doc);
    refine::schedules(&mut doc);
    refine::pipelines(&mut doc);
    refine::storable_strings(&mut doc);
    refine::at_least_one(&mut doc, &["ProjectPatchBody"]);
    // Checked against the lenient pattern; the served document says what this instance takes.
    refine::destinations(&mut doc, true);
    if let Some(body) = doc.pointer_mut("/components/schemas/DatasetCreateBody") {
        // A dataset selects by a filter, by ids, or both (`null` is neither).
        body["anyOf"] = serde_json::json!([
            {"required": ["filter"], "properties": {"filter": {"type": "object"}}},
            {"required": ["traceIds"], "properties": {"traceIds": {"type": "array", "minItems": 1}}}
        ]);
    }
    refine::optional_bodies(&mut doc);
    refine::links(&mut doc);
    refine::request_examples(&mut doc, examples::request_examples());
    refine::webhooks(&mut doc, &keel_core::domain::EventType::ALL);
    doc
}

/// The document as `GET /openapi.json` serves it, with what depends on this instance's
/// settings: the product events the flash route accepts, and whether a destination keel
/// calls (a webhook endpoint, an OTLP export) may be `http://` (`webhooks.allow_http`).
pub fn served(settings: &keel_core::config::Settings) -> crate::system::OpenApiJson {
    let mut doc = document_value().clone();
    if let Some(event) = doc.pointer_mut("/components/schemas/FlashProductEventBody/properties/event") {
        event["enum"] = serde_json::json!(settings.flash.event_allowlist);
    }
    refine::destinations(&mut doc, settings.webhooks.allow_http);
    crate::system::OpenApiJson(serde_json::to_vec(&doc).unwrap_or_default().into())
}

/// The document: keel's description and security schemes, the paths of the route table,
/// and the answers every route shares.
pub fn document() -> Document {
    let mut doc = Root::openapi();
    doc.merge(crate::routes::Doc::openapi());
    for item in doc.paths.paths.values_mut() {
        let operations = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ];
        for operation in operations.into_iter().flatten() {
            add_shared_answers(operation);
        }
    }
    doc
}
