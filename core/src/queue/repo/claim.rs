//! Claims: which queued jobs of an action go to workers, across organizations by their
//! weights ([`crate::queue::shares`]), never past an organization's running cap.
//!
//! One claim statement serves several claimants at once (the claims of one action that
//! arrived together on this instance, `queue::claims`): their jobs are allotted as
//! one claim of their limits' sum, and each claimant is handed its run of the picks in
//! order. On PostgreSQL it is one statement (`keel_claim_jobs`, see [`super::sql::postgres`]):
//! claims of one action take turns only for its length, claims of different actions never
//! wait for each other (but for an organization under a running cap, whose own claims take
//! turns), and nothing is held across a round trip, in the cluster or in the instance. On
//! SQLite (one instance, one writer) the backlog is read and split in memory, and the jobs
//! taken in one transaction.

use entities::{queue_share, training_job};
use sea_orm::ActiveValue::Set;
use sea_orm::{DatabaseConnection, EntityTrait, TransactionTrait};

use super::*;
use crate::queue::shares::{allot_in_order, Allotment, Contender};

/// One worker's part of a claim statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claimant {
    pub worker_id: String,
    /// Jobs it asks for (1..=100).
    pub limit: u32,
}

/// Hands each claimant up to its `limit` queued jobs of `action`, committed: most urgent
/// (lowest priority) first, then oldest, within an organization; answers every job handed,
/// its `worker_id` naming its claimant. The claimants' workers must be distinct. A caller
/// whose worker left meanwhile gives them back with [`super::release_claims`].
pub async fn claim(
    db: &DatabaseConnection,
    action: JobAction,
    claimants: &[Claimant],
    default_cap: u32,
) -> Result<Vec<training_job::Model>, DbErr> {
    let limit: u32 = claimants.iter().map(|c| c.limit).sum();
    if limit == 0 {
        return Ok(Vec::new());
    }
    let mut jobs = match db.get_database_backend() {
        DbBackend::Postgres => {
            let claimants: Vec<serde_json::Value> = claimants
                .iter()
                .map(|c| serde_json::json!({"worker_id": c.worker_id, "limit": c.limit}))
                .collect();
            let statement = Statement::from_sql_and_values(
                DbBackend::Postgres,
                super::sql::postgres::CLAIM,
                [
                    action.as_str().into(),
                    serde_json::Value::Array(claimants).into(),
                    i64::from(default_cap).into(),
                    Utc::now().into(),
                ],
            );
            training_job::Entity::find()
                .from_raw_sql(statement)
                .all(db)
                .await?
        }
        _ => {
            let (allotted, picks) = allot_claim(db, action, limit, default_cap).await?;
            match picks.is_empty() {
                true => Vec::new(),
                false => claim_sqlite(db, action, claimants, &allotted, &picks).await?,
            }
        }
    };
    jobs.sort_by(|a, b| {
        (a.priority, a.created_at)
            .cmp(&(b.priority, b.created_at))
            .then_with(|| a.id.cmp(&b.id))
    });
    Ok(jobs)
}

/// Installs (or replaces) the claim's function on PostgreSQL, written from the transition
/// table: at every start, so it always matches this build. Instances starting together take
/// turns (a `CREATE OR REPLACE` beside another fails with "tuple concurrently updated").
pub(crate) async fn install(db: &DatabaseConnection) -> Result<(), DbErr> {
    if db.get_database_backend() != DbBackend::Postgres {
        return Ok(());
    }
    let txn = db.begin().await?;
    txn.execute_unprepared(super::sql::postgres::INSTALL_LOCK).await?;
    txn.execute_unprepared(super::sql::postgres::CLAIM_FUNCTION.as_str())
        .await?;
    txn.commit().await
}

/// How a claim of `limit` splits among the organizations with queued jobs of `action`, and
/// its picks in order (SQLite: one claim statement at a time, so what is read holds until
/// the claim).
async fn allot_claim(
    db: &DatabaseConnection,
    action: JobAction,
    limit: u32,
    default_cap: u32,
) -> Result<(Vec<Allotment>, Vec<usize>), DbErr> {
    let backlog = backlog(db, action, limit, default_cap).await?;
    let contenders: Vec<Contender> = backlog
        .iter()
        .map(|b| {
            let room = match b.cap {
                0 => i64::MAX,
                cap => Ord::max(cap - b.running, 0),
            };
            Contender {
                org_id: b.org_id.clone(),
                weight: b.weight.unwrap_or(1),
                available: Ord::min(b.queued, room),
                pass: b.pass,
            }
        })
        .collect();
    Ok(allot_in_order(&contenders, limit))
}

/// An organization with queued jobs of the action being claimed.
struct Backlogged {
    org_id: OrgId,
    /// Its queued jobs of the action, counted up to the claim's limit.
    queued: i64,
    weight: Option<i32>,
    /// The cap that applies (0: none)...
    cap: i64,
    /// ...and its held jobs (counted only when capped).
    running: i64,
    pass: Option<f64>,
}

/// Every organization with queued jobs of `action`, with its settings, its pass and (when
/// capped) its held jobs; none while the action is paused.
async fn backlog(
    db: &impl ConnectionTrait,
    action: JobAction,
    limit: u32,
    default_cap: u32,
) -> Result<Vec<Backlogged>, DbErr> {
    let backend = db.get_database_backend();
    let sql = super::sql::sqlite::BACKLOG.as_str();
    let values: Vec<Value> = vec![
        action.as_str().into(),
        i64::from(limit).into(),
        i64::from(default_cap).into(),
    ];
    db.query_all_raw(Statement::from_sql_and_values(backend, sql, values))
        .await?
        .into_iter()
        .map(|row| {
            Ok(Backlogged {
                org_id: row.try_get_by_index(0)?,
                queued: row.try_get_by_index(1)?,
                weight: row.try_get_by_index(2)?,
                cap: row.try_get_by_index(3)?,
                running: row.try_get_by_index::<Option<i64>>(4)?.unwrap_or(0),
                pass: row.try_get_by_index(5)?,
            })
        })
        .collect()
}

/// Claims the allotted jobs (SQLite): for each claimant, its run of the picks (one index
/// range per organization), and the passes the claim moved, in one transaction.
async fn claim_sqlite(
    db: &DatabaseConnection,
    action: JobAction,
    claimants: &[Claimant],
    allotted: &[Allotment],
    picks: &[usize],
) -> Result<Vec<training_job::Model>, DbErr> {
    let now = Utc::now();
    let txn = db.begin().await?;
    let mut jobs = Vec::new();
    let mut picks = picks.iter();
    for claimant in claimants {
        let mut per_org = vec![0i64; allotted.len()];
        for &index in picks.by_ref().take(claimant.limit as usize) {
            per_org[index] += 1;
        }
        let mut values: Vec<Value> = vec![
            claimant.worker_id.as_str().into(),
            now.into(),
            now.into(),
            now.into(),
        ];
        let heads: Vec<&str> = allotted
            .iter()
            .zip(&per_org)
            .filter(|(_, n)| **n > 0)
            .map(|(a, n)| {
                values.push(a.org_id.as_str().into());
                values.push(action.as_str().into());
                values.push((*n).into());
                super::sql::sqlite::CLAIM_HEAD.as_str()
            })
            .collect();
        if heads.is_empty() {
            continue;
        }
        let sql = super::sql::sqlite::CLAIM.replace("{heads}", &heads.join(" UNION ALL "));
        jobs.extend(
            training_job::Entity::find()
                .from_raw_sql(Statement::from_sql_and_values(DbBackend::Sqlite, sql, values))
                .all(&txn)
                .await?,
        );
    }
    let mut handed: HashMap<OrgId, i64> = HashMap::new();
    for job in &jobs {
        *handed.entry(job.org_id.clone()).or_default() += 1;
    }
    save_passes(&txn, action, allotted, &handed).await?;
    txn.commit().await?;
    Ok(jobs)
}

/// Keeps the passes of the organizations this claim handed jobs (and of those it placed
/// for the first time): SQLite's half of what the PostgreSQL statement does in itself.
async fn save_passes(
    db: &impl ConnectionTrait,
    action: JobAction,
    allotted: &[Allotment],
    handed: &HashMap<OrgId, i64>,
) -> Result<(), DbErr> {
    let rows: Vec<queue_share::ActiveModel> = allotted
        .iter()
        .filter_map(|a| {
            let jobs = handed.get(&a.org_id).copied().unwrap_or(0);
            (jobs > 0 || a.first).then(|| queue_share::ActiveModel {
                action: Set(action),
                org_id: Set(a.org_id.clone()),
                pass: Set(a.pass_after(jobs)),
            })
        })
        .collect();
    for chunk in rows.chunks(500) {
        queue_share::Entity::insert_many(chunk.to_vec())
            .on_conflict(
                OnConflict::columns([queue_share::Column::Action, queue_share::Column::OrgId])
                    .update_column(queue_share::Column::Pass)
                    .to_owned(),
            )
            .exec_without_returning(db)
            .await?;
    }
    Ok(())
}
