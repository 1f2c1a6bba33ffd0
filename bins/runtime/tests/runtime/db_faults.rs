//! The daemon with its database stalled under it — PostgreSQL restarted mid-run, the SQLite
//! disk full — while a session waits on an approval and another's call is at the worker: health
//! says NOT_SERVING and calls answer UNAVAILABLE while it cannot write; nothing is lost or
//! half-written; once the database can write again the daemon is SERVING by itself, the
//! approval can be decided, both sessions complete, each call ran once and the audit verifies.
//! The call's result reaches the daemon during the stall.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::{Daemon, Launch, PATIENCE};
use pb::runtime_client::RuntimeClient;
use phrony_proto::runtime::v1 as pb;
use phrony_test_support::private_postgres::{PrivatePostgres, StopMode};
use phrony_test_support::small_fs::SmallFs;
use phrony_test_support::stub::{one_refund_turns, write_refund_agent_named};
use phrony_test_support::worker::RefundWorker;
use serde_json::{Value, json};
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tonic::{Code, Request};
use tonic_health::pb::health_check_response::ServingStatus;

/// The agent whose refund (900, above the boundary of 250) waits for one approval.
const HELD_AGENT: &str = "refund-agent";
/// The agent whose refund (120) is dispatched at once.
const QUICK_AGENT: &str = "quick-refund-agent";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn agent(name: &str) -> pb::AgentRef {
    pb::AgentRef {
        namespace: "support".into(),
        name: name.into(),
        version: String::new(),
    }
}

/// The refund agent on the stub model, named `name`, refunding `amount` for `order_id` and then
/// answering; compiled to the snapshot the CLI would publish.
fn snapshot(dir: &Path, name: &str, order_id: &str, amount: u32) -> Vec<u8> {
    write_refund_agent_named(
        dir,
        name,
        &one_refund_turns(order_id, amount, "The parcel never arrived."),
    );
    let manifest = dir.join("agent.yaml");
    phrony_manifest::load_agent(&manifest)
        .unwrap_or_else(|d| panic!("the outage agent does not compile:\n{d}"))
        .agent
        .snapshot_json()
}

fn as_actor<T>(message: T, actor: &'static str) -> Request<T> {
    let mut request = Request::new(message);
    request
        .metadata_mut()
        .insert("phrony-actor", MetadataValue::from_static(actor));
    request
}

/// Publishes and deploys both agents.
async fn deploy_agents(client: &mut RuntimeClient<Channel>, work: &Path) {
    for (name, order, amount) in [
        (HELD_AGENT, "ORD-HELD", 900),
        (QUICK_AGENT, "ORD-QUICK", 120),
    ] {
        let manifest = snapshot(&work.join(name), name, order, amount);
        client
            .publish(pb::PublishRequest {
                manifest,
                actor: "ci".into(),
            })
            .await
            .unwrap();
        client
            .deploy(pb::DeployRequest {
                agent_ref: Some(pb::AgentRef {
                    version: "0.1.0".into(),
                    ..agent(name)
                }),
                actor: "ci".into(),
                allow_new_secret_endpoints: false,
            })
            .await
            .unwrap();
    }
}

async fn run_session(client: &mut RuntimeClient<Channel>, name: &str) -> String {
    client
        .run_session(as_actor(
            pb::RunSessionRequest {
                agent_ref: Some(agent(name)),
                input: br#"{"request": "Refund my order, please."}"#.to_vec(),
                ..Default::default()
            },
            "bob",
        ))
        .await
        .unwrap()
        .into_inner()
        .session_id
}

async fn status(client: &mut RuntimeClient<Channel>, session_id: &str) -> String {
    client
        .inspect_session(pb::InspectSessionRequest {
            session_id: session_id.into(),
            page_size: 1,
            page_token: String::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .session
        .unwrap()
        .status
}

async fn pending_approvals(
    client: &mut RuntimeClient<Channel>,
    session_id: &str,
) -> Result<Vec<pb::Approval>, tonic::Status> {
    client
        .list_approvals(pb::ListApprovalsRequest {
            status: "pending".into(),
            session_id: session_id.into(),
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner().approvals)
}

/// Polls `probe` until it returns a value; panics naming `what`, with the daemon's log, after
/// [`PATIENCE`].
async fn wait_for<T, F: std::future::Future<Output = Option<T>>>(
    daemon: &Daemon,
    what: &str,
    mut probe: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(found) = probe().await {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; stderr:\n{}",
            daemon.stderr()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The two sessions, started and brought to the state the outage hits: the held one waiting on
/// its approval, the quick one's call executed by the worker with the result held back.
struct Running {
    held: String,
    quick: String,
    approval: pb::Approval,
}

async fn start_sessions(daemon: &Daemon, worker: &RefundWorker) -> Running {
    let mut client = daemon.client().await;
    let held = run_session(&mut client, HELD_AGENT).await;
    let quick = run_session(&mut client, QUICK_AGENT).await;
    let approval = wait_for(daemon, "the held refund's approval", || {
        let mut client = client.clone();
        let held = held.clone();
        async move {
            pending_approvals(&mut client, &held)
                .await
                .unwrap()
                .into_iter()
                .next()
        }
    })
    .await;
    assert_eq!(approval.kind, "policy", "{approval:?}");
    wait_for(daemon, "the quick refund at the worker", || {
        let n = worker.invocations().len();
        async move { (n == 1).then_some(()) }
    })
    .await;
    assert_eq!(worker.invocations()[0]["order_id"], "ORD-QUICK");
    Running {
        held,
        quick,
        approval,
    }
}

/// While the database cannot write: NOT_SERVING, and calls that need it answer UNAVAILABLE (a
/// read and a vote, which must not be recorded).
async fn assert_refused_while_stalled(daemon: &mut Daemon, running: &Running) {
    daemon.wait_for_health(ServingStatus::NotServing).await;
    let mut client = daemon.client().await;
    let vote = client
        .decide_approval(pb::DecideApprovalRequest {
            approval_id: running.approval.id.clone(),
            decision: pb::ApprovalDecision::Approve.into(),
            comment: "during the outage".into(),
            actor: "alice".into(),
            ..Default::default()
        })
        .await
        .expect_err("a vote while the database cannot write");
    assert_eq!(vote.code(), Code::Unavailable, "{vote:?}");
    let run = client
        .run_session(as_actor(
            pb::RunSessionRequest {
                agent_ref: Some(agent(QUICK_AGENT)),
                input: b"{}".to_vec(),
                ..Default::default()
            },
            "bob",
        ))
        .await
        .expect_err("a new session while the database cannot write");
    assert_eq!(run.code(), Code::Unavailable, "{run:?}");
}

/// The ledger's pool acquire timeout: on PostgreSQL a write waits this long for a connection
/// before it fails, so a shorter outage is only a slow write.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// The worker answers the quick refund while the database still cannot write, and the stall
/// goes on for `linger` (long enough for the daemon's attempt to record it to fail — not an
/// assertion): the result must be kept (not acknowledged) until it can be recorded, and
/// recorded once.
fn answer_during_the_stall(worker: &RefundWorker, linger: Duration) {
    worker.release();
    std::thread::sleep(linger);
}

/// Once the database can write again: SERVING by itself, the refused vote left nothing, the
/// approval can be decided, both sessions complete, each refund ran once, the audit verifies.
async fn assert_recovered(daemon: &mut Daemon, running: &Running, worker: &RefundWorker) {
    daemon.wait_for_health(ServingStatus::Serving).await;
    let mut client = daemon.client().await;
    let full = client
        .get_approval(pb::GetApprovalRequest {
            approval_id: running.approval.id.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(full.status, "pending", "{full:?}");
    assert!(
        full.votes.is_empty(),
        "a refused vote was recorded: {full:?}"
    );

    client
        .decide_approval(pb::DecideApprovalRequest {
            approval_id: running.approval.id.clone(),
            decision: pb::ApprovalDecision::Approve.into(),
            comment: "after the outage".into(),
            actor: "alice".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    for session in [&running.held, &running.quick] {
        wait_for(daemon, &format!("session {session} to complete"), || {
            let mut client = client.clone();
            let session = session.clone();
            async move {
                let now = status(&mut client, &session).await;
                assert!(
                    !["failed", "cancelled"].contains(&now.as_str()),
                    "session {session} ended {now}"
                );
                // An outcome review here would mean the runtime lost track of a call.
                let reviews: Vec<pb::Approval> = pending_approvals(&mut client, &session)
                    .await
                    .unwrap()
                    .into_iter()
                    .filter(|a| a.kind == "outcome_review")
                    .collect();
                assert!(
                    reviews.is_empty(),
                    "the outage opened a review: {reviews:?}"
                );
                (now == "completed").then_some(())
            }
        })
        .await;
    }
    let mut orders: Vec<Value> = worker
        .invocations()
        .iter()
        .map(|args| args["order_id"].clone())
        .collect();
    orders.sort_by_key(ToString::to_string);
    assert_eq!(
        orders,
        [json!("ORD-HELD"), json!("ORD-QUICK")],
        "each irreversible refund runs exactly once"
    );
    let verified = client
        .verify_audit(pb::VerifyAuditRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(verified.verified, "{verified:?}");
    assert!(verified.events > 0);
}

#[test]
fn a_postgres_restart_mid_run_is_ridden_out_and_loses_nothing() {
    let Some(mut pg) = PrivatePostgres::start() else {
        return;
    };
    let url = pg.create_database("phrony");
    let rt = runtime();
    let home = tempfile::tempdir().unwrap();
    let launch = Launch::new(home.path(), Some(&url)).env("RUNTIME_ENABLE_STUB_PROVIDER", "1");
    let mut daemon = rt.block_on(launch.start());
    rt.block_on(async {
        let mut client = daemon.client().await;
        deploy_agents(&mut client, home.path()).await;
    });
    let worker = RefundWorker::start_holding(&daemon.addr, "outage-worker");
    let running = rt.block_on(start_sessions(&daemon, &worker));

    // A crash of the server as its clients see it: every connection lost at once.
    pg.stop(StopMode::Immediate);
    rt.block_on(assert_refused_while_stalled(&mut daemon, &running));
    answer_during_the_stall(&worker, ACQUIRE_TIMEOUT + Duration::from_secs(2));
    pg.start_again();
    rt.block_on(assert_recovered(&mut daemon, &running, &worker));
    let log = rt.block_on(daemon.logged("NOT_SERVING"));
    assert!(log.contains("NOT_SERVING"), "{log}");
    drop(worker);
    drop(daemon);
}

#[test]
fn a_full_disk_is_ridden_out_and_nothing_is_half_written() {
    // Larger than the default free-space reserve (RUNTIME_SQLITE_MIN_FREE_BYTES, 32 MiB) by
    // what the daemon's files need: below the reserve no write begins.
    let Some(mut fs) = SmallFs::mount(64) else {
        return;
    };
    let rt = runtime();
    let home = fs.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let work = tempfile::tempdir().unwrap();
    // The default database: $XDG_DATA_HOME/phrony/phrony.db, on the small filesystem.
    let launch = Launch::new(&home, None).env("RUNTIME_ENABLE_STUB_PROVIDER", "1");
    let mut daemon = rt.block_on(launch.start());
    rt.block_on(async {
        let mut client = daemon.client().await;
        deploy_agents(&mut client, work.path()).await;
    });
    let worker = RefundWorker::start_holding(&daemon.addr, "outage-worker");
    let running = rt.block_on(start_sessions(&daemon, &worker));

    let filled = fs.fill();
    assert!(filled > 0, "the filesystem was already full");
    rt.block_on(assert_refused_while_stalled(&mut daemon, &running));
    // The database still opens and reads: the offline audit verifies on the full disk.
    let (status, out) = launch.run(&["audit", "verify", "--all"]);
    assert!(status.success(), "{out}");
    answer_during_the_stall(&worker, Duration::from_secs(2));
    fs.free();
    rt.block_on(assert_recovered(&mut daemon, &running, &worker));
    // The outage was the reserve, named in the health transition's log line.
    let log = rt.block_on(
        daemon.logged("bytes the ledger keeps in reserve (RUNTIME_SQLITE_MIN_FREE_BYTES)"),
    );
    assert!(
        log.contains("bytes the ledger keeps in reserve (RUNTIME_SQLITE_MIN_FREE_BYTES)"),
        "{log}"
    );
    drop(worker);
    assert_eq!(
        rt.block_on(daemon.terminate()).code(),
        Some(0),
        "{}",
        daemon.stderr()
    );

    // Nothing half-written: the file is sound, and the offline audit verifies every chain.
    let db = home.join("xdg").join("phrony").join("phrony.db");
    let (status, out) = launch.run(&["audit", "verify", "--all"]);
    assert!(status.success(), "{out}");
    rt.block_on(async {
        use sqlx::{Connection as _, Row as _};
        let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", db.display()))
            .await
            .unwrap();
        let row = sqlx::query("PRAGMA integrity_check")
            .fetch_one(&mut conn)
            .await
            .unwrap();
        assert_eq!(row.get::<String, _>(0), "ok");
        conn.close().await.unwrap();
    });
}

/// A daemon restarted while its SQLite disk is below the free-space reserve starts, answers
/// NOT_SERVING naming the reserve, and serves by itself once space is freed (it used to exit 1:
/// its start-up audit check ran as an ordinary write).
#[test]
fn a_daemon_restarted_below_the_free_space_reserve_waits_not_serving_then_serves() {
    let Some(mut fs) = SmallFs::mount(64) else {
        return;
    };
    let rt = runtime();
    let home = fs.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let launch = Launch::new(&home, None);
    let mut daemon = rt.block_on(launch.start());
    assert_eq!(rt.block_on(daemon.terminate()).code(), Some(0));

    // 12 MiB free: real space, below the default 32 MiB reserve.
    fs.leave_free(12 * 1024 * 1024);
    let mut daemon = launch.spawn();
    rt.block_on(daemon.wait_for_health(ServingStatus::NotServing));
    let log = rt.block_on(
        daemon.logged("bytes the ledger keeps in reserve (RUNTIME_SQLITE_MIN_FREE_BYTES)"),
    );
    assert!(
        log.contains("bytes the ledger keeps in reserve (RUNTIME_SQLITE_MIN_FREE_BYTES)"),
        "{log}"
    );
    fs.free();
    rt.block_on(daemon.wait_for_health(ServingStatus::Serving));
    assert_eq!(rt.block_on(daemon.terminate()).code(), Some(0));
}

/// PostgreSQL is down when the daemon starts: the daemon does not exit, its port answers health
/// checks with NOT_SERVING while it retries, and once the database is up it migrates and serves
/// by itself; a session then runs to completion.
#[test]
fn a_daemon_started_while_postgres_is_down_waits_not_serving_then_serves() {
    let Some(mut pg) = PrivatePostgres::start() else {
        return;
    };
    let url = pg.create_database("phrony");
    pg.stop(StopMode::Fast);
    let rt = runtime();
    let home = tempfile::tempdir().unwrap();
    let launch = Launch::new(home.path(), Some(&url)).env("RUNTIME_ENABLE_STUB_PROVIDER", "1");
    let mut daemon = launch.spawn();
    rt.block_on(async {
        daemon.wait_for_health(ServingStatus::NotServing).await;
        // Still there a few retries later (wait_for_health fails if the process exited).
        tokio::time::sleep(Duration::from_secs(2)).await;
        daemon.wait_for_health(ServingStatus::NotServing).await;
    });
    let log = rt.block_on(daemon.logged("database unreachable at start-up"));
    assert!(log.contains("database unreachable at start-up"), "{log}");

    pg.start_again();
    rt.block_on(async {
        daemon.wait_for_health(ServingStatus::Serving).await;
        let mut client = daemon.client().await;
        deploy_agents(&mut client, home.path()).await;
    });
    let worker = RefundWorker::start(&daemon.addr, "late-db-worker");
    rt.block_on(async {
        let mut client = daemon.client().await;
        let session = run_session(&mut client, QUICK_AGENT).await;
        wait_for(&daemon, "the session to complete", || {
            let mut client = client.clone();
            let session = session.clone();
            async move { (status(&mut client, &session).await == "completed").then_some(()) }
        })
        .await;
    });
    assert_eq!(worker.invocations().len(), 1);
    drop(worker);
    drop(daemon);
}

/// A database that never comes up: a SIGTERM while the daemon waits is a clean stop (exit 0),
/// and `RUNTIME_DATABASE_START_TIMEOUT` bounds the wait (exit 1 naming the database and the
/// setting). A SQLite file that cannot be opened is not waited for.
#[test]
fn the_start_up_wait_for_the_database_ends_on_sigterm_or_its_timeout() {
    let rt = runtime();
    let home = tempfile::tempdir().unwrap();
    // Nothing listens on a fresh free port.
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/phrony",
        crate::support::free_port()
    );
    let launch = Launch::new(home.path(), Some(&url));
    let mut daemon = launch.spawn();
    rt.block_on(daemon.wait_for_health(ServingStatus::NotServing));
    let status = rt.block_on(daemon.terminate());
    assert!(status.success(), "{status}: {}", daemon.stderr());
    assert!(
        daemon
            .stderr()
            .contains("stopped while waiting for the database"),
        "{}",
        daemon.stderr()
    );

    let started = Instant::now();
    let (status, log) = launch
        .clone()
        .env("RUNTIME_DATABASE_START_TIMEOUT", "2s")
        .run(&[]);
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        log.contains("gave up waiting for the database after 2s"),
        "{log}"
    );
    assert!(log.contains("RUNTIME_DATABASE_START_TIMEOUT"), "{log}");
    assert!(started.elapsed() < PATIENCE, "{log}");

    // Below a regular file: no directory can be made there.
    let file = home.path().join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let unopenable = file.join("ledger.db");
    let sqlite = Launch::new(
        home.path(),
        Some(&format!("sqlite://{}", unopenable.display())),
    );
    let started = Instant::now();
    let (status, log) = sqlite.run(&[]);
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(
        !log.contains("retry"),
        "a SQLite path problem is not waited for: {log}"
    );
    assert!(started.elapsed() < Duration::from_secs(5), "{log}");
}
