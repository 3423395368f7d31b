//! The operator's figures on `/metrics` (Prometheus, every name prefixed `keel_`): the
//! queue, the money, the proxy, the cluster channel and the trace writer. README lists them.
//!
//! Hot paths only add to counters resolved at start-up (an atomic add, no lock, no
//! allocation); figures that need the database (queue depth, pending payments) are read when
//! `/metrics` is scraped.

use crate::domain::{AttemptOutcome, EntryKind, JobAction, JobStatus, PROVIDERS};
use prometheus::{
    Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry,
};

/// A ledger operation's outcome, as the metric labels it.
pub const LEDGER_OUTCOMES: [&str; 7] = [
    "applied",
    "replayed",
    "insufficient_funds",
    "duplicate",
    "unknown_org",
    "locked",
    "unavailable",
];

/// A webhook delivery attempt's outcome, as `keel_webhook_deliveries_total` labels it.
pub const WEBHOOK_OUTCOMES: [&str; 3] = ["succeeded", "retrying", "failed"];

/// Distinct model names `keel_proxy_tokens_total` keeps a series for.
pub const MAX_TOKEN_MODELS: usize = 200;

/// The look-up caches, as `keel_cache_loads_total` labels them.
pub const CACHES: [&str; 3] = ["api_keys", "projects", "adapters"];

/// The formats of dataset lines, as `keel_dataset_export_*_total` label them (the datasets'
/// `LineFormat` names; a test holds them equal).
pub const DATASET_FORMATS: [&str; 3] = ["openai-chat", "records", "prompts"];

/// What enqueued a schedule's job, as `keel_schedule_enqueued_total` labels it.
pub const SCHEDULE_TRIGGERS: [&str; 3] = ["tick", "catch_up", "run_now"];

/// Outcomes of pushed spans, as `keel_otlp_export_spans_total` labels them.
pub const OTLP_OUTCOMES: [&str; 3] = ["exported", "failed", "dropped"];

/// Classes of a provider's failure: its 4xx and 5xx answers, no answer at all, and a stream
/// that failed in its middle (cut or stalled after its head).
pub const UPSTREAM_ERROR_CLASSES: [&str; 4] = ["4xx", "5xx", "transport", "stream"];

#[derive(Clone)]
pub struct Metrics {
    // The queue.
    pub jobs_claimed: IntCounter,
    /// Claims one claim statement served (claims of one action that arrived together).
    pub claims_per_statement: Histogram,
    pub reports: IntCounterVec,
    pub requeued: IntCounterVec,
    pub attempts_exhausted: IntCounter,
    /// Queued (or due, requeued, retried) until claimed, by action.
    queue_wait: HistogramVec,
    /// Claimed until the attempt ended, by action and the attempt's outcome.
    queue_run: HistogramVec,
    /// Retryable failures scheduled again, by action.
    queue_retries: IntCounterVec,
    queue_jobs: IntGaugeVec,
    queue_oldest: GaugeVec,
    /// Jobs cron schedules enqueued, by trigger (tick, catch_up, run_now).
    schedule_enqueued: IntCounterVec,
    /// How long the earliest due tick has waited to be enqueued (read at scrape).
    schedule_lag: Gauge,
    // The money.
    ledger_ops: Vec<IntCounter>,
    /// A ledger operation's time from its submission to its commit (or refusal).
    pub ledger_seconds: Histogram,
    pub auto_topups: IntCounterVec,
    /// Ledger batches written by one guarded statement outside the committer (PostgreSQL),
    /// by its guard: `version` (the row as planned on) or `current_account` (the debit
    /// function's check of the account as locked).
    pub ledger_guarded_writes: IntCounterVec,
    /// Credit grants the expiry sweep ended with something left, and how much.
    pub credit_grants_expired: IntCounter,
    pub credit_expired_microcents: IntCounter,
    /// Auto top-ups not charged because the month's cap would be passed.
    pub auto_topup_limit_reached: IntCounter,
    /// Traces a project's retention deleted.
    pub traces_expired: IntCounter,
    /// Traces the search indexer indexed (PostgreSQL).
    pub traces_indexed: IntCounter,
    traces_index_lag: Gauge,
    /// Spans of recorded calls pushed to projects' OTLP endpoints, by outcome.
    otlp_spans: IntCounterVec,
    otlp_lag: Gauge,
    /// Dataset lines and bytes exported (the API and the workers' route), by format.
    dataset_export_lines: IntCounterVec,
    dataset_export_bytes: IntCounterVec,
    /// Proxied and relayed calls an API key's limit refused, by limit.
    proxy_limited: IntCounterVec,
    pub payments_reconciled: IntCounterVec,
    payments_pending: IntGauge,
    payments_oldest: Gauge,
    ledger_stalled: Gauge,
    /// This instance's readiness (`/healthz`) and whether its database answers, at scrape.
    ready: IntGauge,
    database_up: IntGauge,
    // The proxy.
    upstream_seconds: Vec<Histogram>,
    added_seconds: Histogram,
    upstream_errors: Vec<IntCounter>,
    tokens: IntCounterVec,
    /// The models `tokens` has a series for (model names come from callers: at most
    /// [`MAX_TOKEN_MODELS`], the rest count as `other`).
    token_models: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
    // Outbound webhooks.
    webhook_deliveries: IntCounterVec,
    webhook_seconds: Histogram,
    webhook_pending: IntGauge,
    webhook_oldest: Gauge,
    webhook_endpoints: IntGaugeVec,
    // The trace writer.
    pub trace_lag: Gauge,
    /// How far behind the OTLP export of keel's own spans is (`telemetry.otlp_endpoint`).
    pub spans_export_lag: Gauge,
    trace_queue: IntGauge,
    // The hot paths' look-up caches (`cache::LoadCache`).
    cache_loads: IntCounterVec,
    /// The vectors the resolved children above belong to (registered as they are).
    families: (IntCounterVec, HistogramVec, IntCounterVec),
}

fn counter(name: &str, help: &str) -> prometheus::Result<IntCounter> {
    IntCounter::new(name, help)
}

fn counter_vec(name: &str, help: &str, labels: &[&str]) -> prometheus::Result<IntCounterVec> {
    IntCounterVec::new(Opts::new(name, help), labels)
}

fn gauge(name: &str, help: &str) -> prometheus::Result<Gauge> {
    Gauge::new(name, help)
}

/// Buckets of a job's wait and run, in seconds: from a tenth of a second to a day.
const QUEUE_SECONDS: &[f64] = &[
    0.1,
    0.5,
    1.0,
    5.0,
    15.0,
    60.0,
    300.0,
    900.0,
    3600.0,
    4.0 * 3600.0,
    12.0 * 3600.0,
    86400.0,
];

/// Latency buckets from 100 µs to 60 s.
const SECONDS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0,
];

impl Metrics {
    /// Every figure, unregistered (`register` adds them to a registry). Fails only on a
    /// malformed name or label set, which the tests would show at once.
    pub fn new() -> prometheus::Result<Self> {
        let ledger_ops = counter_vec(
            "keel_ledger_operations_total",
            "Ledger operations answered, by entry kind and outcome (insufficient_funds: the 402 refusals)",
            &["kind", "outcome"],
        )?;
        let upstream = HistogramVec::new(
            HistogramOpts::new(
                "keel_proxy_upstream_seconds",
                "Time the provider took per proxied call (to the end of its body; to its headers for a stream)",
            )
            .buckets(SECONDS.to_vec()),
            &["provider"],
        )?;
        let errors = counter_vec(
            "keel_proxy_upstream_errors_total",
            "Proxied calls the provider failed, by provider and class (4xx, 5xx, transport: no answer)",
            &["provider", "class"],
        )?;
        let added = Histogram::with_opts(
            HistogramOpts::new(
                "keel_proxy_added_seconds",
                "keel's own time per proxied call: the whole call minus the provider's part",
            )
            .buckets(SECONDS.to_vec()),
        )?;
        let ledger_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "keel_ledger_operation_seconds",
                "Ledger operations' time from submission to the ledger until committed (or refused)",
            )
            .buckets(SECONDS.to_vec()),
        )?;
        Ok(Self {
            ledger_seconds,
            jobs_claimed: counter("keel_queue_claimed_jobs_total", "Jobs handed to workers by claims")?,
            claims_per_statement: Histogram::with_opts(
                HistogramOpts::new(
                    "keel_queue_claims_per_statement",
                    "Claims one claim statement served (claims of one action that arrived together on this instance)",
                )
                .buckets(vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]),
            )?,
            reports: counter_vec(
                "keel_queue_reports_total",
                "Terminal job reports, by outcome (applied, replayed, conflict, ...)",
                &["outcome"],
            )?,
            requeued: counter_vec(
                "keel_queue_requeued_total",
                "Jobs put back in the queue, by reason (stale: no heartbeat; interrupted: the worker restarted; unsettled: the run fee could not be settled)",
                &["reason"],
            )?,
            attempts_exhausted: counter(
                "keel_queue_attempts_exhausted_total",
                "Stale jobs failed because their attempts were spent",
            )?,
            queue_wait: HistogramVec::new(
                HistogramOpts::new(
                    "keel_queue_wait_seconds",
                    "A job's wait from becoming claimable (queued, due, requeued or retried) to its claim, by action",
                )
                .buckets(QUEUE_SECONDS.to_vec()),
                &["action"],
            )?,
            queue_run: HistogramVec::new(
                HistogramOpts::new(
                    "keel_queue_run_seconds",
                    "An attempt's time from its claim to its end, by action and outcome (succeeded, failed, retried, stale, interrupted, blocked, user_stopped)",
                )
                .buckets(QUEUE_SECONDS.to_vec()),
                &["action", "outcome"],
            )?,
            webhook_deliveries: counter_vec(
                "keel_webhook_deliveries_total",
                "Webhook delivery attempts by outcome: succeeded (a 2xx), retrying (another attempt is scheduled), failed (no attempt left)",
                &["outcome"],
            )?,
            webhook_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "keel_webhook_delivery_seconds",
                    "A webhook delivery attempt's time, from sending to the answer's end (or the failure)",
                )
                .buckets(vec![0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]),
            )?,
            webhook_pending: IntGauge::new(
                "keel_webhook_outbox_pending",
                "Webhook deliveries not yet succeeded or failed (read at scrape)",
            )?,
            webhook_oldest: gauge(
                "keel_webhook_oldest_pending_seconds",
                "Age of the oldest pending webhook delivery (read at scrape; 0 when none)",
            )?,
            webhook_endpoints: {
                let endpoints = IntGaugeVec::new(
                    Opts::new(
                        "keel_webhook_endpoints",
                        "Webhook endpoints by state: healthy (enabled, last delivery fine), failing (enabled, failing since its last success), disabled (read at scrape)",
                    ),
                    &["state"],
                )?;
                for state in ["healthy", "failing", "disabled"] {
                    endpoints.with_label_values(&[state]);
                }
                endpoints
            },
            queue_retries: counter_vec(
                "keel_queue_retries_total",
                "Retryable failures scheduled for another attempt, by action",
                &["action"],
            )?,
            queue_jobs: IntGaugeVec::new(
                Opts::new("keel_queue_jobs", "Jobs by action and status (read at scrape)"),
                &["action", "status"],
            )?,
            queue_oldest: GaugeVec::new(
                Opts::new(
                    "keel_queue_oldest_queued_seconds",
                    "Age of the oldest queued job, by action (read at scrape)",
                ),
                &["action"],
            )?,
            ledger_ops: EntryKind::ALL
                .iter()
                .flat_map(|kind| {
                    let ops = &ledger_ops;
                    LEDGER_OUTCOMES
                        .iter()
                        .map(move |outcome| ops.with_label_values(&[kind.as_str(), outcome]))
                })
                .collect(),
            ledger_guarded_writes: counter_vec(
                "keel_ledger_guarded_writes_total",
                "Ledger batches written by one guarded statement outside the committer, by guard (version: the row as planned on; current_account: debits checked against the account as locked)",
                &["guard"],
            )?,
            auto_topups: counter_vec(
                "keel_auto_topups_total",
                "Auto top-ups, by outcome (charged, declined, waiting, failed)",
                &["outcome"],
            )?,
            credit_grants_expired: counter(
                "keel_credit_grants_expired_total",
                "Credit grants expired with something left (their remainder became an expiry entry)",
            )?,
            credit_expired_microcents: counter(
                "keel_credit_expired_microcents_total",
                "Microcents of credit that expired",
            )?,
            auto_topup_limit_reached: counter(
                "keel_auto_topup_limit_reached_total",
                "Auto top-ups not charged because the month's cap would be passed",
            )?,
            traces_expired: counter(
                "keel_traces_expired_total",
                "Traces deleted because they passed their project's traceRetentionDays",
            )?,
            traces_indexed: counter(
                "keel_traces_indexed_total",
                "Traces the search indexer made searchable through the GIN index (PostgreSQL)",
            )?,
            traces_index_lag: gauge(
                "keel_traces_index_lag_seconds",
                "Age of the oldest trace the search indexer has not reached (read at scrape; 0 when none)",
            )?,
            otlp_spans: {
                let spans = counter_vec(
                    "keel_otlp_export_spans_total",
                    "Spans of recorded calls pushed to projects' OTLP endpoints, by outcome: exported (accepted), failed (a push that failed; sent again), dropped (waited past otlp_push.drop_after_hours after a failure, their trace gone, or the export turned off)",
                    &["outcome"],
                )?;
                for outcome in OTLP_OUTCOMES {
                    spans.with_label_values(&[outcome]);
                }
                spans
            },
            dataset_export_lines: {
                let lines = counter_vec(
                    "keel_dataset_export_lines_total",
                    "Lines of dataset versions streamed (exports and workers' reads), by format",
                    &["format"],
                )?;
                for format in DATASET_FORMATS {
                    lines.with_label_values(&[format]);
                }
                lines
            },
            dataset_export_bytes: {
                let bytes = counter_vec(
                    "keel_dataset_export_bytes_total",
                    "Bytes of dataset versions streamed (exports and workers' reads), by format",
                    &["format"],
                )?;
                for format in DATASET_FORMATS {
                    bytes.with_label_values(&[format]);
                }
                bytes
            },
            otlp_lag: gauge(
                "keel_otlp_export_lag_seconds",
                "Age of the oldest recorded call waiting to be pushed to its project's OTLP endpoint (read at scrape; 0 when none)",
            )?,
            proxy_limited: {
                let limited = counter_vec(
                    "keel_proxy_limited_total",
                    "Proxied and relayed calls an API key's limit refused (429), by limit",
                    &["limit"],
                )?;
                // Every series exists from start-up.
                for kind in crate::domain::LimitKind::ALL {
                    limited.with_label_values(&[kind.as_str()]);
                }
                limited
            },
            payments_reconciled: counter_vec(
                "keel_payments_reconciled_total",
                "Pending charges the reconciler settled, by outcome (credited, declined, waiting, failed)",
                &["outcome"],
            )?,
            payments_pending: IntGauge::new(
                "keel_payments_pending",
                "Charges recorded before the processor was called and not settled yet (read at scrape)",
            )?,
            schedule_enqueued: {
                let enqueued = counter_vec(
                    "keel_schedule_enqueued_total",
                    "Jobs cron schedules enqueued, by trigger: tick (on time), catch_up (the latest tick missed while no instance ran, catchUp latest), run_now",
                    &["trigger"],
                )?;
                for trigger in SCHEDULE_TRIGGERS {
                    enqueued.with_label_values(&[trigger]);
                }
                enqueued
            },
            schedule_lag: gauge(
                "keel_schedule_lag_seconds",
                "How long the earliest due tick of an enabled schedule has waited to be enqueued (read at scrape; 0 when none is due)",
            )?,
            payments_oldest: gauge(
                "keel_payments_oldest_pending_seconds",
                "Age of the oldest charge not settled yet (read at scrape; 0 when none)",
            )?,
            ready: IntGauge::new(
                "keel_ready",
                "1 when this instance is ready (as /healthz: database answering, ledger not stalled, not draining), else 0",
            )?,
            database_up: IntGauge::new(
                "keel_database_up",
                "1 when the database answered a ping at this scrape (within 1 s), else 0",
            )?,
            ledger_stalled: gauge(
                "keel_ledger_stalled_seconds",
                "How long ledger operations have waited without the ledger answering any (0 when none wait)",
            )?,
            upstream_seconds: PROVIDERS.iter().map(|p| upstream.with_label_values(&[p])).collect(),
            added_seconds: added.clone(),
            upstream_errors: PROVIDERS
                .iter()
                .flat_map(|p| {
                    let errors = &errors;
                    UPSTREAM_ERROR_CLASSES
                        .iter()
                        .map(move |class| errors.with_label_values(&[p, class]))
                })
                .collect(),
            tokens: counter_vec(
                "keel_proxy_tokens_total",
                "Tokens of recorded proxied calls, by provider, model and kind (prompt, completion)",
                &["provider", "model", "kind"],
            )?,
            token_models: Default::default(),
            spans_export_lag: gauge(
                "keel_spans_export_lag_seconds",
                "How long the oldest span not yet exported over OTLP has waited (0 when none waits or nothing is exported)",
            )?,
            trace_lag: gauge(
                "keel_trace_writer_lag_seconds",
                "How long the oldest trace of the last written batch waited between its call's end and its insert",
            )?,
            trace_queue: IntGauge::new(
                "keel_trace_writer_queue",
                "Traces waiting for the trace writer (read at scrape)",
            )?,
            cache_loads: counter_vec(
                "keel_cache_loads_total",
                "Look-ups a cache sent to the database (misses; callers that missed one entry at once share one), by cache",
                &["cache"],
            )?,
            families: (ledger_ops.clone(), upstream.clone(), errors.clone()),
        }
        .with_zero_series())
    }

    /// Every labelled series an alert may name exists from the start, at zero.
    fn with_zero_series(self) -> Self {
        for outcome in ["applied", "repeated", "not_held", "not_found"] {
            self.reports.with_label_values(&[outcome]);
        }
        for reason in ["stale", "interrupted", "unsettled"] {
            self.requeued.with_label_values(&[reason]);
        }
        for outcome in ["charged", "declined", "waiting", "failed"] {
            self.auto_topups.with_label_values(&[outcome]);
        }
        for outcome in ["credited", "declined", "waiting", "failed"] {
            self.payments_reconciled.with_label_values(&[outcome]);
        }
        for cache in CACHES {
            self.cache_loads.with_label_values(&[cache]);
        }
        for outcome in WEBHOOK_OUTCOMES {
            self.webhook_deliveries.with_label_values(&[outcome]);
        }
        for action in JobAction::NAMES {
            self.queue_wait.with_label_values(&[action]);
            self.queue_retries.with_label_values(&[action]);
            for outcome in AttemptOutcome::ALL {
                self.queue_run.with_label_values(&[action, outcome.as_str()]);
            }
        }
        self.zero_queue_jobs();
        self.zero_queue_oldest();
        self
    }

    /// A job of `action` claimed after waiting `seconds` since it became claimable.
    pub fn job_waited(&self, action: JobAction, seconds: f64) {
        self.queue_wait
            .with_label_values(&[action.as_str()])
            .observe(seconds.max(0.0));
    }

    /// A webhook delivery attempt ended `outcome` (one of [`WEBHOOK_OUTCOMES`]) after
    /// `seconds`.
    pub fn webhook_attempt(&self, outcome: &str, seconds: f64) {
        self.webhook_deliveries.with_label_values(&[outcome]).inc();
        self.webhook_seconds.observe(seconds.max(0.0));
    }

    /// An attempt at a job of `action` ended `outcome` after `seconds` since its claim;
    /// a retried one counts as a retry.
    pub fn attempt_ended(&self, action: JobAction, outcome: AttemptOutcome, seconds: f64) {
        self.queue_run
            .with_label_values(&[action.as_str(), outcome.as_str()])
            .observe(seconds.max(0.0));
        if outcome == AttemptOutcome::Retried {
            self.queue_retries.with_label_values(&[action.as_str()]).inc();
        }
    }

    fn zero_queue_jobs(&self) {
        for action in JobAction::ALL {
            for status in JobStatus::ALL {
                self.queue_jobs
                    .with_label_values(&[action.as_str(), status.as_str()])
                    .set(0);
            }
        }
    }

    fn zero_queue_oldest(&self) {
        for action in JobAction::ALL {
            self.queue_oldest.with_label_values(&[action.as_str()]).set(0.0);
        }
    }

    /// The load counter of one of [`CACHES`].
    pub fn cache_loads(&self, cache: &str) -> IntCounter {
        self.cache_loads.with_label_values(&[cache])
    }

    pub fn register(&self, registry: &Registry) -> prometheus::Result<()> {
        let collectors: Vec<Box<dyn prometheus::core::Collector>> = vec![
            Box::new(self.jobs_claimed.clone()),
            Box::new(self.claims_per_statement.clone()),
            Box::new(self.reports.clone()),
            Box::new(self.requeued.clone()),
            Box::new(self.attempts_exhausted.clone()),
            Box::new(self.queue_wait.clone()),
            Box::new(self.queue_run.clone()),
            Box::new(self.queue_retries.clone()),
            Box::new(self.webhook_deliveries.clone()),
            Box::new(self.webhook_seconds.clone()),
            Box::new(self.webhook_pending.clone()),
            Box::new(self.webhook_oldest.clone()),
            Box::new(self.queue_jobs.clone()),
            Box::new(self.queue_oldest.clone()),
            Box::new(self.schedule_enqueued.clone()),
            Box::new(self.schedule_lag.clone()),
            Box::new(self.auto_topups.clone()),
            Box::new(self.ledger_guarded_writes.clone()),
            Box::new(self.credit_grants_expired.clone()),
            Box::new(self.credit_expired_microcents.clone()),
            Box::new(self.auto_topup_limit_reached.clone()),
            Box::new(self.traces_expired.clone()),
            Box::new(self.traces_indexed.clone()),
            Box::new(self.traces_index_lag.clone()),
            Box::new(self.otlp_spans.clone()),
            Box::new(self.otlp_lag.clone()),
            Box::new(self.dataset_export_lines.clone()),
            Box::new(self.dataset_export_bytes.clone()),
            Box::new(self.proxy_limited.clone()),
            Box::new(self.payments_reconciled.clone()),
            Box::new(self.payments_pending.clone()),
            Box::new(self.payments_oldest.clone()),
            Box::new(self.ready.clone()),
            Box::new(self.database_up.clone()),
            Box::new(self.webhook_endpoints.clone()),
            Box::new(self.ledger_stalled.clone()),
            Box::new(self.tokens.clone()),
            Box::new(self.trace_lag.clone()),
            Box::new(self.spans_export_lag.clone()),
            Box::new(self.trace_queue.clone()),
            Box::new(self.cache_loads.clone()),
            Box::new(self.ledger_seconds.clone()),
        ];
        for collector in collectors {
            registry.register(collector)?;
        }
        registry.register(Box::new(self.families.0.clone()))?;
        registry.register(Box::new(self.families.1.clone()))?;
        registry.register(Box::new(self.families.2.clone()))?;
        registry.register(Box::new(self.added_seconds.clone()))
    }

    /// Counts one answered ledger operation; `outcome` is one of [`LEDGER_OUTCOMES`].
    pub fn ledger_op(&self, kind: EntryKind, outcome: &str) {
        let outcome = LEDGER_OUTCOMES.iter().position(|o| *o == outcome).unwrap_or(0);
        let kind = EntryKind::ALL.iter().position(|k| *k == kind).unwrap_or(0);
        if let Some(counter) = self.ledger_ops.get(kind * LEDGER_OUTCOMES.len() + outcome) {
            counter.inc();
        }
    }

    /// Times one proxied call: the provider's part, and keel's own (the rest).
    pub fn proxied(&self, provider: usize, upstream: std::time::Duration, total: std::time::Duration) {
        if let Some(histogram) = self.upstream_seconds.get(provider) {
            histogram.observe(upstream.as_secs_f64());
        }
        self.added_seconds
            .observe(total.saturating_sub(upstream).as_secs_f64());
    }

    /// Counts a provider's failure: its status (4xx, 5xx), or `None` when it did not answer.
    pub fn upstream_error(&self, provider: usize, status: Option<u16>) {
        let class = match status {
            Some(400..=499) => 0,
            Some(500..=599) => 1,
            Some(_) => return,
            None => 2,
        };
        if let Some(counter) = self
            .upstream_errors
            .get(provider * UPSTREAM_ERROR_CLASSES.len() + class)
        {
            counter.inc();
        }
    }

    /// Counts a call an API key's limit refused.
    pub fn limited(&self, limit: crate::domain::LimitKind) {
        self.proxy_limited.with_label_values(&[limit.as_str()]).inc();
    }

    /// Counts a provider's stream that failed after its head (cut, stalled, ended early).
    pub fn stream_error(&self, provider: usize) {
        if let Some(counter) = self
            .upstream_errors
            .get(provider * UPSTREAM_ERROR_CLASSES.len() + 3)
        {
            counter.inc();
        }
    }

    /// Counts a recorded call's tokens (on the trace writer's task, not the proxy's path).
    pub fn count_tokens(&self, provider: &str, model: &str, kind: &str, tokens: u64) {
        let model = {
            let mut known = self.token_models.lock().unwrap_or_else(|p| p.into_inner());
            if known.contains(model) || (known.len() < MAX_TOKEN_MODELS && known.insert(model.to_owned())) {
                model
            } else {
                "other"
            }
        };
        self.tokens
            .with_label_values(&[provider, model, kind])
            .inc_by(tokens);
    }

    /// Sets what only the database and the background workers know, just before a scrape
    /// is encoded. A reading that failed (`None`) leaves its gauges as they were.
    pub fn record(&self, readings: Readings) {
        if let Some(counts) = readings.jobs {
            // Every (action, status) series stays, at 0 when no job has it: an alert on one
            // never sees it vanish. Only known actions and statuses are labels.
            self.zero_queue_jobs();
            for (action, status, count) in counts {
                if let (Some(action), Some(status)) = (JobAction::parse(&action), JobStatus::parse(&status)) {
                    self.queue_jobs
                        .with_label_values(&[action.as_str(), status.as_str()])
                        .set(count);
                }
            }
        }
        if let Some(oldest) = readings.oldest_queued {
            self.zero_queue_oldest();
            let now = chrono::Utc::now();
            for (action, at) in oldest {
                if let Some(action) = JobAction::parse(&action) {
                    let age = (now - at).num_milliseconds().max(0) as f64 / 1000.0;
                    self.queue_oldest.with_label_values(&[action.as_str()]).set(age);
                }
            }
        }
        if let Some(due) = readings.schedules_due {
            self.schedule_lag.set(age_of(due));
        }
        if let Some((pending, oldest)) = readings.payments_pending {
            self.payments_pending.set(pending as i64);
            self.payments_oldest.set(age_of(oldest));
        }
        self.ready.set(i64::from(readings.ready));
        self.database_up.set(i64::from(readings.database_up));
        if let Some(endpoints) = readings.webhook_endpoints {
            for (state, count) in [
                ("healthy", endpoints.healthy),
                ("failing", endpoints.failing),
                ("disabled", endpoints.disabled),
            ] {
                self.webhook_endpoints.with_label_values(&[state]).set(count);
            }
        }
        self.ledger_stalled.set(readings.ledger_stalled.as_secs_f64());
        self.trace_queue.set(readings.trace_queue as i64);
        if let Some((pending, oldest)) = readings.webhooks_pending {
            self.webhook_pending.set(pending);
            let age = oldest.map_or(0.0, |at| {
                (chrono::Utc::now() - at).num_milliseconds().max(0) as f64 / 1000.0
            });
            self.webhook_oldest.set(age);
        }
        if let Some(oldest) = readings.traces_unindexed {
            let age = oldest.map_or(0.0, |at| {
                (chrono::Utc::now() - at).num_milliseconds().max(0) as f64 / 1000.0
            });
            self.traces_index_lag.set(age);
        }
        if let Some(oldest) = readings.otlp_pending {
            let age = oldest.map_or(0.0, |at| {
                (chrono::Utc::now() - at).num_milliseconds().max(0) as f64 / 1000.0
            });
            self.otlp_lag.set(age);
        }
    }

    /// The counter of pushed spans of `outcome` (one of [`OTLP_OUTCOMES`]).
    /// Counts jobs a schedule enqueued (`trigger` is one of [`SCHEDULE_TRIGGERS`]).
    pub fn schedule_enqueued(&self, trigger: &str, jobs: u64) {
        self.schedule_enqueued.with_label_values(&[trigger]).inc_by(jobs);
    }

    /// Counts a streamed page of a dataset version (`format` is one of its line formats).
    pub fn dataset_exported(&self, format: &str, lines: u64, bytes: u64) {
        self.dataset_export_lines
            .with_label_values(&[format])
            .inc_by(lines);
        self.dataset_export_bytes
            .with_label_values(&[format])
            .inc_by(bytes);
    }

    pub fn otlp_spans(&self, outcome: &str) -> IntCounter {
        self.otlp_spans.with_label_values(&[outcome])
    }

    /// Each action's queue wait and run time (every outcome) at the 50th, 90th and 99th
    /// percentiles, estimated from this instance's histograms since it started.
    pub fn queue_latencies(&self) -> Vec<ActionLatency> {
        JobAction::ALL
            .iter()
            .map(|&action| {
                let wait = buckets_of(&[self.queue_wait.with_label_values(&[action.as_str()])]);
                let runs: Vec<Histogram> = AttemptOutcome::ALL
                    .iter()
                    .map(|outcome| {
                        self.queue_run
                            .with_label_values(&[action.as_str(), outcome.as_str()])
                    })
                    .collect();
                ActionLatency {
                    action,
                    wait: Percentiles::of(&wait),
                    run: Percentiles::of(&buckets_of(&runs)),
                }
            })
            .collect()
    }
}

/// One action's queue wait and run time, as the operator's console shows them.
#[derive(Debug, Clone)]
pub struct ActionLatency {
    pub action: JobAction,
    pub wait: Percentiles,
    pub run: Percentiles,
}

/// Where a histogram's percentiles fall: for each, the bucket that holds it, `(lower, upper)`
/// in seconds (`upper` infinite past the last bound). A histogram knows no more than that; a
/// point inside the bucket would be a guess. None without observations.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Percentiles {
    pub count: u64,
    pub p50: Option<(f64, f64)>,
    pub p90: Option<(f64, f64)>,
    pub p99: Option<(f64, f64)>,
}

impl Percentiles {
    fn of(buckets: &[(f64, u64)]) -> Self {
        Self {
            count: buckets.last().map_or(0, |(_, n)| *n),
            p50: quantile_bucket(buckets, 0.5),
            p90: quantile_bucket(buckets, 0.9),
            p99: quantile_bucket(buckets, 0.99),
        }
    }
}

/// The bucket of cumulative `buckets` that holds the `q` quantile: `(lower bound, upper
/// bound)`, the first bucket from 0, the last one up to infinity.
pub fn quantile_bucket(buckets: &[(f64, u64)], q: f64) -> Option<(f64, f64)> {
    let total = buckets.last()?.1;
    if total == 0 {
        return None;
    }
    let rank = q * total as f64;
    let mut lower = 0.0;
    for &(bound, count) in buckets {
        if count as f64 >= rank && count > 0 {
            return Some((lower, bound));
        }
        lower = bound;
    }
    Some((lower, f64::INFINITY))
}

/// The summed cumulative buckets `(upper bound, observations at or under it)` of
/// histograms with the same bounds, the `+Inf` bucket last.
fn buckets_of(histograms: &[Histogram]) -> Vec<(f64, u64)> {
    let mut summed: Vec<(f64, u64)> = Vec::new();
    for histogram in histograms {
        let metric = prometheus::core::Metric::metric(histogram);
        let proto = metric.get_histogram();
        for (i, bucket) in proto.get_bucket().iter().enumerate() {
            match summed.get_mut(i) {
                Some((_, n)) => *n += bucket.cumulative_count(),
                None => summed.push((bucket.upper_bound(), bucket.cumulative_count())),
            }
        }
        let total = proto.get_sample_count();
        match summed.get_mut(proto.get_bucket().len()) {
            Some((_, n)) => *n += total,
            None => summed.push((f64::INFINITY, total)),
        }
    }
    summed
}

/// The `q` quantile of cumulative `buckets` as Prometheus' `histogram_quantile` estimates
/// it: linear within the bucket that holds it, the first bucket from 0; one that falls in
/// the `+Inf` bucket is reported as the highest finite bound.
pub fn quantile(buckets: &[(f64, u64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total == 0 {
        return None;
    }
    let rank = q * total as f64;
    let mut lower = (0.0, 0u64);
    for &(bound, count) in buckets {
        if count as f64 >= rank {
            if bound.is_infinite() {
                return Some(lower.0);
            }
            let inside = (count - lower.1) as f64;
            let fraction = if inside > 0.0 {
                (rank - lower.1 as f64) / inside
            } else {
                1.0
            };
            return Some(lower.0 + (bound - lower.0) * fraction);
        }
        lower = (bound, count);
    }
    Some(lower.0)
}

/// Webhook endpoints by state (read at scrape).
#[derive(Debug, Clone, Copy, Default)]
pub struct EndpointStates {
    pub healthy: i64,
    pub failing: i64,
    pub disabled: i64,
}

/// Seconds since `at` (0 when none).
fn age_of(at: Option<chrono::DateTime<chrono::Utc>>) -> f64 {
    at.map_or(0.0, |at| {
        (chrono::Utc::now() - at).num_milliseconds().max(0) as f64 / 1000.0
    })
}

/// What a scrape reads from the database and the background workers.
pub struct Readings {
    /// Jobs per (action, status).
    pub jobs: Option<Vec<(String, String, i64)>>,
    /// The oldest queued job's creation per action.
    pub oldest_queued: Option<Vec<(String, chrono::DateTime<chrono::Utc>)>>,
    /// Charges not settled yet, and when the oldest was recorded.
    pub payments_pending: Option<(u64, Option<chrono::DateTime<chrono::Utc>>)>,
    pub ledger_stalled: std::time::Duration,
    pub ready: bool,
    pub database_up: bool,
    pub webhook_endpoints: Option<EndpointStates>,
    pub trace_queue: usize,
    /// Pending webhook deliveries and when the oldest was created.
    pub webhooks_pending: Option<(i64, Option<chrono::DateTime<chrono::Utc>>)>,
    /// When the oldest trace the search indexer has not reached was recorded.
    pub traces_unindexed: Option<Option<chrono::DateTime<chrono::Utc>>>,
    /// When the oldest trace waiting to be pushed to an OTLP endpoint was recorded.
    pub otlp_pending: Option<Option<chrono::DateTime<chrono::Utc>>>,
    /// The earliest tick due and not enqueued yet.
    pub schedules_due: Option<Option<chrono::DateTime<chrono::Utc>>>,
}

#[cfg(test)]
mod quantile_tests {
    use super::*;

    #[test]
    fn a_percentile_is_the_bucket_that_holds_its_rank() {
        let buckets = [(0.01, 0), (0.05, 6), (0.1, 9), (f64::INFINITY, 10)];
        assert_eq!(quantile_bucket(&buckets, 0.5), Some((0.01, 0.05)));
        assert_eq!(quantile_bucket(&buckets, 0.9), Some((0.05, 0.1)));
        assert_eq!(quantile_bucket(&buckets, 0.99), Some((0.1, f64::INFINITY)));
        assert_eq!(quantile_bucket(&[(1.0, 0), (f64::INFINITY, 0)], 0.5), None);
        // Everything in the first bucket: from 0.
        assert_eq!(
            quantile_bucket(&[(0.005, 4), (f64::INFINITY, 4)], 0.99),
            Some((0.0, 0.005))
        );
    }

    #[test]
    fn interpolates_within_the_bucket_that_holds_the_rank() {
        // 10 under 1 s, 10 between 1 and 2 s, none above.
        let buckets = [(1.0, 10), (2.0, 20), (f64::INFINITY, 20)];
        assert_eq!(quantile(&buckets, 0.5), Some(1.0));
        assert_eq!(quantile(&buckets, 0.25), Some(0.5));
        assert_eq!(quantile(&buckets, 0.75), Some(1.5));
        assert_eq!(quantile(&[(1.0, 0), (f64::INFINITY, 0)], 0.5), None);
    }

    #[test]
    fn a_rank_past_the_last_bound_reports_that_bound() {
        let buckets = [(1.0, 1), (5.0, 2), (f64::INFINITY, 10)];
        assert_eq!(quantile(&buckets, 0.99), Some(5.0));
    }

    #[test]
    fn latencies_come_from_the_histograms_of_every_outcome() {
        let metrics = Metrics::new().unwrap();
        metrics.job_waited(JobAction::Tracer, 0.2);
        metrics.attempt_ended(JobAction::Tracer, AttemptOutcome::Succeeded, 3.0);
        metrics.attempt_ended(JobAction::Tracer, AttemptOutcome::Failed, 3.0);
        let tracer = metrics
            .queue_latencies()
            .into_iter()
            .find(|l| l.action == JobAction::Tracer)
            .unwrap();
        assert_eq!(tracer.wait.count, 1);
        assert_eq!(tracer.run.count, 2);
        // 3 s lies in a bucket that starts at or under it and ends above it.
        let (lower, upper) = tracer.run.p50.unwrap();
        assert!(
            lower <= 3.0 && upper >= 3.0 && upper.is_finite(),
            "{lower}..{upper}"
        );
        let idle = metrics
            .queue_latencies()
            .into_iter()
            .find(|l| l.action == JobAction::Training)
            .unwrap();
        assert_eq!(
            idle.run,
            Percentiles {
                count: 0,
                p50: None,
                p90: None,
                p99: None
            }
        );
    }
}
