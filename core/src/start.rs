//! The core, started: its actors (ledger, queue), the trace writer, the cluster and every
//! background loop, each loop tracked by name so that shutdown awaits them all.

use std::sync::Arc;
use std::time::Duration;

use sea_orm::DatabaseConnection;

use crate::billing::actor::{Ledger, LedgerConfig};
use crate::billing::payments::Payments;
use crate::config::Settings;
use crate::orgs::adapters::AdapterDirectory;
use crate::queue::actor::{QueueActor, QueueConfig};
use crate::secrets::SecretBox;
use crate::tasks::Tasks;

/// What the web crate (or any other front) runs on. Cloning shares it.
#[derive(Clone)]
pub struct Core {
    pub db: DatabaseConnection,
    pub settings: Arc<Settings>,
    /// One TLS configuration for every outbound client: loading the system's root
    /// certificates is most of a client's start-up cost (docs/DECISIONS.md).
    pub tls: native_tls::TlsConnector,
    /// Outbound calls to the serving layer, hub and tracker (per-call timeouts from config).
    pub http: reqwest::Client,
    pub adapters: AdapterDirectory,
    /// `None` when no key is configured: secrets cannot be stored.
    pub secret_box: Option<SecretBox>,
    pub proxy_cache: crate::proxy::cache::ProxyCache,
    pub traces: crate::traces::writer::TraceWriter,
    /// API keys' limits (requests a minute, tokens a day, open streams) and usage counts.
    pub limiter: crate::keys::Limiter,
    /// The operator's figures on `/metrics`.
    pub metrics: crate::metrics::Metrics,
    /// Cache invalidations and job wake-ups shared with the other instances.
    pub cluster: crate::cluster::Cluster,
    /// What the core's flows need, each its narrow part of the above.
    pub billing: crate::billing::Billing,
    pub jobs: crate::queue::Jobs,
    /// Cron schedules of jobs.
    pub schedules: crate::queue::schedules::Schedules,
    pub serving: crate::serving::Serving,
    pub webhooks: crate::webhooks::Webhooks,
    /// Recorded calls pushed to projects' OTLP endpoints.
    pub push: crate::traces::push::Push,
    ledger: Ledger,
    tasks: Tasks,
}

impl Core {
    /// Readies the database for this build: pending migrations applied (under their lock on
    /// PostgreSQL), then the queue's claim function installed from this build's transition
    /// table and the ledger's debit function. Every process that serves runs it first.
    pub async fn prepare(
        settings: &crate::config::DatabaseSettings,
        db: &DatabaseConnection,
    ) -> anyhow::Result<()> {
        crate::database::migrate(settings, db).await?;
        crate::queue::install(db)
            .await
            .map_err(|e| anyhow::anyhow!("installing the queue's claim function failed: {e}"))?;
        crate::billing::ledger::install(db)
            .await
            .map_err(|e| anyhow::anyhow!("installing the ledger's debit function failed: {e}"))
    }

    /// Builds everything and starts every loop. Must run inside an actix system (the ledger
    /// has an arbiter of its own; the queue actor and the loops run on the current one).
    pub fn start(db: DatabaseConnection, settings: Settings) -> anyhow::Result<Self> {
        Self::build(db, settings, Loops::Serving)
    }

    /// The same services for one command of the operator's CLI (`keel admin`), without the
    /// loops a serving instance runs (no sweeps, dispatcher, reconciler or listener); only the
    /// ledger's follow-up runs (a credit queues the organization's jobs blocked for funds
    /// again). End it with [`Core::shutdown`].
    pub fn for_command(db: DatabaseConnection, settings: Settings) -> anyhow::Result<Self> {
        Self::build(db, settings, Loops::Command)
    }

    fn build(db: DatabaseConnection, settings: Settings, loops: Loops) -> anyhow::Result<Self> {
        let tasks = Tasks::default();
        let tls =
            native_tls::TlsConnector::new().map_err(|e| anyhow::anyhow!("TLS for outbound calls: {e}"))?;
        let payments = Arc::new(Payments::from_settings(&settings.payments, &tls)?);
        let metrics = crate::metrics::Metrics::new().map_err(|e| anyhow::anyhow!("metrics: {e}"))?;
        let ledger = Ledger::new(
            db.clone(),
            metrics.clone(),
            LedgerConfig {
                max_batch: settings.billing.max_batch,
                groups_in_flight: match db.get_database_backend() {
                    sea_orm::DbBackend::Postgres => settings.billing.groups_in_flight.max(1),
                    _ => 1,
                },
                idle_after: Duration::from_secs(settings.billing.actor_idle_secs),
                policy: crate::billing::ledger::LedgerPolicy {
                    low_balance: settings.billing.low_balance_cents,
                    promotional_priority: settings.billing.promotional_priority,
                    paid_priority: settings.billing.paid_priority,
                },
            },
        );
        let proxy_cache = crate::proxy::cache::ProxyCache::new(
            Duration::from_millis(settings.proxy.auth_cache_ttl_ms),
            &metrics,
        );
        let adapters = AdapterDirectory::new(
            Duration::from_millis(settings.billing.adapter_cache_ttl_ms),
            &metrics,
        );
        let limiter = crate::keys::Limiter::new(db.clone(), crate::keys::UsageBook::default());
        let cluster = crate::cluster::Cluster::new(
            db.clone(),
            vec![
                Box::new(proxy_cache.clone()),
                Box::new(limiter.clone()),
                Box::new(adapters.clone()),
                Box::new(crate::webhooks::outbox::Waker),
            ],
        )
        .map_err(|e| anyhow::anyhow!("metrics: {e}"))?;
        let stopping = cluster.stopping().clone();
        let queue_config = QueueConfig {
            stale_after: Duration::from_secs(settings.queue.stale_after_secs),
            max_attempts: settings.queue.max_attempts,
            sweep_interval: match loops {
                Loops::Serving => Duration::from_secs(settings.queue.sweep_interval_secs),
                Loops::Command => Duration::ZERO,
            },
            max_batch: settings.billing.max_batch,
            retry_backoff_base: Duration::from_secs(settings.queue.retry_backoff_base_secs),
            retry_backoff_max: Duration::from_secs(settings.queue.retry_backoff_max_secs),
        };
        let queue = actix::Actor::start(QueueActor::new(
            db.clone(),
            cluster.clone(),
            metrics.clone(),
            queue_config.clone(),
        ));
        let secret_box =
            SecretBox::from_settings(&settings.secrets.encryption_key, &settings.auth.session_secret)?;
        let http = reqwest::Client::builder()
            .use_preconfigured_tls(tls.clone())
            .connect_timeout(Duration::from_secs(5))
            .pool_idle_timeout(Duration::from_secs(60))
            .build()?;
        let traces =
            crate::traces::writer::TraceWriter::start(db.clone(), &settings.traces, metrics.clone(), &tasks)
                .map_err(|e| anyhow::anyhow!("metrics: {e}"))?;
        let billing = crate::billing::Billing {
            db: db.clone(),
            ledger: ledger.clone(),
            payments: payments.clone(),
            adapters: adapters.clone(),
            settings: Arc::new(settings.billing.clone()),
            pricing: Arc::new(settings.pricing.clone()),
            payment_settings: Arc::new(settings.payments.clone()),
            metrics: metrics.clone(),
            stopping: stopping.clone(),
        };
        let jobs = crate::queue::Jobs {
            db: db.clone(),
            actor: queue,
            secret_box: secret_box.clone(),
            cluster: cluster.clone(),
            metrics: metrics.clone(),
            stale_after: chrono::Duration::seconds(settings.queue.stale_after_secs as i64),
            max_running_per_org: settings.queue.max_running_per_org,
            ledger: ledger.clone(),
            run_fee: settings.billing.flat_run_fee_cents,
            requeue_blocked_on_credit: settings.queue.requeue_blocked_on_credit,
            retry_policy: queue_config.retry_policy(),
            claims: crate::queue::claim_groups(match db.get_database_backend() {
                sea_orm::DbBackend::Postgres => settings.queue.claims_in_flight,
                _ => 1,
            }),
            reports: Default::default(),
        };
        let schedules = crate::queue::schedules::Schedules::new(
            jobs.clone(),
            chrono::Duration::seconds(settings.queue.schedule_grace_secs as i64),
            Duration::from_millis(settings.queue.schedule_poll_ms),
        );
        let webhooks = crate::webhooks::Webhooks::new(
            db.clone(),
            secret_box.clone(),
            &settings.webhooks,
            metrics.clone(),
        );
        let serving = crate::serving::Serving {
            db: db.clone(),
            adapters: adapters.clone(),
            pricing: Arc::new(settings.pricing.clone()),
            cluster: cluster.clone(),
            limiter: limiter.clone(),
            layer: crate::serving::client::ServingLayer::new(&http, &settings.serving, &settings.auth),
        };

        if settings.queue.requeue_blocked_on_credit {
            if let Some(credited) = ledger.watch_credits() {
                tasks.spawn(
                    "requeue on credit",
                    crate::queue::service::requeue_blocked_on_credit(
                        jobs.clone(),
                        credited,
                        stopping.clone(),
                    ),
                );
            }
        }
        let push = crate::traces::push::Push::new(
            db.clone(),
            secret_box.clone(),
            &settings.webhooks,
            &settings.otlp_push,
            metrics.clone(),
        );
        if loops == Loops::Serving {
            Self::start_loops(
                &settings, &tasks, &db, &cluster, &ledger, &payments, &metrics, &billing, &webhooks, &limiter,
            )?;
            tasks.spawn(
                "cron schedules",
                crate::queue::schedules::service::run(schedules.clone(), cluster.stopping().clone()),
            );
            if settings.otlp_push.exporter {
                tasks.spawn(
                    "otlp exporter",
                    crate::traces::push::exporter::run(push.clone(), cluster.stopping().clone()),
                );
            }
        }
        Ok(Self {
            db,
            settings: Arc::new(settings),
            tls,
            http,
            adapters,
            secret_box,
            proxy_cache,
            traces,
            limiter,
            metrics,
            cluster,
            billing,
            jobs,
            schedules,
            serving,
            webhooks,
            push,
            ledger,
            tasks,
        })
    }

    /// The loops of a serving instance.
    #[allow(clippy::too_many_arguments)]
    fn start_loops(
        settings: &Settings,
        tasks: &Tasks,
        db: &DatabaseConnection,
        cluster: &crate::cluster::Cluster,
        ledger: &Ledger,
        payments: &Arc<Payments>,
        metrics: &crate::metrics::Metrics,
        billing: &crate::billing::Billing,
        webhooks: &crate::webhooks::Webhooks,
        limiter: &crate::keys::Limiter,
    ) -> anyhow::Result<()> {
        let stopping = cluster.stopping().clone();
        if let Some(listener) = cluster.listener(&settings.database.url) {
            tasks.spawn("cluster listener", listener);
        }
        // Charges the card when the ledger says a balance went under its threshold; shutdown
        // waits for it before the ledger drains (its credits go through the ledger).
        if let Some(below) = ledger.watch_balance_below() {
            tasks.spawn(
                "auto top-up",
                crate::billing::auto_topup::run(
                    db.clone(),
                    payments.clone(),
                    metrics.clone(),
                    ledger.clone(),
                    below,
                    stopping.clone(),
                ),
            );
        }
        tasks.spawn(
            "payments reconciler",
            crate::billing::service::run_reconciler(billing.clone()),
        );
        tasks.spawn("credit expiry", crate::billing::expiry::run(billing.clone()));
        if settings.webhooks.dispatcher {
            tasks.spawn(
                "webhook dispatcher",
                crate::webhooks::dispatcher::run(webhooks.clone(), stopping.clone()),
            );
        }
        tasks.spawn("open streams", limiter.clone().run(stopping.clone()));
        tasks.spawn(
            "key expiries",
            crate::keys::service::log_expiries(db.clone(), Duration::from_secs(30), stopping.clone()),
        );
        tasks.spawn(
            "key usage",
            limiter.usage().clone().run(db.clone(), stopping.clone()),
        );
        if settings.traces.search_indexer {
            tasks.spawn(
                "search indexer",
                crate::traces::indexer::run(db.clone(), metrics.traces_indexed.clone(), stopping.clone()),
            );
        }
        tasks.spawn(
            "trace retention",
            crate::traces::retention::run(
                db.clone(),
                Duration::from_secs(settings.traces.retention_sweep_secs.max(1)),
                metrics.traces_expired.clone(),
                stopping,
            ),
        );
        Ok(())
    }

    /// Whether this instance can serve: its database answers (within 1 s), its ledger is not
    /// stalled past `billing.stall_after_secs`, it is not draining (`/healthz`, `keel_ready`).
    pub async fn readiness(&self) -> Readiness {
        let database = tokio::time::timeout(Duration::from_secs(1), self.db.ping())
            .await
            .is_ok_and(|pinged| pinged.is_ok());
        let stall_after = Duration::from_secs(self.settings.billing.stall_after_secs);
        Readiness {
            database,
            ledger: self.ledger.stalled_for() < stall_after,
            draining: self.cluster.stopping().is_cancelled(),
        }
    }

    /// How long the ledger has had work it could not commit (the readiness check).
    pub fn ledger_stalled_for(&self) -> Duration {
        self.ledger.stalled_for()
    }

    /// Reads the queue's depths, the pending payments, the ledger's stall, the trace writer's
    /// queue, the webhook backlog and the search index's lag into the metrics, just before a
    /// scrape is encoded (a figure that cannot be read keeps its last value).
    pub async fn refresh_metrics(&self) {
        let db = &self.db;
        let readiness = self.readiness().await;
        self.metrics.record(crate::metrics::Readings {
            jobs: crate::queue::repo::counts_by_action_status(db).await.ok(),
            oldest_queued: crate::queue::repo::oldest_queued(db).await.ok(),
            payments_pending: crate::billing::repo::pending_summary(db).await.ok(),
            ready: readiness.ok(),
            database_up: readiness.database,
            webhook_endpoints: crate::webhooks::repo::endpoint_states(db).await.ok(),
            ledger_stalled: self.ledger.stalled_for(),
            trace_queue: self.traces.queue_depth(),
            webhooks_pending: crate::webhooks::repo::pending_summary(db).await.ok(),
            traces_unindexed: crate::traces::repo::oldest_unindexed(db).await.ok(),
            otlp_pending: crate::traces::push::repo::oldest_pending(db).await.ok(),
            schedules_due: crate::queue::schedules::repo::oldest_due(db).await.ok(),
        });
    }

    /// Stops intake, ends every task and drains, in this order (requests are done: the
    /// server drained them first):
    /// 1. the stop signal: waiting claims answer, every loop ends its turn and returns;
    /// 2. the queue actor stops (no report is pending);
    /// 3. the trace writer's queue closes: it writes what it holds, then stops;
    /// 4. every task is awaited (the auto top-up's card charges submit their credits here,
    ///    before the ledger drains);
    /// 5. the ledger commits what it holds;
    /// 6. the tokens the last traces counted, and every call's count, are written;
    /// 7. the pool closes.
    pub async fn shutdown(&self) {
        self.cluster.stopping().cancel();
        let _ = self.jobs.actor.send(crate::queue::actor::Shutdown).await;
        self.traces.close();
        self.tasks.wait().await;
        self.ledger.drain().await;
        self.limiter.usage().flush(&self.db).await;
        if let Err(err) = self.db.clone().close().await {
            tracing::warn!(error = %err, "closing the database pool");
        }
        tracing::info!("background work stopped");
    }
}

/// What `/healthz` answers and `keel_ready` shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Readiness {
    pub database: bool,
    /// The ledger answers (not stalled).
    pub ledger: bool,
    pub draining: bool,
}

impl Readiness {
    pub fn ok(&self) -> bool {
        self.database && self.ledger && !self.draining
    }
}

/// Which loops a core runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Loops {
    /// Every loop of a serving instance.
    Serving,
    /// Only the ledger's follow-up (an operator's command).
    Command,
}
