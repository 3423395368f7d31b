//! `/metrics`' figures that need the database or a background worker, read at scrape.

use crate::state::AppState;

pub use keel_core::metrics::*;

/// Reads the queue's depths, the pending payments, the ledger's stall and the trace
/// writer's queue into `state.metrics`, just before a scrape is encoded.
pub async fn refresh(state: &AppState) {
    let db = &state.db;
    state.metrics.record(keel_core::metrics::Readings {
        jobs: keel_core::queue::repo::counts_by_action_status(db).await.ok(),
        oldest_queued: keel_core::queue::repo::oldest_queued(db).await.ok(),
        payments_pending: keel_core::billing::repo::pending_count(db).await.ok(),
        ledger_stalled: state.ledger_stalled_for(),
        trace_queue: state.traces.queue_depth(),
        webhooks_pending: keel_core::webhooks::repo::pending_summary(db).await.ok(),
        traces_unindexed: keel_core::traces::repo::oldest_unindexed(db).await.ok(),
    });
}
