//! Traces as OpenTelemetry spans (OTLP/JSON `ExportTraceServiceRequest`), one span per trace,
//! following the GenAI semantic conventions, so Langfuse, Phoenix or any OTLP collector can
//! import a keel dataset. OTLP/JSON writes ids in hex, enums as numbers and 64-bit integers
//! as strings.

use entities::trace;
use serde_json::{json, Value};

use super::marks::Marks;

/// What comes before a page's spans: one resource (`service.name` keel), one scope.
pub fn document_head() -> String {
    format!(
        r#"{{"resourceSpans":[{{"resource":{{"attributes":[{{"key":"service.name","value":{{"stringValue":"keel"}}}}]}},"scopeSpans":[{{"scope":{{"name":"keel","version":"{}"}},"spans":["#,
        env!("CARGO_PKG_VERSION")
    )
}

/// What comes after them.
pub const DOCUMENT_TAIL: &str = "]}]}]}";

/// The GenAI conventions' name of a keel provider (`gen_ai.provider.name`).
fn provider_name(provider: &str) -> &str {
    match provider {
        "google" => "gcp.gemini",
        other => other,
    }
}

fn string(key: &str, value: impl Into<String>) -> Value {
    json!({"key": key, "value": {"stringValue": value.into()}})
}

fn int(key: &str, value: i64) -> Value {
    json!({"key": key, "value": {"intValue": value.to_string()}})
}

/// A message's content as the conventions' parts: text parts (and, for a tool call, its
/// name and arguments).
fn parts(message: &Value) -> Vec<Value> {
    let mut parts = Vec::new();
    match message.get("content") {
        Some(Value::String(text)) => parts.push(json!({"type": "text", "content": text})),
        Some(Value::Array(items)) => {
            for item in items {
                if let Some(text) = item.get("text").and_then(Value::as_str) {
                    parts.push(json!({"type": "text", "content": text}));
                }
            }
        }
        _ => {}
    }
    for call in message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        parts.push(json!({
            "type": "tool_call",
            "id": call.get("id"),
            "name": call.pointer("/function/name"),
            "arguments": call.pointer("/function/arguments"),
        }));
    }
    parts
}

/// One trace as a span.
pub fn span(t: &trace::Model, marks: &Marks) -> Value {
    let request: Value = serde_json::from_str(&t.request).unwrap_or(Value::Null);
    let response: Value = t
        .response
        .as_deref()
        .and_then(|r| serde_json::from_str(r).ok())
        .unwrap_or(Value::Null);
    let mut attributes = vec![
        string("gen_ai.operation.name", "chat"),
        string("gen_ai.provider.name", provider_name(&t.provider)),
        string("gen_ai.system", provider_name(&t.provider)),
        string("keel.project_id", t.project_id.as_str()),
        string("keel.trace_id", t.id.as_str()),
    ];
    if let Some(model) = &t.model {
        attributes.push(string("gen_ai.request.model", model.as_str()));
    }
    if let Some(model) = response.get("model").and_then(Value::as_str) {
        attributes.push(string("gen_ai.response.model", model));
    }
    if let Some(id) = response.get("id").and_then(Value::as_str) {
        attributes.push(string("gen_ai.response.id", id));
    }
    if let Some(tokens) = t.prompt_tokens {
        attributes.push(int("gen_ai.usage.input_tokens", tokens));
    }
    if let Some(tokens) = t.completion_tokens {
        attributes.push(int("gen_ai.usage.output_tokens", tokens));
    }
    let input: Vec<Value> = request
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|m| json!({"role": m.get("role").and_then(Value::as_str).unwrap_or("user"), "parts": parts(m)}))
        .collect();
    attributes.push(string("gen_ai.input.messages", Value::from(input).to_string()));
    let choices = response.get("choices").and_then(Value::as_array);
    let output: Vec<Value> = choices
        .into_iter()
        .flatten()
        .filter_map(|choice| {
            let message = choice.get("message")?;
            Some(json!({
                "role": message.get("role").and_then(Value::as_str).unwrap_or("assistant"),
                "parts": parts(message),
                "finish_reason": choice.get("finish_reason").and_then(Value::as_str).unwrap_or(""),
            }))
        })
        .collect();
    let finish_reasons: Vec<Value> = output
        .iter()
        .filter_map(|m| {
            m["finish_reason"]
                .as_str()
                .filter(|r| !r.is_empty())
                .map(|r| json!({"stringValue": r}))
        })
        .collect();
    attributes.push(string("gen_ai.output.messages", Value::from(output).to_string()));
    if !finish_reasons.is_empty() {
        attributes.push(json!({"key": "gen_ai.response.finish_reasons", "value": {"arrayValue": {"values": finish_reasons}}}));
    }
    if !marks.tags.is_empty() {
        let tags: Vec<Value> = marks.tags.iter().map(|t| json!({"stringValue": t})).collect();
        attributes.push(json!({"key": "keel.tags", "value": {"arrayValue": {"values": tags}}}));
    }
    for (name, score) in &marks.scores {
        attributes.push(json!({"key": format!("keel.score.{name}"), "value": {"doubleValue": score.value}}));
    }
    let failed = super::status_of(t.status_code, t.complete, t.error.as_deref()) == "error";
    let status = match (&t.error, failed) {
        (Some(error), _) => {
            attributes.push(string("error.type", "upstream_error"));
            json!({"code": 2, "message": error})
        }
        (None, true) => {
            attributes.push(string("error.type", t.status_code.to_string()));
            json!({"code": 2, "message": format!("the provider answered {}", t.status_code)})
        }
        (None, false) => json!({"code": 1}),
    };
    let end = t.created_at.timestamp_nanos_opt().unwrap_or(0);
    let start = end - t.latency_ms.saturating_mul(1_000_000);
    let hex = t.id.as_str().replace('-', "");
    let model = t.model.as_deref().unwrap_or("unknown");
    json!({
        "traceId": hex,
        "spanId": &hex[16..],
        "name": format!("chat {model}"),
        "kind": 3,
        "startTimeUnixNano": start.to_string(),
        "endTimeUnixNano": end.to_string(),
        "attributes": attributes,
        "status": status,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_is_a_client_span_with_the_gen_ai_attributes() {
        let t = trace::Model {
            id: crate::domain::TraceId::parse("0193c2f0-7a1e-7c55-9b1d-3e4f5a6b7c8d").unwrap(),
            org_id: crate::domain::OrgId::parse("org").unwrap(),
            project_id: crate::domain::ProjectId::parse("00000000-0000-4000-8000-00000000000a").unwrap(),
            provider: "openai".into(),
            model: Some("gpt-4o-mini".into()),
            request: r#"{"messages":[{"role":"user","content":"Capital of France?"}]}"#.into(),
            response: Some(r#"{"id":"chatcmpl-1","model":"gpt-4o-mini-2024-07-18","choices":[{"message":{"role":"assistant","content":"Paris."},"finish_reason":"stop"}]}"#.into()),
            status_code: 200,
            stream: false,
            complete: true,
            latency_ms: 420,
            ttfb_ms: None,
            prompt_tokens: Some(24),
            completion_tokens: Some(8),
            total_tokens: Some(32),
            usage_estimated: false,
            error: None,
            created_at: chrono::DateTime::from_timestamp(1_764_000_000, 0).unwrap(),
            search_text: None,
            preview_input: None,
            preview_output: None,
        };
        let span = span(&t, &Marks::default());
        assert_eq!(span["traceId"], "0193c2f07a1e7c559b1d3e4f5a6b7c8d");
        assert_eq!(span["spanId"], "9b1d3e4f5a6b7c8d");
        assert_eq!(span["kind"], 3);
        assert_eq!(span["endTimeUnixNano"], "1764000000000000000");
        assert_eq!(span["startTimeUnixNano"], "1763999999580000000");
        let attribute = |key: &str| {
            span["attributes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|a| a["key"] == key)
                .map(|a| a["value"].clone())
        };
        assert_eq!(
            attribute("gen_ai.usage.input_tokens").unwrap(),
            json!({"intValue": "24"})
        );
        assert_eq!(
            attribute("gen_ai.response.model").unwrap(),
            json!({"stringValue": "gpt-4o-mini-2024-07-18"})
        );
        let output: Value = serde_json::from_str(
            attribute("gen_ai.output.messages").unwrap()["stringValue"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            output,
            json!([{"role": "assistant", "parts": [{"type": "text", "content": "Paris."}], "finish_reason": "stop"}])
        );
        let document: Value =
            serde_json::from_str(&format!("{}{}{}", document_head(), span, DOCUMENT_TAIL)).unwrap();
        assert_eq!(
            document["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"],
            span["traceId"]
        );
    }
}
