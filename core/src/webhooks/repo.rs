//! Outbound webhooks' rows: endpoints, events, deliveries and their attempts.

use chrono::{DateTime, Utc};
use entities::{outbound_event, webhook_delivery, webhook_delivery_attempt, webhook_endpoint};
use sea_orm::sea_query::{Condition, Expr};
use sea_orm::ActiveValue::Set;
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DbBackend, DbErr, EntityTrait, ExprTrait, QueryFilter,
    QueryOrder, QuerySelect, Statement, TransactionSession, Value,
};

use crate::domain::{DeliveryStatus, OrgId};

const PENDING: DeliveryStatus = DeliveryStatus::Pending;

pub async fn insert_endpoint(
    db: &impl ConnectionTrait,
    endpoint: webhook_endpoint::Model,
) -> Result<(), DbErr> {
    webhook_endpoint::Entity::insert(webhook_endpoint::ActiveModel::from(endpoint))
        .exec_without_returning(db)
        .await?;
    Ok(())
}

/// The organizations' endpoints, oldest first.
pub async fn endpoints(
    db: &impl ConnectionTrait,
    orgs: &[OrgId],
) -> Result<Vec<webhook_endpoint::Model>, DbErr> {
    if orgs.is_empty() {
        return Ok(Vec::new());
    }
    webhook_endpoint::Entity::find()
        .filter(webhook_endpoint::Column::OrgId.is_in(orgs.iter().cloned()))
        .order_by_asc(webhook_endpoint::Column::CreatedAt)
        .order_by_asc(webhook_endpoint::Column::Id)
        .all(db)
        .await
}

/// One of the organizations' endpoints (another organization's is none).
pub async fn endpoint(
    db: &impl ConnectionTrait,
    orgs: &[OrgId],
    id: &str,
) -> Result<Option<webhook_endpoint::Model>, DbErr> {
    Ok(find_endpoint(db, id).await?.filter(|e| orgs.contains(&e.org_id)))
}

pub async fn find_endpoint(
    db: &impl ConnectionTrait,
    id: &str,
) -> Result<Option<webhook_endpoint::Model>, DbErr> {
    webhook_endpoint::Entity::find_by_id(id.to_owned()).one(db).await
}

pub async fn save_endpoint(
    db: &impl ConnectionTrait,
    endpoint: webhook_endpoint::Model,
) -> Result<(), DbErr> {
    // Every column written (the model is the whole row as it should be).
    let active = webhook_endpoint::ActiveModel::from(endpoint).reset_all();
    webhook_endpoint::Entity::update(active).exec(db).await?;
    Ok(())
}

/// Deletes an endpoint (its deliveries and their attempts go with it).
pub async fn delete_endpoint(db: &impl ConnectionTrait, id: &str) -> Result<bool, DbErr> {
    let deleted = webhook_endpoint::Entity::delete_by_id(id.to_owned())
        .exec(db)
        .await?;
    Ok(deleted.rows_affected > 0)
}

/// An event and one pending delivery per endpoint, due now.
pub async fn insert_event(
    db: &impl ConnectionTrait,
    event: outbound_event::Model,
    endpoint_ids: &[String],
) -> Result<Vec<String>, DbErr> {
    let now = event.created_at;
    let (event_id, org_id) = (event.id.clone(), event.org_id.clone());
    outbound_event::Entity::insert(outbound_event::ActiveModel::from(event))
        .exec_without_returning(db)
        .await?;
    let deliveries: Vec<webhook_delivery::ActiveModel> = endpoint_ids
        .iter()
        .map(|endpoint_id| webhook_delivery::ActiveModel {
            id: Set(uuid::Uuid::new_v4().to_string()),
            event_id: Set(event_id.clone()),
            endpoint_id: Set(endpoint_id.clone()),
            org_id: Set(org_id.clone()),
            status: Set(PENDING),
            attempts: Set(0),
            next_attempt_at: Set(Some(now)),
            created_at: Set(now),
            updated_at: Set(now),
            leased_until: Set(None),
        })
        .collect();
    let ids = deliveries
        .iter()
        .map(|d| d.id.clone().unwrap())
        .collect::<Vec<_>>();
    if !deliveries.is_empty() {
        webhook_delivery::Entity::insert_many(deliveries)
            .exec_without_returning(db)
            .await?;
    }
    Ok(ids)
}

/// Claims up to `limit` due deliveries for this dispatcher, at most `per_endpoint` of any one
/// endpoint and none of `busy` (endpoints whose slots this dispatcher has filled), taking
/// each endpoint's first due delivery before any endpoint's second: one endpoint's backlog
/// never fills a claim. Each is leased to `lease_until` (its `next_attempt_at` too, so no
/// other dispatcher takes it meanwhile; if this one dies, it is due again then). Deliveries
/// of disabled endpoints wait, their attempts untouched, until the endpoint is enabled.
/// PostgreSQL skips rows another dispatcher has locked; SQLite has one writer.
pub async fn claim_due(
    db: &impl ConnectionTrait,
    now: DateTime<Utc>,
    lease_until: DateTime<Utc>,
    limit: u64,
    per_endpoint: u64,
    busy: &[String],
) -> Result<Vec<webhook_delivery::Model>, DbErr> {
    let backend = db.get_database_backend();
    let (lock, p, busy_ids) = match backend {
        DbBackend::Postgres => (
            " FOR UPDATE SKIP LOCKED",
            ["$1", "$2", "$3", "$4", "$5"],
            "SELECT jsonb_array_elements_text($5::jsonb)",
        ),
        _ => (
            "",
            ["?1", "?2", "?3", "?4", "?5"],
            "SELECT value FROM json_each(?5)",
        ),
    };
    let sql = format!(
        "UPDATE webhook_deliveries SET next_attempt_at = {lease}, leased_until = {lease}, updated_at = {now} \
         WHERE id IN (SELECT id FROM webhook_deliveries WHERE id IN ( \
             SELECT id FROM ( \
                 SELECT d.id, d.next_attempt_at, \
                     ROW_NUMBER() OVER (PARTITION BY d.endpoint_id ORDER BY d.next_attempt_at, d.id) AS turn \
                 FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id AND e.enabled \
                 WHERE d.status = 'pending' AND d.next_attempt_at <= {now} \
                   AND d.endpoint_id NOT IN ({busy_ids})) AS due \
             WHERE turn <= {per_endpoint} ORDER BY turn, next_attempt_at LIMIT {limit}) \
           AND status = 'pending' AND next_attempt_at <= {now}{lock}) \
         AND status = 'pending' \
         RETURNING id, event_id, endpoint_id, org_id, status, attempts, next_attempt_at, created_at, updated_at, leased_until",
        lease = p[0],
        now = p[1],
        limit = p[2],
        per_endpoint = p[3],
    );
    let rows = db
        .query_all_raw(Statement::from_sql_and_values(
            backend,
            sql,
            [
                Value::from(lease_until),
                Value::from(now),
                Value::from(limit as i64),
                Value::from(per_endpoint as i64),
                Value::from(serde_json::json!(busy).to_string()),
            ],
        ))
        .await?;
    rows.iter()
        .map(|row| {
            Ok(webhook_delivery::Model {
                id: row.try_get("", "id")?,
                event_id: row.try_get("", "event_id")?,
                endpoint_id: row.try_get("", "endpoint_id")?,
                org_id: row.try_get("", "org_id")?,
                status: row.try_get("", "status")?,
                attempts: row.try_get("", "attempts")?,
                next_attempt_at: row.try_get("", "next_attempt_at")?,
                created_at: row.try_get("", "created_at")?,
                updated_at: row.try_get("", "updated_at")?,
                leased_until: row.try_get("", "leased_until")?,
            })
        })
        .collect()
}

/// Gives back leases this dispatcher took and will not use (due again now, attempts
/// untouched), if they are still its own.
pub async fn release_leases(
    db: &impl ConnectionTrait,
    deliveries: &[webhook_delivery::Model],
) -> Result<(), DbErr> {
    let now = Utc::now();
    for delivery in deliveries {
        webhook_delivery::Entity::update_many()
            .col_expr(webhook_delivery::Column::NextAttemptAt, Expr::value(now))
            .col_expr(
                webhook_delivery::Column::LeasedUntil,
                Expr::value(Option::<DateTime<Utc>>::None),
            )
            .col_expr(webhook_delivery::Column::UpdatedAt, Expr::value(now))
            .filter(webhook_delivery::Column::Id.eq(&delivery.id))
            .filter(webhook_delivery::Column::Status.eq(PENDING))
            .filter(webhook_delivery::Column::LeasedUntil.eq(delivery.leased_until))
            .exec(db)
            .await?;
    }
    Ok(())
}

/// Test deliveries (`webhook.test`) made for an endpoint since `since`, oldest first: when.
/// Locks an endpoint's row until the transaction ends (PostgreSQL; SQLite's one instance
/// takes turns in the process).
pub async fn lock_endpoint(db: &impl ConnectionTrait, endpoint_id: &str) -> Result<(), DbErr> {
    if db.get_database_backend() == sea_orm::DbBackend::Postgres {
        webhook_endpoint::Entity::find_by_id(endpoint_id.to_owned())
            .lock_exclusive()
            .one(db)
            .await?;
    }
    Ok(())
}

pub async fn tests_since(
    db: &impl ConnectionTrait,
    endpoint_id: &str,
    since: DateTime<Utc>,
) -> Result<Vec<DateTime<Utc>>, DbErr> {
    webhook_delivery::Entity::find()
        .select_only()
        .column(webhook_delivery::Column::CreatedAt)
        .filter(webhook_delivery::Column::EndpointId.eq(endpoint_id))
        .filter(webhook_delivery::Column::CreatedAt.gt(since))
        .filter(
            webhook_delivery::Column::EventId.in_subquery(
                sea_orm::sea_query::Query::select()
                    .column(outbound_event::Column::Id)
                    .from(outbound_event::Entity)
                    .and_where(
                        outbound_event::Column::EventType.eq(crate::domain::EventType::WebhookTest.as_str()),
                    )
                    .and_where(outbound_event::Column::CreatedAt.gt(since))
                    .to_owned(),
            ),
        )
        .order_by_asc(webhook_delivery::Column::CreatedAt)
        .into_tuple()
        .all(db)
        .await
}

/// How many endpoints the organization has.
pub async fn count_endpoints(db: &impl ConnectionTrait, org_id: &OrgId) -> Result<u64, DbErr> {
    use sea_orm::PaginatorTrait;
    webhook_endpoint::Entity::find()
        .filter(webhook_endpoint::Column::OrgId.eq(org_id.to_owned()))
        .count(db)
        .await
}

/// The events of `ids` (repeats allowed).
pub async fn events_by_id(
    db: &impl ConnectionTrait,
    ids: &[String],
) -> Result<Vec<outbound_event::Model>, DbErr> {
    let mut ids = ids.to_vec();
    ids.sort();
    ids.dedup();
    outbound_event::Entity::find()
        .filter(outbound_event::Column::Id.is_in(ids))
        .all(db)
        .await
}

/// The endpoints of `ids` (repeats allowed).
pub async fn endpoints_by_id(
    db: &impl ConnectionTrait,
    ids: &[String],
) -> Result<Vec<webhook_endpoint::Model>, DbErr> {
    let mut ids = ids.to_vec();
    ids.sort();
    ids.dedup();
    webhook_endpoint::Entity::find()
        .filter(webhook_endpoint::Column::Id.is_in(ids))
        .all(db)
        .await
}

/// What an attempt came to.
pub struct AttemptRecord {
    pub attempted_at: DateTime<Utc>,
    pub status_code: Option<i32>,
    pub latency_ms: i32,
    pub response: Option<String>,
    pub error: Option<String>,
}

/// Records attempt `delivery.attempts + 1` and moves the delivery on (to `status`, due
/// again at `next_attempt_at` when pending), if it is still the claim this dispatcher made
/// (`claimed_until`). Answers whether it was.
pub async fn record_attempt(
    db: &impl sea_orm::TransactionTrait,
    delivery: &webhook_delivery::Model,
    claimed_until: Option<DateTime<Utc>>,
    record: AttemptRecord,
    status: DeliveryStatus,
    next_attempt_at: Option<DateTime<Utc>>,
    health: Health,
) -> Result<bool, DbErr> {
    let txn = db.begin().await?;
    let attempt = delivery.attempts + 1;
    let moved = webhook_delivery::Entity::update_many()
        .col_expr(webhook_delivery::Column::Status, Expr::value(status))
        .col_expr(webhook_delivery::Column::Attempts, Expr::value(attempt))
        .col_expr(
            webhook_delivery::Column::NextAttemptAt,
            Expr::value(next_attempt_at),
        )
        .col_expr(
            webhook_delivery::Column::LeasedUntil,
            Expr::value(Option::<DateTime<Utc>>::None),
        )
        .col_expr(webhook_delivery::Column::UpdatedAt, Expr::value(Utc::now()))
        .filter(webhook_delivery::Column::Id.eq(&delivery.id))
        .filter(webhook_delivery::Column::Status.eq(PENDING))
        .filter(webhook_delivery::Column::Attempts.eq(delivery.attempts))
        .filter(match claimed_until {
            Some(at) => webhook_delivery::Column::NextAttemptAt.eq(at),
            None => webhook_delivery::Column::NextAttemptAt.is_null(),
        })
        .exec(&txn)
        .await?;
    if moved.rows_affected == 0 {
        txn.rollback().await?;
        return Ok(false);
    }
    webhook_delivery_attempt::Entity::insert(webhook_delivery_attempt::ActiveModel {
        delivery_id: Set(delivery.id.clone()),
        attempt: Set(attempt),
        attempted_at: Set(record.attempted_at),
        status_code: Set(record.status_code),
        latency_ms: Set(record.latency_ms),
        response: Set(record.response),
        error: Set(record.error),
    })
    .exec_without_returning(&txn)
    .await?;
    endpoint_health(&txn, &delivery.endpoint_id, health, record.attempted_at).await?;
    txn.commit().await?;
    Ok(true)
}

/// What an attempt says about its endpoint's health.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// The endpoint answered 2xx.
    Succeeded,
    /// It was called and failed (an answer other than 2xx, or none).
    Failed,
    /// It was not called (disabled, gone, refused before sending): says nothing.
    NotCalled,
    /// It answered 410 Gone: the receiver says it is gone for good, so it is disabled.
    Gone,
}

/// How long an endpoint's deliveries may all fail before keel disables it.
pub const DISABLE_AFTER_DAYS: i64 = 5;

/// Why keel disabled an endpoint.
pub const DISABLED_FOR_FAILURES: &str = "every delivery failed for 5 days";
pub const DISABLED_FOR_GONE: &str = "the endpoint answered 410 Gone";

/// A success clears the endpoint's failing streak; a failure starts it, and one that finds
/// it [`DISABLE_AFTER_DAYS`] old disables the endpoint (once: the update is guarded by
/// `enabled`) and records a console event for its organization.
async fn endpoint_health(
    txn: &impl ConnectionTrait,
    endpoint_id: &str,
    health: Health,
    at: DateTime<Utc>,
) -> Result<(), DbErr> {
    let by_id =
        || webhook_endpoint::Entity::update_many().filter(webhook_endpoint::Column::Id.eq(endpoint_id));
    match health {
        Health::NotCalled => Ok(()),
        Health::Gone => {
            let disabled = by_id()
                .col_expr(webhook_endpoint::Column::Enabled, Expr::value(false))
                .col_expr(
                    webhook_endpoint::Column::DisabledReason,
                    Expr::value(DISABLED_FOR_GONE),
                )
                .col_expr(webhook_endpoint::Column::DisabledAt, Expr::value(at))
                .col_expr(webhook_endpoint::Column::UpdatedAt, Expr::value(at))
                .filter(webhook_endpoint::Column::Enabled.eq(true))
                .exec_with_returning(txn)
                .await?;
            announce_disabled(txn, disabled, DISABLED_FOR_GONE, at).await
        }
        Health::Succeeded => by_id()
            .col_expr(
                webhook_endpoint::Column::FailingSince,
                Expr::value(Option::<DateTime<Utc>>::None),
            )
            .filter(webhook_endpoint::Column::FailingSince.is_not_null())
            .exec(txn)
            .await
            .map(drop),
        Health::Failed => {
            by_id()
                .col_expr(webhook_endpoint::Column::FailingSince, Expr::value(at))
                .filter(webhook_endpoint::Column::FailingSince.is_null())
                .exec(txn)
                .await?;
            let disabled = by_id()
                .col_expr(webhook_endpoint::Column::Enabled, Expr::value(false))
                .col_expr(
                    webhook_endpoint::Column::DisabledReason,
                    Expr::value(DISABLED_FOR_FAILURES),
                )
                .col_expr(webhook_endpoint::Column::DisabledAt, Expr::value(at))
                .col_expr(webhook_endpoint::Column::UpdatedAt, Expr::value(at))
                .filter(webhook_endpoint::Column::Enabled.eq(true))
                .filter(
                    webhook_endpoint::Column::FailingSince
                        .lte(at - chrono::Duration::days(DISABLE_AFTER_DAYS)),
                )
                .exec_with_returning(txn)
                .await?;
            announce_disabled(txn, disabled, DISABLED_FOR_FAILURES, at).await
        }
    }
}

/// Logs the endpoints keel just disabled and tells their organizations (a console event).
async fn announce_disabled(
    txn: &impl ConnectionTrait,
    disabled: Vec<webhook_endpoint::Model>,
    why: &str,
    at: DateTime<Utc>,
) -> Result<(), DbErr> {
    for endpoint in disabled {
        tracing::warn!(
            target: "keel_event",
            event = "webhook.endpoint_disabled",
            endpoint_id = %endpoint.id,
            org_id = %endpoint.org_id,
            reason = why,
            "webhook endpoint disabled: {why}"
        );
        crate::console::repo::insert_event(
            txn,
            &endpoint.org_id,
            "webhook.endpoint_disabled",
            format!("Webhook endpoint {} was disabled: {why}.", endpoint.url),
            at,
        )
        .await?;
    }
    Ok(())
}

/// An endpoint's deliveries of `status` and `event_type` (each when given).
fn deliveries_of(
    endpoint_id: &str,
    status: Option<DeliveryStatus>,
    event_type: Option<&str>,
) -> sea_orm::Select<webhook_delivery::Entity> {
    let mut query =
        webhook_delivery::Entity::find().filter(webhook_delivery::Column::EndpointId.eq(endpoint_id));
    if let Some(status) = status {
        query = query.filter(webhook_delivery::Column::Status.eq(status));
    }
    if let Some(event_type) = event_type {
        query = query.filter(
            webhook_delivery::Column::EventId.in_subquery(
                sea_orm::sea_query::Query::select()
                    .column(outbound_event::Column::Id)
                    .from(outbound_event::Entity)
                    .and_where(outbound_event::Column::EventType.eq(event_type))
                    .to_owned(),
            ),
        );
    }
    query
}

/// How many deliveries of `status` and `event_type` an endpoint has.
pub async fn count_deliveries(
    db: &impl ConnectionTrait,
    endpoint_id: &str,
    status: Option<DeliveryStatus>,
    event_type: Option<&str>,
) -> Result<u64, DbErr> {
    sea_orm::PaginatorTrait::count(deliveries_of(endpoint_id, status, event_type), db).await
}

/// A page of an endpoint's deliveries, newest first, older than `before` when given.
pub async fn deliveries(
    db: &impl ConnectionTrait,
    endpoint_id: &str,
    status: Option<DeliveryStatus>,
    event_type: Option<&str>,
    before: Option<(DateTime<Utc>, String)>,
    limit: u64,
) -> Result<Vec<webhook_delivery::Model>, DbErr> {
    let mut query = deliveries_of(endpoint_id, status, event_type);
    if let Some((at, id)) = before {
        query = query.filter(
            Condition::any()
                .add(webhook_delivery::Column::CreatedAt.lt(at))
                .add(
                    Condition::all()
                        .add(webhook_delivery::Column::CreatedAt.eq(at))
                        .add(webhook_delivery::Column::Id.lt(id)),
                ),
        );
    }
    query
        .order_by_desc(webhook_delivery::Column::CreatedAt)
        .order_by_desc(webhook_delivery::Column::Id)
        .limit(limit)
        .all(db)
        .await
}

/// The deliveries' attempts, oldest first.
pub async fn attempts(
    db: &impl ConnectionTrait,
    delivery_ids: &[String],
) -> Result<Vec<webhook_delivery_attempt::Model>, DbErr> {
    if delivery_ids.is_empty() {
        return Ok(Vec::new());
    }
    webhook_delivery_attempt::Entity::find()
        .filter(webhook_delivery_attempt::Column::DeliveryId.is_in(delivery_ids.iter().cloned()))
        .order_by_asc(webhook_delivery_attempt::Column::DeliveryId)
        .order_by_asc(webhook_delivery_attempt::Column::Attempt)
        .all(db)
        .await
}

/// The events' types, by id.
pub async fn event_types(
    db: &impl ConnectionTrait,
    event_ids: &[String],
) -> Result<Vec<(String, String)>, DbErr> {
    if event_ids.is_empty() {
        return Ok(Vec::new());
    }
    outbound_event::Entity::find()
        .select_only()
        .column(outbound_event::Column::Id)
        .column(outbound_event::Column::EventType)
        .filter(outbound_event::Column::Id.is_in(event_ids.iter().cloned()))
        .into_tuple()
        .all(db)
        .await
}

/// One of the organizations' deliveries.
pub async fn delivery(
    db: &impl ConnectionTrait,
    orgs: &[OrgId],
    id: &str,
) -> Result<Option<webhook_delivery::Model>, DbErr> {
    Ok(webhook_delivery::Entity::find_by_id(id.to_owned())
        .one(db)
        .await?
        .filter(|d| orgs.contains(&d.org_id)))
}

/// One outbound event.
pub async fn event(
    db: &impl ConnectionTrait,
    event_id: &str,
) -> Result<Option<outbound_event::Model>, DbErr> {
    outbound_event::Entity::find_by_id(event_id.to_owned())
        .one(db)
        .await
}

/// Makes the delivery due now, whatever it came to (one more attempt; its attempts keep
/// counting), unless a dispatcher is sending it right now: answers whether it did.
pub async fn retry_delivery(db: &impl ConnectionTrait, id: &str) -> Result<bool, DbErr> {
    let now = Utc::now();
    let retried = webhook_delivery::Entity::update_many()
        .col_expr(webhook_delivery::Column::Status, Expr::value(PENDING))
        .col_expr(webhook_delivery::Column::NextAttemptAt, Expr::value(now))
        .col_expr(webhook_delivery::Column::UpdatedAt, Expr::value(now))
        .filter(webhook_delivery::Column::Id.eq(id))
        .filter(
            Condition::any()
                .add(webhook_delivery::Column::LeasedUntil.is_null())
                .add(webhook_delivery::Column::LeasedUntil.lte(now)),
        )
        .exec(db)
        .await?;
    Ok(retried.rows_affected > 0)
}

/// Pending deliveries: how many, and when the oldest was created.
pub async fn pending_summary(db: &impl ConnectionTrait) -> Result<(i64, Option<DateTime<Utc>>), DbErr> {
    let row: Option<(i64, Option<DateTime<Utc>>)> = webhook_delivery::Entity::find()
        .select_only()
        .column_as(Expr::col(webhook_delivery::Column::Id).count(), "pending")
        .column_as(Expr::col(webhook_delivery::Column::CreatedAt).min(), "oldest")
        .filter(Expr::cust("status = 'pending'"))
        .into_tuple()
        .one(db)
        .await?;
    Ok(row.unwrap_or((0, None)))
}

/// Endpoints of every organization by state: healthy, failing (enabled, failing since its
/// last success) and disabled.
pub async fn endpoint_states(db: &impl ConnectionTrait) -> Result<crate::metrics::EndpointStates, DbErr> {
    let rows: Vec<(bool, bool, i64)> = webhook_endpoint::Entity::find()
        .select_only()
        .column(webhook_endpoint::Column::Enabled)
        .column_as(webhook_endpoint::Column::FailingSince.is_not_null(), "failing")
        .column_as(Expr::col(webhook_endpoint::Column::Id).count(), "n")
        .group_by(webhook_endpoint::Column::Enabled)
        .group_by(Expr::col(webhook_endpoint::Column::FailingSince).is_not_null())
        .into_tuple()
        .all(db)
        .await?;
    let mut states = crate::metrics::EndpointStates::default();
    for (enabled, failing, n) in rows {
        match (enabled, failing) {
            (false, _) => states.disabled += n,
            (true, true) => states.failing += n,
            (true, false) => states.healthy += n,
        }
    }
    Ok(states)
}

/// Endpoints of every organization whose deliveries keep failing, or that keel disabled for
/// it: the longest failing first.
pub async fn failing_endpoints(
    db: &impl ConnectionTrait,
    limit: u64,
) -> Result<Vec<webhook_endpoint::Model>, DbErr> {
    webhook_endpoint::Entity::find()
        .filter(
            Condition::any()
                .add(webhook_endpoint::Column::FailingSince.is_not_null())
                .add(webhook_endpoint::Column::DisabledReason.is_not_null()),
        )
        .order_by_asc(webhook_endpoint::Column::FailingSince)
        .order_by_asc(webhook_endpoint::Column::Id)
        .limit(limit)
        .all(db)
        .await
}

/// Pending deliveries per endpoint, of `endpoint_ids`.
pub async fn pending_by_endpoint(
    db: &impl ConnectionTrait,
    endpoint_ids: &[String],
) -> Result<std::collections::HashMap<String, u64>, DbErr> {
    if endpoint_ids.is_empty() {
        return Ok(Default::default());
    }
    let rows: Vec<(String, i64)> = webhook_delivery::Entity::find()
        .select_only()
        .column(webhook_delivery::Column::EndpointId)
        .column_as(webhook_delivery::Column::Id.count(), "n")
        .filter(webhook_delivery::Column::EndpointId.is_in(endpoint_ids.iter().cloned()))
        .filter(webhook_delivery::Column::Status.eq(PENDING))
        .group_by(webhook_delivery::Column::EndpointId)
        .into_tuple()
        .all(db)
        .await?;
    Ok(rows
        .into_iter()
        .map(|(id, n)| (id, u64::try_from(n).unwrap_or(0)))
        .collect())
}
