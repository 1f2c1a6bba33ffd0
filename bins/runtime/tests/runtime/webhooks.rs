//! Webhooks (`RUNTIME_WEBHOOKS_FILE`) on the real binary with an in-process receiver on
//! 127.0.0.1: the €400 refund's approval reaches the receiver signed (`approval.required`), in
//! JSON and as a Slack message; its decision is `approval.decided`, delivered on the 3rd attempt
//! under the same id after two 500s; a receiver nobody listens on ends `failed` after
//! `max_attempts`; a delivery pending when the daemon is killed (-9) is delivered after the
//! restart on the same database; a bad webhooks file stops the start naming file:line:column.
//! A receiver's refusal (410) fails the delivery at once with the status and a cleaned excerpt
//! of its body (an operator's retry sends it again), a 408 is retried, and a 429's
//! `Retry-After` is waited out.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use hmac::{Hmac, Mac as _};
use phrony_proto::runtime::v1 as pb;
use phrony_test_support::worker::RefundWorker;
use serde_json::Value;
use sha2::Sha256;

use crate::metrics::{decide_pending, publish_refund_agent, run_refund, wait_for_status};
use crate::support::{Launch, free_port, sqlite_url};

const SECRET: &str = "whsec-0123456789abcdef";

/// One request the receiver got.
#[derive(Debug, Clone)]
struct Received {
    path: String,
    id: String,
    timestamp: String,
    signature: Option<String>,
    body: Vec<u8>,
    at: Instant,
}

impl Received {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap()
    }
}

#[derive(Default)]
struct Receiver {
    got: Mutex<Vec<Received>>,
    /// Answer 500 to this many requests (then 200).
    fail_next: Mutex<u32>,
    /// Answers per path, used up first.
    script: Mutex<HashMap<String, VecDeque<Scripted>>>,
}

/// A scripted answer: status, `Retry-After`, body.
type Scripted = (u16, Option<&'static str>, String);

async fn receive(
    State(receiver): State<Arc<Receiver>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let header = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    receiver.got.lock().unwrap().push(Received {
        path: uri.path().to_owned(),
        id: header("phrony-webhook-id").unwrap_or_default(),
        timestamp: header("phrony-webhook-timestamp").unwrap_or_default(),
        signature: header("phrony-webhook-signature"),
        body: body.to_vec(),
        at: Instant::now(),
    });
    let scripted = receiver
        .script
        .lock()
        .unwrap()
        .get_mut(uri.path())
        .and_then(VecDeque::pop_front);
    if let Some((status, retry_after, body)) = scripted {
        let mut response = (StatusCode::from_u16(status).unwrap(), body).into_response();
        if let Some(after) = retry_after {
            response
                .headers_mut()
                .insert("retry-after", after.parse().unwrap());
        }
        return response;
    }
    let mut fail = receiver.fail_next.lock().unwrap();
    if *fail > 0 {
        *fail -= 1;
        StatusCode::INTERNAL_SERVER_ERROR.into_response()
    } else {
        StatusCode::OK.into_response()
    }
}

async fn start_receiver() -> (Arc<Receiver>, String) {
    let receiver = Arc::new(Receiver::default());
    let app = axum::Router::new()
        .route("/{*path}", axum::routing::post(receive))
        .with_state(Arc::clone(&receiver));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (receiver, format!("http://{addr}"))
}

/// Waits until the receiver holds a request matching `want`; returns every match.
async fn wait_for(
    receiver: &Receiver,
    what: &str,
    want: impl Fn(&Received) -> bool,
    count: usize,
) -> Vec<Received> {
    for _ in 0..300 {
        let got: Vec<Received> = receiver
            .got
            .lock()
            .unwrap()
            .iter()
            .filter(|r| want(r))
            .cloned()
            .collect();
        if got.len() >= count {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let all: Vec<String> = receiver
        .got
        .lock()
        .unwrap()
        .iter()
        .map(|r| format!("{} {}", r.path, String::from_utf8_lossy(&r.body)))
        .collect();
    panic!("the receiver never got {count} × {what}; it got {all:#?}");
}

fn of_type(path: &'static str, kind: &'static str) -> impl Fn(&Received) -> bool {
    move |r| r.path == path && r.json()["type"] == kind
}

/// The receiver's check, as the docs describe it.
fn verify(r: &Received) {
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(r.timestamp.as_bytes());
    mac.update(b".");
    mac.update(&r.body);
    let want = format!("v1={}", hex::encode(mac.finalize().into_bytes()));
    assert_eq!(r.signature.as_deref(), Some(want.as_str()), "{r:?}");
    let ts: i64 = r.timestamp.parse().unwrap();
    assert!((chrono::Utc::now().timestamp() - ts).abs() < 300, "{r:?}");
}

async fn delivery_rows(url: &str, webhook: &str) -> Vec<(String, String, i64, Option<String>)> {
    let pool = sqlx::SqlitePool::connect(url).await.unwrap();
    let rows: Vec<(String, String, i64, Option<String>)> = sqlx::query_as(
        "SELECT id, status, attempts, last_error FROM webhook_deliveries WHERE webhook = ? \
         ORDER BY updated_at",
    )
    .bind(webhook)
    .fetch_all(&pool)
    .await
    .unwrap();
    pool.close().await;
    rows
}

#[tokio::test]
async fn webhooks_are_signed_retried_and_survive_a_restart() {
    let home = tempfile::tempdir().unwrap();
    let url = sqlite_url(home.path());
    let (receiver, base) = start_receiver().await;
    let dead = format!("http://127.0.0.1:{}/gone", free_port());
    let hooks = home.path().join("hooks.yaml");
    std::fs::write(
        &hooks,
        format!(
            "webhooks:\n\
             - name: ops\n  url: {base}/ops\n  events: [approval.required, approval.decided, \
             approval.expired, approval.escalated, session.failed]\n  secret_env: HOOK_SECRET\n  \
             console_url: https://console.example.com/\n  timeout: 2s\n  max_attempts: 6\n  \
             backoff_initial: 2s\n  backoff_max: 4s\n\
             - name: chat\n  url: {base}/slack\n  format: slack\n  events: [approval.required]\n  \
             console_url: https://console.example.com\n\
             - name: dead\n  url: {dead}\n  events: [approval.required]\n  secret_env: \
             HOOK_SECRET\n  timeout: 1s\n  max_attempts: 2\n  backoff_initial: 100ms\n  \
             backoff_max: 200ms\n"
        ),
    )
    .unwrap();
    let launch = Launch::new(home.path(), Some(&url))
        .env("RUNTIME_ENABLE_STUB_PROVIDER", "1")
        .env("RUNTIME_WEBHOOKS_FILE", hooks.to_str().unwrap())
        .env("HOOK_SECRET", SECRET);
    let daemon = launch.start().await;
    let mut client = daemon.client().await;
    publish_refund_agent(&mut client, home.path(), "refund-agent", 400, None).await;
    let worker = RefundWorker::start(&daemon.addr, "webhook-worker");
    let session = run_refund(
        &mut client,
        "refund-agent",
        "Refund 400 EUR for ORD-1, the item arrived damaged.",
    )
    .await;
    wait_for_status(&mut client, &session, "awaiting_approval", None).await;

    // approval.required, signed, with the approval's exact arguments and a console link.
    let required = wait_for(
        &receiver,
        "approval.required on /ops",
        of_type("/ops", "approval.required"),
        1,
    )
    .await;
    let r = &required[0];
    verify(r);
    let body = r.json();
    assert_eq!(body["id"], r.id.as_str(), "the body's id is the header's");
    assert_eq!(body["session_id"], session.as_str());
    assert_eq!(body["agent"], "support/refund-agent@0.1.0");
    assert_eq!(body["tool"], "payments.issue-refund@1.0.0");
    assert_eq!(body["arguments"]["amount"], 400);
    assert_eq!(
        body["policy"], "payments/refund-approval-boundary@1.0.0",
        "{body}"
    );
    assert_eq!(body["reason"], "Refund amount above delegated limit.");
    assert_eq!(body["quorum"]["required"], 1);
    let approval_id = body["approval_id"].as_str().unwrap().to_owned();
    assert_eq!(
        body["console_url"],
        format!("https://console.example.com/console/#/approvals/{approval_id}").as_str()
    );

    // The Slack message: unsigned, the tool, the amount, the policy, the reason and the link.
    let slack = wait_for(&receiver, "the Slack message", |r| r.path == "/slack", 1).await;
    assert_eq!(slack[0].signature, None, "Slack messages are not signed");
    let message = slack[0].json();
    let link = format!("https://console.example.com/console/#/approvals/{approval_id}");
    let context = format!("session {session} · {}", slack[0].id);
    assert_eq!(
        message,
        serde_json::json!({
            "text": "Approval required: payments.issue-refund@1.0.0",
            "blocks": [
                {"type": "header", "text": {"type": "plain_text", "text": "Approval required"}},
                {"type": "section", "fields": [
                    {"type": "mrkdwn", "text": "*Agent:*\nsupport/refund-agent@0.1.0"},
                    {"type": "mrkdwn", "text": "*Tool:*\npayments.issue-refund@1.0.0"},
                    {"type": "mrkdwn", "text": "*amount:*\n400 EUR"},
                    {"type": "mrkdwn", "text": "*Policy:*\npayments/refund-approval-boundary@1.0.0"}
                ]},
                {"type": "section", "text": {"type": "mrkdwn",
                    "text": "*Reason:* Refund amount above delegated limit."}},
                {"type": "actions", "elements": [{"type": "button",
                    "text": {"type": "plain_text", "text": "Open in the console"}, "url": link}]},
                {"type": "context", "elements": [{"type": "mrkdwn", "text": context}]}
            ]
        })
    );

    // Nobody listens for `dead`: failed after its 2 attempts, with the error kept.
    for _ in 0..100 {
        if delivery_rows(&url, "dead")
            .await
            .first()
            .is_some_and(|d| d.1 == "failed")
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let dead_rows = delivery_rows(&url, "dead").await;
    assert_eq!(dead_rows.len(), 1, "{dead_rows:?}");
    assert_eq!(dead_rows[0].1, "failed");
    assert_eq!(dead_rows[0].2, 2);
    assert!(
        dead_rows[0]
            .3
            .as_deref()
            .unwrap()
            .contains("request failed"),
        "{dead_rows:?}"
    );

    // The decision: two 500s, then delivered on the 3rd attempt under the same id.
    *receiver.fail_next.lock().unwrap() = 2;
    decide_pending(
        &mut client,
        &session,
        pb::ApprovalDecision::Approve,
        "fine by me",
    )
    .await;
    let decided = wait_for(
        &receiver,
        "3 × approval.decided",
        of_type("/ops", "approval.decided"),
        3,
    )
    .await;
    assert!(decided.iter().all(|d| d.id == decided[0].id), "{decided:?}");
    for d in &decided {
        verify(d);
    }
    let body = decided[2].json();
    assert_eq!(body["decision"], "approved");
    assert_eq!(body["decided_by"], "emad");
    assert_eq!(body["comment"], "fine by me");
    wait_for_status(&mut client, &session, "completed", None).await;
    let ops = delivery_rows(&url, "ops").await;
    let decided_row = ops.iter().find(|d| d.0 == decided[0].id).unwrap();
    assert_eq!(decided_row.1, "delivered");
    assert_eq!(decided_row.2, 3);

    // A delivery pending when the daemon is killed is delivered after the restart, same id: the
    // receiver answers 500 until the daemon is gone, so the delivery is pending at the kill.
    *receiver.fail_next.lock().unwrap() = 1000;
    let second = run_refund(
        &mut client,
        "refund-agent",
        "Refund 400 EUR for ORD-1, the item arrived damaged.",
    )
    .await;
    let first_try = wait_for(
        &receiver,
        "the second approval.required",
        move |r| {
            r.path == "/ops"
                && r.json()["type"] == "approval.required"
                && r.json()["session_id"] == second.as_str()
        },
        1,
    )
    .await;
    drop(worker);
    drop(daemon); // SIGKILL, with a retry due
    *receiver.fail_next.lock().unwrap() = 0;
    let pending = delivery_rows(&url, "ops").await;
    assert!(
        pending
            .iter()
            .any(|d| d.0 == first_try[0].id && d.1 == "pending"),
        "{pending:?}"
    );
    let daemon = launch.start().await;
    let id = first_try[0].id.clone();
    let again = wait_for(
        &receiver,
        "the second approval.required after the restart",
        move |r| r.id == id,
        2,
    )
    .await;
    verify(&again[1]);
    assert_eq!(again[1].json()["id"], first_try[0].id.as_str());
    drop(daemon);
}

#[tokio::test]
async fn a_bad_webhooks_file_stops_the_start_naming_file_line_and_column() {
    let home = tempfile::tempdir().unwrap();
    let hooks = home.path().join("hooks.yaml");
    std::fs::write(
        &hooks,
        "webhooks:\n  - name: ops\n    url: https://hooks.example.com/x\n    events: [approval.voted]\n    secret_env: HOOK_SECRET\n",
    )
    .unwrap();
    let (status, stderr) = Launch::new(home.path(), Some(&sqlite_url(home.path())))
        .env("RUNTIME_WEBHOOKS_FILE", hooks.to_str().unwrap())
        .env("HOOK_SECRET", SECRET)
        .run(&[]);
    assert!(!status.success());
    let want = format!(
        "{}:4:13: webhooks[0].events: unknown event \"approval.voted\"",
        hooks.display()
    );
    assert!(stderr.contains(&want), "{stderr}");
}

/// Polls the delivery rows of `webhook` until one has `status`.
async fn wait_row(url: &str, webhook: &str, status: &str) -> (String, String, i64, Option<String>) {
    for _ in 0..300 {
        if let Some(row) = delivery_rows(url, webhook)
            .await
            .into_iter()
            .find(|d| d.1 == status)
        {
            return row;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "no {status} delivery for {webhook}: {:?}",
        delivery_rows(url, webhook).await
    );
}

#[tokio::test]
async fn refusals_fail_at_once_and_rate_limits_are_honoured() {
    let home = tempfile::tempdir().unwrap();
    let url = sqlite_url(home.path());
    let (receiver, base) = start_receiver().await;
    let noisy = format!("no such hook\n\u{1b}[31m{}", "x".repeat(5000));
    receiver.script.lock().unwrap().extend([
        ("/gone".to_owned(), VecDeque::from([(410, None, noisy)])),
        (
            "/busy".to_owned(),
            VecDeque::from([(429, Some("2"), "slow down".to_owned())]),
        ),
        (
            "/slow".to_owned(),
            VecDeque::from([(408, None, String::new())]),
        ),
    ]);
    let hook = |name: &str, backoff_max: &str| {
        format!(
            "- name: {name}\n  url: {base}/{name}\n  events: [approval.required]\n  secret_env: \
             HOOK_SECRET\n  timeout: 2s\n  max_attempts: 5\n  backoff_initial: 100ms\n  \
             backoff_max: {backoff_max}\n"
        )
    };
    let hooks = home.path().join("hooks.yaml");
    std::fs::write(
        &hooks,
        format!(
            "webhooks:\n{}{}{}",
            hook("gone", "200ms"),
            hook("busy", "5s"),
            hook("slow", "200ms")
        ),
    )
    .unwrap();
    let launch = Launch::new(home.path(), Some(&url))
        .env("RUNTIME_ENABLE_STUB_PROVIDER", "1")
        .env("RUNTIME_WEBHOOKS_FILE", hooks.to_str().unwrap())
        .env("HOOK_SECRET", SECRET);
    let daemon = launch.start().await;
    let mut client = daemon.client().await;
    publish_refund_agent(&mut client, home.path(), "refund-agent", 400, None).await;
    let worker = RefundWorker::start(&daemon.addr, "webhook-worker");
    let session = run_refund(
        &mut client,
        "refund-agent",
        "Refund 400 EUR for ORD-1, the item arrived damaged.",
    )
    .await;
    wait_for_status(&mut client, &session, "awaiting_approval", None).await;

    // 408 is a timeout: retried, delivered on the 2nd attempt.
    wait_for(&receiver, "2 × /slow", |r| r.path == "/slow", 2).await;
    let slow = wait_row(&url, "slow", "delivered").await;
    assert_eq!(slow.2, 2, "{slow:?}");

    // 429 with `Retry-After: 2`: the next attempt waits 2 s, not the 100 ms backoff.
    let busy = wait_for(&receiver, "2 × /busy", |r| r.path == "/busy", 2).await;
    let waited = busy[1].at.duration_since(busy[0].at);
    assert!(
        waited >= Duration::from_millis(1900),
        "the 2nd attempt came {waited:?} after the 429"
    );
    assert_eq!(wait_row(&url, "busy", "delivered").await.2, 2);

    // 410: failed at once, with the status and a bounded, cleaned excerpt of the body.
    let gone = wait_row(&url, "gone", "failed").await;
    assert_eq!(gone.2, 1, "one attempt: {gone:?}");
    let error = gone.3.clone().unwrap();
    assert!(
        error.starts_with("HTTP 410 Gone (permanent, not retried): no such hook [31mxxx"),
        "{error}"
    );
    assert!(!error.chars().any(char::is_control), "{error:?}");
    assert!(
        error.chars().count() < 300 && error.ends_with('…'),
        "bounded: {error}"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    let sent: Vec<Received> = receiver
        .got
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.path == "/gone")
        .cloned()
        .collect();
    assert_eq!(sent.len(), 1, "a refusal is not retried: {sent:?}");

    // An operator re-queues it (the receiver was fixed): delivered under the same id.
    client
        .retry_webhook_delivery(pb::RetryWebhookDeliveryRequest {
            delivery_id: gone.0.clone(),
            actor: "ops-lead".into(),
        })
        .await
        .unwrap();
    let again = wait_for(&receiver, "/gone again", |r| r.path == "/gone", 2).await;
    assert_eq!(again[1].id, gone.0);
    assert_eq!(wait_row(&url, "gone", "delivered").await.2, 1);
    drop(worker);
    drop(daemon);
}
