//! Organization flows shared by the JSON API and the console.

use super::repo;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// Revokes the organization's API key; 404 when it is another organization's or unknown.
/// Every instance's proxy forgets it at once.
pub async fn revoke_key(state: &AppState, org_id: &str, key_id: &str) -> ApiResult<()> {
    let db = &state.db;
    let belongs = repo::api_key_belongs(db, key_id, org_id).await?;
    if !belongs || !repo::revoke_api_key(db, key_id).await? {
        return Err(ApiError::not_found("API key"));
    }
    state
        .cluster
        .publish(crate::cluster::Event::KeyRevoked(key_id.to_owned()))
        .await;
    Ok(())
}
