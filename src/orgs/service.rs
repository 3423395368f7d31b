//! Organization flows shared by the JSON API and the console.

use super::repo;
use crate::error::{ApiError, ApiResult};
use crate::state::AppState;

/// Revokes the organization's API key; 404 when it is another organization's or unknown.
/// The proxy on this instance forgets it at once.
pub async fn revoke_key(state: &AppState, org_id: &str, key_id: &str) -> ApiResult<()> {
    let db = &state.db;
    let belongs = repo::api_key_belongs(db, key_id, org_id).await?;
    if !belongs || !repo::revoke_api_key(db, key_id).await? {
        return Err(ApiError::not_found("API key"));
    }
    state.proxy_cache.forget_key(key_id);
    Ok(())
}
