//! `keel-bench workers`: N no-op jobs drained on PostgreSQL by the queues a team would pick,
//! in one run, interleaved round by round: keel's Python worker library (`keel_worker.Worker`
//! at concurrency 10: one process, then four), graphile-worker (concurrency 10, one Node
//! process) and pg-boss (four work loops fetching 1,000 at a time), from `bench/baselines`
//! (installed with npm on first use). Optionally a second keel build and library (before a
//! change) in the same rounds.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::claims::median;
use crate::common::{postgres_cpu, proc_cpu, BenchDb, BENCH_INTERNAL_KEY};
use crate::fleet::{keel_binary, Fleet};

pub struct WorkersBench {
    pub postgres_url: String,
    pub keel: Option<PathBuf>,
    /// A Python with keel_worker (this build's library) and httpx installed.
    pub python: PathBuf,
    /// Another keel binary and a Python with its library: measured beside, as "before".
    pub before: Option<(PathBuf, PathBuf)>,
    pub jobs: usize,
    pub rounds: usize,
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Keel { processes: usize, before: bool },
    Graphile,
    PgBoss,
}

impl Mode {
    fn name(self) -> String {
        match self {
            Mode::Keel { processes, before } => format!(
                "keel{}: keel_worker.Worker(concurrency=10), {processes} process{}",
                if before { " (before)" } else { "" },
                if processes == 1 { "" } else { "es" }
            ),
            Mode::Graphile => "graphile-worker 0.16 (concurrency 10, 1 process)".into(),
            Mode::PgBoss => "pg-boss 10 (4 work loops, batchSize 1,000, 1 process)".into(),
        }
    }
}

pub async fn run(bench: WorkersBench) -> anyhow::Result<()> {
    let baselines = Path::new(env!("CARGO_MANIFEST_DIR")).join("baselines");
    if !baselines.join("node_modules").exists() {
        eprintln!("installing graphile-worker and pg-boss with npm (bench/baselines)");
        let status = Command::new("npm")
            .args(["ci", "--no-audit", "--no-fund"])
            .current_dir(&baselines)
            .status()?;
        anyhow::ensure!(status.success(), "npm ci failed in {}", baselines.display());
    }
    let mut modes = vec![
        Mode::Keel {
            processes: 1,
            before: false,
        },
        Mode::Keel {
            processes: 4,
            before: false,
        },
        Mode::Graphile,
        Mode::PgBoss,
    ];
    if bench.before.is_some() {
        modes.insert(
            0,
            Mode::Keel {
                processes: 1,
                before: true,
            },
        );
        modes.insert(
            2,
            Mode::Keel {
                processes: 4,
                before: true,
            },
        );
    }
    let mut results: Vec<(Mode, Vec<f64>, Vec<Cpu>)> =
        modes.iter().map(|m| (*m, Vec::new(), Vec::new())).collect();
    for round in 0..bench.rounds {
        for (mode, rates, cpus) in results.iter_mut() {
            let (rate, cpu) = match *mode {
                Mode::Keel { processes, before } => keel_run(&bench, processes, before).await?,
                Mode::Graphile | Mode::PgBoss => node_run(&bench, &baselines, *mode).await?,
            };
            eprintln!(
                "round {}: {}: {rate:.0} jobs/s ({})",
                round + 1,
                mode.name(),
                cpu.describe()
            );
            rates.push(rate);
            cpus.push(cpu);
        }
    }
    println!("| queue | jobs/s (each round) | median | CPU during the drain, of 2 cores (last round) |");
    println!("|---|---|---|---|");
    for (mode, rates, cpus) in &results {
        println!(
            "| {} | {} | {:.0} | {} |",
            mode.name(),
            rates
                .iter()
                .map(|r| format!("{r:.0}"))
                .collect::<Vec<_>>()
                .join(" / "),
            median(rates),
            cpus.last().map(Cpu::describe).unwrap_or_default()
        );
    }
    Ok(())
}

/// Where the machine's CPU went while the jobs drained: the queue's own process (keel, or
/// the Node process), PostgreSQL's, the Python workers', and the whole machine busy.
#[derive(Default, Clone, Copy)]
struct Cpu {
    queue: f64,
    postgres: f64,
    workers: f64,
    busy: f64,
}

impl Cpu {
    fn describe(&self) -> String {
        let share = |part: f64| format!("{:.0}%", (100.0 * part).abs());
        let workers = match self.workers > 0.0 {
            true => format!(", Python workers {}", share(self.workers)),
            false => String::new(),
        };
        format!(
            "queue {}, PostgreSQL {}{workers}, machine busy {}",
            share(self.queue),
            share(self.postgres),
            share(self.busy)
        )
    }
}

/// CPU readings at one moment: per process (by pid), PostgreSQL's, and the machine's
/// (busy, total) ticks from /proc/stat.
struct Reading {
    processes: Vec<Duration>,
    postgres: Duration,
    machine: (u64, u64),
}

impl Reading {
    fn take(pids: &[u32]) -> Self {
        let machine = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|stat| {
                let fields: Vec<u64> = stat
                    .lines()
                    .next()?
                    .split_whitespace()
                    .skip(1)
                    .filter_map(|f| f.parse().ok())
                    .collect();
                let total: u64 = fields.iter().sum();
                let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
                Some((total.saturating_sub(idle), total))
            })
            .unwrap_or((0, 1));
        Self {
            processes: pids.iter().map(|pid| proc_cpu(&pid.to_string())).collect(),
            postgres: postgres_cpu(),
            machine,
        }
    }

    /// Shares of two cores over `elapsed`, from `self` to `later`: the first process is the
    /// queue's, the rest its workers.
    fn until(&self, later: &Reading, elapsed: Duration) -> Cpu {
        let cores = 2.0 * elapsed.as_secs_f64().max(f64::MIN_POSITIVE);
        let used = |i: usize| later.processes[i].saturating_sub(self.processes[i]).as_secs_f64();
        let workers: f64 = (1..self.processes.len()).map(used).sum();
        let busy = later.machine.0.saturating_sub(self.machine.0);
        let total = later.machine.1.saturating_sub(self.machine.1).max(1);
        Cpu {
            queue: used(0) / cores,
            postgres: later.postgres.saturating_sub(self.postgres).as_secs_f64() / cores,
            workers: workers / cores,
            busy: busy as f64 / total as f64,
        }
    }
}

/// keel's library drains `bench.jobs`: jobs/s from the moment the worker processes (started
/// and imported) are told to go until the last job succeeded.
async fn keel_run(bench: &WorkersBench, processes: usize, before: bool) -> anyhow::Result<(f64, Cpu)> {
    let (exe, python) = match (&bench.before, before) {
        (Some((exe, python)), true) => (exe.clone(), python.clone()),
        _ => (keel_binary(bench.keel.clone())?, bench.python.clone()),
    };
    let fleet = Fleet::start(&bench.postgres_url, &exe, 1, 1, str::to_owned).await?;
    fleet.enqueue(bench.jobs).await?;
    let total = fleet.count("queued").await?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("python_worker.py");
    let mut children = Vec::new();
    for w in 0..processes {
        let mut child = Command::new(&python)
            .arg(&script)
            .args([
                "library10",
                fleet.base(0),
                BENCH_INTERNAL_KEY,
                &format!("py-{w}"),
                "--go",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let mut line = String::new();
        if let Some(stdout) = child.stdout.take() {
            BufReader::new(stdout).read_line(&mut line)?;
        }
        anyhow::ensure!(
            line.trim() == "ready",
            "python worker {w} did not start: {line:?}"
        );
        children.push(child);
    }
    let mut pids = vec![fleet.instances[0].pid()];
    pids.extend(children.iter().map(std::process::Child::id));
    let before_drain = Reading::take(&pids);
    for child in &mut children {
        if let Some(stdin) = child.stdin.as_mut() {
            writeln!(stdin, "go")?;
            stdin.flush()?;
        }
    }
    let started = Instant::now();
    loop {
        let succeeded = fleet.count("succeeded").await?;
        if succeeded >= total {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(600),
            "{succeeded} of {total} jobs succeeded after 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let elapsed = started.elapsed();
    let cpu = before_drain.until(&Reading::take(&pids), elapsed);
    tokio::task::spawn_blocking(move || {
        for child in &children {
            let _ = Command::new("kill").arg(child.id().to_string()).status();
        }
        for mut child in children {
            let _ = child.wait();
        }
    })
    .await?;
    fleet.stop().await;
    Ok((total as f64 / elapsed.as_secs_f64(), cpu))
}

/// graphile-worker or pg-boss drains `bench.jobs` on a scratch database (the script times
/// its own drain and prints it).
async fn node_run(bench: &WorkersBench, baselines: &Path, mode: Mode) -> anyhow::Result<(f64, Cpu)> {
    let db = BenchDb::create(Some(&bench.postgres_url)).await?;
    let jobs = bench.jobs.to_string();
    let args: Vec<&str> = match mode {
        Mode::Graphile => vec!["graphile.mjs", &db.url, &jobs, "10"],
        _ => vec!["pgboss.mjs", &db.url, &jobs, "4", "1000"],
    };
    let dir = baselines.to_owned();
    let args: Vec<String> = args.into_iter().map(str::to_owned).collect();
    // The script says on stderr when its drain starts and ends; CPU is read at those moments.
    let mut child = Command::new("node")
        .args(&args)
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let pid = child.id();
    let stderr = child.stderr.take();
    let marks = tokio::task::spawn_blocking(move || {
        let mut marks = Vec::new();
        if let Some(stderr) = stderr {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if line == "drain started" || line == "drain ended" {
                    marks.push((Instant::now(), Reading::take(&[pid])));
                } else {
                    eprintln!("{line}");
                }
            }
        }
        marks
    });
    let output = tokio::task::spawn_blocking(move || child.wait_with_output()).await??;
    let marks = marks.await?;
    let cpu = match marks.as_slice() {
        [(start, first), (end, last), ..] => first.until(last, *end - *start),
        _ => Cpu::default(),
    };
    db.drop_now().await;
    anyhow::ensure!(output.status.success(), "{} failed", mode.name());
    let line = String::from_utf8_lossy(&output.stdout);
    let answer: serde_json::Value = serde_json::from_str(line.trim())?;
    let rate = answer["jobs_per_second"]
        .as_f64()
        .ok_or_else(|| anyhow::anyhow!("{}: no jobs_per_second in {line}", mode.name()))?;
    Ok((rate, cpu))
}
