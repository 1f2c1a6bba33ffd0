//! `Runtime.Work`: the bidirectional stream tool workers keep open.
//!
//! The protocol state lives in `phrony-dispatch`; this module only pumps messages:
//!
//! 1. The first client message must be `register` (else the stream ends with the reference's
//!    statuses: `register before heartbeat|result|nack`, `register message is required`). It is
//!    converted to a [`WorkerHello`] and registered with [`Router::connect`].
//! 2. The response stream is the connection's [`Outbox`], converted message by message; when
//!    the router drops the worker (lease expired, superseded, unresponsive) it ends with the
//!    router's status.
//! 3. A task feeds every later client message to [`WorkerConnection::handle`]; a protocol
//!    error ends the response stream with that error's status. When the client closes or
//!    breaks its side, or the response stream goes away, the connection is dropped, which
//!    unregisters the worker (its dispatched calls become indeterminate).
//! 4. On daemon shutdown ([`WorkHub::stop`]) each response stream sends what is already queued
//!    and ends with `OK`, so SDK workers return from `connect()` without an error.
//!
//! Worker restrictions (issue #12), for a principal the edge verified (an unverified principal,
//! `local` mode, keeps the behaviour above):
//!
//! - every advertised `tool@version` must satisfy [`Principal::may_serve`] (the credential's
//!   tool patterns; an admin serves anything), else `PERMISSION_DENIED` naming the tool and the
//!   credential, logged at warn;
//! - the worker id is bound to the credential (name and verification) that first registered
//!   it, for the daemon's lifetime: the same credential reconnecting takes the stream over as
//!   before, another one is `PERMISSION_DENIED` and the registered worker keeps its stream;
//! - the workload identity the `RUNTIME_TOOL_ALLOWLIST` checks is the principal's name, not
//!   what the worker says about itself.
//!
//! Descriptor pins (issue #18) are the router's rule ([`Router::connect`]): a handler whose
//! non-empty `descriptor_hash` matches no pin of a published agent version for its
//! `tool@version` (or an empty one under `RUNTIME_REQUIRE_DESCRIPTOR_PINS`) ends the stream with
//! `FAILED_PRECONDITION` naming the tool, the expected pins and the received hash, after the
//! refusal is recorded (`worker.descriptor_refused`); pins that cannot be read are `UNAVAILABLE`.
//!
//! A stream that sends nothing within the lease (`RUNTIME_WORKER_LEASE_TTL`) is closed with
//! `DEADLINE_EXCEEDED`, so idle unregistered connections cannot pile up.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures::{Stream, StreamExt as _};
use phrony_auth::Principal;
use phrony_dispatch::{
    CancellationToken, DispatchError, FromWorker, Outbox, Router, WorkerConnection, WorkerHello,
};
use phrony_proto::runtime::v1 as pb;
use tokio::sync::oneshot;
use tonic::Status;

use crate::convert::{self, WorkerMessage};

/// The router behind the Work stream, and the signal that ends every worker stream.
///
/// The daemon reaches it only through [`crate::RuntimeService`]; it is `pub` (hidden) so the
/// `work_stream` fuzz target drives the real Work-stream handling without a network socket.
#[derive(Debug, Clone)]
pub struct WorkHub {
    router: Router,
    stop: CancellationToken,
}

impl WorkHub {
    /// A hub over `router`.
    #[must_use]
    pub fn new(router: Router) -> Self {
        Self {
            router,
            stop: CancellationToken::new(),
        }
    }

    pub(crate) fn router(&self) -> &Router {
        &self.router
    }

    /// Ends every open Work stream with `OK` (after the messages already queued for it) and
    /// refuses streams that have not registered yet.
    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// Serves one Work stream: waits for the register, connects the worker and returns the
    /// response stream. Errors before registration are returned as the RPC's status.
    ///
    /// A verified `principal` (see the module docs) is held to its credential: every handler
    /// must satisfy [`Principal::may_serve`], the worker id is bound to the credential, and
    /// the allowlist's workload identity is the principal's name.
    ///
    /// # Errors
    /// The stream's status when the first message is not a valid register, none comes within
    /// the lease, the runtime is stopping, or the router refuses the registration.
    pub async fn open<S>(
        &self,
        mut inbound: S,
        principal: &Principal,
    ) -> Result<WorkResponse, Status>
    where
        S: Stream<Item = Result<pb::WorkClientMsg, Status>> + Send + Unpin + 'static,
    {
        let mut hello = self.await_register(&mut inbound).await?;
        let worker_id = hello.worker_id.clone();
        let handlers: Vec<String> = hello.handlers.iter().map(|h| h.key()).collect();
        let connected = if principal.verification.is_verified() {
            let credential = credential(principal);
            if let Err(error) = check_handlers(&hello, principal, &credential) {
                tracing::warn!(
                    %worker_id,
                    principal = %principal.name,
                    verification = %principal.verification,
                    %error,
                    "work stream refused: handler not allowed for the credential"
                );
                return Err(convert::dispatch_status(&error));
            }
            if !hello.workload_identity.is_empty() && hello.workload_identity != principal.name {
                tracing::warn!(
                    %worker_id,
                    principal = %principal.name,
                    claimed = %hello.workload_identity,
                    "worker's self-asserted workload identity ignored: the allowlist checks the credential's name"
                );
            }
            hello.workload_identity.clone_from(&principal.name);
            self.router.connect_as(hello, &credential).await
        } else {
            self.router.connect(hello).await
        };
        let (conn, outbox) = connected.map_err(|error| {
            if matches!(error, DispatchError::WorkerIdBound { .. }) {
                tracing::warn!(%worker_id, principal = %principal.name, %error, "work stream refused at registration");
            } else {
                tracing::info!(%worker_id, %error, "work stream refused at registration");
            }
            convert::dispatch_status(&error)
        })?;
        tracing::info!(%worker_id, ?handlers, generation = conn.generation(), "work stream open");
        let (ended_tx, ended_rx) = oneshot::channel();
        tokio::spawn(read_worker_messages(inbound, conn, ended_tx));
        Ok(WorkResponse {
            worker_id,
            outbox,
            ended: Some(ended_rx),
            stop: Box::pin(self.stop.clone().cancelled_owned()),
            done: false,
        })
    }

    /// Reads the first client message, which must be a register.
    async fn await_register<S>(&self, inbound: &mut S) -> Result<WorkerHello, Status>
    where
        S: Stream<Item = Result<pb::WorkClientMsg, Status>> + Unpin,
    {
        let wait = self.router.config().lease_ttl;
        let first = tokio::select! {
            biased;
            () = self.stop.cancelled() => {
                return Err(convert::dispatch_status(&DispatchError::ShuttingDown));
            }
            first = tokio::time::timeout(wait, inbound.next()) => first,
        };
        let first = match first {
            Err(_elapsed) => {
                tracing::info!(
                    wait_ms = wait.as_millis(),
                    "work stream closed: no register message"
                );
                return Err(Status::deadline_exceeded(format!(
                    "no register message within {}ms of opening the Work stream",
                    wait.as_millis()
                )));
            }
            // The client gave up before registering (its error is already its own).
            Ok(Some(Err(status))) => return Err(status),
            Ok(None) => {
                return Err(convert::dispatch_status(&DispatchError::MessageRequired {
                    message: "register",
                }));
            }
            Ok(Some(Ok(msg))) => msg,
        };
        let refused = |error: DispatchError| {
            tracing::info!(%error, "work stream refused before registration");
            convert::dispatch_status(&error)
        };
        match convert::work_client_msg(first) {
            Ok(WorkerMessage::Register(hello)) => Ok(hello),
            Ok(WorkerMessage::Other(msg)) => Err(refused(DispatchError::RegisterFirst {
                message: kind(&msg),
            })),
            // An empty first message: what is missing is the register.
            Err(DispatchError::UnknownMessage) => Err(refused(DispatchError::MessageRequired {
                message: "register",
            })),
            Err(error) => Err(refused(error)),
        }
    }
}

/// How a credential is named in errors and bound to worker ids: `"refund-bot" (token)`.
fn credential(principal: &Principal) -> String {
    format!("{:?} ({})", principal.name, principal.verification)
}

/// Every advertised handler must be one the principal may serve.
fn check_handlers(
    hello: &WorkerHello,
    principal: &Principal,
    credential: &str,
) -> Result<(), DispatchError> {
    for handler in &hello.handlers {
        if !principal.may_serve(&handler.tool, &handler.version) {
            let patterns: Vec<String> = principal.tools.iter().map(ToString::to_string).collect();
            return Err(DispatchError::ToolNotPermitted {
                worker_id: hello.worker_id.clone(),
                tool: handler.key(),
                credential: credential.to_owned(),
                patterns: if patterns.is_empty() {
                    "none".to_owned()
                } else {
                    patterns.join(", ")
                },
            });
        }
    }
    Ok(())
}

/// The protocol name of a worker message, as used in `register before <name>`.
fn kind(msg: &FromWorker) -> &'static str {
    match msg {
        FromWorker::Heartbeat => "heartbeat",
        FromWorker::Result { .. } => "result",
        FromWorker::Nack { .. } => "nack",
    }
}

/// Feeds a registered worker's messages to its connection until the stream ends, a message is
/// refused (its status goes to the response stream through `ended`), or the response stream
/// is gone. Dropping the connection at the end unregisters the worker, unless it already
/// registered again on another stream.
async fn read_worker_messages<S>(
    mut inbound: S,
    conn: WorkerConnection,
    mut ended: oneshot::Sender<Status>,
) where
    S: Stream<Item = Result<pb::WorkClientMsg, Status>> + Unpin,
{
    let worker_id = conn.worker_id().to_owned();
    loop {
        let next = tokio::select! {
            () = ended.closed() => {
                tracing::debug!(%worker_id, "work stream response closed");
                break;
            }
            next = inbound.next() => next,
        };
        let msg = match next {
            Some(Ok(msg)) => msg,
            None => {
                tracing::info!(%worker_id, "work stream closed by the worker");
                break;
            }
            Some(Err(status)) => {
                tracing::info!(
                    %worker_id,
                    code = ?status.code(),
                    message = status.message(),
                    "work stream broken"
                );
                break;
            }
        };
        let handled = match convert::work_client_msg(msg) {
            Ok(WorkerMessage::Other(msg)) => conn.handle(msg),
            Ok(WorkerMessage::Register(_)) => Err(DispatchError::AlreadyRegistered {
                worker_id: worker_id.clone(),
            }),
            Err(error) => Err(error),
        };
        if let Err(error) = handled {
            tracing::info!(%worker_id, %error, "work stream ended by a protocol error");
            let _ = ended.send(convert::dispatch_status(&error));
            break;
        }
    }
    drop(conn);
}

/// The response side of one Work stream: the worker's outbox as `WorkServerMsg`s.
///
/// Ends with the status of a refused client message, with the router's status when it drops
/// the worker, or with `OK` when the connection closes or the daemon stops.
pub struct WorkResponse {
    worker_id: String,
    outbox: Outbox,
    /// A protocol error found by the reader task; `None` once it reported or finished.
    ended: Option<oneshot::Receiver<Status>>,
    /// Completes when the daemon stops.
    stop: Pin<Box<dyn Future<Output = ()> + Send>>,
    done: bool,
}

impl std::fmt::Debug for WorkResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkResponse")
            .field("worker_id", &self.worker_id)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl WorkResponse {
    fn finish(
        &mut self,
        item: Option<Result<pb::WorkServerMsg, Status>>,
    ) -> Poll<Option<Result<pb::WorkServerMsg, Status>>> {
        self.done = true;
        // Dropping the receiver tells the reader task to stop and release the connection.
        self.ended = None;
        Poll::Ready(item)
    }
}

impl Stream for WorkResponse {
    type Item = Result<pb::WorkServerMsg, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        // 1. A refused client message ends the stream with its status.
        if let Some(ended) = this.ended.as_mut() {
            match Pin::new(ended).poll(cx) {
                Poll::Ready(Ok(status)) => return this.finish(Some(Err(status))),
                // The reader finished without an error; the outbox closes next.
                Poll::Ready(Err(_)) => this.ended = None,
                Poll::Pending => {}
            }
        }
        // 2. The next message for the worker, or the router's verdict.
        match Pin::new(&mut this.outbox).poll_next(cx) {
            Poll::Ready(Some(Ok(msg))) => {
                return Poll::Ready(Some(Ok(convert::work_server_msg(msg))));
            }
            Poll::Ready(Some(Err(error))) => {
                tracing::info!(worker_id = %this.worker_id, %error, "work stream ended by the router");
                return this.finish(Some(Err(convert::dispatch_status(&error))));
            }
            Poll::Ready(None) => {
                tracing::debug!(worker_id = %this.worker_id, "work stream finished");
                return this.finish(None);
            }
            Poll::Pending => {}
        }
        // 3. Daemon shutdown, once nothing is queued.
        if this.stop.as_mut().poll(cx).is_ready() {
            tracing::info!(worker_id = %this.worker_id, "work stream closed: the runtime is stopping");
            return this.finish(None);
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use phrony_dispatch::{Invocation, ToWorker, ToolError};
    use serde_json::json;
    use tonic::Code;

    use super::*;

    fn invoke(args: serde_json::Value, version: &str) -> pb::WorkInvoke {
        let msg = convert::work_server_msg(ToWorker::Invoke(Box::new(Invocation {
            call_id: "c1".into(),
            session_id: "s1".into(),
            agent_version_id: "av1".into(),
            turn: 2,
            tool: "orders.lookup-order".into(),
            version: version.into(),
            args,
            side_effect_class: "read_only".into(),
            deadline_unix_ms: 1_700_000_000_000,
            trace_context: std::collections::BTreeMap::new(),
        })));
        match msg.body {
            Some(pb::work_server_msg::Body::Invoke(invoke)) => invoke,
            other => panic!("expected an invoke, got {other:?}"),
        }
    }

    #[test]
    fn invokes_carry_json_args_and_a_routable_version() {
        let i = invoke(json!({"order_id": "ORD-1"}), "1.0.0");
        assert_eq!(i.args, br#"{"order_id":"ORD-1"}"#);
        assert_eq!(
            (i.call_id.as_str(), i.session_id.as_str(), i.turn),
            ("c1", "s1", 2)
        );
        assert_eq!(i.deadline_unix_ms, 1_700_000_000_000);
        // No arguments travel as `{}`; no version as `default`.
        let i = invoke(serde_json::Value::Null, "");
        assert_eq!(i.args, b"{}");
        assert_eq!(i.version, "default");
    }

    #[test]
    fn worker_results_keep_their_error() {
        let msg = pb::WorkClientMsg {
            body: Some(pb::work_client_msg::Body::Result(pb::WorkToolResult {
                call_id: "c1".into(),
                payload: Vec::new(),
                error: Some(pb::WorkToolError {
                    code: "invalid_args".into(),
                    message: "amount must be greater than zero".into(),
                }),
            })),
        };
        let Ok(WorkerMessage::Other(FromWorker::Result { call_id, error, .. })) =
            convert::work_client_msg(msg)
        else {
            panic!("expected a result")
        };
        assert_eq!(call_id, "c1");
        assert_eq!(
            error,
            Some(ToolError::new(
                "invalid_args",
                "amount must be greater than zero"
            ))
        );
        assert_eq!(
            convert::work_client_msg(pb::WorkClientMsg { body: None }).unwrap_err(),
            DispatchError::UnknownMessage
        );
    }

    #[test]
    fn every_status_class_maps_to_its_code() {
        let cases = [
            (DispatchError::WorkerIdRequired, Code::InvalidArgument),
            (
                DispatchError::RegisterFirst {
                    message: "heartbeat",
                },
                Code::FailedPrecondition,
            ),
            (
                DispatchError::UnknownWorker {
                    worker_id: "w".into(),
                },
                Code::NotFound,
            ),
            (
                DispatchError::LeaseExpired {
                    worker_id: "w".into(),
                    lease_ttl_ms: 30_000,
                },
                Code::Aborted,
            ),
            (
                DispatchError::OutboxOverflow {
                    worker_id: "w".into(),
                    capacity: 1024,
                },
                Code::ResourceExhausted,
            ),
        ];
        for (error, code) in cases {
            let status = convert::dispatch_status(&error);
            assert_eq!(status.code(), code, "{error}");
            assert_eq!(status.message(), error.to_string());
        }
    }
}
