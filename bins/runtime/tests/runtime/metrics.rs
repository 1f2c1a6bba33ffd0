//! The daemon's HTTP listener (`RUNTIME_HTTP_ADDR`) on the real binary: the probes, the
//! Prometheus metrics after one governed session (stub model, the Rust refund worker), the
//! readiness probe during a database outage (another process holds the SQLite write lock), the
//! token `/metrics` needs in `required` mode, the refusal of a non-loopback address in `local`
//! mode, and the counters of a policy denial and of a failed model call.

use std::time::Duration;

use crate::support::{Launch, agent_ref, authed, free_port, sqlite_url};
use pb::runtime_client::RuntimeClient;
use phrony_proto::runtime::v1 as pb;
use phrony_test_support::stub::{one_refund_turns, write_refund_agent_named};
use phrony_test_support::worker::RefundWorker;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;

/// `GET path` on `addr` (HTTP/1.1, `Connection: close`): the status code and the body.
pub(crate) async fn get(addr: &str, path: &str, bearer: Option<&str>) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let auth = bearer.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = Vec::new();
    stream.read_to_end(&mut response).await.unwrap();
    let response = String::from_utf8(response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {head:?}"));
    (status, body.to_owned())
}

/// The value of the sample `series` (name with its labels, as exported).
fn sample(samples: &[(String, f64)], series: &str, body: &str) -> f64 {
    samples
        .iter()
        .find(|(s, _)| s == series)
        .map(|(_, v)| *v)
        .unwrap_or_else(|| panic!("no {series} in\n{body}"))
}

async fn scrape(addr: &str, bearer: Option<&str>) -> (Vec<(String, f64)>, String) {
    let (status, body) = get(addr, "/metrics", bearer).await;
    assert_eq!(status, 200, "{body}");
    let samples = phrony_runtime::http::parse_exposition(&body)
        .unwrap_or_else(|e| panic!("the exposition does not parse: {e}\n{body}"));
    (samples, body)
}

/// Publishes and deploys `support/<name>` refunding `amount` EUR (over 250 waits for an
/// approval), with `bearer` (a publisher's token) in `required` auth mode.
pub(crate) async fn publish_refund_agent(
    client: &mut RuntimeClient<Channel>,
    home: &std::path::Path,
    name: &str,
    amount: u32,
    bearer: Option<&str>,
) {
    let project = home.join(name);
    write_refund_agent_named(
        &project,
        name,
        &one_refund_turns("ORD-1", amount, "The item arrived damaged."),
    );
    publish_project(client, &project, name, bearer).await;
}

/// Publishes and deploys the agent project in `project` as `support/<name>@0.1.0`, with `bearer`
/// (a publisher's token) in `required` auth mode.
async fn publish_project(
    client: &mut RuntimeClient<Channel>,
    project: &std::path::Path,
    name: &str,
    bearer: Option<&str>,
) {
    let snapshot = phrony_manifest::load_agent(project.join("agent.yaml"))
        .unwrap_or_else(|d| panic!("{name} does not compile:\n{d}"))
        .agent
        .snapshot_json();
    // With a token the recorded actor is the token's name: the request names nobody.
    let actor = if bearer.is_some() { "" } else { "alice" };
    client
        .publish(authed(
            pb::PublishRequest {
                manifest: snapshot,
                actor: actor.into(),
            },
            bearer,
        ))
        .await
        .unwrap();
    client
        .deploy(authed(
            pb::DeployRequest {
                agent_ref: Some(pb::AgentRef {
                    name: name.into(),
                    ..agent_ref("0.1.0")
                }),
                actor: actor.into(),
                allow_new_secret_endpoints: false,
            },
            bearer,
        ))
        .await
        .unwrap();
}

/// Starts a session of `support/<agent>` with `message` as its input; returns its id.
pub(crate) async fn run_refund(
    client: &mut RuntimeClient<Channel>,
    agent: &str,
    message: &str,
) -> String {
    client
        .run_session(pb::RunSessionRequest {
            agent_ref: Some(pb::AgentRef {
                name: agent.into(),
                ..agent_ref("")
            }),
            input: serde_json::json!({ "message": message })
                .to_string()
                .into_bytes(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .session_id
}

/// Waits until session `id` is `want` (listing sessions with `bearer`, if given).
pub(crate) async fn wait_for_status(
    client: &mut RuntimeClient<Channel>,
    id: &str,
    want: &str,
    bearer: Option<&str>,
) {
    let mut last = String::new();
    for _ in 0..300 {
        let sessions = client
            .list_sessions(authed(pb::ListSessionsRequest::default(), bearer))
            .await
            .unwrap()
            .into_inner()
            .sessions;
        last = sessions
            .into_iter()
            .find(|s| s.id == id)
            .map(|s| s.status)
            .unwrap_or_default();
        if last == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("session {id} is {last:?}, not {want:?}");
}

/// Decides the session's (first) pending approval as `emad`.
pub(crate) async fn decide_pending(
    client: &mut RuntimeClient<Channel>,
    session_id: &str,
    decision: pb::ApprovalDecision,
    comment: &str,
) {
    let approval_id = client
        .list_approvals(pb::ListApprovalsRequest {
            session_id: session_id.to_owned(),
            status: "pending".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .approvals[0]
        .id
        .clone();
    client
        .decide_approval(pb::DecideApprovalRequest {
            approval_id,
            decision: decision.into(),
            comment: comment.into(),
            actor: "emad".into(),
            ..Default::default()
        })
        .await
        .unwrap();
}

pub(crate) async fn wait_for_ready(http: &str, want: u16) -> String {
    let mut last = (0, String::new());
    for _ in 0..300 {
        last = get(http, "/readyz", None).await;
        if last.0 == want {
            return last.1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("/readyz stayed {} ({:?}), not {want}", last.0, last.1);
}

#[tokio::test]
async fn probes_and_metrics_follow_a_governed_session_and_a_database_outage() {
    let home = tempfile::tempdir().unwrap();
    let url = sqlite_url(home.path());
    let db_file = home.path().join("ledger.db");
    let http = format!("127.0.0.1:{}", free_port());
    let daemon = Launch::new(home.path(), Some(&url))
        .env("RUNTIME_ENABLE_STUB_PROVIDER", "1")
        .env("RUNTIME_SQLITE_BUSY_TIMEOUT", "500ms")
        .env("RUNTIME_HTTP_ADDR", &http)
        .start()
        .await;
    let mut daemon = daemon;
    assert_eq!(get(&http, "/healthz", None).await, (200, "ok\n".to_owned()));
    assert_eq!(wait_for_ready(&http, 200).await, "ready\n");

    let mut client = daemon.client().await;
    // 40 EUR: under the approval boundary, so policy allows the call.
    publish_refund_agent(&mut client, home.path(), "refund-agent", 40, None).await;
    let worker = RefundWorker::start(&daemon.addr, "metrics-worker");
    let session_id = run_refund(
        &mut client,
        "refund-agent",
        "Refund 40 EUR for ORD-1, the item arrived damaged.",
    )
    .await;
    wait_for_status(&mut client, &session_id, "completed", None).await;

    let (samples, body) = scrape(&http, None).await;
    let value = |series: &str| sample(&samples, series, &body);
    assert_eq!(value("phrony_tool_calls_total{decision=\"allow\"}"), 1.0);
    assert_eq!(value("phrony_tool_calls_total{decision=\"deny\"}"), 0.0);
    assert_eq!(
        value("phrony_tool_call_outcomes_total{outcome=\"succeeded\"}"),
        1.0
    );
    assert_eq!(value("phrony_sessions{status=\"completed\"}"), 1.0);
    assert_eq!(value("phrony_sessions{status=\"running\"}"), 0.0);
    assert_eq!(value("phrony_approvals_pending"), 0.0);
    assert_eq!(value("phrony_policy_evaluation_seconds_count"), 1.0);
    assert_eq!(value("phrony_dispatch_queue_wait_seconds_count"), 1.0);
    assert!(value("phrony_model_call_seconds_count") >= 2.0, "{body}");
    assert_eq!(value("phrony_model_errors_total"), 0.0);
    assert!(value("phrony_ledger_commit_seconds_count") >= 1.0, "{body}");
    for series in [
        "phrony_ledger_write_wait_seconds_count",
        "phrony_ledger_write_hold_seconds_count",
        "phrony_ledger_batch_seconds_count",
        "phrony_ledger_checkpoint_seconds_count",
    ] {
        assert!(value(series) >= 1.0, "{series}: {body}");
    }
    // Every write ran statements, each inside its hold of the writer.
    assert!(
        value("phrony_ledger_write_statement_seconds_count")
            >= value("phrony_ledger_write_hold_seconds_count"),
        "{body}"
    );
    assert!(
        value("phrony_ledger_write_statement_seconds_sum")
            <= value("phrony_ledger_write_hold_seconds_sum"),
        "{body}"
    );
    // Each write was handed the writer and handed it back, both waits inside its hold.
    assert!(
        value("phrony_ledger_write_handoff_seconds_count")
            >= 2.0 * value("phrony_ledger_write_hold_seconds_count"),
        "{body}"
    );
    assert!(
        value("phrony_ledger_write_handoff_seconds_sum")
            <= value("phrony_ledger_write_hold_seconds_sum"),
        "{body}"
    );
    assert_eq!(value("phrony_dispatch_queue_depth"), 0.0);
    assert!(
        samples.iter().any(|(s, v)| s
            == "phrony_workers_connected{tool=\"payments.issue-refund@1.0.0\"}"
            && *v == 1.0),
        "{body}"
    );
    // No label value comes from the session: not its id, input or the worker's id.
    for secret in [session_id.as_str(), "ORD-1", "metrics-worker", "alice"] {
        assert!(!body.contains(secret), "{secret} leaked into\n{body}");
    }

    // A call over the boundary waits for an approval, then is approved.
    publish_refund_agent(&mut client, home.path(), "refund-big", 400, None).await;
    let big = run_refund(&mut client, "refund-big", "Refund 400 EUR for ORD-1.").await;
    wait_for_status(&mut client, &big, "awaiting_approval", None).await;
    let (samples, body) = scrape(&http, None).await;
    let value = |series: &str| sample(&samples, series, &body);
    assert_eq!(value("phrony_tool_calls_total{decision=\"approval\"}"), 1.0);
    assert_eq!(value("phrony_approvals_pending"), 1.0);
    assert_eq!(value("phrony_sessions{status=\"awaiting_approval\"}"), 1.0);
    decide_pending(&mut client, &big, pb::ApprovalDecision::Approve, "ok").await;
    wait_for_status(&mut client, &big, "completed", None).await;
    let (samples, body) = scrape(&http, None).await;
    let value = |series: &str| sample(&samples, series, &body);
    assert_eq!(
        value("phrony_approvals_decided_total{decision=\"approved\"}"),
        1.0
    );
    assert_eq!(value("phrony_approvals_expired_total"), 0.0);
    assert_eq!(value("phrony_approval_wait_seconds_count"), 1.0);
    assert_eq!(value("phrony_approvals_pending"), 0.0);
    assert_eq!(
        value("phrony_tool_call_outcomes_total{outcome=\"succeeded\"}"),
        2.0
    );
    assert_eq!(value("phrony_sessions{status=\"completed\"}"), 2.0);
    assert!(!body.contains(&big), "the session id is no label");

    // A rejected call is counted as rejected and never runs; the model hears of it and the
    // session completes.
    let rejected = run_refund(&mut client, "refund-big", "Refund 400 EUR for ORD-1 again.").await;
    wait_for_status(&mut client, &rejected, "awaiting_approval", None).await;
    decide_pending(
        &mut client,
        &rejected,
        pb::ApprovalDecision::Reject,
        "not this one",
    )
    .await;
    wait_for_status(&mut client, &rejected, "completed", None).await;
    let (samples, body) = scrape(&http, None).await;
    let value = |series: &str| sample(&samples, series, &body);
    assert_eq!(
        value("phrony_approvals_decided_total{decision=\"rejected\"}"),
        1.0
    );
    assert_eq!(
        value("phrony_approvals_decided_total{decision=\"approved\"}"),
        1.0
    );
    assert_eq!(value("phrony_tool_calls_total{decision=\"approval\"}"), 2.0);
    assert_eq!(value("phrony_approval_wait_seconds_count"), 2.0);
    assert_eq!(value("phrony_approvals_pending"), 0.0);
    assert_eq!(value("phrony_sessions{status=\"completed\"}"), 3.0);

    // Another process holds the write lock: not ready, naming the database; then ready again.
    let lock = crate::outage::Locker::hold(&db_file);
    daemon.wait_for_health(ServingStatus::NotServing).await;
    let reason = wait_for_ready(&http, 503).await;
    assert!(reason.contains("database"), "{reason}");
    assert_eq!(get(&http, "/healthz", None).await.0, 200, "alive all along");
    lock.release();
    daemon.wait_for_health(ServingStatus::Serving).await;
    wait_for_ready(&http, 200).await;

    assert_eq!(worker.invocations().len(), 2, "each refund ran once");
    crate::support::stop_worker(worker).await;
    let status = daemon.terminate().await;
    assert!(status.success(), "{status}\n{}", daemon.stderr());
    assert!(
        tokio::net::TcpStream::connect(&http).await.is_err(),
        "the HTTP listener stops with the daemon"
    );
}

#[tokio::test]
async fn metrics_need_a_read_token_in_required_mode_and_probes_do_not() {
    let home = tempfile::tempdir().unwrap();
    let url = sqlite_url(home.path());
    let http = format!("127.0.0.1:{}", free_port());
    let launch = Launch::new(home.path(), Some(&url))
        .env("RUNTIME_AUTH", "required")
        .env("RUNTIME_HTTP_ADDR", &http);
    let viewer = launch.token("scraper", "viewer");
    let worker = launch.token("a-worker", "worker");
    let mut daemon = launch.start().await;

    assert_eq!(get(&http, "/healthz", None).await.0, 200);
    assert_eq!(wait_for_ready(&http, 200).await, "ready\n");

    let (status, body) = get(&http, "/metrics", None).await;
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("no credential"), "{body}");
    let forged = "phr_AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA";
    let (status, body) = get(&http, "/metrics", Some(forged)).await;
    assert_eq!(status, 401, "{body}");
    assert!(!body.contains(forged), "the token is never echoed: {body}");
    let (status, body) = get(&http, "/metrics", Some(&worker)).await;
    assert_eq!(status, 403, "a worker token has no read permission: {body}");
    let (samples, body) = scrape(&http, Some(&viewer)).await;
    assert_eq!(sample(&samples, "phrony_approvals_pending", &body), 0.0);
    assert!(
        !daemon.stderr().contains(&viewer),
        "the token is never logged"
    );

    let status = daemon.terminate().await;
    assert!(status.success(), "{status}\n{}", daemon.stderr());
}

#[tokio::test]
async fn a_non_loopback_http_address_is_refused_in_local_mode() {
    let home = tempfile::tempdir().unwrap();
    let url = sqlite_url(home.path());
    let (status, stderr) = Launch::new(home.path(), Some(&url))
        .env("RUNTIME_AUTH", "local")
        .env("RUNTIME_HTTP_ADDR", &format!("0.0.0.0:{}", free_port()))
        .run(&[]);
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("RUNTIME_HTTP_ADDR"), "{stderr}");
    assert!(stderr.contains("RUNTIME_AUTH=required"), "{stderr}");
    assert!(
        !home.path().join("ledger.db").exists(),
        "refused before the database is touched"
    );
}

#[tokio::test]
async fn while_waiting_for_the_database_the_daemon_is_alive_but_not_ready() {
    let home = tempfile::tempdir().unwrap();
    // Nobody listens there: the daemon waits for PostgreSQL at start-up.
    let url = format!("postgres://postgres@127.0.0.1:{}/postgres", free_port());
    let http = format!("127.0.0.1:{}", free_port());
    let mut daemon = Launch::new(home.path(), Some(&url))
        .env("RUNTIME_DATABASE_START_TIMEOUT", "60s")
        .env("RUNTIME_HTTP_ADDR", &http)
        .spawn();
    let mut alive = false;
    for _ in 0..300 {
        if tokio::net::TcpStream::connect(&http).await.is_ok() {
            alive = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(alive, "no HTTP listener:\n{}", daemon.stderr());
    assert_eq!(get(&http, "/healthz", None).await, (200, "ok\n".to_owned()));
    let (status, body) = get(&http, "/readyz", None).await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("starting"), "{body}");
    assert_eq!(get(&http, "/metrics", None).await.0, 503);
    let status = daemon.terminate().await;
    assert!(status.success(), "{status}\n{}", daemon.stderr());
}

/// Publishes and deploys `support/<name>` with the stub `turns`; `hard_limit` adds the
/// tutorial's `refund-hard-limit` policy (a refund above 5000 is denied).
async fn publish_scripted_agent(
    client: &mut RuntimeClient<Channel>,
    home: &std::path::Path,
    name: &str,
    turns: &serde_json::Value,
    hard_limit: bool,
) {
    let project = home.join(name);
    write_refund_agent_named(&project, name, turns);
    if hard_limit {
        let policy = "policies/refund-hard-limit.yaml";
        std::fs::copy(
            phrony_test_support::examples_dir()
                .join("refund-agent")
                .join(policy),
            project.join(policy),
        )
        .unwrap();
        let manifest = project.join("agent.yaml");
        let yaml = std::fs::read_to_string(&manifest).unwrap().replacen(
            "        - ref: policies/refund-approval-boundary.yaml\n",
            &format!(
                "        - ref: policies/refund-approval-boundary.yaml\n        - ref: {policy}\n"
            ),
            1,
        );
        assert!(yaml.contains(policy), "{yaml}");
        std::fs::write(&manifest, yaml).unwrap();
    }
    publish_project(client, &project, name, None).await;
}

#[tokio::test]
async fn a_policy_denial_and_a_failed_model_call_are_counted() {
    let home = tempfile::tempdir().unwrap();
    let url = sqlite_url(home.path());
    let http = format!("127.0.0.1:{}", free_port());
    let mut daemon = Launch::new(home.path(), Some(&url))
        .env("RUNTIME_ENABLE_STUB_PROVIDER", "1")
        .env("RUNTIME_HTTP_ADDR", &http)
        .start()
        .await;
    wait_for_ready(&http, 200).await;
    let mut client = daemon.client().await;

    // 9000 EUR: over the hard limit, denied by policy without reaching a worker.
    publish_scripted_agent(
        &mut client,
        home.path(),
        "refund-huge",
        &one_refund_turns("ORD-1", 9000, "Damaged."),
        true,
    )
    .await;
    let denied = run_refund(&mut client, "refund-huge", "Refund 9000 EUR for ORD-1.").await;
    wait_for_status(&mut client, &denied, "completed", None).await;
    let (samples, body) = scrape(&http, None).await;
    let value = |series: &str| sample(&samples, series, &body);
    assert_eq!(value("phrony_tool_calls_total{decision=\"deny\"}"), 1.0);
    assert_eq!(value("phrony_tool_calls_total{decision=\"allow\"}"), 0.0);
    assert_eq!(value("phrony_policy_evaluation_seconds_count"), 1.0);
    assert_eq!(value("phrony_dispatch_queue_wait_seconds_count"), 0.0);
    assert_eq!(value("phrony_model_errors_total"), 0.0);

    // The model provider fails: counted as a model error, and the session fails.
    publish_scripted_agent(
        &mut client,
        home.path(),
        "refund-broken",
        &serde_json::json!([[{"type": "failed", "error": "upstream overloaded"}]]),
        false,
    )
    .await;
    let broken = run_refund(&mut client, "refund-broken", "Refund 40 EUR for ORD-1.").await;
    wait_for_status(&mut client, &broken, "failed", None).await;
    let (samples, body) = scrape(&http, None).await;
    let value = |series: &str| sample(&samples, series, &body);
    assert!(value("phrony_model_errors_total") >= 1.0, "{body}");
    assert_eq!(value("phrony_sessions{status=\"failed\"}"), 1.0);
    assert_eq!(value("phrony_sessions{status=\"completed\"}"), 1.0);
    assert!(
        !body.contains("upstream overloaded"),
        "no error text in a label"
    );

    let status = daemon.terminate().await;
    assert!(status.success(), "{status}\n{}", daemon.stderr());
}
