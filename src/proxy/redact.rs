//! Redaction (proxy rule 4): before a body goes upstream or into a trace, values are
//! replaced with `[redacted]` where (a) the field's name says it is a secret, or (b) the value
//! contains the caller's keel key or provider key (replaced as a substring; the rest stays).

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

/// JSON Schema maps whose keys are property or definition names, not data.
const SCHEMA_MAPS: &[&str] = &["properties", "patternProperties", "$defs", "definitions"];

pub fn is_secret_name(name: &str) -> bool {
    // Runs for every key of every body, so nothing is allocated: the name is normalized
    // backwards, and only as far as the longest name it could match. A full match needs the
    // whole normalized name, which is known once fewer than `TAIL` characters came out.
    const TAIL: usize = 19; // "proxyauthorization".len() + 1
    let mut tail = ['\0'; TAIL];
    let mut len = 0;
    for c in name
        .chars()
        .rev()
        .filter(|c| *c != '_' && *c != '-')
        .flat_map(|c| c.to_lowercase().rev())
    {
        if len == TAIL {
            break;
        }
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

    /// A text with every secret replaced (for raw bodies that are not JSON).
    pub fn redact_text(&self, text: &str) -> Option<String> {
        self.secrets.iter().any(|s| text.contains(s)).then(|| {
            self.secrets
                .iter()
                .fold(text.to_owned(), |t, s| t.replace(s, REDACTED))
        })
    }

    fn walk(&self, value: &mut Value, changed: &mut bool) {
        match value {
            Value::Object(map) => {
                for (name, child) in map.iter_mut() {
                    if is_secret_name(name) {
                        redact_whole(child, changed);
                    } else if SCHEMA_MAPS.contains(&name.as_str()) && child.is_object() {
                        self.walk_schema_map(child, changed);
                    } else {
                        self.walk(child, changed);
                    }
                }
            }
            Value::Array(items) => {
                for item in items {
                    self.walk(item, changed);
                }
            }
            Value::String(text) => {
                if let Some(clean) = self.redact_text(text) {
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
            for (name, schema) in map.iter_mut() {
                if !schema.is_object() && is_secret_name(name) {
                    redact_whole(schema, changed);
                } else {
                    self.walk(schema, changed);
                }
            }
        }
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
    ];

    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z ]{0,12}",
            Just(KEEL_KEY.to_owned()),
            Just(PROVIDER_KEY.to_owned()),
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
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::vec((prop::sample::select(NAMES), inner), 0..6).prop_map(|pairs| {
                    Value::Object(pairs.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
                }),
            ]
        })
    }

    /// Every leaf reachable without passing a secret-named key, with its path.
    fn public_leaves(value: &Value, path: String, out: &mut Vec<(String, Value)>) {
        match value {
            Value::Object(map) => {
                for (k, v) in map {
                    if !is_secret_name(k) {
                        public_leaves(v, format!("{path}/{k}"), out);
                    }
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    public_leaves(v, format!("{path}/{i}"), out);
                }
            }
            leaf => out.push((path, leaf.clone())),
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
            // Nothing secret-named keeps a value other than the marker, outside schema maps.
            let mut stack = vec![(&value, false)];
            while let Some((v, in_schema_map)) = stack.pop() {
                match v {
                    Value::Object(map) => for (k, child) in map {
                        if is_secret_name(k) && !(in_schema_map && child.is_object()) {
                            prop_assert_eq!(child, &json!(REDACTED));
                        }
                        stack.push((child, SCHEMA_MAPS.contains(&k.as_str()) && child.is_object()));
                    },
                    Value::Array(items) => stack.extend(items.iter().map(|i| (i, false))),
                    _ => {}
                }
            }
        }

        #[test]
        fn no_other_field_changes(value in json_value()) {
            let mut redacted = value.clone();
            Redactor::new(&[KEEL_KEY, PROVIDER_KEY]).redact(&mut redacted);
            let (mut before, mut after) = (Vec::new(), Vec::new());
            public_leaves(&value, String::new(), &mut before);
            public_leaves(&redacted, String::new(), &mut after);
            prop_assert_eq!(before.len(), after.len());
            for ((path, old), (path_after, new)) in before.iter().zip(&after) {
                prop_assert_eq!(path, path_after);
                match old {
                    Value::String(s) => prop_assert_eq!(
                        new,
                        &Value::String(s.replace(KEEL_KEY, REDACTED).replace(PROVIDER_KEY, REDACTED))
                    ),
                    other => prop_assert_eq!(new, other),
                }
            }
        }
    }
}
