//! The search index, kept off the trace writer's path. The writer inserts a trace's words
//! (`search_text`); this indexer enters them in the index in batches, oldest first. On
//! PostgreSQL, on every instance, it makes them the `search` column's `tsvector` (the words
//! themselves, no parser), which enters them in its GIN index, claiming rows with `FOR UPDATE
//! SKIP LOCKED` so instances share the work; on SQLite it enters the traces past a mark (the
//! last rowid indexed) in the FTS5 table and moves the mark. Until a trace is indexed a search
//! still finds it: the search's predicate reads the unindexed tail's words directly
//! (`repo::kept_by`). Indexing on insert cost the writer more than half its throughput on
//! PostgreSQL (the GIN index) and doubled its cost per trace on SQLite (an FTS5 trigger)
//! (docs/BENCHMARKS.md, docs/DECISIONS.md 119, 134 and 135).
//!
//! On both databases it also gives traces recorded before keel kept their words (no
//! `search_text`) those words and their previews, made from their stored (redacted) request
//! and response as the writer makes them, 100 at a time, taking turns with the indexing.

use std::time::Duration;

use sea_orm::{ConnectionTrait, DatabaseConnection, DbBackend, DbErr, TransactionSession, TransactionTrait};
use tokio_util::sync::CancellationToken;

use super::repo;

/// Traces indexed by one statement on PostgreSQL (instances share the work a batch at a time).
pub const BATCH: u64 = 1_000;
/// Traces entered in SQLite's FTS5 table by one transaction. Each commit writes a segment of
/// the index that later merges rewrite; a larger batch makes fewer (about half the cost per
/// trace of 1,000 in a measurement of the same statements, docs/DECISIONS.md 135) while
/// holding SQLite's one writer for tens of milliseconds at most.
pub const SQLITE_BATCH: u64 = 5_000;

/// How long the indexer rests after it found less than a batch to do.
const IDLE: Duration = Duration::from_millis(500);
/// How long it rests after a failure (the database down, say): the tail stays searchable
/// meanwhile, and `keel_traces_index_lag_seconds` grows.
const AFTER_FAILURE: Duration = Duration::from_secs(5);

/// Traces given their words by one transaction.
pub const WORDS_BATCH: u64 = 100;

/// Gives up to [`WORDS_BATCH`] traces without words (recorded before keel kept them) their
/// words and previews, in one transaction; answers how many. Two instances at it at once may
/// make a trace's words twice; only the first sets them.
pub async fn word_batch<C>(db: &C) -> Result<u64, DbErr>
where
    C: ConnectionTrait + TransactionTrait,
{
    // Read outside the transaction: on SQLite a transaction that reads first cannot always
    // become the writer.
    let rows = repo::unworded(db, WORDS_BATCH).await?;
    let found = rows.len() as u64;
    if found == 0 {
        return Ok(0);
    }
    let txn = db.begin().await?;
    for (id, request, response) in rows {
        let indexed = super::search::index_text(request.as_bytes(), response.as_deref());
        repo::set_words(&txn, &id, indexed).await?;
    }
    txn.commit().await?;
    Ok(found)
}

/// Indexes until nothing is left (or only rows other instances hold); answers how many.
pub async fn catch_up(db: &DatabaseConnection, indexed: &prometheus::IntCounter) -> Result<u64, DbErr> {
    let postgres = db.get_database_backend() == DbBackend::Postgres;
    let batch = if postgres { BATCH } else { SQLITE_BATCH };
    let mut total = 0;
    loop {
        let done = match postgres {
            true => repo::index_unindexed(db, batch).await?,
            false => repo::index_unindexed_sqlite(db, batch).await?,
        };
        indexed.inc_by(done);
        total += done;
        if done < batch {
            return Ok(total);
        }
        // Room for the writers between batches.
        tokio::task::yield_now().await;
    }
}

/// Gives old traces their words and (PostgreSQL) indexes what the writers add, until
/// `stop`. The two take turns: a backlog of old traces is worded a batch at a time, with the
/// new traces indexed between batches, so neither holds the other up.
pub async fn run(db: DatabaseConnection, indexed: prometheus::IntCounter, stop: CancellationToken) {
    // Old traces worded since the backlog was last found empty (for one line in the log).
    let mut worded = 0;
    loop {
        let mut failed = false;
        let mut backlog = false;
        match word_batch(&db).await {
            Ok(found) => {
                worded += found;
                backlog = found == WORDS_BATCH;
                if !backlog && worded > 0 {
                    tracing::info!(
                        traces = worded,
                        "words and previews made for traces recorded without them"
                    );
                    worded = 0;
                }
            }
            Err(err) => {
                tracing::warn!(error = %err, "giving old traces their words failed; it tries again in 5 s");
                failed = true;
            }
        }
        if let Err(err) = catch_up(&db, &indexed).await {
            tracing::warn!(error = %err, "trace search indexer failed; it tries again in 5 s");
            failed = true;
        }
        let rest = match (failed, backlog) {
            (true, _) => AFTER_FAILURE,
            // More old traces to word: at once, after room for the writers.
            (false, true) => Duration::ZERO,
            (false, false) => IDLE,
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(rest) => {}
        }
    }
}
