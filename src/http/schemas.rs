//! The OpenAPI document's component schemas, and the one check of every body's bounds: each
//! body is validated against its own component schema (JSON Schema 2020-12, the `jsonschema`
//! crate), so a bound declared on a field (`#[schema(min_length, max_length, pattern,
//! minimum, maximum, min_items, max_items)]`) is both what the document says and what the
//! server enforces. The document is built from the route table, above this layer, so it is
//! installed here at start-up (`startup`) rather than imported.
//!
//! Types, required fields and unknown fields stay serde's (its messages are FastAPI's);
//! rules no schema can state (a field needed when another is absent, a value from the
//! configuration) stay in each body's `Validate`.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};

use jsonschema::error::ValidationErrorKind;
use jsonschema::ValidationError;
use serde_json::{json, Map, Value};

use crate::error::ValidationIssue;

static DOCUMENT: OnceLock<&'static Value> = OnceLock::new();

/// Each component's compiled schema, made on its first use.
static VALIDATORS: OnceLock<RwLock<HashMap<String, Option<Compiled>>>> = OnceLock::new();

/// A compiled schema and the object schema it was made from (the types of a query's or a
/// form's fields are read from it).
#[derive(Clone)]
struct Compiled {
    validator: Arc<jsonschema::Validator>,
    schema: Arc<Value>,
}

/// The pattern the document gives every string keel stores (no NUL), whose refusal is
/// worded for what it is.
pub const STORABLE: &str = "^[^\\u0000]*$";

/// A UUID as `uuid::Uuid::parse_str` reads it: hyphenated, 32 hex digits, braced, or a URN.
pub const UUID: &str = "^[0-9a-fA-F]{32}$|^(urn:uuid:)?[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$|^\\{[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\\}$";

/// Installs the OpenAPI document (once per process; later calls change nothing).
pub fn install(document: &'static Value) {
    let _ = DOCUMENT.set(document);
}

fn document() -> Option<&'static Value> {
    let document = DOCUMENT.get().copied();
    if document.is_none() {
        tracing::error!("the OpenAPI document was not installed: bounds are not checked");
    }
    document
}

fn components() -> Option<&'static Value> {
    document()?.pointer("/components/schemas")
}

/// The component schema `name`.
pub fn component(name: &str) -> Option<&'static Value> {
    components()?.get(name)
}

/// Whether a schema's `type` is, or includes, `string`.
pub fn is_string_type(schema: &Map<String, Value>) -> bool {
    match schema.get("type") {
        Some(Value::String(t)) => t == "string",
        Some(Value::Array(types)) => types.iter().any(|t| t == "string"),
        _ => false,
    }
}

/// The compiled schema under `key`, made by `schema` on first use (`None`: nothing to
/// check). Read under a shared lock: every body and query of every worker looks here.
fn compiled(key: &str, schema: impl FnOnce() -> Option<Value>) -> Option<Compiled> {
    let cache = VALIDATORS.get_or_init(|| RwLock::new(HashMap::new()));
    if let Some(found) = cache.read().unwrap_or_else(|p| p.into_inner()).get(key) {
        return found.clone();
    }
    let compiled = schema().and_then(|object| {
        let mut root = object.clone();
        if let (Value::Object(map), Some(components)) = (&mut root, components()) {
            map.insert(
                "$schema".into(),
                json!("https://json-schema.org/draft/2020-12/schema"),
            );
            map.insert("components".into(), json!({ "schemas": components }));
        }
        match jsonschema::options().build(&root) {
            Ok(validator) => Some(Compiled {
                validator: Arc::new(validator),
                schema: Arc::new(object),
            }),
            Err(err) => {
                tracing::error!(schema = key, error = %err, "a schema of the document does not compile");
                None
            }
        }
    });
    let mut cache = cache.write().unwrap_or_else(|p| p.into_inner());
    cache.entry(key.to_owned()).or_insert(compiled).clone()
}

fn validator(name: &str) -> Option<Arc<jsonschema::Validator>> {
    let compiled = compiled(name, || {
        if component(name).is_none() {
            // A body type whose schema the document does not hold would go unchecked: said
            // once, loudly (a test sends every documented body past its bounds).
            tracing::error!(
                schema = name,
                "a body has no component schema: its bounds are not checked"
            );
        }
        component(name).map(|_| json!({ "$ref": format!("#/components/schemas/{name}") }))
    });
    compiled.map(|c| c.validator)
}

/// The query parameters of the operation `method` `pattern` (a route pattern of the table)
/// as one object schema.
fn query_schema(method: &str, pattern: &str) -> Option<Value> {
    let path = pattern.trim_end_matches('*');
    let operation = document()?.get("paths")?.get(path)?.get(method)?;
    let mut properties = Map::new();
    for parameter in operation.get("parameters")?.as_array()? {
        if parameter["in"] == "query" {
            if let (Some(name), Some(schema)) = (parameter["name"].as_str(), parameter.get("schema")) {
                properties.insert(name.to_owned(), schema.clone());
            }
        }
    }
    (!properties.is_empty()).then(|| json!({ "type": "object", "properties": properties }))
}

/// Every bound of the operation's query parameters that `pairs` break, as 422 issues at
/// `["query", name]`.
pub fn query_issues(method: &str, pattern: &str, pairs: &[(String, String)]) -> Vec<ValidationIssue> {
    let method = method.to_ascii_lowercase();
    // The operation's parameters are read from the document once, with their compiled schema.
    let Some(Compiled { validator, schema }) =
        compiled(&format!("{method} {pattern}"), || query_schema(&method, pattern))
    else {
        return Vec::new();
    };
    let value = typed_fields(schema.get("properties").and_then(Value::as_object), pairs);
    if validator.is_valid(&value) {
        return Vec::new();
    }
    let mut issues = Vec::new();
    for error in validator.iter_errors(&value) {
        collect("query", &error, &mut issues);
    }
    issues.dedup_by(|a, b| a.loc == b.loc);
    issues
}

/// Every bound of the component schema `name` that `value` breaks, as 422 issues under
/// `root` (`"body"`): lengths, patterns, ranges and list sizes, inside nested objects, list
/// items and the alternative a tagged or nullable value takes.
pub fn bound_issues(root: &str, name: &str, value: &Value) -> Vec<ValidationIssue> {
    let Some(validator) = validator(name) else {
        return Vec::new();
    };
    // Most bodies are valid: the cheap yes first, every failure's detail only for a no.
    if validator.is_valid(value) {
        return Vec::new();
    }
    let mut issues = Vec::new();
    for error in validator.iter_errors(value) {
        collect(root, &error, &mut issues);
    }
    issues.dedup_by(|a, b| a.loc == b.loc);
    issues
}

fn collect(root: &str, error: &ValidationError<'_>, issues: &mut Vec<ValidationIssue>) {
    let kind = error.kind();
    let context = match kind {
        ValidationErrorKind::OneOfNotValid { context }
        | ValidationErrorKind::OneOfMultipleValid { context }
        | ValidationErrorKind::AnyOf { context } => Some(context),
        _ => None,
    };
    if let Some(alternatives) = context {
        // The alternative the value's shape takes (its tag, its being null or not): the one
        // whose only failures are bounds. Shapes are serde's to judge.
        if let Some(errors) = fitting(alternatives) {
            for error in errors {
                collect(root, error, issues);
            }
        }
        return;
    }
    let loc = location(root, &error.instance_path().to_string());
    let issue = match kind {
        ValidationErrorKind::MinLength { limit } => {
            let unit = if *limit == 1 { "character" } else { "characters" };
            ValidationIssue::new(
                loc,
                "string_too_short",
                format!("String should have at least {limit} {unit}"),
            )
            .with_ctx(json!({ "min_length": limit }))
        }
        ValidationErrorKind::MaxLength { limit } => {
            let unit = if *limit == 1 { "character" } else { "characters" };
            ValidationIssue::new(
                loc,
                "string_too_long",
                format!("String should have at most {limit} {unit}"),
            )
            .with_ctx(json!({ "max_length": limit }))
        }
        ValidationErrorKind::Pattern { pattern }
            if pattern == STORABLE || error.instance().as_str().is_some_and(|s| s.contains('\0')) =>
        {
            ValidationIssue::new(
                loc,
                "string_pattern_mismatch",
                "String should not contain the NUL character (\\u0000)",
            )
        }
        ValidationErrorKind::Pattern { pattern } if pattern == UUID => {
            ValidationIssue::new(loc, "uuid_parsing", "Input should be a valid UUID")
        }
        ValidationErrorKind::Pattern { pattern } => ValidationIssue::new(
            loc,
            "string_pattern_mismatch",
            format!("String should match pattern '{pattern}'"),
        )
        .with_ctx(json!({ "pattern": pattern })),
        ValidationErrorKind::Minimum { limit } => ValidationIssue::new(
            loc,
            "greater_than_equal",
            format!("Input should be greater than or equal to {limit}"),
        )
        .with_ctx(json!({ "ge": limit })),
        ValidationErrorKind::Maximum { limit } => ValidationIssue::new(
            loc,
            "less_than_equal",
            format!("Input should be less than or equal to {limit}"),
        )
        .with_ctx(json!({ "le": limit })),
        ValidationErrorKind::ExclusiveMinimum { limit } => ValidationIssue::new(
            loc,
            "greater_than",
            format!("Input should be greater than {limit}"),
        )
        .with_ctx(json!({ "gt": limit })),
        ValidationErrorKind::ExclusiveMaximum { limit } => {
            ValidationIssue::new(loc, "less_than", format!("Input should be less than {limit}"))
                .with_ctx(json!({ "lt": limit }))
        }
        // A map key the schema's `propertyNames` refuses (a NUL in a typed map's key).
        ValidationErrorKind::PropertyNames { error } => {
            let key = error.instance().as_str().unwrap_or_default().to_owned();
            let mut loc = loc;
            let message = match key.contains('\0') {
                true => "String should not contain the NUL character (\\u0000)".to_owned(),
                false => "String should match the pattern of this map's keys".to_owned(),
            };
            loc.push(Value::from(key));
            ValidationIssue::new(loc, "string_pattern_mismatch", message)
        }
        ValidationErrorKind::MinItems { limit } => {
            let len = error.instance().as_array().map_or(0, Vec::len);
            ValidationIssue::new(
                loc,
                "too_short",
                format!("List should have at least {limit} items after validation, not {len}"),
            )
            .with_ctx(json!({ "min_length": limit, "actual_length": len }))
        }
        ValidationErrorKind::MaxItems { limit } => {
            let len = error.instance().as_array().map_or(0, Vec::len);
            ValidationIssue::new(
                loc,
                "too_long",
                format!("List should have at most {limit} items after validation, not {len}"),
            )
            .with_ctx(json!({ "max_length": limit, "actual_length": len }))
        }
        _ => return,
    };
    issues.push(issue);
}

/// Whether a failure is about the value's shape (its type, fields, tag) rather than a bound.
fn is_shape_error(error: &ValidationError<'_>) -> bool {
    match error.kind() {
        ValidationErrorKind::Type { .. }
        | ValidationErrorKind::Required { .. }
        | ValidationErrorKind::AdditionalProperties { .. }
        | ValidationErrorKind::Enum { .. }
        | ValidationErrorKind::Constant { .. }
        | ValidationErrorKind::FalseSchema => true,
        // A nested choice fits when exactly one of its alternatives does.
        ValidationErrorKind::OneOfNotValid { context }
        | ValidationErrorKind::OneOfMultipleValid { context }
        | ValidationErrorKind::AnyOf { context } => fitting(context).is_none(),
        _ => false,
    }
}

/// The one alternative of a choice whose failures are all bounds (none when several or no
/// alternative's shape fits).
fn fitting<'e, 'a>(alternatives: &'e [Vec<ValidationError<'a>>]) -> Option<&'e Vec<ValidationError<'a>>> {
    let mut fits = alternatives
        .iter()
        .filter(|errors| !errors.iter().any(is_shape_error));
    match (fits.next(), fits.next()) {
        (Some(errors), None) => Some(errors),
        _ => None,
    }
}

/// The JSON value of a form's fields as the component schema `name` types them (numbers,
/// booleans, lists of repeated fields; anything unreadable left as its text), so a form
/// posted for a body is held to that body's bounds.
pub fn form_value(name: &str, fields: &[(String, String)]) -> Value {
    let properties = component(name)
        .and_then(|schema| schema.get("properties"))
        .and_then(Value::as_object);
    typed_fields(properties, fields)
}

/// Text fields as JSON values of the types `properties` give them.
fn typed_fields(properties: Option<&Map<String, Value>>, fields: &[(String, String)]) -> Value {
    let mut object = Map::new();
    for (field, text) in fields {
        let schema = properties.and_then(|p| p.get(field));
        let types = |kind: &str| {
            schema.is_some_and(|s| {
                s["type"] == kind || s["type"].as_array().is_some_and(|t| t.contains(&json!(kind)))
            })
        };
        let value = if types("integer") {
            text.parse::<i64>()
                .map_or_else(|_| Value::from(text.as_str()), Value::from)
        } else if types("number") {
            text.parse::<f64>()
                .map_or_else(|_| Value::from(text.as_str()), Value::from)
        } else if types("boolean") {
            text.parse::<bool>()
                .map_or_else(|_| Value::from(text.as_str()), Value::from)
        } else {
            Value::from(text.as_str())
        };
        if types("array") {
            match object
                .entry(field.clone())
                .or_insert_with(|| Value::Array(Vec::new()))
            {
                Value::Array(items) => items.push(value),
                other => *other = Value::Array(vec![value]),
            }
        } else {
            object.insert(field.clone(), value);
        }
    }
    Value::Object(object)
}

/// `["body", "field", 0, ...]` from a JSON pointer.
fn location(root: &str, pointer: &str) -> Vec<Value> {
    let mut loc = vec![Value::from(root)];
    for segment in pointer.split('/').skip(1) {
        let segment = segment.replace("~1", "/").replace("~0", "~");
        match segment.parse::<u64>() {
            Ok(index) => loc.push(Value::from(index)),
            Err(_) => loc.push(Value::from(segment)),
        }
    }
    loc
}

#[cfg(test)]
mod tests {
    use super::UUID;

    #[test]
    fn the_uuid_pattern_is_what_the_service_reads_as_a_uuid() {
        let pattern = regex::Regex::new(UUID).unwrap();
        let id = "0b6f5f0e-4c1a-4a44-9d5c-2f1c3e0a7b11";
        let simple = id.replace('-', "");
        for candidate in [
            id.to_owned(),
            id.to_uppercase(),
            simple.clone(),
            format!("{{{id}}}"),
            format!("urn:uuid:{id}"),
            format!("urn:uuid:{simple}"),
            format!("{{{simple}}}"),
            format!(" {id}"),
            format!("{id}\n"),
            id[1..].to_owned(),
            "0b6f5f0e4c1a-4a44-9d5c-2f1c3e0a7b11".to_owned(),
            "g".repeat(32),
            String::new(),
        ] {
            assert_eq!(
                pattern.is_match(&candidate),
                uuid::Uuid::parse_str(&candidate).is_ok(),
                "{candidate:?}"
            );
        }
    }
}
