//! The crash soak: the real daemon, the soak agent on the scripted stub model, a journaling
//! worker process, a scripted operator, and SIGKILL at chosen points; then the invariants.
//!
//! Run it by hand with `cargo run -p tests --bin soak -- --backend sqlite --trials 200`; the
//! short run is `tests/tests/soak.rs`. One trial:
//!
//! 1. starts `phrony-runtime` (a fresh SQLite file or PostgreSQL database), publishes and
//!    deploys `soak/soak-agent@0.1.0` (`tests/fixtures/soak/`: a tool of every side-effect
//!    class and one binding without a class; a refund held for one approval, a transfer for a
//!    quorum of two) with the real CLI, starts the journaling worker ([`worker`]) and a few
//!    task sessions;
//! 2. for each planned fault ([`Fault`]): waits for its trigger (the worker's `INVOKE` or
//!    `RESULT` line, a vote RPC that returned, an approval the operator saw, a random delay),
//!    then SIGKILLs the daemon and starts it again on the same database (or kills, stops,
//!    cuts the worker; or, with `--db-faults`, stalls the database under the running daemon:
//!    another process holds SQLite's write lock past the busy timeout, or the private
//!    PostgreSQL cluster the trial runs on is crashed and started again — health must say
//!    `NOT_SERVING` meanwhile and `SERVING` again by itself after);
//! 3. lets recovery and the operator finish every session: policy approvals are approved
//!    (by `alice`, then `bob` for the quorum), approved with edited arguments, or rejected;
//!    outcome reviews are resolved as an operator would, from the worker's journal
//!    (`happened` with the journaled result, or `resend` when it never ran);
//! 4. checks the invariants ([`check`]) and classifies each kill by the affected call's last
//!    durable event.

pub mod check;
pub mod trial;
pub mod worker;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::daemon::Backend;

/// What the harness was asked to do.
#[derive(Debug, Clone)]
pub struct Options {
    /// The storage.
    pub backend: Backend,
    /// How many trials.
    pub trials: u64,
    /// The seed every choice derives from (the same seed plans the same faults).
    pub seed: u64,
    /// Where to write the JSON report (none: stdout only).
    pub report: Option<PathBuf>,
    /// Sessions per trial.
    pub sessions: usize,
    /// Faults per trial.
    pub faults: usize,
    /// Also plan worker faults (kill, stop past the lease, stream cut, duplicated results).
    pub worker_faults: bool,
    /// Also plan database stalls (`--db-faults`): [`Fault::DbLocked`] on SQLite,
    /// [`Fault::DbRestart`] on PostgreSQL (whose trials then run on a private cluster).
    pub db_faults: bool,
    /// Plan only this fault (`--only <name>`, a name of [`Fault::name`]).
    pub only: Option<Fault>,
    /// Count a session failed by the known final-turn re-run (a crash between the final
    /// `model.completion` and its `message.assistant` makes recovery ask the model again; the
    /// stub's script then runs out) as a known issue instead of a violation
    /// (`--tolerate-final-turn-rerun`). Fixed since the completion and its message commit together;
    /// kept only to soak builds from before the fix (the short test never sets it).
    pub tolerate_final_turn_rerun: bool,
    /// Count a session failed by the known late-result race (a safe call marked indeterminate
    /// whose late result is recorded before the engine fails it: `cannot go from succeeded to
    /// failed`) as a known issue (`--tolerate-late-result-race`). Fixed since the engine takes the
    /// recorded result; kept only to soak builds from before the fix (the short test never sets it).
    pub tolerate_late_result_race: bool,
}

impl Options {
    /// Parses the command line (after the program name).
    ///
    /// # Errors
    /// A message naming the bad or unknown argument.
    pub fn parse(args: &[String]) -> Result<Self, String> {
        let mut o = Self {
            backend: Backend::Sqlite,
            trials: 10,
            seed: 1,
            report: None,
            sessions: 3,
            faults: 2,
            worker_faults: true,
            db_faults: false,
            only: None,
            tolerate_final_turn_rerun: false,
            tolerate_late_result_race: false,
        };
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            let mut value = || {
                it.next()
                    .cloned()
                    .ok_or_else(|| format!("{flag} needs a value"))
            };
            let number = |v: String| {
                v.parse::<u64>()
                    .map_err(|_| format!("{flag}: not a number: {v:?}"))
            };
            match flag.as_str() {
                "--backend" => {
                    o.backend = match value()?.as_str() {
                        "sqlite" => Backend::Sqlite,
                        "postgres" => Backend::Postgres,
                        other => {
                            return Err(format!(
                                "--backend: expected sqlite or postgres, got {other:?}"
                            ));
                        }
                    }
                }
                "--trials" => o.trials = number(value()?)?,
                "--seed" => o.seed = number(value()?)?,
                "--report" => o.report = Some(PathBuf::from(value()?)),
                "--sessions" => {
                    o.sessions = usize::try_from(number(value()?)?.clamp(1, 20)).unwrap_or(3);
                }
                "--faults" => {
                    o.faults = usize::try_from(number(value()?)?.clamp(1, 20)).unwrap_or(2);
                }
                "--no-worker-faults" => o.worker_faults = false,
                "--db-faults" => o.db_faults = true,
                "--tolerate-final-turn-rerun" => o.tolerate_final_turn_rerun = true,
                "--tolerate-late-result-race" => o.tolerate_late_result_race = true,
                "--only" => {
                    let name = value()?;
                    o.only = Some(
                        Fault::ALL
                            .into_iter()
                            .find(|f| f.name() == name)
                            .ok_or_else(|| format!("--only: unknown fault {name:?}"))?,
                    );
                }
                other => return Err(format!("unknown argument {other:?}")),
            }
        }
        match (o.only, o.backend) {
            (Some(Fault::DbLocked), Backend::Postgres) => {
                Err("--only db_locked needs --backend sqlite (PostgreSQL has no file lock)".into())
            }
            (Some(Fault::DbRestart), Backend::Sqlite) => {
                Err("--only db_restart needs --backend postgres".into())
            }
            _ => Ok(o),
        }
    }

    /// Whether the PostgreSQL trials run on a private cluster (the restart fault needs one).
    #[must_use]
    pub fn private_postgres(&self) -> bool {
        self.backend == Backend::Postgres && (self.db_faults || self.only == Some(Fault::DbRestart))
    }
}

/// A fault the harness injects, and when.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// SIGKILL the daemon when the worker says it received an invoke (journaled, no result).
    DaemonAtInvoke,
    /// SIGKILL the daemon when the worker says it sent a result (half the time 1–40 ms later,
    /// on the records that follow it).
    DaemonAtResult,
    /// SIGKILL the daemon 0–30 ms after the worker sent the result of a session's last call,
    /// on the session's final model turn and its end.
    DaemonAtLastResult,
    /// SIGKILL the daemon right after a vote RPC returned.
    DaemonAfterVote,
    /// SIGKILL the daemon when the operator first sees an approval (before voting on it).
    DaemonAtApproval,
    /// SIGKILL the daemon after a random delay (0–1.5 s).
    DaemonRandom,
    /// SIGKILL the worker when it received an invoke; start it again.
    WorkerKilled,
    /// SIGSTOP the worker when it received an invoke, past its lease; then SIGCONT.
    WorkerStopped,
    /// Cut the worker's stream when it received an invoke (it reconnects).
    StreamCut,
    /// SQLite: when the worker received an invoke, another process takes the database's write
    /// lock and holds it past the daemon's busy timeout (until health said `NOT_SERVING`, and
    /// at least the busy timeout and 2 s), then releases it.
    DbLocked,
    /// PostgreSQL: when the worker received an invoke, the (private) cluster is stopped in
    /// immediate mode — a crash as the daemon sees it — and started again once health said
    /// `NOT_SERVING` (and at least 1–3 s later).
    DbRestart,
}

impl Fault {
    /// Every fault.
    pub const ALL: [Self; 11] = [
        Self::DaemonAtInvoke,
        Self::DaemonAtResult,
        Self::DaemonAtLastResult,
        Self::DaemonAfterVote,
        Self::DaemonAtApproval,
        Self::DaemonRandom,
        Self::WorkerKilled,
        Self::WorkerStopped,
        Self::StreamCut,
        Self::DbLocked,
        Self::DbRestart,
    ];

    /// The name in the report.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::DaemonAtInvoke => "daemon_kill_at_invoke",
            Self::DaemonAtResult => "daemon_kill_at_result",
            Self::DaemonAtLastResult => "daemon_kill_at_last_result",
            Self::DaemonAfterVote => "daemon_kill_after_vote",
            Self::DaemonAtApproval => "daemon_kill_at_approval",
            Self::DaemonRandom => "daemon_kill_random",
            Self::WorkerKilled => "worker_kill",
            Self::WorkerStopped => "worker_stop_past_lease",
            Self::StreamCut => "stream_cut",
            Self::DbLocked => "db_locked",
            Self::DbRestart => "db_restart",
        }
    }

    /// Whether it kills the daemon.
    #[must_use]
    pub fn kills_daemon(self) -> bool {
        matches!(
            self,
            Self::DaemonAtInvoke
                | Self::DaemonAtResult
                | Self::DaemonAtLastResult
                | Self::DaemonAfterVote
                | Self::DaemonAtApproval
                | Self::DaemonRandom
        )
    }
}

impl Fault {
    /// Whether it stalls the database under the running daemon.
    #[must_use]
    pub fn stalls_database(self) -> bool {
        matches!(self, Self::DbLocked | Self::DbRestart)
    }
}

/// A database stall and what the daemon's health said during and after it.
#[derive(Debug, Clone)]
pub struct DbStall {
    /// Which fault.
    pub fault: Fault,
    /// How long the database could not write, in ms.
    pub held_ms: u64,
    /// Whether health said `NOT_SERVING` while it could not write.
    pub not_serving_seen: bool,
    /// How long after the database could write again health said `SERVING` (by itself), in
    /// ms; `None` when it did not within the bound.
    pub recovered_after_ms: Option<u64>,
}

/// A small deterministic generator (SplitMix64): the seed decides every choice.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        Self(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number below `n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// What one trial did and found.
#[derive(Debug, Default, Clone)]
pub struct TrialOutcome {
    /// Daemon kills and their commit point (the affected call's last durable event).
    pub kills: Vec<(String, String)>,
    /// Worker faults injected, by name.
    pub worker_faults: Vec<String>,
    /// Whether the worker sent every result twice.
    pub duplicated_results: bool,
    /// Database stalls injected.
    pub db_stalls: Vec<DbStall>,
    /// Executions of non-idempotent, irreversible or unclassed calls beyond the first.
    pub duplicates: u64,
    /// Executions of read-only or idempotent calls beyond the first (allowed).
    pub safe_reruns: u64,
    /// Outcome reviews the operator resolved, by resolution.
    pub reviews: Vec<String>,
    /// Events exported and checked.
    pub events: u64,
    /// Broken invariants, each naming what broke.
    pub violations: Vec<String>,
    /// Sessions failed by a known issue, when tolerated.
    pub known_issues: Vec<String>,
}

/// Runs the soak; returns whether every invariant held.
///
/// # Panics
/// When the daemon, the CLI or the worker cannot be started (an environment problem, not a
/// finding).
#[must_use]
pub fn run(options: &Options) -> bool {
    let started = Instant::now();
    let mut outcomes = Vec::new();
    for n in 0..options.trials {
        let seed = options.seed.wrapping_mul(1_000_003).wrapping_add(n);
        let trial_started = Instant::now();
        let Some(outcome) = trial::run_trial(options, seed) else {
            println!("soak: PostgreSQL is not available; skipped");
            return true;
        };
        println!(
            "soak: trial {}/{} (seed {seed}, {:.1}s): kills {:?}, worker faults {:?}, db stalls {:?}{}, duplicates {}, {}",
            n + 1,
            options.trials,
            trial_started.elapsed().as_secs_f64(),
            outcome.kills,
            outcome.worker_faults,
            outcome
                .db_stalls
                .iter()
                .map(|s| format!(
                    "{} {} ms, NOT_SERVING {}, SERVING again after {:?} ms",
                    s.fault.name(),
                    s.held_ms,
                    if s.not_serving_seen {
                        "seen"
                    } else {
                        "NOT seen"
                    },
                    s.recovered_after_ms
                ))
                .collect::<Vec<_>>(),
            if outcome.duplicated_results {
                " (results duplicated)"
            } else {
                ""
            },
            outcome.duplicates,
            if outcome.violations.is_empty() {
                "ok".to_owned()
            } else {
                format!("VIOLATIONS: {:#?}", outcome.violations)
            }
        );
        outcomes.push(outcome);
    }
    let report = report(options, &outcomes, started.elapsed());
    println!(
        "{}",
        serde_json::to_string_pretty(&report).unwrap_or_default()
    );
    if let Some(path) = &options.report {
        std::fs::write(path, format!("{report:#}\n"))
            .unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }
    outcomes.iter().all(|o| o.violations.is_empty())
}

fn report(options: &Options, outcomes: &[TrialOutcome], elapsed: Duration) -> Value {
    let mut per_point = std::collections::BTreeMap::<String, u64>::new();
    let mut per_fault = std::collections::BTreeMap::<String, u64>::new();
    let mut reviews = std::collections::BTreeMap::<String, u64>::new();
    for o in outcomes {
        for (fault, point) in &o.kills {
            *per_point.entry(point.clone()).or_default() += 1;
            *per_fault.entry(fault.clone()).or_default() += 1;
        }
        for f in &o.worker_faults {
            *per_fault.entry(f.clone()).or_default() += 1;
        }
        for stall in &o.db_stalls {
            *per_fault.entry(stall.fault.name().to_owned()).or_default() += 1;
        }
        for r in &o.reviews {
            *reviews.entry(r.clone()).or_default() += 1;
        }
    }
    let violations: Vec<&String> = outcomes.iter().flat_map(|o| &o.violations).collect();
    let stalls: Vec<&DbStall> = outcomes.iter().flat_map(|o| &o.db_stalls).collect();
    let recoveries: Vec<u64> = stalls.iter().filter_map(|s| s.recovered_after_ms).collect();
    json!({
        "backend": match options.backend {
            Backend::Sqlite => "sqlite",
            Backend::Postgres if options.private_postgres() => "postgres (private cluster)",
            Backend::Postgres | Backend::PrivatePostgres => "postgres",
        },
        "seed": options.seed,
        "trials": outcomes.len(),
        "sessions": outcomes.len() * options.sessions,
        "daemon_kills": outcomes.iter().map(|o| o.kills.len()).sum::<usize>(),
        "kills_per_commit_point": per_point,
        "faults": per_fault,
        "db_stalls": stalls.len(),
        "db_stalls_not_serving_seen": stalls.iter().filter(|s| s.not_serving_seen).count(),
        "db_stalls_recovered": recoveries.len(),
        "db_stall_max_recovery_ms": recoveries.iter().max(),
        "trials_with_duplicated_results": outcomes.iter().filter(|o| o.duplicated_results).count(),
        "outcome_reviews": reviews,
        "duplicates": outcomes.iter().map(|o| o.duplicates).sum::<u64>(),
        "safe_reruns": outcomes.iter().map(|o| o.safe_reruns).sum::<u64>(),
        "events_checked": outcomes.iter().map(|o| o.events).sum::<u64>(),
        "violations": violations,
        "known_issues": outcomes.iter().map(|o| o.known_issues.len()).sum::<usize>(),
        "seconds": elapsed.as_secs(),
    })
}
