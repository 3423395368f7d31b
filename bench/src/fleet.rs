//! keel as its own process (or several, on one database) for the benchmarks that compare
//! builds or run beside other queues: a scratch PostgreSQL database, funded organizations
//! with a project each, jobs queued through the bulk route.

use std::path::{Path, PathBuf};
use std::time::Duration;

use entities::training_job;
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, PaginatorTrait, QueryFilter};
use serde_json::json;

use crate::common::{migrated, BenchDb, Process, Tenant};

pub struct Fleet {
    pub db: BenchDb,
    pub conn: DatabaseConnection,
    pub instances: Vec<Process>,
    pub tenants: Vec<Tenant>,
}

impl Fleet {
    /// A scratch database (from `admin_url`) with `orgs` organizations, and `instances` keel
    /// processes of `exe` on it, reaching it at `db_url_of(url)` (say through a proxy).
    pub async fn start(
        admin_url: &str,
        exe: &Path,
        instances: usize,
        orgs: usize,
        db_url_of: impl Fn(&str) -> String,
    ) -> anyhow::Result<Self> {
        Self::start_with(admin_url, exe, instances, orgs, db_url_of, &[]).await
    }

    /// As [`Fleet::start`], the processes with `extra` settings in their environment.
    pub async fn start_with(
        admin_url: &str,
        exe: &Path,
        instances: usize,
        orgs: usize,
        db_url_of: impl Fn(&str) -> String,
        extra: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let db = BenchDb::create(Some(admin_url)).await?;
        let conn = migrated(&db).await?;
        let mut tenants = Vec::new();
        for n in 0..orgs {
            tenants.push(Tenant::named(&conn, &format!("bench-{n}")).await?);
        }
        let url = db_url_of(&db.url);
        let mut envs = vec![
            ("KEEL__BILLING__STARTER_CREDIT_CENTS", "100000000"),
            ("KEEL__QUEUE__MAX_CLAIM_WAIT_SECS", "2"),
        ];
        envs.extend_from_slice(extra);
        let mut processes = Vec::new();
        for _ in 0..instances {
            processes.push(Process::keel_serve_from(exe, &url, &envs).await?);
        }
        let fleet = Self {
            db,
            conn,
            instances: processes,
            tenants,
        };
        let http = reqwest::Client::new();
        for tenant in &fleet.tenants {
            let funded = http
                .post(format!("{}/api/billing/starter-credit", fleet.base(0)))
                .bearer_auth(&tenant.key)
                .json(&json!({"orgId": tenant.org_id}))
                .send()
                .await?;
            anyhow::ensure!(funded.status().is_success(), "funding: {}", funded.status());
        }
        Ok(fleet)
    }

    pub fn base(&self, instance: usize) -> &str {
        &self.instances[instance % self.instances.len()].base
    }

    /// Queues `jobs` no-op tracer jobs, spread evenly over the organizations, 1,000 a request.
    pub async fn enqueue(&self, jobs: usize) -> anyhow::Result<()> {
        let http = reqwest::Client::new();
        let per_org = jobs.div_ceil(self.tenants.len());
        for tenant in &self.tenants {
            let mut left = per_org;
            while left > 0 {
                let n = left.min(1000);
                left -= n;
                let items = vec![json!({"action": "tracer", "projectId": tenant.project_id}); n];
                let answer = http
                    .post(format!("{}/api/training/jobs/batch", self.base(0)))
                    .bearer_auth(&tenant.key)
                    .json(&json!({"jobs": items}))
                    .send()
                    .await?;
                anyhow::ensure!(answer.status().is_success(), "enqueue: {}", answer.status());
            }
        }
        Ok(())
    }

    pub async fn count(&self, status: &str) -> anyhow::Result<u64> {
        Ok(training_job::Entity::find()
            .filter(training_job::Column::Status.eq(status))
            .count(&self.conn)
            .await?)
    }

    pub async fn stop(self) {
        drop(self.instances);
        // Its processes have exited (SIGTERM, waited for) before the database goes.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let _ = self.conn.close().await;
        self.db.drop_now().await;
    }
}

/// The keel binary to run: the one given, else the one beside keel-bench.
pub fn keel_binary(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    match given {
        Some(path) => Ok(path),
        None => crate::common::keel_exe(),
    }
}
