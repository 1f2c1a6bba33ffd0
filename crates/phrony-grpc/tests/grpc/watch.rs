//! `WatchApprovals` over real TCP against the in-process daemon (SQLite file): the current set,
//! an approval a session opens, its decision through `DecideApproval`, a session cancelled
//! with its approval pending, filters validated like `ListApprovals`, the bound on open
//! watches, and a watcher that does not read being ended.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "tests: a panic is a failed assertion, with its message"
)]

use std::sync::Arc;
use std::time::Duration;

use phrony_proto::runtime::v1 as pb;
use phrony_proto::runtime::v1::runtime_client::RuntimeClient;
use phrony_runtime::{SecretsKey, ServeConfig};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Streaming};

use crate::sessions::{
    Db, Server, Worker, decide, publish_and_deploy, refund_agent, run, wait_status,
};

/// A safety net against hangs; no assertion depends on timing.
const PATIENCE: Duration = Duration::from_secs(20);
/// How long the slow watcher's server waits for it to read.
const GRACE: Duration = Duration::from_millis(200);

struct World {
    _db: Db,
    server: Server,
    _worker: Worker,
    client: RuntimeClient<Channel>,
}

async fn world(tweak: impl FnOnce(&mut ServeConfig)) -> World {
    let db = Db::sqlite();
    let server =
        Server::start_with(&db, &SecretsKey::generate().unwrap(), Arc::default(), tweak).await;
    let worker = Worker::connect(&server).await;
    let mut client = server.client().await;
    publish_and_deploy(&mut client, &refund_agent("refund-agent", 1)).await;
    World {
        _db: db,
        server,
        _worker: worker,
        client,
    }
}

async fn watch(
    client: &mut RuntimeClient<Channel>,
    request: pb::WatchApprovalsRequest,
) -> Streaming<pb::ApprovalChange> {
    client.watch_approvals(request).await.unwrap().into_inner()
}

async fn next(stream: &mut Streaming<pb::ApprovalChange>) -> pb::ApprovalChange {
    tokio::time::timeout(PATIENCE, stream.message())
        .await
        .expect("no approval change arrived")
        .unwrap()
        .expect("the watch ended")
}

/// The next change, which must be of `kind`; its approval.
async fn expect(
    stream: &mut Streaming<pb::ApprovalChange>,
    kind: pb::ApprovalChangeKind,
) -> pb::Approval {
    let change = next(stream).await;
    assert_eq!(change.kind(), kind, "{change:?}");
    change.approval.unwrap()
}

#[tokio::test]
async fn a_watch_sends_the_current_set_then_openings_and_decisions() {
    let mut w = world(|_| {}).await;
    let first = run(&mut w.client, "refund-agent", "Refund 400 for ORD-1").await;
    wait_status(&mut w.client, &first, "awaiting_approval").await;

    let mut stream = watch(&mut w.client, pb::WatchApprovalsRequest::default()).await;
    let current = expect(&mut stream, pb::ApprovalChangeKind::Opened).await;
    assert_eq!(current.session_id, first);
    assert_eq!(current.status, "pending");
    assert_eq!(current.agent_ref, "support/refund-agent@0.1.0");
    assert_eq!(
        current.policy_ref,
        "payments/refund-approval-boundary@1.0.0"
    );
    let end = next(&mut stream).await;
    assert_eq!(end.kind(), pb::ApprovalChangeKind::CurrentEnd);
    assert!(end.approval.is_none());

    // A session opens an approval.
    let second = run(&mut w.client, "refund-agent", "Refund 450 for ORD-2").await;
    let opened = expect(&mut stream, pb::ApprovalChangeKind::Opened).await;
    assert_eq!(opened.session_id, second);

    // A vote through DecideApproval decides the first.
    w.client
        .decide_approval(decide(&current.id, true, "emad", "Verified."))
        .await
        .unwrap();
    let decided = expect(&mut stream, pb::ApprovalChangeKind::Decided).await;
    assert_eq!(
        (decided.id.as_str(), decided.status.as_str()),
        (current.id.as_str(), "approved")
    );
    assert_eq!(decided.decided_by, "emad");
    assert_eq!(decided.comment, "Verified.");
    assert_eq!(decided.votes.len(), 1);

    // Cancelling the second session closes its approval.
    w.client
        .cancel_session(pb::CancelSessionRequest {
            session_id: second.clone(),
        })
        .await
        .unwrap();
    let cancelled = expect(&mut stream, pb::ApprovalChangeKind::Decided).await;
    assert_eq!(
        (cancelled.id.as_str(), cancelled.status.as_str()),
        (opened.id.as_str(), "cancelled")
    );

    // Filters: another session's watch sees nothing pending.
    let mut other = watch(
        &mut w.client,
        pb::WatchApprovalsRequest {
            session_id: first.clone(),
            ..Default::default()
        },
    )
    .await;
    assert_eq!(
        next(&mut other).await.kind(),
        pb::ApprovalChangeKind::CurrentEnd
    );
}

#[tokio::test]
async fn watch_filters_are_validated_like_list_filters() {
    let mut w = world(|_| {}).await;
    let cases = [
        (
            pb::WatchApprovalsRequest {
                status: "approved".into(),
                ..Default::default()
            },
            "a watch follows pending approvals: status must be empty or \"pending\"",
        ),
        (
            pb::WatchApprovalsRequest {
                status: "maybe".into(),
                ..Default::default()
            },
            "maybe",
        ),
        (
            pb::WatchApprovalsRequest {
                agent_namespace: "support".into(),
                ..Default::default()
            },
            "agent_namespace and agent_name must be given together",
        ),
    ];
    for (request, message) in cases {
        let refused = w.client.watch_approvals(request).await.unwrap_err();
        assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
        assert!(refused.message().contains(message), "{refused:?}");
    }
}

#[tokio::test]
async fn one_watch_more_than_the_bound_is_refused_until_one_closes() {
    let mut w = world(|config| config.max_approval_watchers = 2).await;
    let mut open = Vec::new();
    for _ in 0..2 {
        let mut stream = watch(&mut w.client, pb::WatchApprovalsRequest::default()).await;
        assert_eq!(
            next(&mut stream).await.kind(),
            pb::ApprovalChangeKind::CurrentEnd
        );
        open.push(stream);
    }
    let refused = w
        .client
        .watch_approvals(pb::WatchApprovalsRequest::default())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert_eq!(
        refused.message(),
        "too many approval watchers: at most 2 may be open at once"
    );
    // A client that goes away frees its slot (once the server notices).
    drop(open.pop());
    let reopened = tokio::time::timeout(PATIENCE, async {
        loop {
            match w
                .client
                .watch_approvals(pb::WatchApprovalsRequest::default())
                .await
            {
                Ok(stream) => return stream.into_inner(),
                Err(e) => assert_eq!(e.code(), Code::ResourceExhausted),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the closed watch's slot was never freed");
    let mut reopened = reopened;
    assert_eq!(
        next(&mut reopened).await.kind(),
        pb::ApprovalChangeKind::CurrentEnd
    );
}

#[tokio::test]
async fn a_watcher_that_does_not_read_is_ended() {
    let mut w = world(|config| {
        config.approval_watch_buffer = 1;
        config.approval_watch_grace = GRACE;
    })
    .await;
    // A client whose HTTP/2 window holds almost nothing, so the server's buffer is what fills.
    let channel = Endpoint::from_shared(format!("http://{}", w.server.addr))
        .unwrap()
        .initial_stream_window_size(Some(64))
        .connect()
        .await
        .unwrap();
    let mut slow = RuntimeClient::new(channel);
    let mut stream = watch(&mut slow, pb::WatchApprovalsRequest::default()).await;
    // Not read from now on: changes pile up on the server.
    let mut sessions = Vec::new();
    for order in 0..6 {
        let id = run(
            &mut w.client,
            "refund-agent",
            &format!("Refund 400 for ORD-{order}"),
        )
        .await;
        wait_status(&mut w.client, &id, "awaiting_approval").await;
        sessions.push(id);
    }
    // Not reading for longer than the grace, with changes waiting.
    tokio::time::sleep(GRACE * 5).await;
    // Reading now gets what was sent before the end, then the end.
    let ended = tokio::time::timeout(PATIENCE, async {
        loop {
            match stream.message().await {
                Ok(Some(_)) => {}
                Ok(None) => panic!("the watch ended without an error"),
                Err(status) => return status,
            }
        }
    })
    .await
    .expect("the slow watcher was never ended");
    assert_eq!(ended.code(), Code::ResourceExhausted, "{ended:?}");
    assert!(
        ended.message().starts_with(
            "the approval watch fell more than 1 changes behind for 200ms and was ended; watch again"
        ),
        "{ended:?}"
    );
    // Its slot is free again and a new watch (reading, with the same one-change buffer) gets the
    // whole current set.
    let mut again = watch(&mut w.client, pb::WatchApprovalsRequest::default()).await;
    for id in &sessions {
        assert_eq!(
            &expect(&mut again, pb::ApprovalChangeKind::Opened)
                .await
                .session_id,
            id
        );
    }
    assert_eq!(
        next(&mut again).await.kind(),
        pb::ApprovalChangeKind::CurrentEnd
    );
}
