//! A refused form told in words: which field, and what to do about it. The API's 422 says the
//! same in a machine's terms (a JSON pointer, a regular expression); a person at the console
//! gets neither.

use serde_json::Value;

use crate::error::ValidationIssue;

/// "requests per minute", "models (item 3)": where the issue is, as a form's label would say.
pub fn field(loc: &[Value]) -> String {
    let mut words = String::new();
    let mut item = None;
    for step in loc.iter().skip(1) {
        match step {
            Value::String(name) => words = spaced(name),
            Value::Number(n) => item = n.as_u64(),
            _ => {}
        }
    }
    if words.is_empty() {
        words = "value".into();
    }
    match item {
        Some(i) => format!("{words} (item {})", i + 1),
        None => words,
    }
}

/// `requestsPerMinute` → `requests per minute`.
fn spaced(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for c in name.chars() {
        if c.is_ascii_uppercase() {
            out.push(' ');
            out.push(c.to_ascii_lowercase());
        } else if c == '_' {
            out.push(' ');
        } else {
            out.push(c);
        }
    }
    out
}

fn ctx_number(issue: &ValidationIssue, key: &str) -> Option<String> {
    issue.ctx.as_ref()?.get(key).map(|v| match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    })
}

/// What to do about `issue`, in words.
pub fn fix(issue: &ValidationIssue) -> String {
    match issue.kind.as_str() {
        "missing" => "fill it in".into(),
        "string_too_short" => match ctx_number(issue, "min_length").as_deref() {
            Some("1") | None => "fill it in".into(),
            Some(n) => format!("use at least {n} characters"),
        },
        "string_too_long" => match ctx_number(issue, "max_length") {
            Some(n) => format!("use at most {n} characters"),
            None => "make it shorter".into(),
        },
        "greater_than_equal" => match ctx_number(issue, "ge") {
            Some(n) => format!("use {n} or more"),
            None => "use a larger number".into(),
        },
        "less_than_equal" => match ctx_number(issue, "le") {
            Some(n) => format!("use {n} or less"),
            None => "use a smaller number".into(),
        },
        "greater_than" | "less_than" | "int_parsing" | "float_parsing" | "int_type" => {
            "use a whole number in its range".into()
        }
        "uuid_parsing" => "use an id as keel shows it".into(),
        "string_pattern_mismatch" if issue.msg.contains("NUL") => "take out the NUL character".into(),
        "string_pattern_mismatch" => pattern(
            issue
                .ctx
                .as_ref()
                .and_then(|c| c.get("pattern"))
                .and_then(Value::as_str),
        ),
        "too_short" => "choose at least one".into(),
        "too_long" => "choose fewer".into(),
        _ if looks_technical(&issue.msg) => "is not in a form it takes; see the hint beside it".into(),
        _ => issue.msg.clone(),
    }
}

/// Whether a message speaks in a machine's terms (a pattern, a pointer, a type name).
fn looks_technical(msg: &str) -> bool {
    msg.contains("pattern")
        || msg.contains('^')
        || msg.contains('$')
        || msg.contains("\\u")
        || msg.contains('/')
}

/// A pattern in words, for the patterns keel's fields have: a name of a few kinds of
/// characters (`^[a-z0-9_.:-]{1,50}$`), or text that is not blank.
fn pattern(pattern: Option<&str>) -> String {
    let Some(pattern) = pattern else {
        return "is not in a form it takes".into();
    };
    if pattern.contains("\\t") || pattern.contains("\\n") {
        return "write something other than spaces".into();
    }
    let class = pattern.strip_prefix("^[").and_then(|rest| rest.split_once(']'));
    let Some((class, rest)) = class else {
        return "is not in a form it takes".into();
    };
    let mut kinds: Vec<String> = Vec::new();
    let mut others = String::new();
    let mut chars = class.chars().peekable();
    while let Some(c) = chars.next() {
        let range = |from: char, to: char, chars: &mut std::iter::Peekable<std::str::Chars<'_>>| {
            let mut probe = chars.clone();
            (probe.next() == Some('-') && probe.next() == Some(to)).then(|| {
                chars.next();
                chars.next();
                from
            })
        };
        match c {
            'a' if range('a', 'z', &mut chars).is_some() => kinds.push("lowercase letters".into()),
            'A' if range('A', 'Z', &mut chars).is_some() => kinds.push("capital letters".into()),
            '0' if range('0', '9', &mut chars).is_some() => kinds.push("digits".into()),
            '\\' => {
                if let Some(escaped) = chars.next() {
                    others.push(escaped);
                }
            }
            other => others.push(other),
        }
    }
    if !others.is_empty() {
        let listed: Vec<String> = others.chars().map(|c| c.to_string()).collect();
        kinds.push(format!("the characters {}", listed.join(" ")));
    }
    let length = rest
        .strip_prefix('{')
        .and_then(|r| r.split_once('}'))
        .and_then(|(bounds, _)| bounds.split_once(','))
        .map(|(min, max)| format!(", {min} to {max} of them"))
        .unwrap_or_default();
    format!("use only {}{length}", kinds.join(", "))
}

/// Every issue of a refused form, each as "field: what to do".
pub fn issues(issues: &[ValidationIssue]) -> String {
    issues
        .iter()
        .map(|i| format!("{}: {}", field(&i.loc), fix(i)))
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn issue(loc: Value, kind: &str, msg: &str, ctx: Option<Value>) -> ValidationIssue {
        let mut issue = ValidationIssue::new(loc.as_array().unwrap().clone(), kind, msg);
        issue.ctx = ctx;
        issue
    }

    #[test]
    fn fields_and_fixes_read_as_words_never_as_patterns() {
        let said = issues(&[
            issue(
                json!(["body", "limits", "requestsPerMinute"]),
                "greater_than_equal",
                "Input should be greater than or equal to 1",
                Some(json!({"ge": 1})),
            ),
            issue(
                json!(["body", "models", 2]),
                "string_too_long",
                "String should have at most 200 characters",
                Some(json!({"max_length": 200})),
            ),
            issue(
                json!(["body", "tag"]),
                "string_pattern_mismatch",
                "String should match pattern '^[a-z0-9_.:-]{1,50}$'",
                Some(json!({"pattern": "^[a-z0-9_.:-]{1,50}$"})),
            ),
            issue(
                json!(["body", "name"]),
                "string_pattern_mismatch",
                "String should match pattern '^([^\\u0000]*[^\\u0000\\t\\n])?$'",
                Some(json!({"pattern": "^([^\\u0000]*[^\\u0000\\t\\n])?$"})),
            ),
        ]);
        assert_eq!(
            said,
            "requests per minute: use 1 or more; models (item 3): use at most 200 characters; \
             tag: use only lowercase letters, digits, the characters _ . : -, 1 to 50 of them; \
             name: write something other than spaces"
        );
        for technical in ["^", "$", "\\u", "pattern"] {
            assert!(!said.contains(technical), "{technical} in {said}");
        }
    }
}
