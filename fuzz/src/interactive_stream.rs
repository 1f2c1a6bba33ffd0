//! The `interactive_stream` target: a scripted client speaks `RunSessionInteractive` to the real
//! tonic service ([`phrony_grpc::RuntimeService`], called in-process through its generated
//! trait) over a real engine on a SQLite ledger and the scripted `stub` model. The request body
//! is a real gRPC body decoded by tonic's codec, so arbitrary bytes (frames, lengths, protobuf)
//! can be injected as well as well-formed messages.
//!
//! One engine and one ledger (the crash soak's agent, `tests/fixtures/soak`, published and
//! deployed) are built per thread, once; each input opens one stream. The input is a script of
//! operations (one opcode byte, then its operands): send a `start` (a new session, an attach to
//! the previous input's session, malformed refs, inputs, session ids, secrets), a user message,
//! a tool approval (malformed ids, arguments and resolutions included), an empty message, raw
//! body bytes, read what the server sent, half-close.
//!
//! Checked: no panic; a stream whose first message is not a start is refused with the
//! documented status; each message the runtime refuses for certain (empty text, an approval id
//! that is not a UUID or names no approval) is answered with a `status` carrying the refusal,
//! and the stream goes on; a second start or an empty message ends the stream with its
//! `INVALID_ARGUMENT`; every server message and status is bounded; and once the session is
//! cancelled the stream ends (it does not hang).

use std::cell::RefCell;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use futures::channel::mpsc;
use http_body::Frame;
use http_body_util::StreamBody;
use pb::run_session_interactive_client_msg::Body as ClientBody;
use pb::run_session_interactive_server_msg::Body as ServerBody;
use pb::runtime_server::Runtime as _;
use phrony_auth::{Principal, Role, Verification};
use phrony_engine::{
    DefaultProviderFactory, Engine, EngineConfig, EngineDeps, LedgerStore, SystemClock,
};
use phrony_grpc::RuntimeService;
use phrony_ledger::Ledger;
use phrony_proto::runtime::v1 as pb;
use phrony_providers::ProviderEnv;
use prost::Message as _;
use tonic::codec::Streaming;
use tonic::codegen::{BoxStream, Bytes};
use tonic::{Code, Request, Status};

/// At most this many operations are read from one input.
const MAX_OPS: usize = 48;
/// How long a reply the runtime owes may take before the input counts as a hang (real time:
/// the ledger is a real SQLite file).
const REPLY: Duration = Duration::from_secs(5);
/// How long "read what the server sent" waits for the next message.
const IDLE: Duration = Duration::from_millis(20);

const FIRST_MESSAGE_MUST_BE_START: &str = "first message must be start";
const NO_BODY: &str = "client message has no body; expected start, user_message or tool_approval";
const UNEXPECTED_START: &str = "unexpected start after attach";

/// The engine, the service over it and the previous input's session, per thread.
struct Fixture {
    runtime: tokio::runtime::Runtime,
    service: RuntimeService,
    last_session: RefCell<Option<String>>,
    _dir: tempfile::TempDir,
}

thread_local! {
    static FIXTURE: Fixture = Fixture::new();
}

fn soak_agent() -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/soak/agent.yaml");
    let compiled = phrony_manifest::load_agent(&path)
        .unwrap_or_else(|d| panic!("the soak agent {} compiles:\n{d}", path.display()));
    compiled.agent.snapshot_json()
}

fn agent_ref(version: &str) -> pb::AgentRef {
    pb::AgentRef {
        namespace: "soak".to_owned(),
        name: "soak-agent".to_owned(),
        version: version.to_owned(),
    }
}

impl Fixture {
    fn new() -> Self {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a current-thread runtime");
        let dir = tempfile::tempdir().expect("a scratch directory");
        let url = format!("sqlite://{}", dir.path().join("ledger.db").display());
        let service = runtime.block_on(async {
            let ledger = Ledger::connect(&url)
                .await
                .expect("the scratch ledger opens");
            ledger.migrate().await.expect("the scratch ledger migrates");
            let engine = Engine::new(EngineDeps {
                store: Arc::new(LedgerStore::new(ledger.clone(), None)),
                // No worker: every tool call fails at once as `no_handler` and goes back to
                // the model, so sessions move on to the approvals.
                router: None,
                providers: Arc::new(DefaultProviderFactory::new(ProviderEnv {
                    stub_enabled: true,
                    ..ProviderEnv::default()
                })),
                clock: Arc::new(SystemClock),
                config: EngineConfig::default(),
            });
            let router = phrony_dispatch::Router::new(phrony_dispatch::RouterConfig::default())
                .expect("the default router config is valid");
            let service = RuntimeService::new(ledger, "fuzz-operator", router).with_engine(engine);
            service
                .publish(Request::new(pb::PublishRequest {
                    manifest: soak_agent(),
                    actor: "fuzz-operator".to_owned(),
                }))
                .await
                .expect("the soak agent publishes");
            service
                .deploy(Request::new(pb::DeployRequest {
                    agent_ref: Some(agent_ref("0.1.0")),
                    actor: "fuzz-operator".to_owned(),
                    allow_new_secret_endpoints: false,
                }))
                .await
                .expect("the soak agent deploys");
            service
        });
        Self {
            runtime,
            service,
            last_session: RefCell::new(None),
            _dir: dir,
        }
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

fn start(s: &mut Script<'_>, last_session: Option<&str>) -> pb::RunSessionInteractiveStart {
    let agent_ref = match s.pick(5) {
        0 | 1 => Some(agent_ref("")),
        2 => Some(agent_ref("0.1.0")),
        3 => Some(agent_ref("9.9.9")),
        _ => None,
    };
    let input = match s.pick(5) {
        0 | 1 => br#"{"order_id":"ORD-7"}"#.to_vec(),
        2 => Vec::new(),
        3 => b"{not json".to_vec(),
        _ => format!("\"{}\"", "i".repeat(300_000)).into_bytes(),
    };
    let session_id = match s.pick(6) {
        0..=2 => String::new(),
        3 => last_session.unwrap_or_default().to_owned(),
        4 => "not-a-session".to_owned(),
        _ => "00000000-0000-4000-8000-000000000000".to_owned(),
    };
    let mode = [0, 1, 2, 7][s.pick(4)];
    let mut resolved_secrets = std::collections::HashMap::new();
    let mut metadata = std::collections::HashMap::new();
    match s.pick(4) {
        0 => {
            resolved_secrets.insert("openai".to_owned(), b"sk-x".to_vec());
        }
        1 => {
            metadata.insert("k".repeat(10_000), "v".to_owned());
        }
        _ => {
            metadata.insert("ticket_id".to_owned(), "T-1".to_owned());
        }
    }
    pb::RunSessionInteractiveStart {
        agent_ref,
        input,
        session_id,
        resolved_secrets,
        bundle_ref: None,
        mode,
        metadata,
    }
}

/// A user message and whether the runtime refuses it for certain (its refusal reason).
fn user_message(
    s: &mut Script<'_>,
) -> (pb::RunSessionInteractiveUserMessage, Option<&'static str>) {
    let (text, refused) = match s.pick(5) {
        0 => (String::new(), Some("")),
        1 => ("   ".to_owned(), Some("")),
        2 => ("hello".to_owned(), None),
        3 => ("\u{0}\u{202e}".to_owned(), None),
        _ => ("u".repeat(200_000), None),
    };
    (pb::RunSessionInteractiveUserMessage { text }, refused)
}

/// A tool approval and, when the runtime refuses it for certain, what the refusal says.
fn tool_approval(
    s: &mut Script<'_>,
) -> (pb::RunSessionInteractiveToolApproval, Option<&'static str>) {
    let (approval_id, refused) = match s.pick(4) {
        0 | 1 => (String::new(), None),
        2 => ("not-a-uuid".to_owned(), Some("approval_id must be a UUID")),
        _ => ("00000000-0000-4000-8000-000000000001".to_owned(), Some("")),
    };
    let (args, bad_args) = match s.pick(4) {
        0 | 1 => (Vec::new(), false),
        2 => (
            br#"{"order_id":"ORD-7","amount":100,"currency":"EUR"}"#.to_vec(),
            false,
        ),
        _ => (b"{nope".to_vec(), true),
    };
    let resolution = ["", "happened", "resend", "fail", "bogus"][s.pick(5)];
    let refused = if refused == Some("approval_id must be a UUID") {
        refused
    } else if bad_args || resolution == "bogus" {
        Some("tool_approval.")
    } else {
        refused
    };
    (
        pb::RunSessionInteractiveToolApproval {
            approval_id,
            approved: s.pick(2) == 0,
            comment: ["", "ok", "looks right"][s.pick(3)].to_owned(),
            args,
            comprehension_acknowledged: s.pick(2) == 0,
            resolution: resolution.to_owned(),
            result: Vec::new(),
        },
        refused,
    )
}

/// One gRPC message frame (uncompressed).
fn frame(msg: &pb::RunSessionInteractiveClientMsg) -> Bytes {
    let body = msg.encode_to_vec();
    let mut out = Vec::with_capacity(5 + body.len());
    out.push(0);
    out.extend_from_slice(&u32::try_from(body.len()).unwrap_or(u32::MAX).to_be_bytes());
    out.extend_from_slice(&body);
    Bytes::from(out)
}

type BodyTx = mpsc::UnboundedSender<Result<Frame<Bytes>, std::io::Error>>;

/// The client's side of an open stream.
struct Open {
    tx: Option<BodyTx>,
    responses: BoxStream<pb::RunSessionInteractiveServerMsg>,
    session_id: String,
    /// The stream's end: `Some(Ok(()))` after a clean end, `Some(Err)` with its status.
    ended: Option<Result<(), Status>>,
    /// A terminal message (completed, failed, cancelled) was received.
    terminal: bool,
    /// Bytes the client sent (the bound of what an error may quote).
    sent: usize,
}

impl Open {
    /// Reads one server message within `wait`; `None` when none came (or the stream ended).
    async fn next(&mut self, wait: Duration) -> Option<pb::RunSessionInteractiveServerMsg> {
        if self.ended.is_some() {
            return None;
        }
        match tokio::time::timeout(wait, self.responses.next()).await {
            Err(_elapsed) => None,
            Ok(None) => {
                self.ended = Some(Ok(()));
                None
            }
            Ok(Some(Err(status))) => {
                check_status(&status, self.sent);
                self.ended = Some(Err(status));
                None
            }
            Ok(Some(Ok(msg))) => {
                check_server_msg(&msg, self.sent);
                if matches!(
                    msg.body,
                    Some(
                        ServerBody::Completed(_) | ServerBody::Failed(_) | ServerBody::Cancelled(_)
                    )
                ) {
                    self.terminal = true;
                }
                if let Some(ServerBody::SessionStarted(started)) = &msg.body {
                    self.session_id.clone_from(&started.session_id);
                }
                Some(msg)
            }
        }
    }

    /// Reads until nothing comes for `IDLE`.
    async fn drain(&mut self) {
        for _ in 0..256 {
            if self.next(IDLE).await.is_none() {
                return;
            }
        }
    }

    /// Waits for the refusal of a message the runtime refuses for certain: a `status` whose
    /// reason contains `reason`, unless the session ends first.
    async fn expect_refusal(&mut self, reason: &str) {
        loop {
            if self.ended.is_some() || self.terminal {
                return;
            }
            let Some(msg) = self.next(REPLY).await else {
                assert!(
                    self.ended.is_some(),
                    "a refused message got no answer within {REPLY:?} (expected a status with {reason:?})"
                );
                return;
            };
            match &msg.body {
                Some(ServerBody::Status(status))
                    if !status.reason.is_empty() && status.reason.contains(reason) =>
                {
                    return;
                }
                // A user message while input is blocked is answered with the reason.
                Some(ServerBody::AwaitingInput(w)) if !w.input_blocked_reason.is_empty() => return,
                _ => {}
            }
        }
    }

    /// After a protocol violation: the stream must end with `INVALID_ARGUMENT: message`,
    /// unless the session ended first.
    async fn expect_violation(&mut self, message: &str) {
        let deadline = tokio::time::Instant::now() + REPLY;
        while self.ended.is_none() && tokio::time::Instant::now() < deadline {
            self.next(REPLY).await;
        }
        match &self.ended {
            Some(Err(status)) => assert_eq!(
                (status.code(), status.message()),
                (Code::InvalidArgument, message),
                "the wrong end of a stream after a protocol violation"
            ),
            Some(Ok(())) => assert!(
                self.terminal,
                "a stream ended cleanly after a protocol violation without the session ending"
            ),
            None => panic!("a stream did not end within {REPLY:?} after {message:?}"),
        }
    }
}

/// The largest message an error may carry: a fixed allowance plus a multiple of what the
/// client sent (an error may quote a field, but must not grow beyond).
fn check_message(what: &str, message: &str, sent: usize) {
    let bound = 64 * 1024 + 8 * sent;
    assert!(
        message.len() <= bound,
        "{what}: {} bytes of message for {sent} bytes sent",
        message.len()
    );
    assert!(!message.trim().is_empty(), "{what}: an empty message");
}

fn check_status(status: &Status, sent: usize) {
    assert!(
        matches!(
            status.code(),
            Code::InvalidArgument
                | Code::NotFound
                | Code::Aborted
                | Code::AlreadyExists
                | Code::FailedPrecondition
                | Code::PermissionDenied
                | Code::Unimplemented
                | Code::ResourceExhausted
                // A frame announcing more than the 4 MiB message bound (tonic's decoder; the
                // README's Limits table).
                | Code::OutOfRange
                | Code::Unavailable
                | Code::Internal
        ),
        "an interactive stream ended with an undocumented code {:?}: {}",
        status.code(),
        status.message()
    );
    check_message("interactive stream status", status.message(), sent);
}

fn check_server_msg(msg: &pb::RunSessionInteractiveServerMsg, sent: usize) {
    assert!(msg.body.is_some(), "a server message without a body");
    if let Some(ServerBody::Status(status)) = &msg.body {
        assert!(
            !status.status.is_empty(),
            "a status message without a status"
        );
        if !status.reason.is_empty() {
            check_message("refusal reason", &status.reason, sent);
        }
    }
}

/// The principal the stream runs as: the local admin, or a runner that may not vote.
fn principal(runner: bool) -> Option<Principal> {
    runner.then(|| Principal {
        name: "runner-bot".to_owned(),
        verification: Verification::Token,
        roles: [Role::Runner].into(),
        routes: Vec::new(),
        tools: Vec::new(),
    })
}

/// The body: see the module docs. Returns whether the stream opened.
pub fn interactive_stream(data: &[u8]) -> bool {
    FIXTURE.with(|f| f.runtime.block_on(drive(f, data)))
}

/// What one scripted client message is.
enum Sent {
    /// Well-formed, and refused for certain with a status containing this.
    Refused(&'static str),
    /// A protocol violation that ends the stream with this `INVALID_ARGUMENT` message.
    Violation(&'static str),
    /// Anything else (its effect depends on the session's state).
    Other,
}

/// The next client message of the script, or raw body bytes.
fn next_message(
    s: &mut Script<'_>,
    last: Option<&str>,
) -> Option<(Bytes, Option<&'static str>, Sent)> {
    let op = s.byte()?;
    let msg = |body| pb::RunSessionInteractiveClientMsg { body };
    Some(match op % 6 {
        0 => (
            frame(&msg(Some(ClientBody::Start(start(s, last))))),
            Some("start"),
            Sent::Violation(UNEXPECTED_START),
        ),
        1 => {
            let (m, refused) = user_message(s);
            let sent = refused.map_or(Sent::Other, Sent::Refused);
            (
                frame(&msg(Some(ClientBody::UserMessage(m)))),
                Some("user_message"),
                sent,
            )
        }
        2 => {
            let (a, refused) = tool_approval(s);
            let sent = refused.map_or(Sent::Other, Sent::Refused);
            (
                frame(&msg(Some(ClientBody::ToolApproval(a)))),
                Some("tool_approval"),
                sent,
            )
        }
        3 => (frame(&msg(None)), Some("none"), Sent::Violation(NO_BODY)),
        4 => {
            let len = usize::from(s.byte().unwrap_or(0));
            (Bytes::copy_from_slice(s.take(len)), None, Sent::Other)
        }
        _ => (Bytes::new(), Some("read"), Sent::Other),
    })
}

async fn drive(f: &Fixture, data: &[u8]) -> bool {
    let mut s = Script(data);
    let runner = s.pick(4) == 0;
    let last = f.last_session.borrow().clone();
    let (tx, rx) = mpsc::unbounded::<Result<Frame<Bytes>, std::io::Error>>();
    let body = StreamBody::new(rx);
    let decoder = tonic_prost::ProstDecoder::<pb::RunSessionInteractiveClientMsg>::default();
    let inbound = Streaming::new_request(decoder, body, None, Some(phrony_grpc::MAX_MESSAGE_BYTES));
    let mut request = Request::new(inbound);
    if let Some(p) = principal(runner) {
        request.extensions_mut().insert(p);
    }

    // The first message (or bytes), sent before the RPC reads it.
    let first = next_message(&mut s, last.as_deref());
    let sent = data.len() + first.as_ref().map_or(0, |(bytes, _, _)| bytes.len());
    let first_kind = match &first {
        Some((_, Some("read"), _)) | None => Some("none-sent"),
        Some((bytes, kind, _)) => {
            let _ = tx.unbounded_send(Ok(Frame::data(bytes.clone())));
            *kind
        }
    };
    // Nothing, or raw bytes: the body ends there (a partial frame would wait for more).
    let tx = if matches!(first_kind, Some("none-sent") | None) {
        drop(tx);
        None
    } else {
        Some(tx)
    };
    let opened = tokio::time::timeout(REPLY, f.service.run_session_interactive(request)).await;
    let opened = opened.expect("RunSessionInteractive did not answer its first message");
    let responses = match opened {
        Err(status) => {
            check_status(&status, sent);
            let expected = match first_kind {
                Some("user_message") => Some(FIRST_MESSAGE_MUST_BE_START),
                Some("none" | "none-sent") => Some(if first_kind == Some("none") {
                    NO_BODY
                } else {
                    FIRST_MESSAGE_MUST_BE_START
                }),
                _ => None,
            };
            if let Some(expected) = expected {
                assert_eq!(
                    (status.code(), status.message()),
                    (Code::InvalidArgument, expected),
                    "the wrong refusal of a first message ({first_kind:?})"
                );
            }
            return false;
        }
        Ok(response) => response.into_inner(),
    };
    assert!(
        matches!(first_kind, Some("start") | None),
        "a stream opened on a first message that is not a start ({first_kind:?})"
    );
    let mut open = Open {
        tx,
        responses,
        session_id: String::new(),
        ended: None,
        terminal: false,
        sent,
    };
    // The first server message is `session_started`.
    let started = open.next(REPLY).await;
    assert!(
        matches!(&started, Some(m) if matches!(m.body, Some(ServerBody::SessionStarted(_)))),
        "the first server message is not session_started: {started:?} (end: {:?})",
        open.ended
    );
    *f.last_session.borrow_mut() = Some(open.session_id.clone());

    // Raw bytes mid-stream may break the framing: later messages are then not predicted.
    let mut framing_known = true;
    for _ in 0..MAX_OPS {
        if open.ended.is_some() {
            break;
        }
        let Some((bytes, kind, sent)) = next_message(&mut s, last.as_deref()) else {
            break;
        };
        if kind == Some("read") {
            open.drain().await;
            continue;
        }
        if s.pick(8) == 0 {
            // The client half-closes: the stream carries on without it.
            open.tx = None;
        }
        let Some(tx) = &open.tx else { continue };
        open.sent += bytes.len();
        let _ = tx.unbounded_send(Ok(Frame::data(bytes)));
        // Raw bytes may break the stream's framing: their effect is not predicted.
        if kind.is_none() {
            framing_known = false;
        }
        if !framing_known {
            open.drain().await;
            continue;
        }
        match sent {
            // A runner's vote is refused for its missing permission first.
            Sent::Refused(_) if runner && kind == Some("tool_approval") => {
                open.expect_refusal("").await;
            }
            Sent::Refused(reason) => open.expect_refusal(reason).await,
            Sent::Violation(message) => {
                open.expect_violation(message).await;
                break;
            }
            Sent::Other => open.drain().await,
        }
    }

    // The client half-closes and the session is cancelled (so no session of an input stays
    // live in the engine): the stream must end.
    open.tx = None;
    let _ = f
        .service
        .cancel_session(Request::new(pb::CancelSessionRequest {
            session_id: open.session_id.clone(),
        }))
        .await;
    {
        let deadline = tokio::time::Instant::now() + REPLY;
        while open.ended.is_none() {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the stream did not end within {REPLY:?} of its session's cancellation"
            );
            open.next(REPLY).await;
        }
    }
    true
}
