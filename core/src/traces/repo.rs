//! Trace queries, and the batched writer's inserts.

use std::fmt::Write as _;
use std::sync::OnceLock;

use chrono::{DateTime, Utc};
use entities::{project, trace};
use sea_orm::sea_query::{Expr, Func};

use crate::domain::{OrgId, ProjectId, TraceId};
use sea_orm::{
    ColumnTrait, ConnectionTrait, DatabaseConnection, DbBackend, DbErr, EntityName, EntityTrait, IdenStatic,
    QueryFilter, QueryOrder, QuerySelect, Statement, TransactionTrait, Value,
};

/// A batch is inserted in statements of power-of-two row counts up to this (17 columns;
/// SQLite allows 32,766 parameters): nine statement shapes in all, each prepared once and
/// then reused, instead of one shape per batch size, each prepared anew and kept in the
/// statement cache (about 30 MiB more RSS under load).
const LARGEST_INSERT: usize = 256;

/// Rows of one trace writer's batch at most (one transaction; the writer's `flush_rows`
/// above it act as it).
pub(crate) const MAX_BATCH_ROWS: usize = 500;

/// A project with traces: `(project id, its name, how many, the newest's time)`.
pub type ProjectTraces = (ProjectId, String, i64, DateTime<Utc>);

/// The organizations' projects that have traces, most recently recorded first.
pub async fn projects_with_traces(
    db: &impl ConnectionTrait,
    orgs: &[OrgId],
) -> Result<Vec<ProjectTraces>, DbErr> {
    if orgs.is_empty() {
        return Ok(Vec::new());
    }
    let counts: Vec<(ProjectId, i64, DateTime<Utc>)> = trace::Entity::find()
        .select_only()
        .column(trace::Column::ProjectId)
        .column_as(
            Expr::from(Func::count(Expr::col(trace::Column::Id))),
            "trace_count",
        )
        .column_as(
            Expr::from(Func::max(Expr::col(trace::Column::CreatedAt))),
            "last_trace_at",
        )
        .filter(trace::Column::OrgId.is_in(orgs.iter().map(OrgId::to_string)))
        .group_by(trace::Column::ProjectId)
        .into_tuple()
        .all(db)
        .await?;
    let names: std::collections::HashMap<ProjectId, String> = project::Entity::find()
        .filter(project::Column::Id.is_in(counts.iter().map(|(id, _, _)| id.clone())))
        .all(db)
        .await?
        .into_iter()
        .map(|p| (p.id, p.name))
        .collect();
    let mut projects: Vec<ProjectTraces> = counts
        .into_iter()
        .map(|(project_id, count, last)| {
            let name = names.get(&project_id).cloned().unwrap_or_default();
            (project_id, name, count, last)
        })
        .collect();
    projects.sort_by_key(|p| std::cmp::Reverse(p.3));
    Ok(projects)
}

/// A trace the search indexer has not reached (PostgreSQL): the predicate of the partial
/// index `idx_traces_unindexed`, which the indexer and a search's tail read through.
const UNINDEXED: &str = "\"traces\".\"search\" IS NULL AND \"traces\".\"search_text\" IS NOT NULL";

/// A trace the search indexer has not reached (SQLite): past the mark of the last one
/// entered in FTS5 (rowids only grow, so the tail is a range of the rowid).
const UNINDEXED_SQLITE: &str = "\"traces\".rowid > (SELECT last_rowid FROM traces_fts_mark)";

/// Which of a project's traces to list.
#[derive(Debug, Default, Clone)]
pub struct TraceFilter {
    pub model: Option<String>,
    /// `Some(true)`: 2xx answers that are complete and carry no error; `Some(false)`: the
    /// others.
    pub ok: Option<bool>,
    /// Keyset paging: only traces older than this `(created_at, id)`.
    pub before: Option<(DateTime<Utc>, TraceId)>,
    /// Only traces recorded at or after this time...
    pub since: Option<DateTime<Utc>>,
    /// ...and before this one.
    pub until: Option<DateTime<Utc>>,
    /// Only traces with this tag.
    pub tag: Option<String>,
    /// Only traces with a score of this name at or above this value.
    pub min_score: Option<(String, f64)>,
    /// Only traces whose words match (`search::Query`, never empty here).
    pub search: Option<super::search::Query>,
}

/// The project's traces that `filter` keeps (newest first is the caller's order).
fn filtered(
    backend: DbBackend,
    project_id: &ProjectId,
    filter: &TraceFilter,
) -> sea_orm::Select<trace::Entity> {
    kept_by(
        backend,
        trace::Entity::find().filter(trace::Column::ProjectId.eq(project_id)),
        filter,
    )
    .order_by_desc(trace::Column::CreatedAt)
    .order_by_desc(trace::Column::Id)
}

/// `query` narrowed to the traces `filter` keeps.
fn kept_by(
    backend: DbBackend,
    mut query: sea_orm::Select<trace::Entity>,
    filter: &TraceFilter,
) -> sea_orm::Select<trace::Entity> {
    use entities::{trace_score, trace_tag};
    use sea_orm::sea_query::{Condition, Query};
    if let Some(tag) = &filter.tag {
        query = query.filter(
            trace::Column::Id.in_subquery(
                Query::select()
                    .column(trace_tag::Column::TraceId)
                    .from(trace_tag::Entity)
                    .and_where(trace_tag::Column::Tag.eq(tag.as_str()))
                    .to_owned(),
            ),
        );
    }
    if let Some((name, value)) = &filter.min_score {
        query = query.filter(
            trace::Column::Id.in_subquery(
                Query::select()
                    .column(trace_score::Column::TraceId)
                    .from(trace_score::Entity)
                    .and_where(trace_score::Column::Name.eq(name.as_str()))
                    .and_where(trace_score::Column::Value.gte(*value))
                    .to_owned(),
            ),
        );
    }
    if let Some(search) = filter.search.as_ref().filter(|q| !q.is_empty()) {
        // The words' own queries, bound as values (each backend's placeholder: `$1` numbered
        // on PostgreSQL, `?` on SQLite). An indexed trace matches through the index (a
        // phrase's order then on its words): on PostgreSQL its `search` column (GIN), on
        // SQLite FTS5. One the indexer has not reached yet matches by its words alone: on
        // PostgreSQL the unindexed tail's partial index finds those, on SQLite a range of
        // the rowid past the mark (see `super::indexer`).
        let (index, unindexed, words_query) = match backend {
            DbBackend::Postgres => (
                "\"traces\".\"search\" @@ CAST($1 AS tsquery)",
                UNINDEXED,
                search.tsquery(),
            ),
            _ => (
                "\"traces\".rowid IN (SELECT rowid FROM traces_fts WHERE traces_fts MATCH ?)",
                UNINDEXED_SQLITE,
                search.fts5(),
            ),
        };
        use sea_orm::sea_query::ExprTrait as _;
        let words = || Expr::cust("' ' || \"traces\".\"search_text\" || ' '");
        let mut indexed = Condition::all().add(Expr::cust_with_expr(index, Expr::val(words_query)));
        for phrase in search.phrase_patterns() {
            indexed = indexed.add(words().like(phrase));
        }
        let mut tail = Condition::all().add(Expr::cust(unindexed));
        for term in search.patterns() {
            tail = tail.add(words().like(term));
        }
        query = query.filter(Condition::any().add(indexed).add(tail));
    }
    if let Some(model) = &filter.model {
        query = query.filter(trace::Column::Model.eq(model.as_str()));
    }
    // `ok`: a 2xx answer, complete, without an error; anything else is not ok.
    match filter.ok {
        Some(true) => {
            query = query
                .filter(trace::Column::StatusCode.between(200, 299))
                .filter(trace::Column::Complete.eq(true))
                .filter(trace::Column::Error.is_null())
        }
        Some(false) => {
            query = query.filter(
                Condition::any()
                    .add(trace::Column::StatusCode.lt(200))
                    .add(trace::Column::StatusCode.gt(299))
                    .add(trace::Column::Complete.eq(false))
                    .add(trace::Column::Error.is_not_null()),
            )
        }
        None => {}
    }
    if let Some(since) = filter.since {
        query = query.filter(trace::Column::CreatedAt.gte(since));
    }
    if let Some(until) = filter.until {
        query = query.filter(trace::Column::CreatedAt.lt(until));
    }
    if let Some((at, id)) = &filter.before {
        query = query.filter(
            Condition::any().add(trace::Column::CreatedAt.lt(*at)).add(
                Condition::all()
                    .add(trace::Column::CreatedAt.eq(*at))
                    .add(trace::Column::Id.lt(id.as_str())),
            ),
        );
    }
    query
}

/// A page of the project's whole traces, newest first (the export walk).
#[cfg_attr(not(feature = "fixtures"), allow(dead_code))]
pub async fn export_page(
    db: &impl ConnectionTrait,
    project_id: &ProjectId,
    filter: &TraceFilter,
    limit: u64,
) -> Result<Vec<trace::Model>, DbErr> {
    filtered(db.get_database_backend(), project_id, filter)
        .limit(limit)
        .all(db)
        .await
}

/// The next `limit` traces of the export walk, newest first, without their content: each
/// one's position and the size of its stored request and response (characters, about their
/// bytes), so a page can end at a size before any content is read.
pub async fn export_sizes(
    db: &impl ConnectionTrait,
    project_id: &ProjectId,
    filter: &TraceFilter,
    limit: u64,
) -> Result<Vec<(TraceId, DateTime<Utc>, i64)>, DbErr> {
    use sea_orm::sea_query::ExprTrait;
    let backend = db.get_database_backend();
    let size = match backend {
        // The bodies' bytes from their TOAST headers: `octet_length` reads no value, where
        // `char_length` reads and decompresses each one (every body was read twice a page).
        DbBackend::Postgres => {
            Expr::cust(r#"octet_length("traces"."request") + coalesce(octet_length("traces"."response"), 0)"#)
        }
        _ => Expr::expr(Func::char_length(Expr::col(trace::Column::Request))).add(Func::coalesce([
            Expr::from(Func::char_length(Expr::col(trace::Column::Response))),
            Expr::val(0),
        ])),
    };
    filtered(backend, project_id, filter)
        .select_only()
        .column(trace::Column::Id)
        .column(trace::Column::CreatedAt)
        .column_as(Expr::expr(size).cast_as("bigint"), "size")
        .limit(limit)
        .into_tuple()
        .all(db)
        .await
}

/// Traces by id (any order).
pub async fn by_ids(db: &impl ConnectionTrait, ids: &[TraceId]) -> Result<Vec<trace::Model>, DbErr> {
    trace::Entity::find()
        .filter(trace::Column::Id.is_in(ids.iter().cloned()))
        .all(db)
        .await
}

/// A trace as the list shows it: its figures and previews, no request or response body.
#[derive(Debug, Clone, sea_orm::FromQueryResult)]
pub struct ListedTrace {
    pub id: TraceId,
    pub project_id: ProjectId,
    pub provider: String,
    pub model: Option<String>,
    pub status_code: i32,
    pub stream: bool,
    pub complete: bool,
    pub error: Option<String>,
    pub latency_ms: i64,
    pub ttfb_ms: Option<i64>,
    pub prompt_tokens: Option<i64>,
    pub completion_tokens: Option<i64>,
    /// The tokens were estimated from the text (a stream without the provider's usage).
    pub usage_estimated: bool,
    pub preview_input: Option<String>,
    pub preview_output: Option<String>,
    pub created_at: DateTime<Utc>,
}

impl ListedTrace {
    /// A whole trace as the list shows it.
    pub fn of(t: &trace::Model) -> Self {
        Self {
            id: t.id.clone(),
            project_id: t.project_id.clone(),
            provider: t.provider.clone(),
            model: t.model.clone(),
            status_code: t.status_code,
            stream: t.stream,
            complete: t.complete,
            error: t.error.clone(),
            latency_ms: t.latency_ms,
            ttfb_ms: t.ttfb_ms,
            prompt_tokens: t.prompt_tokens,
            completion_tokens: t.completion_tokens,
            usage_estimated: t.usage_estimated,
            preview_input: t.preview_input.clone(),
            preview_output: t.preview_output.clone(),
            created_at: t.created_at,
        }
    }
}

/// A search with at most this many matches takes its page from their ids (see
/// [`list_page`]).
const SEARCH_PROBE: u64 = 2_000;

/// A word in at least this share of traces (PostgreSQL's statistics of the search column) is
/// common: a search of common words only walks the project newest first without a probe
/// (whose bitmap of half a million matches would cost more than the walk).
const COMMON_SHARE: f64 = 0.01;

/// The statistics' most common words and their shares, read at most once a minute.
async fn common_words(
    db: &impl ConnectionTrait,
) -> Result<std::sync::Arc<std::collections::HashMap<String, f64>>, DbErr> {
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};
    type Seen = Option<(Instant, Arc<std::collections::HashMap<String, f64>>)>;
    static SEEN: Mutex<Seen> = Mutex::new(None);
    if let Some((at, words)) = SEEN
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .as_ref()
    {
        if at.elapsed() < Duration::from_secs(60) {
            return Ok(words.clone());
        }
    }
    let row = db
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT array_to_json(most_common_elems::text::text[])::text AS words, \
             array_to_json(most_common_elem_freqs)::text AS shares \
             FROM pg_stats WHERE tablename = 'traces' AND attname = 'search' LIMIT 1",
        ))
        .await?;
    let mut words = std::collections::HashMap::new();
    if let Some(row) = row {
        let text = |name: &str| row.try_get::<Option<String>>("", name).ok().flatten();
        let names: Vec<String> = text("words")
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        let shares: Vec<f64> = text("shares")
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        words.extend(names.into_iter().zip(shares));
    }
    let words = Arc::new(words);
    *SEEN.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some((Instant::now(), words.clone()));
    Ok(words)
}

/// Whether every word of the search is common (see [`COMMON_SHARE`]).
async fn all_words_common(db: &impl ConnectionTrait, query: &super::search::Query) -> Result<bool, DbErr> {
    let common = common_words(db).await?;
    Ok(query
        .words()
        .all(|word| common.get(word).is_some_and(|share| *share >= COMMON_SHARE)))
}

/// A page of the project's traces that `filter` keeps, newest first.
/// How many of the project's traces `filter` keeps (its `before` included).
pub async fn count_matching(
    db: &impl ConnectionTrait,
    project_id: &ProjectId,
    filter: &TraceFilter,
) -> Result<u64, DbErr> {
    use sea_orm::PaginatorTrait;
    let unordered = trace::Entity::find().filter(trace::Column::ProjectId.eq(project_id));
    kept_by(db.get_database_backend(), unordered, filter)
        .count(db)
        .await
}

/// The trace `filter` keeps that comes right after `(at, id)` in the newest-first order
/// (`older`), or right before it (`!older`).
pub async fn neighbour(
    db: &impl ConnectionTrait,
    project_id: &ProjectId,
    filter: &TraceFilter,
    at: DateTime<Utc>,
    id: &TraceId,
    older: bool,
) -> Result<Option<TraceId>, DbErr> {
    use sea_orm::sea_query::Condition;
    let unordered = trace::Entity::find().filter(trace::Column::ProjectId.eq(project_id));
    let query = kept_by(db.get_database_backend(), unordered, filter);
    let query = match older {
        true => query
            .filter(
                Condition::any().add(trace::Column::CreatedAt.lt(at)).add(
                    Condition::all()
                        .add(trace::Column::CreatedAt.eq(at))
                        .add(trace::Column::Id.lt(id.clone())),
                ),
            )
            .order_by_desc(trace::Column::CreatedAt)
            .order_by_desc(trace::Column::Id),
        false => query
            .filter(
                Condition::any().add(trace::Column::CreatedAt.gt(at)).add(
                    Condition::all()
                        .add(trace::Column::CreatedAt.eq(at))
                        .add(trace::Column::Id.gt(id.clone())),
                ),
            )
            .order_by_asc(trace::Column::CreatedAt)
            .order_by_asc(trace::Column::Id),
    };
    query
        .select_only()
        .column(trace::Column::Id)
        .limit(1)
        .into_tuple()
        .one(db)
        .await
}

pub async fn list_page(
    db: &impl ConnectionTrait,
    project_id: &ProjectId,
    filter: &TraceFilter,
    limit: u64,
) -> Result<Vec<ListedTrace>, DbErr> {
    let backend = db.get_database_backend();
    let mut query = filtered(backend, project_id, filter);
    // A search on PostgreSQL: the planner cannot tell a rare word from a common one (their
    // estimates are alike), and walking the project newest first to find a rare word reads
    // every trace. So the matches are probed first through the GIN index, a few more than
    // [`SEARCH_PROBE`] at most: when that is all of them, the page is taken from those ids;
    // when there are more, matches are dense and the newest-first walk finds a page soon.
    let search = filter.search.as_ref().filter(|q| !q.is_empty());
    let dense = match search {
        Some(q) if backend == DbBackend::Postgres => all_words_common(db, q).await?,
        _ => false,
    };
    if backend == DbBackend::Postgres && search.is_some() && !dense {
        // No order: any `SEARCH_PROBE + 1` matches tell whether there are more.
        let unordered = trace::Entity::find().filter(trace::Column::ProjectId.eq(project_id));
        let probe: Vec<TraceId> = kept_by(backend, unordered, filter)
            .select_only()
            .column(trace::Column::Id)
            .limit(SEARCH_PROBE + 1)
            .into_tuple()
            .all(db)
            .await?;
        if probe.len() as u64 <= SEARCH_PROBE {
            if probe.is_empty() {
                return Ok(Vec::new());
            }
            query = query.filter(trace::Column::Id.is_in(probe));
        }
    }
    query
        .select_only()
        .columns([
            trace::Column::Id,
            trace::Column::ProjectId,
            trace::Column::Provider,
            trace::Column::Model,
            trace::Column::StatusCode,
            trace::Column::Stream,
            trace::Column::Complete,
            trace::Column::Error,
            trace::Column::LatencyMs,
            trace::Column::TtfbMs,
            trace::Column::PromptTokens,
            trace::Column::CompletionTokens,
            trace::Column::UsageEstimated,
            trace::Column::PreviewInput,
            trace::Column::PreviewOutput,
            trace::Column::CreatedAt,
        ])
        .limit(limit)
        .into_model::<ListedTrace>()
        .all(db)
        .await
}

/// Enters up to `limit` traces past the mark in SQLite's FTS5 table, oldest first, and moves
/// the mark past them, in one transaction; answers how many. (One instance: nothing to share.)
pub async fn index_unindexed_sqlite(db: &DatabaseConnection, limit: u64) -> Result<u64, DbErr> {
    use sea_orm::TransactionTrait;
    let txn = db.begin().await?;
    // Its first statement writes: a SQLite transaction that reads first cannot always become
    // the writer.
    let done = txn
        .execute_raw(Statement::from_sql_and_values(
            DbBackend::Sqlite,
            "INSERT INTO traces_fts(rowid, search_text) SELECT rowid, search_text FROM traces \
             WHERE rowid > (SELECT last_rowid FROM traces_fts_mark) ORDER BY rowid LIMIT ?",
            [(limit as i64).into()],
        ))
        .await?
        .rows_affected();
    if done > 0 {
        txn.execute_raw(Statement::from_sql_and_values(
            DbBackend::Sqlite,
            "UPDATE traces_fts_mark SET last_rowid = (SELECT max(rowid) FROM \
             (SELECT rowid FROM traces WHERE rowid > (SELECT last_rowid FROM traces_fts_mark) ORDER BY rowid LIMIT ?))",
            [(limit as i64).into()],
        ))
        .await?;
    }
    txn.commit().await?;
    Ok(done)
}

/// Sets the search column of up to `limit` traces the indexer has not reached, oldest first
/// (PostgreSQL only); rows another instance's indexer holds are skipped, not waited for.
/// Answers how many were indexed.
pub async fn index_unindexed(db: &impl ConnectionTrait, limit: u64) -> Result<u64, DbErr> {
    let sql = format!(
        "UPDATE traces SET search = array_to_tsvector(array_remove(string_to_array(search_text, ' '), '')) \
         WHERE id IN (SELECT id FROM traces WHERE {UNINDEXED} \
         ORDER BY created_at, id LIMIT $1 FOR UPDATE SKIP LOCKED)"
    );
    let done = db
        .execute_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            sql,
            [(limit as i64).into()],
        ))
        .await?;
    Ok(done.rows_affected())
}

/// Up to `limit` traces recorded before keel kept their words (`search_text` null), oldest
/// first: their ids, requests and responses as stored.
pub async fn unworded(
    db: &impl ConnectionTrait,
    limit: u64,
) -> Result<Vec<(TraceId, String, Option<String>)>, DbErr> {
    trace::Entity::find()
        .select_only()
        .columns([trace::Column::Id, trace::Column::Request, trace::Column::Response])
        .filter(trace::Column::SearchText.is_null())
        .order_by_asc(trace::Column::CreatedAt)
        .order_by_asc(trace::Column::Id)
        .limit(limit)
        .into_tuple()
        .all(db)
        .await
}

/// Sets a trace's words and previews, unless it has words already (another instance was
/// first).
pub async fn set_words(
    db: &impl ConnectionTrait,
    id: &TraceId,
    words: super::search::Indexed,
) -> Result<(), DbErr> {
    trace::Entity::update_many()
        .col_expr(trace::Column::SearchText, Expr::value(words.search_text))
        .col_expr(trace::Column::PreviewInput, Expr::value(words.preview_input))
        .col_expr(trace::Column::PreviewOutput, Expr::value(words.preview_output))
        .filter(trace::Column::Id.eq(id))
        .filter(trace::Column::SearchText.is_null())
        .exec(db)
        .await?;
    Ok(())
}

/// When the oldest trace the indexer has not reached was recorded.
pub async fn oldest_unindexed(db: &impl ConnectionTrait) -> Result<Option<DateTime<Utc>>, DbErr> {
    let tail = match db.get_database_backend() {
        DbBackend::Postgres => UNINDEXED,
        _ => UNINDEXED_SQLITE,
    };
    trace::Entity::find()
        .select_only()
        .column(trace::Column::CreatedAt)
        .filter(Expr::cust(tail))
        .order_by_asc(trace::Column::CreatedAt)
        .order_by_asc(trace::Column::Id)
        .into_tuple()
        .one(db)
        .await
}

/// The projects that keep their traces a number of days: `(project, days)`.
pub async fn retained_projects(db: &impl ConnectionTrait) -> Result<Vec<(ProjectId, i32)>, DbErr> {
    let rows: Vec<(ProjectId, Option<i32>)> = project::Entity::find()
        .select_only()
        .column(project::Column::Id)
        .column(project::Column::TraceRetentionDays)
        .filter(project::Column::TraceRetentionDays.is_not_null())
        .into_tuple()
        .all(db)
        .await?;
    Ok(rows
        .into_iter()
        .filter_map(|(id, days)| days.map(|d| (id, d)))
        .collect())
}

/// Deletes up to `batch` of the project's traces recorded before `before`; answers how many
/// (a statement of its own: no lock is held between batches).
pub async fn delete_older(
    db: &impl ConnectionTrait,
    project_id: &ProjectId,
    before: DateTime<Utc>,
    batch: u64,
) -> Result<u64, DbErr> {
    use sea_orm::sea_query::Query;
    let ids = Query::select()
        .column(trace::Column::Id)
        .from(trace::Entity)
        .and_where(trace::Column::ProjectId.eq(project_id))
        .and_where(trace::Column::CreatedAt.lt(before))
        .limit(batch)
        .to_owned();
    Ok(trace::Entity::delete_many()
        .filter(trace::Column::Id.in_subquery(ids))
        .exec(db)
        .await?
        .rows_affected)
}

/// How many of the project's traces are older than `before` (what a retention of that age
/// would delete).
pub async fn count_older(
    db: &impl ConnectionTrait,
    project_id: &ProjectId,
    before: DateTime<Utc>,
) -> Result<u64, DbErr> {
    use sea_orm::PaginatorTrait;
    trace::Entity::find()
        .filter(trace::Column::ProjectId.eq(project_id))
        .filter(trace::Column::CreatedAt.lt(before))
        .count(db)
        .await
}

/// The models a project's traces name, alphabetically (for a filter's choices).
pub async fn models_of_project(
    db: &impl ConnectionTrait,
    project_id: &ProjectId,
) -> Result<Vec<String>, DbErr> {
    let models: Vec<Option<String>> = trace::Entity::find()
        .select_only()
        .column(trace::Column::Model)
        .filter(trace::Column::ProjectId.eq(project_id))
        .distinct()
        .order_by_asc(trace::Column::Model)
        .limit(200)
        .into_tuple()
        .all(db)
        .await?;
    Ok(models.into_iter().flatten().collect())
}

/// Those of `ids` that belong to one of `orgs`, in no particular order.
pub async fn find_in_orgs(
    db: &impl ConnectionTrait,
    ids: &[TraceId],
    orgs: &[OrgId],
    filter: &TraceFilter,
) -> Result<Vec<trace::Model>, DbErr> {
    let query = trace::Entity::find()
        .filter(trace::Column::Id.is_in(ids.iter().cloned()))
        .filter(trace::Column::OrgId.is_in(orgs.iter().map(OrgId::to_string)));
    kept_by(db.get_database_backend(), query, filter).all(db).await
}

/// Inserts traces (at most a batch), all or nothing, in one commit.
/// Writes the traces, and in the same transaction puts those of projects that push to an
/// OTLP endpoint in the push's outbox; answers how many it put there.
pub async fn insert_traces(db: &DatabaseConnection, traces: &[trace::Model]) -> Result<u64, DbErr> {
    let inserts = insert_statements(db.get_database_backend(), traces);
    let txn = db.begin().await?;
    for insert in inserts {
        txn.execute_raw(insert).await?;
    }
    let queued = super::push::repo::enqueue(&txn, traces).await?;
    txn.commit().await?;
    Ok(queued)
}

/// The traces table's columns, in the order [`push_values`] gives a trace's values.
const COLUMNS: [trace::Column; 21] = [
    trace::Column::Id,
    trace::Column::OrgId,
    trace::Column::ProjectId,
    trace::Column::Provider,
    trace::Column::Model,
    trace::Column::Request,
    trace::Column::Response,
    trace::Column::StatusCode,
    trace::Column::Stream,
    trace::Column::Complete,
    trace::Column::LatencyMs,
    trace::Column::TtfbMs,
    trace::Column::PromptTokens,
    trace::Column::CompletionTokens,
    trace::Column::TotalTokens,
    trace::Column::UsageEstimated,
    trace::Column::Error,
    trace::Column::CreatedAt,
    trace::Column::SearchText,
    trace::Column::PreviewInput,
    trace::Column::PreviewOutput,
];

/// A trace's values, copied into the statement's in [`COLUMNS`] order (once per attempt, as
/// sea-orm takes a statement by value). The pattern names every field: a column added to the
/// entity fails to compile here until it is written too.
fn push_values(trace: &trace::Model, values: &mut Vec<Value>) {
    let trace::Model {
        id,
        org_id,
        project_id,
        provider,
        model,
        request,
        response,
        status_code,
        stream,
        complete,
        latency_ms,
        ttfb_ms,
        prompt_tokens,
        completion_tokens,
        total_tokens,
        usage_estimated,
        error,
        created_at,
        search_text,
        preview_input,
        preview_output,
    } = trace;
    values.extend([
        id.clone().into(),
        org_id.clone().into(),
        project_id.clone().into(),
        provider.clone().into(),
        model.clone().into(),
        request.clone().into(),
        response.clone().into(),
        (*status_code).into(),
        (*stream).into(),
        (*complete).into(),
        (*latency_ms).into(),
        (*ttfb_ms).into(),
        (*prompt_tokens).into(),
        (*completion_tokens).into(),
        (*total_tokens).into(),
        (*usage_estimated).into(),
        error.clone().into(),
        (*created_at).into(),
        search_text.clone().into(),
        preview_input.clone().into(),
        preview_output.clone().into(),
    ]);
}

/// `INSERT INTO "traces" (...) VALUES (...), ...` of `rows` rows, with `backend`'s
/// placeholders: the statement sea-query builds for the same rows (a unit test holds it to
/// that), without building its syntax tree and its text anew for every statement.
fn insert_sql(backend: DbBackend, rows: usize) -> String {
    let columns: Vec<String> = COLUMNS.iter().map(|c| format!("\"{}\"", c.as_str())).collect();
    let mut sql = format!(
        "INSERT INTO \"{}\" ({}) VALUES ",
        trace::Entity.table_name(),
        columns.join(", ")
    );
    let mut placeholder = 0;
    for row in 0..rows {
        sql.push_str(if row == 0 { "(" } else { ", (" });
        for column in 0..COLUMNS.len() {
            if column > 0 {
                sql.push_str(", ");
            }
            placeholder += 1;
            match backend {
                DbBackend::Postgres => {
                    let _ = write!(sql, "${placeholder}");
                }
                _ => sql.push('?'),
            }
        }
        sql.push(')');
    }
    sql
}

/// A batch as its insert statements: one per [`statement_sizes`] part, each of a shape
/// (row count) whose text is made once per process ([`insert_text`]).
fn insert_statements(backend: DbBackend, batch: &[trace::Model]) -> Vec<Statement> {
    let mut traces = batch.iter();
    statement_sizes(traces.len())
        .map(|size| {
            let mut values = Vec::with_capacity(size * COLUMNS.len());
            for trace in traces.by_ref().take(size) {
                push_values(trace, &mut values);
            }
            Statement::from_sql_and_values(backend, insert_text(backend, size), values)
        })
        .collect()
}

/// [`insert_sql`] of each statement size, made once (per backend) and copied from then on.
fn insert_text(backend: DbBackend, rows: usize) -> String {
    // Index: the size's power of two (1, 2, 4, ..., LARGEST_INSERT).
    static SQLITE: OnceLock<Vec<String>> = OnceLock::new();
    static POSTGRES: OnceLock<Vec<String>> = OnceLock::new();
    let texts = match backend {
        DbBackend::Postgres => &POSTGRES,
        _ => &SQLITE,
    };
    let texts = texts.get_or_init(|| {
        (0..=LARGEST_INSERT.trailing_zeros())
            .map(|bit| insert_sql(backend, 1 << bit))
            .collect()
    });
    match texts.get(rows.trailing_zeros() as usize) {
        Some(text) if rows.is_power_of_two() => text.clone(),
        _ => insert_sql(backend, rows),
    }
}

/// `rows` as a sum of powers of two no larger than [`LARGEST_INSERT`], largest first.
fn statement_sizes(rows: usize) -> impl Iterator<Item = usize> {
    let whole = rows / LARGEST_INSERT;
    let rest = rows % LARGEST_INSERT;
    std::iter::repeat_n(LARGEST_INSERT, whole).chain(
        (0..LARGEST_INSERT.trailing_zeros())
            .rev()
            .map(|bit| 1 << bit)
            .filter(move |size| rest & size != 0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use sea_orm::{EntityTrait, IntoActiveModel, QueryTrait};

    fn traces(rows: usize) -> Vec<trace::Model> {
        (0..rows)
            .map(|i| trace::Model {
                id: TraceId::parse(&format!("00000000-0000-4000-8000-{i:012}")).unwrap(),
                org_id: OrgId::parse("org").unwrap(),
                project_id: ProjectId::parse("00000000-0000-4000-8000-00000000000a").unwrap(),
                provider: "openai".into(),
                model: (i % 2 == 0).then(|| "gpt-4o-mini".into()),
                request: format!("{{\"n\":{i}}}"),
                response: (i % 3 != 0).then(|| "{}".into()),
                status_code: 200,
                stream: i % 2 == 1,
                complete: i % 5 != 0,
                latency_ms: i as i64,
                ttfb_ms: (i % 4 != 0).then_some(3),
                prompt_tokens: Some(24),
                completion_tokens: None,
                total_tokens: (i % 2 == 0).then_some(32),
                usage_estimated: false,
                error: (i % 7 == 0).then(|| "upstream answered 500".into()),
                created_at: chrono::Utc::now(),
                search_text: (i % 2 == 0).then(|| "capital of france".into()),
                preview_input: Some("Capital of France?".into()),
                preview_output: None,
            })
            .collect()
    }

    #[test]
    fn insert_statements_are_the_ones_sea_query_builds() {
        for backend in [DbBackend::Sqlite, DbBackend::Postgres] {
            for rows in [1, 2, 8, LARGEST_INSERT] {
                let batch = traces(rows);
                let expected = trace::Entity::insert_many(
                    batch.clone().into_iter().map(IntoActiveModel::into_active_model),
                )
                .build(backend);
                let ours = insert_statements(backend, &batch);
                assert_eq!(ours.len(), 1);
                assert_eq!(ours[0].sql, expected.sql, "{backend:?}, {rows} rows");
                assert_eq!(ours[0].values, expected.values, "{backend:?}, {rows} rows");
            }
            // A batch that is not a power of two: its statements, in order, hold every trace once.
            let batch = traces(281);
            let ours = insert_statements(backend, &batch);
            let mut at = 0;
            for (statement, size) in ours.iter().zip(statement_sizes(281)) {
                let part = batch[at..at + size].to_vec();
                let expected =
                    trace::Entity::insert_many(part.into_iter().map(IntoActiveModel::into_active_model))
                        .build(backend);
                assert_eq!(statement.sql, expected.sql);
                assert_eq!(statement.values, expected.values);
                at += size;
            }
            assert_eq!((ours.len(), at), (4, 281));
        }
    }

    #[test]
    fn a_batch_splits_into_powers_of_two_that_add_up() {
        for rows in 0..=MAX_BATCH_ROWS {
            let sizes: Vec<usize> = statement_sizes(rows).collect();
            assert_eq!(sizes.iter().sum::<usize>(), rows, "{rows}: {sizes:?}");
            assert!(
                sizes.iter().all(|s| s.is_power_of_two() && *s <= LARGEST_INSERT),
                "{rows}: {sizes:?}"
            );
            assert!(sizes.windows(2).all(|w| w[0] >= w[1]), "{rows}: {sizes:?}");
        }
        assert_eq!(statement_sizes(281).collect::<Vec<_>>(), vec![256, 16, 8, 1]);
        assert_eq!(
            statement_sizes(500).collect::<Vec<_>>(),
            vec![256, 128, 64, 32, 16, 4]
        );
    }
}

#[cfg(test)]
mod search_tests {
    use super::*;
    use sea_orm::QueryTrait;

    #[test]
    fn a_search_is_bound_as_a_value_never_written_into_the_sql() {
        let project = ProjectId::parse("00000000-0000-4000-8000-00000000000a").unwrap();
        let filter = TraceFilter {
            search: Some(crate::traces::search::Query::parse("refund \"late delivery\"")),
            ..TraceFilter::default()
        };
        for backend in [DbBackend::Sqlite, DbBackend::Postgres] {
            let statement = filtered(backend, &project, &filter).build(backend);
            assert!(!statement.sql.contains("refund"), "{}", statement.sql);
            let values = format!("{:?}", statement.values);
            assert!(values.contains("refund"), "{values}");
        }
    }
}
