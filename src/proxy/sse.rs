//! Reading a streamed chat completion as the bytes pass by: an SSE parser that copes with
//! frames split at any byte, CRLF line ends, comment lines, `data:` without its space and
//! several `data:` lines per event; and an assembler that folds the chunks into the one
//! `chat.completion` object a non-streamed call would have answered.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::marker::PhantomData;

use bytes::{Bytes, BytesMut};

use serde::de::value::MapAccessDeserializer;
use serde::de::{MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

/// Splits a byte stream into SSE events' `data` payloads.
#[derive(Debug, Default)]
pub struct SseParser {
    line: Vec<u8>,
    data: String,
    has_data: bool,
}

impl SseParser {
    /// Feeds bytes; calls `on_data` with each complete event's data. A line that arrives
    /// whole is read where it lies; only a line split across two pushes is copied.
    pub fn push(&mut self, mut bytes: &[u8], on_data: &mut impl FnMut(&str)) {
        while let Some(end) = memchr::memchr(b'\n', bytes) {
            let line = &bytes[..end];
            bytes = &bytes[end + 1..];
            if self.line.is_empty() {
                self.on_line(without_cr(line), on_data);
            } else {
                let mut joined = std::mem::take(&mut self.line);
                joined.extend_from_slice(line);
                self.on_line(without_cr(&joined), on_data);
                // Its room is kept for the next split line.
                joined.clear();
                self.line = joined;
            }
        }
        self.line.extend_from_slice(bytes);
    }

    /// Whether an event is unfinished: a line without its end, or data lines without the
    /// blank line that ends their event.
    pub fn has_partial(&self) -> bool {
        !self.line.is_empty() || self.has_data
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

/// A line without the CR of a CRLF ending.
fn without_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
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

/// A chunk's field kept as JSON (an id, the usage, an error): its text as the chunk holds
/// it, or its `Value` when the chunk was read as one; made a `Value` only when kept.
#[derive(Clone, Copy)]
enum Json<'a> {
    Text(&'a RawValue),
    Value(&'a Value),
}

impl Json<'_> {
    fn value(self) -> Value {
        match self {
            Json::Text(text) => serde_json::from_str(text.get()).unwrap_or(Value::Null),
            Json::Value(value) => value.clone(),
        }
    }

    fn is_object(self) -> bool {
        match self {
            Json::Text(text) => text.get().starts_with('{'),
            Json::Value(value) => value.is_object(),
        }
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Json<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        <&'a RawValue>::deserialize(deserializer).map(Json::Text)
    }
}

/// `T` read only from a JSON object: serde also reads a struct from an array (its fields
/// by position), which a `Value`'s fields never are.
struct Object<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Fields<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for Fields<T> {
            type Value = T;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(MapAccessDeserializer::new(map))
            }
        }
        deserializer.deserialize_map(Fields(PhantomData)).map(Object)
    }
}

/// A field that counts when present, even as `null` (`Option<T>` alone reads `null` as
/// absent).
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(deserializer: D) -> Result<Option<T>, D::Error> {
    T::deserialize(deserializer).map(Some)
}

/// What the assembler reads of a `chat.completion.chunk` (or of an error event). Read from
/// text, its strings are borrowed unless they hold escapes, and the rest of the chunk is
/// skipped unbuilt; a `null` counts as absent except where `present` says otherwise, as
/// with a `Value`'s fields ([`Chunk::from_object`] reads the same from one).
#[derive(Deserialize)]
struct Chunk<'a> {
    #[serde(borrow)]
    id: Option<Json<'a>>,
    #[serde(borrow)]
    model: Option<Json<'a>>,
    #[serde(borrow)]
    created: Option<Json<'a>>,
    #[serde(borrow)]
    system_fingerprint: Option<Json<'a>>,
    #[serde(borrow)]
    usage: Option<Json<'a>>,
    #[serde(borrow, default, deserialize_with = "present")]
    error: Option<Json<'a>>,
    #[serde(borrow)]
    choices: Option<Vec<Object<ChunkChoice<'a>>>>,
}

#[derive(Deserialize)]
struct ChunkChoice<'a> {
    index: Option<u64>,
    #[serde(borrow)]
    finish_reason: Option<Json<'a>>,
    /// Present (`Some`), even as `null`, it is the delta: `message` is then not read.
    #[serde(borrow, default, deserialize_with = "present")]
    delta: Option<Option<Object<Delta<'a>>>>,
    #[serde(borrow)]
    message: Option<Object<Delta<'a>>>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(borrow)]
    role: Option<Cow<'a, str>>,
    #[serde(borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(borrow)]
    refusal: Option<Cow<'a, str>>,
    #[serde(borrow)]
    tool_calls: Option<Vec<Object<ToolCallDelta<'a>>>>,
}

#[derive(Deserialize)]
struct ToolCallDelta<'a> {
    index: Option<u64>,
    #[serde(borrow)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, rename = "type")]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow)]
    function: Option<Object<FunctionDelta<'a>>>,
}

#[derive(Deserialize)]
struct FunctionDelta<'a> {
    #[serde(borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow)]
    arguments: Option<Cow<'a, str>>,
}

impl<'a> Chunk<'a> {
    /// A chunk that did not fit [`Chunk`] as text, read from its `Value` field by field: a
    /// field of another type than expected counts as absent (a choice's index as 0, a tool
    /// call's as its position), and a `delta` that is no object as an empty one.
    fn from_object(chunk: &'a Map<String, Value>) -> Self {
        let kept = |key: &str| chunk.get(key).filter(|v| !v.is_null()).map(Json::Value);
        Self {
            id: kept("id"),
            model: kept("model"),
            created: kept("created"),
            system_fingerprint: kept("system_fingerprint"),
            usage: kept("usage"),
            error: chunk.get("error").map(Json::Value),
            choices: chunk.get("choices").and_then(Value::as_array).map(|choices| {
                choices
                    .iter()
                    .map(|choice| {
                        Object(ChunkChoice {
                            index: choice.get("index").and_then(Value::as_u64),
                            finish_reason: choice
                                .get("finish_reason")
                                .filter(|r| !r.is_null())
                                .map(Json::Value),
                            delta: Some(
                                choice
                                    .get("delta")
                                    .or_else(|| choice.get("message"))
                                    .map(|delta| Object(Delta::from_value(delta))),
                            ),
                            message: None,
                        })
                    })
                    .collect()
            }),
        }
    }
}

impl<'a> Delta<'a> {
    fn from_value(delta: &'a Value) -> Self {
        let text = |value: &'a Value, key: &str| value.get(key).and_then(Value::as_str).map(Cow::Borrowed);
        Self {
            role: text(delta, "role"),
            content: text(delta, "content"),
            refusal: text(delta, "refusal"),
            tool_calls: delta.get("tool_calls").and_then(Value::as_array).map(|calls| {
                calls
                    .iter()
                    .map(|call| {
                        Object(ToolCallDelta {
                            index: call.get("index").and_then(Value::as_u64),
                            id: text(call, "id"),
                            kind: text(call, "type"),
                            function: call.get("function").map(|function| {
                                Object(FunctionDelta {
                                    name: text(function, "name"),
                                    arguments: text(function, "arguments"),
                                })
                            }),
                        })
                    })
                    .collect()
            }),
        }
    }
}

/// Where an event that ends in `bytes` ends (after its blank line), the last one.
fn last_event_end(bytes: &[u8]) -> Option<usize> {
    let lf = memchr::memmem::rfind(bytes, b"\n\n").map(|i| i + 2);
    let crlf = memchr::memmem::rfind(bytes, b"\r\n\r\n").map(|i| i + 4);
    lf.max(crlf)
}

/// Whether one event (its bytes, blank line included) is a usage-only chunk: `choices`
/// empty and `usage` an object (what `stream_options.include_usage` adds before `[DONE]`).
fn is_usage_only(event: &[u8]) -> bool {
    if memchr::memmem::find(event, b"\"choices\"").is_none()
        || memchr::memmem::find(event, b"\"usage\"").is_none()
    {
        return false;
    }
    let Ok(text) = std::str::from_utf8(event) else {
        return false;
    };
    let data: String = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| d.strip_prefix(' ').unwrap_or(d))
        .collect::<Vec<_>>()
        .join("\n");
    match serde_json::from_str::<Value>(&data) {
        Ok(Value::Object(chunk)) => {
            chunk
                .get("choices")
                .and_then(Value::as_array)
                .is_some_and(Vec::is_empty)
                && chunk.get("usage").is_some_and(Value::is_object)
        }
        _ => false,
    }
}

/// `bytes` of an event stream without its usage-only chunks (see [`is_usage_only`]). Events
/// leave whole: the bytes of one not yet whole wait in `pending`. Every other event goes out
/// exactly as it came, and a chunk of whole events without a usage chunk in it is passed on
/// as it is (no copy).
pub fn without_usage_chunks(pending: &mut BytesMut, bytes: Bytes) -> Bytes {
    let whole = bytes.ends_with(b"\n\n") || bytes.ends_with(b"\r\n\r\n");
    if pending.is_empty()
        && whole
        && memchr::memmem::find(&bytes, b"\"choices\":[]").is_none()
        && memchr::memmem::find(&bytes, b"\"choices\": []").is_none()
    {
        return bytes;
    }
    pending.extend_from_slice(&bytes);
    let Some(end) = last_event_end(pending) else {
        return Bytes::new();
    };
    let events = pending.split_to(end);
    let mut out = BytesMut::with_capacity(events.len());
    let mut rest: &[u8] = &events;
    while !rest.is_empty() {
        let lf = memchr::memmem::find(rest, b"\n\n").map(|i| i + 2);
        let crlf = memchr::memmem::find(rest, b"\r\n\r\n").map(|i| i + 4);
        let cut = match (lf, crlf) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or(rest.len()),
        };
        let (event, after) = rest.split_at(cut);
        if !is_usage_only(event) {
            out.extend_from_slice(event);
        }
        rest = after;
    }
    out.freeze()
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
        // Most chunks read straight into [`Chunk`], their strings borrowed from `data`; one
        // that does not fit it (a field of another type, a key twice) is read as a `Value`
        // and taken field by field, whatever fits.
        match serde_json::from_str::<Object<Chunk<'_>>>(data) {
            Ok(Object(chunk)) => self.on_chunk(chunk),
            Err(_) => {
                if let Ok(Value::Object(chunk)) = serde_json::from_str::<Value>(data) {
                    self.on_chunk(Chunk::from_object(&chunk));
                }
            }
        }
    }

    fn on_chunk(&mut self, chunk: Chunk<'_>) {
        if let Some(error) = chunk.error {
            self.error = Some(error.value());
        }
        for (slot, field) in [
            (&mut self.id, chunk.id),
            (&mut self.model, chunk.model),
            (&mut self.created, chunk.created),
            (&mut self.system_fingerprint, chunk.system_fingerprint),
        ] {
            if slot.is_none() {
                *slot = field.map(Json::value);
            }
        }
        if let Some(usage) = chunk.usage.filter(|u| u.is_object()) {
            self.usage = Some(usage.value());
        }
        for choice in chunk.choices.into_iter().flatten() {
            self.on_choice(choice.0);
        }
    }

    fn on_choice(&mut self, choice: ChunkChoice<'_>) {
        let acc = self.choices.entry(choice.index.unwrap_or(0)).or_default();
        if let Some(reason) = choice.finish_reason {
            acc.finish_reason = reason.value();
        }
        let Some(Object(delta)) = choice.delta.unwrap_or(choice.message) else {
            return;
        };
        if let Some(role) = delta.role {
            acc.role = Some(role.into_owned());
        }
        if let Some(text) = delta.content {
            append(&mut acc.content, &text);
        }
        if let Some(text) = delta.refusal {
            append(&mut acc.refusal, &text);
        }
        for (position, Object(call)) in delta.tool_calls.into_iter().flatten().enumerate() {
            let tool = acc
                .tool_calls
                .entry(call.index.unwrap_or(position as u64))
                .or_default();
            if let Some(id) = call.id {
                tool.id = Some(id.into_owned());
            }
            if let Some(kind) = call.kind {
                tool.kind = Some(kind.into_owned());
            }
            if let Some(Object(function)) = call.function {
                if let Some(name) = function.name {
                    tool.name.push_str(&name);
                }
                if let Some(arguments) = function.arguments {
                    tool.arguments.push_str(&arguments);
                }
            }
        }
    }

    /// Whether the stream said `[DONE]`.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Whether a choice said why it finished (`finish_reason`).
    pub fn finished(&self) -> bool {
        self.choices.values().any(|c| !c.finish_reason.is_null())
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

    /// The chunk read the slow way only: its `Value`, field by field.
    fn slowly(assembler: &mut CompletionAssembler, data: &str) {
        if let Ok(Value::Object(chunk)) = serde_json::from_str::<Value>(data) {
            assembler.on_chunk(Chunk::from_object(&chunk));
        }
    }

    fn same(fast: &CompletionAssembler, slow: &CompletionAssembler) -> Result<(), String> {
        let (a, b) = (fast.completion(), slow.completion());
        if a != b || fast.usage() != slow.usage() || fast.error() != slow.error() {
            return Err(format!(
                "fast {a} {:?} {:?}\nslow {b} {:?} {:?}",
                fast.usage(),
                fast.error(),
                slow.usage(),
                slow.error()
            ));
        }
        Ok(())
    }

    #[test]
    fn a_chunk_read_as_text_and_as_a_value_assembles_the_same() {
        // The shapes the fast reading must not take differently from a `Value`'s fields.
        let cases = [
            r#"{"id":"a","choices":[{"index":0,"delta":{"content":"x\n\u00e9"}}]}"#,
            r#"{"choices":[{"index":1,"delta":null,"message":{"content":"m"}}]}"#,
            r#"{"choices":[{"message":{"role":"assistant","content":"m"}}]}"#,
            r#"{"choices":[{"index":0,"message":null}]}"#,
            r#"{"error":null}"#,
            r#"{"error":{"message":"overloaded"}}"#,
            r#"{"id":null,"model":"m","usage":null}"#,
            r#"{"usage":"no object"}"#,
            r#"{"choices":[["index",0],{"index":2}]}"#,
            r#"{"choices":[{"delta":["role","content"]}]}"#,
            r#"["id","model"]"#,
            // Arrays with one element per field, which serde would read as the struct.
            r#"{"choices":[[1,"stop",{"content":"c"},null]]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[[0,"t","function",["f","{}"]]]}}]}"#,
            r#"["i","m",1,"fp",{"total_tokens":1},null,[]]"#,
            r#"{"choices":[{"index":"0","delta":{"content":"s"}}]}"#,
            r#"{"choices":[{"index":1.0,"delta":{"content":"f"}}]}"#,
            r#"{"choices":[{"index":-1,"delta":{"content":"n"}}]}"#,
            r#"{"id":"first","id":"second","choices":[{"delta":{"content":"a","content":"b"}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"function":{"arguments":"{"}},{"index":0,"function":"f"},[0]]}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[{"id":"t","type":"function","function":{"name":"f","arguments":"{}"}}]}}]}"#,
            r#"{"choices":[{"delta":{"role":7,"content":"c"}}]}"#,
            r#"{"choices":{"index":0}}"#,
            r#"{"choices":[{"finish_reason":null},{"index":3,"finish_reason":{"odd":true}}]}"#,
        ];
        for case in cases {
            let (mut fast, mut slow) = (CompletionAssembler::default(), CompletionAssembler::default());
            fast.on_data(case);
            slowly(&mut slow, case);
            if let Err(differs) = same(&fast, &slow) {
                panic!("{case}\n{differs}");
            }
        }
    }

    /// A JSON value of any type, as text.
    fn any_json() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        prop_oneof![
            Just("null".to_owned()),
            Just("true".to_owned()),
            (0_u64..4).prop_map(|n| n.to_string()),
            Just("-1".to_owned()),
            Just("1.5".to_owned()),
            Just(r#""x""#.to_owned()),
            Just(r#""\u00e9\n\"""#.to_owned()),
            Just("[]".to_owned()),
            Just("[0,\"a\"]".to_owned()),
            Just("{}".to_owned()),
            Just(r#"{"content":"o"}"#.to_owned()),
        ]
    }

    /// An object of `fields` (each absent, or one of its values), sometimes with a field twice,
    /// sometimes as an array of its values, sometimes any other JSON instead.
    fn object(
        fields: Vec<(&'static str, proptest::strategy::BoxedStrategy<String>)>,
    ) -> proptest::strategy::BoxedStrategy<String> {
        use proptest::prelude::*;
        let entries: Vec<_> = fields
            .into_iter()
            .map(|(key, value)| proptest::option::of(value).prop_map(move |v| v.map(|v| (key, v))))
            .collect();
        (entries, any::<bool>(), 0_u8..10, any_json())
            .prop_map(|(entries, twice, shape, other)| {
                let mut present: Vec<(&str, String)> = entries.into_iter().flatten().collect();
                if twice {
                    if let Some(first) = present.first().cloned() {
                        present.push(first);
                    }
                }
                match shape {
                    0 => other,
                    1 => format!(
                        "[{}]",
                        present
                            .iter()
                            .map(|(_, v)| v.as_str())
                            .collect::<Vec<_>>()
                            .join(",")
                    ),
                    _ => format!(
                        "{{{}}}",
                        present
                            .iter()
                            .map(|(k, v)| format!("\"{k}\":{v}"))
                            .collect::<Vec<_>>()
                            .join(",")
                    ),
                }
            })
            .boxed()
    }

    fn text() -> proptest::strategy::BoxedStrategy<String> {
        use proptest::prelude::*;
        prop_oneof![3 => "[a-z\\\\\"é ]{0,6}".prop_map(|s| serde_json::to_string(&s).unwrap_or_default()), 1 => any_json()].boxed()
    }

    fn list(item: proptest::strategy::BoxedStrategy<String>) -> proptest::strategy::BoxedStrategy<String> {
        use proptest::prelude::*;
        prop_oneof![
            4 => proptest::collection::vec(item, 0..3).prop_map(|items| format!("[{}]", items.join(","))),
            1 => any_json(),
        ]
        .boxed()
    }

    fn chunk() -> proptest::strategy::BoxedStrategy<String> {
        use proptest::prelude::*;
        let index = || prop_oneof![3 => (0_u64..3).prop_map(|n| n.to_string()), 1 => any_json()].boxed();
        let function = object(vec![("name", text()), ("arguments", text())]);
        let call = object(vec![
            ("index", index()),
            ("id", text()),
            ("type", text()),
            ("function", function),
        ]);
        let delta = || {
            object(vec![
                ("role", text()),
                ("content", text()),
                ("refusal", text()),
                ("tool_calls", list(call.clone())),
            ])
        };
        let choice = object(vec![
            ("index", index()),
            ("finish_reason", text()),
            ("delta", delta()),
            ("message", delta()),
        ]);
        object(vec![
            ("id", text()),
            ("model", text()),
            ("created", any_json().boxed()),
            ("system_fingerprint", text()),
            ("usage", any_json().boxed()),
            ("error", any_json().boxed()),
            ("choices", list(choice)),
        ])
    }

    proptest::proptest! {
        #[test]
        fn any_chunks_assemble_alike_read_as_text_or_as_values(chunks in proptest::collection::vec(chunk(), 1..5)) {
            let (mut fast, mut slow) = (CompletionAssembler::default(), CompletionAssembler::default());
            for chunk in &chunks {
                fast.on_data(chunk);
                slowly(&mut slow, chunk);
            }
            if let Err(differs) = same(&fast, &slow) {
                return Err(proptest::test_runner::TestCaseError::fail(format!("{chunks:?}\n{differs}")));
            }
        }
    }
}
