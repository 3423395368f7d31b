//! `keel traces export`: a project's traces as JSONL, read through the HTTP API one page at
//! a time and written as they come (constant memory, whatever the project's size).
//!
//! With `--out FILE` the lines go to `FILE.part` and, after each page, where the walk stands
//! goes to `FILE.cursor`; at the end `FILE.part` becomes `FILE`. A failed export leaves an
//! existing `FILE` untouched, and `--resume` goes on from the last page written.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use keel_core::traces::export::openai_chat_line;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub struct ExportArgs {
    pub project: String,
    /// `records`, `prompts`, `raw` (the API's) or `openai-chat` (made here from `raw`).
    pub format: String,
    /// Traces per page (and, without `all`, the newest this many).
    pub limit: u16,
    /// Every page, following `nextCursor`.
    pub all: bool,
    pub since: Option<String>,
    pub until: Option<String>,
    pub model: Option<String>,
    pub tag: Option<String>,
    /// `NAME:VALUE`.
    pub min_score: Option<String>,
    pub base_url: String,
    pub api_key: String,
}

/// Where an interrupted export stands (`FILE.cursor`).
#[derive(Debug, Serialize, Deserialize)]
struct Checkpoint {
    project: String,
    format: String,
    /// The next page's cursor.
    cursor: String,
    /// Bytes of `FILE.part` written up to this page (anything after is cut on resume).
    bytes: u64,
    written: u64,
    skipped: u64,
}

/// What an export wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    pub written: u64,
    pub skipped: u64,
}

/// `FILE` with `suffix` added to its name (`FILE.part`, `FILE.cursor`).
pub(crate) fn side_file(out: &Path, suffix: &str) -> PathBuf {
    let mut name = out.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(suffix);
    out.with_file_name(name)
}

/// Exports to `out` (or standard output), stopping at Ctrl-C (SIGINT) or SIGTERM with a word
/// on what was kept and how to go on: pages already written stay in `FILE.part` and
/// `FILE.cursor`, and the same command with `--resume` continues after them.
pub async fn export_until_interrupted(
    args: &ExportArgs,
    out: Option<&Path>,
    resume: bool,
) -> anyhow::Result<()> {
    let export = async {
        match out {
            Some(path) => export_to_file(args, path, resume).await.map(drop),
            None => export_to_stdout(args).await.map(drop),
        }
    };
    or_interrupted(export, out, "pages").await
}

/// `work`, unless Ctrl-C or SIGTERM comes first: then an error that says where the `kept`
/// (pages, lines) written so far are and how to go on.
pub(crate) async fn or_interrupted(
    work: impl std::future::Future<Output = anyhow::Result<()>>,
    out: Option<&Path>,
    kept: &str,
) -> anyhow::Result<()> {
    tokio::select! {
        done = work => done,
        () = interrupted() => {
            let advice = match out {
                Some(path) => format!(
                    "interrupted; the {kept} written so far are kept in {}: run the same command with --resume to go on",
                    side_file(path, ".part").display()
                ),
                None => "interrupted; standard output has what was written so far (write to a file with --out to be able to --resume)".to_owned(),
            };
            anyhow::bail!("{advice}")
        }
    }
}

/// Ctrl-C or SIGTERM.
async fn interrupted() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// Exports to `out` through `FILE.part`, renamed at the end; `resume` goes on from
/// `FILE.cursor`.
pub async fn export_to_file(args: &ExportArgs, out: &Path, resume: bool) -> anyhow::Result<Written> {
    let part = side_file(out, ".part");
    let checkpoint_path = side_file(out, ".cursor");
    let (file, start) = if resume {
        let text = std::fs::read_to_string(&checkpoint_path).map_err(|e| {
            anyhow::anyhow!(
                "nothing to resume: {} cannot be read ({e}); run without --resume",
                checkpoint_path.display()
            )
        })?;
        let checkpoint: Checkpoint = serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("{} is not an export checkpoint: {e}", checkpoint_path.display()))?;
        if checkpoint.project != args.project || checkpoint.format != args.format {
            anyhow::bail!(
                "{} is an export of project {} as {}; resume it with the same --project and --format",
                checkpoint_path.display(),
                checkpoint.project,
                checkpoint.format
            );
        }
        let mut file = OpenOptions::new()
            .write(true)
            .open(&part)
            .map_err(|e| anyhow::anyhow!("nothing to resume: {} ({e})", part.display()))?;
        // Lines written after the last checkpoint are written again.
        file.set_len(checkpoint.bytes)?;
        file.seek(std::io::SeekFrom::End(0))?;
        (file, Some(checkpoint))
    } else {
        let file =
            File::create(&part).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", part.display()))?;
        (file, None)
    };
    let mut sink = FileSink {
        file: BufWriter::new(file),
        checkpoint_path: &checkpoint_path,
        args,
    };
    let written = walk(args, &mut sink, start).await?;
    sink.file.flush()?;
    sink.file.get_ref().sync_all()?;
    drop(sink);
    std::fs::rename(&part, out)
        .map_err(|e| anyhow::anyhow!("cannot move {} to {}: {e}", part.display(), out.display()))?;
    let _ = std::fs::remove_file(&checkpoint_path);
    Ok(written)
}

/// Exports to standard output (no checkpoints: there is nothing to resume into).
pub async fn export_to_stdout(args: &ExportArgs) -> anyhow::Result<Written> {
    let mut sink = StreamSink(std::io::stdout().lock());
    walk(args, &mut sink, None).await
}

/// Where pages go.
trait Sink {
    fn line(&mut self, record: &Value) -> anyhow::Result<()>;
    /// A page is written: remember where the walk stands.
    fn page_done(&mut self, cursor: &str, done: Written) -> anyhow::Result<()>;
}

struct StreamSink<W: Write>(W);

impl<W: Write> Sink for StreamSink<W> {
    fn line(&mut self, record: &Value) -> anyhow::Result<()> {
        serde_json::to_writer(&mut self.0, record)?;
        self.0.write_all(b"\n")?;
        Ok(())
    }

    fn page_done(&mut self, _: &str, _: Written) -> anyhow::Result<()> {
        self.0.flush()?;
        Ok(())
    }
}

struct FileSink<'a> {
    file: BufWriter<File>,
    checkpoint_path: &'a Path,
    args: &'a ExportArgs,
}

impl Sink for FileSink<'_> {
    fn line(&mut self, record: &Value) -> anyhow::Result<()> {
        serde_json::to_writer(&mut self.file, record)?;
        self.file.write_all(b"\n")?;
        Ok(())
    }

    fn page_done(&mut self, cursor: &str, done: Written) -> anyhow::Result<()> {
        self.file.flush()?;
        let bytes = self.file.get_ref().metadata()?.len();
        let checkpoint = Checkpoint {
            project: self.args.project.clone(),
            format: self.args.format.clone(),
            cursor: cursor.to_owned(),
            bytes,
            written: done.written,
            skipped: done.skipped,
        };
        // Replaced whole (write, then rename): never half a checkpoint.
        let tmp = side_file(self.checkpoint_path, ".tmp");
        std::fs::write(&tmp, serde_json::to_vec(&checkpoint)?)?;
        std::fs::rename(&tmp, self.checkpoint_path)?;
        Ok(())
    }
}

/// Walks the pages (one, or every one with `all`) from `start`, writing each record.
async fn walk(args: &ExportArgs, sink: &mut dyn Sink, start: Option<Checkpoint>) -> anyhow::Result<Written> {
    let url = format!("{}/api/traces/export", args.base_url.trim_end_matches('/'));
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(300))
        .build()?;
    let openai_chat = args.format == "openai-chat";
    let api_format = if openai_chat { "raw" } else { args.format.as_str() };
    let mut done = start.as_ref().map_or(Written::default(), |c| Written {
        written: c.written,
        skipped: c.skipped,
    });
    let mut cursor = start.map(|c| c.cursor);
    let progress = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    progress.set_style(
        ProgressStyle::with_template("{spinner} {pos} traces written, {msg} [{elapsed}]")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    progress.set_position(done.written);
    progress.set_message(format!("{} skipped", done.skipped));
    let started = std::time::Instant::now();
    let resumed_at = done.written;
    loop {
        let mut query: Vec<(&str, String)> = vec![
            ("project_id", args.project.clone()),
            ("format", api_format.to_owned()),
            ("limit", args.limit.to_string()),
        ];
        for (name, value) in [
            ("since", &args.since),
            ("until", &args.until),
            ("model", &args.model),
            ("tag", &args.tag),
            ("minScore", &args.min_score),
        ] {
            if let Some(value) = value {
                query.push((name, value.clone()));
            }
        }
        if let Some(cursor) = &cursor {
            query.push(("cursor", cursor.clone()));
        }
        let page = fetch(&http, &url, &args.api_key, &query).await?;
        let records = page["records"].as_array().map(Vec::as_slice).unwrap_or_default();
        done.skipped += page["skipped"].as_u64().unwrap_or(0);
        for record in records {
            let line = match openai_chat {
                true => openai_chat_line(record),
                false => Some(record.clone()),
            };
            match line {
                Some(line) => {
                    sink.line(&line)?;
                    // An OTLP document holds a page of traces, a span each.
                    done.written += match args.format.as_str() {
                        "otlp-json" => line
                            .pointer("/resourceSpans/0/scopeSpans/0/spans")
                            .and_then(Value::as_array)
                            .map_or(0, |spans| spans.len() as u64),
                        _ => 1,
                    };
                }
                None => done.skipped += 1,
            }
        }
        progress.set_position(done.written);
        progress.set_message(progress_message(done, resumed_at, started.elapsed()));
        let next = page["nextCursor"].as_str().map(str::to_owned);
        match (args.all, next) {
            (true, Some(next)) => {
                sink.page_done(&next, done)?;
                cursor = Some(next);
            }
            _ => {
                sink.page_done("", done)?;
                break;
            }
        }
    }
    progress.finish_and_clear();
    let mut stderr = std::io::stderr().lock();
    writeln!(stderr, "{}", summary(done, &args.format, &args.project))?;
    Ok(done)
}

/// The progress bar's message: what was skipped, and records a second, whole.
fn progress_message(done: Written, resumed_at: u64, elapsed: Duration) -> String {
    let secs = elapsed.as_secs_f64();
    let rate = match secs > 0.0 {
        true => ((done.written - resumed_at) as f64 / secs).round() as u64,
        false => 0,
    };
    format!("{} skipped, {rate}/s", done.skipped)
}

/// The closing line: `exported 3003 records (format records) of project P (2 skipped)`.
fn summary(done: Written, format: &str, project: &str) -> String {
    let noun = if done.written == 1 { "record" } else { "records" };
    format!(
        "exported {} {noun} (format {format}) of project {project} ({} skipped)",
        done.written, done.skipped
    )
}

async fn fetch(
    http: &reqwest::Client,
    url: &str,
    api_key: &str,
    query: &[(&str, String)],
) -> anyhow::Result<Value> {
    let response = http
        .get(url)
        .bearer_auth(api_key)
        .query(query)
        .send()
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach {url}: {}", e.without_url()))?;
    let status = response.status();
    let body: Value = response
        .json()
        .await
        .map_err(|e| anyhow::anyhow!("{url} answered {status} without JSON: {}", e.without_url()))?;
    if !status.is_success() {
        anyhow::bail!("{url} answered {status}: {}", body["detail"]);
    }
    Ok(body)
}

#[cfg(test)]
mod summary_tests {
    use super::*;

    #[test]
    fn the_closing_line_and_the_rate_read_plainly() {
        let done = Written {
            written: 3003,
            skipped: 2,
        };
        assert_eq!(
            summary(done, "records", "p"),
            "exported 3003 records (format records) of project p (2 skipped)"
        );
        let one = Written {
            written: 1,
            skipped: 0,
        };
        assert_eq!(
            summary(one, "openai-chat", "p"),
            "exported 1 record (format openai-chat) of project p (0 skipped)"
        );
        let rate = progress_message(
            Written {
                written: 41_371,
                skipped: 0,
            },
            0,
            Duration::from_millis(999),
        );
        assert_eq!(rate, "0 skipped, 41412/s");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn raw(request: Value, response: Value, status: i64) -> Value {
        json!({"statusCode": status, "request": request, "response": response, "complete": true, "error": null})
    }

    #[test]
    fn a_broken_stream_or_an_error_is_never_a_line() {
        let pair = || {
            raw(
                json!({"messages": [{"role": "user", "content": "Count"}]}),
                json!({"choices": [{"message": {"role": "assistant", "content": "tok0 tok1 tok2 "}}]}),
                200,
            )
        };
        assert!(openai_chat_line(&pair()).is_some());
        let mut cut = pair();
        cut["complete"] = json!(false);
        assert_eq!(openai_chat_line(&cut), None);
        let mut errored = pair();
        errored["error"] = json!("upstream error: overloaded");
        assert_eq!(openai_chat_line(&errored), None);
    }

    #[test]
    fn a_lone_turn_becomes_the_question_and_the_answer() {
        let line = openai_chat_line(&raw(
            json!({"messages": [{"role": "user", "content": "Capital of France?"}]}),
            json!({"choices": [{"message": {"role": "assistant", "content": "Paris."}}]}),
            200,
        ))
        .expect("a pair");
        assert_eq!(
            line,
            json!({"messages": [
                {"role": "user", "content": "Capital of France?"},
                {"role": "assistant", "content": "Paris."}
            ]})
        );
    }

    #[test]
    fn a_conversation_keeps_its_system_prompt_and_turns() {
        let line = openai_chat_line(&raw(
            json!({"messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": "Capital of France?"}
            ]}),
            json!({"choices": [{"message": {"role": "assistant", "content": [{"type": "text", "text": "Paris"}, {"type": "text", "text": "."}]}}]}),
            200,
        ))
        .expect("a pair");
        let messages = line["messages"].as_array().unwrap();
        assert_eq!(messages.len(), 5);
        assert_eq!(messages[0], json!({"role": "system", "content": "Be brief."}));
        assert_eq!(messages[4], json!({"role": "assistant", "content": "Paris."}));
    }

    #[test]
    fn a_tool_call_is_kept_and_errors_are_skipped() {
        let calls = json!([{"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}}]);
        let line = openai_chat_line(&raw(
            json!({"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": []}),
            json!({"choices": [{"message": {"role": "assistant", "content": null, "tool_calls": calls}}]}),
            200,
        ))
        .expect("a pair");
        assert_eq!(line["messages"][1]["tool_calls"], calls);
        assert_eq!(line["messages"][1]["content"], Value::Null);
        // No tools declared (an empty list): none on the line.
        assert!(line.get("tools").is_none());
        let tools = json!([{"type": "function", "function": {"name": "weather", "description": "Today's weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]);
        let line = openai_chat_line(&raw(
            json!({"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": tools, "parallel_tool_calls": false}),
            json!({"choices": [{"message": {"role": "assistant", "content": null, "tool_calls": calls}}]}),
            200,
        ))
        .expect("a pair");
        assert_eq!(
            line["tools"], tools,
            "the functions' schemas stay with the example"
        );
        assert_eq!(line["parallel_tool_calls"], false);
        assert_eq!(
            openai_chat_line(&raw(
                json!({"messages": [{"role": "user", "content": "x"}]}),
                json!({"error": {}}),
                401
            )),
            None
        );
        assert_eq!(
            openai_chat_line(&raw(json!({"messages": []}), json!({}), 200)),
            None
        );
    }
}
