//! `keel-bench`: the benchmarks, over real HTTP against a fresh database (a temporary SQLite
//! file, or a scratch PostgreSQL database), each against its simplest baseline measured in
//! the same run. Tables go to stdout as markdown (docs/BENCHMARKS.md); progress to stderr.
#![forbid(unsafe_code)]
#![allow(clippy::print_stdout)]

mod claims;
mod common;
mod console;
mod delay;
mod export;
mod fleet;
mod ledger;
mod pipelines;
mod proxy;
mod queue;
mod relay;
mod search;
mod streams;
mod webhooks;
mod workers;

use clap::{Parser, Subcommand};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(
    name = "keel-bench",
    version,
    about = "keel's benchmarks (markdown tables on stdout)"
)]
struct Cli {
    #[command(subcommand)]
    target: BenchTarget,
}

#[derive(Debug, Subcommand)]
enum BenchTarget {
    /// Serving-usage charges/s and latency: one hot organization and many, group commit
    /// against one transaction per charge.
    Ledger {
        /// Also run on PostgreSQL (an admin URL; a scratch database is created and dropped).
        #[arg(long, env = "KEEL_BENCH_POSTGRES_URL")]
        postgres_url: Option<String>,
        #[arg(long, default_value_t = 20_000)]
        requests: usize,
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        /// Organizations in the spread scenario.
        #[arg(long, default_value_t = 1_000)]
        orgs: usize,
        /// Skip the baseline runs.
        #[arg(long)]
        skip_baseline: bool,
        /// With --postgres-url: measure PostgreSQL only.
        #[arg(long)]
        skip_sqlite: bool,
        /// Active credit grants each organization holds before the run.
        #[arg(long, default_value_t = 0)]
        grants: usize,
        /// Only the one-organization (hot) scenario.
        #[arg(long)]
        hot_only: bool,
    },
    /// What the webhook outbox costs hot charges (an organization with a subscribed endpoint
    /// against one without, interleaved) and the dispatcher's deliveries per second.
    Webhooks {
        #[arg(long, env = "KEEL_BENCH_POSTGRES_URL")]
        postgres_url: Option<String>,
        /// Charges per run.
        #[arg(long, default_value_t = 20_000)]
        requests: usize,
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        /// Runs of each organization, interleaved.
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Events sent through the dispatcher.
        #[arg(long, default_value_t = 5_000)]
        deliveries: usize,
        #[arg(long)]
        skip_sqlite: bool,
    },
    /// The recording proxy's added latency at fixed rates and its saturation throughput,
    /// against the same load sent directly to the fake provider.
    Proxy {
        /// Request rates (per second) of the fixed-rate runs.
        #[arg(long, value_delimiter = ',', default_value = "200,1000,3000")]
        rates: Vec<u32>,
        /// Seconds each fixed-rate run lasts.
        #[arg(long, default_value_t = 5)]
        seconds: u64,
        /// The fixed-rate runs' connections at most: a request that finds them all busy
        /// waits for one (its wait counted in its latency), as with an SDK's bounded pool.
        #[arg(long, default_value_t = 256)]
        connections: usize,
        /// Requests in flight in the saturation run.
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        /// Requests of each saturation run.
        #[arg(long, default_value_t = 100_000)]
        requests: usize,
        /// Rounds: each fixed-rate and saturation measurement this many times, each round
        /// running direct, recording on and recording off in turn (a slow spell of the
        /// machine then falls on all three alike); the tables give every round, the fixed
        /// rates' percentiles pooled and the saturation's medians.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=20))]
        rounds: u64,
        /// The trace writer's batch size (`traces.flush_rows`) for this run; the configured
        /// default when absent.
        #[arg(long)]
        flush_rows: Option<usize>,
        /// The trace writer's longest wait before writing a batch (`traces.flush_ms`) for
        /// this run; the configured default when absent.
        #[arg(long)]
        flush_ms: Option<u64>,
        /// The trace writer's shortest time between two batches under load
        /// (`traces.batch_interval_ms`) for this run; the configured default when absent.
        #[arg(long)]
        batch_interval_ms: Option<u64>,
        /// keel's HTTP workers (`server.workers`) for this run; the configured default (one
        /// per core) when absent.
        #[arg(long)]
        workers: Option<usize>,
        /// Instead of the request runs: this many streamed completions open at once (a
        /// comma-separated list runs each), through a `keel serve` process against the fake.
        #[arg(long, value_delimiter = ',')]
        streams: Vec<usize>,
        /// With --streams: one 20 ms tick for all streams (every stream's chunk at the same
        /// instant), instead of each stream on its own clock with spread phases.
        #[arg(long)]
        aligned: bool,
        /// Instead of recording off, the third phase of each round records through a second
        /// API key with every limit set (requestsPerMinute, tokensPerDay, concurrentStreams)
        /// high enough never to refuse: a limited key against a plain one, interleaved.
        #[arg(long)]
        key_limits: bool,
        /// Runs keel without its trace search indexer (`traces.search_indexer = false`): what
        /// indexing the recorded traces costs at saturation is the difference.
        #[arg(long)]
        no_search_indexer: bool,
        /// Also run on PostgreSQL (an admin URL; a scratch database is created and dropped).
        #[arg(long, env = "KEEL_BENCH_POSTGRES_URL")]
        postgres_url: Option<String>,
        /// With --postgres-url: measure PostgreSQL only.
        #[arg(long)]
        skip_sqlite: bool,
    },
    /// Every console page's server time with a big organization, against `/healthz` and
    /// the JSON API's billing overview in the same run.
    Console {
        #[arg(long, env = "KEEL_BENCH_POSTGRES_URL")]
        postgres_url: Option<String>,
        #[arg(long, default_value_t = 10_000)]
        jobs: usize,
        #[arg(long, default_value_t = 100_000)]
        ledger: usize,
        #[arg(long, default_value_t = 50_000)]
        traces: usize,
        /// Requests per page (one at a time).
        #[arg(long, default_value_t = 100)]
        requests: usize,
        /// With --postgres-url: measure PostgreSQL only.
        #[arg(long)]
        skip_sqlite: bool,
    },
    /// A whole project's traces exported by `keel traces export --all` from `keel serve`:
    /// time and peak RSS of both, against reading the rows straight from the database.
    Export {
        #[arg(long, env = "KEEL_BENCH_POSTGRES_URL")]
        postgres_url: Option<String>,
        #[arg(long, default_value_t = 100_000)]
        traces: usize,
        /// With --postgres-url: measure PostgreSQL only.
        #[arg(long)]
        skip_sqlite: bool,
    },
    /// Full-text search of 1,000,000 traces on PostgreSQL (p50/p95), and the trace writer's
    /// throughput with the search index against without, interleaved.
    Search {
        #[arg(long, env = "KEEL_BENCH_POSTGRES_URL")]
        postgres_url: String,
        #[arg(long, default_value_t = 1_000_000)]
        traces: usize,
        /// Traces each writer round inserts (each of its three parts).
        #[arg(long, default_value_t = 100_000)]
        writes: usize,
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Timed runs of each query.
        #[arg(long, default_value_t = 100)]
        queries: usize,
        /// Traces written, and left unindexed, before the last searches.
        #[arg(long, default_value_t = 20_000)]
        tail: usize,
        /// Steady writer rates (traces/s, comma-separated) at which the indexer's lag is
        /// sampled...
        #[arg(long, value_delimiter = ',', default_value = "1000,5000,10000")]
        paced_rates: Vec<u64>,
        /// ...each for this many seconds.
        #[arg(long, default_value_t = 10)]
        paced_secs: u64,
    },
    /// Enqueue jobs, then workers claim and report them: batched against one job per claim.
    Queue {
        #[arg(long, env = "KEEL_BENCH_POSTGRES_URL")]
        postgres_url: Option<String>,
        #[arg(long, default_value_t = 20_000)]
        jobs: usize,
        #[arg(long, default_value_t = 8)]
        workers: usize,
        /// Requests in flight while enqueueing.
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        /// Skip the baseline runs.
        #[arg(long)]
        skip_baseline: bool,
        /// Measure PostgreSQL only (with --postgres-url).
        #[arg(long)]
        skip_sqlite: bool,
        /// A Python with keel_worker and httpx installed: adds runs of Python worker
        /// processes (the library, and a naive loop as its baseline).
        #[arg(long)]
        python: Option<std::path::PathBuf>,
        /// Python worker processes in those runs.
        #[arg(long, default_value_t = 8)]
        python_workers: usize,
    },
    /// What settling pipelines costs the report path: reports/s of jobs nobody waits for
    /// against jobs with one waiting dependent each, rounds interleaved.
    Pipelines {
        #[arg(long, env = "KEEL_BENCH_POSTGRES_URL")]
        postgres_url: Option<String>,
        /// Jobs reported per round.
        #[arg(long, default_value_t = 5_000)]
        jobs: usize,
        /// Reports in flight.
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Measure PostgreSQL only (with --postgres-url).
        #[arg(long)]
        skip_sqlite: bool,
    },
    /// One-job claims per second from concurrent claimers with the database one network
    /// hop away (a TCP proxy adding a delay each way), one keel instance against two.
    Claims {
        /// An admin URL (scratch databases are created and dropped).
        #[arg(long, env = "KEEL_BENCH_POSTGRES_URL")]
        postgres_url: String,
        /// The keel binary to run (default: the one beside keel-bench).
        #[arg(long)]
        keel: Option<std::path::PathBuf>,
        /// Delays each way, in milliseconds, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,5")]
        delays_ms: Vec<u64>,
        /// Claimers in all (spread over the instances), or each instance's with
        /// `--per-instance`.
        #[arg(long, default_value_t = 16)]
        claimers: usize,
        /// Every instance gets `--claimers` claimers (two instances: twice the load), so the
        /// rows say whether a second instance adds claims a second; without it the same
        /// claimers are spread over the instances.
        #[arg(long)]
        per_instance: bool,
        /// The measured window of each round (after a second of warm-up).
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Organizations the jobs (and their run fees) are spread over.
        #[arg(long, default_value_t = 8)]
        orgs: usize,
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// The run fee in cents (0: claims without a fee, so without the ledger).
        #[arg(long)]
        run_fee_cents: Option<u64>,
    },
    /// No-op jobs drained on PostgreSQL by keel's Python worker library, graphile-worker and
    /// pg-boss (npm, in bench/baselines), round by round in one run.
    Workers {
        #[arg(long, env = "KEEL_BENCH_POSTGRES_URL")]
        postgres_url: String,
        /// The keel binary to run (default: the one beside keel-bench).
        #[arg(long)]
        keel: Option<std::path::PathBuf>,
        /// A Python with keel_worker and httpx installed.
        #[arg(long)]
        python: std::path::PathBuf,
        /// Another keel binary, measured beside as "before" (with --before-python).
        #[arg(long, requires = "before_python")]
        before_keel: Option<std::path::PathBuf>,
        /// A Python with that build's keel_worker installed.
        #[arg(long, requires = "before_keel")]
        before_python: Option<std::path::PathBuf>,
        #[arg(long, default_value_t = 20_000)]
        jobs: usize,
        #[arg(long, default_value_t = 3)]
        rounds: usize,
    },
    /// The bare relay `proxy --streams` starts beside keel (the same HTTP stack, none of
    /// keel's work): prints its port, relays until stopped.
    #[command(hide = true)]
    Relay {
        /// The upstream's base URL (…/v1).
        #[arg(long)]
        upstream: String,
    },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // Per-request log lines would measure the terminal, not keel.
    let mut telemetry = match keel_core::config::Settings::defaults() {
        Ok(settings) => settings.telemetry,
        Err(err) => {
            eprintln!("keel-bench: {err}");
            return std::process::ExitCode::from(2);
        }
    };
    telemetry.level = "warn".into();
    let logs = keel::telemetry::init(&telemetry);
    let result = actix_web::rt::System::new().block_on(run(cli));
    logs.flush();
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("keel-bench: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.target {
        BenchTarget::Proxy { streams, aligned, .. } if !streams.is_empty() => {
            let phases = match aligned {
                true => crate::streams::Phases::Aligned,
                false => crate::streams::Phases::Spread,
            };
            crate::streams::run(&streams, phases).await
        }
        BenchTarget::Proxy {
            rates,
            seconds,
            connections,
            concurrency,
            requests,
            rounds,
            flush_rows,
            flush_ms,
            batch_interval_ms,
            workers,
            postgres_url,
            skip_sqlite,
            key_limits,
            no_search_indexer,
            ..
        } => {
            crate::proxy::run(crate::proxy::ProxyBench {
                rates,
                seconds,
                connections,
                concurrency,
                saturation_requests: requests,
                rounds: rounds as usize,
                flush_rows,
                flush_ms,
                batch_interval_ms,
                workers,
                postgres_url,
                skip_sqlite,
                key_limits,
                search_indexer: !no_search_indexer,
            })
            .await
        }
        BenchTarget::Ledger {
            postgres_url,
            requests,
            concurrency,
            orgs,
            skip_baseline,
            skip_sqlite,
            grants,
            hot_only,
        } => {
            crate::ledger::run(crate::ledger::LedgerBench {
                postgres_url,
                requests,
                concurrency,
                spread_orgs: orgs,
                skip_baseline,
                skip_sqlite,
                grants,
                hot_only,
            })
            .await
        }
        BenchTarget::Search {
            postgres_url,
            traces,
            writes,
            rounds,
            queries,
            tail,
            paced_rates,
            paced_secs,
        } => {
            crate::search::run(crate::search::SearchBench {
                postgres_url,
                traces,
                writes,
                rounds,
                queries,
                tail,
                paced_rates,
                paced_secs,
            })
            .await
        }
        BenchTarget::Export {
            postgres_url,
            traces,
            skip_sqlite,
        } => {
            crate::export::run(crate::export::ExportBench {
                postgres_url,
                traces,
                skip_sqlite,
            })
            .await
        }
        BenchTarget::Console {
            postgres_url,
            jobs,
            ledger,
            traces,
            requests,
            skip_sqlite,
        } => {
            crate::console::run(crate::console::ConsoleBench {
                postgres_url,
                jobs,
                ledger,
                traces,
                requests,
                skip_sqlite,
            })
            .await
        }
        BenchTarget::Claims {
            postgres_url,
            keel,
            delays_ms,
            claimers,
            per_instance,
            seconds,
            orgs,
            rounds,
            run_fee_cents,
        } => {
            crate::claims::run(crate::claims::ClaimsBench {
                postgres_url,
                keel,
                delays_ms,
                claimers,
                per_instance,
                seconds,
                orgs,
                rounds,
                run_fee_cents,
            })
            .await
        }
        BenchTarget::Workers {
            postgres_url,
            keel,
            python,
            before_keel,
            before_python,
            jobs,
            rounds,
        } => {
            crate::workers::run(crate::workers::WorkersBench {
                postgres_url,
                keel,
                python,
                before: before_keel.zip(before_python),
                jobs,
                rounds,
            })
            .await
        }
        BenchTarget::Queue {
            postgres_url,
            jobs,
            workers,
            concurrency,
            skip_baseline,
            skip_sqlite,
            python,
            python_workers,
        } => {
            crate::queue::run(crate::queue::QueueBench {
                postgres_url,
                jobs,
                workers,
                concurrency,
                skip_baseline,
                skip_sqlite,
                python,
                python_workers,
            })
            .await
        }
        BenchTarget::Webhooks {
            postgres_url,
            requests,
            concurrency,
            rounds,
            deliveries,
            skip_sqlite,
        } => {
            crate::webhooks::run(crate::webhooks::WebhooksBench {
                postgres_url,
                requests,
                concurrency,
                rounds,
                deliveries,
                skip_sqlite,
            })
            .await
        }
        BenchTarget::Pipelines {
            postgres_url,
            jobs,
            concurrency,
            rounds,
            skip_sqlite,
        } => {
            crate::pipelines::run(crate::pipelines::PipelinesBench {
                postgres_url,
                jobs,
                concurrency,
                rounds,
                skip_sqlite,
            })
            .await
        }
        BenchTarget::Relay { upstream } => crate::relay::serve(&upstream).await,
    }
}
