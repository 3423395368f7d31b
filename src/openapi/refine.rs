//! What the document says beyond what the handlers' derives can: edits on the document's
//! JSON, each derived from the document itself so it follows the code.

use std::collections::BTreeSet;

use crate::http::schemas::is_string_type;
use keel_core::domain::EventType;
use serde_json::{json, Map, Value};

/// The pattern of a string keel stores: anything but NUL (which PostgreSQL's text refuses;
/// the service answers 422 naming the field).
pub use crate::http::schemas::STORABLE;

/// The pattern of an organization id: no NUL, and at least one character that is not
/// whitespace (the service trims an id, so an id of whitespace alone is none); or empty,
/// which an optional filter reads as absent (a required one says `minLength: 1`). The class
/// names Unicode's White_Space characters one by one, as Rust's `trim` takes them, since
/// `\s` differs between regex dialects.
pub const ORG_ID: &str = "^([^\\u0000]*[^\\u0000\\t\\n\\u000b\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000][^\\u0000]*)?$";

/// The pattern of a display name (an organization's, a project's, a dataset's): no NUL, and
/// at least one character that is not whitespace (the class as in [`ORG_ID`]).
pub const NOT_BLANK: &str = "^[^\\u0000]*[^\\u0000\\t-\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000][^\\u0000]*$";

/// The display names keel refuses blank, by schema and property.
const NAMES: [(&str, &str); 6] = [
    ("CreateOrgBody", "name"),
    ("ProjectCreateBody", "name"),
    ("DatasetCreateBody", "name"),
    ("DatasetPatchBody", "name"),
    ("ScheduleCreateBody", "name"),
    ("SchedulePatchBody", "name"),
];

/// Gives each display name of [`NAMES`] the [`NOT_BLANK`] pattern.
pub fn names(doc: &mut Value) {
    for (schema, property) in NAMES {
        if let Some(field) = doc.pointer_mut(&format!("/components/schemas/{schema}/properties/{property}")) {
            field["pattern"] = json!(NOT_BLANK);
        }
    }
}

/// A UUID in a spelling the service reads (hyphenated, 32 hex digits, braced, or a URN), as
/// a pattern: `format: uuid` alone is an annotation in JSON Schema 2020-12.
pub use crate::http::schemas::UUID;

/// The start of an RFC 3339 date-time (`2026-11-24T10:00:00Z`).
pub const DATE_TIME: &str = "^[0-9]{4}-[0-9]{2}-[0-9]{2}T";

/// Serde's internally tagged enums come out of utoipa as `oneOf` of `allOf [variant, {tag}]`,
/// which no body can satisfy when the variant forbids unknown fields. Each variant gets the
/// tag as a property of its own, and the union a discriminator on it.
pub fn tagged_unions(doc: &mut Value) {
    let Some(schemas) = doc
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    let mut unions = Vec::new();
    for (name, schema) in schemas.iter() {
        let Some(items) = schema.get("oneOf").and_then(Value::as_array) else {
            continue;
        };
        let variants: Option<Vec<(String, String, String)>> = items.iter().map(tagged_variant).collect();
        if let Some(variants) = variants.filter(|v| !v.is_empty()) {
            let tag = variants[0].0.clone();
            if variants.iter().all(|(t, _, _)| *t == tag) {
                unions.push((name.clone(), tag, variants));
            }
        }
    }
    for (name, tag, variants) in unions {
        let mut mapping = Map::new();
        let mut refs = Vec::new();
        for (_, value, reference) in &variants {
            let variant = reference.trim_start_matches("#/components/schemas/");
            if let Some(Value::Object(target)) = schemas.get_mut(variant) {
                let properties = target.entry("properties").or_insert_with(|| json!({}));
                if let Value::Object(properties) = properties {
                    properties.insert(tag.clone(), json!({"type": "string", "enum": [value]}));
                }
                let required = target.entry("required").or_insert_with(|| json!([]));
                if let Value::Array(required) = required {
                    if !required.contains(&json!(tag)) {
                        required.insert(0, json!(tag));
                    }
                }
            }
            mapping.insert(value.clone(), json!(reference));
            refs.push(json!({"$ref": reference}));
        }
        if let Some(Value::Object(union)) = schemas.get_mut(&name) {
            union.insert("oneOf".into(), Value::Array(refs));
            union.insert(
                "discriminator".into(),
                json!({"propertyName": tag, "mapping": mapping}),
            );
        }
    }
}

/// `(tag, value, $ref)` of `{"allOf": [{"$ref": ...}, {"properties": {tag: {"enum": [value]}}}]}`.
fn tagged_variant(item: &Value) -> Option<(String, String, String)> {
    let parts = item.get("allOf")?.as_array()?;
    let [reference, tag] = parts.as_slice() else {
        return None;
    };
    let reference = reference.get("$ref")?.as_str()?.to_owned();
    let properties = tag.get("properties")?.as_object()?;
    let (name, property) = properties.iter().next().filter(|_| properties.len() == 1)?;
    let [value] = property.get("enum")?.as_array()?.as_slice() else {
        return None;
    };
    Some((name.clone(), value.as_str()?.to_owned(), reference))
}

/// Every plain string a client sends (request bodies and parameters, no pattern, format or
/// enum of its own) says it may not hold NUL. Object members declared free-form carry no
/// string schema, so free-form content stays unconstrained.
pub fn storable_strings(doc: &mut Value) {
    let mut reachable = BTreeSet::new();
    let mut pending: Vec<String> = Vec::new();
    if let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) {
        for item in paths.values_mut() {
            let Some(item) = item.as_object_mut() else {
                continue;
            };
            for operation in item.values_mut() {
                if let Some(body) = operation.pointer_mut("/requestBody/content/application~1json/schema") {
                    collect_refs(body, &mut pending);
                    constrain_strings(body);
                }
                if let Some(Value::Array(parameters)) = operation.get_mut("parameters") {
                    for parameter in parameters.iter_mut() {
                        // A list that must hold an item cannot be left out (`schema_with`
                        // loses the field's own `required`).
                        if parameter.pointer("/schema/minItems").and_then(Value::as_u64) >= Some(1) {
                            parameter["required"] = json!(true);
                        }
                    }
                    for parameter in parameters {
                        if parameter.get("in").and_then(Value::as_str) == Some("header") {
                            continue;
                        }
                        if let Some(schema) = parameter.get_mut("schema") {
                            collect_refs(schema, &mut pending);
                            constrain_strings(schema);
                        }
                    }
                }
            }
        }
    }
    let Some(schemas) = doc
        .pointer_mut("/components/schemas")
        .and_then(Value::as_object_mut)
    else {
        return;
    };
    while let Some(name) = pending.pop() {
        if !reachable.insert(name.clone()) {
            continue;
        }
        if let Some(schema) = schemas.get_mut(&name) {
            collect_refs(schema, &mut pending);
            constrain_strings(schema);
        }
    }
}

/// Every `orgId` a client sends (a parameter, a body's property) takes [`ORG_ID`]'s pattern.
pub fn org_ids(doc: &mut Value) {
    fn walk(value: &mut Value) {
        match value {
            Value::Object(map) => {
                // An id the service reads as a UUID keeps its format (and its UUID pattern).
                let free_text = |schema: &Map<String, Value>| {
                    is_string_type(schema) && schema.get("format").and_then(Value::as_str) != Some("uuid")
                };
                if matches!(map.get("name").and_then(Value::as_str), Some("orgId" | "org_id")) {
                    if let Some(Value::Object(schema)) = map.get_mut("schema") {
                        if free_text(schema) {
                            schema.insert("pattern".into(), json!(ORG_ID));
                        }
                    }
                }
                for name in ["orgId", "org_id"] {
                    if let Some(Value::Object(schema)) =
                        map.get_mut("properties").and_then(|p| p.get_mut(name))
                    {
                        if free_text(schema) {
                            schema.insert("pattern".into(), json!(ORG_ID));
                        }
                    }
                }
                map.iter_mut()
                    .filter(|(key, _)| !matches!(key.as_str(), "example" | "examples" | "default"))
                    .for_each(|(_, v)| walk(v));
            }
            Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    if let Some(paths) = doc.get_mut("paths") {
        walk(paths);
    }
    if let Some(schemas) = doc.pointer_mut("/components/schemas") {
        walk(schemas);
    }
}

fn collect_refs(schema: &Value, into: &mut Vec<String>) {
    match schema {
        Value::Object(map) => {
            if let Some(Value::String(reference)) = map.get("$ref") {
                if let Some(name) = reference.strip_prefix("#/components/schemas/") {
                    into.push(name.to_owned());
                }
            }
            map.values().for_each(|v| collect_refs(v, into));
        }
        Value::Array(items) => items.iter().for_each(|v| collect_refs(v, into)),
        _ => {}
    }
}

fn constrain_strings(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            // A date-time the service parses starts with its date; the format alone is an
            // annotation in JSON Schema 2020-12, which a generator may ignore.
            if is_string_type(map)
                && map.get("format").and_then(Value::as_str) == Some("date-time")
                && !map.contains_key("pattern")
            {
                map.insert("pattern".into(), json!(DATE_TIME));
            }
            if is_string_type(map)
                && map.get("format").and_then(Value::as_str) == Some("uuid")
                && !map.contains_key("pattern")
            {
                map.insert("pattern".into(), json!(UUID));
            }
            let plain = is_string_type(map)
                && !["pattern", "format", "enum", "const"]
                    .iter()
                    .any(|k| map.contains_key(*k));
            if plain {
                map.insert("pattern".into(), json!(STORABLE));
            }
            for (key, value) in map.iter_mut() {
                // Examples and defaults are data, not schemas.
                if key != "example" && key != "examples" && key != "default" {
                    constrain_strings(value);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(constrain_strings),
        _ => {}
    }
}

/// Bodies whose validation needs one of several sets of members (the spec's alternatives):
/// each alternative names members that must then be present and not null.
/// Members with their JSON type.
type Members = &'static [(&'static str, &'static str)];

const ALTERNATIVES: &[(&str, &[Members])] = &[
    // Serving usage names its organization by the adapter, or by orgId with a base model.
    (
        "ServingUsageBody",
        &[
            &[("adapterId", "string")],
            &[("model", "string"), ("orgId", "string")],
        ],
    ),
];

/// Bodies where a flag being true requires more members: (schema, flag, members and types).
const WHEN_TRUE: &[(&str, &str, Members)] = &[
    // Auto top-up on needs its threshold and amount.
    (
        "AutoTopupBody",
        "enabled",
        &[("thresholdCents", "integer"), ("amountCents", "integer")],
    ),
];

/// Writes [`ALTERNATIVES`] as `anyOf` on their schemas.
pub fn alternatives(doc: &mut Value) {
    for (schema, alternatives) in ALTERNATIVES {
        let pointer = format!("/components/schemas/{schema}");
        let Some(Value::Object(target)) = doc.pointer_mut(&pointer) else {
            continue;
        };
        let any_of: Vec<Value> = alternatives
            .iter()
            .map(|members| {
                let properties: Map<String, Value> = members
                    .iter()
                    .map(|(name, kind)| ((*name).to_owned(), json!({"type": kind})))
                    .collect();
                let required: Vec<&str> = members.iter().map(|(name, _)| *name).collect();
                json!({"properties": properties, "required": required})
            })
            .collect();
        target.insert("anyOf".into(), Value::Array(any_of));
    }
    for (schema, flag, members) in WHEN_TRUE {
        let pointer = format!("/components/schemas/{schema}");
        let Some(Value::Object(target)) = doc.pointer_mut(&pointer) else {
            continue;
        };
        let properties: Map<String, Value> = members
            .iter()
            .map(|(name, kind)| ((*name).to_owned(), json!({"type": kind})))
            .collect();
        let required: Vec<&str> = members.iter().map(|(name, _)| *name).collect();
        target.insert(
            "if".into(),
            json!({"properties": {*flag: {"const": true}}, "required": [flag]}),
        );
        target.insert(
            "then".into(),
            json!({"properties": properties, "required": required}),
        );
    }
}

/// Links from the operations that create something to those that read or change it, so a
/// client (and schemathesis' stateful phase) can follow them.
pub fn links(doc: &mut Value) {
    let links: &[(&str, &str, &str, &str, &str, &str, &str)] = &[
        // (path, method, status, link name, target operationId, parameter, expression)
        (
            "/api/projects",
            "post",
            "201",
            "GetProject",
            "get_project",
            "project_id",
            "$response.body#/id",
        ),
        (
            "/api/training/jobs",
            "post",
            "202",
            "GetJob",
            "get_job",
            "job_id",
            "$response.body#/jobId",
        ),
        (
            "/api/training/jobs",
            "post",
            "202",
            "StopJob",
            "stop_job",
            "job_id",
            "$response.body#/jobId",
        ),
        (
            "/api/training/schedules",
            "post",
            "201",
            "GetSchedule",
            "get_schedule",
            "schedule_id",
            "$response.body#/scheduleId",
        ),
        (
            "/api/training/schedules",
            "post",
            "201",
            "UpdateSchedule",
            "update_schedule",
            "schedule_id",
            "$response.body#/scheduleId",
        ),
        (
            "/api/training/schedules",
            "post",
            "201",
            "DeleteSchedule",
            "delete_schedule",
            "schedule_id",
            "$response.body#/scheduleId",
        ),
        (
            "/api/training/schedules",
            "post",
            "201",
            "RunSchedule",
            "run_schedule",
            "schedule_id",
            "$response.body#/scheduleId",
        ),
        (
            "/api/runs",
            "post",
            "200",
            "UpdateRun",
            "update_run",
            "run_id",
            "$response.body#/runId",
        ),
        (
            "/api/runs",
            "post",
            "200",
            "LinkTracker",
            "link_tracker",
            "run_id",
            "$response.body#/runId",
        ),
        (
            "/api/api-keys",
            "post",
            "201",
            "RevokeKey",
            "revoke_key",
            "api_key_id",
            "$response.body#/apiKeyId",
        ),
        (
            "/api/internal/orgs",
            "post",
            "201",
            "PutMember",
            "put_member",
            "org_id",
            "$response.body#/orgId",
        ),
        (
            "/api/internal/orgs",
            "post",
            "201",
            "CreateApiKey",
            "create_api_key",
            "org_id",
            "$response.body#/orgId",
        ),
        (
            "/api/internal/orgs",
            "post",
            "201",
            "DeleteOrg",
            "delete_org",
            "org_id",
            "$response.body#/orgId",
        ),
        (
            "/api/internal/orgs/{org_id}/api-keys",
            "post",
            "201",
            "RevokeApiKey",
            "revoke_api_key",
            "api_key_id",
            "$response.body#/apiKeyId",
        ),
    ];
    for (path, method, status, name, target, parameter, expression) in links {
        let pointer = format!("{}/responses/{status}", operation_pointer(method, path));
        if let Some(Value::Object(response)) = doc.pointer_mut(&pointer) {
            let links = response.entry("links").or_insert_with(|| json!({}));
            if let Value::Object(links) = links {
                links.insert(
                    (*name).to_owned(),
                    json!({"operationId": target, "parameters": {*parameter: expression}}),
                );
            }
        }
    }
}

/// The JSON pointer of the operation `method path` in the document.
fn operation_pointer(method: &str, path: &str) -> String {
    format!("/paths/{}/{method}", path.replace('~', "~0").replace('/', "~1"))
}

/// Sets each `(method, path, example)` as its request body's example.
pub fn request_examples(doc: &mut Value, examples: Vec<(&str, &str, Value)>) {
    for (method, path, example) in examples {
        let pointer = format!(
            "{}/requestBody/content/application~1json",
            operation_pointer(method, path)
        );
        if let Some(Value::Object(content)) = doc.pointer_mut(&pointer) {
            content.insert("example".into(), example);
        }
    }
}

/// A JSON body whose object has no required member (and no `minProperties`) may be left out, or sent as `null`: the
/// service reads both as `{}` (`ValidJson`), so the document says the body is not required
/// and may be null.
pub fn optional_bodies(doc: &mut Value) {
    let components = doc.pointer("/components/schemas").cloned().unwrap_or_default();
    let Some(paths) = doc.get_mut("paths").and_then(Value::as_object_mut) else {
        return;
    };
    for item in paths.values_mut() {
        let Some(item) = item.as_object_mut() else {
            continue;
        };
        for operation in item.values_mut() {
            let Some(body) = operation.get_mut("requestBody") else {
                continue;
            };
            let schema = body
                .pointer("/content/application~1json/schema")
                .cloned()
                .unwrap_or_default();
            let object = match schema.get("$ref").and_then(Value::as_str) {
                Some(reference) => components
                    .get(reference.trim_start_matches("#/components/schemas/"))
                    .cloned()
                    .unwrap_or_default(),
                None => schema,
            };
            let is_object =
                object.get("type") == Some(&json!("object")) && object.get("properties").is_some();
            let requires_none = object
                .get("required")
                .and_then(Value::as_array)
                .is_none_or(|required| required.is_empty())
                && object.get("minProperties").is_none();
            if is_object && requires_none {
                body["required"] = json!(false);
                if let Some(schema) = body.pointer_mut("/content/application~1json/schema") {
                    let object = schema.take();
                    *schema = json!({"oneOf": [{"type": "null"}, object]});
                }
            }
        }
    }
}

/// Bodies whose fields are each optional but which must name one of them (a change with
/// nothing in it is 422): `minProperties: 1`, which also keeps them required. (utoipa's own
/// `min_properties` container attribute writes `maxProperties`.)
pub fn at_least_one(doc: &mut Value, schemas: &[&str]) {
    for name in schemas {
        if let Some(schema) = doc.pointer_mut(&format!("/components/schemas/{name}")) {
            schema["minProperties"] = json!(1);
        }
    }
}

/// The URLs keel calls (webhook endpoints, OTLP exports): the pattern of what
/// `webhooks::destination::check_url` parses and takes, `https://` only unless `allow_http`.
pub fn destinations(doc: &mut Value, allow_http: bool) {
    for url in [
        "/components/schemas/EndpointCreateBody/properties/url",
        "/components/schemas/EndpointPatchBody/properties/url",
        "/components/schemas/OtlpExportBody/properties/endpoint",
    ] {
        if let Some(url) = doc.pointer_mut(url) {
            url["pattern"] = json!(keel_core::webhooks::destination::url_pattern(allow_http));
        }
    }
}

/// What each event's `data` is, as a schema.
fn event_data(event_type: EventType) -> (Value, &'static str) {
    let declined = json!({
        "type": "object",
        "required": ["amountCents", "paymentMethod", "reason"],
        "properties": {
            "amountCents": {"type": "integer"},
            "paymentMethod": {"type": "string", "description": "The card's payment method id."},
            "reason": {"type": "string", "description": "The processor's message (at most 1,000 characters)."}
        }
    });
    match event_type {
        EventType::JobSucceeded
        | EventType::JobFailed
        | EventType::JobBlocked
        | EventType::JobUserStopped => (
            json!({"$ref": "#/components/schemas/JobView"}),
            "A job ended so: `data` is the job's view, as `GET /api/training/jobs/{id}` answers it.",
        ),
        EventType::JobCancelled => (
            json!({"$ref": "#/components/schemas/JobView"}),
            "A job waiting for its dependencies (`dependsOn`) was cancelled: one of them ended \
             without success (`error` names it). `data` is the job's view.",
        ),
        EventType::TopupSucceeded => (
            json!({"$ref": "#/components/schemas/LedgerEntryView"}),
            "A top-up was credited: `data` is its ledger entry.",
        ),
        EventType::AutoTopupSucceeded => (
            json!({"$ref": "#/components/schemas/LedgerEntryView"}),
            "An auto top-up was credited: `data` is its ledger entry.",
        ),
        EventType::TopupFailed => (declined, "A top-up's charge was declined."),
        EventType::AutoTopupFailed => (declined, "An auto top-up's charge was declined."),
        EventType::BalanceLow => (
            json!({
                "type": "object",
                "required": ["balanceMicrocents", "thresholdCents"],
                "properties": {
                    "balanceMicrocents": {"type": "integer"},
                    "thresholdCents": {"type": "integer"}
                }
            }),
            "The balance fell from at or above the organization's auto top-up threshold (or \
             `billing.low_balance_cents` when it has none) to under it: once per crossing.",
        ),
        EventType::CreditExpiring => (
            json!({
                "type": "object",
                "required": ["grantId", "kind", "remainingMicrocents", "expiresAt"],
                "properties": {
                    "grantId": {"type": "string"},
                    "kind": {"type": "string"},
                    "remainingMicrocents": {"type": "integer"},
                    "expiresAt": {"type": "string", "format": "date-time"}
                }
            }),
            "A credit grant expires within 7 days (sent once per grant).",
        ),
        EventType::CreditExpired => (
            json!({
                "type": "object",
                "required": ["grantId", "expiredMicrocents"],
                "properties": {"grantId": {"type": "string"}, "expiredMicrocents": {"type": "integer"}}
            }),
            "A credit grant expired: what was left of it became an `expiry` ledger entry.",
        ),
        EventType::AutoTopupLimitReached => (
            json!({
                "type": "object",
                "required": ["month", "monthlyLimitCents", "chargedCents"],
                "properties": {
                    "month": {"type": "string", "description": "YYYY-MM (UTC)"},
                    "monthlyLimitCents": {"type": "integer"},
                    "chargedCents": {"type": "integer"}
                }
            }),
            "An auto top-up was not charged: it would have taken the month past its cap (sent once a month).",
        ),
        EventType::DatasetVersionCreated => (
            json!({
                "type": "object",
                "required": ["datasetId", "projectId", "name", "version"],
                "properties": {
                    "datasetId": {"type": "string", "format": "uuid"},
                    "projectId": {"type": "string", "format": "uuid"},
                    "name": {"type": "string"},
                    "version": {
                        "type": "object",
                        "required": ["version", "createdAt", "filter", "counts", "skipped", "sha256"],
                        "properties": {
                            "version": {"type": "integer"},
                            "createdAt": {"type": "string", "format": "date-time"},
                            "filter": {"type": ["object", "null"]},
                            "counts": {"$ref": "#/components/schemas/SplitCounts"},
                            "skipped": {"type": "integer"},
                            "sha256": {"$ref": "#/components/schemas/SplitDigests"}
                        }
                    }
                }
            }),
            "A dataset version was made (a dataset's first, or `POST /api/datasets/{id}/versions`).",
        ),
        EventType::WebhookTest => (
            json!({
                "type": "object",
                "required": ["endpointId"],
                "properties": {"endpointId": {"type": "string"}}
            }),
            "Sent by `POST /api/webhooks/endpoints/{id}/test`, whatever the endpoint subscribes to.",
        ),
    }
}

/// The `webhooks` section (OpenAPI 3.1): one operation per event keel sends, the request it
/// makes to an endpoint: Standard Webhooks headers and `{id, type, createdAt, orgId, data}`.
pub fn webhooks(doc: &mut Value, event_types: &[EventType]) {
    let header = |name: &str, description: &str| json!({"name": name, "in": "header", "required": true, "description": description, "schema": {"type": "string"}});
    let mut section = Map::new();
    for &event_type in event_types {
        let (data, description) = event_data(event_type);
        let operation = json!({
            "post": {
                "operationId": format!("webhook_{}", event_type.as_str().replace('.', "_")),
                "tags": ["webhooks"],
                "summary": format!("`{event_type}`"),
                "description": description,
                "parameters": [
                    header("webhook-id", "The event's id (`evt_…`): the same on every attempt, for deduplication."),
                    header("webhook-timestamp", "Unix seconds when this attempt was signed."),
                    header("webhook-signature", "`v1,<base64 HMAC-SHA256 of \"{id}.{timestamp}.{body}\">`, keyed by the endpoint secret's decoded bytes; two, space-separated, during a rotation."),
                ],
                "requestBody": {
                    "required": true,
                    "content": {"application/json": {"schema": {
                        "type": "object",
                        "required": ["id", "type", "createdAt", "orgId", "data"],
                        "properties": {
                            "id": {"type": "string"},
                            "type": {"const": event_type.as_str()},
                            "createdAt": {"type": "string", "format": "date-time"},
                            "orgId": {"type": "string"},
                            "data": data
                        }
                    }}}
                },
                "responses": {
                    "2XX": {"description": "Received. Any other answer, or none within 10 s, is retried after 5 s, 5 min, 30 min, 2 h, 5 h, 10 h and 10 h."}
                }
            }
        });
        section.insert(event_type.as_str().to_owned(), operation);
    }
    doc["webhooks"] = Value::Object(section);
}

/// A schedule's `cron` takes the shape [`CRON_PATTERN`] states, and its `timezone` that of
/// [`ZONE_PATTERN`] (what they mean the service checks: a 422 naming the field).
///
/// [`CRON_PATTERN`]: keel_core::queue::schedules::cadence::CRON_PATTERN
/// [`ZONE_PATTERN`]: keel_core::queue::schedules::cadence::ZONE_PATTERN
/// A pipeline's names in a job's create body: an item's `ref`, and each `dependsOn` entry
/// (`ref:` and a ref, or a job id).
pub fn pipelines(doc: &mut Value) {
    for schema in ["TracerJob", "DraftJob", "OptimizeJob", "TrainingJob"] {
        let Some(properties) = doc.pointer_mut(&format!("/components/schemas/{schema}/properties")) else {
            continue;
        };
        if let Some(reference) = properties.get_mut("ref") {
            reference["pattern"] = json!(crate::queue::routes::REF_PATTERN);
        }
        if let Some(items) = properties.pointer_mut("/dependsOn/items") {
            items["pattern"] = json!(crate::queue::routes::depends_on_pattern());
        }
    }
}

pub fn schedules(doc: &mut Value) {
    use keel_core::queue::schedules::cadence::{CRON_PATTERN, ZONE_PATTERN};
    for schema in ["ScheduleCreateBody", "SchedulePatchBody"] {
        let Some(properties) = doc.pointer_mut(&format!("/components/schemas/{schema}/properties")) else {
            continue;
        };
        if let Some(cron) = properties.get_mut("cron") {
            cron["pattern"] = json!(CRON_PATTERN);
        }
        if let Some(zone) = properties.get_mut("timezone") {
            zone["pattern"] = json!(ZONE_PATTERN);
        }
    }
}
