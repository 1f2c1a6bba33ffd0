//! The `work_stream` target: a scripted tool worker speaks the `Runtime.Work` stream to the real
//! Work-stream handling of the daemon ([`phrony_grpc::WorkHub`]: first-message rules, protobuf
//! to `phrony-dispatch` conversion, the reader task, the response stream) over a real
//! [`Router`], while the runtime dispatches tool calls to it.
//!
//! The input is a script of operations (one opcode byte, then its operands): open up to three
//! streams; send a register (worker ids and handler sets from small tables, duplicate and
//! oversized fields included), heartbeat, result, nack, an empty message or arbitrary bytes
//! decoded as a `WorkClientMsg` on any stream; dispatch, cancel and acknowledge calls (call ids
//! from a small table, so results can be for known, unknown, duplicate and foreign calls);
//! advance the (paused) clock; half-close a stream, drop its response, stop the hub.
//!
//! Checked: no panic; the first message's refusal is the documented status; every stream ends
//! with one of the documented codes and a bounded message; the first server message of an
//! opened stream is `registered`; no call is in flight on a worker unless it was dispatched,
//! nor on two workers; a worker whose streams ended is unregistered at once (no lease expiry
//! needed); then every dispatch ends (a completion or a typed failure), and the router keeps
//! no worker, queued call or unacknowledged result.

use std::time::Duration;

use futures::StreamExt as _;
use futures::channel::mpsc;
use phrony_auth::{Principal, Role, ToolPattern, Verification};
use phrony_dispatch::{
    CancellationToken, Completion, DispatchCall, DispatchFailure, Invocation, Router, RouterConfig,
};
use phrony_grpc::WorkHub;
use phrony_proto::runtime::v1 as pb;
use prost::Message as _;
use tokio::task::JoinHandle;
use tonic::{Code, Status};

use pb::work_client_msg::Body;

/// At most this many operations are read from one input (bounded work per input).
const MAX_OPS: usize = 192;
/// At most this many streams and dispatches per input.
const MAX_STREAMS: usize = 3;
const MAX_DISPATCHES: usize = 12;

/// The call ids dispatches and worker messages use: a small table so they meet; `""` and
/// `call-x` (never dispatched) are the unknown ones.
const CALL_IDS: [&str; 6] = ["call-0", "call-1", "call-2", "call-3", "", "call-x"];

const LOOKUP: &str = "orders.lookup-order";
const REFUND: &str = "payments.issue-refund";

fn config() -> RouterConfig {
    RouterConfig {
        lease_ttl: Duration::from_secs(4),
        queue_capacity: 2,
        nack_retries: 1,
        abandon_grace: Duration::from_secs(6),
        // The smallest outbox the router accepts, so a worker that stops reading overflows it.
        outbox_capacity: 16,
        // Unpinned hashes stay accepted: the scripts advertise any hash, and no pins hook runs.
        require_descriptor_pins: false,
    }
}

/// Reads operands; a script that runs out reads zeros.
struct Script<'a>(&'a [u8]);

impl Script<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }

    fn pick(&mut self, n: usize) -> usize {
        usize::from(self.byte().unwrap_or(0)) % n
    }

    fn take(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (taken, rest) = self.0.split_at(n);
        self.0 = rest;
        taken
    }
}

fn ad(tool: &str, version: &str, max_concurrency: u32) -> pb::WorkHandlerAdvertisement {
    pb::WorkHandlerAdvertisement {
        tool: tool.to_owned(),
        version: version.to_owned(),
        contract_version: "1".to_owned(),
        max_concurrency,
        descriptor_hash: "sha256:00".to_owned(),
    }
}

fn register(s: &mut Script<'_>) -> pb::WorkRegister {
    let worker_id = match s.pick(5) {
        0 => "w1".to_owned(),
        1 => "w2".to_owned(),
        2 => String::new(),
        3 => "w1 \u{0}\n\u{202e}".to_owned(),
        _ => "w".repeat(70_000),
    };
    let handlers = match s.pick(7) {
        0 => vec![ad(LOOKUP, "1.0.0", 1)],
        1 => vec![ad(LOOKUP, "1.0.0", 2), ad(REFUND, "default", 0)],
        2 => Vec::new(),
        3 => vec![ad(LOOKUP, "1.0.0", 1), ad(LOOKUP, "1.0.0", 3)],
        4 => vec![ad("", "", 1)],
        5 => vec![ad(REFUND, "", u32::MAX)],
        _ => vec![pb::WorkHandlerAdvertisement {
            tool: "t".repeat(70_000),
            version: "9".repeat(5_000),
            contract_version: "c".repeat(5_000),
            max_concurrency: u32::MAX,
            descriptor_hash: "h".repeat(70_000),
        }],
    };
    let in_flight = match s.pick(4) {
        0 => Vec::new(),
        1 => vec!["call-0"],
        2 => vec!["call-0", "call-0", "call-1"],
        _ => vec!["", "call-x"],
    };
    pb::WorkRegister {
        worker_id,
        workload_identity: ["", "orders-worker", "spoofed"][s.pick(3)].to_owned(),
        image_digest: "sha256:abc".to_owned(),
        handlers,
        in_flight: in_flight
            .into_iter()
            .map(|c| pb::WorkInFlightCall {
                call_id: c.to_owned(),
            })
            .collect(),
    }
}

fn payload(s: &mut Script<'_>) -> Vec<u8> {
    match s.pick(7) {
        0 => br#"{"order_id":"ORD-1","status":"shipped"}"#.to_vec(),
        1 => Vec::new(),
        2 => b"not json".to_vec(),
        3 => vec![0xff, 0xfe, 0x00],
        4 => "[".repeat(100_000).into_bytes(),
        5 => format!("\"{}\"", "x".repeat(1 << 20)).into_bytes(),
        _ => b"null".to_vec(),
    }
}

/// The kind of a decoded client message, as the refusals name it.
fn kind(msg: &pb::WorkClientMsg) -> &'static str {
    match msg.body {
        Some(Body::Register(_)) => "register",
        Some(Body::Heartbeat(_)) => "heartbeat",
        Some(Body::Result(_)) => "result",
        Some(Body::Nack(_)) => "nack",
        None => "none",
    }
}

/// One client stream: its sending half, the task that opens it and reads its responses, and
/// what the oracle needs about its first message.
struct Stream {
    tx: Option<mpsc::UnboundedSender<Result<pb::WorkClientMsg, Status>>>,
    stop_reading: CancellationToken,
    task: JoinHandle<StreamEnd>,
    /// The first thing sent: `Ok(kind)` or `Err` for a broken stream.
    first: Option<Result<&'static str, Status>>,
    /// The first message's refusal is predictable (no clock advance, stop or close before it).
    predictable: bool,
}

/// How a stream ended.
struct StreamEnd {
    opened: Result<(), Status>,
    /// The response stream's final status (`Ok` status for a clean end); `None` when the
    /// client dropped the response first.
    ended: Option<Status>,
}

/// The calls the runtime dispatched.
struct Dispatch {
    cancel: CancellationToken,
    task: Option<JoinHandle<Result<Completion, DispatchFailure>>>,
}

fn principal(verified: bool) -> Principal {
    if verified {
        Principal {
            name: "orders-worker".to_owned(),
            verification: Verification::Token,
            roles: [Role::Worker].into(),
            routes: Vec::new(),
            tools: ToolPattern::parse(LOOKUP).into_iter().collect(),
        }
    } else {
        Principal::unverified("local")
    }
}

/// The codes a Work stream may end with: the router's status classes, `DEADLINE_EXCEEDED` (no
/// register within the lease), `INTERNAL` (the client's own broken-stream status passed back)
/// and `OK`.
fn documented(code: Code) -> bool {
    matches!(
        code,
        Code::Ok
            | Code::InvalidArgument
            | Code::FailedPrecondition
            | Code::NotFound
            | Code::Aborted
            | Code::ResourceExhausted
            | Code::PermissionDenied
            | Code::DeadlineExceeded
            | Code::Internal
    )
}

async fn run_stream(
    hub: WorkHub,
    principal: Principal,
    inbound: mpsc::UnboundedReceiver<Result<pb::WorkClientMsg, Status>>,
    stop_reading: CancellationToken,
) -> StreamEnd {
    let mut response = match hub.open(inbound, &principal).await {
        Ok(response) => response,
        Err(status) => {
            return StreamEnd {
                opened: Err(status),
                ended: None,
            };
        }
    };
    let mut first = true;
    loop {
        let item = tokio::select! {
            () = stop_reading.cancelled() => return StreamEnd { opened: Ok(()), ended: None },
            item = response.next() => item,
        };
        match item {
            Some(Ok(msg)) => {
                if first {
                    assert!(
                        matches!(msg.body, Some(pb::work_server_msg::Body::Registered(_))),
                        "the first server message of an opened Work stream is not `registered`: {msg:?}"
                    );
                    first = false;
                }
                if let Some(pb::work_server_msg::Body::Invoke(invoke)) = &msg.body {
                    assert!(
                        CALL_IDS[..4].contains(&invoke.call_id.as_str()),
                        "an invoke for a call nobody dispatched: {:?}",
                        invoke.call_id
                    );
                    assert!(
                        serde_json::from_slice::<serde_json::Value>(&invoke.args).is_ok(),
                        "invoke arguments are not JSON"
                    );
                }
            }
            Some(Err(status)) => {
                return StreamEnd {
                    opened: Ok(()),
                    ended: Some(status),
                };
            }
            None => {
                return StreamEnd {
                    opened: Ok(()),
                    ended: Some(Status::ok("")),
                };
            }
        }
    }
}

/// Lets every task run until it waits (messages flow, the router reacts); the clock stays.
async fn settle() {
    for _ in 0..32 {
        tokio::task::yield_now().await;
    }
}

/// The router's invariants at any point: a call is in flight on at most one worker, and only
/// if it was dispatched.
fn check_router(router: &Router) {
    let snapshot = router.snapshot();
    let mut seen = std::collections::HashSet::new();
    for worker in &snapshot.workers {
        for call in &worker.in_flight {
            assert!(
                CALL_IDS[..4].contains(&call.as_str()),
                "worker {:?} has call {call:?} in flight, which nobody dispatched",
                worker.worker_id
            );
            assert!(
                seen.insert(call.clone()),
                "call {call:?} is in flight on two workers"
            );
        }
    }
}

/// The largest message an error may carry: a fixed allowance plus a multiple of what the
/// worker sent (an error may quote a field, e.g. a 70 kB worker id, but must not grow beyond).
fn check_message(what: &str, message: &str, sent: usize) {
    let bound = 64 * 1024 + 8 * sent;
    assert!(
        message.len() <= bound,
        "{what}: {} bytes of message for {sent} bytes sent",
        message.len()
    );
    assert!(!message.trim().is_empty(), "{what}: an empty message");
}

/// Checks a status a stream ended with (or was refused with).
fn check_status(status: &Status, sent: usize) {
    assert!(
        documented(status.code()),
        "a Work stream ended with an undocumented code {:?}: {}",
        status.code(),
        status.message()
    );
    if status.code() != Code::Ok {
        check_message("work stream status", status.message(), sent);
    }
}

/// The refusal the module docs of `phrony_grpc`'s Work stream promise for a first message.
fn check_first(first: &Result<&'static str, Status>, opened: &Result<(), Status>) {
    let refused = match (first, opened) {
        (Ok("register"), _) => return,
        (_, Ok(())) => panic!("a Work stream opened without a register first ({first:?})"),
        (_, Err(status)) => status,
    };
    let (code, message) = match first {
        Ok("none") => (
            Code::InvalidArgument,
            "register message is required".to_owned(),
        ),
        Ok(other) => (Code::FailedPrecondition, format!("register before {other}")),
        Err(sent) => (sent.code(), sent.message().to_owned()),
    };
    assert_eq!(
        (refused.code(), refused.message()),
        (code, message.as_str()),
        "the wrong refusal of a first message"
    );
}

/// The body: see the module docs. Returns whether some stream registered.
pub fn work_stream(data: &[u8]) -> bool {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    runtime.block_on(drive(data))
}

async fn drive(data: &[u8]) -> bool {
    let mut s = Script(data);
    let router = Router::new(config()).expect("the fuzz router config is valid");
    let hub = WorkHub::new(router.clone());
    let verified = (s.byte().unwrap_or(0) & 1) == 1;
    let principal = principal(verified);
    let mut streams: Vec<Stream> = Vec::new();
    let mut dispatches: Vec<Dispatch> = Vec::new();
    let mut stopped = false;
    // Bytes of client messages sent (the bound of what an error may quote).
    let mut sent = data.len();
    // Completions recorded without an ack (the result stays unacknowledged on the worker).
    let mut unacked: Vec<Completion> = Vec::new();

    for _ in 0..MAX_OPS {
        let Some(op) = s.byte() else { break };
        match op % 14 {
            // Open a stream.
            0 => {
                if streams.len() < MAX_STREAMS {
                    let (tx, rx) = mpsc::unbounded();
                    let stop_reading = CancellationToken::new();
                    let task = tokio::spawn(run_stream(
                        hub.clone(),
                        principal.clone(),
                        rx,
                        stop_reading.clone(),
                    ));
                    streams.push(Stream {
                        tx: Some(tx),
                        stop_reading,
                        task,
                        first: None,
                        predictable: !stopped,
                    });
                }
            }
            // A client message on a stream.
            op @ 1..=6 => {
                let at = s.pick(MAX_STREAMS);
                let msg = client_message(op, &mut s);
                sent += msg.as_ref().map_or(0, prost::Message::encoded_len);
                if let Some(stream) = streams.get_mut(at) {
                    if stream.first.is_none() {
                        stream.first = Some(msg.as_ref().map(kind).map_err(Clone::clone));
                    }
                    if let Some(tx) = &stream.tx {
                        // The receiver is gone once the stream ended: what a real client
                        // sees as a failed send.
                        let _ = tx.unbounded_send(msg);
                    }
                }
            }
            // The runtime dispatches a call.
            7 => {
                if dispatches.len() < MAX_DISPATCHES {
                    dispatches.push(dispatch(&router, &mut s));
                }
            }
            // The session of a call is cancelled.
            8 => {
                let at = s.pick(MAX_DISPATCHES);
                if let Some(d) = dispatches.get(at) {
                    d.cancel.cancel();
                }
            }
            // A finished call's result is recorded and acknowledged (or not).
            9 => {
                let at = s.pick(MAX_DISPATCHES);
                let ack = s.pick(2) == 0;
                if let Some(d) = dispatches.get_mut(at)
                    && d.task.as_ref().is_some_and(JoinHandle::is_finished)
                {
                    let done = d
                        .task
                        .take()
                        .expect("checked")
                        .await
                        .expect("a dispatch task");
                    match done {
                        Ok(completion) if ack => {
                            let _ = completion.ack.ack();
                        }
                        Ok(completion) => unacked.push(completion),
                        Err(failure) => {
                            check_message("dispatch failure", &failure.to_string(), sent);
                        }
                    }
                }
            }
            // Time passes.
            10 => {
                let ms = 250 * u64::from(s.byte().unwrap_or(0) % 32);
                for stream in &mut streams {
                    if stream.first.is_none() {
                        stream.predictable = false;
                    }
                }
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            // The worker half-closes a stream.
            11 => {
                if let Some(stream) = streams.get_mut(s.pick(MAX_STREAMS)) {
                    if stream.first.is_none() {
                        stream.first = Some(Ok("none"));
                    }
                    stream.tx = None;
                }
            }
            // The worker stops reading (drops the response).
            12 => {
                if let Some(stream) = streams.get(s.pick(MAX_STREAMS)) {
                    stream.stop_reading.cancel();
                }
            }
            // The daemon stops.
            _ => {
                if s.pick(4) == 0 {
                    hub.stop();
                    router.shutdown();
                    stopped = true;
                    for stream in &mut streams {
                        if stream.first.is_none() {
                            stream.predictable = false;
                        }
                    }
                }
            }
        }
        settle().await;
        check_router(&router);
    }

    finish(&router, streams, dispatches, unacked, sent).await
}

/// Client message `op` (1 to 6) of the script, as the server's codec hands it over.
fn client_message(op: u8, s: &mut Script<'_>) -> Result<pb::WorkClientMsg, Status> {
    match op {
        1 => Ok(Some(Body::Register(register(s)))),
        2 => Ok(Some(Body::Heartbeat(pb::WorkHeartbeat {}))),
        3 => {
            let call_id = CALL_IDS[s.pick(CALL_IDS.len())].to_owned();
            let error = (s.pick(3) == 0).then(|| pb::WorkToolError {
                code: "invalid_args".to_owned(),
                message: "amount must be positive".to_owned(),
            });
            Ok(Some(Body::Result(pb::WorkToolResult {
                call_id,
                payload: payload(s),
                error,
            })))
        }
        4 => Ok(Some(Body::Nack(pb::WorkToolNack {
            call_id: CALL_IDS[s.pick(CALL_IDS.len())].to_owned(),
            code: ["unknown_handler", "", "busy"][s.pick(3)].to_owned(),
            message: "refused".to_owned(),
        }))),
        5 => Ok(None),
        _ => {
            // Arbitrary bytes, decoded as the server's codec would: a decode error
            // breaks the stream with the codec's status.
            let len = usize::from(s.byte().unwrap_or(0));
            pb::WorkClientMsg::decode(s.take(len))
                .map(|m| m.body)
                .map_err(|e| Status::internal(format!("decoding WorkClientMsg: {e}")))
        }
    }
    .map(|body| pb::WorkClientMsg { body })
}

/// The runtime dispatches a call (operands: call id, tool, queue wait, execution timeout).
fn dispatch(router: &Router, s: &mut Script<'_>) -> Dispatch {
    let call_id = CALL_IDS[s.pick(4)].to_owned();
    let (tool, version) = [(LOOKUP, "1.0.0"), (REFUND, ""), ("unknown.tool", "1")][s.pick(3)];
    let invocation = Invocation {
        call_id,
        session_id: "s1".to_owned(),
        agent_version_id: "av1".to_owned(),
        turn: 1,
        tool: tool.to_owned(),
        version: version.to_owned(),
        args: serde_json::json!({"order_id": "ORD-1"}),
        side_effect_class: "read_only".to_owned(),
        deadline_unix_ms: 0,
        trace_context: std::collections::BTreeMap::new(),
    };
    let queue_wait = Duration::from_millis(500 * u64::from(s.byte().unwrap_or(0) % 8));
    let exec_timeout = match s.pick(3) {
        0 => None,
        n => Some(Duration::from_secs(3 * n as u64)),
    };
    let cancel = CancellationToken::new();
    let call = DispatchCall::new(invocation, "support/refund-agent", queue_wait, exec_timeout)
        .with_cancel(cancel.clone());
    let router = router.clone();
    let task = tokio::spawn(async move { router.dispatch(call).await });
    Dispatch {
        cancel,
        task: Some(task),
    }
}

/// Every stream goes away (its worker closes and stops reading), then the end checks.
async fn finish(
    router: &Router,
    mut streams: Vec<Stream>,
    dispatches: Vec<Dispatch>,
    unacked: Vec<Completion>,
    sent: usize,
) -> bool {
    let mut accepted = false;
    for stream in &mut streams {
        if stream.first.is_none() {
            stream.first = Some(Ok("none"));
        }
        stream.tx = None;
    }
    settle().await;
    for stream in streams {
        stream.stop_reading.cancel();
        let end = tokio::time::timeout(Duration::from_secs(3600), stream.task)
            .await
            .expect("a Work stream did not end after its worker went away")
            .expect("a Work stream task");
        if let (Some(first), true) = (&stream.first, stream.predictable) {
            check_first(first, &end.opened);
        }
        match &end.opened {
            Ok(()) => accepted = true,
            Err(status) => check_status(status, sent),
        }
        if let Some(status) = &end.ended {
            check_status(status, sent);
        }
    }
    // A worker whose stream ended is unregistered at once (no clock advance needed).
    settle().await;
    let snapshot = router.snapshot();
    assert!(
        snapshot.workers.is_empty(),
        "workers still registered after their streams ended: {:?}",
        snapshot.workers
    );
    // Every dispatch ends once no worker is left.
    for d in dispatches {
        let Some(task) = d.task else { continue };
        let done = tokio::time::timeout(Duration::from_secs(24 * 3600), task)
            .await
            .expect("a dispatch did not end after every worker went away")
            .expect("a dispatch task");
        if let Err(failure) = done {
            check_message("dispatch failure", &failure.to_string(), sent);
        }
    }
    drop(unacked);
    let grace = config().lease_ttl + config().abandon_grace + Duration::from_secs(1);
    tokio::time::sleep(grace).await;
    let snapshot = router.snapshot();
    assert!(
        snapshot.workers.is_empty(),
        "workers registered again after every stream ended: {:?}",
        snapshot.workers
    );
    assert!(
        snapshot.queues.iter().all(|q| q.depth == 0),
        "calls left queued after every dispatch ended: {:?}",
        snapshot.queues
    );
    assert_eq!(
        snapshot.awaiting_ack, 0,
        "results awaiting an ack of a gone worker"
    );
    accepted
}
