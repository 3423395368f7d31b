//! Every transition of the table, through the repository function that makes it, on SQLite:
//! a job in each status meets each event, and its status afterwards is the table's answer
//! (the event's to-status when the job was in one of its from-statuses, else unchanged).

use entities::{organization, training_job};
use sea_orm::{ActiveModelTrait, ConnectionTrait, Database, DatabaseConnection, IntoActiveModel};

use super::*;
use crate::domain::ProjectId;

struct Fixture {
    db: DatabaseConnection,
    org_id: OrgId,
    project_id: ProjectId,
    _dir: TempDb,
}

/// A database file removed when the test ends.
struct TempDb(std::path::PathBuf);

impl Drop for TempDb {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.0.display()));
        }
    }
}

async fn fixture() -> Fixture {
    let path = std::env::temp_dir().join(format!("keel-transitions-{}.db", uuid::Uuid::new_v4()));
    let db = Database::connect(format!("sqlite://{}?mode=rwc", path.display()))
        .await
        .unwrap();
    crate::database::migrate_up(&db).await.unwrap();
    let org_id = OrgId::generate();
    organization::Model {
        id: org_id.clone(),
        name: "transitions".into(),
        slug: format!("t-{org_id}"),
        created_at: Utc::now(),
    }
    .into_active_model()
    .insert(&db)
    .await
    .unwrap();
    let project = crate::projects::repo::insert(&db, &org_id, "p", "p", None)
        .await
        .unwrap();
    Fixture {
        db,
        org_id,
        project_id: project.id,
        _dir: TempDb(path),
    }
}

impl Fixture {
    /// The only job there is, in `status`, held by worker `w1` on its first attempt, its
    /// last sign of life and its due time an hour ago, marked blocked for funds.
    async fn job_in(&self, status: JobStatus) -> JobId {
        self.db
            .execute_unprepared(
                "DELETE FROM training_job_attempts; DELETE FROM training_job_dependencies; DELETE FROM training_jobs;",
            )
            .await
            .unwrap();
        let job = self.insert(JobAction::Training).await;
        let hour_ago = Utc::now() - Duration::hours(1);
        training_job::Entity::update_many()
            .col_expr(training_job::Column::Status, Expr::value(status.as_str()))
            .col_expr(training_job::Column::WorkerId, Expr::value("w1"))
            .col_expr(training_job::Column::Attempts, Expr::value(1))
            .col_expr(training_job::Column::ClaimedAt, Expr::value(hour_ago))
            .col_expr(training_job::Column::HeartbeatAt, Expr::value(hour_ago))
            .col_expr(training_job::Column::ScheduledAt, Expr::value(hour_ago))
            .col_expr(training_job::Column::BlockedForFunds, Expr::value(true))
            .filter(training_job::Column::Id.eq(&job.id))
            .exec(&self.db)
            .await
            .unwrap();
        job.id
    }

    /// A new job of `action`, queued.
    async fn insert(&self, action: JobAction) -> training_job::Model {
        let job = NewJob {
            org_id: self.org_id.clone(),
            project_id: self.project_id.clone(),
            training_task_id: None,
            action,
            payload: serde_json::json!({}),
            priority: DEFAULT_PRIORITY,
            run_at: None,
            unique_key: None,
            idempotency: None,
            dataset: None,
            schedule: None,
            depends_on: Vec::new(),
        };
        insert_jobs(&self.db, vec![job]).await.pop().unwrap().unwrap()
    }

    /// A job `job_id` depends on, in `status` (of another action: no claim takes it).
    async fn dependency(&self, job_id: &JobId, status: JobStatus) -> JobId {
        let dependency = self.insert(JobAction::Tracer).await.id;
        training_job::Entity::update_many()
            .col_expr(training_job::Column::Status, Expr::value(status.as_str()))
            .filter(training_job::Column::Id.eq(&dependency))
            .exec(&self.db)
            .await
            .unwrap();
        super::pipeline::insert_edges(&self.db, &[(job_id.clone(), dependency.clone())], Utc::now())
            .await
            .unwrap();
        dependency
    }

    /// The jobs waiting for `dependency` settled, as its change of status does.
    async fn settle(&self, dependency: &JobId) {
        super::pipeline::settle_dependents(&self.db, std::slice::from_ref(dependency), Utc::now())
            .await
            .unwrap();
    }

    async fn status_of(&self, job_id: &JobId) -> JobStatus {
        find_job(&self.db, job_id).await.unwrap().unwrap().status
    }

    fn report(&self, job_id: &JobId, status: JobStatus, retryable: bool) -> Report {
        Report {
            job_id: job_id.clone(),
            worker_id: "w1".into(),
            status,
            result: None,
            error: Some("x".into()),
            retryable,
        }
    }

    /// Makes `event` happen to the job through the repository function that implements it.
    async fn apply(&self, event: JobEvent, job_id: &JobId) {
        let db = &self.db;
        let policy = RetryPolicy {
            max_attempts: 3,
            backoff_base: Duration::seconds(60),
            backoff_max: Duration::seconds(60),
        };
        let report = |status, retryable| self.report(job_id, status, retryable);
        match event {
            JobEvent::Create | JobEvent::Schedule | JobEvent::CreateWaiting => {
                unreachable!("a new job has no status before")
            }
            JobEvent::DependenciesMet => {
                let on = self.dependency(job_id, JobStatus::Succeeded).await;
                self.settle(&on).await;
            }
            JobEvent::DependenciesMetLater => {
                training_job::Entity::update_many()
                    .col_expr(
                        training_job::Column::ScheduledAt,
                        Expr::value(Utc::now() + Duration::hours(1)),
                    )
                    .filter(training_job::Column::Id.eq(job_id))
                    .exec(db)
                    .await
                    .unwrap();
                let on = self.dependency(job_id, JobStatus::Succeeded).await;
                self.settle(&on).await;
            }
            JobEvent::DependencyBroke => {
                let on = self.dependency(job_id, JobStatus::Failed).await;
                self.settle(&on).await;
            }
            JobEvent::DependencyRetried => {
                let on = self.dependency(job_id, JobStatus::Queued).await;
                self.settle(&on).await;
            }
            JobEvent::RetryWaiting => {
                self.dependency(job_id, JobStatus::Running).await;
                retry_jobs(db, std::slice::from_ref(job_id)).await.unwrap();
            }
            JobEvent::Promote => {
                promote_due(db, Utc::now()).await.unwrap();
            }
            JobEvent::Claim => {
                let claimant = Claimant {
                    worker_id: "w2".into(),
                    limit: 10,
                };
                claim(db, JobAction::Training, &[claimant], 0).await.unwrap();
            }
            JobEvent::Heartbeat => {
                let held = heartbeat(db, job_id, "w1").await.unwrap();
                let status = self.status_of(job_id).await;
                assert_eq!(
                    matches!(held, Held::Yes { .. }),
                    event.applies_to(status),
                    "{status:?}"
                );
            }
            JobEvent::Succeed => apply_one(db, report(JobStatus::Succeeded, false), &policy).await,
            JobEvent::Fail => apply_one(db, report(JobStatus::Failed, false), &policy).await,
            JobEvent::FailRetryable => apply_one(db, report(JobStatus::Failed, true), &policy).await,
            JobEvent::Block => apply_one(db, report(JobStatus::Blocked, false), &policy).await,
            JobEvent::ConfirmStop => apply_one(db, report(JobStatus::UserStopped, false), &policy).await,
            JobEvent::StopWaiting | JobEvent::StopRunning => {
                stop_job(db, job_id, Some("stop")).await.unwrap();
            }
            JobEvent::Retry => {
                retry_jobs(db, std::slice::from_ref(job_id)).await.unwrap();
            }
            JobEvent::StaleStopping | JobEvent::StaleRequeue => {
                requeue_stale(db, Duration::minutes(1), 3).await.unwrap();
            }
            JobEvent::StaleFail => {
                requeue_stale(db, Duration::minutes(1), 1).await.unwrap();
            }
            JobEvent::Interrupted => {
                requeue_interrupted(db, "w1").await.unwrap();
            }
            JobEvent::BlockForFunds => {
                block_unpaid(db, std::slice::from_ref(job_id), "w1", "no funds")
                    .await
                    .unwrap();
            }
            JobEvent::RequeueOnCredit => {
                requeue_blocked_for_funds(db, &self.org_id).await.unwrap();
            }
            JobEvent::Release => {
                release_claims(db, std::slice::from_ref(job_id), "w1")
                    .await
                    .unwrap();
            }
        }
    }
}

async fn apply_one(db: &DatabaseConnection, report: Report, policy: &RetryPolicy) {
    apply_reports(db, &[report], policy).await.unwrap();
}

/// The events one repository call makes, by the job's status: a stop is `StopWaiting` or
/// `StopRunning`; a retryable failure of a job that cannot be retried (stopping) is a
/// plain failure; the sweep ends a stopping job and requeues a running one.
fn expected(event: JobEvent, status: JobStatus) -> JobStatus {
    let also: &[JobEvent] = match event {
        JobEvent::StopWaiting | JobEvent::StopRunning => &[JobEvent::StopWaiting, JobEvent::StopRunning],
        JobEvent::FailRetryable => &[JobEvent::FailRetryable, JobEvent::Fail],
        JobEvent::StaleStopping | JobEvent::StaleRequeue => {
            &[JobEvent::StaleStopping, JobEvent::StaleRequeue]
        }
        JobEvent::StaleFail => &[JobEvent::StaleStopping, JobEvent::StaleFail],
        // A cancelled job whose dependencies all succeeded waits again, then is queued.
        JobEvent::DependenciesMet | JobEvent::DependenciesMetLater if status == JobStatus::Cancelled => {
            let waiting = JobEvent::DependencyRetried.next(status).unwrap_or(status);
            return event.next(waiting).unwrap_or(waiting);
        }
        _ => std::slice::from_ref(&event),
    };
    also.iter().find_map(|e| e.next(status)).unwrap_or(status)
}

#[tokio::test]
async fn every_event_moves_a_job_exactly_as_the_table_says() {
    let f = fixture().await;
    for event in JobEvent::ALL {
        if matches!(
            event,
            JobEvent::Create | JobEvent::Schedule | JobEvent::CreateWaiting
        ) {
            continue;
        }
        for status in JobStatus::ALL {
            let job_id = f.job_in(status).await;
            f.apply(event, &job_id).await;
            let after = f.status_of(&job_id).await;
            assert_eq!(
                after,
                expected(event, status),
                "{} of a job {}",
                event.as_str(),
                status.as_str()
            );
        }
    }
}

#[tokio::test]
async fn a_new_job_is_queued_or_scheduled_as_the_table_says() {
    let f = fixture().await;
    let new = |run_at| NewJob {
        org_id: f.org_id.clone(),
        project_id: f.project_id.clone(),
        training_task_id: None,
        action: JobAction::Draft,
        payload: serde_json::json!({}),
        priority: DEFAULT_PRIORITY,
        run_at,
        unique_key: None,
        idempotency: None,
        dataset: None,
        schedule: None,
        depends_on: Vec::new(),
    };
    let made = insert_jobs(&f.db, vec![new(None), new(Some(Utc::now() + Duration::hours(1)))]).await;
    let statuses: Vec<JobStatus> = made.into_iter().map(|job| job.unwrap().status).collect();
    assert_eq!(
        statuses,
        vec![JobEvent::Create.to().unwrap(), JobEvent::Schedule.to().unwrap()]
    );
}

#[test]
fn guards_name_the_held_index_and_write_statuses_as_literals() {
    assert_eq!(from_sql(JobEvent::Claim, "t.status"), "t.status = 'queued'");
    assert_eq!(
        from_sql(JobEvent::Succeed, "status"),
        "status IN ('running', 'stopping')"
    );
    assert_eq!(to_sql(JobEvent::Claim), "'running'");
    // A guard inside the held statuses repeats the held indexes' condition.
    let sql = |c: Condition| {
        sea_orm::sea_query::Query::select()
            .from(training_job::Entity)
            .cond_where(c)
            .to_string(sea_orm::sea_query::SqliteQueryBuilder)
    };
    let running = sql(guard(JobEvent::StaleRequeue));
    assert!(
        running.contains("status IN ('running', 'stopping')") && running.contains("status = 'running'"),
        "{running}"
    );
    assert!(!sql(guard(JobEvent::Retry)).contains("'running'"));
}
