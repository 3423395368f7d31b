//! Queue flows shared by the JSON API and the console.

use std::collections::BTreeMap;

use super::repo::{self, SecretChange};
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// Sets (or, with an empty value, deletes) training secrets: every value is sealed first,
/// then all are written in one transaction. Answers every name the organization has.
pub async fn set_secrets(
    state: &AppState,
    org_id: &str,
    secrets: BTreeMap<String, String>,
) -> ApiResult<Vec<String>> {
    let Some(secret_box) = &state.secret_box else {
        return Err(ApiError::Unavailable(
            "secrets need secrets.encryption_key or KEEL_SESSION_SECRET to be configured".into(),
        ));
    };
    let changes = secrets
        .into_iter()
        .map(|(name, value)| {
            let sealed = match value.is_empty() {
                true => None,
                false => Some(secret_box.seal(org_id, &name, &value)?),
            };
            Ok(SecretChange { name, sealed })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(repo::apply_secret_changes(&state.db, org_id, changes).await?)
}

/// The organization's secrets, opened, for the worker that runs one of its jobs. A secret
/// that cannot be opened (the key changed) is left out and logged.
pub async fn worker_secrets(state: &AppState, org_id: &str) -> ApiResult<BTreeMap<String, String>> {
    let mut secrets = BTreeMap::new();
    let Some(secret_box) = &state.secret_box else {
        return Ok(secrets);
    };
    for row in repo::sealed_secrets(&state.db, org_id).await? {
        match secret_box.open(&row.org_id, &row.name, &row.sealed) {
            Ok(value) => {
                secrets.insert(row.name, value);
            }
            Err(err) => {
                tracing::error!(org_id = %row.org_id, name = %row.name, error = %err, "secret unreadable")
            }
        }
    }
    Ok(secrets)
}
