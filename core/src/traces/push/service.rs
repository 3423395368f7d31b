//! Setting a project's destination, and what people see of it.

use std::collections::BTreeMap;

use chrono::Utc;
use entities::{otlp_export, project};
use sea_orm::ConnectionTrait;

use super::{header_problem, repo, traces_url, Destination, ExportView, Push, PushError};
use crate::domain::ProjectId;
use crate::webhooks::destination;

/// The name a destination's headers are sealed under (bound to the project).
fn sealed_name(project_id: &ProjectId) -> String {
    format!("otlp-export-headers:{project_id}")
}

/// Sets where `project` pushes its recorded calls (`None`: nowhere; what waited is dropped),
/// inside the caller's transaction. The endpoint must be one keel may call (the webhooks'
/// rules), each header one it can send; the headers are sealed and never shown again.
#[tracing::instrument(level = "debug", skip_all, fields(project_id = %project.id))]
pub async fn set(
    push: &Push,
    db: &impl ConnectionTrait,
    project: &project::Model,
    destination: Option<Destination>,
) -> Result<(), PushError> {
    let Some(Destination { endpoint, headers }) = destination else {
        // What still waited is let go with the destination: asked for, so not counted as
        // dropped (that outcome is the alert's, for calls given up on).
        let discarded = repo::delete_export(db, &project.id).await?;
        tracing::info!(target: "keel_event", event = "otlp_export.cleared", project_id = %project.id, org_id = %project.org_id, discarded, "project's OTLP push turned off");
        return Ok(());
    };
    let url = traces_url(&endpoint)?;
    let url = destination::check_url(url.as_str(), push.rules)?;
    for (name, value) in &headers {
        if let Some(reason) = header_problem(name, value) {
            return Err(PushError::Header {
                name: name.clone(),
                reason,
            });
        }
    }
    let headers_sealed = match headers.is_empty() {
        true => None,
        false => {
            let sealer = push.secret_box.as_ref().ok_or(PushError::SecretsUnconfigured)?;
            let plain = serde_json::to_string(&headers).map_err(|e| PushError::Sealing(e.into()))?;
            Some(
                sealer
                    .seal(&project.org_id, &sealed_name(&project.id), &plain)
                    .map_err(PushError::Sealing)?,
            )
        }
    };
    let names: Vec<&String> = headers.keys().collect();
    let now = Utc::now();
    repo::save_export(
        db,
        otlp_export::Model {
            project_id: project.id.clone(),
            org_id: project.org_id.clone(),
            url: url.to_string(),
            header_names: serde_json::to_string(&names).unwrap_or_else(|_| "[]".into()),
            headers_sealed,
            failures: 0,
            retry_at: None,
            last_error: None,
            last_error_at: None,
            last_exported_at: None,
            created_at: now,
            updated_at: now,
        },
    )
    .await?;
    tracing::info!(target: "keel_event", event = "otlp_export.set", project_id = %project.id, org_id = %project.org_id, url = %url, headers = names.len(), "project's OTLP push set");
    Ok(())
}

/// A project's destination as people may see it (`None`: it pushes nowhere).
pub async fn view(
    db: &impl ConnectionTrait,
    project_id: &ProjectId,
) -> Result<Option<ExportView>, PushError> {
    let Some(export) = repo::find_export(db, project_id).await? else {
        return Ok(None);
    };
    let pending = repo::pending_of(db, project_id).await?;
    Ok(Some(view_of(export, pending)))
}

/// The destinations of `project_ids` that push somewhere, by project.
pub async fn views_of(
    db: &impl ConnectionTrait,
    project_ids: &[ProjectId],
) -> Result<std::collections::HashMap<ProjectId, ExportView>, PushError> {
    let exports = repo::exports_of(db, project_ids).await?;
    if exports.is_empty() {
        return Ok(Default::default());
    }
    let ids: Vec<ProjectId> = exports.iter().map(|e| e.project_id.clone()).collect();
    let pending = repo::pending_counts(db, &ids).await?;
    Ok(exports
        .into_iter()
        .map(|export| {
            let waiting = pending.get(&export.project_id).copied().unwrap_or(0);
            (export.project_id.clone(), view_of(export, waiting))
        })
        .collect())
}

fn view_of(export: otlp_export::Model, pending: u64) -> ExportView {
    ExportView {
        url: export.url,
        header_names: serde_json::from_str(&export.header_names).unwrap_or_default(),
        last_error: export.last_error,
        last_error_at: export.last_error_at,
        last_exported_at: export.last_exported_at,
        pending,
    }
}

/// A destination's headers, opened (none when it has none, or they no longer open).
pub(super) fn headers_of(
    push: &Push,
    export: &otlp_export::Model,
) -> Result<BTreeMap<String, String>, String> {
    let Some(sealed) = &export.headers_sealed else {
        return Ok(BTreeMap::new());
    };
    let sealer = push
        .secret_box
        .as_ref()
        .ok_or("its headers cannot be opened: no secrets key is configured")?;
    let plain = sealer
        .open(&export.org_id, &sealed_name(&export.project_id), sealed)
        .map_err(|_| "its headers cannot be opened (the secrets key changed): set the export again")?;
    serde_json::from_str(&plain).map_err(|_| "its headers cannot be read: set the export again".to_owned())
}
