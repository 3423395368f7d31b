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

/// A message's text: a string as is, content parts' `text` blocks joined by spaces.
fn text_of(content: &Value) -> Option<String> {
    super::export::texts_of(content).map(|texts| texts.join(" "))
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
    let messages = conversation(request);
    let answer = reply(response);
    let mut search_text = String::new();
    let texts = messages
        .iter()
        .map(|(_, text)| text.as_str())
        .chain(answer.as_deref());
    'texts: for text in texts {
        for word in words(text) {
            if search_text.len() + word.len() + 1 > MAX_DOCUMENT_BYTES {
                break 'texts;
            }
            if !search_text.is_empty() {
                search_text.push(' ');
            }
            search_text.push_str(&word);
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

    /// As an FTS5 `MATCH` expression: each term a quoted string (a phrase), all required.
    /// The words hold only letters and digits, so no quote or operator can be in them.
    pub fn fts5(&self) -> String {
        self.terms
            .iter()
            .map(|term| format!("\"{}\"", term.join(" ")))
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
        assert_eq!(Query::parse("refund-8c2b").fts5(), "\"refund\" AND \"8c2b\"");
        assert_eq!(Query::parse("refund-8c2b").tsquery(), "'8c2b' & 'refund'");
        let phrase = Query::parse("\"late delivery\" Refund");
        assert_eq!(phrase.tsquery(), "'delivery' & 'late' & 'refund'");
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
            "\"a\" AND \"or\" AND \"b\" AND \"not\" AND \"c\""
        );
        // A quote without its pair is a character: the words around it are words.
        assert_eq!(Query::parse("refund \"late").tsquery(), "'late' & 'refund'");
        assert_eq!(Query::parse("\"a b\" \"c").fts5(), "\"a b\" AND \"c\"");
        assert!(Query::parse("*** \"\" :: ()").is_empty());
        assert_eq!(Query::parse("Café naïve").tsquery(), "'café' & 'naïve'");
        assert_eq!(
            Query::parse("'; DROP TABLE traces; --").tsquery(),
            "'drop' & 'table' & 'traces'"
        );
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
