//! Redaction (proxy rule 4): before a body goes upstream or into a trace, values are
//! replaced with `[redacted]` where (a) the field's name says it is a secret, or (b) the value
//! contains the caller's keel key or provider key (replaced as a substring; the rest stays).
//! The keys are replaced in member names too, and a string that holds a JSON object or array
//! (a tool call's `arguments`, a tool message's `content`) is redacted inside by the same
//! rules and stored re-encoded; any other string is searched as text.

use std::borrow::Cow;
use std::cell::Cell;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

pub const REDACTED: &str = "[redacted]";

/// Keys shorter than this are not searched for inside values: replacing a two-letter "key"
/// everywhere would mangle text and protect nothing.
pub const MIN_SECRET_LEN: usize = 8;

/// Name endings that mark a secret, compared without case, `_` and `-`. `token` is singular
/// only, so `max_tokens` and `completion_tokens` pass.
const SECRET_SUFFIXES: &[&str] = &[
    "apikey",
    "secret",
    "token",
    "password",
    "passwd",
    "credential",
    "credentials",
    "privatekey",
];

/// The last two characters (normalized) of every name [`is_secret_name`] matches: the
/// suffixes above and `authorization`. A key ending otherwise, nearly every key of a chat
/// completion, is turned away without the full comparison.
const SECRET_ENDINGS: &[[u8; 2]] = &[*b"ey", *b"et", *b"en", *b"rd", *b"wd", *b"al", *b"ls", *b"on"];

/// JSON Schema maps whose keys are property or definition names, not data.
const SCHEMA_MAPS: &[&str] = &["properties", "patternProperties", "$defs", "definitions"];

pub fn is_secret_name(name: &str) -> bool {
    // Runs for every key of every body, so nothing is allocated: the name is normalized
    // backwards, and only as far as the longest name it could match. Keys are nearly always
    // ASCII, whose lowering needs no Unicode table.
    if name.is_ascii() {
        let lowered = || {
            name.bytes()
                .rev()
                .filter(|b| *b != b'_' && *b != b'-')
                .map(|b| b.to_ascii_lowercase())
        };
        let mut last = lowered();
        match (last.next(), last.next()) {
            (Some(z), Some(y)) if SECRET_ENDINGS.contains(&[y, z]) => {
                is_secret_reversed(lowered().map(char::from))
            }
            _ => false,
        }
    } else {
        is_secret_reversed(
            name.chars()
                .rev()
                .filter(|c| *c != '_' && *c != '-')
                .flat_map(|c| c.to_lowercase().rev()),
        )
    }
}

/// [`is_secret_name`] of a name given as its normalized characters, last first. A full match
/// needs the whole normalized name, which is known once fewer than `TAIL` characters came out.
fn is_secret_reversed(lowered: impl Iterator<Item = char>) -> bool {
    const TAIL: usize = 19; // "proxyauthorization".len() + 1
    let mut tail = ['\0'; TAIL];
    let mut len = 0;
    for c in lowered.take(TAIL) {
        tail[len] = c;
        len += 1;
    }
    let reversed = &tail[..len];
    let ends_with = |word: &str| word.len() <= len && word.chars().rev().zip(reversed).all(|(a, b)| a == *b);
    let is = |word: &str| word.len() == len && ends_with(word);
    is("authorization") || is("proxyauthorization") || SECRET_SUFFIXES.iter().any(|s| ends_with(s))
}

/// Redacts with the given secret values (the keel key, the provider key).
pub struct Redactor<'a> {
    secrets: Vec<&'a str>,
}

impl<'a> Redactor<'a> {
    pub fn new(secrets: &[&'a str]) -> Self {
        Self {
            secrets: secrets
                .iter()
                .copied()
                .filter(|s| s.len() >= MIN_SECRET_LEN)
                .collect(),
        }
    }

    /// Redacts `value` in place; answers whether anything changed.
    pub fn redact(&self, value: &mut Value) -> bool {
        let mut changed = false;
        self.walk(value, &mut changed);
        changed
    }

    /// Reads a JSON text without building it: whether [`Redactor::redact`] would change it,
    /// and the few top-level fields the proxy needs. `None` when it is not JSON.
    ///
    /// Most bodies hold nothing to redact; they are then used as they came (forwarded,
    /// stored), and the work of building, walking and re-serializing a `Value` is saved.
    pub fn scan(&self, json: &[u8]) -> Option<Scan> {
        let cx = ScanContext {
            redactor: self,
            dirty: Cell::new(false),
            duplicate: std::cell::RefCell::new(None),
        };
        let mut head = serde_json::Map::new();
        let mut deserializer = serde_json::Deserializer::from_slice(json);
        let object = Node {
            cx: &cx,
            mode: Mode::Top(&mut head),
        }
        .deserialize(&mut deserializer)
        .ok()?;
        deserializer.end().ok()?;
        Some(Scan {
            needs_redaction: cx.dirty.get(),
            object,
            head: Value::Object(head),
            duplicate: cx.duplicate.into_inner(),
        })
    }

    fn contains_secret(&self, text: &str) -> bool {
        self.secrets.iter().any(|s| text.contains(s))
    }

    /// A string holding a JSON object or array, redacted inside and re-encoded; `None` when it
    /// holds none or nothing in it changes.
    fn redact_embedded(&self, text: &str) -> Option<String> {
        let text = container_text(text)?;
        let mut inner: Value = serde_json::from_str(text).ok()?;
        let mut changed = false;
        self.walk(&mut inner, &mut changed);
        changed.then(|| inner.to_string())
    }

    /// Whether [`Redactor::redact_embedded`] would change `text`, read without building it.
    fn embedded_needs_redaction(&self, text: &str) -> bool {
        let Some(text) = container_text(text) else {
            return false;
        };
        let cx = ScanContext {
            redactor: self,
            dirty: Cell::new(false),
            duplicate: std::cell::RefCell::new(None),
        };
        let mut deserializer = serde_json::Deserializer::from_str(text);
        let parsed = Node {
            cx: &cx,
            mode: Mode::Plain,
        }
        .deserialize(&mut deserializer)
        .is_ok()
            && deserializer.end().is_ok();
        parsed && cx.dirty.get()
    }

    /// A text with every secret replaced (for raw bodies that are not JSON).
    pub fn redact_text(&self, text: &str) -> Option<String> {
        self.contains_secret(text).then(|| {
            self.secrets
                .iter()
                .fold(text.to_owned(), |t, s| t.replace(s, REDACTED))
        })
    }

    fn walk(&self, value: &mut Value, changed: &mut bool) {
        match value {
            Value::Object(map) => self.walk_entries(map, changed, |name, child, changed| {
                if is_secret_name(name) {
                    redact_whole(child, changed);
                } else if SCHEMA_MAPS.contains(&name) && child.is_object() {
                    self.walk_schema_map(child, changed);
                } else {
                    self.walk(child, changed);
                }
            }),
            Value::Array(items) => {
                for item in items {
                    self.walk(item, changed);
                }
            }
            Value::String(text) => {
                if let Some(clean) = self.redact_embedded(text).or_else(|| self.redact_text(text)) {
                    *text = clean;
                    *changed = true;
                }
            }
            _ => {}
        }
    }

    /// `{"token": {"type": "string"}}` under `properties` defines a field named `token`; the
    /// definition is kept (and searched). A plain value there is still judged by its name.
    fn walk_schema_map(&self, map: &mut Value, changed: &mut bool) {
        if let Value::Object(map) = map {
            self.walk_entries(map, changed, |name, schema, changed| {
                if !schema.is_object() && is_secret_name(name) {
                    redact_whole(schema, changed);
                } else {
                    self.walk(schema, changed);
                }
            });
        }
    }

    /// Each entry through `visit` (judged by its name as it came), then a name holding a key
    /// replaced as a substring. Should two names become one, the later entry stays.
    fn walk_entries(
        &self,
        map: &mut serde_json::Map<String, Value>,
        changed: &mut bool,
        mut visit: impl FnMut(&str, &mut Value, &mut bool),
    ) {
        if !map.keys().any(|name| self.contains_secret(name)) {
            for (name, child) in map.iter_mut() {
                visit(name, child, changed);
            }
            return;
        }
        for (name, mut child) in std::mem::take(map) {
            visit(&name, &mut child, changed);
            let name = self.redact_text(&name).unwrap_or(name);
            map.insert(name, child);
        }
        *changed = true;
    }
}

/// The JSON object or array a string could hold (checked before parsing it): the string
/// without a leading byte-order mark and surrounding whitespace (Unicode's too, which JSON
/// itself does not allow, so that "\u{feff}{...}" or "\u{a0}{...}" is read, not left as is).
fn container_text(text: &str) -> Option<&str> {
    let text = text
        .trim_start_matches(|c: char| c == '\u{feff}' || c.is_whitespace())
        .trim_end_matches(char::is_whitespace);
    matches!(
        (text.as_bytes().first(), text.as_bytes().last()),
        (Some(b'{'), Some(b'}')) | (Some(b'['), Some(b']'))
    )
    .then_some(text)
}

/// What [`Redactor::scan`] found.
#[derive(Debug)]
pub struct Scan {
    /// [`Redactor::redact`] would change the text (a secret-named field, a secret inside a
    /// value).
    pub needs_redaction: bool,
    /// The text is a JSON object.
    pub object: bool,
    /// An object with the text's top-level [`Scan::HEAD`] fields as redaction leaves them
    /// (the last of each, as a parsed `Value` keeps it).
    pub head: Value,
    /// A top-level member name the object has twice (keel checks one `model`, a provider
    /// may run the other: such a body is refused).
    pub duplicate: Option<String>,
}

impl Scan {
    /// The top-level fields kept in [`Scan::head`] (`models`: OpenRouter's fallback list).
    pub const HEAD: &'static [&'static str] =
        &["model", "models", "stream", "stream_options", "usage", "error"];
}

struct ScanContext<'r, 'a> {
    redactor: &'r Redactor<'a>,
    dirty: Cell<bool>,
    /// The first top-level name seen twice.
    duplicate: std::cell::RefCell<Option<String>>,
}

impl ScanContext<'_, '_> {
    /// A member name holding a key is renamed by redaction.
    fn note_name(&self, name: &str) {
        if self.redactor.contains_secret(name) {
            self.dirty.set(true);
        }
    }
}

/// What is known about a value from where it sits (the cases of [`Redactor::walk`]).
enum Mode<'h> {
    /// The whole text: walked as any value, and its head fields kept.
    Top(&'h mut serde_json::Map<String, Value>),
    /// Any value not covered below.
    Plain,
    /// The value of a secret-named field: anything but the marker itself is redacted.
    Secret,
    /// The value of a `properties`-like field: a schema map if it is an object.
    SchemaMap,
    /// An entry of a schema map: an object is walked; anything else is judged by its name.
    SchemaEntry { secret_name: bool },
}

struct Node<'c, 'r, 'a, 'h> {
    cx: &'c ScanContext<'r, 'a>,
    mode: Mode<'h>,
}

impl Node<'_, '_, '_, '_> {
    /// A value that [`redact_whole`] replaces when it is not the marker.
    fn replaced_whole(&self) -> bool {
        matches!(self.mode, Mode::Secret | Mode::SchemaEntry { secret_name: true })
    }

    fn mark_dirty(&self) {
        self.cx.dirty.set(true);
    }

    fn scalar<E>(self) -> Result<bool, E> {
        if self.replaced_whole() {
            self.mark_dirty();
        }
        Ok(false)
    }
}

impl<'de> DeserializeSeed<'de> for Node<'_, '_, '_, '_> {
    /// Whether the value is an object.
    type Value = bool;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<bool, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Node<'_, '_, '_, '_> {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<bool, E> {
        self.scalar()
    }

    fn visit_i64<E>(self, _: i64) -> Result<bool, E> {
        self.scalar()
    }

    fn visit_u64<E>(self, _: u64) -> Result<bool, E> {
        self.scalar()
    }

    fn visit_f64<E>(self, _: f64) -> Result<bool, E> {
        self.scalar()
    }

    fn visit_unit<E>(self) -> Result<bool, E> {
        self.scalar()
    }

    fn visit_str<E>(self, text: &str) -> Result<bool, E> {
        let redactor = self.cx.redactor;
        let dirty = match self.replaced_whole() {
            true => text != REDACTED,
            false => redactor.contains_secret(text) || redactor.embedded_needs_redaction(text),
        };
        if dirty {
            self.mark_dirty();
        }
        Ok(false)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<bool, A::Error> {
        if self.replaced_whole() {
            self.mark_dirty();
            while seq.next_element::<IgnoredAny>()?.is_some() {}
        } else {
            while seq
                .next_element_seed(Node {
                    cx: self.cx,
                    mode: Mode::Plain,
                })?
                .is_some()
            {}
        }
        Ok(false)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<bool, A::Error> {
        let cx = self.cx;
        match self.mode {
            Mode::Secret => {
                self.mark_dirty();
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
            }
            Mode::SchemaMap => {
                while let Some(Key(name)) = map.next_key::<Key<'de>>()? {
                    self.cx.note_name(&name);
                    let secret_name = is_secret_name(&name);
                    map.next_value_seed(Node {
                        cx,
                        mode: Mode::SchemaEntry { secret_name },
                    })?;
                }
            }
            Mode::Top(head) => {
                // A body's top level has a few names: a list is quicker than a set.
                let mut seen: Vec<Cow<'de, str>> = Vec::new();
                while let Some(Key(name)) = map.next_key::<Key<'de>>()? {
                    cx.note_name(&name);
                    if seen.contains(&name) {
                        cx.duplicate.borrow_mut().get_or_insert_with(|| name.to_string());
                    } else {
                        seen.push(name.clone());
                    }
                    if Scan::HEAD.contains(&name.as_ref()) {
                        // Small fields, kept as values and judged as `walk` judges them.
                        let mut value: Value = map.next_value()?;
                        if cx.redactor.redact(&mut value) {
                            cx.dirty.set(true);
                        }
                        head.insert(name.into_owned(), value);
                    } else {
                        map.next_value_seed(Node {
                            cx,
                            mode: Mode::of_field(&name),
                        })?;
                    }
                }
            }
            Mode::Plain | Mode::SchemaEntry { .. } => {
                while let Some(Key(name)) = map.next_key::<Key<'de>>()? {
                    cx.note_name(&name);
                    map.next_value_seed(Node {
                        cx,
                        mode: Mode::of_field(&name),
                    })?;
                }
            }
        }
        Ok(true)
    }
}

impl Mode<'_> {
    /// The value of an object's field `name`.
    fn of_field(name: &str) -> Self {
        if is_secret_name(name) {
            Mode::Secret
        } else if SCHEMA_MAPS.contains(&name) {
            Mode::SchemaMap
        } else {
            Mode::Plain
        }
    }
}

/// An object key, borrowed from the text unless it holds escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> serde::Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object key")
            }

            fn visit_borrowed_str<E>(self, key: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(key)))
            }

            fn visit_str<E>(self, key: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(key.to_owned())))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

fn redact_whole(value: &mut Value, changed: &mut bool) {
    if value.as_str() != Some(REDACTED) {
        *value = Value::String(REDACTED.to_owned());
        *changed = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    const KEEL_KEY: &str = "keel_sk_AbCdEfGhIjKlMnOpQrStUvWxYz0123456789";
    const PROVIDER_KEY: &str = "sk-proj-ZyXwVuTsRqPoNmLk9876";

    #[test]
    fn a_top_level_name_given_twice_is_found_however_it_is_spelled() {
        let redactor = Redactor::new(&[KEEL_KEY, PROVIDER_KEY]);
        let scan = |text: &str| redactor.scan(text.as_bytes()).unwrap().duplicate;
        assert_eq!(
            scan(r#"{"model": "a", "n": 1, "model": "b"}"#),
            Some("model".into())
        );
        assert_eq!(scan(r#"{"model": "a", "mo\u0064el": "b"}"#), Some("model".into()));
        // Only the top level: the same name in two messages is no duplicate.
        assert_eq!(
            scan(r#"{"messages": [{"role": "user"}, {"role": "user"}], "model": "a"}"#),
            None
        );
        assert_eq!(scan(r#"{"a": {"x": 1, "x": 2}}"#), None);
    }

    #[test]
    fn secret_names_ignore_case_underscores_and_dashes() {
        for name in [
            "authorization",
            "Proxy-Authorization",
            "api_key",
            "openaiApiKey",
            "client_secret",
            "access_token",
            "refresh-token",
            "PASSWORD",
            "passwd",
            "aws_credentials",
            "credential",
            "private_key",
            "token",
        ] {
            assert!(is_secret_name(name), "{name}");
        }
        for name in [
            "max_tokens",
            "completion_tokens",
            "prompt_tokens",
            "tokens",
            "model",
            "messages",
            "usage",
            "secrets_manager_region",
            "author",
        ] {
            assert!(!is_secret_name(name), "{name}");
        }
    }

    #[test]
    fn redacts_by_name_and_by_value_and_keeps_schemas() {
        let mut body = json!({
            "model": "gpt-4o-mini",
            "max_tokens": 64,
            "api_key": "anything",
            "metadata": {"Authorization": "Bearer x", "note": format!("my key is {KEEL_KEY}, thanks")},
            "messages": [{"role": "user", "content": format!("use {PROVIDER_KEY} please")}],
            "tools": [{"type": "function", "function": {"name": "login", "parameters": {
                "type": "object",
                "properties": {"token": {"type": "string", "description": "session token"}, "password": "hunter22"},
                "required": ["token"]
            }}}],
        });
        assert!(Redactor::new(&[KEEL_KEY, PROVIDER_KEY]).redact(&mut body));
        assert_eq!(body["model"], "gpt-4o-mini");
        assert_eq!(body["max_tokens"], 64);
        assert_eq!(body["api_key"], REDACTED);
        assert_eq!(body["metadata"]["Authorization"], REDACTED);
        assert_eq!(body["metadata"]["note"], "my key is [redacted], thanks");
        assert_eq!(body["messages"][0]["content"], "use [redacted] please");
        let params = &body["tools"][0]["function"]["parameters"];
        assert_eq!(
            params["properties"]["token"],
            json!({"type": "string", "description": "session token"})
        );
        assert_eq!(params["properties"]["password"], REDACTED);
        assert_eq!(params["required"], json!(["token"]));
    }

    #[test]
    fn a_scan_reads_the_head_and_refuses_what_is_not_json() {
        let redactor = Redactor::new(&[KEEL_KEY, PROVIDER_KEY]);
        let text = br#"{"model":"gpt-4o","model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"hi"}],
            "usage":{"prompt_tokens":3},"tools":[{"function":{"parameters":{"properties":{"token":{"type":"string"}}}}}]}"#;
        let scan = redactor.scan(text).unwrap();
        assert!(!scan.needs_redaction);
        assert!(scan.object);
        // The last of a repeated field, as a parsed value keeps it.
        assert_eq!(
            scan.head,
            json!({"model": "gpt-4o-mini", "stream": true, "usage": {"prompt_tokens": 3}})
        );
        // A secret in a key-escaped field name is still a secret name.
        assert!(redactor.scan(br#"{"api\u005fkey":"x"}"#).unwrap().needs_redaction);
        assert!(redactor
            .scan(br#"{"a":[1,{"password":"[redacted]"}]}"#)
            .is_some_and(|s| !s.needs_redaction));
        assert!(
            redactor
                .scan(br#"{"usage":{"token":1}}"#)
                .unwrap()
                .needs_redaction
        );
        assert!(!redactor.scan(b"[1,2]").unwrap().object);
        for not_json in [&b""[..], b"{", b"{} x", b"{\"a\":}", b"\xff", b"[1e400]"] {
            assert!(redactor.scan(not_json).is_none(), "{not_json:?}");
        }
    }

    #[test]
    fn keys_are_replaced_in_member_names() {
        let mut body = json!({
            "metadata": {KEEL_KEY: 1, format!("{PROVIDER_KEY}-x"): "x", "plain": 2},
            "tools": [{"function": {"parameters": {"properties": {KEEL_KEY: {"type": "string"}}}}}],
        });
        let text = body.to_string();
        let redactor = Redactor::new(&[KEEL_KEY, PROVIDER_KEY]);
        assert!(redactor.scan(text.as_bytes()).unwrap().needs_redaction);
        assert!(redactor.redact(&mut body));
        assert_eq!(
            body["metadata"],
            json!({"[redacted]": 1, "[redacted]-x": "x", "plain": 2})
        );
        assert_eq!(
            body["tools"][0]["function"]["parameters"]["properties"],
            json!({"[redacted]": {"type": "string"}})
        );
    }

    #[test]
    fn json_inside_strings_is_redacted_by_the_same_rules() {
        let arguments =
            json!({"password": "hunter22", "api_key": "k", "city": "Paris", "note": KEEL_KEY}).to_string();
        let mut body = json!({"messages": [
            {"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "login", "arguments": arguments}}]},
            {"role": "tool", "content": format!("[{}]", json!({"token": "abc", "n": 1}))},
            {"role": "user", "content": "{not json, stays as it is}"},
            {"role": "user", "content": "[1, 2, 3]"},
        ]});
        let redactor = Redactor::new(&[KEEL_KEY, PROVIDER_KEY]);
        assert!(
            redactor
                .scan(body.to_string().as_bytes())
                .unwrap()
                .needs_redaction
        );
        assert!(redactor.redact(&mut body));
        let stored = &body["messages"];
        let arguments: Value = serde_json::from_str(
            stored[0]["tool_calls"][0]["function"]["arguments"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        assert_eq!(
            arguments,
            json!({"password": REDACTED, "api_key": REDACTED, "city": "Paris", "note": REDACTED})
        );
        let content: Value = serde_json::from_str(stored[1]["content"].as_str().unwrap()).unwrap();
        assert_eq!(content, json!([{"token": REDACTED, "n": 1}]));
        assert_eq!(stored[2]["content"], "{not json, stays as it is}");
        // A byte-order mark or whitespace before the JSON hides nothing.
        for lead in ["\u{feff}", " \n\t", "\u{a0}", "\u{feff} "] {
            let mut body = json!({"arguments": format!("{lead}{}\n", json!({"password": "hunter22"}))});
            assert!(
                redactor
                    .scan(body.to_string().as_bytes())
                    .unwrap()
                    .needs_redaction,
                "{lead:?}"
            );
            assert!(redactor.redact(&mut body), "{lead:?}");
            let inner: Value = serde_json::from_str(body["arguments"].as_str().unwrap()).unwrap();
            assert_eq!(inner, json!({"password": REDACTED}), "{lead:?}");
        }
        assert_eq!(
            stored[3]["content"], "[1, 2, 3]",
            "clean JSON text is kept as written"
        );
        // Nothing to redact inside: the scan says so, and the body is kept as it came.
        let clean = json!({"arguments": json!({"city": "Paris"}).to_string()});
        assert!(
            !redactor
                .scan(clean.to_string().as_bytes())
                .unwrap()
                .needs_redaction
        );
    }

    #[test]
    fn short_keys_are_not_searched_inside_text() {
        let mut body = json!({"content": "abc abc"});
        assert!(!Redactor::new(&["abc"]).redact(&mut body));
        assert_eq!(body["content"], "abc abc");
    }

    const NAMES: &[&str] = &[
        "model",
        "messages",
        "content",
        "role",
        "max_tokens",
        "completion_tokens",
        "usage",
        "tools",
        "properties",
        "items",
        "name",
        "api_key",
        "token",
        "Authorization",
        "client-secret",
        "db_password",
        "credentials",
        "private_key",
        "notes",
        "patternProperties",
        "$defs",
        "stream",
        // Names that hold a key.
        KEEL_KEY,
        "id-sk-proj-ZyXwVuTsRqPoNmLk9876",
    ];

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z ]{0,12}",
            Just(KEEL_KEY.to_owned()),
            Just(PROVIDER_KEY.to_owned()),
            Just(REDACTED.to_owned()),
            "[a-z ]{0,6}".prop_map(|s| format!("{s}{KEEL_KEY}{s}")),
            "[a-z ]{0,6}".prop_map(|s| format!("{PROVIDER_KEY} and {s} {PROVIDER_KEY}")),
        ]
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            text().prop_map(Value::String),
        ];
        leaf.prop_recursive(5, 64, 6, |inner| {
            prop_oneof![
                // A JSON document inside a string (a tool call's arguments).
                inner.clone().prop_map(|v| Value::String(v.to_string())),
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::vec((prop::sample::select(NAMES), inner.clone()), 0..6).prop_map(|pairs| {
                    Value::Object(pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
                }),
                // A JSON-Schema map (as in a tool's parameters), whose entries are definitions.
                (
                    prop::sample::select(SCHEMA_MAPS),
                    prop::collection::vec((prop::sample::select(NAMES), inner), 0..4)
                )
                    .prop_map(|(map, entries)| {
                        let entries = entries.into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
                        json!({ map: Value::Object(entries) })
                    }),
            ]
        })
    }

    /// The JSON object or array a string holds, as redaction reads it.
    fn embedded(text: &str) -> Option<Value> {
        serde_json::from_str::<Value>(text)
            .ok()
            .filter(|v| v.is_object() || v.is_array())
    }

    fn without_keys(text: &str) -> String {
        text.replace(KEEL_KEY, REDACTED).replace(PROVIDER_KEY, REDACTED)
    }

    /// Every leaf reachable without passing a secret-named key, by its path (names as
    /// redaction leaves them); a string holding JSON is followed into.
    fn public_leaves(value: &Value, path: String, out: &mut std::collections::BTreeMap<String, Value>) {
        match value {
            Value::Object(map) => {
                for (k, v) in map {
                    if !is_secret_name(k) {
                        public_leaves(v, format!("{path}/{}", without_keys(k)), out);
                    }
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    public_leaves(v, format!("{path}/{i}"), out);
                }
            }
            Value::String(text) => match embedded(text) {
                Some(inner) => public_leaves(&inner, format!("{path}/#json"), out),
                None => {
                    out.insert(path, value.clone());
                }
            },
            leaf => {
                out.insert(path, leaf.clone());
            }
        }
    }

    #[test]
    fn every_secret_name_ends_as_the_quick_check_expects() {
        for word in SECRET_SUFFIXES
            .iter()
            .chain(&["authorization", "proxyauthorization"])
        {
            let ending = &word.as_bytes()[word.len() - 2..];
            assert!(SECRET_ENDINGS.iter().any(|e| e == ending), "{word}");
        }
    }

    /// The plain definition `is_secret_name` must agree with.
    fn is_secret_name_reference(name: &str) -> bool {
        let normalized: String = name
            .chars()
            .filter(|c| *c != '_' && *c != '-')
            .flat_map(char::to_lowercase)
            .collect();
        normalized == "authorization"
            || normalized == "proxyauthorization"
            || SECRET_SUFFIXES.iter().any(|s| normalized.ends_with(s))
    }

    proptest! {
        #[test]
        fn secret_names_match_their_plain_definition(
            name in prop_oneof![
                "[a-zA-Z_-]{0,24}",
                "[a-zA-Z_-]{0,8}(TOKEN|Api_Key|pass-word|Authorization|proxy_authorization|İ|ß)[_-]{0,2}",
                "\\PC{0,24}",
            ]
        ) {
            prop_assert_eq!(is_secret_name(&name), is_secret_name_reference(&name), "{}", name);
        }

        #[test]
        fn no_secret_value_survives(mut value in json_value()) {
            Redactor::new(&[KEEL_KEY, PROVIDER_KEY]).redact(&mut value);
            let text = value.to_string();
            prop_assert!(!text.contains(KEEL_KEY));
            prop_assert!(!text.contains(PROVIDER_KEY));
            // Nothing secret-named keeps a value other than the marker, outside schema maps,
            // in JSON held by strings too.
            let mut stack = vec![(value, false)];
            while let Some((v, in_schema_map)) = stack.pop() {
                match v {
                    Value::Object(map) => for (k, child) in map {
                        if is_secret_name(&k) && !(in_schema_map && child.is_object()) {
                            prop_assert_eq!(&child, &json!(REDACTED));
                        }
                        let schema_map = SCHEMA_MAPS.contains(&k.as_str()) && child.is_object();
                        stack.push((child, schema_map));
                    },
                    Value::Array(items) => stack.extend(items.into_iter().map(|i| (i, false))),
                    Value::String(text) => stack.extend(embedded(&text).map(|inner| (inner, false))),
                    _ => {}
                }
            }
        }

        #[test]
        fn a_scan_agrees_with_redaction(value in json_value(), pretty in any::<bool>()) {
            let text = match pretty {
                true => serde_json::to_vec_pretty(&value).unwrap(),
                false => serde_json::to_vec(&value).unwrap(),
            };
            let redactor = Redactor::new(&[KEEL_KEY, PROVIDER_KEY]);
            let scan = redactor.scan(&text).unwrap();
            let mut redacted = value.clone();
            prop_assert_eq!(scan.needs_redaction, redactor.redact(&mut redacted));
            prop_assert_eq!(scan.object, value.is_object());
            for field in Scan::HEAD {
                prop_assert_eq!(scan.head.get(*field), redacted.get(*field).filter(|_| value.is_object()));
            }
        }

        #[test]
        fn no_other_field_changes(value in json_value()) {
            let mut redacted = value.clone();
            Redactor::new(&[KEEL_KEY, PROVIDER_KEY]).redact(&mut redacted);
            let (mut before, mut after) = Default::default();
            public_leaves(&value, String::new(), &mut before);
            public_leaves(&redacted, String::new(), &mut after);
            prop_assert_eq!(before.keys().collect::<Vec<_>>(), after.keys().collect::<Vec<_>>());
            for ((_, old), (_, new)) in before.iter().zip(&after) {
                match old {
                    Value::String(s) => prop_assert_eq!(new, &Value::String(without_keys(s))),
                    other => prop_assert_eq!(new, other),
                }
            }
        }
    }
}
