//! Full-text search of traces, tokenized by keel itself: a word is a run of letters and
//! digits (any script), compared lowercase. A trace's words (its user and assistant
//! messages and its reply, as stored: redacted) are kept in `search_text`, which PostgreSQL
//! indexes as a `tsvector` of those very words (GIN; filled by `super::indexer`) and SQLite
//! as an FTS5 table. A query's words and `"quoted phrases"` are made into each database's
//! query syntax from those words alone, so nothing a caller types is ever read as an
//! operator: `refund-8c2b` is two words, a stray `*`, `(` or `:` is a separator, and a quote
//! without its pair is just a character.

use serde_json::Value;

/// Words longer than this are left out (of documents and of queries alike).
const MAX_WORD_CHARS: usize = 100;
/// A trace's searchable words are kept up to this many bytes.
pub const MAX_DOCUMENT_BYTES: usize = 64 * 1024;
/// A query keeps this many terms at most.
const MAX_TERMS: usize = 32;
/// Previews are cut to this many characters.
pub const PREVIEW_CHARS: usize = 200;

/// The words of `text`, lowercase.
pub fn words(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty() && w.chars().count() <= MAX_WORD_CHARS)
        .map(str::to_lowercase)
}

/// A message's text pieces: a string as is, or content parts' `text` blocks.
pub(crate) fn texts_of(content: &Value) -> Option<Vec<&str>> {
    match content {
        Value::String(text) => Some(vec![text.as_str()]),
        Value::Array(parts) => {
            let texts: Vec<&str> = parts
                .iter()
                .filter(|p| p.get("type").and_then(Value::as_str).is_none_or(|t| t == "text"))
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect();
            (!texts.is_empty()).then_some(texts)
        }
        _ => None,
    }
}

/// A message's text: a string as is, content parts' `text` blocks joined by spaces.
fn text_of(content: &Value) -> Option<String> {
    texts_of(content).map(|texts| texts.join(" "))
}

/// The texts of the request's user and assistant messages, in order.
fn conversation(request: &Value) -> Vec<(String, String)> {
    request
        .get("messages")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|m| {
            let role = m.get("role").and_then(Value::as_str)?;
            matches!(role, "user" | "assistant")
                .then(|| m.get("content").and_then(text_of))
                .flatten()
                .map(|text| (role.to_owned(), text))
        })
        .collect()
}

/// The reply's text (the first choice's message).
fn reply(response: Option<&Value>) -> Option<String> {
    response?.pointer("/choices/0/message/content").and_then(text_of)
}

fn cut(text: &str) -> String {
    let text = text.trim();
    match text.char_indices().nth(PREVIEW_CHARS) {
        Some((end, _)) => text[..end].to_owned(),
        None => text.to_owned(),
    }
}

/// What a trace is found and shown by: its searchable words (user and assistant messages,
/// the reply) and its previews (the last user message, the reply; 200 characters each).
pub struct Indexed {
    pub search_text: String,
    pub preview_input: Option<String>,
    pub preview_output: Option<String>,
}

/// A trace's [`Indexed`] from its stored (redacted) request and response.
pub fn index(request: &Value, response: Option<&Value>) -> Indexed {
    indexed(conversation(request), reply(response))
}

/// [`index`] of the stored texts themselves, read without building them as values: only
/// the messages' roles and texts and the first choice's text are taken (what the trace
/// writer does for every recorded call). Text that is not JSON indexes as nothing.
pub fn index_text(request: &[u8], response: Option<&str>) -> Indexed {
    let messages = serde_json::from_slice::<stored::Request>(request)
        .map(|r| r.0)
        .unwrap_or_default();
    let answer = response
        .and_then(|r| serde_json::from_str::<stored::Response>(r).ok())
        .and_then(|r| r.0);
    indexed(messages, answer)
}

fn indexed(messages: Vec<(String, String)>, answer: Option<String>) -> Indexed {
    let mut search_text = String::new();
    let texts = messages
        .iter()
        .map(|(_, text)| text.as_str())
        .chain(answer.as_deref());
    for text in texts {
        if !push_words(text, &mut search_text) {
            break;
        }
    }
    Indexed {
        search_text,
        preview_input: messages
            .iter()
            .rev()
            .find(|(role, _)| role == "user")
            .map(|(_, text)| cut(text)),
        preview_output: answer.as_deref().map(cut),
    }
}

/// Appends `text`'s words (as [`words`] makes them) to `out`, space-separated, while it stays
/// within [`MAX_DOCUMENT_BYTES`]; `false` once a word no longer fits. An ASCII word is
/// lowercased in place, without a string of its own.
fn push_words(text: &str, out: &mut String) -> bool {
    for word in text.split(|c: char| !c.is_alphanumeric()) {
        if word.is_empty() {
            continue;
        }
        if word.is_ascii() {
            if word.len() > MAX_WORD_CHARS {
                continue;
            }
            if out.len() + word.len() + 1 > MAX_DOCUMENT_BYTES {
                return false;
            }
            if !out.is_empty() {
                out.push(' ');
            }
            let start = out.len();
            out.push_str(word);
            out[start..].make_ascii_lowercase();
        } else {
            if word.chars().count() > MAX_WORD_CHARS {
                continue;
            }
            let lower = word.to_lowercase();
            if out.len() + lower.len() + 1 > MAX_DOCUMENT_BYTES {
                return false;
            }
            if !out.is_empty() {
                out.push(' ');
            }
            out.push_str(&lower);
        }
    }
    true
}

/// The parts of a stored request and response that [`index_text`] reads, as serde visitors
/// that skip the rest (tools' schemas, ids, usage) without building it. Each reads as the
/// value-based [`index`] does: a member of another type than expected is as if absent, and a
/// member given twice counts by its last.
mod stored {
    use std::borrow::Cow;
    use std::fmt;

    use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
    use serde::Deserialize;

    /// Anything: a string kept (borrowed when it can be), any other value skipped.
    pub struct Text<'a>(pub Option<Cow<'a, str>>);

    impl<'de> Deserialize<'de> for Text<'de> {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Text<'de>;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("any value")
                }
                fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Self::Value, E> {
                    Ok(Text(Some(Cow::Borrowed(v))))
                }
                fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                    Ok(Text(Some(Cow::Owned(v.to_owned()))))
                }
                fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                    Ok(Text(Some(Cow::Owned(v))))
                }
                fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                    Ok(Text(None))
                }
                fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                    Ok(Text(None))
                }
                fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                    Ok(Text(None))
                }
                fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                    Ok(Text(None))
                }
                fn visit_unit<E>(self) -> Result<Self::Value, E> {
                    Ok(Text(None))
                }
                fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                    while seq.next_element::<IgnoredAny>()?.is_some() {}
                    Ok(Text(None))
                }
                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                    while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                    Ok(Text(None))
                }
            }
            d.deserialize_any(V)
        }
    }

    /// A visitor of any value that acts only on one shape: `on_map` for an object, `on_seq`
    /// for an array; anything else is skipped and answers `T::default()`.
    macro_rules! shaped {
        ($name:ident, $value:ty, map: |$m:ident| $on_map:block, seq: |$s:ident| $on_seq:block) => {
            impl<'de> Deserialize<'de> for $name {
                fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                    struct V;
                    impl<'de> Visitor<'de> for V {
                        type Value = $name;
                        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                            f.write_str("any value")
                        }
                        fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                            Ok($name::default())
                        }
                        fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                            Ok($name::default())
                        }
                        fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                            Ok($name::default())
                        }
                        fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                            Ok($name::default())
                        }
                        fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
                            Ok($name::default())
                        }
                        fn visit_unit<E>(self) -> Result<Self::Value, E> {
                            Ok($name::default())
                        }
                        fn visit_map<A: MapAccess<'de>>(self, mut $m: A) -> Result<Self::Value, A::Error> {
                            $on_map
                        }
                        fn visit_seq<A: SeqAccess<'de>>(self, mut $s: A) -> Result<Self::Value, A::Error> {
                            $on_seq
                        }
                    }
                    d.deserialize_any(V)
                }
            }
        };
    }

    fn skip_seq<'de, A: SeqAccess<'de>>(seq: &mut A) -> Result<(), A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(())
    }

    fn skip_map<'de, A: MapAccess<'de>>(map: &mut A) -> Result<(), A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(())
    }

    /// A message's content as text: a string as is, or its parts' `text` blocks (a part
    /// whose `type` is missing, not a string, or `text`) joined by spaces; none when neither.
    #[derive(Default)]
    pub struct Content(pub Option<String>);

    /// One content part's text, if it is a text part.
    #[derive(Default)]
    struct Part(Option<String>);

    shaped!(Part, Part, map: |map| {
        let (mut kind, mut text): (Option<Option<String>>, Option<String>) = (None, None);
        while let Some(key) = map.next_key::<Text<'de>>()? {
            match key.0.as_deref().unwrap_or_default() {
                "type" => kind = Some(map.next_value::<Text<'de>>()?.0.map(Cow::into_owned)),
                "text" => text = map.next_value::<Text<'de>>()?.0.map(Cow::into_owned),
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let is_text = kind.flatten().is_none_or(|t| t == "text");
        Ok(Part(text.filter(|_| is_text)))
    }, seq: |seq| {
        skip_seq(&mut seq)?;
        Ok(Part(None))
    });

    impl<'de> Deserialize<'de> for Content {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Content;
                fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                    f.write_str("any value")
                }
                fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
                    Ok(Content(Some(v.to_owned())))
                }
                fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
                    Ok(Content(Some(v)))
                }
                fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
                    Ok(Content(None))
                }
                fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
                    Ok(Content(None))
                }
                fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
                    Ok(Content(None))
                }
                fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
                    Ok(Content(None))
                }
                fn visit_unit<E>(self) -> Result<Self::Value, E> {
                    Ok(Content(None))
                }
                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                    skip_map(&mut map)?;
                    Ok(Content(None))
                }
                fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                    let mut texts: Vec<String> = Vec::new();
                    while let Some(Part(text)) = seq.next_element::<Part>()? {
                        texts.extend(text);
                    }
                    Ok(Content((!texts.is_empty()).then(|| texts.join(" "))))
                }
            }
            d.deserialize_any(V)
        }
    }

    /// A message: its role (when a string) and its content's text.
    #[derive(Default)]
    struct Message(Option<String>, Option<String>);

    shaped!(Message, Message, map: |map| {
        let (mut role, mut content) = (None, None);
        while let Some(key) = map.next_key::<Text<'de>>()? {
            match key.0.as_deref().unwrap_or_default() {
                "role" => role = map.next_value::<Text<'de>>()?.0.map(Cow::into_owned),
                "content" => content = map.next_value::<Content>()?.0,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Message(role, content))
    }, seq: |seq| {
        skip_seq(&mut seq)?;
        Ok(Message(None, None))
    });

    /// The user and assistant messages with text, in order.
    #[derive(Default)]
    struct Messages(Vec<(String, String)>);

    shaped!(Messages, Messages, map: |map| {
        skip_map(&mut map)?;
        Ok(Messages(Vec::new()))
    }, seq: |seq| {
        let mut kept = Vec::new();
        while let Some(Message(role, content)) = seq.next_element::<Message>()? {
            if let (Some(role), Some(text)) = (role, content) {
                if matches!(role.as_str(), "user" | "assistant") {
                    kept.push((role, text));
                }
            }
        }
        Ok(Messages(kept))
    });

    /// A request's [`Messages`] (none when it is not an object or has no such list).
    #[derive(Default)]
    pub struct Request(pub Vec<(String, String)>);

    shaped!(Request, Request, map: |map| {
        let mut messages = Vec::new();
        while let Some(key) = map.next_key::<Text<'de>>()? {
            match key.0.as_deref().unwrap_or_default() {
                "messages" => messages = map.next_value::<Messages>()?.0,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Request(messages))
    }, seq: |seq| {
        skip_seq(&mut seq)?;
        Ok(Request(Vec::new()))
    });

    /// `message.content` of a choice.
    #[derive(Default)]
    struct ChoiceMessage(Option<String>);

    shaped!(ChoiceMessage, ChoiceMessage, map: |map| {
        let mut content = None;
        while let Some(key) = map.next_key::<Text<'de>>()? {
            match key.0.as_deref().unwrap_or_default() {
                "content" => content = map.next_value::<Content>()?.0,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(ChoiceMessage(content))
    }, seq: |seq| {
        skip_seq(&mut seq)?;
        Ok(ChoiceMessage(None))
    });

    #[derive(Default)]
    struct Choice(Option<String>);

    shaped!(Choice, Choice, map: |map| {
        let mut text = None;
        while let Some(key) = map.next_key::<Text<'de>>()? {
            match key.0.as_deref().unwrap_or_default() {
                "message" => text = map.next_value::<ChoiceMessage>()?.0,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Choice(text))
    }, seq: |seq| {
        skip_seq(&mut seq)?;
        Ok(Choice(None))
    });

    /// The first choice's text.
    #[derive(Default)]
    struct Choices(Option<String>);

    shaped!(Choices, Choices, map: |map| {
        skip_map(&mut map)?;
        Ok(Choices(None))
    }, seq: |seq| {
        let first = seq.next_element::<Choice>()?.and_then(|c| c.0);
        skip_seq(&mut seq)?;
        Ok(Choices(first))
    });

    /// A response's first choice's message text.
    #[derive(Default)]
    pub struct Response(pub Option<String>);

    shaped!(Response, Response, map: |map| {
        let mut text = None;
        while let Some(key) = map.next_key::<Text<'de>>()? {
            match key.0.as_deref().unwrap_or_default() {
                "choices" => text = map.next_value::<Choices>()?.0,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Response(text))
    }, seq: |seq| {
        skip_seq(&mut seq)?;
        Ok(Response(None))
    });
}

/// A search: every term must match; a term is one word or a phrase (its words in a row).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Query {
    terms: Vec<Vec<String>>,
}

impl Query {
    /// `q` as typed: words, and phrases in double quotes (balanced ones; a quote without its
    /// pair is a separator like any other punctuation).
    pub fn parse(q: &str) -> Self {
        let mut terms: Vec<Vec<String>> = Vec::new();
        let quotes = q.matches('"').count();
        // The last quote of an odd count has no pair: it is just a character.
        let paired = quotes - quotes % 2;
        let mut seen = 0;
        let mut rest = q;
        while let Some(at) = rest.find('"') {
            if seen >= paired {
                break;
            }
            let (before, after) = rest.split_at(at);
            terms.extend(words(before).map(|w| vec![w]));
            let after = &after[1..];
            let end = after.find('"').unwrap_or(after.len());
            let phrase: Vec<String> = words(&after[..end]).collect();
            if !phrase.is_empty() {
                terms.push(phrase);
            }
            seen += 2;
            rest = after.get(end + 1..).unwrap_or("");
        }
        terms.extend(words(rest).map(|w| vec![w]));
        terms.dedup();
        terms.truncate(MAX_TERMS);
        Self { terms }
    }

    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// Every word of every term.
    pub fn words(&self) -> impl Iterator<Item = &str> {
        self.terms.iter().flatten().map(String::as_str)
    }

    /// As an FTS5 `MATCH` expression: every word, quoted, all required. SQLite's index keeps
    /// which traces hold a word, not where (`detail=none`, as PostgreSQL's `tsvector` of
    /// words has no positions), so a phrase's order is checked on the words themselves
    /// ([`Query::phrase_patterns`]). The words hold only letters and digits, so no quote or
    /// operator can be in them.
    pub fn fts5(&self) -> String {
        let mut words: Vec<&str> = self.words().collect();
        words.sort_unstable();
        words.dedup();
        words
            .iter()
            .map(|word| format!("\"{word}\""))
            .collect::<Vec<_>>()
            .join(" AND ")
    }

    /// As PostgreSQL `tsquery` input (cast, not parsed by a text search configuration): every
    /// word, quoted, joined by `&`. A trace's `search` column holds its words as they are, so
    /// the lexemes on both sides are keel's own words; a phrase's order is checked on the
    /// words themselves ([`Query::phrase_patterns`]). The words hold only letters and
    /// digits, so no quote or operator can be in them.
    pub fn tsquery(&self) -> String {
        let mut words: Vec<&str> = self.words().collect();
        words.sort_unstable();
        words.dedup();
        words
            .iter()
            .map(|word| format!("'{word}'"))
            .collect::<Vec<_>>()
            .join(" & ")
    }

    /// Each term as a `LIKE` pattern of its words in a row, for `' ' || search_text || ' '`
    /// (a trace's words, space-separated): `% late delivery %`. The words hold no `%`, `_`
    /// or `\`.
    pub fn patterns(&self) -> impl Iterator<Item = String> + '_ {
        self.terms.iter().map(|term| pattern(term))
    }

    /// [`Query::patterns`] of the phrases only (the terms of more than one word).
    pub fn phrase_patterns(&self) -> impl Iterator<Item = String> + '_ {
        self.terms
            .iter()
            .filter(|term| term.len() > 1)
            .map(|term| pattern(term))
    }
}

/// A term's words in a row as a `LIKE` pattern of space-separated words.
fn pattern(term: &[String]) -> String {
    format!("% {} %", term.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn punctuation_and_operators_are_separators_and_quotes_make_phrases() {
        assert_eq!(Query::parse("refund-8c2b").fts5(), "\"8c2b\" AND \"refund\"");
        assert_eq!(Query::parse("refund-8c2b").tsquery(), "'8c2b' & 'refund'");
        let phrase = Query::parse("\"late delivery\" Refund");
        assert_eq!(phrase.tsquery(), "'delivery' & 'late' & 'refund'");
        assert_eq!(phrase.fts5(), "\"delivery\" AND \"late\" AND \"refund\"");
        assert_eq!(
            phrase.patterns().collect::<Vec<_>>(),
            ["% late delivery %", "% refund %"]
        );
        assert_eq!(
            phrase.phrase_patterns().collect::<Vec<_>>(),
            ["% late delivery %"]
        );
        assert_eq!(
            Query::parse("a OR b NOT c*").fts5(),
            "\"a\" AND \"b\" AND \"c\" AND \"not\" AND \"or\""
        );
        // A quote without its pair is a character: the words around it are words.
        assert_eq!(Query::parse("refund \"late").tsquery(), "'late' & 'refund'");
        assert_eq!(Query::parse("\"a b\" \"c").fts5(), "\"a\" AND \"b\" AND \"c\"");
        assert!(Query::parse("*** \"\" :: ()").is_empty());
        assert_eq!(Query::parse("Café naïve").tsquery(), "'café' & 'naïve'");
        assert_eq!(
            Query::parse("'; DROP TABLE traces; --").tsquery(),
            "'drop' & 'table' & 'traces'"
        );
    }

    use proptest::prelude::*;

    /// JSON of the shapes a stored request or response takes, and of every other shape in
    /// their places: strings, numbers, nulls, objects and arrays where texts are expected.
    fn anything() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i32>().prop_map(Value::from),
            "[a-zA-Zé 0-9,.!?-]{0,20}".prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..3).prop_map(Value::from),
                proptest::collection::btree_map("[a-z]{1,4}", inner, 0..3)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn part() -> impl Strategy<Value = Value> {
        prop_oneof![
            (
                "[a-zA-Z ]{0,12}",
                prop_oneof![
                    Just(json!("text")),
                    Just(json!("image_url")),
                    Just(json!(3)),
                    Just(Value::Null)
                ]
            )
                .prop_map(|(text, kind)| json!({"type": kind, "text": text})),
            "[a-zA-Z ]{0,12}".prop_map(|text| json!({"text": text})),
            anything(),
        ]
    }

    fn content() -> impl Strategy<Value = Value> {
        prop_oneof![
            "[a-zA-Zé 0-9?'-]{0,30}".prop_map(Value::from),
            proptest::collection::vec(part(), 0..4).prop_map(Value::from),
            anything(),
        ]
    }

    fn message() -> impl Strategy<Value = Value> {
        let role = prop_oneof![
            Just(json!("user")),
            Just(json!("assistant")),
            Just(json!("system")),
            Just(json!("tool")),
            anything(),
        ];
        prop_oneof![
            4 => (role, content()).prop_map(|(role, content)| json!({"role": role, "content": content, "name": "x"})),
            1 => anything(),
        ]
    }

    proptest! {
        /// Reading the stored texts directly indexes exactly as reading their values does.
        #[test]
        fn the_streaming_index_is_the_value_index(
            messages in proptest::collection::vec(message(), 0..6),
            reply in content(),
            shape in 0_u8..4,
            extra in anything(),
        ) {
            let request = match shape {
                0 => json!({"model": "m", "messages": messages, "tools": [extra.clone()]}),
                1 => json!({"messages": extra.clone()}),
                2 => extra.clone(),
                _ => json!({"messages": messages}),
            };
            let response = match shape {
                0 => json!({"choices": [{"message": {"content": reply}}, {"message": {"content": "second"}}], "usage": extra}),
                1 => json!({"choices": extra}),
                2 => json!({"choices": [{"message": extra}]}),
                _ => json!({"choices": [{"message": {"role": "assistant", "content": reply}}]}),
            };
            let by_value = index(&request, Some(&response));
            let by_text = index_text(request.to_string().as_bytes(), Some(&response.to_string()));
            prop_assert_eq!(&by_text.search_text, &by_value.search_text);
            prop_assert_eq!(&by_text.preview_input, &by_value.preview_input);
            prop_assert_eq!(&by_text.preview_output, &by_value.preview_output);
        }
    }

    #[test]
    fn the_streaming_index_reads_duplicates_by_their_last_and_skips_what_is_not_json() {
        let request = r#"{"messages": [{"role": "user", "content": "first"}], "messages": [{"role": "user", "content": "last"}]}"#;
        assert_eq!(index_text(request.as_bytes(), None).search_text, "last");
        let nothing = index_text(b"not json", Some("{"));
        assert_eq!((nothing.search_text.as_str(), nothing.preview_input), ("", None));
    }

    #[test]
    fn a_trace_is_indexed_by_its_user_and_assistant_words_and_previewed() {
        let request = json!({"messages": [
            {"role": "system", "content": "secret system prompt"},
            {"role": "user", "content": "Where is my refund-8c2b?"},
            {"role": "assistant", "content": "Checking."},
            {"role": "user", "content": [{"type": "text", "text": "Still waiting"}, {"type": "image_url", "image_url": {"url": "x"}}]},
        ]});
        let response =
            json!({"choices": [{"message": {"role": "assistant", "content": "It was sent today."}}]});
        let indexed = index(&request, Some(&response));
        assert_eq!(
            indexed.search_text,
            "where is my refund 8c2b checking still waiting it was sent today"
        );
        assert_eq!(indexed.preview_input.as_deref(), Some("Still waiting"));
        assert_eq!(indexed.preview_output.as_deref(), Some("It was sent today."));
        let long = "é".repeat(500);
        let indexed = index(&json!({"messages": [{"role": "user", "content": long}]}), None);
        assert_eq!(indexed.preview_input.unwrap().chars().count(), PREVIEW_CHARS);
        assert_eq!(indexed.preview_output, None);
    }
}
