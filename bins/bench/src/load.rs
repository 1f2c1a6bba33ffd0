//! The scenarios against one daemon: closed loop per concurrency, then parked sessions and an
//! approval burst.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
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
use crate::{BenchError, ClosedLoop, Parked, Plan, Report, backend_name, baseline, rss_mb};

/// The allowed refund's agent (one tool call of 50, then a closing text).
const FAST: &str = "bench-fast";
/// The held refund's agent (a refund of 400 waits for one approval).
const HELD: &str = "bench-held";
/// How long the parked phase may wait for sessions to park or to complete (a guard, not a pace).
const PHASE_GUARD: Duration = Duration::from_secs(600);
/// Calls a `RefundWorker` takes at once.
const PER_WORKER: usize = 4;
/// Concurrent voters in the approval burst.
const VOTERS: usize = 64;

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
    let Some(daemon) = Daemon::start_with_env(
        backend,
        &[
            ("RUNTIME_ENABLE_STUB_PROVIDER", "1"),
            ("RUNTIME_MAX_SESSIONS_PER_AGENT", &bound),
            ("RUNTIME_LOG_FORMAT", "json"),
        ],
    ) else {
        eprintln!("{name}: skipped (PHRONY_TEST_SKIP_POSTGRES=1 and no PostgreSQL)");
        return Ok(());
    };
    let project = tempfile::tempdir().map_err(|e| BenchError::new(format!("tempdir: {e}")))?;
    for (agent, amount) in [(FAST, 50), (HELD, 400)] {
        let dir = project.path().join(agent);
        std::fs::create_dir_all(&dir)
            .map_err(|e| BenchError::new(format!("mkdir {}: {e}", dir.display())))?;
        write_refund_agent_named(
            &dir,
            agent,
            &one_refund_turns("ORD-1", amount, "The item arrived damaged."),
        );
        publish_and_deploy(&daemon, &dir, &format!("support/{agent}"));
    }
    let max = plan.concurrency.iter().copied().max().unwrap_or(1);
    let workers: Vec<RefundWorker> = (0..max.div_ceil(PER_WORKER).clamp(1, 64))
        .map(|i| RefundWorker::start(daemon.addr(), &format!("bench-{name}-{i}")))
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| BenchError::new(format!("tokio: {e}")))?;
    let (completed_fast, completed_held) = runtime.block_on(async {
        let client = Client::connect(daemon.addr())
            .await
            .map_err(|e| BenchError::new(format!("connect {}: {e}", daemon.addr())))?;
        let rtt = baseline::unary_rtt(&client, plan.rtt_samples).await?;
        eprintln!(
            "{name}: unary round trip p50 {:.0} µs, p99 {:.0} µs",
            rtt.p50_us(),
            rtt.p99_us()
        );
        report.rtt.push((name, rtt));
        let mut completed_fast = 0;
        // One session first: the daemon's first session pays for lazy set-up.
        completed_fast += closed_loop(&client, 1, Duration::ZERO).await.0;
        for &concurrency in &plan.concurrency {
            let (completed, phase) = closed_loop(&client, concurrency, plan.phase).await;
            completed_fast += completed;
            eprintln!(
                "{name}: concurrency {concurrency}: {:.1} sessions/s, p50 {:.1} ms, p99 {:.1} ms, {} failed",
                phase.per_s,
                phase.latency.p50_us() / 1000.0,
                phase.latency.p99_us() / 1000.0,
                phase.failed
            );
            report.lost_or_duplicated += phase.failed;
            report.closed.push(ClosedLoop {
                backend: name,
                ..phase
            });
        }
        let completed_held = if plan.parked > 0 {
            let parked = parked(&client, &daemon, plan.parked).await?;
            let ended = parked.sessions as u64;
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
            "{name}: {fast_runs} allowed refunds ran for {completed_fast} completed sessions, \
             {held_runs} held refunds for {completed_held}"
        );
    }
    report.lost_or_duplicated += wrong;
    drop(workers);
    Ok(())
}

/// `concurrency` clients, each starting a session of the fast agent and waiting for its end,
/// until `phase` has passed (at least one session each). Returns the completed sessions and the
/// phase's figures (`backend` filled in by the caller).
async fn closed_loop(client: &Client, concurrency: usize, phase: Duration) -> (u64, ClosedLoop) {
    let started = Instant::now();
    let deadline = started + phase;
    let failed = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let client = client.clone();
        let failed = Arc::clone(&failed);
        tasks.push(tokio::spawn(async move {
            let mut latencies = Latencies::default();
            loop {
                let t0 = Instant::now();
                match one_session(&client).await {
                    Ok(()) => latencies.push(t0.elapsed()),
                    Err(e) => {
                        eprintln!("session failed: {e}");
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
                if Instant::now() >= deadline {
                    return latencies;
                }
            }
        }));
    }
    let mut latency = Latencies::default();
    for task in tasks {
        match task.await {
            Ok(l) => latency.extend(&l),
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
            failed: failed.load(Ordering::Relaxed),
        },
    )
}

fn run_of(agent: &str) -> RunSession {
    let mut run = RunSession::new(AgentName::new("support", agent));
    run.input = Some(json!({"message": "Refund order ORD-1."}));
    run
}

/// One task session on an interactive stream, until it ends: `Ok` when it completed.
async fn one_session(client: &Client) -> Result<(), String> {
    let session = client
        .start_interactive(&run_of(FAST), "bench")
        .await
        .map_err(|e| e.to_string())?;
    let (_sender, mut events) = session.split();
    loop {
        match events.next().await.map_err(|e| e.to_string())? {
            Some(SessionEvent::Completed(_)) => return Ok(()),
            Some(event) if event.is_terminal() => return Err(format!("ended: {event:?}")),
            Some(_) => {}
            None => return Err("the stream ended before the session".to_owned()),
        }
    }
}

/// Parks `n` sessions of the held agent in `awaiting_approval`, measures the daemon's memory,
/// approves them all in one burst and waits until they completed.
async fn parked(client: &Client, daemon: &Daemon, n: usize) -> Result<Parked, BenchError> {
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
    let ids = wait_for_pending(client, n).await?;
    let parked_rss = rss_mb(daemon);
    eprintln!(
        "parked {n}: daemon RSS {before:.1} MiB before, {parked_rss:.1} MiB parked ({:.0} KiB each)",
        (parked_rss - before) * 1024.0 / (n.max(1) as f64)
    );
    let burst = Instant::now();
    let ids = Arc::new(ids);
    let mut voters = Vec::new();
    for voter in 0..VOTERS {
        let client = client.clone();
        let ids = Arc::clone(&ids);
        voters.push(tokio::spawn(async move {
            let mut latencies = Latencies::default();
            let mut i = voter;
            while i < ids.len() {
                let vote = DecideApproval {
                    approval_id: ids[i].clone(),
                    decision: Decision::Approve,
                    comment: Some("bench burst".to_owned()),
                    args: None,
                    comprehension_acknowledged: true,
                    resolution: None,
                    result: None,
                };
                let t0 = Instant::now();
                client
                    .decide_approval(&vote, "bench-approver")
                    .await
                    .map_err(|e| BenchError::new(format!("DecideApproval: {e}")))?;
                latencies.push(t0.elapsed());
                i += VOTERS;
            }
            Ok::<_, BenchError>(latencies)
        }));
    }
    let mut vote = Latencies::default();
    for voter in voters {
        vote.extend(
            &voter
                .await
                .map_err(|e| BenchError::new(format!("a voter failed: {e}")))??,
        );
    }
    wait_for_completed(client, n).await?;
    let burst_ms = burst.elapsed().as_secs_f64() * 1000.0;
    let after = rss_mb(daemon);
    eprintln!(
        "burst of {n} approvals: vote p50 {:.1} ms, p99 {:.1} ms; all completed after {burst_ms:.0} ms; RSS after {after:.1} MiB",
        vote.p50_us() / 1000.0,
        vote.p99_us() / 1000.0
    );
    Ok(Parked {
        backend: "",
        sessions: n,
        rss_mb: [before, parked_rss, after],
        vote,
        burst_ms,
    })
}

/// Waits until the held agent has `n` pending approvals; returns their ids.
async fn wait_for_pending(client: &Client, n: usize) -> Result<Vec<String>, BenchError> {
    let deadline = Instant::now() + PHASE_GUARD;
    loop {
        let mut ids = Vec::new();
        let mut filter = ApprovalFilter {
            status: Some("pending".to_owned()),
            agent: Some(AgentName::new("support", HELD)),
            limit: Some(1000),
            ..ApprovalFilter::default()
        };
        loop {
            let page = client
                .list_approvals(&filter)
                .await
                .map_err(|e| BenchError::new(format!("ListApprovals: {e}")))?;
            ids.extend(page.approvals.into_iter().map(|a| a.id));
            match page.next_page_token {
                Some(token) => filter.page_token = Some(token),
                None => break,
            }
        }
        if ids.len() >= n {
            return Ok(ids);
        }
        if Instant::now() > deadline {
            return Err(BenchError::new(format!(
                "only {} of {n} sessions parked within {} s",
                ids.len(),
                PHASE_GUARD.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the held agent has `n` completed sessions.
async fn wait_for_completed(client: &Client, n: usize) -> Result<(), BenchError> {
    let deadline = Instant::now() + PHASE_GUARD;
    loop {
        let mut done = 0;
        let mut filter = SessionFilter {
            agent: Some(AgentName::new("support", HELD)),
            status: Some("completed".to_owned()),
            limit: Some(1000),
            ..SessionFilter::default()
        };
        loop {
            let page = client
                .list_sessions(&filter)
                .await
                .map_err(|e| BenchError::new(format!("ListSessions: {e}")))?;
            done += page.sessions.len();
            match page.next_page_token {
                Some(token) => filter.page_token = Some(token),
                None => break,
            }
        }
        if done >= n {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(BenchError::new(format!(
                "only {done} of {n} approved sessions completed within {} s",
                PHASE_GUARD.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
