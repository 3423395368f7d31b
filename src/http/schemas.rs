//! The OpenAPI document's component schemas, for the checks that follow the document (a
//! string the document types as a string refuses NUL). The document is built from the route
//! table, above this layer, so it is installed here at start-up (`startup`) rather than
//! imported.

use std::sync::OnceLock;

use serde_json::{Map, Value};

static COMPONENTS: OnceLock<&'static Value> = OnceLock::new();

/// Installs the document's `components.schemas` (once per process; later calls change
/// nothing).
pub fn install(components: &'static Value) {
    let _ = COMPONENTS.set(components);
}

/// The component schema `name`.
pub fn component(name: &str) -> Option<&'static Value> {
    let Some(components) = COMPONENTS.get() else {
        tracing::error!(
            "the OpenAPI components were not installed: body checks that follow the document are off"
        );
        return None;
    };
    components.get(name)
}

/// Whether a schema's `type` is, or includes, `string`.
pub fn is_string_type(schema: &Map<String, Value>) -> bool {
    match schema.get("type") {
        Some(Value::String(t)) => t == "string",
        Some(Value::Array(types)) => types.iter().any(|t| t == "string"),
        _ => false,
    }
}
