//! Several `phrony-runtime` replicas on one PostgreSQL database (issue #20), end to end: real
//! daemons on loopback sharing a test database, the real CLI, the SDK refund worker. A session
//! started on one replica is inspected and decided on the others; the replica driving it is
//! killed with SIGKILL (or paused with SIGSTOP, a partition) while it waits for the approval,
//! another replica takes the session over within the lease, the decision is taken elsewhere,
//! the refund runs once and the audit log verifies.
//!
//! A call is dispatched by the replica driving its session to one of its own workers; when none
//! of them serves the tool and another replica's do, the session is handed to that replica.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers as well as tests: a panic is a failed assertion, with its message"
)]

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tests::cli::{json, ok};
use tests::daemon::{Daemon, Replicas};
use tests::stub::{REFUND_AGENT as AGENT, publish_and_deploy, write_refund_agent};
use tests::worker::RefundWorker;

use crate::sessions::{pending_approvals, refund_turns, start, wait_for, wait_for_status};

/// The session lease of the replicas: short, so a takeover happens within seconds.
const LEASE_TTL: &str = "2s";
/// A takeover must happen within this long after the lease's owner stopped renewing (one TTL
/// for the lease to run out, up to 0.6 TTL for the next scan, and a loaded 2-core machine).
const TAKEOVER_WITHIN: Duration = Duration::from_secs(10);

fn phrony(daemon: &Daemon, actor: &str) -> Command {
    tests::cli::phrony(daemon, actor)
}

/// Three (or `n`) replicas on one fresh PostgreSQL database, each with a refund worker, the
/// refund agent deployed; `None` when PostgreSQL tests are skipped.
struct Cluster {
    // Declared before the daemons: the workers disconnect first.
    workers: Vec<RefundWorker>,
    daemons: Replicas,
    _project: tempfile::TempDir,
}

impl Cluster {
    fn start(n: usize) -> Option<Self> {
        Self::start_with(n, &refund_turns(), None)
    }

    /// [`Cluster::start`] with the agent's script and, when given, the replica whose worker
    /// holds every result back (a call stays in flight there).
    fn start_with(n: usize, turns: &Value, holding: Option<usize>) -> Option<Self> {
        Self::start_serving(n, turns, holding, &(0..n).collect::<Vec<_>>())
    }

    /// [`Cluster::start_with`] with refund workers on the replicas `serving` only.
    fn start_serving(
        n: usize,
        turns: &Value,
        holding: Option<usize>,
        serving: &[usize],
    ) -> Option<Self> {
        let daemons = Replicas::start(
            n,
            &[
                ("RUNTIME_ENABLE_STUB_PROVIDER", "1"),
                ("RUNTIME_SESSION_LEASE_TTL", LEASE_TTL),
                // A driver keeps its session while people decide, so a replica dies
                // mid-approval.
                ("RUNTIME_PARK_APPROVAL_WAITS", "false"),
                ("RUNTIME_RECOVERY_GRACE", "1s"),
            ],
        )?;
        let project = tempfile::tempdir().unwrap();
        write_refund_agent(project.path(), turns);
        publish_and_deploy(daemons.get(0), project.path(), AGENT);
        let mut cluster = Self {
            workers: Vec::new(),
            daemons,
            _project: project,
        };
        for &i in serving {
            let (addr, id) = (cluster.get(i).addr().to_owned(), format!("worker-{i}"));
            cluster.workers.push(if holding == Some(i) {
                RefundWorker::start_holding(&addr, &id)
            } else {
                RefundWorker::start(&addr, &id)
            });
        }
        Some(cluster)
    }

    fn get(&self, i: usize) -> &Daemon {
        self.daemons.get(i)
    }

    fn get_mut(&mut self, i: usize) -> &mut Daemon {
        self.daemons.get_mut(i)
    }

    /// Every refund the workers ran.
    fn refunds(&self) -> Vec<Value> {
        self.workers
            .iter()
            .flat_map(RefundWorker::invocations)
            .collect()
    }

    /// The index of the replica whose log says it took `session` over, waiting up to
    /// [`TAKEOVER_WITHIN`]; returns it and how long it took.
    fn wait_for_takeover(&self, session: &str, skip: usize) -> (usize, Duration) {
        let began = Instant::now();
        loop {
            for i in (0..self.daemons.len()).filter(|i| *i != skip) {
                let logs = self.get(i).logs();
                if logs.lines().any(|l| {
                    l.contains("taking over a session whose lease expired") && l.contains(session)
                }) {
                    return (i, began.elapsed());
                }
            }
            assert!(
                began.elapsed() < TAKEOVER_WITHIN,
                "no replica took {session} over within {TAKEOVER_WITHIN:?}\n{}",
                (0..self.daemons.len())
                    .filter(|i| *i != skip)
                    .map(|i| self.get(i).logs())
                    .collect::<Vec<_>>()
                    .join("\n----\n")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The model's script for a refund of 100 on `order` (no approval needed: dispatched at once),
/// then `answer`.
fn small_refund_turns(order: &str, answer: &str) -> Value {
    json!([
        [
            {"type": "tool_call", "name": "issue_refund",
             "args": {"order_id": order, "amount": 100, "currency": "EUR",
                      "reason": "Late delivery."}},
            {"type": "completed", "stop_reason": "tool_use"}
        ],
        [
            {"type": "text_delta", "text": answer},
            {"type": "completed", "stop_reason": "end_turn"}
        ]
    ])
}

/// Starts the refund session on `daemon` and waits until its approval is listed on `other`.
fn start_refund(daemon: &Daemon, other: &Daemon) -> (String, String) {
    let session = start(phrony(daemon, "emad").args([
        "run",
        AGENT,
        "--input",
        "Refund €400 for ORD-1, the item arrived damaged.",
    ]));
    let approval = wait_for(other, &format!("an approval of {session}"), || {
        pending_approvals(other, &session).first().cloned()
    });
    (session, approval["id"].as_str().unwrap().to_owned())
}

fn approve(daemon: &Daemon, approval: &str) {
    let decided = ok(phrony(daemon, "finance-lead").args([
        "approvals",
        "approve",
        approval,
        "--comment",
        "checked",
    ]));
    assert!(decided.starts_with("status: approved\n"), "{decided}");
}

/// The session's timeline types from `sessions inspect --output json` on `daemon`.
fn timeline_types(daemon: &Daemon, session: &str) -> Vec<String> {
    let inspected = json(&ok(
        phrony(daemon, "ci").args(["sessions", "inspect", session, "--output", "json"])
    ));
    inspected["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["event"]["type"].as_str().map(str::to_owned))
        .collect()
}

/// Each of `kinds` occurs exactly once in the timeline `types`.
#[track_caller]
fn assert_once(types: &[String], kinds: &[&str]) {
    for kind in kinds {
        assert_eq!(
            types.iter().filter(|t| t == kind).count(),
            1,
            "{kind} in {types:?}"
        );
    }
}

fn verify_audit(daemon: &Daemon) {
    let verified = ok(phrony(daemon, "ci-auditor").args(["audit", "verify", "--all"]));
    assert!(verified.starts_with("verified "), "{verified}");
}

#[test]
fn replicas_serve_any_session_and_take_over_a_killed_replicas_session() {
    let Some(mut cluster) = Cluster::start(3) else {
        return;
    };
    // Started on replica 1; its approval is listed on replica 2 and the session inspected on
    // replica 0 while replica 1 drives it.
    let (session, approval) = start_refund(cluster.get(1), cluster.get(2));
    wait_for_status(cluster.get(0), &session, "awaiting_approval");
    assert!(cluster.refunds().is_empty(), "dispatched before approval");

    // Replica 1 dies mid-approval: another replica takes the session over within the lease.
    cluster.get_mut(1).kill9();
    let (taker, took) = cluster.wait_for_takeover(&session, 1);
    eprintln!("takeover by replica {taker} after {took:?}");
    // Decided on the replica that does not drive it.
    let decider = if taker == 2 { 0 } else { 2 };
    approve(cluster.get(decider), &approval);
    wait_for_status(cluster.get(decider), &session, "completed");
    let refunds = cluster.refunds();
    assert_eq!(refunds.len(), 1, "the refund ran once: {refunds:?}");
    assert_eq!(refunds[0]["amount"], 400);
    // One decision, one dispatch, one result in the log, whoever recorded them.
    let types = timeline_types(cluster.get(0), &session);
    assert_once(
        &types,
        &[
            "approval.decided",
            "tool.dispatched",
            "tool.completed",
            "session.completed",
        ],
    );
    verify_audit(cluster.get(taker));
    verify_audit(cluster.get(decider));
}

#[test]
fn a_paused_replica_stops_driving_and_its_session_goes_on_elsewhere() {
    let Some(cluster) = Cluster::start(2) else {
        return;
    };
    let (session, approval) = start_refund(cluster.get(1), cluster.get(0));
    // Replica 1 is cut off (SIGSTOP) past its lease: replica 0 takes the session over.
    cluster.get(1).pause(true);
    let (taker, _) = cluster.wait_for_takeover(&session, 1);
    assert_eq!(taker, 0);
    approve(cluster.get(0), &approval);
    wait_for_status(cluster.get(0), &session, "completed");
    // Replica 1 comes back: its renewal finds the lease lost (or its driver's next write is
    // refused by the fence) and its driver stops; nothing it does afterwards reaches the
    // session.
    cluster.get(1).pause(false);
    wait_for(cluster.get(1), "replica 1 to notice its lost lease", || {
        cluster
            .get(1)
            .logs()
            .contains("session lease lost")
            .then_some(())
    });
    std::thread::sleep(Duration::from_millis(500));
    let refunds = cluster.refunds();
    assert_eq!(refunds.len(), 1, "the refund ran once: {refunds:?}");
    let types = timeline_types(cluster.get(1), &session);
    assert_eq!(
        types.iter().filter(|t| *t == "approval.decided").count(),
        1,
        "{types:?}"
    );
    assert_eq!(
        types.iter().filter(|t| *t == "session.completed").count(),
        1,
        "{types:?}"
    );
    verify_audit(cluster.get(1));
    assert_eq!(
        ok(phrony(cluster.get(1), "ci").args(["sessions", "ls"]))
            .lines()
            .filter(|l| l.contains(&session))
            .count(),
        1
    );
}

#[test]
fn a_call_in_flight_on_a_killed_replica_goes_to_review_and_is_never_sent_again() {
    // A refund of 100 needs no approval: it is dispatched at once, to the only worker of the
    // replica driving the session, which keeps the result.
    let turns = small_refund_turns(
        "ORD-2",
        "The refund's outcome is unknown; a person checks it.",
    );
    let Some(mut cluster) = Cluster::start_with(3, &turns, Some(1)) else {
        return;
    };
    let session = start(phrony(cluster.get(1), "emad").args([
        "run",
        AGENT,
        "--input",
        "Refund €100 for ORD-2, it came late.",
    ]));
    wait_for(
        cluster.get(1),
        "the refund to reach replica 1's worker",
        || (!cluster.refunds().is_empty()).then_some(()),
    );
    // Replica 1 dies mid-dispatch: the call's outcome is unknown to everybody else.
    cluster.get_mut(1).kill9();
    let (taker, _) = cluster.wait_for_takeover(&session, 1);
    let decider = if taker == 2 { 0 } else { 2 };
    // The irreversible refund is not sent again: an outcome review waits for a person.
    let review = wait_for(cluster.get(decider), "an outcome review", || {
        pending_approvals(cluster.get(decider), &session)
            .into_iter()
            .find(|a| a["kind"] == "outcome_review")
    });
    let review = review["id"].as_str().unwrap().to_owned();
    let resolved = ok(phrony(cluster.get(decider), "finance-lead").args([
        "approvals",
        "resolve",
        &review,
        "--fail",
    ]));
    assert!(resolved.contains("status: "), "{resolved}");
    wait_for_status(cluster.get(decider), &session, "completed");
    let refunds = cluster.refunds();
    assert_eq!(refunds.len(), 1, "never re-sent: {refunds:?}");
    let types = timeline_types(cluster.get(0), &session);
    assert_eq!(
        types.iter().filter(|t| *t == "tool.dispatched").count(),
        1,
        "{types:?}"
    );
    verify_audit(cluster.get(taker));
}

#[test]
fn a_worker_on_one_replica_serves_the_sessions_another_replica_drives() {
    // A refund of 100 needs no approval: it is dispatched at once.
    let turns = small_refund_turns("ORD-3", "Refunded.");
    // The only worker is connected to replica 0.
    let Some(cluster) = Cluster::start_serving(2, &turns, None, &[0]) else {
        return;
    };
    // Replica 0 publishes what its worker serves with its lease renewals (every third of the
    // TTL).
    std::thread::sleep(Duration::from_millis(1500));
    let began = Instant::now();
    let session = start(phrony(cluster.get(1), "emad").args([
        "run",
        AGENT,
        "--input",
        "Refund €100 for ORD-3, it arrived late.",
    ]));
    wait_for_status(cluster.get(1), &session, "completed");
    eprintln!("completed through a handoff in {:?}", began.elapsed());
    let refunds = cluster.refunds();
    assert_eq!(refunds.len(), 1, "the refund ran once: {refunds:?}");
    assert_eq!(refunds[0]["amount"], 100);
    let handed = |i: usize, text: &str| {
        cluster
            .get(i)
            .logs()
            .lines()
            .any(|l| l.contains(text) && l.contains(&session))
    };
    assert!(
        handed(1, "session handed off"),
        "replica 1 handed it off:\n{}",
        cluster.get(1).logs()
    );
    assert!(
        handed(0, "taking a session handed to this replica"),
        "replica 0 took it:\n{}",
        cluster.get(0).logs()
    );
    let types = timeline_types(cluster.get(1), &session);
    assert_once(
        &types,
        &[
            "tool.queued",
            "tool.dispatched",
            "tool.completed",
            "session.completed",
        ],
    );
    verify_audit(cluster.get(0));
    verify_audit(cluster.get(1));
}

#[test]
fn a_restarted_replica_leaves_a_session_to_its_driver_whose_decision_it_takes_and_wakes_it() {
    let Some(mut cluster) = Cluster::start(2) else {
        return;
    };
    // Driven by replica 1 (it keeps its driver while people decide), decided on replica 0.
    let (session, approval) = start_refund(cluster.get(1), cluster.get(0));
    wait_for_status(cluster.get(0), &session, "awaiting_approval");
    // Replica 0 restarts meanwhile: its recovery leaves the session to replica 1.
    assert!(cluster.get_mut(0).stop().is_some_and(|s| s.success()));
    cluster.get_mut(0).restart();
    let logs = cluster.get(0).logs();
    assert!(
        logs.lines()
            .any(|l| l.contains("recovered the sessions") && l.contains("driven_elsewhere=1")),
        "replica 0 left the session to replica 1:\n{logs}"
    );
    let began = Instant::now();
    approve(cluster.get(0), &approval);
    wait_for_status(cluster.get(1), &session, "completed");
    // Without the announcement the driver would see the decision at its safety-net re-read
    // (ten poll intervals, 20 s).
    eprintln!(
        "completed {:?} after the decision on the other replica",
        began.elapsed()
    );
    assert!(
        cluster.get(1).logs().lines().any(|l| {
            l.contains("a change recorded on another replica wakes the session's driver")
                && l.contains(&session)
        }),
        "replica 1 was woken:\n{}",
        cluster.get(1).logs()
    );
    let refunds = cluster.refunds();
    assert_eq!(refunds.len(), 1, "the refund ran once: {refunds:?}");
    let types = timeline_types(cluster.get(0), &session);
    assert_once(
        &types,
        &[
            "approval.decided",
            "tool.dispatched",
            "tool.completed",
            "session.completed",
        ],
    );
    verify_audit(cluster.get(0));
}

/// The scenario: three daemons on one database, the only worker on one, the session
/// started on another, its approval decided on the third; then the replica driving a second
/// session dies mid-approval, and that session too is decided elsewhere and served by the one
/// worker. Each refund runs once and the audit verifies.
#[test]
fn a_worker_on_one_replica_a_session_started_on_another_decided_on_the_third() {
    let Some(mut cluster) = Cluster::start_serving(3, &refund_turns(), None, &[0]) else {
        return;
    };
    std::thread::sleep(Duration::from_millis(1500));
    let (first, approval) = start_refund(cluster.get(1), cluster.get(2));
    approve(cluster.get(2), &approval);
    wait_for_status(cluster.get(2), &first, "completed");
    assert_eq!(cluster.refunds().len(), 1, "{:?}", cluster.refunds());

    // A second session, driven by replica 1, which dies while the approval is pending.
    let (second, approval) = start_refund(cluster.get(1), cluster.get(0));
    wait_for_status(cluster.get(0), &second, "awaiting_approval");
    cluster.get_mut(1).kill9();
    let (taker, took) = cluster.wait_for_takeover(&second, 1);
    eprintln!("takeover by replica {taker} after {took:?}");
    let decider = if taker == 2 { 0 } else { 2 };
    approve(cluster.get(decider), &approval);
    wait_for_status(cluster.get(decider), &second, "completed");
    let refunds = cluster.refunds();
    assert_eq!(refunds.len(), 2, "each refund ran once: {refunds:?}");
    for session in [&first, &second] {
        let types = timeline_types(cluster.get(0), session);
        assert_once(
            &types,
            &[
                "approval.decided",
                "tool.dispatched",
                "tool.completed",
                "session.completed",
            ],
        );
    }
    verify_audit(cluster.get(0));
    verify_audit(cluster.get(2));
}

/// Attach (what the CLI's `sessions attach` and the TUI are built on) works against a replica
/// that does not drive the session: it shows the pending approval, takes the decision and
/// follows the session to its end while another replica drives it.
#[test]
fn attach_on_a_replica_that_does_not_drive_the_session_decides_and_follows_it() {
    use phrony_client::Client;
    use phrony_client::interactive::{ApprovalStatus, Decision, SessionEvent};

    async fn next_event(
        events: &mut phrony_client::interactive::InteractiveEvents,
    ) -> SessionEvent {
        tokio::time::timeout(Duration::from_secs(60), events.next())
            .await
            .expect("an event in time")
            .unwrap()
            .expect("the stream stays open")
    }

    let Some(cluster) = Cluster::start(2) else {
        return;
    };
    // Driven by replica 1; attached on replica 0.
    let (session, _) = start_refund(cluster.get(1), cluster.get(0));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = Client::connect(cluster.get(0).addr()).await.unwrap();
        let attached = client.attach(&session, "finance-lead").await.unwrap();
        let (sender, mut events) = attached.split();
        let approval = loop {
            match next_event(&mut events).await {
                SessionEvent::ApprovalRequired(approval) => break approval,
                SessionEvent::Failed { message } => panic!("failed: {message}"),
                _ => {}
            }
        };
        assert_eq!(approval.tool, "payments.issue-refund");
        sender
            .decide(
                Decision::approve()
                    .for_approval(approval.approval_id.clone())
                    .with_comment("checked on replica 0"),
            )
            .await
            .unwrap();
        let (mut decided, mut result) = (None, None);
        loop {
            match next_event(&mut events).await {
                SessionEvent::ApprovalDecided(d) => decided = Some(d),
                SessionEvent::ToolResult(r) => result = Some(r),
                SessionEvent::Completed(_) => break,
                SessionEvent::Failed { message } => panic!("failed: {message}"),
                _ => {}
            }
        }
        let decided = decided.expect("the decision is on the stream");
        assert_eq!(decided.status, ApprovalStatus::Approved);
        assert_eq!(decided.decided_by, "finance-lead");
        assert_eq!(
            result.expect("the tool result is on the stream").call_id,
            approval.call_id
        );
    });
    let refunds = cluster.refunds();
    assert_eq!(refunds.len(), 1, "the refund ran once: {refunds:?}");
    verify_audit(cluster.get(0));
}

/// A user message sent on a stream attached to a replica that does not drive the conversation
/// is queued for the driving replica (announced by NOTIFY), which records it and answers it:
/// the answer streams back to the client on the other replica, and the message is in the
/// session's log once, by its sender.
#[test]
fn a_user_message_sent_to_a_replica_that_does_not_drive_the_conversation_is_answered() {
    use phrony_client::Client;
    use phrony_client::interactive::SessionEvent;

    let turns = json!([
        [
            {"type": "text_delta", "text": "Hello, how can I help?"},
            {"type": "completed", "stop_reason": "end_turn"}
        ],
        [
            {"type": "text_delta", "text": "Your refund is on its way."},
            {"type": "completed", "stop_reason": "end_turn"}
        ]
    ]);
    let Some(cluster) = Cluster::start_with(2, &turns, None) else {
        return;
    };
    // Driven by replica 1; the client talks to replica 0.
    let started = json(&ok(phrony(cluster.get(1), "emad").args([
        "run",
        AGENT,
        "--conversation",
        "--input",
        "hi",
        "--output",
        "json",
    ])));
    let session = started["session_id"].as_str().unwrap().to_owned();
    wait_for_status(cluster.get(0), &session, "awaiting_input");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let answered_in = rt.block_on(async {
        let client = Client::connect(cluster.get(0).addr()).await.unwrap();
        let attached = client.attach(&session, "emad").await.unwrap();
        let (sender, mut events) = attached.split();
        let sent = Instant::now();
        sender
            .send_user_message("Where is my refund?")
            .await
            .unwrap();
        let mut text = String::new();
        loop {
            let event = tokio::time::timeout(Duration::from_secs(60), events.next())
                .await
                .expect("an event in time")
                .unwrap()
                .expect("the stream stays open");
            match event {
                SessionEvent::TextDelta(delta) => text.push_str(&delta),
                SessionEvent::AwaitingInput(_) if text.contains("on its way") => {
                    break sent.elapsed();
                }
                SessionEvent::Failed { message } => panic!("failed: {message}"),
                SessionEvent::Status(status) if status.reason.is_some() => {
                    panic!("the message was refused: {status:?}")
                }
                _ => {}
            }
        }
    });
    eprintln!("a message sent to the other replica answered in {answered_in:?}");
    let timeline =
        json(&ok(phrony(cluster.get(0), "ci")
            .args(["sessions", "inspect", &session, "--output", "json"])));
    let users: Vec<(String, String)> = timeline["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| &e["event"])
        .filter(|e| e["type"] == "message.user")
        .map(|e| {
            (
                e["actor"].as_str().unwrap_or_default().to_owned(),
                e["payload"]["content"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect();
    assert_eq!(users.len(), 2, "{timeline}");
    assert_eq!(users[1].1, "Where is my refund?", "{timeline}");
    assert!(users[1].0.starts_with("emad"), "{timeline}");
    verify_audit(cluster.get(0));
}
