//! The exporter: every `otlp_push.interval_ms` (and at once when a batch's worth queued
//! here), each project with traces waiting and not backed off gets its batches pushed, up to
//! eight projects at a time: leased, read, made spans, encoded, posted. A 2xx removes them; a
//! failure gives them back, backs the project off (1 s doubling to `max_backoff_secs`) and
//! drops what has waited past `drop_after_hours`. A batch whose exporter died is sent again
//! when its lease lapses (at least once).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chrono::Utc;
use futures_util::StreamExt;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse;
use prost::Message;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::{encode, repo, service, Push};
use crate::domain::{ProjectId, TraceId};
use crate::traces::{marks, otlp};

/// Traces queued for pushing on this instance since the exporter last looked, and what
/// wakes it once they make a batch.
static QUEUED: AtomicUsize = AtomicUsize::new(0);
static BATCH: AtomicUsize = AtomicUsize::new(512);
static WAKE: Notify = Notify::const_new();

/// The trace writer put `n` traces in the outbox.
pub(crate) fn queued(n: u64) {
    let before = QUEUED.fetch_add(n as usize, Ordering::Relaxed);
    if before + n as usize >= BATCH.load(Ordering::Relaxed) {
        WAKE.notify_one();
    }
}

/// Projects pushed at once, and looked at in one pass at most.
const PROJECTS_AT_ONCE: usize = 8;
const PROJECTS_A_PASS: u64 = 64;
/// The most of an endpoint's answer kept as its error (the rest is read no further than 64 KiB).
const ANSWER_KEPT: usize = 300;
const ANSWER_READ: usize = 64 * 1024;

/// Pushes until `stop`.
pub async fn run(push: Push, stop: CancellationToken) {
    let settings = push.settings.clone();
    BATCH.store(settings.batch_spans.max(1), Ordering::Relaxed);
    let client = match crate::webhooks::dispatcher::checked_client_builder(
        push.rules,
        "keel-otlp/1",
        Duration::from_secs(settings.timeout_secs),
    )
    .build()
    {
        Ok(client) => client,
        Err(err) => {
            tracing::error!(error = %err, "OTLP exporter: no HTTP client; recorded calls are not pushed");
            return;
        }
    };
    let interval = Duration::from_millis(settings.interval_ms);
    loop {
        QUEUED.store(0, Ordering::Relaxed);
        pass(&push, &client, &stop).await;
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
            () = WAKE.notified() => {}
        }
    }
}

/// One look at every project with traces waiting.
async fn pass(push: &Push, client: &reqwest::Client, stop: &CancellationToken) {
    let projects = match repo::due_projects(&push.db, Utc::now(), PROJECTS_A_PASS).await {
        Ok(projects) => projects,
        Err(err) => {
            tracing::warn!(error = %err, "OTLP exporter: reading the projects with traces waiting failed");
            return;
        }
    };
    futures_util::stream::iter(projects)
        .for_each_concurrent(PROJECTS_AT_ONCE, |project_id| async move {
            if let Err(err) = push_project(push, client, &project_id, stop).await {
                tracing::warn!(project_id = %project_id, error = %err, "OTLP exporter: pushing a project's traces failed");
            }
        })
        .await;
}

/// A project's waiting traces, batch after batch, until none waits, a push fails or `stop`.
async fn push_project(
    push: &Push,
    client: &reqwest::Client,
    project_id: &ProjectId,
    stop: &CancellationToken,
) -> Result<(), sea_orm::DbErr> {
    let settings = &push.settings;
    let db = &push.db;
    while !stop.is_cancelled() {
        let now = Utc::now();
        let until = now + chrono::Duration::seconds(settings.lease_secs as i64);
        let leased = repo::lease(db, project_id, now, until, settings.batch_spans as u64).await?;
        if leased.is_empty() {
            return Ok(());
        }
        let ids: Vec<TraceId> = leased.iter().map(|row| row.trace_id.clone()).collect();
        let Some(export) = repo::find_export(db, project_id).await? else {
            let dropped = repo::remove(db, &ids).await?;
            push.metrics.otlp_spans("dropped").inc_by(dropped);
            return Ok(());
        };
        let mut traces = crate::traces::repo::by_ids(db, &ids).await?;
        traces.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        // Traces retention deleted before they were pushed have nothing left to send.
        let gone: Vec<TraceId> = ids
            .iter()
            .filter(|id| !traces.iter().any(|t| t.id == **id))
            .cloned()
            .collect();
        if !gone.is_empty() {
            let dropped = repo::remove(db, &gone).await?;
            push.metrics.otlp_spans("dropped").inc_by(dropped);
        }
        let sent: Vec<TraceId> = traces.iter().map(|t| t.id.clone()).collect();
        if sent.is_empty() {
            continue;
        }
        let marks = marks::marks_of(db, &sent).await?;
        let spans: Vec<serde_json::Value> = traces
            .iter()
            .map(|t| otlp::span(t, marks.get(&t.id).unwrap_or(&marks::Marks::default())))
            .collect();
        let outcome = match encode::request(&spans) {
            Ok(body) => match service::headers_of(push, &export) {
                Ok(headers) => send(client, &export.url, &headers, body).await,
                Err(reason) => Err(reason),
            },
            Err(err) => Err(format!("the spans could not be encoded: {err}")),
        };
        let now = Utc::now();
        match outcome {
            Ok(rejected) => {
                repo::remove(db, &sent).await?;
                repo::record_success(db, project_id, now).await?;
                push.metrics.otlp_spans("exported").inc_by(sent.len() as u64);
                if let Some(rejected) = rejected {
                    tracing::warn!(target: "keel_event", event = "otlp_export.partially_rejected", project_id = %project_id, spans = sent.len(), detail = %rejected, "the OTLP endpoint took the push but rejected some of its spans");
                }
                tracing::debug!(project_id = %project_id, spans = sent.len(), "OTLP push sent");
                if leased.len() < settings.batch_spans {
                    return Ok(());
                }
            }
            Err(error) => {
                repo::release(db, &sent).await?;
                let max = settings.max_backoff_secs as f64;
                let failures = repo::record_failure(db, project_id, now, &error, |failures| {
                    let base = (2f64.powi(failures.saturating_sub(1).min(30))).min(max);
                    let jitter = rand::random_range(0.8..=1.2);
                    now + chrono::Duration::milliseconds((base * jitter * 1000.0) as i64)
                })
                .await?;
                let before = now - chrono::Duration::hours(settings.drop_after_hours as i64);
                let dropped = repo::drop_older(db, project_id, before, now).await?;
                push.metrics.otlp_spans("failed").inc_by(sent.len() as u64);
                push.metrics.otlp_spans("dropped").inc_by(dropped);
                tracing::warn!(target: "keel_event", event = "otlp_export.failed", project_id = %project_id, org_id = %export.org_id, spans = sent.len(), failures, dropped, error = %error, "OTLP push failed; the project's next waits");
                return Ok(());
            }
        }
    }
    Ok(())
}

/// Posts one request; `Ok` with what the endpoint said it rejected (if anything) on a 2xx,
/// else the failure in words (the answer's head, bounded and without control characters).
async fn send(
    client: &reqwest::Client,
    url: &str,
    headers: &std::collections::BTreeMap<String, String>,
    body: Vec<u8>,
) -> Result<Option<String>, String> {
    let mut request = client
        .post(url)
        .header(reqwest::header::CONTENT_TYPE, "application/x-protobuf");
    for (name, value) in headers {
        request = request.header(name.as_str(), value.as_str());
    }
    let answer = request
        .body(body)
        .send()
        .await
        .map_err(|err| format!("the endpoint could not be reached: {}", describe(&err)))?;
    let status = answer.status();
    let text = read_bounded(answer).await;
    if !status.is_success() {
        let excerpt = clean(&String::from_utf8_lossy(&text));
        return Err(match excerpt.is_empty() {
            true => format!("the endpoint answered {status}"),
            false => format!("the endpoint answered {status}: {excerpt}"),
        });
    }
    Ok(ExportTraceServiceResponse::decode(text.as_slice())
        .ok()
        .and_then(|answer| answer.partial_success)
        .filter(|partial| partial.rejected_spans > 0)
        .map(|partial| {
            format!(
                "{} spans rejected: {}",
                partial.rejected_spans,
                clean(&partial.error_message)
            )
        }))
}

/// An error and its causes, one line.
fn describe(err: &reqwest::Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    clean(&text)
}

/// The answer's body, at most [`ANSWER_READ`] bytes of it.
async fn read_bounded(mut answer: reqwest::Response) -> Vec<u8> {
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = answer.chunk().await {
        body.extend_from_slice(&chunk);
        if body.len() >= ANSWER_READ {
            body.truncate(ANSWER_READ);
            break;
        }
    }
    body
}

/// Someone else's text as keel keeps it: control characters as spaces, at most
/// [`ANSWER_KEPT`] characters.
fn clean(text: &str) -> String {
    let cleaned: String = text
        .trim()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(ANSWER_KEPT)
        .collect();
    match text.trim().chars().count() > ANSWER_KEPT {
        true => format!("{cleaned}…"),
        false => cleaned,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_kept_short_and_without_control_characters() {
        assert_eq!(clean(" bad\r\n\u{1b}[31mred "), "bad   [31mred");
        let long = "x".repeat(1000);
        assert_eq!(clean(&long).chars().count(), ANSWER_KEPT + 1);
    }
}
