//! Turning stored traces into dataset rows (export rules 1-5).
//!
//! - `records`: `{input, output}`. `input` is a lone user turn's bare text, or the whole
//!   conversation flattened to `<role>: <text>` lines joined by `\n`. `output` is the reply's
//!   text (content parts' text blocks joined), or `{messages: [reply]}` when it calls tools.
//! - `prompts`: `{input}` only. `raw`: the stored trace, unconverted.
//! - A trace without an extractable request/response pair (an upstream error, a reply with
//!   neither text nor tool calls, a request without messages) is skipped and counted, and so
//!   is one that is not complete (a stream that broke, or that the client left) or carries an
//!   error: only `raw` keeps those, with their `complete` and `error`.

use entities::trace;
use serde_json::{json, Value};

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    Records,
    Prompts,
    Raw,
    /// OpenAI's chat fine-tuning format: the request's messages and the reply (tools kept).
    #[serde(rename = "openai-chat")]
    OpenaiChat,
    /// OTLP/JSON: a page's traces as one `ExportTraceServiceRequest`, a span each.
    #[serde(rename = "otlp-json")]
    OtlpJson,
}

impl Format {
    pub const NAMES: &'static [&'static str] = &["records", "prompts", "raw", "openai-chat", "otlp-json"];

    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "records" => Some(Self::Records),
            "prompts" => Some(Self::Prompts),
            "raw" => Some(Self::Raw),
            "openai-chat" => Some(Self::OpenaiChat),
            "otlp-json" => Some(Self::OtlpJson),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Records => "records",
            Self::Prompts => "prompts",
            Self::Raw => "raw",
            Self::OpenaiChat => "openai-chat",
            Self::OtlpJson => "otlp-json",
        }
    }
}

/// A message's text: a string as is, content parts' `text` blocks joined.
fn text_of(content: &Value) -> Option<String> {
    super::search::texts_of(content).map(|texts| texts.concat())
}

fn parse(text: Option<&str>) -> Option<Value> {
    text.and_then(|t| serde_json::from_str(t).ok())
}

/// The dataset input of a request, or `None` when it has no messages.
pub fn input_of(request: &Value) -> Option<String> {
    let messages = request.get("messages")?.as_array().filter(|m| !m.is_empty())?;
    if let [only] = messages.as_slice() {
        if only.get("role").and_then(Value::as_str) == Some("user") {
            return only.get("content").and_then(text_of);
        }
    }
    let lines: Vec<String> = messages
        .iter()
        .map(|m| {
            let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
            let text = m
                .get("content")
                .and_then(text_of)
                .or_else(|| m.get("tool_calls").map(Value::to_string))
                .unwrap_or_default();
            format!("{role}: {text}")
        })
        .collect();
    Some(lines.join("\n"))
}

/// The dataset output of a successful reply, or `None` when there is nothing to learn from.
pub fn output_of(status_code: i32, response: &Value) -> Option<Value> {
    if !(200..300).contains(&status_code) {
        return None;
    }
    let message = response.pointer("/choices/0/message")?;
    let tool_calls = message
        .get("tool_calls")
        .and_then(Value::as_array)
        .filter(|c| !c.is_empty());
    if let Some(calls) = tool_calls {
        let mut reply = json!({
            "role": message.get("role").and_then(Value::as_str).unwrap_or("assistant"),
            "content": message.get("content").cloned().unwrap_or(Value::Null),
            "tool_calls": calls,
        });
        if reply["content"].is_array() {
            reply["content"] = json!(message.get("content").and_then(text_of));
        }
        return Some(json!({ "messages": [reply] }));
    }
    message.get("content").and_then(text_of).map(Value::String)
}

/// The stored trace, as `raw` exports it, with its tags and scores.
pub fn raw_of(t: &trace::Model, marks: &super::marks::Marks) -> Value {
    json!({
        "tags": marks.tags,
        "scores": marks.scores,
        "id": t.id,
        "projectId": t.project_id,
        "provider": t.provider,
        "model": t.model,
        "request": parse(Some(&t.request)),
        "response": parse(t.response.as_deref()),
        "statusCode": t.status_code,
        "stream": t.stream,
        "complete": t.complete,
        "latencyMs": t.latency_ms,
        "ttfbMs": t.ttfb_ms,
        "usage": {
            "prompt_tokens": t.prompt_tokens,
            "completion_tokens": t.completion_tokens,
            "total_tokens": t.total_tokens,
        },
        "usageEstimated": t.usage_estimated,
        "error": t.error,
        "createdAt": t.created_at,
    })
}

/// A trace that ended as it should: complete and without an error (its status is checked
/// by the formats themselves).
pub fn is_clean(t: &trace::Model) -> bool {
    t.complete && t.error.is_none()
}

/// One trace in `format`, or `None` when it is skipped.
pub fn convert(t: &trace::Model, format: Format, marks: &super::marks::Marks) -> Option<Value> {
    match format {
        Format::Raw => return Some(raw_of(t, marks)),
        Format::OtlpJson => return Some(super::otlp::span(t, marks)),
        Format::OpenaiChat => return openai_chat_line(&raw_of(t, marks)),
        _ => {}
    }
    // A stream that broke, or an answer carrying an error, is never a training example.
    if !is_clean(t) {
        return None;
    }
    let request = parse(Some(&t.request))?;
    let input = input_of(&request)?;
    let output = output_of(t.status_code, &parse(t.response.as_deref())?)?;
    Some(match format {
        Format::Prompts => json!({ "input": input }),
        _ => json!({ "input": input, "output": output }),
    })
}

/// A `raw` export row as one line of OpenAI's chat fine-tuning format: the request's
/// messages followed by the assistant's reply (tool calls kept), and the request's `tools`
/// and `parallel_tool_calls` beside them (a tool-calling example needs its functions'
/// schemas). `None` when the trace has no pair (no messages, an error answer, a reply with
/// neither text nor tool calls).
pub fn openai_chat_line(raw: &Value) -> Option<Value> {
    let status = raw["statusCode"].as_i64()?;
    if !(200..300).contains(&status) {
        return None;
    }
    // A broken stream or an answer with an error is never a training example.
    if raw["complete"] != Value::Bool(true) || !raw["error"].is_null() {
        return None;
    }
    let messages = raw
        .pointer("/request/messages")?
        .as_array()
        .filter(|m| !m.is_empty())?;
    let reply = raw.pointer("/response/choices/0/message")?;
    let text = match reply.get("content") {
        Some(Value::String(text)) => Some(text.clone()),
        Some(Value::Array(parts)) => {
            let texts: Vec<&str> = parts
                .iter()
                .filter(|p| p.get("type").and_then(Value::as_str).is_none_or(|t| t == "text"))
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect();
            (!texts.is_empty()).then(|| texts.concat())
        }
        _ => None,
    };
    let tool_calls = reply
        .get("tool_calls")
        .and_then(Value::as_array)
        .filter(|c| !c.is_empty());
    if text.is_none() && tool_calls.is_none() {
        return None;
    }
    let mut assistant = json!({"role": "assistant", "content": text});
    if let Some(calls) = tool_calls {
        assistant["tool_calls"] = Value::Array(calls.clone());
    }
    let mut conversation = messages.clone();
    conversation.push(assistant);
    let mut line = json!({ "messages": conversation });
    if let Some(tools) = raw
        .pointer("/request/tools")
        .filter(|t| t.as_array().is_some_and(|t| !t.is_empty()))
    {
        line["tools"] = tools.clone();
    }
    if let Some(parallel) = raw
        .pointer("/request/parallel_tool_calls")
        .filter(|p| p.is_boolean())
    {
        line["parallel_tool_calls"] = parallel.clone();
    }
    Some(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Value {
        let path = format!("{}/../tests/fixtures/chat/{name}", env!("CARGO_MANIFEST_DIR"));
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    #[test]
    fn a_lone_user_turn_is_its_bare_text() {
        let request = json!({"messages": [{"role": "user", "content": "Capital of France?"}]});
        assert_eq!(input_of(&request).unwrap(), "Capital of France?");
        assert_eq!(
            output_of(200, &fixture("completion_plain.json")).unwrap(),
            "Paris is the capital of France."
        );
    }

    #[test]
    fn a_conversation_is_flattened_with_its_system_prompt() {
        let request = json!({"messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": [{"type": "text", "text": "Capital"}, {"type": "text", "text": " of France?"}]},
        ]});
        assert_eq!(
            input_of(&request).unwrap(),
            "system: Be brief.\nuser: Hi\nassistant: Hello!\nuser: Capital of France?"
        );
    }

    #[test]
    fn a_tool_call_reply_is_kept_whole_and_multimodal_replies_keep_their_text() {
        let out = output_of(200, &fixture("completion_tool_call.json")).unwrap();
        let reply = &out["messages"][0];
        assert_eq!(reply["role"], "assistant");
        assert!(!reply["tool_calls"].as_array().unwrap().is_empty());
        assert_eq!(
            output_of(200, &fixture("completion_multimodal_content.json")).unwrap(),
            "The image shows a red bicycle leaning on a wall."
        );
    }

    #[test]
    fn errors_and_empty_requests_have_no_pair() {
        assert_eq!(output_of(401, &fixture("error_401.json")), None);
        assert_eq!(output_of(200, &json!({"choices": []})), None);
        assert_eq!(input_of(&json!({"messages": []})), None);
        assert_eq!(input_of(&json!({"prompt": "legacy"})), None);
    }
}
