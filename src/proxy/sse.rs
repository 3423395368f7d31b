//! Reading a streamed chat completion as the bytes pass by: an SSE parser that copes with
//! frames split at any byte, CRLF line ends, comment lines, `data:` without its space and
//! several `data:` lines per event; and an assembler that folds the chunks into the one
//! `chat.completion` object a non-streamed call would have answered.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

/// Splits a byte stream into SSE events' `data` payloads.
#[derive(Debug, Default)]
pub struct SseParser {
    line: Vec<u8>,
    data: String,
    has_data: bool,
}

impl SseParser {
    /// Feeds bytes; calls `on_data` with each complete event's data.
    pub fn push(&mut self, mut bytes: &[u8], on_data: &mut impl FnMut(&str)) {
        while let Some(end) = bytes.iter().position(|b| *b == b'\n') {
            self.line.extend_from_slice(&bytes[..end]);
            bytes = &bytes[end + 1..];
            let mut line = std::mem::take(&mut self.line);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            self.on_line(&line, on_data);
        }
        self.line.extend_from_slice(bytes);
    }

    /// The stream ended: an event without its closing blank line still counts.
    pub fn finish(&mut self, on_data: &mut impl FnMut(&str)) {
        let line = std::mem::take(&mut self.line);
        if !line.is_empty() {
            self.on_line(&line, on_data);
        }
        self.dispatch(on_data);
    }

    fn on_line(&mut self, line: &[u8], on_data: &mut impl FnMut(&str)) {
        if line.is_empty() {
            self.dispatch(on_data);
            return;
        }
        if line.starts_with(b":") {
            return;
        }
        if let Some(rest) = line.strip_prefix(b"data:") {
            let rest = rest.strip_prefix(b" ").unwrap_or(rest);
            if self.has_data {
                self.data.push('\n');
            }
            self.data.push_str(&String::from_utf8_lossy(rest));
            self.has_data = true;
        }
    }

    fn dispatch(&mut self, on_data: &mut impl FnMut(&str)) {
        if self.has_data {
            on_data(&self.data);
            self.data.clear();
            self.has_data = false;
        }
    }
}

#[derive(Debug, Default)]
struct ToolCall {
    id: Option<String>,
    kind: Option<String>,
    name: String,
    arguments: String,
}

#[derive(Debug, Default)]
struct Choice {
    role: Option<String>,
    content: Option<String>,
    refusal: Option<String>,
    tool_calls: BTreeMap<u64, ToolCall>,
    finish_reason: Value,
}

/// Folds `chat.completion.chunk`s into one `chat.completion`.
#[derive(Debug, Default)]
pub struct CompletionAssembler {
    id: Option<Value>,
    model: Option<Value>,
    created: Option<Value>,
    system_fingerprint: Option<Value>,
    choices: BTreeMap<u64, Choice>,
    usage: Option<Value>,
    error: Option<Value>,
    done: bool,
}

fn append(slot: &mut Option<String>, piece: &str) {
    slot.get_or_insert_with(String::new).push_str(piece);
}

impl CompletionAssembler {
    /// One event's data: a chunk, an error object, or `[DONE]`.
    pub fn on_data(&mut self, data: &str) {
        let data = data.trim();
        if data == "[DONE]" {
            self.done = true;
            return;
        }
        let Ok(Value::Object(chunk)) = serde_json::from_str::<Value>(data) else {
            return;
        };
        if let Some(error) = chunk.get("error") {
            self.error = Some(error.clone());
        }
        for (slot, key) in [
            (&mut self.id, "id"),
            (&mut self.model, "model"),
            (&mut self.created, "created"),
            (&mut self.system_fingerprint, "system_fingerprint"),
        ] {
            if slot.is_none() {
                *slot = chunk.get(key).filter(|v| !v.is_null()).cloned();
            }
        }
        if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(usage.clone());
        }
        for choice in chunk
            .get("choices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            self.on_choice(choice);
        }
    }

    fn on_choice(&mut self, choice: &Value) {
        let index = choice.get("index").and_then(Value::as_u64).unwrap_or(0);
        let acc = self.choices.entry(index).or_default();
        if let Some(reason) = choice.get("finish_reason").filter(|r| !r.is_null()) {
            acc.finish_reason = reason.clone();
        }
        let Some(delta) = choice.get("delta").or_else(|| choice.get("message")) else {
            return;
        };
        if let Some(role) = delta.get("role").and_then(Value::as_str) {
            acc.role = Some(role.to_owned());
        }
        if let Some(text) = delta.get("content").and_then(Value::as_str) {
            append(&mut acc.content, text);
        }
        if let Some(text) = delta.get("refusal").and_then(Value::as_str) {
            append(&mut acc.refusal, text);
        }
        for (position, call) in delta
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let index = call
                .get("index")
                .and_then(Value::as_u64)
                .unwrap_or(position as u64);
            let tool = acc.tool_calls.entry(index).or_default();
            if let Some(id) = call.get("id").and_then(Value::as_str) {
                tool.id = Some(id.to_owned());
            }
            if let Some(kind) = call.get("type").and_then(Value::as_str) {
                tool.kind = Some(kind.to_owned());
            }
            if let Some(function) = call.get("function") {
                if let Some(name) = function.get("name").and_then(Value::as_str) {
                    tool.name.push_str(name);
                }
                if let Some(arguments) = function.get("arguments").and_then(Value::as_str) {
                    tool.arguments.push_str(arguments);
                }
            }
        }
    }

    /// Whether the stream said `[DONE]`.
    pub fn is_done(&self) -> bool {
        self.done
    }

    pub fn usage(&self) -> Option<&Value> {
        self.usage.as_ref()
    }

    pub fn error(&self) -> Option<&Value> {
        self.error.as_ref()
    }

    /// The assembled `chat.completion`.
    pub fn completion(&self) -> Value {
        let choices: Vec<Value> = self
            .choices
            .iter()
            .map(|(index, c)| {
                let mut message = Map::new();
                message.insert("role".into(), json!(c.role.as_deref().unwrap_or("assistant")));
                message.insert("content".into(), json!(c.content));
                if let Some(refusal) = &c.refusal {
                    message.insert("refusal".into(), json!(refusal));
                }
                if !c.tool_calls.is_empty() {
                    let calls: Vec<Value> = c
                        .tool_calls
                        .values()
                        .map(|t| {
                            json!({
                                "id": t.id,
                                "type": t.kind.as_deref().unwrap_or("function"),
                                "function": {"name": t.name, "arguments": t.arguments},
                            })
                        })
                        .collect();
                    message.insert("tool_calls".into(), Value::Array(calls));
                }
                json!({"index": index, "message": message, "finish_reason": c.finish_reason})
            })
            .collect();
        let mut completion = json!({
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self.usage,
        });
        if let Some(fingerprint) = &self.system_fingerprint {
            completion["system_fingerprint"] = fingerprint.clone();
        }
        completion
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assemble(bytes: &[u8], split_every: usize) -> CompletionAssembler {
        let mut parser = SseParser::default();
        let mut assembler = CompletionAssembler::default();
        let mut feed = |data: &str| assembler.on_data(data);
        for piece in bytes.chunks(split_every.max(1)) {
            parser.push(piece, &mut feed);
        }
        parser.finish(&mut feed);
        assembler
    }

    #[test]
    fn plain_stream_with_a_usage_chunk_at_any_split() {
        let bytes = include_bytes!("../../tests/fixtures/chat/stream_plain_with_usage.sse");
        for split in [1, 2, 3, 7, 64, bytes.len()] {
            let a = assemble(bytes, split);
            let c = a.completion();
            assert!(a.is_done(), "split {split}");
            assert_eq!(c["object"], "chat.completion");
            assert_eq!(c["choices"][0]["message"]["role"], "assistant");
            assert!(
                c["choices"][0]["message"]["content"].as_str().unwrap().len() > 5,
                "{c}"
            );
            assert_eq!(c["choices"][0]["finish_reason"], "stop");
            assert!(c["usage"]["total_tokens"].as_u64().unwrap() > 0, "{c}");
        }
    }

    #[test]
    fn tool_calls_assemble_by_index_from_fragments() {
        let bytes = include_bytes!("../../tests/fixtures/chat/stream_two_tool_calls_no_usage.sse");
        let c = assemble(bytes, 5).completion();
        let calls = c["choices"][0]["message"]["tool_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 2);
        for call in calls {
            let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
            assert!(args.is_object());
            assert!(call["id"].is_string());
            assert!(!call["function"]["name"].as_str().unwrap().is_empty());
        }
        assert_eq!(c["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(c["usage"], Value::Null);
    }

    #[test]
    fn comments_crlf_and_usage_in_the_last_content_chunk() {
        let bytes = include_bytes!("../../tests/fixtures/chat/stream_router_comments_crlf.sse");
        let a = assemble(bytes, 4);
        let c = a.completion();
        assert!(!c["choices"][0]["message"]["content"].as_str().unwrap().is_empty());
        assert!(c["usage"].is_object(), "{c}");
    }

    #[test]
    fn several_data_lines_make_one_event_and_data_may_lack_its_space() {
        let mut parser = SseParser::default();
        let mut events = Vec::new();
        parser.push(
            b"data:{\"a\":\ndata: 1}\n\n: keep-alive\n\ndata:[DONE]",
            &mut |d| events.push(d.to_owned()),
        );
        parser.finish(&mut |d| events.push(d.to_owned()));
        assert_eq!(events, ["{\"a\":\n1}", "[DONE]"]);
    }
}
