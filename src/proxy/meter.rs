//! A call's tokens, counted for its key (`tokensPerDay`, today's usage) when its answer
//! ends, from the provider's own `usage`: a JSON body's, or a stream's usage event (chat's
//! usage chunk, which keel asks for; the Responses API's `response.completed`). The count is
//! in the key's book before the client has the end of its answer, so the next call of that
//! key on this instance is admitted against it.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use actix_web::web::Bytes;
use chrono::Utc;
use futures_util::Stream;
use serde::Deserialize;
use serde_json::Value;

use super::sse::SseParser;
use keel_core::keys::UsageBook;
use keel_core::proxy::cache::KeyOwner;

/// Where a call's tokens go: the key's book (the key shared with the call, not copied).
#[derive(Clone)]
pub struct Meter {
    book: UsageBook,
    owner: Arc<KeyOwner>,
}

impl Meter {
    pub fn new(book: UsageBook, owner: Arc<KeyOwner>) -> Self {
        Self { book, owner }
    }

    pub fn count(&self, tokens: i64) {
        self.book.tokens(&self.owner.key_id, tokens, Utc::now());
    }
}

/// The counts a provider's `usage` object may carry (chat and embeddings name them
/// `prompt_tokens`/`completion_tokens`, the Responses API `input_tokens`/`output_tokens`).
#[derive(Debug, Default, Deserialize)]
struct Usage {
    prompt_tokens: Option<i64>,
    completion_tokens: Option<i64>,
    input_tokens: Option<i64>,
    output_tokens: Option<i64>,
    total_tokens: Option<i64>,
}

impl Usage {
    /// Its tokens: the total when given, else what went in plus what came out.
    fn tokens(&self) -> Option<i64> {
        let parts = [
            self.prompt_tokens.or(self.input_tokens),
            self.completion_tokens.or(self.output_tokens),
        ];
        self.total_tokens.or_else(|| match parts {
            [None, None] => None,
            [a, b] => Some(a.unwrap_or(0) + b.unwrap_or(0)),
        })
    }
}

/// Tokens of a provider's `usage` value.
pub fn tokens_of(usage: &Value) -> Option<i64> {
    Usage::deserialize(usage).ok()?.tokens()
}

/// Tokens of a JSON answer's top-level `usage`. Providers write `usage` last, so the last
/// `"usage":` of the text is read first, alone (a few hundred bytes, not the whole answer);
/// only when that gives nothing is the answer read whole (the rest skipped, not built).
pub fn tokens_in_json(bytes: &[u8]) -> Option<i64> {
    #[derive(Deserialize)]
    struct Answer {
        usage: Option<Usage>,
    }
    usage_at_tail(bytes).or_else(|| serde_json::from_slice::<Answer>(bytes).ok()?.usage?.tokens())
}

/// The tokens of the value after the text's last `"usage"` key (a quote not escaped, so not
/// inside a string), if it is a usage object.
fn usage_at_tail(bytes: &[u8]) -> Option<i64> {
    const KEY: &[u8] = b"\"usage\"";
    let at = memchr::memmem::rfind(bytes, KEY)?;
    if at > 0 && bytes[at - 1] == b'\\' {
        return None;
    }
    let rest = &bytes[at + KEY.len()..];
    let colon = rest.iter().position(|b| !b.is_ascii_whitespace())?;
    if rest[colon] != b':' {
        return None;
    }
    let mut values = serde_json::Deserializer::from_slice(&rest[colon + 1..]).into_iter::<Usage>();
    values.next()?.ok()?.tokens()
}

/// Tokens of one SSE event's data, if it carries usage: a chat chunk's `usage`, or a
/// Responses API event's `response.usage`.
pub fn tokens_in_event(data: &str) -> Option<i64> {
    if !data.contains("\"usage\"") {
        return None;
    }
    #[derive(Deserialize)]
    struct Event {
        usage: Option<Usage>,
        response: Option<Inner>,
    }
    #[derive(Deserialize)]
    struct Inner {
        usage: Option<Usage>,
    }
    let event: Event = serde_json::from_str(data).ok()?;
    event
        .usage
        .or_else(|| event.response.and_then(|r| r.usage))?
        .tokens()
}

/// Watches an event stream for its usage events (the last one wins).
#[derive(Debug, Default)]
pub struct EventUsage {
    parser: SseParser,
    tokens: Option<i64>,
}

impl EventUsage {
    pub fn push(&mut self, bytes: &[u8]) {
        let tokens = &mut self.tokens;
        self.parser.push(bytes, &mut |data| {
            if let Some(found) = tokens_in_event(data) {
                *tokens = Some(found);
            }
        });
    }

    pub fn finish(&mut self) -> Option<i64> {
        let tokens = &mut self.tokens;
        self.parser.finish(&mut |data| {
            if let Some(found) = tokens_in_event(data) {
                *tokens = Some(found);
            }
        });
        self.tokens
    }
}

/// A JSON answer is kept whole up to this to read its `usage`; past it only its last
/// [`TAIL_BYTES`] (a provider writes `usage` after the data).
const WHOLE_BYTES: usize = 8 << 20;
const TAIL_BYTES: usize = 64 << 10;

/// What a JSON answer's watcher keeps.
#[derive(Debug, Default)]
struct JsonUsage {
    kept: Vec<u8>,
    /// Past [`WHOLE_BYTES`]: only the tail is kept.
    tail_only: bool,
}

impl JsonUsage {
    fn push(&mut self, bytes: &[u8]) {
        self.kept.extend_from_slice(bytes);
        if self.kept.len() > WHOLE_BYTES || self.tail_only && self.kept.len() > 2 * TAIL_BYTES {
            self.tail_only = true;
            let cut = self.kept.len() - TAIL_BYTES;
            self.kept.drain(..cut);
        }
    }

    fn finish(&self) -> Option<i64> {
        if !self.tail_only {
            return tokens_in_json(&self.kept);
        }
        // The last `"usage":` of the tail, and the one JSON value after it.
        let at = memchr::memmem::rfind(&self.kept, b"\"usage\"")?;
        let rest = &self.kept[at + b"\"usage\"".len()..];
        let colon = rest.iter().position(|b| *b == b':')?;
        let mut values = serde_json::Deserializer::from_slice(&rest[colon + 1..]).into_iter::<Value>();
        tokens_of(&values.next()?.ok()?)
    }
}

/// How a relayed answer's usage is found.
enum Watch {
    Json(JsonUsage),
    Events(EventUsage),
}

/// A relayed answer's body, passed on as it arrives, whose usage is counted when it ends
/// (before the end reaches the client). Holds a stream's place under `concurrentStreams`
/// until then, too.
pub struct Metered<S> {
    body: S,
    watch: Option<(Watch, Meter)>,
    _permit: Option<keel_core::keys::StreamPermit>,
}

impl<S> Metered<S> {
    /// `content_type` says how to read the answer: JSON or an event stream is watched,
    /// anything else (audio, files) passes untouched.
    pub fn new(
        body: S,
        content_type: &str,
        meter: Option<Meter>,
        permit: Option<keel_core::keys::StreamPermit>,
    ) -> Self {
        let media = content_type
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        let watch = match media.as_str() {
            "text/event-stream" => Some(Watch::Events(EventUsage::default())),
            m if m == "application/json" || m.ends_with("+json") => Some(Watch::Json(JsonUsage::default())),
            _ => None,
        };
        Self {
            body,
            watch: watch.zip(meter),
            _permit: permit,
        }
    }

    fn count(&mut self) {
        if let Some((watch, meter)) = self.watch.take() {
            let tokens = match watch {
                Watch::Json(json) => json.finish(),
                Watch::Events(mut events) => events.finish(),
            };
            if let Some(tokens) = tokens {
                meter.count(tokens);
            }
        }
    }
}

impl<S, E> Stream for Metered<S>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
{
    type Item = Result<Bytes, E>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let next = Pin::new(&mut this.body).poll_next(cx);
        match &next {
            Poll::Ready(Some(Ok(bytes))) => match &mut this.watch {
                Some((Watch::Json(json), _)) => json.push(bytes),
                Some((Watch::Events(events), _)) => events.push(bytes),
                None => {}
            },
            // Ended, or broken off: what the provider reported so far is what was used.
            Poll::Ready(None | Some(Err(_))) => this.count(),
            Poll::Pending => {}
        }
        next
    }
}

impl<S> Drop for Metered<S> {
    fn drop(&mut self) {
        // A client that left before the end: whatever usage had arrived is counted.
        self.count();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_of_chat_embeddings_and_responses() {
        let chat = br#"{"id":"x","choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}}"#;
        assert_eq!(tokens_in_json(chat), Some(10));
        let embeddings = br#"{"object":"list","data":[{"embedding":[0.1,0.2]}],"usage":{"prompt_tokens":5,"total_tokens":5}}"#;
        assert_eq!(tokens_in_json(embeddings), Some(5));
        let responses = br#"{"id":"resp","output":[],"usage":{"input_tokens":12,"output_tokens":4}}"#;
        assert_eq!(tokens_in_json(responses), Some(16));
        assert_eq!(tokens_in_json(br#"{"data":[]}"#), None);
        assert_eq!(tokens_in_json(b"not json"), None);
        assert_eq!(
            tokens_in_event(
                r#"{"type":"response.completed","response":{"usage":{"input_tokens":2,"output_tokens":1,"total_tokens":3}}}"#
            ),
            Some(3)
        );
        assert_eq!(
            tokens_in_event(r#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":1}}"#),
            Some(10)
        );
        assert_eq!(tokens_in_event(r#"{"choices":[{"delta":{}}]}"#), None);
    }

    #[test]
    fn a_usage_key_inside_a_string_or_nested_is_not_taken_for_the_answers() {
        let quoted = br#"{"usage":{"prompt_tokens":3,"completion_tokens":4},"choices":[{"message":{"content":"my \"usage\": {\"prompt_tokens\": 999}"}}]}"#;
        assert_eq!(tokens_in_json(quoted), Some(7));
        let nested_last = br#"{"usage":{"total_tokens":12},"choices":[{"message":{"content":"x"},"logprobs":{"usage":1}}]}"#;
        assert_eq!(
            tokens_in_json(nested_last),
            Some(12),
            "a nested non-usage value falls back to the whole read"
        );
        assert_eq!(
            tokens_in_json(br#"{"usage" : {"input_tokens": 2, "output_tokens": 5}}"#),
            Some(7)
        );
    }

    #[test]
    fn a_large_json_answer_is_read_from_its_tail() {
        let mut watch = JsonUsage::default();
        watch.push(br#"{"data":["#);
        let filler = vec![b'1'; 1 << 20];
        for _ in 0..10 {
            watch.push(&filler);
            watch.push(b",");
        }
        watch.push(br#"1],"usage":{"prompt_tokens":41,"total_tokens":41}}"#);
        assert!(watch.tail_only);
        assert!(watch.kept.len() <= 2 * TAIL_BYTES + (1 << 20));
        assert_eq!(watch.finish(), Some(41));
    }

    #[test]
    fn an_event_stream_split_anywhere_gives_its_usage() {
        let stream = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":2}}\n\ndata: [DONE]\n\n";
        for split in 1..stream.len() {
            let mut watch = EventUsage::default();
            watch.push(&stream.as_bytes()[..split]);
            watch.push(&stream.as_bytes()[split..]);
            assert_eq!(watch.finish(), Some(6), "split at {split}");
        }
    }
}
