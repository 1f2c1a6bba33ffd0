//! One soak trial: the daemon, the worker process, the sessions, the planned faults and the
//! scripted operator.

use std::collections::{BTreeMap, HashSet};
use std::io::{BufRead as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use phrony_client::{
    AgentName, Approval, ApprovalFilter, Client, DecideApproval, Decision, RunSession,
};
use serde_json::{Value, json};

use super::check::{self, Cast, KillRecord};
use super::worker::{JournalEntry, now_ms, read_journal};
use super::{DbStall, Fault, Options, Rng, TrialOutcome};
use crate::daemon::{Backend, Daemon};
use phrony_client::Health;
use phrony_test_support::private_postgres::StopMode;
use phrony_test_support::sqlite_lock::SqliteWriteLock;

/// The soak agent.
const AGENT: (&str, &str) = ("soak", "soak-agent");

/// The worker's lease (the daemon's `RUNTIME_WORKER_LEASE_TTL`).
const LEASE: Duration = Duration::from_secs(3);

/// The daemon's SQLite busy timeout in trials that plan database stalls
/// (`RUNTIME_SQLITE_BUSY_TIMEOUT`; the default, 10 s, would make each `db_locked` last 12 s): a
/// writer waits this long for the write lock before its write fails.
const BUSY_TIMEOUT: Duration = Duration::from_secs(3);

/// How long a database stall may last at most while waiting for health to say `NOT_SERVING`,
/// and how long health may take to say `SERVING` again once the database can write.
const STALL_BOUND: Duration = Duration::from_secs(30);

/// How long every session may take to end after the last fault (recovery waits up to 30 s
/// for a worker to report a call it was sent before a restart).
const SETTLE: Duration = Duration::from_secs(120);

/// The worker's lines on stdout, with the time they were read.
type Lines = Arc<Mutex<Vec<(u64, String)>>>;

/// A signal the line reader sends by itself the moment a matching line arrives, so that a
/// kill lands right at the commit point rather than a polling interval later.
#[derive(Debug, Clone)]
struct Armed {
    /// `INVOKE` or `RESULT`.
    word: &'static str,
    /// Only lines about this tool (`None`: any).
    tool: Option<&'static str>,
    /// Matching lines to let pass first.
    skip: u64,
    /// `kill` arguments (`-KILL <pid>`…); empty: only record.
    signal: Option<(&'static str, u32)>,
    /// How long after the line to signal (a few ms after a result lands on the records
    /// that follow it: the next model turn, the next call's decision and dispatch).
    delay: Duration,
    /// The call of the line that fired.
    fired: Option<String>,
}

type Trigger = Arc<Mutex<Option<Armed>>>;

fn guard<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn signal(name: &str, pid: u32) {
    let _ = Command::new("kill").args([name, &pid.to_string()]).status();
}

/// The worker process.
struct WorkerProc {
    child: Child,
    stdin: ChildStdin,
}

impl WorkerProc {
    fn start(
        addr: &str,
        journal: &Path,
        duplicate: bool,
        lines: &Lines,
        trigger: &Trigger,
    ) -> Self {
        let exe = std::env::current_exe().unwrap_or_else(|e| panic!("current_exe: {e}"));
        let mut cmd = Command::new(exe);
        cmd.args(["worker", "--addr", addr, "--journal"])
            .arg(journal)
            .args(["--work-ms", "150"]);
        if duplicate {
            cmd.arg("--duplicate");
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the soak worker: {e}"));
        let stdin = child.stdin.take().unwrap_or_else(|| panic!("worker stdin"));
        let stdout = child
            .stdout
            .take()
            .unwrap_or_else(|| panic!("worker stdout"));
        let (lines, trigger) = (Arc::clone(lines), Arc::clone(trigger));
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                {
                    let mut armed = guard(&trigger);
                    let mut words = line.split_whitespace();
                    let (word, call, tool) = (words.next(), words.next(), words.next());
                    if let Some(a) = armed.as_mut().filter(|a| {
                        a.fired.is_none()
                            && word == Some(a.word)
                            && a.tool.is_none_or(|t| tool == Some(t))
                    }) && let Some(call) = call
                    {
                        if a.skip == 0 {
                            std::thread::sleep(a.delay);
                            if let Some((name, pid)) = a.signal {
                                signal(name, pid);
                            }
                            a.fired = Some(call.to_owned());
                        } else {
                            a.skip -= 1;
                        }
                    }
                }
                guard(&lines).push((now_ms(), line));
            }
        });
        Self { child, stdin }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The trial's state: what ran, what the operator did, which faults were injected.
struct Trial {
    daemon: Daemon,
    worker: WorkerProc,
    duplicate: bool,
    lines: Lines,
    trigger: Trigger,
    rt: tokio::runtime::Runtime,
    client: Client,
    journal: PathBuf,
    sessions: Vec<String>,
    rng: Rng,
    casts: Vec<Cast>,
    seen: HashSet<String>,
    plans: BTreeMap<String, u64>,
    reviews: Vec<String>,
    kills: Vec<KillRecord>,
    worker_faults: Vec<String>,
    db_stalls: Vec<DbStall>,
    db_faults: bool,
    /// When the worker was last disturbed (killed, stopped, cut, its daemon killed).
    disturbed_ms: u64,
    notes: Vec<String>,
    tolerate_final_turn_rerun: bool,
    tolerate_late_result_race: bool,
    _dir: tempfile::TempDir,
}

/// What an operator pass did.
enum Seen {
    Nothing,
    NewApproval(String),
    Voted(String),
}

/// Runs one trial; `None` when PostgreSQL was asked for and is skipped.
pub(crate) fn run_trial(options: &Options, seed: u64) -> Option<TrialOutcome> {
    let mut rng = Rng::new(seed);
    let lease = format!("{}s", LEASE.as_secs());
    let backend = if options.private_postgres() {
        Backend::PrivatePostgres
    } else {
        options.backend
    };
    let busy = format!("{}s", BUSY_TIMEOUT.as_secs());
    let mut env = vec![
        ("RUNTIME_ENABLE_STUB_PROVIDER", "1"),
        ("RUNTIME_WORKER_LEASE_TTL", lease.as_str()),
        ("RUNTIME_LOG", "warn"),
    ];
    if options.db_faults || options.only == Some(Fault::DbLocked) {
        env.push(("RUNTIME_SQLITE_BUSY_TIMEOUT", busy.as_str()));
    }
    let daemon = Daemon::start_with_env(backend, &env)?;
    let fixture = crate::workspace_root().join("tests/fixtures/soak");
    publish_and_deploy(&daemon, &fixture);
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
    let journal = dir.path().join("journal.jsonl");
    let lines: Lines = Arc::default();
    let trigger: Trigger = Arc::default();
    let duplicate = options.worker_faults && rng.below(4) == 0;
    let worker = WorkerProc::start(daemon.addr(), &journal, duplicate, &lines, &trigger);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("tokio: {e}"));
    let client = connect(&rt, daemon.addr());
    let mut trial = Trial {
        daemon,
        worker,
        duplicate,
        lines,
        trigger,
        rt,
        client,
        journal,
        sessions: Vec::new(),
        rng,
        casts: Vec::new(),
        seen: HashSet::new(),
        plans: BTreeMap::new(),
        reviews: Vec::new(),
        kills: Vec::new(),
        worker_faults: Vec::new(),
        db_stalls: Vec::new(),
        db_faults: options.db_faults,
        disturbed_ms: 0,
        notes: Vec::new(),
        tolerate_final_turn_rerun: options.tolerate_final_turn_rerun,
        tolerate_late_result_race: options.tolerate_late_result_race,
        _dir: dir,
    };
    trial.wait_registered();
    for n in 0..options.sessions {
        let mut run = RunSession::new(AgentName::new(AGENT.0, AGENT.1));
        run.input = Some(json!(format!("soak session {n}")));
        let started = trial
            .rt
            .block_on(trial.client.run_session(&run, "soak-client"))
            .unwrap_or_else(|e| panic!("RunSession: {e}"));
        trial.sessions.push(started.session_id);
    }
    for _ in 0..options.faults {
        let fault = options
            .only
            .unwrap_or_else(|| trial.plan_fault(options.worker_faults));
        trial.inject(fault);
    }
    trial.finish();
    Some(trial.check(options.backend))
}

/// Publishes and deploys the soak agent with the real CLI. The unclassed binding's warning
/// (treated as `irreversible_action`) is expected; nothing else may be printed on stderr.
fn publish_and_deploy(daemon: &Daemon, fixture: &Path) {
    let publish = crate::cli::run(
        crate::cli::phrony(daemon, "ci")
            .args(["agents", "publish"])
            .arg(fixture.join("agent.yaml")),
    );
    assert_eq!(publish.code, Some(0), "publish failed: {publish:?}");
    assert!(
        publish
            .stderr
            .lines()
            .all(|l| l.contains("has no side_effect_class")),
        "publish warned: {}",
        publish.stderr
    );
    crate::cli::ok(crate::cli::phrony(daemon, "ci").args([
        "agents",
        "deploy",
        &format!("{}/{}@0.1.0", AGENT.0, AGENT.1),
    ]));
}

fn connect(rt: &tokio::runtime::Runtime, addr: &str) -> Client {
    rt.block_on(Client::connect(addr))
        .unwrap_or_else(|e| panic!("connect to {addr}: {e}"))
}

impl Trial {
    fn plan_fault(&mut self, worker_faults: bool) -> Fault {
        const DAEMON: [Fault; 6] = [
            Fault::DaemonAtInvoke,
            Fault::DaemonAtResult,
            Fault::DaemonAtLastResult,
            Fault::DaemonAfterVote,
            Fault::DaemonAtApproval,
            Fault::DaemonRandom,
        ];
        const WORKER: [Fault; 3] = [Fault::WorkerKilled, Fault::WorkerStopped, Fault::StreamCut];
        // Drawn only with --db-faults, so that a seed plans the same faults as before without.
        if self.db_faults && self.rng.below(10) < 2 {
            return if self.daemon.sqlite_path().is_some() {
                Fault::DbLocked
            } else {
                Fault::DbRestart
            };
        }
        if worker_faults && self.rng.below(10) < 3 {
            WORKER[usize::try_from(self.rng.below(3)).unwrap_or(0)]
        } else {
            DAEMON[usize::try_from(self.rng.below(6)).unwrap_or(0)]
        }
    }

    fn wait_registered(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !guard(&self.lines).iter().any(|(_, l)| l == "REGISTERED") {
            assert!(
                Instant::now() < deadline,
                "the soak worker did not register"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the fault's trigger while the operator works, then injects it.
    fn inject(&mut self, fault: Fault) {
        let skip = self.rng.below(3);
        let word = match fault {
            Fault::DaemonAtResult | Fault::DaemonAtLastResult => Some("RESULT"),
            Fault::DaemonAtInvoke
            | Fault::WorkerKilled
            | Fault::WorkerStopped
            | Fault::StreamCut
            | Fault::DbLocked
            | Fault::DbRestart => Some("INVOKE"),
            _ => None,
        };
        let sig = match fault {
            Fault::DaemonAtInvoke | Fault::DaemonAtResult | Fault::DaemonAtLastResult => {
                self.daemon.pid().map(|pid| ("-KILL", pid))
            }
            Fault::WorkerKilled => Some(("-KILL", self.worker.pid())),
            Fault::WorkerStopped => Some(("-STOP", self.worker.pid())),
            _ => None,
        };
        let delay = match fault {
            Fault::DaemonAtResult if self.rng.below(2) == 0 => {
                Duration::from_millis(1 + self.rng.below(40))
            }
            Fault::DaemonAtLastResult => Duration::from_millis(self.rng.below(30)),
            _ => Duration::ZERO,
        };
        let (skip, tool) = if fault == Fault::DaemonAtLastResult {
            (
                self.rng
                    .below(u64::try_from(self.sessions.len()).unwrap_or(1)),
                Some("partners.notify-partner"),
            )
        } else {
            (skip, None)
        };
        if let Some(word) = word {
            *guard(&self.trigger) = Some(Armed {
                word,
                tool,
                skip,
                signal: sig,
                delay,
                fired: None,
            });
        }
        let random = Instant::now() + Duration::from_millis(self.rng.below(1500));
        let mut polls = 0u32;
        let call = loop {
            if word.is_some() {
                let fired = guard(&self.trigger).as_ref().and_then(|a| a.fired.clone());
                if let Some(call) = fired {
                    *guard(&self.trigger) = None;
                    break Some(call);
                }
            }
            if fault == Fault::DaemonRandom && Instant::now() >= random {
                break Some(String::new());
            }
            match self.operator(fault == Fault::DaemonAtApproval) {
                Seen::NewApproval(call) if fault == Fault::DaemonAtApproval => break Some(call),
                Seen::Voted(call) if fault == Fault::DaemonAfterVote => break Some(call),
                _ => {}
            }
            polls += 1;
            if polls.is_multiple_of(10) && self.settled() {
                *guard(&self.trigger) = None;
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let Some(call) = call else {
            self.notes
                .push(format!("{}: sessions ended before it fired", fault.name()));
            return;
        };
        self.apply(fault, call);
    }

    fn apply(&mut self, fault: Fault, call: String) {
        if fault.stalls_database() {
            self.stall_database(fault);
            return;
        }
        if fault.kills_daemon() {
            self.daemon.kill9();
            let at_ms = now_ms();
            self.disturbed_ms = at_ms;
            self.kills.push(KillRecord {
                fault,
                at_ms,
                call_id: Some(call).filter(|c| !c.is_empty()),
            });
            // A moment with the daemon down, as a crash would leave it.
            std::thread::sleep(Duration::from_millis(self.rng.below(300)));
            self.daemon.restart();
            self.client = connect(&self.rt, self.daemon.addr());
            return;
        }
        self.disturbed_ms = now_ms();
        match fault {
            Fault::WorkerKilled => {
                self.worker.kill();
                self.worker = WorkerProc::start(
                    self.daemon.addr(),
                    &self.journal,
                    self.duplicate,
                    &self.lines,
                    &self.trigger,
                );
            }
            Fault::WorkerStopped => {
                std::thread::sleep(LEASE + Duration::from_millis(1500));
                signal("-CONT", self.worker.pid());
            }
            _ => {
                let _ = writeln!(self.worker.stdin, "CUT");
                let _ = self.worker.stdin.flush();
            }
        }
        self.disturbed_ms = now_ms();
        self.worker_faults.push(fault.name().to_owned());
    }

    /// The daemon's health as a client sees it (`None`: no answer).
    fn health(&self) -> Option<Health> {
        self.rt.block_on(self.client.health()).ok()
    }

    /// Takes the database away from the running daemon (the write lock, or the server), keeps
    /// it away until health said `NOT_SERVING` (bounded) and at least the fault's minimum, gives
    /// it back, and waits (bounded) for health to say `SERVING` by itself. The operator pauses
    /// meanwhile: its calls would only wait out the busy timeout and fail.
    fn stall_database(&mut self, fault: Fault) {
        let minimum = match fault {
            Fault::DbLocked => BUSY_TIMEOUT + Duration::from_secs(2),
            _ => Duration::from_millis(1000 + self.rng.below(2000)),
        };
        let lock = match fault {
            Fault::DbLocked => {
                let path = self
                    .daemon
                    .sqlite_path()
                    .unwrap_or_else(|| panic!("db_locked planned on a daemon without SQLite"));
                match SqliteWriteLock::hold(&path) {
                    Ok(lock) => Some(lock),
                    Err(e) => {
                        self.notes
                            .push(format!("db_locked: could not take the write lock: {e}"));
                        return;
                    }
                }
            }
            _ => {
                self.daemon
                    .private_postgres()
                    .unwrap_or_else(|| {
                        panic!("db_restart planned on a daemon without a private cluster")
                    })
                    .stop(StopMode::Immediate);
                None
            }
        };
        let started = Instant::now();
        let mut not_serving_seen = false;
        // Bounded by STALL_BOUND: the database comes back even when health never noticed.
        while started.elapsed() < STALL_BOUND {
            not_serving_seen |= self.health() == Some(Health::NotServing);
            if not_serving_seen && started.elapsed() >= minimum {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let held_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        match lock {
            Some(lock) => lock.release(),
            None => {
                if let Some(cluster) = self.daemon.private_postgres() {
                    cluster.start_again();
                }
            }
        }
        let back = Instant::now();
        let mut recovered_after_ms = None;
        while back.elapsed() < STALL_BOUND {
            if self.health() == Some(Health::Serving) {
                recovered_after_ms = u64::try_from(back.elapsed().as_millis()).ok();
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        self.db_stalls.push(DbStall {
            fault,
            held_ms,
            not_serving_seen,
            recovered_after_ms,
        });
    }

    /// Runs the operator until every session ended.
    fn finish(&mut self) {
        let deadline = Instant::now() + SETTLE;
        let mut polls = 0u32;
        loop {
            let _ = self.operator(false);
            polls += 1;
            if polls.is_multiple_of(5) && self.settled() {
                return;
            }
            if Instant::now() > deadline {
                self.notes.push("sessions did not end in time".to_owned());
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn settled(&self) -> bool {
        self.sessions.iter().all(|id| {
            self.rt
                .block_on(self.client.inspect_session(id))
                .is_ok_and(|s| {
                    matches!(
                        s.session.status.as_str(),
                        "completed" | "failed" | "cancelled"
                    )
                })
        })
    }

    /// One operator pass: decides (at most) one vote on a pending approval. With
    /// `stop_at_new`, a newly seen approval is reported before anyone votes on it.
    fn operator(&mut self, stop_at_new: bool) -> Seen {
        let filter = ApprovalFilter {
            status: Some("pending".into()),
            ..ApprovalFilter::default()
        };
        let Ok(page) = self.rt.block_on(self.client.list_approvals(&filter)) else {
            return Seen::Nothing;
        };
        for approval in page.approvals {
            if self.seen.insert(approval.id.clone()) && stop_at_new {
                return Seen::NewApproval(approval.call_id);
            }
            let vote = if approval.is_outcome_review() {
                self.review(&approval)
            } else {
                self.policy_vote(&approval)
            };
            let Some((voter, vote)) = vote else { continue };
            let answer = self.rt.block_on(self.client.decide_approval(&vote, voter));
            if let Err(e) = &answer {
                self.notes
                    .push(format!("vote by {voter} on {} refused: {e}", approval.id));
            }
            if let Some(r) = &vote.resolution {
                self.reviews.push(r.clone());
            }
            self.casts.push(Cast {
                approval_id: approval.id.clone(),
                voter: voter.to_owned(),
                acknowledged: answer.is_ok(),
            });
            return Seen::Voted(approval.call_id);
        }
        Seen::Nothing
    }

    /// The next vote on a policy approval: the plan (drawn once per approval) is approve,
    /// approve with edited arguments, or reject; `alice` votes first, `bob` completes a quorum.
    fn policy_vote(&mut self, approval: &Approval) -> Option<(&'static str, DecideApproval)> {
        let roll = self.rng.below(100);
        let plan = *self.plans.entry(approval.id.clone()).or_insert(roll);
        let full = self
            .rt
            .block_on(self.client.get_approval(&approval.id))
            .ok()?;
        let voted: HashSet<&str> = full.votes.iter().map(|v| v.decided_by.as_str()).collect();
        let voter = ["alice", "bob"].into_iter().find(|v| !voted.contains(v))?;
        let reject = plan >= 75;
        let args = (45..75).contains(&plan).then(|| edited(&approval.args));
        Some((
            voter,
            DecideApproval {
                approval_id: approval.id.clone(),
                decision: if reject {
                    Decision::Reject
                } else {
                    Decision::Approve
                },
                comment: Some(format!("soak plan {plan}")),
                args,
                comprehension_acknowledged: false,
                resolution: None,
                result: None,
            },
        ))
    }

    /// An outcome review, resolved as an operator would: once the worker is running and
    /// connected again (and has had a moment to report), look in the worker's journal — the
    /// outside world — and say `happened` with what it returned, or `resend` if it never ran.
    fn review(&self, approval: &Approval) -> Option<(&'static str, DecideApproval)> {
        let now = now_ms();
        let registered = guard(&self.lines)
            .iter()
            .rev()
            .find(|(_, l)| l == "REGISTERED")
            .map(|(at, _)| *at)?;
        if registered <= self.disturbed_ms || now < registered + 500 {
            return None;
        }
        let journal = read_journal(&self.journal).unwrap_or_else(|e| panic!("{e}"));
        let ran = journal.iter().rev().find_map(|e| match e {
            JournalEntry::Exec {
                call_id, result, ..
            } if *call_id == approval.call_id => Some(result.clone()),
            JournalEntry::Exec { .. } => None,
        });
        let (resolution, result) = match ran {
            Some(result) => ("happened", Some(result)),
            None => ("resend", None),
        };
        Some((
            "carol",
            DecideApproval {
                approval_id: approval.id.clone(),
                decision: Decision::Approve,
                comment: Some(format!("checked the worker's journal: {resolution}")),
                args: None,
                comprehension_acknowledged: false,
                resolution: Some(resolution.to_owned()),
                result,
            },
        ))
    }

    fn check(mut self, backend: Backend) -> TrialOutcome {
        let mut outcome = check::check_trial(&check::Inputs {
            rt: &self.rt,
            client: &self.client,
            sessions: &self.sessions,
            journal: &self.journal,
            casts: &self.casts,
            kills: &self.kills,
            lines: &guard(&self.lines),
            tolerate_final_turn_rerun: self.tolerate_final_turn_rerun,
            tolerate_late_result_race: self.tolerate_late_result_race,
        });
        outcome.worker_faults = std::mem::take(&mut self.worker_faults);
        outcome.duplicated_results = self.duplicate;
        for stall in &self.db_stalls {
            let name = stall.fault.name();
            if !stall.not_serving_seen {
                outcome.violations.push(format!(
                    "{name}: health never said NOT_SERVING while the database could not write \
                     ({} ms)",
                    stall.held_ms
                ));
            }
            if stall.recovered_after_ms.is_none() {
                outcome.violations.push(format!(
                    "{name}: health did not say SERVING again within {} s of the database \
                     writing again",
                    STALL_BOUND.as_secs()
                ));
            }
        }
        outcome.db_stalls = std::mem::take(&mut self.db_stalls);
        outcome.reviews = std::mem::take(&mut self.reviews);
        for note in &self.notes {
            if note.starts_with("sessions did not end") || note.starts_with("db_locked: could not")
            {
                outcome.violations.push(note.clone());
            }
        }
        self.worker.kill();
        // An open client connection would hold the daemon's graceful stop to its grace period
        // (its tasks live on the harness's runtime, so that goes too).
        drop(self.client);
        drop(self.rt);
        // The auditor's check offline, on the stopped daemon's database.
        let stopped = self.daemon.stop();
        if stopped.is_some_and(|s| !s.success()) {
            outcome.violations.push(format!(
                "the daemon exited with {stopped:?} on SIGTERM ({backend:?})"
            ));
        }
        let offline = self
            .daemon
            .runtime()
            .args(["audit", "verify", "--all"])
            .output();
        match offline {
            Ok(out) if out.status.success() => {}
            Ok(out) => outcome.violations.push(format!(
                "phrony-runtime audit verify --all failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )),
            Err(e) => outcome
                .violations
                .push(format!("cannot run phrony-runtime audit verify: {e}")),
        }
        if !outcome.violations.is_empty() {
            outcome.violations.push(format!(
                "operator notes: {:?}\ndaemon log (tail):\n{}",
                self.notes,
                tail(&self.daemon.logs(), 40)
            ));
        }
        outcome
    }
}

/// The arguments an approver substitutes: the same call with half the amount (below the
/// policy's threshold).
fn edited(args: &Value) -> Value {
    let mut args = args.clone();
    if let Some(amount) = args.get("amount").and_then(Value::as_f64) {
        args["amount"] = json!((amount / 2.0).round());
    }
    args
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
