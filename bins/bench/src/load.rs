//! The scenarios against one daemon: closed loop per concurrency, then parked sessions and an
//! approval burst.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use phrony_client::interactive::SessionEvent;
use phrony_client::{
    AgentName, ApprovalFilter, Client, DecideApproval, Decision, RunSession, SessionFilter,
};
use phrony_test_support::stub::{one_refund_turns, write_refund_agent_named};
use phrony_test_support::worker::RefundWorker;
use serde_json::{Value, json};
use tests::daemon::{Backend, Daemon};
use tests::stub::publish_and_deploy;

use crate::stats::Latencies;
use crate::writer::{self, Scrape};
use crate::{
    BenchError, ClosedLoop, OpenLoop, Parked, Plan, Report, Rtt, backend_name, baseline, cpu_time,
    rss_mb,
};

/// The allowed refund's agent (one tool call of 50, then a closing text).
pub(crate) const FAST: &str = "bench-fast";
/// The held refund's agent (a refund of 400 waits for one approval).
pub(crate) const HELD: &str = "bench-held";
/// How long the parked phase may wait for sessions to park or to complete (a guard, not a pace):
/// ten minutes, and one more second per 100 sessions beyond 60,000.
pub(crate) fn phase_guard(n: usize) -> Duration {
    Duration::from_secs(600 + (n.saturating_sub(60_000) / 100) as u64)
}
/// Calls a `RefundWorker` takes at once.
const PER_WORKER: usize = 4;
/// Concurrent voters in the approval burst.
pub(crate) const VOTERS: usize = 64;

/// Runs every scenario on a fresh daemon of `backend` and adds the figures to `report`.
///
/// # Errors
/// Setup that fails; a scenario that cannot run.
pub(crate) fn backend(
    backend: Backend,
    plan: &Plan,
    report: &mut Report,
) -> Result<(), BenchError> {
    let name = backend_name(backend);
    let bound = (plan.parked * 2).max(10_000).to_string();
    // The probes and metrics, on loopback: each closed-loop phase reads the ledger's.
    let http = format!("127.0.0.1:{}", tests::daemon::free_port());
    let mut env = daemon_env(&bound);
    env.push(("RUNTIME_HTTP_ADDR", &http));
    let Some(mut daemon) = Daemon::start_with_env(backend, &env) else {
        eprintln!("{name}: skipped (PHRONY_TEST_SKIP_POSTGRES=1 and no PostgreSQL)");
        return Ok(());
    };
    let _project = deploy(&daemon, &[(FAST, 50), (HELD, 400)])?;
    let workers: Arc<Vec<RefundWorker>> = Arc::new(start_workers(
        &daemon,
        &format!("bench-{name}"),
        plan.worker_calls(),
    ));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| BenchError::new(format!("tokio: {e}")))?;
    let (completed_fast, completed_held) = runtime.block_on(async {
        let client = Client::connect(daemon.addr())
            .await
            .map_err(|e| BenchError::new(format!("connect {}: {e}", daemon.addr())))?;
        let unary = baseline::unary_rtt(&client, plan.rtt_samples).await?;
        let bidi = baseline::bidi_rtt(daemon.addr(), plan.rtt_samples).await?;
        eprintln!(
            "{name}: unary round trip p50 {:.0} µs, p99 {:.0} µs; bidi-stream round trip p50 {:.0} µs, p99 {:.0} µs",
            unary.p50_us(),
            unary.p99_us(),
            bidi.p50_us(),
            bidi.p99_us()
        );
        report.rtt.push(Rtt {
            backend: name,
            unary,
            bidi,
        });
        let clients = std::slice::from_ref(&client);
        let mut completed_fast = 0;
        // One session first: the daemon's first session pays for lazy set-up.
        completed_fast += closed_loop(clients, &workers, 1, Duration::ZERO).await.0;
        let mut best: f64 = 0.0;
        for &concurrency in &plan.concurrency {
            let (completed, phase) = closed_phase(
                name,
                clients,
                &[&daemon],
                Some(&http),
                &workers,
                concurrency,
                plan.phase,
            )
            .await;
            completed_fast += completed;
            best = best.max(phase.per_s);
            report.lost_or_duplicated += phase.failed;
            report.closed.push(ClosedLoop {
                backend: name,
                ..phase
            });
        }
        // Open loop at half the best closed-loop rate of this run.
        let rate = best / 2.0;
        if rate >= 1.0 {
            let (completed, open) = open_loop(&client, rate, plan.phase).await;
            completed_fast += completed;
            eprintln!(
                "{name}: open loop at {rate:.1}/s: p50 {:.1} ms, p99 {:.1} ms, {} failed, {} not started (over {OPEN_LOOP_IN_FLIGHT} in flight)",
                open.latency.p50_us() / 1000.0,
                open.latency.p99_us() / 1000.0,
                open.failed,
                open.overloaded
            );
            report.lost_or_duplicated += open.failed;
            report.open.push(OpenLoop {
                backend: name,
                ..open
            });
        }
        let completed_held = if plan.parked > 0 {
            let parked = parked(&client, &mut daemon, &workers, plan).await?;
            let ended = parked.approved as u64;
            report.parked.push(Parked {
                backend: name,
                ..parked
            });
            ended
        } else {
            0
        };
        Ok::<_, BenchError>((completed_fast, completed_held))
    })?;
    drop(runtime);
    report.lost_or_duplicated += runs_off(name, &workers, completed_fast, completed_held);
    drop(workers);
    Ok(())
}

/// The environment of every daemon of the bench: the scripted `stub` model, room for `bound`
/// live sessions per agent, JSON logs.
pub(crate) fn daemon_env(bound: &str) -> Vec<(&'static str, &str)> {
    vec![
        ("RUNTIME_ENABLE_STUB_PROVIDER", "1"),
        ("RUNTIME_MAX_SESSIONS_PER_AGENT", bound),
        ("RUNTIME_LOG_FORMAT", "json"),
    ]
}

/// Publishes and deploys, on `daemon`, one copy of the tutorial's refund agent per
/// `(name, amount)`: a single refund of `amount`, then a closing text. The returned directory
/// holds the agents' sources (keep it while they run).
pub(crate) fn deploy(
    daemon: &Daemon,
    agents: &[(&str, u32)],
) -> Result<tempfile::TempDir, BenchError> {
    let project = tempfile::tempdir().map_err(|e| BenchError::new(format!("tempdir: {e}")))?;
    for &(agent, amount) in agents {
        let dir = project.path().join(agent);
        std::fs::create_dir_all(&dir)
            .map_err(|e| BenchError::new(format!("mkdir {}: {e}", dir.display())))?;
        write_refund_agent_named(
            &dir,
            agent,
            &one_refund_turns("ORD-1", amount, "The item arrived damaged."),
        );
        publish_and_deploy(daemon, &dir, &format!("support/{agent}"));
    }
    Ok(project)
}

/// Enough refund workers on `daemon` for `concurrency` calls at once ([`PER_WORKER`] each, at
/// least one, at most 64), named `{label}-{i}`.
pub(crate) fn start_workers(daemon: &Daemon, label: &str, concurrency: usize) -> Vec<RefundWorker> {
    (0..concurrency.div_ceil(PER_WORKER).clamp(1, 64))
        .map(|i| RefundWorker::start(daemon.addr(), &format!("{label}-{i}")))
        .collect()
}

/// How far the refunds `workers` ran are from one per completed session: allowed refunds (50)
/// against `completed_fast`, held ones (400) against `completed_held`. Says so when not 0.
pub(crate) fn runs_off(
    label: &str,
    workers: &[RefundWorker],
    completed_fast: u64,
    completed_held: u64,
) -> u64 {
    let invocations: Vec<Value> = workers.iter().flat_map(RefundWorker::invocations).collect();
    let ran = |amount: u64| {
        invocations
            .iter()
            .filter(|args| args["amount"].as_u64() == Some(amount))
            .count() as u64
    };
    let (fast_runs, held_runs) = (ran(50), ran(400));
    let wrong = fast_runs.abs_diff(completed_fast) + held_runs.abs_diff(completed_held);
    if wrong > 0 {
        eprintln!(
            "{label}: {fast_runs} allowed refunds ran for {completed_fast} completed sessions, \
             {held_runs} held refunds for {completed_held}"
        );
    }
    wrong
}

/// One measured closed-loop phase ([`closed_loop`]) with the CPU time `daemons` spent over it,
/// summed, per completed session, and, with the HTTP address of a single daemon's `metrics`,
/// where its ledger writes spent their time; prints its figures under `label`. Returns the
/// completed sessions and the phase (`backend` filled in by the caller).
pub(crate) async fn closed_phase(
    label: &str,
    clients: &[Client],
    daemons: &[&Daemon],
    metrics: Option<&str>,
    workers: &[RefundWorker],
    concurrency: usize,
    phase: Duration,
) -> (u64, ClosedLoop) {
    let metrics_before = scrape(label, metrics).await;
    let cpu_before = cpu_time_sum(daemons);
    let started = Instant::now();
    let (completed, mut figures) = closed_loop(clients, workers, concurrency, phase).await;
    let elapsed = started.elapsed().as_secs_f64();
    if let (Some(before), Some(after)) = (metrics_before, scrape(label, metrics).await) {
        figures.writer = writer::figures(&before, &after, elapsed, completed);
    }
    figures.cpu_us_per_call = match (cpu_before, cpu_time_sum(daemons)) {
        (Some(before), Some(after)) if completed > 0 => {
            Some(after.saturating_sub(before).as_secs_f64() * 1e6 / completed as f64)
        }
        _ => None,
    };
    eprintln!(
        "{label}: concurrency {concurrency}: {:.1} sessions/s, p50 {:.1} ms, p99 {:.1} ms, \
         dispatch overhead p50 {:.0} µs, daemon CPU per call {:.0} µs, {} failed",
        figures.per_s,
        figures.latency.p50_us() / 1000.0,
        figures.latency.p99_us() / 1000.0,
        figures.dispatch.p50_us(),
        figures.cpu_us_per_call.unwrap_or(f64::NAN),
        figures.failed
    );
    if let Some(w) = &figures.writer {
        eprintln!(
            "{label}: concurrency {concurrency}: {:.1} ledger writes per session, wait {:.0} µs, \
             hold {:.0} µs ({} in statements, {} in hand-offs), commit {:.0} µs; writer busy {}",
            w.writes_per_session,
            w.wait_us,
            w.hold_us,
            w.statement_us
                .map_or_else(|| "—".to_owned(), |us| format!("{us:.0} µs")),
            w.handoff_us
                .map_or_else(|| "—".to_owned(), |us| format!("{us:.0} µs")),
            w.commit_us,
            w.busy
                .map_or_else(|| "—".to_owned(), |b| format!("{:.0} %", b * 100.0))
        );
    }
    (completed, figures)
}

/// The daemon's metrics at `addr` now (`None` without an address, or saying why under
/// `label` when they cannot be read).
async fn scrape(label: &str, addr: Option<&str>) -> Option<Scrape> {
    match Scrape::read(addr?).await {
        Ok(scrape) => Some(scrape),
        Err(e) => {
            eprintln!("{label}: no ledger write figures: {e}");
            None
        }
    }
}

/// The CPU time of all `daemons` so far, summed; `None` when one cannot be read.
fn cpu_time_sum(daemons: &[&Daemon]) -> Option<Duration> {
    daemons.iter().map(|d| cpu_time(d)).sum()
}

/// `concurrency` clients, each starting a session of the fast agent and waiting for its end,
/// until `phase` has passed (at least one session each); each session goes to the next of
/// `clients` in turn (round robin over the daemons they connect to). Returns the completed
/// sessions and the phase's figures (`backend` filled in by the caller).
pub(crate) async fn closed_loop(
    clients: &[Client],
    workers: &[RefundWorker],
    concurrency: usize,
    phase: Duration,
) -> (u64, ClosedLoop) {
    let started = Instant::now();
    let deadline = started + phase;
    let failed = Arc::new(AtomicU64::new(0));
    let turn = Arc::new(AtomicUsize::new(0));
    let clients: Arc<Vec<Client>> = Arc::new(clients.to_vec());
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let clients = Arc::clone(&clients);
        let turn = Arc::clone(&turn);
        let failed = Arc::clone(&failed);
        tasks.push(tokio::spawn(async move {
            let mut latencies = Latencies::default();
            let mut calls = Vec::new();
            loop {
                let next = turn.fetch_add(1, Ordering::Relaxed) % clients.len().max(1);
                let Some(client) = clients.get(next) else {
                    return (latencies, calls);
                };
                let t0 = Instant::now();
                match one_session(client).await {
                    Ok(call) => {
                        latencies.push(t0.elapsed());
                        calls.extend(call);
                    }
                    Err(e) => {
                        eprintln!("session failed: {e}");
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                if Instant::now() >= deadline {
                    return (latencies, calls);
                }
            }
        }));
    }
    let mut latency = Latencies::default();
    let mut calls = Vec::new();
    for task in tasks {
        match task.await {
            Ok((l, c)) => {
                latency.extend(&l);
                calls.extend(c);
            }
            Err(_) => {
                failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let completed = latency.len() as u64;
    (
        completed,
        ClosedLoop {
            backend: "",
            concurrency,
            per_s: completed as f64 / elapsed,
            latency,
            dispatch: dispatch_overhead(workers, &calls),
            failed: failed.load(Ordering::Relaxed),
            cpu_us_per_call: None,
            replicas: 1,
            writer: None,
        },
    )
}

/// When the invoke of `call_id` reached one of `workers`.
fn arrival(workers: &[RefundWorker], call_id: &str) -> Option<Instant> {
    workers.iter().find_map(|w| w.arrived(call_id))
}

/// Dispatch overhead per call: from the moment the client saw the model's tool call on the
/// session's stream until the invoke reached a worker. Both are one loopback hop from the
/// daemon, so the difference is the daemon's time from the model's tool call to the invoke
/// (binding, validation, policy, the durable decision and dispatch journal). An invoke that
/// arrived before the stream's event counts as zero.
fn dispatch_overhead(workers: &[RefundWorker], calls: &[(String, Instant)]) -> Latencies {
    let mut overhead = Latencies::default();
    for (call_id, seen) in calls {
        if let Some(at) = arrival(workers, call_id) {
            overhead.push(at.saturating_duration_since(*seen));
        }
    }
    overhead
}

/// Sessions started at most this many at once in the open loop; a start due while this many
/// are running is counted as not started (the daemon fell behind the arrival rate).
pub(crate) const OPEN_LOOP_IN_FLIGHT: usize = 4096;

/// Starts sessions of the fast agent at a fixed `rate` per second for `phase`, each measured
/// from its *scheduled* start (so a daemon that falls behind shows as latency, not as a lower
/// rate: no coordinated omission), and waits for them all.
async fn open_loop(client: &Client, rate: f64, phase: Duration) -> (u64, OpenLoop) {
    let started = tokio::time::Instant::now();
    let interval = Duration::from_secs_f64(1.0 / rate);
    let slots = Arc::new(tokio::sync::Semaphore::new(OPEN_LOOP_IN_FLIGHT));
    let failed = Arc::new(AtomicU64::new(0));
    let mut overloaded = 0u64;
    let mut tasks = Vec::new();
    let mut k: u32 = 0;
    loop {
        let scheduled = started + interval * k;
        if scheduled.duration_since(started) >= phase {
            break;
        }
        tokio::time::sleep_until(scheduled).await;
        k = k.saturating_add(1);
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            overloaded += 1;
            continue;
        };
        let client = client.clone();
        let failed = Arc::clone(&failed);
        tasks.push(tokio::spawn(async move {
            let _slot = slot;
            match one_session(&client).await {
                Ok(_) => Some(scheduled.elapsed()),
                Err(e) => {
                    eprintln!("session failed: {e}");
                    failed.fetch_add(1, Ordering::Relaxed);
                    None
                }
            }
        }));
    }
    let mut latency = Latencies::default();
    for task in tasks {
        match task.await {
            Ok(Some(l)) => latency.push(l),
            Ok(None) => {}
            Err(_) => {
                failed.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
    (
        latency.len() as u64,
        OpenLoop {
            backend: "",
            rate,
            latency,
            failed: failed.load(Ordering::Relaxed),
            overloaded,
        },
    )
}

pub(crate) fn run_of(agent: &str) -> RunSession {
    let mut run = RunSession::new(AgentName::new("support", agent));
    run.input = Some(json!({"message": "Refund order ORD-1."}));
    run
}

/// One task session on an interactive stream, until it ends: `Ok` when it completed, with its
/// tool call's id and when the stream showed it.
async fn one_session(client: &Client) -> Result<Option<(String, Instant)>, String> {
    let session = client
        .start_interactive(&run_of(FAST), "bench")
        .await
        .map_err(|e| e.to_string())?;
    let (_sender, mut events) = session.split();
    let mut call = None;
    loop {
        match events.next().await.map_err(|e| e.to_string())? {
            Some(SessionEvent::ToolCall(c)) => {
                let seen = Instant::now();
                call.get_or_insert((c.call_id, seen));
            }
            Some(SessionEvent::Completed(_)) => return Ok(call),
            Some(event) if event.is_terminal() => return Err(format!("ended: {event:?}")),
            Some(_) => {}
            None => return Err("the stream ended before the session".to_owned()),
        }
    }
}

/// Parks `plan.parked` sessions of the held agent in `awaiting_approval` and measures the
/// daemon's memory and idle CPU; kills and restarts it; approves a few one at a time and
/// `plan.burst` more in one burst and waits until they completed; cancels the rest; reads the
/// memory again.
async fn parked(
    client: &Client,
    daemon: &mut Daemon,
    workers: &[RefundWorker],
    plan: &Plan,
) -> Result<Parked, BenchError> {
    let n = plan.parked;
    let guard = phase_guard(n);
    let before = rss_mb(daemon);
    let mut starts = Vec::new();
    for chunk in 0..32usize {
        let client = client.clone();
        starts.push(tokio::spawn(async move {
            let mut i = chunk;
            while i < n {
                client
                    .run_session(&run_of(HELD), "bench")
                    .await
                    .map_err(|e| BenchError::new(format!("RunSession: {e}")))?;
                i += 32;
            }
            Ok::<_, BenchError>(())
        }));
    }
    for start in starts {
        start
            .await
            .map_err(|e| BenchError::new(format!("a start task failed: {e}")))??;
    }
    let held = wait_for_pending(client, n, guard).await?;
    let parked_rss = rss_mb(daemon);
    eprintln!(
        "parked {n}: daemon RSS {before:.1} MiB before, {parked_rss:.1} MiB parked ({:.0} KiB each)",
        (parked_rss - before) * 1024.0 / (n.max(1) as f64)
    );
    // Nothing runs but the parked sessions: the daemon's own CPU over a quiet window.
    let window = if plan.quick { QUIET_QUICK } else { QUIET };
    let cpu_before = cpu_time(daemon);
    tokio::time::sleep(window).await;
    let idle_cpu_pct = match (cpu_before, cpu_time(daemon)) {
        (Some(a), Some(b)) => b.saturating_sub(a).as_secs_f64() * 100.0 / window.as_secs_f64(),
        _ => 0.0,
    };
    let quiet_rss = rss_mb(daemon);
    eprintln!(
        "parked {n}: daemon CPU {idle_cpu_pct:.1} % of a core over {} s with nothing else to do; \
         RSS then {quiet_rss:.1} MiB ({:.1} KiB each)",
        window.as_secs(),
        (quiet_rss - before) * 1024.0 / (n.max(1) as f64)
    );
    // kill -9 with every session parked: how long recovery takes until SERVING, and what the
    // daemon holds afterwards (the workers and the client reconnect on their own).
    let restart = Instant::now();
    tokio::task::block_in_place(|| {
        daemon.kill9();
        daemon.restart();
    });
    let restart_ms = restart.elapsed().as_secs_f64() * 1000.0;
    let restart_rss = rss_mb(daemon);
    eprintln!(
        "parked {n}: kill -9 and restart until SERVING {restart_ms:.0} ms, RSS then {restart_rss:.1} MiB"
    );
    // Approve → invoke with nothing else going on: a few approvals one at a time, each
    // waited for until its invoke reached a worker.
    let singles = (n / 5).min(SINGLE_APPROVALS);
    let mut approve_to_invoke = Latencies::default();
    for h in &held[..singles] {
        let t0 = Instant::now();
        approve(client, &h.approval).await?;
        approve_to_invoke.push(wait_for_arrival(workers, &h.call, t0, guard).await?);
    }
    // The burst: `plan.burst` more approved at once by 64 voters.
    let burst_size = plan.burst.min(n - singles);
    let approved = singles + burst_size;
    let burst = Instant::now();
    let rest: Arc<Vec<Held>> = Arc::new(held[singles..approved].to_vec());
    let mut voters = Vec::new();
    for voter in 0..VOTERS {
        let client = client.clone();
        let rest = Arc::clone(&rest);
        voters.push(tokio::spawn(async move {
            let mut latencies = Latencies::default();
            let mut sent = Vec::new();
            let mut i = voter;
            while i < rest.len() {
                let t0 = Instant::now();
                approve(&client, &rest[i].approval).await?;
                latencies.push(t0.elapsed());
                sent.push((rest[i].call.clone(), t0));
                i += VOTERS;
            }
            Ok::<_, BenchError>((latencies, sent))
        }));
    }
    let mut vote = Latencies::default();
    let mut sent = Vec::new();
    for voter in voters {
        let (latencies, s) = voter
            .await
            .map_err(|e| BenchError::new(format!("a voter failed: {e}")))??;
        vote.extend(&latencies);
        sent.extend(s);
    }
    wait_for_completed(client, approved, guard).await?;
    let burst_ms = burst.elapsed().as_secs_f64() * 1000.0;
    let mut burst_to_invoke = Latencies::default();
    for (call_id, t0) in &sent {
        if let Some(at) = arrival(workers, call_id) {
            burst_to_invoke.push(at.saturating_duration_since(*t0));
        }
    }
    eprintln!(
        "approve → invoke, one at a time: p50 {:.1} ms; burst of {burst_size}: vote p50 {:.1} ms, p99 {:.1} ms, \
         approve → invoke p50 {:.1} ms, p99 {:.1} ms; all completed after {burst_ms:.0} ms",
        approve_to_invoke.p50_us() / 1000.0,
        vote.p50_us() / 1000.0,
        vote.p99_us() / 1000.0,
        burst_to_invoke.p50_us() / 1000.0,
        burst_to_invoke.p99_us() / 1000.0,
    );
    // The sessions not approved end too (cancelled), so every parked session has ended.
    let unapproved: Arc<Vec<Held>> = Arc::new(held[approved..].to_vec());
    cancel_all(client, &unapproved).await?;
    let after = rss_mb(daemon);
    // The allocator returns freed pages after its decay time (jemalloc: 10 s).
    tokio::time::sleep(SETTLE).await;
    let settled = rss_mb(daemon);
    eprintln!(
        "parked {n}: {} cancelled; RSS {after:.1} MiB when all ended, {settled:.1} MiB {} s later",
        unapproved.len(),
        SETTLE.as_secs(),
    );
    Ok(Parked {
        backend: "",
        sessions: n,
        approved,
        idle_cpu_pct,
        rss_mb: [before, parked_rss, after, settled],
        quiet_rss_mb: quiet_rss,
        restart_ms,
        restart_rss_mb: restart_rss,
        approve_to_invoke,
        burst: burst_size,
        vote,
        burst_to_invoke,
        burst_ms,
    })
}

/// The quiet window over which the daemon's CPU is read while sessions are parked.
const QUIET: Duration = Duration::from_secs(10);
/// The same for `--quick`.
const QUIET_QUICK: Duration = Duration::from_secs(2);

/// Cancels the sessions of `held` (64 at a time); each `CancelSession` returns once the
/// cancellation is durable.
async fn cancel_all(client: &Client, sessions: &Arc<Vec<Held>>) -> Result<(), BenchError> {
    let mut tasks = Vec::new();
    for worker in 0..VOTERS {
        let client = client.clone();
        let sessions = Arc::clone(sessions);
        tasks.push(tokio::spawn(async move {
            let mut i = worker;
            while i < sessions.len() {
                client
                    .cancel_session(&sessions[i].session, "bench")
                    .await
                    .map_err(|e| BenchError::new(format!("CancelSession: {e}")))?;
                i += VOTERS;
            }
            Ok::<_, BenchError>(())
        }));
    }
    for task in tasks {
        task.await
            .map_err(|e| BenchError::new(format!("a cancel task failed: {e}")))??;
    }
    Ok(())
}

/// How long after the burst ended the daemon's RSS is read again.
pub(crate) const SETTLE: Duration = Duration::from_secs(12);

/// Approvals decided one at a time before the burst (approve → invoke unloaded).
const SINGLE_APPROVALS: usize = 20;

pub(crate) async fn approve(client: &Client, approval_id: &str) -> Result<(), BenchError> {
    let vote = DecideApproval {
        approval_id: approval_id.to_owned(),
        decision: Decision::Approve,
        comment: Some("bench".to_owned()),
        args: None,
        comprehension_acknowledged: true,
        resolution: None,
        result: None,
    };
    client
        .decide_approval(&vote, "bench-approver")
        .await
        .map_err(|e| BenchError::new(format!("DecideApproval: {e}")))?;
    Ok(())
}

/// Waits until the invoke of `call_id` reached a worker; returns the time since `t0`.
pub(crate) async fn wait_for_arrival(
    workers: &[RefundWorker],
    call_id: &str,
    t0: Instant,
    guard: Duration,
) -> Result<Duration, BenchError> {
    let mut changes: Vec<_> = workers.iter().map(RefundWorker::arrivals).collect();
    loop {
        if let Some(at) = arrival(workers, call_id) {
            return Ok(at.saturating_duration_since(t0));
        }
        let any_change =
            futures::future::select_all(changes.iter_mut().map(|c| Box::pin(c.changed())));
        if tokio::time::timeout(guard.saturating_sub(t0.elapsed()), any_change)
            .await
            .is_err()
        {
            return Err(BenchError::new(format!(
                "call {call_id} was approved but never reached a worker within {} s",
                guard.as_secs()
            )));
        }
    }
}

/// A parked session's pending approval.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub(crate) approval: String,
    pub(crate) call: String,
    session: String,
}

/// Every pending approval `filter` selects (all pages of 1,000).
pub(crate) async fn pending_approvals(
    client: &Client,
    mut filter: ApprovalFilter,
) -> Result<Vec<Held>, BenchError> {
    filter.status = Some("pending".to_owned());
    filter.limit = Some(1000);
    let mut ids = Vec::new();
    loop {
        let page = client
            .list_approvals(&filter)
            .await
            .map_err(|e| BenchError::new(format!("ListApprovals: {e}")))?;
        ids.extend(page.approvals.into_iter().map(|a| Held {
            approval: a.id,
            call: a.call_id,
            session: a.session_id,
        }));
        match page.next_page_token {
            Some(token) => filter.page_token = Some(token),
            None => return Ok(ids),
        }
    }
}

/// Waits until the held agent has `n` pending approvals; returns them.
async fn wait_for_pending(
    client: &Client,
    n: usize,
    guard: Duration,
) -> Result<Vec<Held>, BenchError> {
    let deadline = Instant::now() + guard;
    // A listing of many pages is itself load on the daemon: poll less often when it is long.
    let every = Duration::from_millis(100 + (n / 1000) as u64 * 20);
    loop {
        let ids = pending_approvals(
            client,
            ApprovalFilter {
                agent: Some(AgentName::new("support", HELD)),
                ..ApprovalFilter::default()
            },
        )
        .await?;
        if ids.len() >= n {
            return Ok(ids);
        }
        if Instant::now() > deadline {
            return Err(BenchError::new(format!(
                "only {} of {n} sessions parked within {} s",
                ids.len(),
                guard.as_secs()
            )));
        }
        tokio::time::sleep(every).await;
    }
}

/// Waits until the held agent has `n` completed sessions. Fails as soon as one of its sessions
/// failed or was cancelled (none is cancelled before this returns) or, at the guard, names how
/// many are in each status (a session still `awaiting_approval` after its vote was asked
/// again: lost work). Only the completed and failed listings are polled, which stay short
/// however many sessions remain parked.
pub(crate) async fn wait_for_completed(
    client: &Client,
    n: usize,
    guard: Duration,
) -> Result<(), BenchError> {
    let deadline = Instant::now() + guard;
    loop {
        let done = count_held(client, "completed", n).await?;
        if done >= n {
            return Ok(());
        }
        let ended_otherwise =
            count_held(client, "failed", 1).await? + count_held(client, "cancelled", 1).await?;
        if ended_otherwise > 0 || Instant::now() > deadline {
            let mut statuses: BTreeMap<&str, usize> = BTreeMap::new();
            for status in [
                "completed",
                "failed",
                "cancelled",
                "awaiting_approval",
                "awaiting_tool",
                "running",
            ] {
                statuses.insert(status, count_held(client, status, usize::MAX).await?);
            }
            return Err(BenchError::new(format!(
                "only {done} of {n} approved sessions completed (sessions by status: \
                 {statuses:?}){}",
                first_failure(client).await
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Why the first failed session of the held agent failed, for the bench's error (empty when
/// none failed or it cannot be read).
async fn first_failure(client: &Client) -> String {
    let filter = SessionFilter {
        agent: Some(AgentName::new("support", HELD)),
        status: Some("failed".to_owned()),
        limit: Some(1),
        ..SessionFilter::default()
    };
    let Ok(page) = client.list_sessions(&filter).await else {
        return String::new();
    };
    let Some(first) = page.sessions.first() else {
        return String::new();
    };
    match client.inspect_session(&first.id).await {
        Ok(inspection) => format!(
            "; session {} failed: {}",
            first.id,
            inspection.session.error.unwrap_or_default()
        ),
        Err(e) => format!("; session {} failed (inspect: {e})", first.id),
    }
}

/// How many sessions of the held agent are in `status`, counting no further than `enough`.
async fn count_held(client: &Client, status: &str, enough: usize) -> Result<usize, BenchError> {
    let mut filter = SessionFilter {
        agent: Some(AgentName::new("support", HELD)),
        status: Some(status.to_owned()),
        limit: Some(1000),
        ..SessionFilter::default()
    };
    let mut count = 0;
    loop {
        let page = client
            .list_sessions(&filter)
            .await
            .map_err(|e| BenchError::new(format!("ListSessions: {e}")))?;
        count += page.sessions.len();
        match page.next_page_token {
            Some(token) if count < enough => filter.page_token = Some(token),
            _ => return Ok(count),
        }
    }
}
