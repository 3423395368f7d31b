//! `keel traces export`: a project's traces as JSONL, read through the HTTP API.

use std::io::Write;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::Value;

pub struct ExportArgs {
    pub project: String,
    pub format: String,
    pub limit: u16,
    pub base_url: String,
    pub api_key: String,
}

/// Fetches the export and writes one record a line to `out`; a summary goes to stderr.
pub async fn export(args: &ExportArgs, mut out: impl Write) -> anyhow::Result<()> {
    let url = format!("{}/api/traces/export", args.base_url.trim_end_matches('/'));
    let response = reqwest::Client::new()
        .get(&url)
        .bearer_auth(&args.api_key)
        .query(&[
            ("project_id", args.project.as_str()),
            ("format", args.format.as_str()),
            ("limit", &args.limit.to_string()),
        ])
        .send()
        .await
        .map_err(|e| anyhow::anyhow!("cannot reach {url}: {e}"))?;
    let status = response.status();
    let body: Value = response
        .json()
        .await
        .map_err(|e| anyhow::anyhow!("{url} answered {status} without JSON: {e}"))?;
    if !status.is_success() {
        anyhow::bail!("{url} answered {status}: {}", body["detail"]);
    }
    let records = body["records"].as_array().cloned().unwrap_or_default();
    let progress = ProgressBar::with_draw_target(Some(records.len() as u64), ProgressDrawTarget::stderr());
    progress.set_style(
        ProgressStyle::with_template("{bar:40} {pos}/{len} records")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    for record in &records {
        serde_json::to_writer(&mut out, record)?;
        out.write_all(b"\n")?;
        progress.inc(1);
    }
    out.flush()?;
    progress.finish_and_clear();
    let mut stderr = std::io::stderr().lock();
    writeln!(
        stderr,
        "exported {} {} record(s) of project {} ({} skipped)",
        records.len(),
        args.format,
        args.project,
        body["skipped"]
    )?;
    Ok(())
}
