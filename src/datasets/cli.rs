//! `keel datasets export`: a dataset version's lines of one split, downloaded through the
//! HTTP API as one stream and written as they come (constant memory, whatever the size),
//! with a progress bar on standard error, checked against the version's SHA-256 at the end.
//!
//! With `--out FILE` the lines go to `FILE.part`, and what is being downloaded (dataset,
//! version, format, split, digest) to `FILE.cursor`; at the end, once the digest matches,
//! `FILE.part` becomes `FILE`. `--resume` keeps the whole lines of `FILE.part` and asks for
//! the rest (`offset`): a version's bytes never change, so the two halves make the same file.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Read, Seek, Write};
use std::path::Path;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::traces::cli::side_file;

pub struct ExportArgs {
    pub dataset: String,
    /// The latest when absent (on `--resume`, the checkpoint's).
    pub version: Option<u32>,
    pub format: String,
    pub split: String,
    pub base_url: String,
    pub api_key: String,
}

/// What an interrupted download was (`FILE.cursor`).
#[derive(Debug, Serialize, Deserialize)]
struct Checkpoint {
    dataset: String,
    version: u32,
    format: String,
    split: String,
    lines: u64,
    sha256: String,
}

/// What a download wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Downloaded {
    pub version: u32,
    pub lines: u64,
    pub sha256: String,
}

/// Downloads to `out` (or standard output), stopping at Ctrl-C or SIGTERM with a word on
/// what was kept and how to go on.
pub async fn export_until_interrupted(
    args: &ExportArgs,
    out: Option<&Path>,
    resume: bool,
) -> anyhow::Result<()> {
    let export = async {
        let done = match out {
            Some(path) => export_to_file(args, path, resume).await?,
            None => export_to_stdout(args).await?,
        };
        let noun = if done.lines == 1 { "line" } else { "lines" };
        eprintln!(
            "exported {} {noun} ({}, split {}) of dataset {} version {}; sha256 {} verified",
            done.lines, args.format, args.split, args.dataset, done.version, done.sha256
        );
        Ok(())
    };
    crate::traces::cli::or_interrupted(export, out, "lines").await
}

/// Downloads to `out` through `FILE.part`, renamed once the digest matches; `resume` goes on
/// after the whole lines `FILE.part` has.
pub async fn export_to_file(args: &ExportArgs, out: &Path, resume: bool) -> anyhow::Result<Downloaded> {
    let part = side_file(out, ".part");
    let checkpoint_path = side_file(out, ".cursor");
    let http = client()?;
    let mut hasher = Sha256::new();
    let (file, checkpoint, kept) = match resume {
        true => {
            let checkpoint = read_checkpoint(&checkpoint_path, args)?;
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&part)
                .map_err(|e| anyhow::anyhow!("nothing to resume: {} ({e})", part.display()))?;
            let (bytes, lines) = whole_lines(&mut file, &mut hasher)?;
            // A line cut by the interruption is fetched again.
            file.set_len(bytes)?;
            file.seek(std::io::SeekFrom::End(0))?;
            (file, checkpoint, lines)
        }
        false => {
            let version = match args.version {
                Some(version) => version,
                None => latest_version(&http, args).await?,
            };
            let file =
                File::create(&part).map_err(|e| anyhow::anyhow!("cannot create {}: {e}", part.display()))?;
            let checkpoint = Checkpoint {
                dataset: args.dataset.clone(),
                version,
                format: args.format.clone(),
                split: args.split.clone(),
                lines: 0,
                sha256: String::new(),
            };
            (file, checkpoint, 0)
        }
    };
    let mut sink = BufWriter::new(file);
    let mut started = false;
    let mut checkpoint = checkpoint;
    let done = download(
        &http,
        args,
        checkpoint.version,
        kept,
        &mut hasher,
        &mut sink,
        |lines, sha256| {
            if checkpoint.sha256.is_empty() {
                checkpoint.lines = lines;
                checkpoint.sha256 = sha256.to_owned();
            } else if checkpoint.sha256 != sha256 {
                anyhow::bail!(
                    "{} says version {} has sha256 {}, keel now says {sha256}: run without --resume",
                    checkpoint_path.display(),
                    checkpoint.version,
                    checkpoint.sha256
                );
            }
            if !started {
                started = true;
                write_checkpoint(&checkpoint_path, &checkpoint)?;
            }
            Ok(())
        },
    )
    .await?;
    sink.flush()?;
    sink.get_ref().sync_all()?;
    drop(sink);
    std::fs::rename(&part, out)
        .map_err(|e| anyhow::anyhow!("cannot move {} to {}: {e}", part.display(), out.display()))?;
    let _ = std::fs::remove_file(&checkpoint_path);
    Ok(done)
}

/// Downloads to standard output (nothing to resume into), checking the digest at the end.
pub async fn export_to_stdout(args: &ExportArgs) -> anyhow::Result<Downloaded> {
    let http = client()?;
    let version = match args.version {
        Some(version) => version,
        None => latest_version(&http, args).await?,
    };
    let mut out = std::io::stdout().lock();
    let mut hasher = Sha256::new();
    download(&http, args, version, 0, &mut hasher, &mut out, |_, _| Ok(())).await
}

fn client() -> anyhow::Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .read_timeout(Duration::from_secs(300))
        .build()?)
}

fn read_checkpoint(path: &Path, args: &ExportArgs) -> anyhow::Result<Checkpoint> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        anyhow::anyhow!(
            "nothing to resume: {} cannot be read ({e}); run without --resume",
            path.display()
        )
    })?;
    let checkpoint: Checkpoint = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{} is not a dataset download's checkpoint: {e}", path.display()))?;
    let same = checkpoint.dataset == args.dataset
        && checkpoint.format == args.format
        && checkpoint.split == args.split
        && args.version.is_none_or(|v| v == checkpoint.version);
    if !same {
        anyhow::bail!(
            "{} is a download of dataset {} version {} ({}, split {}); resume it with the same --dataset, --version, --format and --split",
            path.display(),
            checkpoint.dataset,
            checkpoint.version,
            checkpoint.format,
            checkpoint.split
        );
    }
    Ok(checkpoint)
}

/// Replaced whole (write, then rename): never half a checkpoint.
fn write_checkpoint(path: &Path, checkpoint: &Checkpoint) -> anyhow::Result<()> {
    let tmp = side_file(path, ".tmp");
    std::fs::write(&tmp, serde_json::to_vec(checkpoint)?)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// The bytes and lines of `file` up to its last newline, hashed into `hasher`.
fn whole_lines(file: &mut File, hasher: &mut Sha256) -> anyhow::Result<(u64, u64)> {
    file.seek(std::io::SeekFrom::Start(0))?;
    let (mut bytes, mut lines, mut pending) = (0u64, 0u64, Vec::new());
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let n = file.read(&mut buffer)?;
        if n == 0 {
            return Ok((bytes, lines));
        }
        let chunk = &buffer[..n];
        match chunk.iter().rposition(|b| *b == b'\n') {
            Some(last) => {
                hasher.update(&pending);
                hasher.update(&chunk[..=last]);
                bytes += (pending.len() + last + 1) as u64;
                lines += chunk[..=last].iter().filter(|b| **b == b'\n').count() as u64;
                pending.clear();
                pending.extend_from_slice(&chunk[last + 1..]);
            }
            None => pending.extend_from_slice(chunk),
        }
    }
}

async fn latest_version(http: &reqwest::Client, args: &ExportArgs) -> anyhow::Result<u32> {
    let url = format!(
        "{}/api/datasets/{}",
        args.base_url.trim_end_matches('/'),
        args.dataset
    );
    let response = http
        .get(&url)
        .bearer_auth(&args.api_key)
        .send()
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach {url}: {}", e.without_url()))?;
    let status = response.status();
    let body: serde_json::Value = response
        .json()
        .await
        .map_err(|e| anyhow::anyhow!("{url} answered {status} without JSON: {}", e.without_url()))?;
    if !status.is_success() {
        anyhow::bail!("{url} answered {status}: {}", body["detail"]);
    }
    body["version"]
        .as_u64()
        .map(|v| v as u32)
        .ok_or_else(|| anyhow::anyhow!("{url} answered a dataset without a version"))
}

/// Streams the version's lines after the first `kept` into `sink`, hashing them, and checks
/// the whole digest at the end. `started(lines, sha256)` hears the headers first.
async fn download(
    http: &reqwest::Client,
    args: &ExportArgs,
    version: u32,
    kept: u64,
    hasher: &mut Sha256,
    sink: &mut dyn Write,
    mut started: impl FnMut(u64, &str) -> anyhow::Result<()>,
) -> anyhow::Result<Downloaded> {
    let url = format!(
        "{}/api/datasets/{}/versions/{version}/export",
        args.base_url.trim_end_matches('/'),
        args.dataset
    );
    let query = [
        ("format", args.format.clone()),
        ("split", args.split.clone()),
        ("offset", kept.to_string()),
    ];
    let mut response = http
        .get(&url)
        .bearer_auth(&args.api_key)
        .query(&query)
        .send()
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach {url}: {}", e.without_url()))?;
    let status = response.status();
    if !status.is_success() {
        let body: serde_json::Value = response.json().await.unwrap_or_default();
        anyhow::bail!("{url} answered {status}: {}", body["detail"]);
    }
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .ok_or_else(|| anyhow::anyhow!("{url} answered without {name}"))
    };
    let expected = header("x-dataset-sha256")?;
    let total: u64 = header("x-dataset-lines")?
        .parse()
        .map_err(|_| anyhow::anyhow!("{url} answered an X-Dataset-Lines that is no count"))?;
    started(total, &expected)?;
    let progress = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    progress.set_style(
        ProgressStyle::with_template("{bar:30} {pos}/{len} lines, {msg} [{elapsed}, {eta} left]")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    progress.set_position(kept);
    let (mut lines, mut bytes) = (kept, 0u64);
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| anyhow::anyhow!("the download from {url} broke off: {}", e.without_url()))?
    {
        hasher.update(&chunk);
        sink.write_all(&chunk)?;
        lines += chunk.iter().filter(|b| **b == b'\n').count() as u64;
        bytes += chunk.len() as u64;
        progress.set_position(lines);
        progress.set_message(format!("{} MiB", bytes / (1024 * 1024)));
    }
    sink.flush()?;
    progress.finish_and_clear();
    let got = hex::encode(hasher.clone().finalize());
    if lines != total || got != expected {
        anyhow::bail!(
            "the download is not version {version}'s lines: {lines} lines with sha256 {got}, keel said {total} with {expected}"
        );
    }
    Ok(Downloaded {
        version,
        lines,
        sha256: got,
    })
}
