//! Token counts estimated from the text, for a streamed call whose provider sent no usage:
//! OpenAI's `o200k_base` vocabulary (shipped inside `tiktoken-rs`, nothing downloaded), and
//! OpenAI's own counting of chat messages (3 tokens a message, 3 to prime the reply). An
//! estimate is marked as one on its trace (`usageEstimated`).

use serde_json::Value;

fn tokens(text: &str) -> i64 {
    tiktoken_rs::o200k_base_singleton()
        .encode_with_special_tokens(text)
        .len() as i64
}

/// The texts of a message: its content (a string, or parts' texts), its name, and its tool
/// calls' names and arguments.
fn message_texts(message: &Value, into: &mut Vec<String>) {
    match message.get("content") {
        Some(Value::String(text)) => into.push(text.clone()),
        Some(Value::Array(parts)) => into.extend(
            parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .map(str::to_owned),
        ),
        _ => {}
    }
    for key in ["role", "name"] {
        if let Some(text) = message.get(key).and_then(Value::as_str) {
            into.push(text.to_owned());
        }
    }
    for call in message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        for pointer in ["/function/name", "/function/arguments"] {
            if let Some(text) = call.pointer(pointer).and_then(Value::as_str) {
                into.push(text.to_owned());
            }
        }
    }
}

/// `(prompt, completion)` tokens of a request's messages and a completion's choices.
pub fn estimate(request: &[u8], completion: &Value) -> (i64, i64) {
    let request: Value = serde_json::from_slice(request).unwrap_or(Value::Null);
    let messages = request.get("messages").and_then(Value::as_array);
    let prompt = messages.map_or(0, |messages| {
        3 + messages
            .iter()
            .map(|m| {
                let mut texts = Vec::new();
                message_texts(m, &mut texts);
                3 + texts.iter().map(|t| tokens(t)).sum::<i64>()
            })
            .sum::<i64>()
    });
    let completion = completion
        .get("choices")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|choice| choice.get("message"))
        .map(|message| {
            let mut texts = Vec::new();
            message_texts(
                &Value::Object(
                    message
                        .as_object()
                        .map(|m| {
                            m.iter()
                                .filter(|(k, _)| *k != "role")
                                .map(|(k, v)| (k.clone(), v.clone()))
                                .collect()
                        })
                        .unwrap_or_default(),
                ),
                &mut texts,
            );
            texts.iter().map(|t| tokens(t)).sum::<i64>()
        })
        .sum();
    (prompt, completion)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn counts_what_a_model_reads_and_writes() {
        let request =
            json!({"model": "m", "messages": [{"role": "user", "content": "Hello world"}]}).to_string();
        let completion = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi there, friend."}}]});
        let (prompt, reply) = estimate(request.as_bytes(), &completion);
        // "Hello world" is 2 tokens, "user" 1: 3 + (3 + 3).
        assert_eq!(prompt, 9);
        assert!((3..=6).contains(&reply), "{reply}");
        let tools = json!({"choices": [{"message": {"content": null, "tool_calls": [
            {"function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]}}]});
        assert!(estimate(b"{}", &tools).1 >= 5);
        assert_eq!(estimate(b"not json", &json!({})), (0, 0));
    }
}
