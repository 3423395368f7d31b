//! What every handler can reach.

use std::sync::Arc;
use std::time::Duration;

use sea_orm::DatabaseConnection;

use crate::config::Settings;
use keel_core::auth::keys::InternalKeys;
use keel_core::auth::session::SessionKeys;
use keel_core::billing::actor::{Ledger, LedgerConfig};
use keel_core::billing::payments::Payments;
use keel_core::orgs::adapters::AdapterDirectory;
use keel_core::queue::actor::{QueueActor, QueueConfig};
use keel_core::secrets::SecretBox;

#[derive(Clone)]
pub struct AppState {
    pub db: DatabaseConnection,
    pub settings: Arc<Settings>,
    pub internal_keys: InternalKeys,
    pub session_keys: Option<SessionKeys>,
    pub payments: Arc<Payments>,
    pub ledger: Ledger,
    pub adapters: AdapterDirectory,
    pub queue: actix::Addr<QueueActor>,
    /// `None` when no key is configured: secrets cannot be stored.
    pub secret_box: Option<SecretBox>,
    /// Seals a new API key's secret for its one view in the console: the secrets' box, or
    /// one of this process's own when there is none (a single instance without a secret).
    pub console_box: SecretBox,
    /// Outbound calls to the serving layer, hub and tracker (per-call timeouts from config).
    pub http: reqwest::Client,
    /// The recording proxy's providers (each HTTP worker calls them through a client of its
    /// own, made from this), its look-up cache and the trace writer.
    pub upstreams: crate::upstream::UpstreamConfig,
    pub proxy_cache: keel_core::proxy::cache::ProxyCache,
    pub traces: keel_core::traces::writer::TraceWriter,
    /// API keys' limits (requests a minute, tokens a day, open streams) and usage counts.
    pub limiter: keel_core::keys::Limiter,
    /// The operator's figures on `/metrics`.
    pub metrics: keel_core::metrics::Metrics,
    /// Cache invalidations and job wake-ups shared with the other instances.
    pub cluster: crate::cluster::Cluster,
    /// Signs the console's session cookies (one key per process when no secret is set).
    pub console_keys: keel_core::auth::cookies::CookieKeys,
    /// Sign-in attempts per client address.
    pub sign_in_throttle: keel_core::auth::throttle::SignInThrottle,
    /// What the core's flows need, each its narrow part of the above.
    pub billing: keel_core::billing::Billing,
    pub jobs: keel_core::queue::Jobs,
    pub serving: keel_core::serving::Serving,
    pub webhooks: keel_core::webhooks::Webhooks,
    /// The auto top-up task (`billing::auto_topup::run`), awaited at shutdown.
    auto_topups: Arc<std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>>,
}

impl AppState {
    /// Must run inside an actix system: it starts the ledger's arbiter.
    pub fn new(db: DatabaseConnection, settings: Settings) -> anyhow::Result<Self> {
        // One TLS configuration for every outbound client: loading the system's root
        // certificates is most of a client's start-up cost (docs/DECISIONS.md).
        let tls =
            native_tls::TlsConnector::new().map_err(|e| anyhow::anyhow!("TLS for outbound calls: {e}"))?;
        let payments = Arc::new(Payments::from_settings(&settings.payments, &tls)?);
        let metrics = keel_core::metrics::Metrics::new();
        let ledger = Ledger::new(
            db.clone(),
            metrics.clone(),
            LedgerConfig {
                max_batch: settings.billing.max_batch,
                idle_after: Duration::from_secs(settings.billing.actor_idle_secs),
                policy: keel_core::billing::ledger::LedgerPolicy {
                    low_balance: settings.billing.low_balance_cents,
                    promotional_priority: settings.billing.promotional_priority,
                    paid_priority: settings.billing.paid_priority,
                },
            },
        );
        let proxy_cache = keel_core::proxy::cache::ProxyCache::new(
            Duration::from_millis(settings.proxy.auth_cache_ttl_ms),
            &metrics,
        );
        let adapters = AdapterDirectory::new(
            Duration::from_millis(settings.billing.adapter_cache_ttl_ms),
            &metrics,
        );
        let limiter = keel_core::keys::Limiter::new(db.clone(), keel_core::keys::UsageBook::default());
        let cluster = crate::cluster::Cluster::new(
            db.clone(),
            vec![
                Box::new(proxy_cache.clone()),
                Box::new(limiter.clone()),
                Box::new(adapters.clone()),
                Box::new(keel_core::webhooks::outbox::Waker),
            ],
        );
        let queue_config = QueueConfig {
            stale_after: Duration::from_secs(settings.queue.stale_after_secs),
            max_attempts: settings.queue.max_attempts,
            sweep_interval: Duration::from_secs(settings.queue.sweep_interval_secs),
            run_fee: settings.billing.flat_run_fee_cents,
            max_batch: settings.billing.max_batch,
            retry_backoff_base: Duration::from_secs(settings.queue.retry_backoff_base_secs),
            retry_backoff_max: Duration::from_secs(settings.queue.retry_backoff_max_secs),
            max_running_per_org: settings.queue.max_running_per_org,
            requeue_blocked_on_credit: settings.queue.requeue_blocked_on_credit,
        };
        let queue = {
            let (db, ledger, cluster, metrics) =
                (db.clone(), ledger.clone(), cluster.clone(), metrics.clone());
            actix::Actor::start(QueueActor::new(db, ledger, cluster, metrics, queue_config))
        };
        let secret_box =
            SecretBox::from_settings(&settings.secrets.encryption_key, &settings.auth.session_secret)?;
        let http = reqwest::Client::builder()
            .use_preconfigured_tls(tls.clone())
            .connect_timeout(Duration::from_secs(5))
            .pool_idle_timeout(Duration::from_secs(60))
            .build()?;
        let traces =
            keel_core::traces::writer::TraceWriter::start(db.clone(), &settings.traces, metrics.clone());
        let billing = keel_core::billing::Billing {
            db: db.clone(),
            ledger: ledger.clone(),
            payments: payments.clone(),
            adapters: adapters.clone(),
            settings: Arc::new(settings.billing.clone()),
            pricing: Arc::new(settings.pricing.clone()),
            payment_settings: Arc::new(settings.payments.clone()),
            metrics: metrics.clone(),
            stopping: cluster.stopping().clone(),
        };
        let jobs = keel_core::queue::Jobs {
            db: db.clone(),
            actor: queue.clone(),
            secret_box: secret_box.clone(),
            cluster: cluster.clone(),
            metrics: metrics.clone(),
            stale_after: chrono::Duration::seconds(settings.queue.stale_after_secs as i64),
            max_running_per_org: settings.queue.max_running_per_org,
        };
        // Charges the card when the ledger says a balance went under its threshold; shutdown
        // waits for it before the ledger drains (its credits go through the ledger).
        let auto_topups = ledger.watch_balance_below().map(|below| {
            actix::spawn(keel_core::billing::auto_topup::run(
                db.clone(),
                payments.clone(),
                metrics.clone(),
                ledger.clone(),
                below,
                cluster.stopping().clone(),
            ))
        });
        if settings.queue.requeue_blocked_on_credit {
            if let Some(credited) = ledger.watch_credits() {
                actix::spawn(keel_core::queue::service::requeue_blocked_on_credit(
                    jobs.clone(),
                    credited,
                ));
            }
        }
        let webhooks = keel_core::webhooks::Webhooks::new(
            db.clone(),
            secret_box.clone(),
            &settings.webhooks,
            metrics.clone(),
        );
        if settings.webhooks.dispatcher {
            actix::spawn(keel_core::webhooks::dispatcher::run(
                webhooks.clone(),
                cluster.stopping().clone(),
            ));
        }
        actix::spawn(limiter.clone().run(cluster.stopping().clone()));
        if settings.traces.search_indexer {
            actix::spawn(keel_core::traces::indexer::run(
                db.clone(),
                metrics.traces_indexed.clone(),
                cluster.stopping().clone(),
            ));
        }
        actix::spawn(keel_core::traces::retention::run(
            db.clone(),
            Duration::from_secs(settings.traces.retention_sweep_secs.max(1)),
            metrics.traces_expired.clone(),
            cluster.stopping().clone(),
        ));
        actix::spawn(
            limiter
                .usage()
                .clone()
                .run(db.clone(), cluster.stopping().clone()),
        );
        let serving = keel_core::serving::Serving {
            db: db.clone(),
            adapters: adapters.clone(),
            pricing: Arc::new(settings.pricing.clone()),
            cluster: cluster.clone(),
            limiter: limiter.clone(),
            layer: keel_core::serving::client::ServingLayer::new(&http, &settings.serving, &settings.auth),
        };
        Ok(Self {
            billing,
            jobs,
            serving,
            webhooks,
            upstreams: crate::upstream::UpstreamConfig::new(&settings, tls)?,
            proxy_cache,
            limiter,
            cluster,
            metrics,
            traces,
            http,
            queue,
            console_box: secret_box.clone().unwrap_or_else(SecretBox::ephemeral),
            secret_box,
            internal_keys: InternalKeys::new(&settings.auth.internal_keys),
            session_keys: SessionKeys::new(&settings.auth.session_secret),
            console_keys: keel_core::auth::cookies::CookieKeys::new(
                &settings.auth.session_secret,
                settings.console.session_ttl_secs,
            ),
            sign_in_throttle: keel_core::auth::throttle::SignInThrottle::default(),
            adapters,
            settings: Arc::new(settings),
            payments,
            ledger,
            auto_topups: Arc::new(std::sync::Mutex::new(auto_topups)),
            db,
        })
    }

    /// Stops background work after it drains, then closes the database pool.
    pub async fn shutdown(&self) {
        // However the server was stopped (a signal already did this; a handle does not), the
        // background loops waiting on it end now: the payments reconciler and the
        // PostgreSQL listener, whose session would otherwise outlive the app.
        self.cluster.stopping().cancel();
        // In-flight requests are done (the server drained them), so no report is pending.
        let _ = self.queue.send(keel_core::queue::actor::Shutdown).await;
        // The card charges under way end and submit their credits before the ledger drains.
        let auto_topups = self.auto_topups.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(auto_topups) = auto_topups {
            let _ = auto_topups.await;
        }
        self.ledger.drain().await;
        self.traces.drain().await;
        // The tokens the last traces counted, and every call's count, are written.
        self.limiter.usage().flush(&self.db).await;
        if let Err(err) = self.db.clone().close().await {
            tracing::warn!(error = %err, "closing the database pool");
        }
    }
}
