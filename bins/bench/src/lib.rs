//! The load benchmark of phrony-rs (issue #14): the real `phrony-runtime` daemon on SQLite and
//! PostgreSQL, Rust workers on the `Work` stream, and the scripted `stub` model (it answers at
//! once, so the daemon is what is measured), with baselines measured in the same run.
//!
//! Scenarios:
//! - **closed loop**: `N` clients each start a task session of one allowed tool call
//!   (`issue_refund` of 50, under the tutorial's approval boundary) on an interactive stream and
//!   wait for it to complete, then start the next; throughput and latency from the start to
//!   `completed`, per concurrency;
//! - **parked**: `P` sessions wait in `awaiting_approval` (a refund of 400); the daemon's resident
//!   memory before and while parked, its CPU while nothing but parked sessions exist, a kill -9
//!   and restart with all of them parked; then a burst of `B` approvals (default up to 1,000, 64
//!   voters at once: each vote's latency, approve → invoke, the time until they all completed);
//!   the sessions not approved are then cancelled, and the memory read again when all ended and
//!   once more after the allocator's decay time;
//! - **baselines**: raw durable SQLite commits per second with the daemon's settings (WAL,
//!   `synchronous=FULL`, one row per transaction) on the same filesystem, and the unary
//!   (`Health/Check`) and bidirectional-stream (`Work` heartbeat → ack) gRPC round trips to the
//!   same daemon.
//!
//! Every run checks the work: each completed session's tool call ran exactly once on a worker
//! (`lost_or_duplicated` counts the difference and every failed session); the binary exits 1
//! when it is not 0. Timing never fails a run.
//!
//! - **open loop**: sessions started at a fixed rate (half the best closed-loop rate of the same
//!   run), each timed from its *scheduled* start, so queueing shows as latency instead of
//!   hiding behind a lower rate (no coordinated omission);
//! - **dispatch overhead**: per closed-loop call, from the moment the client saw the model's tool
//!   call on the session's stream until the invoke reached a worker (both one loopback hop from
//!   the daemon);
//! - **approve → invoke**: from sending `DecideApproval` until the invoke reached a worker, for
//!   20 approvals one at a time and for every approval of the burst.
//!
//! `--webhooks N` runs only the webhook sender's scenario instead (`webhooks.rs`): deliveries
//! per second and the latency from the event's commit to a local receiver.
//!
//! `--replicas 1,2,3` and `--takeovers K` run only the scenarios of several daemons on one
//! PostgreSQL database instead (`replicas.rs`, issue #20): the closed loop with sessions
//! started round robin across the replicas, and the time until a killed replica's session is
//! taken over.

mod baseline;
mod load;
mod replicas;
mod stats;
pub mod webhooks;
mod writer;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};
use tests::daemon::{Backend, Daemon};

pub use stats::Latencies;

/// Command-line options.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "phrony-bench", about = "Load benchmark of the phrony runtime")]
pub struct Options {
    /// A smoke run for CI (about a minute): short phases, few parked sessions.
    #[arg(long)]
    pub quick: bool,
    /// Print one JSON object last on stdout.
    #[arg(long)]
    pub json: bool,
    /// `sqlite`, `postgres` or `both`.
    #[arg(long, default_value = "both")]
    pub backend: String,
    /// Closed-loop concurrencies, comma-separated.
    #[arg(long, default_value = "1,16,64")]
    pub concurrency: String,
    /// Seconds per closed-loop phase (default 10, `--quick` 2).
    #[arg(long)]
    pub seconds: Option<u64>,
    /// Sessions parked in `awaiting_approval` (default 1000, `--quick` 50).
    #[arg(long)]
    pub parked: Option<usize>,
    /// Parked sessions approved in the burst (default: 1000, or all of them when fewer); the
    /// others are cancelled afterwards.
    #[arg(long)]
    pub burst: Option<usize>,
    /// Write the report as Markdown to this file (e.g. `BENCHMARKS.md`).
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Run only the webhook sender's scenario, with this many deliveries per phase (1 to
    /// 100000).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub webhooks: Option<u64>,
    /// Run only the closed loop with this many daemons on one PostgreSQL database,
    /// comma-separated (e.g. `1,2,3`; PostgreSQL only).
    #[arg(long, value_name = "N,...")]
    pub replicas: Option<String>,
    /// Run only (or also, with `--replicas`) the takeover scenario: this many times, kill -9 the
    /// replica driving a session that waits for its approval and time until another takes it
    /// over (PostgreSQL only).
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub takeovers: Option<u64>,
    /// `RUNTIME_SESSION_LEASE_TTL` of the takeover scenario's replicas, in milliseconds
    /// (default: unset, the daemon's 10 s on PostgreSQL).
    #[arg(long, value_name = "MS", value_parser = clap::value_parser!(u64).range(300..=600_000))]
    pub lease_ttl_ms: Option<u64>,
}

/// Why a run could not be made (not a slow run: timing never fails).
#[derive(Debug)]
pub struct BenchError(pub String);

impl std::fmt::Display for BenchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BenchError {}

impl BenchError {
    pub(crate) fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

/// One closed-loop phase.
#[derive(Debug, Clone)]
pub struct ClosedLoop {
    /// `sqlite` or `postgres`.
    pub backend: &'static str,
    /// Concurrent clients.
    pub concurrency: usize,
    /// Sessions completed per second (= governed tool calls per second).
    pub per_s: f64,
    /// Start → completed.
    pub latency: Latencies,
    /// The model's tool call seen on the stream → the invoke at a worker.
    pub dispatch: Latencies,
    /// Sessions that did not complete.
    pub failed: u64,
    /// The daemon's CPU time (user + system) per completed session, in µs; `None` when
    /// `/proc` cannot be read. With several replicas, summed over them.
    pub cpu_us_per_call: Option<f64>,
    /// Daemons on the database, the sessions started round robin across them.
    pub replicas: usize,
    /// Where the phase's ledger writes spent their time (from the daemon's metrics); `None`
    /// when they were not read.
    pub writer: Option<WriterFigures>,
}

/// Where a closed-loop phase's ledger writes spent their time, from the daemon's
/// `phrony_ledger_*` metrics before and after it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WriterFigures {
    /// Write transactions per completed session.
    pub writes_per_session: f64,
    /// Mean wait of a write for its turn (SQLite) or a connection (PostgreSQL), µs.
    pub wait_us: f64,
    /// Mean time a write held its connection, µs (SQLite: the single writer).
    pub hold_us: f64,
    /// Mean commit, µs (SQLite: a batch's `COMMIT` with its fsync).
    pub commit_us: f64,
    /// The writes' holds summed over the phase's time: on SQLite the share of the phase the
    /// writer was lent to writes, on PostgreSQL the mean number of open write transactions.
    pub hold_share: f64,
    /// SQLite: writes per group-commit batch.
    pub writes_per_batch: Option<f64>,
    /// SQLite: the share of the phase the single writer was in a batch (1 = saturated).
    pub busy: Option<f64>,
    /// SQLite: the share of the phase spent in `COMMIT`.
    pub commit_share: Option<f64>,
    /// SQLite: statements each write ran while it held the writer.
    pub statements_per_write: Option<f64>,
    /// SQLite: the time each write's statements took, µs (the rest of its hold is the caller's
    /// code between them).
    pub statement_us: Option<f64>,
    /// SQLite: the time each write's hold spent in the two hand-offs of the writer's
    /// connection (lent to the write's task, handed back to the writer's), µs: waiting for a
    /// task to be scheduled.
    pub handoff_us: Option<f64>,
}

/// The open-loop phase.
#[derive(Debug, Clone)]
pub struct OpenLoop {
    /// `sqlite` or `postgres`.
    pub backend: &'static str,
    /// Sessions started per second.
    pub rate: f64,
    /// Scheduled start → completed.
    pub latency: Latencies,
    /// Sessions that did not complete.
    pub failed: u64,
    /// Starts skipped because too many sessions were still running.
    pub overloaded: u64,
}

/// The parked-sessions phase.
#[derive(Debug, Clone)]
pub struct Parked {
    /// `sqlite` or `postgres`.
    pub backend: &'static str,
    /// Sessions parked.
    pub sessions: usize,
    /// Of those, approved (one at a time, then in the burst) and completed; the others were
    /// cancelled.
    pub approved: usize,
    /// The daemon's CPU (% of one core) over a quiet window with only the parked sessions.
    pub idle_cpu_pct: f64,
    /// Daemon RSS (MiB) before parking, while parked, when they all ended, and
    /// [`SETTLE`](crate::load::SETTLE) later (what the allocator gave back).
    pub rss_mb: [f64; 4],
    /// Daemon RSS (MiB) at the end of the quiet window, every session still parked: the
    /// allocator has had its decay time (jemalloc: 10 s) to return what parking them used, so
    /// this, not the reading right after the last one parked, is what parked sessions hold.
    pub quiet_rss_mb: f64,
    /// kill -9 with every session parked, then start again: milliseconds until `SERVING`.
    pub restart_ms: f64,
    /// Daemon RSS (MiB) right after that restart.
    pub restart_rss_mb: f64,
    /// Approve → invoke, approvals one at a time.
    pub approve_to_invoke: Latencies,
    /// Approvals in the burst.
    pub burst: usize,
    /// Each `DecideApproval` of the burst.
    pub vote: Latencies,
    /// Approve → invoke of each approval of the burst.
    pub burst_to_invoke: Latencies,
    /// From the first vote of the burst until every approved session completed.
    pub burst_ms: f64,
}

/// The bare gRPC round trips to one daemon.
#[derive(Debug, Clone)]
pub struct Rtt {
    /// `sqlite` or `postgres`.
    pub backend: &'static str,
    /// `Health/Check`, one call at a time.
    pub unary: Latencies,
    /// `Work` heartbeat → ack on one stream, one at a time.
    pub bidi: Latencies,
}

/// Everything a run measured.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Raw durable SQLite commits per second (baseline).
    pub raw_commits_per_s: f64,
    /// Round trips to the daemon (baselines), per backend.
    pub rtt: Vec<Rtt>,
    /// Closed-loop phases.
    pub closed: Vec<ClosedLoop>,
    /// Open-loop phases.
    pub open: Vec<OpenLoop>,
    /// Parked phases.
    pub parked: Vec<Parked>,
    /// Closed-loop phases with several replicas on one PostgreSQL database (`--replicas`).
    pub replicas: Vec<ClosedLoop>,
    /// The takeover scenario (`--takeovers`).
    pub takeovers: Option<Takeovers>,
    /// Tool calls that ran a different number of times than once per completed session, plus
    /// sessions that did not complete.
    pub lost_or_duplicated: u64,
}

/// The takeover scenario: kill -9 of the replica driving a session, until another took it
/// over.
#[derive(Debug, Clone)]
pub struct Takeovers {
    /// The session lease TTL the replicas ran with.
    pub lease_ttl: Duration,
    /// From each SIGKILL until the other replica logged that it took the session over.
    pub times: Latencies,
    /// Votes the replica that took the session over refused (each sent again).
    pub refused_votes: u64,
}

/// Approvals in the burst unless `--burst` says otherwise (all parked sessions when fewer).
const DEFAULT_BURST: usize = 1000;

/// The sizes of a run.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) backends: Vec<Backend>,
    pub(crate) concurrency: Vec<usize>,
    pub(crate) phase: Duration,
    pub(crate) parked: usize,
    pub(crate) burst: usize,
    pub(crate) quick: bool,
    pub(crate) rtt_samples: usize,
    pub(crate) commit_phase: Duration,
    /// `--replicas`: the numbers of replicas, in order (empty: not asked).
    pub(crate) replicas: Vec<usize>,
    /// `--takeovers` (0: not asked).
    pub(crate) takeovers: usize,
    /// `--lease-ttl-ms` (`None`: the daemon's default).
    pub(crate) lease_ttl: Option<Duration>,
}

impl Plan {
    fn from(options: &Options) -> Result<Self, BenchError> {
        let backends = match options.backend.as_str() {
            "sqlite" => vec![Backend::Sqlite],
            "postgres" => vec![Backend::Postgres],
            "both" => vec![Backend::Sqlite, Backend::Postgres],
            other => {
                return Err(BenchError::new(format!(
                    "--backend {other:?}: expected sqlite, postgres or both"
                )));
            }
        };
        let concurrency = whole_numbers("--concurrency", &options.concurrency, 1024)?;
        let replicas = match &options.replicas {
            Some(list) => whole_numbers("--replicas", list, MAX_REPLICAS)?,
            None => Vec::new(),
        };
        let takeovers = options
            .takeovers
            .map_or(0, |k| usize::try_from(k).unwrap_or(usize::MAX));
        if (!replicas.is_empty() || takeovers > 0) && backends == [Backend::Sqlite] {
            return Err(BenchError::new(
                "--replicas and --takeovers run several daemons on one PostgreSQL database: \
                 SQLite is one process per file; use --backend postgres",
            ));
        }
        let seconds = options
            .seconds
            .unwrap_or(if options.quick { 2 } else { 10 });
        if !(1..=3600).contains(&seconds) {
            return Err(BenchError::new(format!(
                "--seconds {seconds}: outside 1..=3600"
            )));
        }
        let parked = options
            .parked
            .unwrap_or(if options.quick { 50 } else { 1000 });
        if parked > 200_000 {
            return Err(BenchError::new(format!(
                "--parked {parked}: at most 200000"
            )));
        }
        let burst = options.burst.unwrap_or(DEFAULT_BURST.min(parked));
        if burst > parked {
            return Err(BenchError::new(format!(
                "--burst {burst}: more than the {parked} parked sessions"
            )));
        }
        Ok(Self {
            backends,
            concurrency,
            phase: Duration::from_secs(seconds),
            parked,
            burst,
            quick: options.quick,
            rtt_samples: if options.quick { 200 } else { 2000 },
            commit_phase: Duration::from_secs(if options.quick { 1 } else { 3 }),
            replicas,
            takeovers,
            lease_ttl: options.lease_ttl_ms.map(Duration::from_millis),
        })
    }
}

impl Plan {
    /// Tool calls the single daemon's workers take at once: the closed loop's highest
    /// concurrency and, when sessions are parked, at least the burst's voters. Every vote of
    /// the burst resumes a session whose approved call is dispatched at once, and a worker
    /// slot stays reserved from the dispatch's durable journal entry until the result
    /// arrives: with only the 4 slots of `--concurrency 1`, a debug build's burst of 1,000
    /// under load queued calls past the daemon's 10 s dispatch queue wait (304 failed
    /// "capacity exhausted"); with 64 they all ran. The workers are sized for the load, not
    /// the daemon's timeout.
    pub(crate) fn worker_calls(&self) -> usize {
        let closed = self.concurrency.iter().copied().max().unwrap_or(1);
        if self.parked > 0 && self.burst > 0 {
            closed.max(load::VOTERS.min(self.burst))
        } else {
            closed
        }
    }
}

/// The most replicas `--replicas` starts.
const MAX_REPLICAS: usize = 8;

/// A comma-separated list of whole numbers in `1..=max`, for option `flag`.
fn whole_numbers(flag: &str, list: &str, max: usize) -> Result<Vec<usize>, BenchError> {
    let mut out = Vec::new();
    for part in list.split(',') {
        let n: usize = part.trim().parse().map_err(|_| {
            BenchError::new(format!("{flag} {list:?}: {part:?} is not a whole number"))
        })?;
        if !(1..=max).contains(&n) {
            return Err(BenchError::new(format!("{flag}: {n} is outside 1..={max}")));
        }
        out.push(n);
    }
    Ok(out)
}

fn backend_name(backend: Backend) -> &'static str {
    match backend {
        Backend::Sqlite => "sqlite",
        Backend::Postgres => "postgres",
        Backend::PrivatePostgres => "postgres (private cluster)",
    }
}

/// Runs the benchmark and prints the report (and its JSON, and writes the Markdown, as asked).
///
/// # Errors
/// A daemon that does not start, a refused setup step, a scenario that cannot run.
pub fn run(options: &Options) -> Result<Report, BenchError> {
    let plan = Plan::from(options)?;
    if let Some(n) = options.webhooks {
        let n = usize::try_from(n).map_err(|_| BenchError::new("--webhooks: too many"))?;
        let mut report = Report::default();
        for backend in &plan.backends {
            if let Some(figures) = webhooks::run(*backend, n)? {
                report.lost_or_duplicated +=
                    u64::try_from(figures.lost_or_duplicated).unwrap_or(u64::MAX);
                if options.json {
                    println!(
                        "{}",
                        json!({
                            "backend": figures.backend,
                            "deliveries": figures.n,
                            "steady_deliveries_per_s": figures.steady_per_s,
                            "steady_events_per_s": figures.events_per_s,
                            "commit_to_receiver_p50_ms": figures.latency.p50_us() / 1e3,
                            "commit_to_receiver_p99_ms": figures.latency.p99_us() / 1e3,
                            "commit_to_receiver_max_ms": figures.latency.quantile_us(1.0) / 1e3,
                            "backlog_drain_deliveries_per_s": figures.drain_per_s,
                            "lost_or_duplicated": figures.lost_or_duplicated,
                        })
                    );
                }
            }
        }
        return Ok(report);
    }
    if !plan.replicas.is_empty() || plan.takeovers > 0 {
        let mut report = Report::default();
        if plan.backends.contains(&Backend::Sqlite) {
            eprintln!("replicas: PostgreSQL only (SQLite is one process per file)");
        }
        replicas::throughput(&plan, &mut report)?;
        if plan.takeovers > 0 {
            replicas::takeovers(&plan, &mut report)?;
        }
        return finish(options, &report);
    }
    let mut report = Report {
        raw_commits_per_s: baseline::raw_durable_commits(plan.commit_phase)?,
        ..Report::default()
    };
    eprintln!(
        "baseline: {:.0} raw durable SQLite commits/s",
        report.raw_commits_per_s
    );
    for backend in &plan.backends {
        load::backend(*backend, &plan, &mut report)?;
    }
    if plan.quick && plan.backends.contains(&Backend::Postgres) {
        // The smoke step of several replicas: two daemons on one database, a short closed
        // loop round robin across them; it fails only on errors or lost work.
        let smoke = Plan {
            replicas: vec![2],
            concurrency: vec![4],
            phase: Duration::from_secs(1),
            ..plan.clone()
        };
        replicas::throughput(&smoke, &mut report)?;
    }
    finish(options, &report)
}

/// Prints the report (and writes it, and prints its JSON, as asked).
fn finish(options: &Options, report: &Report) -> Result<Report, BenchError> {
    let value = to_json(report);
    eprint!("{}", markdown(report));
    if let Some(path) = &options.report {
        write_report(path, report)?;
    }
    if options.json {
        println!("{value}");
    }
    Ok(report.clone())
}

fn best(report: &Report, backend: &str) -> Option<f64> {
    report
        .closed
        .iter()
        .filter(|c| c.backend == backend)
        .map(|c| c.per_s)
        .reduce(f64::max)
}

/// The `--json` object.
#[must_use]
pub fn to_json(report: &Report) -> Value {
    let mut out = serde_json::Map::new();
    let mut put = |k: &str, v: Option<f64>| {
        if let Some(v) = v {
            out.insert(k.to_owned(), json!(v));
        }
    };
    put("tool_calls_per_s", best(report, "sqlite"));
    for n in 1..=MAX_REPLICAS {
        let per_s = report
            .replicas
            .iter()
            .filter(|c| c.replicas == n)
            .map(|c| c.per_s)
            .reduce(f64::max);
        put(&format!("tool_calls_per_s_replicas_{n}"), per_s);
    }
    if let Some(t) = report.takeovers.as_ref().filter(|t| !t.times.is_empty()) {
        put(
            "takeover_lease_ttl_ms",
            Some(t.lease_ttl.as_secs_f64() * 1e3),
        );
        put("takeover_p50_ms", Some(t.times.p50_us() / 1e3));
        put("takeover_p90_ms", Some(t.times.quantile_us(0.9) / 1e3));
        put("takeover_max_ms", Some(t.times.quantile_us(1.0) / 1e3));
    }
    put("tool_calls_per_s_postgres", best(report, "postgres"));
    put(
        "raw_durable_commits_per_s",
        Some(report.raw_commits_per_s).filter(|r| *r > 0.0),
    );
    let rtt = report
        .rtt
        .iter()
        .find(|r| r.backend == "sqlite")
        .or_else(|| report.rtt.first());
    put("bare_rtt_p50_us", rtt.map(|r| r.unary.p50_us()));
    put("bare_bidi_rtt_p50_us", rtt.map(|r| r.bidi.p50_us()));
    let first_closed = report
        .closed
        .iter()
        .find(|c| c.backend == "sqlite")
        .or_else(|| report.closed.first());
    if let Some(c) = first_closed.filter(|c| !c.dispatch.is_empty()) {
        put("dispatch_overhead_p50_us", Some(c.dispatch.p50_us()));
        put("dispatch_overhead_p99_us", Some(c.dispatch.p99_us()));
    }
    let open = report
        .open
        .iter()
        .find(|o| o.backend == "sqlite")
        .or_else(|| report.open.first());
    if let Some(o) = open.filter(|o| !o.latency.is_empty()) {
        put("open_loop_rate_per_s", Some(o.rate));
        put(
            "open_loop_p50_ms_at_half_max",
            Some(o.latency.p50_us() / 1000.0),
        );
        put(
            "open_loop_p99_ms_at_half_max",
            Some(o.latency.p99_us() / 1000.0),
        );
    }
    let parked = report
        .parked
        .iter()
        .find(|p| p.backend == "sqlite")
        .or_else(|| report.parked.first());
    if let Some(p) = parked {
        put("parked_rss_mb", Some(p.rss_mb[1]));
        put("parked_rss_settled_mb", Some(p.rss_mb[3]));
        put("parked_rss_quiet_mb", Some(p.quiet_rss_mb));
        put("parked_idle_cpu_pct", Some(p.idle_cpu_pct));
        put("parked_restart_ms", Some(p.restart_ms));
        if !p.approve_to_invoke.is_empty() {
            put(
                "approve_to_invoke_p50_ms",
                Some(p.approve_to_invoke.p50_us() / 1000.0),
            );
        }
        if !p.burst_to_invoke.is_empty() {
            put(
                "approve_burst_to_invoke_p50_ms",
                Some(p.burst_to_invoke.p50_us() / 1000.0),
            );
            put(
                "approve_burst_to_invoke_p99_ms",
                Some(p.burst_to_invoke.p99_us() / 1000.0),
            );
        }
        put("approve_burst_p99_ms", Some(p.vote.p99_us() / 1000.0));
        put("approve_burst_all_completed_ms", Some(p.burst_ms));
        out.insert("parked_sessions".to_owned(), json!(p.sessions));
        out.insert("approve_burst_size".to_owned(), json!(p.burst));
    }
    if let Some(t) = &report.takeovers {
        out.insert("takeover_kills".to_owned(), json!(t.times.len()));
        out.insert("takeover_refused_votes".to_owned(), json!(t.refused_votes));
    }
    out.insert(
        "lost_or_duplicated".to_owned(),
        json!(report.lost_or_duplicated),
    );
    out.insert(
        "closed_loop".to_owned(),
        report.closed.iter().map(closed_json).collect(),
    );
    if !report.replicas.is_empty() {
        out.insert(
            "replicas_closed_loop".to_owned(),
            report
                .replicas
                .iter()
                .map(|c| {
                    json!({
                        "replicas": c.replicas,
                        "concurrency": c.concurrency,
                        "per_s": c.per_s,
                        "ratio_to_1_replica": replicas::ratio_to_one(report, c),
                        "p50_ms": c.latency.p50_us() / 1000.0,
                        "p99_ms": c.latency.p99_us() / 1000.0,
                        "daemon_cpu_us_per_call": c.cpu_us_per_call,
                        "failed": c.failed,
                    })
                })
                .collect(),
        );
    }
    Value::Object(out)
}

/// One closed-loop phase in the `--json` object.
fn closed_json(c: &ClosedLoop) -> Value {
    json!({
        "backend": c.backend,
        "concurrency": c.concurrency,
        "per_s": c.per_s,
        "p50_ms": c.latency.p50_us() / 1000.0,
        "p99_ms": c.latency.p99_us() / 1000.0,
        "dispatch_overhead_p50_us": c.dispatch.p50_us(),
        "daemon_cpu_us_per_call": c.cpu_us_per_call,
        "failed": c.failed,
        "writer": c.writer.map(|w| json!({
            "writes_per_session": w.writes_per_session,
            "wait_us": w.wait_us,
            "hold_us": w.hold_us,
            "commit_us": w.commit_us,
            "hold_share": w.hold_share,
            "writes_per_batch": w.writes_per_batch,
            "busy": w.busy,
            "commit_share": w.commit_share,
            "statements_per_write": w.statements_per_write,
            "statement_us": w.statement_us,
            "handoff_us": w.handoff_us,
        })),
    })
}

/// The human report (also the body of `--report`).
#[must_use]
pub fn markdown(report: &Report) -> String {
    let mut s = String::new();
    if report.raw_commits_per_s > 0.0 {
        single_daemon_markdown(report, &mut s);
    }
    replicas::markdown(report, &mut s);
    let _ = writeln!(
        s,
        "\nlost or duplicated tool calls: {}",
        report.lost_or_duplicated
    );
    s
}

/// A phase's daemon CPU per call for a table (`—` when unknown).
fn cpu_cell(c: &ClosedLoop) -> String {
    c.cpu_us_per_call
        .map_or_else(|| "—".to_owned(), |us| format!("{us:.0} µs"))
}

/// The tables of the single-daemon scenarios.
fn single_daemon_markdown(report: &Report, s: &mut String) {
    let _ = writeln!(
        s,
        "\n| baseline | value |\n|---|---|\n| raw durable SQLite commits/s (WAL, synchronous=FULL) | {:.0} |",
        report.raw_commits_per_s
    );
    for rtt in &report.rtt {
        let _ = writeln!(
            s,
            "| unary gRPC round trip ({} daemon), p50 / p99 | {:.0} µs / {:.0} µs |\n\
             | bidi-stream gRPC round trip ({} daemon, `Work` heartbeat), p50 / p99 | {:.0} µs / {:.0} µs |",
            rtt.backend,
            rtt.unary.p50_us(),
            rtt.unary.p99_us(),
            rtt.backend,
            rtt.bidi.p50_us(),
            rtt.bidi.p99_us()
        );
    }
    let _ = writeln!(
        s,
        "\n| backend | concurrency | sessions (= tool calls)/s | ratio to raw commits/s | p50 | p99 | dispatch overhead p50 / p99 | daemon CPU per call | failed |\n|---|---|---|---|---|---|---|---|---|"
    );
    for c in &report.closed {
        let _ = writeln!(
            s,
            "| {} | {} | {:.1} | {:.4} | {:.1} ms | {:.1} ms | {:.0} µs / {:.0} µs | {} | {} |",
            c.backend,
            c.concurrency,
            c.per_s,
            c.per_s / report.raw_commits_per_s.max(1.0),
            c.latency.p50_us() / 1000.0,
            c.latency.p99_us() / 1000.0,
            c.dispatch.p50_us(),
            c.dispatch.p99_us(),
            cpu_cell(c),
            c.failed
        );
    }
    writer_markdown(report, s);
    let _ = writeln!(
        s,
        "\n| backend | open loop: sessions started/s (half the best closed loop) | p50 | p99 (from the scheduled start) | failed | not started |\n|---|---|---|---|---|---|"
    );
    for o in &report.open {
        let _ = writeln!(
            s,
            "| {} | {:.1} | {:.1} ms | {:.1} ms | {} | {} |",
            o.backend,
            o.rate,
            o.latency.p50_us() / 1000.0,
            o.latency.p99_us() / 1000.0,
            o.failed,
            o.overloaded
        );
    }
    let _ = writeln!(
        s,
        "\n| backend | parked | RSS before / parked / quiet / ended / settled (MiB) | KiB per parked session (at once / quiet) | daemon CPU while parked | kill -9 → SERVING again (RSS then) | approve → invoke p50 (one at a time) | burst | burst: vote p50 / p99 | burst: approve → invoke p50 / p99 | burst until all completed |\n|---|---|---|---|---|---|---|---|---|---|---|"
    );
    for p in &report.parked {
        let per = |rss: f64| (rss - p.rss_mb[0]) * 1024.0 / (p.sessions.max(1) as f64);
        let _ = writeln!(
            s,
            "| {} | {} | {:.1} / {:.1} / {:.1} / {:.1} / {:.1} | {:.0} / {:.0} | {:.1} % of a core | {:.0} ms ({:.1} MiB) | {:.1} ms | {} | {:.1} ms / {:.1} ms | {:.1} ms / {:.1} ms | {:.0} ms |",
            p.backend,
            p.sessions,
            p.rss_mb[0],
            p.rss_mb[1],
            p.quiet_rss_mb,
            p.rss_mb[2],
            p.rss_mb[3],
            per(p.rss_mb[1]),
            per(p.quiet_rss_mb),
            p.idle_cpu_pct,
            p.restart_ms,
            p.restart_rss_mb,
            p.approve_to_invoke.p50_us() / 1000.0,
            p.burst,
            p.vote.p50_us() / 1000.0,
            p.vote.p99_us() / 1000.0,
            p.burst_to_invoke.p50_us() / 1000.0,
            p.burst_to_invoke.p99_us() / 1000.0,
            p.burst_ms
        );
    }
}

/// The ledger writes of each closed-loop phase whose daemon metrics were read.
fn writer_markdown(report: &Report, s: &mut String) {
    if report.closed.iter().all(|c| c.writer.is_none()) {
        return;
    }
    let _ = writeln!(
        s,
        "\n| backend | concurrency | ledger writes per session | wait / hold per write | SQLite: statements per write (their time) | SQLite: hand-offs per write | commit | writes per batch | SQLite: the writer in a batch / lent to writes / committing; PostgreSQL: write transactions open |\n|---|---|---|---|---|---|---|---|---|"
    );
    for c in &report.closed {
        let Some(w) = c.writer else { continue };
        let writer = match (w.busy, w.commit_share) {
            (Some(busy), Some(committing)) => format!(
                "{:.0} % / {:.0} % / {:.0} %",
                busy * 100.0,
                w.hold_share * 100.0,
                committing * 100.0
            ),
            _ => format!("{:.1} on average", w.hold_share),
        };
        let statements = match (w.statements_per_write, w.statement_us) {
            (Some(n), Some(us)) => format!("{n:.1} ({us:.0} µs)"),
            _ => "—".to_owned(),
        };
        let handoffs = w
            .handoff_us
            .map_or_else(|| "—".to_owned(), |us| format!("{us:.0} µs"));
        let _ = writeln!(
            s,
            "| {} | {} | {:.1} | {:.0} µs / {:.0} µs | {statements} | {handoffs} | {:.0} µs | {} | {writer} |",
            c.backend,
            c.concurrency,
            w.writes_per_session,
            w.wait_us,
            w.hold_us,
            w.commit_us,
            w.writes_per_batch
                .map_or_else(|| "—".to_owned(), |n| format!("{n:.1}")),
        );
    }
}

fn write_report(path: &Path, report: &Report) -> Result<(), BenchError> {
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|| "unknown".to_owned());
    let cpus = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let text = format!(
        "# Benchmarks\n\nWritten by `phrony-bench --report` (see `bins/bench`). Commit {commit}; {cpus} CPUs \
         ({model}).\n{}",
        markdown(report)
    );
    std::fs::write(path, text)
        .map_err(|e| BenchError::new(format!("cannot write {}: {e}", path.display())))
}

/// The daemon's CPU time so far (user + system), from `/proc/<pid>/stat`.
pub(crate) fn cpu_time(daemon: &Daemon) -> Option<Duration> {
    let pid = daemon.pid()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces: count the fields after its closing `)`.
    let rest = stat.rsplit_once(')')?.1;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime) are the 12th and 13th after the name.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // The kernel reports them in USER_HZ, which is 100 on Linux.
    Some(Duration::from_millis(ticks * 10))
}

/// The daemon's resident memory in MiB, from `/proc/<pid>/status`.
pub(crate) fn rss_mb(daemon: &Daemon) -> f64 {
    let Some(pid) = daemon.pid() else {
        return 0.0;
    };
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

#[cfg(test)]
mod option_tests {
    use clap::Parser as _;

    use super::*;

    fn plan(args: &[&str]) -> Result<Plan, BenchError> {
        let options =
            Options::try_parse_from(std::iter::once("phrony-bench").chain(args.iter().copied()))
                .map_err(|e| BenchError::new(e.to_string()))?;
        Plan::from(&options)
    }

    #[test]
    fn replicas_and_takeovers_are_refused_on_sqlite_with_the_reason() {
        for args in [
            &["--backend", "sqlite", "--replicas", "1,2"][..],
            &["--backend", "sqlite", "--takeovers", "20"][..],
        ] {
            let error = plan(args).err().map(|e| e.0).unwrap_or_default();
            assert!(
                error.contains("one PostgreSQL database") && error.contains("--backend postgres"),
                "{args:?}: {error}"
            );
        }
    }

    #[test]
    fn workers_take_the_burst_s_voters_at_once_whatever_the_closed_loop_concurrency() {
        let calls = |args: &[&str]| plan(args).map(|p| p.worker_calls()).map_err(|e| e.0);
        // The closed loop of 1 alone would start one worker of 4 slots for the burst of 1,000.
        assert_eq!(calls(&["--concurrency", "1", "--parked", "2000"]), Ok(64));
        assert_eq!(
            calls(&["--concurrency", "1", "--parked", "10", "--burst", "8"]),
            Ok(8)
        );
        assert_eq!(
            calls(&["--concurrency", "128", "--parked", "2000"]),
            Ok(128)
        );
        assert_eq!(calls(&["--concurrency", "1,16", "--parked", "0"]), Ok(16));
    }

    #[test]
    fn replica_counts_are_parsed_in_order_and_bounded() {
        let p = plan(&[
            "--backend",
            "postgres",
            "--replicas",
            "1, 2,3",
            "--takeovers",
            "20",
        ])
        .map_err(|e| e.0);
        let p = p
            .as_ref()
            .map(|p| (p.replicas.clone(), p.takeovers, p.lease_ttl));
        assert_eq!(p, Ok((vec![1, 2, 3], 20, None)));
        for bad in ["0", "9", "two", "1,,2"] {
            assert!(plan(&["--replicas", bad]).is_err(), "--replicas {bad}");
        }
        assert!(plan(&["--takeovers", "1", "--lease-ttl-ms", "100"]).is_err());
        let ttl = plan(&["--takeovers", "1", "--lease-ttl-ms", "2000"]).map(|p| p.lease_ttl);
        assert!(matches!(ttl, Ok(Some(d)) if d == Duration::from_millis(2000)));
    }

    #[test]
    fn replica_figures_are_reported_per_count_with_the_ratio_to_one_replica() {
        let phase = |replicas: usize, concurrency: usize, per_s: f64| ClosedLoop {
            backend: "postgres",
            concurrency,
            per_s,
            latency: Latencies::default(),
            dispatch: Latencies::default(),
            failed: 0,
            cpu_us_per_call: None,
            replicas,
            writer: None,
        };
        let report = Report {
            replicas: vec![
                phase(1, 16, 100.0),
                phase(1, 64, 120.0),
                phase(2, 16, 150.0),
            ],
            ..Report::default()
        };
        let value = to_json(&report);
        assert_eq!(value["tool_calls_per_s_replicas_1"], json!(120.0));
        assert_eq!(value["tool_calls_per_s_replicas_2"], json!(150.0));
        assert!(
            value.get("tool_calls_per_s_replicas_3").is_none(),
            "{value}"
        );
        assert!(value.get("raw_durable_commits_per_s").is_none(), "{value}");
        assert_eq!(
            value["replicas_closed_loop"][2]["ratio_to_1_replica"],
            json!(1.5)
        );
        assert!(markdown(&report).contains("| 2 | 16 | 150.0 | 1.50 |"));
    }
}
