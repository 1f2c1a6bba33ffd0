//! `RunSessionInteractive`: a client starts a session, or attaches to one, and follows it on a
//! bidirectional stream, sending user messages and approval decisions.
//!
//! 1. The first client message must be `start` (`InvalidArgument: first message must be
//!    start`). With `session_id` it attaches to that session; otherwise it starts one like
//!    `RunSession` (agent resolution, input, secrets, metadata, mode; `bundle_ref` is
//!    `Unimplemented`). Refusals end the RPC with their status before any server message.
//! 2. The server sends `session_started`. On attach it carries the conversation so far and is
//!    followed by the catch-up ([`phrony_engine::CatchUp`]): the assistant text of the turn in
//!    progress as one `text_delta`, that turn's tool calls, results and approval decisions,
//!    then the state (the pending approval and `awaiting_input{input_blocked_reason:
//!    "awaiting_approval"}`, or `awaiting_input{…"awaiting_tool"}`, or the `awaiting_input` of
//!    a parked conversation, or the terminal message of an ended session, which then ends the
//!    stream). A stream that started the session gets every event of it as it happens.
//! 3. Then live: every event of the session, in order, none skipped or repeated (the catch-up
//!    is read up to one event and the engine's subscription continues after it), mapped by the
//!    engine's [`SessionView`]: `tool_call`, `tool_result`, `approval_required`,
//!    `approval_decided` (every vote and decision, whoever cast it), `status` (non-terminal
//!    status changes), `awaiting_input` (a turn of a conversation ended), `text_delta`
//!    (streamed text; coalesced for a slow reader, never lost), and finally `completed`,
//!    `failed` or `cancelled`, after which the server ends the stream (`OK`).
//! 4. Client messages meanwhile: `user_message` goes to [`Engine::send_user_message`]
//!    (recorded at once and run in order, after the running turn if there is one);
//!    `tool_approval` is a vote through [`Engine::vote`], exactly like `DecideApproval`, by
//!    the stream's actor (the `phrony-actor` header, else the runtime's default), on the
//!    session's approval it names or, with an empty `approval_id`, its pending one
//!    ([`VoteTarget::InSession`]). Opening the stream needs the `run` permission; each vote
//!    also needs `approve`, so a runner attached interactively cannot approve (its vote is
//!    refused, naming the missing permission, and the stream goes on).
//!
//! **Refusals keep the stream open.** A client message the runtime refuses (empty text, a
//! task-mode session, a user message past `RUNTIME_MAX_QUEUED_USER_MESSAGES` waiting ones, a
//! duplicate vote, a missing comprehension acknowledgement, an unknown approval, malformed
//! edited arguments, …) is logged and answered with a `status` message
//! carrying the session's current status and the refusal as `reason`; nothing is ended. A user
//! message while input is blocked by a limit is answered with `awaiting_input` carrying the
//! reason. Only protocol violations end the stream with `InvalidArgument`: a second `start`
//! (`unexpected start after attach`) or a message without a body.
//!
//! **Detaching.** Closing the client side, or dropping the stream, only detaches: the session
//! carries on. After a half-close the server keeps sending until the session ends.
//!
//! **Shutdown.** When the runtime starts shutting down, open streams end with `UNAVAILABLE`
//! (their sessions carry on after the restart; clients attach again) and new ones are refused,
//! so attached clients do not hold the server for the grace period.
//!
//! **Back-pressure.** Server messages go through a small bounded channel, and the stream task
//! waits for room, so a slow reader slows the task, which slows its engine subscription, which
//! then reads the session's events from the store when it catches up: nothing is dropped.

use futures::StreamExt as _;
use phrony_auth::{Attribution, Permission, Principal};
use phrony_dispatch::CancellationToken;
use phrony_engine::{
    AttachFrom, Attachment, Engine, SessionStatus, SessionUpdate, SessionView, Subscription,
    VoteTarget,
};
use phrony_proto::runtime::v1 as pb;
use tokio::sync::mpsc;
use tonic::codegen::BoxStream;
use tonic::{Status, Streaming};

use super::RuntimeService;
use super::sessions::StartRequest;
use crate::convert::interactive::{self as conv, ApprovalDecisionRequest, ClientMessage};
use crate::convert::{engine_status, sessions::session_id};

/// Server messages that may wait for a slow reader.
const OUTBOX: usize = 16;

type Outbox = mpsc::Sender<Result<pb::RunSessionInteractiveServerMsg, Status>>;

impl RuntimeService {
    /// Opens one interactive stream; see the module docs. `actor` is the stream's actor.
    pub(super) async fn run_session_interactive_impl(
        &self,
        mut inbound: Streaming<pb::RunSessionInteractiveClientMsg>,
        actor: Attribution,
        principal: Principal,
    ) -> Result<BoxStream<pb::RunSessionInteractiveServerMsg>, Status> {
        let engine = self.engine()?.clone();
        if self.session_streams.is_cancelled() {
            return Err(shutting_down());
        }
        let start = match inbound.message().await? {
            Some(msg) => match conv::client_message(msg)? {
                ClientMessage::Start(start) => start,
                _ => return Err(Status::invalid_argument(conv::FIRST_MESSAGE_MUST_BE_START)),
            },
            None => return Err(Status::invalid_argument(conv::FIRST_MESSAGE_MUST_BE_START)),
        };
        let (id, from) = if start.session_id.trim().is_empty() {
            let handle = self
                .start_session(StartRequest {
                    agent_ref: start.agent_ref,
                    bundle_ref: start.bundle_ref,
                    input: start.input,
                    resolved_secrets: start.resolved_secrets,
                    metadata: start.metadata,
                    mode: start.mode,
                    actor: actor.clone(),
                })
                .await?;
            (handle.id, AttachFrom::Start)
        } else {
            (session_id(&start.session_id)?.to_owned(), AttachFrom::Now)
        };
        let Attachment {
            catch_up,
            view,
            updates,
        } = engine.attach(&id, from).await.map_err(engine_status)?;
        tracing::info!(
            session_id = %id, %actor, attach = (from == AttachFrom::Now),
            status = %catch_up.session.status, "interactive stream open"
        );
        let (tx, rx) = mpsc::channel(OUTBOX);
        let mut first = vec![conv::session_started(&catch_up)];
        first.extend(catch_up.activities.iter().map(conv::activity));
        let stream = InteractiveStream {
            engine,
            session_id: id,
            actor,
            may_approve: principal
                .require(Permission::Approve)
                .map(|()| principal.route_restriction())
                .map_err(|d| d.to_string()),
            view,
            tx,
            stop: self.session_streams.clone(),
        };
        // `updates` is `None` exactly when the catch-up ends with the session's terminal item.
        tokio::spawn(stream.run(first, updates, inbound));
        Ok(Box::pin(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|msg| (msg, rx))
        })))
    }
}

/// One open stream: follows the session and forwards the client's messages to the engine.
struct InteractiveStream {
    engine: Engine,
    session_id: String,
    actor: Attribution,
    /// Whether the stream's principal may vote (the refusal naming the missing permission
    /// otherwise): opening the stream needs only `run`.
    /// (when it may: the routes its votes are restricted to, empty for any).
    may_approve: Result<Vec<String>, String>,
    view: SessionView,
    tx: Outbox,
    /// The runtime is shutting down.
    stop: CancellationToken,
}

fn shutting_down() -> Status {
    Status::unavailable(
        "the runtime is shutting down; the session carries on when it is back (attach again)",
    )
}

/// Why the stream task stops.
enum End {
    /// The client went away.
    Gone,
    /// The session ended (its terminal message was sent).
    SessionEnded,
    /// A protocol violation or a broken subscription.
    Error(Status),
}

impl InteractiveStream {
    async fn run(
        mut self,
        first: Vec<pb::RunSessionInteractiveServerMsg>,
        updates: Option<Subscription>,
        mut inbound: Streaming<pb::RunSessionInteractiveClientMsg>,
    ) {
        let end = async {
            for msg in first {
                self.send(msg).await?;
            }
            let Some(mut updates) = updates else {
                return Err(End::SessionEnded);
            };
            let mut reading = true;
            loop {
                tokio::select! {
                    () = self.tx.closed() => return Err(End::Gone),
                    () = self.stop.cancelled() => return Err(End::Error(shutting_down())),
                    update = updates.recv() => self.forward(update).await?,
                    msg = inbound.next(), if reading => match msg {
                        Some(Ok(msg)) => self.handle(msg).await?,
                        // Half-closed (or broken) client side: the client only detaches its
                        // sending half; the session and this stream carry on.
                        Some(Err(_)) | None => reading = false,
                    },
                }
            }
        }
        .await;
        let reason = match end {
            Ok(()) | Err(End::SessionEnded) => "session ended",
            Err(End::Gone) => "client detached",
            Err(End::Error(status)) => {
                tracing::info!(
                    session_id = %self.session_id, code = ?status.code(),
                    message = status.message(), "interactive stream ended with an error"
                );
                let _ = self.tx.send(Err(status)).await;
                "error"
            }
        };
        tracing::info!(session_id = %self.session_id, reason, "interactive stream closed");
    }

    async fn send(&self, msg: pb::RunSessionInteractiveServerMsg) -> Result<(), End> {
        self.tx.send(Ok(msg)).await.map_err(|_| End::Gone)
    }

    /// Sends the messages of one update; ends after the session's terminal message.
    async fn forward(&mut self, update: Option<SessionUpdate>) -> Result<(), End> {
        let Some(update) = update else {
            // The subscription ends after the terminal event, which was forwarded before, so
            // this is the store failing.
            return Err(End::Error(Status::unavailable(format!(
                "lost the event stream of session {}; attach again",
                self.session_id
            ))));
        };
        let activities = self
            .view
            .update(&update)
            .map_err(|e| End::Error(engine_status(e)))?;
        for activity in activities {
            self.send(conv::activity(&activity)).await?;
            if activity.is_terminal() {
                return Err(End::SessionEnded);
            }
        }
        Ok(())
    }

    async fn handle(&mut self, msg: pb::RunSessionInteractiveClientMsg) -> Result<(), End> {
        if msg.body.is_none() {
            // A message this runtime cannot read: the client speaks another protocol version.
            return Err(End::Error(Status::invalid_argument(conv::NO_BODY)));
        }
        match conv::client_message(msg) {
            Ok(ClientMessage::Start(_)) => Err(End::Error(Status::invalid_argument(
                "unexpected start after attach",
            ))),
            Ok(ClientMessage::UserMessage(text)) => self.user_message(&text).await,
            Ok(ClientMessage::Approval(decision)) => self.approval(decision).await,
            // A malformed decision: refused, the stream goes on.
            Err(status) => self.refuse(status.message()).await,
        }
    }

    async fn user_message(&mut self, text: &str) -> Result<(), End> {
        if let Some(reason) = self.view.input_blocked() {
            tracing::info!(
                session_id = %self.session_id, %reason,
                "user message refused: input is blocked"
            );
            let blocked = self.view.awaiting_input();
            return self.send(conv::awaiting_input_msg(&blocked)).await;
        }
        match self
            .engine
            .send_user_message(&self.session_id, &self.actor, text)
            .await
        {
            Ok(Some(turn)) => {
                tracing::debug!(session_id = %self.session_id, turn, "user message queued");
                Ok(())
            }
            Ok(None) => {
                tracing::debug!(
                    session_id = %self.session_id,
                    "user message queued for the replica driving the session"
                );
                Ok(())
            }
            Err(e) => self.refuse(engine_status(e).message()).await,
        }
    }

    async fn approval(&mut self, decision: ApprovalDecisionRequest) -> Result<(), End> {
        let routes = match self.may_approve.clone() {
            Ok(routes) => routes,
            Err(denied) => return self.refuse(&denied).await,
        };
        let target = VoteTarget::InSession {
            session_id: self.session_id.clone(),
            approval_id: decision.approval_id,
        };
        let mut vote = decision.vote;
        vote.actor.clone_from(&self.actor);
        vote.routes = routes;
        match self.engine.vote(target, vote).await {
            Ok(answer) => {
                tracing::info!(
                    session_id = %self.session_id, approval_id = %answer.approval.id,
                    actor = %self.actor, status = %answer.approval.status,
                    session_status = %answer.session_status, "approval vote recorded on the stream"
                );
                Ok(())
            }
            Err(e) => self.refuse(engine_status(e).message()).await,
        }
    }

    /// Reports a refused client message without ending anything: a `status` with the
    /// session's current status and the refusal as reason.
    async fn refuse(&mut self, message: &str) -> Result<(), End> {
        tracing::info!(session_id = %self.session_id, actor = %self.actor, %message, "client message refused");
        let status = self.view.status().unwrap_or(SessionStatus::Running);
        self.send(conv::status(status, Some(message.to_owned())))
            .await
    }
}
