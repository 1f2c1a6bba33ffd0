//! The worker side of the runtime's `Work` stream, without protobuf: [`Client::work`] registers
//! a worker and returns a [`WorkSender`] (heartbeats, results, tool errors, nacks) and a
//! [`WorkStream`] of [`WorkEvent`]s (registered, invoke, cancel, result ack, heartbeat ack).
//!
//! What the runtime does with each message (`phrony-dispatch` and the server edge):
//!
//! - `register` must come first; an empty worker id or handler list is `INVALID_ARGUMENT`,
//!   a tool outside the credential's patterns or a worker id bound to another credential is
//!   `PERMISSION_DENIED`. Registering an id again replaces the older stream; the calls its
//!   [`Registration::in_flight`] lists stay attached to the new stream (their results are
//!   accepted there), the others become indeterminate. Calls listed there whose results the
//!   runtime already recorded get a [`WorkEvent::ResultAck`] right after
//!   [`WorkEvent::Registered`].
//! - A heartbeat extends the lease ([`WorkEvent::Registered::lease_ttl`]); a stream that sends
//!   nothing for a lease is closed.
//! - A result is acknowledged ([`WorkEvent::ResultAck`]) only once the runtime recorded it
//!   durably: until then the worker keeps it and offers it again after a reconnect.
//! - A nack refuses a call the worker cannot take (`unknown_handler`, `invalid_args`,
//!   `shutting_down`…); the runtime retries it once on another eligible worker, then reports it
//!   to the model as a tool error. A nack is never acknowledged.
//! - [`WorkEvent::Cancel`] tells the worker the runtime stopped waiting for a call (the session
//!   ended or the deadline passed): any result sent later is recorded as a late result only.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use pb::work_client_msg::Body as ClientBody;
use pb::work_server_msg::Body as ServerBody;
use phrony_proto::runtime::v1 as pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::{Client, ClientError};

/// Messages the worker may queue before [`WorkSender`] calls wait for the stream.
const OUTBOUND_BUFFER: usize = 64;

/// The largest invoke message the worker decodes (arguments up to the runtime's 4 MiB limit).
const MAX_INVOKE_BYTES: usize = 8 * 1024 * 1024;

/// One `tool@version` a worker serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HandlerAd {
    /// The tool's dispatch ref, e.g. `payments.issue-refund`.
    pub tool: String,
    /// The exact version the bindings dispatch to, e.g. `1.0.0`.
    pub version: String,
    /// The contract version the worker implements (checked by integrity rules; may be empty).
    pub contract_version: String,
    /// Concurrent invocations this worker accepts for the handler (at least 1).
    pub max_concurrency: u32,
    /// The hash of the tool descriptor the worker implements, recorded for audit (may be empty).
    pub descriptor_hash: String,
}

/// A worker's `WorkRegister`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Registration {
    /// The stable worker id (required).
    pub worker_id: String,
    /// Provenance recorded with each invocation (a verified credential's name replaces it).
    pub workload_identity: String,
    /// The worker's image digest, checked by integrity rules (may be empty).
    pub image_digest: String,
    /// The handlers served.
    pub handlers: Vec<HandlerAd>,
    /// Calls the worker is still running or holds an unacknowledged result for.
    pub in_flight: Vec<String>,
}

/// One call the runtime asks the worker to run (`WorkInvoke`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    /// The call's id; every answer names it.
    pub call_id: String,
    /// The session the call belongs to.
    pub session_id: String,
    /// The agent version that session runs.
    pub agent_version_id: String,
    /// The model turn that proposed the call.
    pub turn: i32,
    /// The tool's dispatch ref.
    pub tool: String,
    /// The tool's version.
    pub version: String,
    /// The arguments as sent (UTF-8 JSON object; the runtime validated them against the tool's
    /// input schema).
    pub args: Vec<u8>,
    /// The binding's side-effect class (`read_only`, `non_idempotent_write`…; may be empty).
    pub side_effect_class: String,
    /// When the runtime stops waiting for the call, if it set a deadline.
    pub deadline: Option<SystemTime>,
    /// The W3C trace context of the runtime's dispatch span (`traceparent`, `tracestate`):
    /// a worker that traces makes it the parent of its own spans. Empty when the runtime
    /// exports no traces.
    pub trace_context: BTreeMap<String, String>,
}

/// A runtime message on the Work stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkEvent {
    /// The registration was accepted.
    Registered {
        /// The worker id as registered.
        worker_id: String,
        /// The lease: heartbeat well within it.
        lease_ttl: Duration,
    },
    /// Run a call.
    Invoke(Invocation),
    /// Stop working on a call: the runtime no longer waits for it.
    Cancel {
        /// The call.
        call_id: String,
    },
    /// The call's result is recorded durably; the worker may forget it.
    ResultAck {
        /// The call.
        call_id: String,
    },
    /// A heartbeat was received.
    HeartbeatAck,
}

/// The sending half of a Work stream. Cheap to clone; every clone writes to the one stream, one
/// message at a time (so concurrent handlers never interleave writes).
#[derive(Debug, Clone)]
pub struct WorkSender {
    outbound: mpsc::Sender<pb::WorkClientMsg>,
}

/// The stream has closed: nothing more can be sent on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the Work stream is closed")]
pub struct StreamClosed;

impl WorkSender {
    async fn send(&self, body: ClientBody) -> Result<(), StreamClosed> {
        self.outbound
            .send(pb::WorkClientMsg { body: Some(body) })
            .await
            .map_err(|_| StreamClosed)
    }

    /// Extends the worker's lease.
    ///
    /// # Errors
    /// [`StreamClosed`] once the stream ended.
    pub async fn heartbeat(&self) -> Result<(), StreamClosed> {
        self.send(ClientBody::Heartbeat(pb::WorkHeartbeat {})).await
    }

    /// Reports a call's successful result (UTF-8 JSON).
    ///
    /// # Errors
    /// [`StreamClosed`] once the stream ended.
    pub async fn result(&self, call_id: &str, payload: Vec<u8>) -> Result<(), StreamClosed> {
        self.send(ClientBody::Result(pb::WorkToolResult {
            call_id: call_id.to_owned(),
            payload,
            error: None,
        }))
        .await
    }

    /// Reports that the handler ran and failed: the model sees `code: message`.
    ///
    /// # Errors
    /// [`StreamClosed`] once the stream ended.
    pub async fn error(
        &self,
        call_id: &str,
        code: &str,
        message: &str,
    ) -> Result<(), StreamClosed> {
        self.send(ClientBody::Result(pb::WorkToolResult {
            call_id: call_id.to_owned(),
            payload: Vec::new(),
            error: Some(pb::WorkToolError {
                code: code.to_owned(),
                message: message.to_owned(),
            }),
        }))
        .await
    }

    /// Refuses a call the worker did not run (`unknown_handler`, `invalid_args`,
    /// `shutting_down`…); the runtime may retry it on another worker.
    ///
    /// # Errors
    /// [`StreamClosed`] once the stream ended.
    pub async fn nack(&self, call_id: &str, code: &str, message: &str) -> Result<(), StreamClosed> {
        self.send(ClientBody::Nack(pb::WorkToolNack {
            call_id: call_id.to_owned(),
            code: code.to_owned(),
            message: message.to_owned(),
        }))
        .await
    }

    /// Ends the worker's side of the stream once every message queued so far is sent (the
    /// runtime then unregisters the worker). Other clones keep the stream open until dropped.
    pub fn close(self) {
        drop(self);
    }
}

/// The receiving half of a Work stream.
#[derive(Debug)]
pub struct WorkStream {
    inbound: tonic::Streaming<pb::WorkServerMsg>,
    addr: String,
}

impl WorkStream {
    /// The next runtime message; `None` when the runtime ended the stream cleanly (daemon
    /// shutdown).
    ///
    /// # Errors
    /// The status that ended the stream (`Superseded` by a newer registration, lease expired…)
    /// or the lost connection; [`ClientError::InvalidResponse`] for a message without a body.
    pub async fn next(&mut self) -> Result<Option<WorkEvent>, ClientError> {
        let message = self
            .inbound
            .message()
            .await
            .map_err(|s| ClientError::from_status(&s, &self.addr, crate::REQUEST_TIMEOUT))?;
        let Some(message) = message else {
            return Ok(None);
        };
        let event = match message.body {
            Some(ServerBody::Registered(r)) => WorkEvent::Registered {
                worker_id: r.worker_id,
                lease_ttl: Duration::from_millis(u64::try_from(r.lease_ttl_ms).unwrap_or(0)),
            },
            Some(ServerBody::Invoke(i)) => WorkEvent::Invoke(Invocation {
                call_id: i.call_id,
                session_id: i.session_id,
                agent_version_id: i.agent_version_id,
                turn: i.turn,
                tool: i.tool,
                version: i.version,
                args: i.args,
                side_effect_class: i.side_effect_class,
                deadline: u64::try_from(i.deadline_unix_ms)
                    .ok()
                    .filter(|ms| *ms > 0)
                    .map(|ms| UNIX_EPOCH + Duration::from_millis(ms)),
                trace_context: i.trace_context.into_iter().collect(),
            }),
            Some(ServerBody::Cancel(c)) => WorkEvent::Cancel { call_id: c.call_id },
            Some(ServerBody::ResultAck(a)) => WorkEvent::ResultAck { call_id: a.call_id },
            Some(ServerBody::HeartbeatAck(_)) => WorkEvent::HeartbeatAck,
            None => {
                return Err(ClientError::InvalidResponse {
                    rpc: "Work",
                    reason: "a message without a body".to_owned(),
                });
            }
        };
        Ok(Some(event))
    }
}

impl HandlerAd {
    fn to_pb(&self) -> pb::WorkHandlerAdvertisement {
        pb::WorkHandlerAdvertisement {
            tool: self.tool.clone(),
            version: self.version.clone(),
            contract_version: self.contract_version.clone(),
            max_concurrency: self.max_concurrency.max(1),
            descriptor_hash: self.descriptor_hash.clone(),
        }
    }
}

impl Registration {
    fn to_pb(&self) -> pb::WorkRegister {
        pb::WorkRegister {
            worker_id: self.worker_id.clone(),
            workload_identity: self.workload_identity.clone(),
            image_digest: self.image_digest.clone(),
            handlers: self.handlers.iter().map(HandlerAd::to_pb).collect(),
            in_flight: self
                .in_flight
                .iter()
                .map(|call_id| pb::WorkInFlightCall {
                    call_id: call_id.clone(),
                })
                .collect(),
        }
    }
}

impl Client {
    /// Opens the `Work` stream and sends `registration` as its first message. The runtime's
    /// answer ([`WorkEvent::Registered`], or the status refusing it) is the stream's first
    /// event.
    ///
    /// # Errors
    /// The runtime's refusal when it answers before the stream is open (a missing credential,
    /// `PERMISSION_DENIED`…), or a transport error.
    pub async fn work(
        &self,
        registration: &Registration,
    ) -> Result<(WorkSender, WorkStream), ClientError> {
        let (outbound, receiver) = mpsc::channel(OUTBOUND_BUFFER);
        outbound
            .send(pb::WorkClientMsg {
                body: Some(ClientBody::Register(registration.to_pb())),
            })
            .await
            .map_err(|_| ClientError::InvalidResponse {
                rpc: "Work",
                reason: "the outbound stream closed before the registration".to_owned(),
            })?;
        let inbound = self
            .runtime
            .clone()
            .max_decoding_message_size(MAX_INVOKE_BYTES)
            .work(ReceiverStream::new(receiver))
            .await
            .map_err(|s| self.status(&s))?
            .into_inner();
        Ok((
            WorkSender { outbound },
            WorkStream {
                inbound,
                addr: self.addr.clone(),
            },
        ))
    }
}
