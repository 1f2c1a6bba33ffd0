//! Several `phrony-runtime` replicas on one PostgreSQL database (issue #20): the closed loop
//! with each session started on the next replica in turn (its driver, and the worker it
//! dispatches to, are that replica's), and the takeover of a killed replica's session.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use phrony_client::{ApprovalFilter, Client};
use phrony_test_support::worker::RefundWorker;
use tests::daemon::{Daemon, Replicas};

use crate::load::{
    FAST, HELD, approve, closed_loop, closed_phase, daemon_env, deploy, pending_approvals,
    phase_guard, run_of, runs_off, start_workers, wait_for_arrival, wait_for_completed,
};
use crate::stats::Latencies;
use crate::{BenchError, ClosedLoop, Plan, Report, Takeovers, cpu_cell};

/// The daemon's `RUNTIME_SESSION_LEASE_TTL` on PostgreSQL when unset.
const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);

/// What the daemon logs when it takes a session over (`lease.rs` in the engine).
const TAKEOVER_LOG: &str = "taking over a session whose lease expired";

/// How often the surviving replica's log is read for the takeover.
const LOG_POLL: Duration = Duration::from_millis(20);

fn runtime() -> Result<tokio::runtime::Runtime, BenchError> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| BenchError::new(format!("tokio: {e}")))
}

/// [`Replicas::start`], saying so under `label` when PostgreSQL is skipped.
fn start(n: usize, env: &[(&str, &str)], label: &str) -> Option<Replicas> {
    let replicas = Replicas::start(n, env);
    if replicas.is_none() {
        eprintln!("{label}: skipped (PHRONY_TEST_SKIP_POSTGRES=1 and no PostgreSQL)");
    }
    replicas
}

async fn connect_all(replicas: &Replicas) -> Result<Vec<Client>, BenchError> {
    let mut clients = Vec::new();
    for daemon in replicas.iter() {
        clients.push(
            Client::connect(daemon.addr())
                .await
                .map_err(|e| BenchError::new(format!("connect {}: {e}", daemon.addr())))?,
        );
    }
    Ok(clients)
}

/// `phrony audit verify --all` on `daemon`: every session's hash chain, whichever replica
/// wrote it.
fn verify_audit(daemon: &Daemon) -> Result<(), BenchError> {
    let out = tests::cli::run(
        tests::cli::phrony(daemon, "bench-auditor").args(["audit", "verify", "--all"]),
    );
    if out.code == Some(0) && out.stdout.starts_with("verified ") {
        eprintln!("replicas: audit {}", out.stdout.trim());
        Ok(())
    } else {
        Err(BenchError::new(format!(
            "audit verify --all failed ({:?}): {}{}",
            out.code, out.stdout, out.stderr
        )))
    }
}

/// For each `plan.replicas` count N: N daemons on a fresh PostgreSQL database (session leases
/// at the daemon's default), enough refund workers on each, and the closed loop at each
/// `plan.concurrency` with sessions started round robin across the replicas; then every tool
/// call is checked to have run once per completed session and the audit chains to verify.
///
/// # Errors
/// Setup that fails; an audit chain that does not verify.
pub(crate) fn throughput(plan: &Plan, report: &mut Report) -> Result<(), BenchError> {
    let max = plan.concurrency.iter().copied().max().unwrap_or(1);
    for &n in &plan.replicas {
        let Some(replicas) = start(n, &daemon_env(&10_000.to_string()), "replicas") else {
            return Ok(());
        };
        let _project = deploy(replicas.get(0), &[(FAST, 50)])?;
        // Each replica dispatches only its own sessions' calls: workers for its share.
        let workers: Vec<RefundWorker> = replicas
            .iter()
            .enumerate()
            .flat_map(|(i, d)| start_workers(d, &format!("bench-r{n}-{i}"), max.div_ceil(n)))
            .collect();
        let daemons: Vec<&Daemon> = replicas.iter().collect();
        let label = format!("postgres, replicas {n}");
        let completed = runtime()?.block_on(async {
            let clients = connect_all(&replicas).await?;
            // One session per replica first: each pays for its lazy set-up.
            let mut completed = closed_loop(&clients, &workers, n, Duration::ZERO).await.0;
            for &concurrency in &plan.concurrency {
                let (done, phase) = closed_phase(
                    &label,
                    &clients,
                    &daemons,
                    None,
                    &workers,
                    concurrency,
                    plan.phase,
                )
                .await;
                completed += done;
                report.lost_or_duplicated += phase.failed;
                report.replicas.push(ClosedLoop {
                    backend: "postgres",
                    replicas: n,
                    ..phase
                });
            }
            Ok::<_, BenchError>(completed)
        })?;
        report.lost_or_duplicated += runs_off(&label, &workers, completed, 0);
        verify_audit(replicas.get(n - 1))?;
        drop(workers);
    }
    Ok(())
}

/// `plan.takeovers` times, on two replicas: a session of the held agent started on replica 1
/// waits for its approval (its driver stays in memory and holds the session's lease), replica 1
/// is killed with SIGKILL, and the time until replica 0 logs that it took the session over is
/// recorded; the approval is then decided on replica 0, the session must complete there with
/// its refund run once, and replica 1 is started again.
///
/// # Errors
/// Setup that fails; a session not taken over or not completed within the guard.
pub(crate) fn takeovers(plan: &Plan, report: &mut Report) -> Result<(), BenchError> {
    let ttl_text = plan.lease_ttl.map(|ttl| format!("{}ms", ttl.as_millis()));
    let bound = 10_000.to_string();
    let mut env = daemon_env(&bound);
    env.extend([
        // The driver keeps its session while it waits for people: the replica dies holding it.
        ("RUNTIME_PARK_APPROVAL_WAITS", "false"),
        ("RUNTIME_RECOVERY_GRACE", "1s"),
    ]);
    if let Some(ttl) = &ttl_text {
        env.push(("RUNTIME_SESSION_LEASE_TTL", ttl));
    }
    let lease_ttl = plan.lease_ttl.unwrap_or(DEFAULT_LEASE_TTL);
    let Some(mut replicas) = start(2, &env, "takeovers") else {
        return Ok(());
    };
    let _project = deploy(replicas.get(0), &[(HELD, 400)])?;
    let workers: Vec<RefundWorker> = replicas
        .iter()
        .enumerate()
        .map(|(i, d)| RefundWorker::start(d.addr(), &format!("bench-takeover-{i}")))
        .collect();
    // A lease runs out within one TTL and the next scan comes within 0.6 TTL: far more is lost.
    let guard = lease_ttl * 4 + Duration::from_secs(30);
    let mut times = Latencies::default();
    let mut refused_votes = 0;
    let outcome = runtime()?.block_on(async {
        let clients = connect_all(&replicas).await?;
        for k in 0..plan.takeovers {
            let session = start_on(&clients[1], guard).await?;
            let (approval, call) = wait_for_approval(&clients[0], &session, guard).await?;
            tokio::task::block_in_place(|| replicas.get_mut(1).kill9());
            let killed = Instant::now();
            let took = wait_for_takeover(replicas.get(0), &session, killed, guard).await?;
            times.push(took);
            eprintln!(
                "takeover {}/{}: {session} taken over {:.0} ms after the kill",
                k + 1,
                plan.takeovers,
                took.as_secs_f64() * 1e3
            );
            refused_votes += vote_after_takeover(&clients[0], &approval, &session).await?;
            wait_for_arrival(&workers, &call, Instant::now(), guard).await?;
            wait_for_completed(&clients[0], k + 1, phase_guard(k + 1)).await?;
            tokio::task::block_in_place(|| replicas.get_mut(1).restart());
        }
        Ok::<_, BenchError>(())
    });
    if let Err(error) = outcome {
        return Err(BenchError::new(format!(
            "{error}\nthe replicas' warnings and errors:\n{}",
            problems(&replicas)
        )));
    }
    let completed = u64::try_from(plan.takeovers).unwrap_or(u64::MAX);
    report.lost_or_duplicated += runs_off("takeovers", &workers, 0, completed);
    verify_audit(replicas.get(0))?;
    drop(workers);
    report.takeovers = Some(Takeovers {
        lease_ttl,
        times,
        refused_votes,
    });
    Ok(())
}

/// Votes to approve on the replica that took the session over; a vote it refuses is counted,
/// said, and sent again (as a client would), up to [`VOTE_ATTEMPTS`] times. Returns the refusals.
async fn vote_after_takeover(
    client: &Client,
    approval: &str,
    session: &str,
) -> Result<u64, BenchError> {
    let mut refused = 0;
    loop {
        match approve(client, approval).await {
            Ok(()) => return Ok(refused),
            Err(e) if refused + 1 < VOTE_ATTEMPTS => {
                refused += 1;
                eprintln!("takeover of {session}: the vote was refused ({e}); sent again");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// How many times [`vote_after_takeover`] sends a vote.
const VOTE_ATTEMPTS: u64 = 5;

/// Starts a session of the held agent on `client`'s replica; a replica just restarted may
/// refuse the first attempts while the client reconnects.
async fn start_on(client: &Client, guard: Duration) -> Result<String, BenchError> {
    let began = Instant::now();
    loop {
        match client.run_session(&run_of(HELD), "bench").await {
            Ok(started) => return Ok(started.session_id),
            Err(e) if began.elapsed() > guard => {
                return Err(BenchError::new(format!("RunSession: {e}")));
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Waits until `session` has a pending approval (listed on `client`'s replica); returns its id
/// and its call's id.
async fn wait_for_approval(
    client: &Client,
    session: &str,
    guard: Duration,
) -> Result<(String, String), BenchError> {
    let began = Instant::now();
    loop {
        let filter = ApprovalFilter {
            session_id: Some(session.to_owned()),
            ..ApprovalFilter::default()
        };
        if let Some(held) = pending_approvals(client, filter).await?.into_iter().next() {
            return Ok((held.approval, held.call));
        }
        if began.elapsed() > guard {
            return Err(BenchError::new(format!(
                "{session} asked for no approval within {} s",
                guard.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `daemon` logs that it took `session` over; returns the time since `killed`.
async fn wait_for_takeover(
    daemon: &Daemon,
    session: &str,
    killed: Instant,
    guard: Duration,
) -> Result<Duration, BenchError> {
    loop {
        let logs = daemon.logs();
        if logs
            .lines()
            .any(|l| l.contains(TAKEOVER_LOG) && l.contains(session))
        {
            return Ok(killed.elapsed());
        }
        if killed.elapsed() > guard {
            return Err(BenchError::new(format!(
                "no replica took {session} over within {} s of the kill",
                guard.as_secs()
            )));
        }
        tokio::time::sleep(LOG_POLL).await;
    }
}

/// The last warnings and errors the replicas logged (JSON lines), to explain a failed run.
fn problems(replicas: &Replicas) -> String {
    let mut out = String::new();
    for (i, daemon) in replicas.iter().enumerate() {
        let logs = daemon.logs();
        let lines: Vec<&str> = logs
            .lines()
            .filter(|l| l.contains("\"level\":\"WARN\"") || l.contains("\"level\":\"ERROR\""))
            .collect();
        for line in &lines[lines.len().saturating_sub(PROBLEM_LINES)..] {
            let _ = writeln!(out, "replica-{i}: {line}");
        }
    }
    out
}

/// Log lines of each replica [`problems`] shows.
const PROBLEM_LINES: usize = 20;

/// `c`'s throughput against the one-replica phase of the same concurrency in the same run.
pub(crate) fn ratio_to_one(report: &Report, c: &ClosedLoop) -> Option<f64> {
    report
        .replicas
        .iter()
        .find(|one| one.replicas == 1 && one.concurrency == c.concurrency)
        .filter(|one| one.per_s > 0.0)
        .map(|one| c.per_s / one.per_s)
}

/// The tables of the replica scenarios (nothing when they did not run).
pub(crate) fn markdown(report: &Report, s: &mut String) {
    if !report.replicas.is_empty() {
        let _ = writeln!(
            s,
            "\n| replicas (PostgreSQL) | concurrency | sessions (= tool calls)/s | ratio to 1 replica | p50 | p99 | daemon CPU per call (all replicas) | failed |\n|---|---|---|---|---|---|---|---|"
        );
        for c in &report.replicas {
            let cells = [
                c.replicas.to_string(),
                c.concurrency.to_string(),
                format!("{:.1}", c.per_s),
                ratio_to_one(report, c).map_or_else(|| "—".to_owned(), |r| format!("{r:.2}")),
                format!("{:.1} ms", c.latency.p50_us() / 1000.0),
                format!("{:.1} ms", c.latency.p99_us() / 1000.0),
                cpu_cell(c),
                c.failed.to_string(),
            ];
            let _ = writeln!(s, "| {} |", cells.join(" | "));
        }
    }
    if let Some(t) = report.takeovers.as_ref().filter(|t| !t.times.is_empty()) {
        let ttl_ms = t.lease_ttl.as_secs_f64() * 1e3;
        let cell = |q: f64| {
            let ms = t.times.quantile_us(q) / 1e3;
            format!("{ms:.0} ms ({:.2} TTL)", ms / ttl_ms)
        };
        let _ = writeln!(
            s,
            "\n| takeovers after kill -9 | lease TTL | min | p50 | p90 | max | votes refused after the takeover (sent again) |\n|---|---|---|---|---|---|---|\n| {} | {ttl_ms:.0} ms | {} | {} | {} | {} | {} |",
            t.times.len(),
            cell(0.0),
            cell(0.5),
            cell(0.9),
            cell(1.0),
            t.refused_votes
        );
    }
}
