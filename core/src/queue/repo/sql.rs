//! The queue's raw statements, one module per dialect (as the ledger's). Statuses stand in
//! them as literals taken from the transition table, so the partial indexes' conditions
//! appear in the text and every guard is the table's.

use std::sync::LazyLock;

use super::{from_sql, statuses_sql, to_sql, CLAIM_ORDER, CLAIM_ORDER_T, HELD_STATUSES};
use crate::domain::JobEvent;

/// `sql` with `{claimable}` (the claim's guard on `t.status`), `{held_h}` (held, on
/// `h.status`) and `{queued_plain}` (the claim's guard, unqualified) written out.
fn expand(sql: &str) -> String {
    sql.replace("{claimable}", &from_sql(JobEvent::Claim, "t.status"))
        .replace("{queued_plain}", &from_sql(JobEvent::Claim, "status"))
        .replace("{claimed}", &to_sql(JobEvent::Claim))
        .replace("{held_h}", &statuses_sql("h.status", &HELD_STATUSES))
        .replace("{claim_order_t}", CLAIM_ORDER_T)
        .replace("{claim_order}", CLAIM_ORDER)
}

/// An organization's queued jobs of the action, counted up to the claim's limit (ordered
/// as the claim index is, so the planner reads that index: ordered by fewer columns,
/// PostgreSQL took the organization's index and walked past its every finished job).
const COUNTED: &str = "(SELECT count(*) FROM (SELECT 1 FROM training_jobs t WHERE t.org_id = o.org_id \
    AND t.action = {action} AND {claimable} ORDER BY {claim_order_t} LIMIT {limit}) x)";
/// The cap that applies, and the held jobs of a capped organization.
const CAPPED: &str = "COALESCE(s.max_running, {default_cap}) AS cap, \
    CASE WHEN COALESCE(s.max_running, {default_cap}) > 0 THEN \
        (SELECT count(*) FROM training_jobs h WHERE h.org_id = o.org_id AND {held_h}) END AS running";
const JOINED: &str = "LEFT JOIN queue_org_settings s ON s.org_id = o.org_id \
    LEFT JOIN queue_shares q ON q.action = {action} AND q.org_id = o.org_id";
/// A paused action has no backlog to hand out (decision 93).
const NOT_PAUSED: &str = "NOT EXISTS (SELECT 1 FROM queue_pauses WHERE action = {action})";

pub(super) mod postgres {
    use super::*;

    /// The advisory lock keyspaces (the two-`int4` form): claims of one action (second key:
    /// the action's hash) and of one capped organization (its id's hash).
    const ACTION_LOCKS: i32 = 0x6b65_656c; // "keel"
    const CAPPED_LOCKS: i32 = 0x6b65_656d;

    /// Taken by the transaction that installs the function (instances starting together).
    pub(in crate::queue::repo) const INSTALL_LOCK: &str = "SELECT pg_advisory_xact_lock(1801807214, 0)";

    /// The claim, as one statement: `SELECT * FROM keel_claim_jobs(action, claimants,
    /// default cap, now)`, the claimants `[{worker_id, limit}]` as JSON. (Builds before the
    /// claims were gathered installed a `keel_claim_jobs(text, text, int, bigint,
    /// timestamptz)` for one worker; it stays for them during a rolling upgrade.)
    pub(in crate::queue::repo) const CLAIM: &str =
        "SELECT * FROM keel_claim_jobs($1::text, $2::jsonb, $3::bigint, $4::timestamptz)";

    /// The function behind [`CLAIM`]. Claims of one action take turns for the length of this
    /// one statement, and nothing else does: its transaction is the statement's own, so the
    /// lock goes at its commit, on the server, with no round trip held. Each query of a
    /// volatile function reads a fresh snapshot, so the claim statement, run once the lock
    /// is held, sees every claim committed before it: the passes it allots from are exact and
    /// no job it locks was taken (`FOR UPDATE SKIP LOCKED` still passes over rows others
    /// hold, say a job being stopped). Organizations under a running cap with jobs of the
    /// action are locked too (in a fixed order), so their claims of every action take turns
    /// and their held jobs are counted after the last one's commit; organizations without a
    /// cap are never waited on.
    ///
    /// The claim statement itself: one index probe per organization with queued jobs of the
    /// action (a loose index scan), its settings, its pass (an idle one's raised to one stride
    /// below the highest of those waiting with it, as [`crate::queue::shares`] does) and, when
    /// capped, the room its held jobs leave; the `limit` lowest of every organization's next
    /// passes (`pass + (k - 1) / weight` for its k-th job: stride scheduling's picks, merged);
    /// each organization's allotted jobs, most urgent then oldest, locked as they are read and
    /// updated by `ctid`, each handed to the claimant whose run of the picks it falls in (the
    /// first claimant the first `limit` picks, and so on); and the passes moved by what each
    /// was handed. One generic plan, made once per connection (`plan_cache_mode`): the
    /// planner otherwise planned the query afresh at every claim (its estimates favour a
    /// custom plan), which took longer than running it (about 2 ms against 1). Without JIT: the
    /// planner prices the generated slots high enough to compile the plan, 60 ms a claim for
    /// a statement that runs in well under one.
    pub(in crate::queue::repo) static CLAIM_FUNCTION: LazyLock<String> = LazyLock::new(|| {
        expand(&format!(
            "CREATE OR REPLACE FUNCTION keel_claim_jobs(p_action text, p_claimants jsonb, \
                p_default_cap bigint, p_now timestamptz) RETURNS SETOF training_jobs \
             LANGUAGE plpgsql VOLATILE SET jit = off SET plan_cache_mode = force_generic_plan AS $fn$ \
             DECLARE lock_key int; p_limit int; \
             BEGIN \
               SELECT COALESCE(sum((c->>'limit')::int), 0) INTO p_limit FROM jsonb_array_elements(p_claimants) AS c; \
               PERFORM pg_advisory_xact_lock({ACTION_LOCKS}, hashtext(p_action)); \
               IF p_default_cap > 0 OR EXISTS (SELECT 1 FROM queue_org_settings WHERE max_running > 0) THEN \
                 FOR lock_key IN SELECT DISTINCT hashtext(t.org_id) FROM training_jobs t \
                     LEFT JOIN queue_org_settings s ON s.org_id = t.org_id \
                     WHERE t.action = p_action AND {{claimable}} \
                       AND COALESCE(s.max_running::bigint, p_default_cap) > 0 ORDER BY 1 LOOP \
                   PERFORM pg_advisory_xact_lock({CAPPED_LOCKS}, lock_key); \
                 END LOOP; \
               END IF; \
               RETURN QUERY \
               WITH RECURSIVE orgs(org_id) AS (\
                   (SELECT t.org_id FROM training_jobs t WHERE t.action = p_action AND {{claimable}} \
                       ORDER BY {{claim_order_t}} LIMIT 1) \
                   UNION ALL \
                   SELECT (SELECT t.org_id FROM training_jobs t WHERE t.action = p_action AND {{claimable}} \
                       AND t.org_id > orgs.org_id ORDER BY {{claim_order_t}} LIMIT 1) \
                   FROM orgs WHERE orgs.org_id IS NOT NULL), \
               backlog AS (SELECT o.org_id, {COUNTED} AS queued, GREATEST(COALESCE(s.weight, 1), 1) AS weight, \
                   COALESCE(s.max_running::bigint, p_default_cap) AS cap, q.pass \
                   FROM orgs o {JOINED} WHERE o.org_id IS NOT NULL AND {NOT_PAUSED}), \
               contenders AS (SELECT b.org_id, b.weight, b.pass IS NULL AS first, \
                   GREATEST(COALESCE(b.pass, f.floor), f.floor) AS pass, \
                   CASE WHEN b.cap > 0 THEN LEAST(b.queued, GREATEST(b.cap - \
                       (SELECT count(*) FROM training_jobs h WHERE h.org_id = b.org_id AND {{held_h}}), 0)) \
                   ELSE b.queued END AS available \
                   FROM backlog b CROSS JOIN (SELECT COALESCE(max(x.pass), 0) - 1 AS floor FROM backlog x) f), \
               slots AS (SELECT c.org_id, c.pass + (n.k - 1)::float8 / c.weight AS at \
                   FROM contenders c CROSS JOIN LATERAL generate_series(1, c.available) AS n(k) \
                   ORDER BY 2, 1 LIMIT p_limit), \
               picks AS (SELECT org_id, row_number() OVER (ORDER BY at, org_id) AS r, \
                   row_number() OVER (PARTITION BY org_id ORDER BY at) AS k FROM slots), \
               allotted AS (SELECT c.org_id, c.weight, c.pass, c.first, COALESCE(x.n, 0) AS n \
                   FROM contenders c LEFT JOIN (SELECT org_id, count(*) AS n FROM picks GROUP BY org_id) x \
                   ON x.org_id = c.org_id WHERE c.available > 0), \
               heads AS (SELECT a.org_id, h.ctid, \
                   row_number() OVER (PARTITION BY a.org_id ORDER BY h.priority, h.created_at, h.id) AS k \
                   FROM allotted a CROSS JOIN LATERAL (\
                   SELECT t.ctid, t.priority, t.created_at, t.id FROM training_jobs t \
                   WHERE t.org_id = a.org_id AND t.action = p_action AND {{claimable}} AND a.n > 0 \
                   ORDER BY {{claim_order_t}} LIMIT a.n FOR UPDATE SKIP LOCKED) h), \
               placed AS (SELECT h.ctid, row_number() OVER (ORDER BY p.r) AS r \
                   FROM heads h JOIN picks p ON p.org_id = h.org_id AND p.k = h.k), \
               claimants AS (SELECT c.x->>'worker_id' AS worker_id, (c.x->>'limit')::bigint AS n, \
                   sum((c.x->>'limit')::bigint) OVER (ORDER BY c.i) AS upto \
                   FROM jsonb_array_elements(p_claimants) WITH ORDINALITY AS c(x, i)), \
               assigned AS (SELECT p.ctid, c.worker_id FROM placed p \
                   JOIN claimants c ON p.r > c.upto - c.n AND p.r <= c.upto), \
               u AS (UPDATE training_jobs t SET status = {{claimed}}, worker_id = a.worker_id, attempts = t.attempts + 1, \
                   claimed_at = p_now, heartbeat_at = p_now, updated_at = p_now, stop_requested = false \
                   FROM assigned a WHERE t.ctid = ANY(ARRAY(SELECT ctid FROM assigned)) AND t.ctid = a.ctid \
                   AND {{claimable}} RETURNING t.*), \
               handed AS (SELECT u.org_id, count(*) AS n FROM u GROUP BY u.org_id), \
               saved AS (INSERT INTO queue_shares (action, org_id, pass) \
                   SELECT p_action, a.org_id, a.pass + COALESCE(handed.n, 0)::float8 / a.weight \
                   FROM allotted a LEFT JOIN handed ON handed.org_id = a.org_id WHERE handed.n > 0 OR a.first \
                   ON CONFLICT (action, org_id) DO UPDATE SET pass = excluded.pass) \
               SELECT * FROM u; \
             END $fn$"
        ))
        .replace("{action}", "p_action")
        .replace("{limit}", "p_limit")
    });

    /// Ends the reported jobs (`$1`: `[{id, worker_id, status, result, error}]`, `$2` now)
    /// their workers hold, and writes each ended attempt to the history in the same statement
    /// (`{unannounced}`: none, or the condition that leaves jobs with webhook endpoints or
    /// with dependents, whose ends are settled in a transaction).
    pub(in crate::queue::repo) static END_REPORTED: LazyLock<String> = LazyLock::new(|| {
        format!(
            "WITH u AS (UPDATE training_jobs AS j SET status = r.status, result = r.result, error = r.error, \
                finished_at = $2, updated_at = $2 \
             FROM jsonb_to_recordset($1) AS r(id text, worker_id text, status text, result text, error text) \
             WHERE j.id = ANY(ARRAY(SELECT x->>'id' FROM jsonb_array_elements($1) AS x)) \
               AND j.id = r.id AND j.worker_id = r.worker_id AND {reportable} \
               {{unannounced}} \
             RETURNING j.id, j.attempts, j.claimed_at, j.action, r.worker_id, r.status, r.error, j.refusals, j.org_id, \
                j.has_dependents), \
             h AS (INSERT INTO training_job_attempts (job_id, ordinal, attempt, worker_id, claimed_at, ended_at, outcome, error) \
                SELECT id, attempts + refusals, attempts, worker_id, claimed_at, $2, status, error FROM u \
                ON CONFLICT (job_id, ordinal) DO NOTHING) \
             SELECT id, attempts, claimed_at, action, refusals, org_id, has_dependents FROM u",
            reportable = from_sql(JobEvent::Succeed, "j.status || ''"),
        )
    });
}

pub(super) mod sqlite {
    use super::*;

    /// Every organization with queued jobs of `?1` (limit `?2`, default cap `?3`).
    pub(in crate::queue::repo) static BACKLOG: LazyLock<String> = LazyLock::new(|| {
        expand(&format!(
            "SELECT o.org_id, {COUNTED} AS queued, s.weight, {CAPPED}, q.pass \
             FROM (SELECT DISTINCT org_id FROM training_jobs t WHERE t.action = ?1 AND {{claimable}}) o \
             {JOINED} WHERE {NOT_PAUSED}"
        ))
        .replace("{action}", "?1")
        .replace("{limit}", "?2")
        .replace("{default_cap}", "?3")
    });

    /// One organization's first `?` jobs of action `?` (its `LIMIT ?`), by the claim order.
    pub(in crate::queue::repo) static CLAIM_HEAD: LazyLock<String> = LazyLock::new(|| {
        expand(
            "SELECT id FROM (SELECT id FROM training_jobs WHERE org_id = ? AND action = ? \
             AND {queued_plain} ORDER BY priority, created_at, id LIMIT ?)",
        )
    });

    /// The claim of the `{heads}` (the organizations' [`CLAIM_HEAD`]s, `UNION ALL`).
    pub(in crate::queue::repo) static CLAIM: LazyLock<String> = LazyLock::new(|| {
        expand(
            "UPDATE training_jobs SET status = {claimed}, worker_id = ?, attempts = attempts + 1, \
                claimed_at = ?, heartbeat_at = ?, updated_at = ?, stop_requested = 0 \
             WHERE {queued_plain} AND id IN ({heads}) RETURNING *",
        )
    });
    /// Ends the reported jobs (`?`, `?` now; `?` the reports as JSON) their workers hold.
    pub(in crate::queue::repo) static END_REPORTED: LazyLock<String> = LazyLock::new(|| {
        format!(
            "UPDATE training_jobs SET status = r.status, result = r.result, error = r.error, \
                finished_at = ?, updated_at = ? \
             FROM (SELECT json_extract(value, '$.id') AS id, json_extract(value, '$.worker_id') AS worker_id, \
                          json_extract(value, '$.status') AS status, json_extract(value, '$.result') AS result, \
                          json_extract(value, '$.error') AS error FROM json_each(?)) AS r \
             WHERE training_jobs.id = r.id AND training_jobs.worker_id = r.worker_id AND {reportable} \
             RETURNING training_jobs.id, training_jobs.attempts, training_jobs.claimed_at, training_jobs.action, \
                training_jobs.refusals, training_jobs.org_id, training_jobs.has_dependents",
            reportable = from_sql(JobEvent::Succeed, "+training_jobs.status"),
        )
    });
}
