//! A trace's training lines: the three formats a dataset serves, made once when the trace
//! first enters the dataset, and the digests of a version's lines.

use sha2::{Digest, Sha256};

use super::{Digests, LineFormat};
use crate::traces::export::{self, Format};
use crate::traces::marks::Marks;

/// The lines of one trace, or `None` when the training formats do not all take it (not
/// complete, an error, no messages, or an answer without a choice to learn from).
pub struct TraceLines {
    pub chat: String,
    pub record: String,
    pub prompt: String,
    /// SHA-256 (hex) of the request's messages as stored.
    pub prompt_key: String,
}

pub fn of(trace: &entities::trace::Model) -> Option<TraceLines> {
    let none = Marks::default();
    let chat = export::convert(trace, Format::OpenaiChat, &none)?;
    let record = export::convert(trace, Format::Records, &none)?;
    let prompt = export::convert(trace, Format::Prompts, &none)?;
    let request: serde_json::Value = serde_json::from_str(&trace.request).ok()?;
    let messages = request.get("messages")?;
    Some(TraceLines {
        chat: chat.to_string(),
        record: record.to_string(),
        prompt: prompt.to_string(),
        prompt_key: hex::encode(Sha256::digest(messages.to_string())),
    })
}

/// The digests of a version's lines as they are read in order: per format, of the train
/// side, the validation side and the whole.
pub struct Hashers {
    by_format: Vec<(LineFormat, [Sha256; 3])>,
}

impl Default for Hashers {
    fn default() -> Self {
        Self {
            by_format: LineFormat::ALL
                .into_iter()
                .map(|format| (format, [Sha256::new(), Sha256::new(), Sha256::new()]))
                .collect(),
        }
    }
}

impl Hashers {
    /// One line (without its newline) of `format`, on the validation side or not.
    pub fn add(&mut self, format: LineFormat, line: &str, validation: bool) {
        if let Some((_, [train, valid, all])) = self.by_format.iter_mut().find(|(f, _)| *f == format) {
            let side = if validation { valid } else { train };
            for hasher in [side, all] {
                hasher.update(line.as_bytes());
                hasher.update(b"\n");
            }
        }
    }

    pub fn finish(self) -> std::collections::BTreeMap<String, Digests> {
        self.by_format
            .into_iter()
            .map(|(format, [train, validation, all])| {
                (
                    format.as_str().to_owned(),
                    Digests {
                        train: hex::encode(train.finalize()),
                        validation: hex::encode(validation.finalize()),
                        all: hex::encode(all.finalize()),
                    },
                )
            })
            .collect()
    }
}

/// The line of `format` a stored trace's lines hold.
pub fn line_of(line: &entities::dataset_line::Model, format: LineFormat) -> &str {
    match format {
        LineFormat::OpenaiChat => &line.chat,
        LineFormat::Records => &line.record,
        LineFormat::Prompts => &line.prompt,
    }
}

/// The column of `dataset_lines` that holds the lines of `format`.
pub fn column_of(format: LineFormat) -> entities::dataset_line::Column {
    use entities::dataset_line::Column;
    match format {
        LineFormat::OpenaiChat => Column::Chat,
        LineFormat::Records => Column::Record,
        LineFormat::Prompts => Column::Prompt,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metrics_label_every_line_format() {
        assert_eq!(crate::metrics::DATASET_FORMATS.as_slice(), LineFormat::NAMES);
    }

    #[test]
    fn a_split_digest_is_of_its_lines_each_with_a_newline() {
        let mut hashers = Hashers::default();
        hashers.add(LineFormat::OpenaiChat, "{\"a\":1}", false);
        hashers.add(LineFormat::OpenaiChat, "{\"b\":2}", true);
        let digests = hashers.finish();
        let chat = &digests["openai-chat"];
        assert_eq!(chat.train, hex::encode(Sha256::digest(b"{\"a\":1}\n")));
        assert_eq!(chat.validation, hex::encode(Sha256::digest(b"{\"b\":2}\n")));
        assert_eq!(chat.all, hex::encode(Sha256::digest(b"{\"a\":1}\n{\"b\":2}\n")));
        assert_eq!(digests["records"].train, hex::encode(Sha256::digest(b"")));
    }
}
