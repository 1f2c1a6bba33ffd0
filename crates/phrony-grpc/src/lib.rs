//! The gRPC server edge of the Phrony runtime.
//!
//! This crate and the typed client (`phrony-client`) are the only ones that see protobuf
//! types. It converts between protobuf and domain types (`src/convert/`, which also maps domain
//! errors to `tonic::Status`) and implements the services; it reads no configuration and
//! assembles nothing: `phrony-runtime` composes the ledger, the dispatch router, the engine and
//! these services into the daemon (`phrony_runtime::serve`). It provides:
//!
//! - `phrony.runtime.v1.Runtime` ([`RuntimeService`]), wire-compatible with the published SDKs.
//!   This release implements the agent lifecycle: `GetVersion`, `Publish`, `Deploy`,
//!   `Rollback`, `GetActiveVersion`, `ListDeployments`, `GetAgentVersion`, `ListAgents`,
//!   `ListAgentVersions`, `DeprecateAgentVersion`, `RetireAgentVersion` and `ArchiveAgent`;
//!   sessions, run by the `phrony-engine` session engine: `RunSession`,
//!   `RunSessionInteractive`, `CancelSession`,
//!   `CompleteSession`, `ListSessions` and `InspectSession`; approvals: `GetApproval`,
//!   `ListApprovals` and `DecideApproval`; and the tool workers' `Work` stream, whose workers
//!   register with the `phrony-dispatch` router given to [`RuntimeService::new`], which
//!   dispatches tool calls to them; bundles: `PublishBundle`, `DeployBundle`,
//!   `RollbackBundle`, `GetActiveBundle`, `GetBundleVersion`, `GetBundleSecretRequirements`,
//!   `ListBundles`, `ListBundleVersions` and `ListBundleDeployments`.
//! - `grpc.health.v1.Health` ([`health::Health`]): `SERVING` for `""` and
//!   `phrony.runtime.v1.Runtime` only while the database takes a write probe (re-checked in the
//!   background every few seconds).
//! - The encoded descriptors ([`health::FILE_DESCRIPTOR_SET`], with
//!   `phrony_proto::FILE_DESCRIPTOR_SET`) that the daemon registers for gRPC server reflection
//!   (`grpc.reflection.v1` and `v1alpha`), so `grpcurl list` works.
//!
//! Every RPC of the Runtime service goes through the access edge ([`auth`]): the credential is
//! authenticated, the RPC's permission (one row per RPC in [`auth::PERMISSIONS`]) checked, and
//! the `phrony_auth::Principal` handed to the handler, which records it as the actor.
//!
//! Actor names ([`Actor`], [`ACTOR_HEADER`]) are re-exported from `phrony-client`, so the
//! service and the CLI apply one rule.
//!
//! # Semantics worth knowing
//!
//! - **Publish re-validates the snapshot** (the reference trusts the client): it must parse as
//!   a compiled agent (known fields only, the compiler's annotation), pass
//!   `phrony_manifest::CompiledAgent::validate` (the authoring rules that apply to compiled
//!   output, the reference's compiled-only checks, policies that compile with `phrony-policy`),
//!   and be byte-for-byte in canonical form. The content hash is recomputed on the server.
//!   Failures are `INVALID_ARGUMENT`: `parse manifest: …`, `invalid manifest: <path>: <message>`,
//!   or `invalid manifest (N errors):` followed by one indented line per problem.
//!   Re-publishing identical content returns the existing version with
//!   `PublishResponse.created` false; different content for an existing version is
//!   `ALREADY_EXISTS`.
//! - **Actors.** Every change records who made it: the request's `actor` field, else the
//!   [`ACTOR_HEADER`] (`phrony-actor`) request metadata (the only way to name the actor of
//!   Deprecate/Retire/Archive, whose messages have no actor field), else the service's default
//!   actor (given to [`RuntimeService::new`]) — in `local` mode. With a verified principal the
//!   recorded actor is the principal; naming someone else is `PERMISSION_DENIED` unless the
//!   principal has the relay permission (`phrony_auth::Principal::attribute`). A named actor
//!   must pass [`Actor::parse`] (1–128
//!   printable characters, no edge whitespace, not one of the runtime's own names such as
//!   `system` or `system:timeout`): otherwise `INVALID_ARGUMENT` naming the rule, and nothing is
//!   changed.
//! - **Errors** map one-to-one from the ledger and the session engine (`NOT_FOUND`, `FAILED_PRECONDITION`,
//!   `ALREADY_EXISTS`, `INVALID_ARGUMENT`); a lost write race is `ABORTED` (retry), an unreachable
//!   database `UNAVAILABLE`, corrupt ledger data `DATA_LOSS`, other storage failures `INTERNAL`
//!   without driver details (those are logged).
//! - **Starting a session** (`RunSession`, and `RunSessionInteractive`'s start) runs the agent's
//!   active deployment; an explicit `agent_ref.version` must be that one
//!   (`FAILED_PRECONDITION: version "x" is not the active deployment (active: "y")`). Archived
//!   agents, retired or deprecated active versions and agents with nothing deployed are
//!   `FAILED_PRECONDITION`, unknown agents `NOT_FOUND`. A `bundle_ref` runs the root member of
//!   the bundle's active deployment (an explicit version, semver or `sha256:` lock hash, must be
//!   that one) with the union of its members' secrets. The input is UTF-8 JSON, an object or a
//!   string (the published SDK sends `run(input="text")` as a JSON string, which becomes the
//!   first user message); empty means `{}`. `resolved_secrets` must name exactly the secrets
//!   the manifest declares: the error lists every missing and unknown name (never a value).
//!   `SESSION_MODE_UNSPECIFIED` is task mode. Metadata keys must be non-empty, at most 128
//!   bytes, without control characters (values at most 4096 bytes, at most 64 pairs).
//! - **ListSessions** lists the sessions of every version of `agent_ref` unless it names a
//!   version (the reference listed only the active version's), newest first, with
//!   `page_size`/`page_token` paging (at most 1000 a page); a request without `page_size` (the
//!   published SDK sends none) gets every match up to 10,000, as the unpaged reference did, and
//!   a `next_page_token` (logged) if more exist; `ListApprovals` pages the same way. Every
//!   `metadata` pair must match. A `bundle_ref` filter
//!   or `kind: "bundle"` returns an empty list, since no session of this runtime runs a bundle.
//! - **InspectSession** returns the session tree and one timeline merging its events, tool-call
//!   milestones and approval milestones, each with a one-line summary such as
//!   `policy denied payments.issue-refund: <reason> (payments/refund-hard-limit@1.0.0)` or
//!   `approval approved by emad: <comment>`. Secrets never appear in it.
//! - **DecideApproval** records the vote through the engine, so a waiting session resumes as
//!   soon as the approval is decided (also after a restart). The voter is the request's
//!   `actor`, else the [`ACTOR_HEADER`], else the default actor; a second vote by the same actor
//!   (names that differ only in case are the same actor) is `FAILED_PRECONDITION`
//!   (`actor "X" already decided on this approval`), a missing
//!   comprehension acknowledgement `INVALID_ARGUMENT`. The response is
//!   [`phrony_engine::Engine::vote`]'s answer: the approval's `status` and
//!   `approvals_received` after the vote, and the `session_status` it led to (the status the
//!   session resumed in once its driver took the decision, `awaiting_approval` while an
//!   approval still holds it).
//! - **RunSessionInteractive** (bidirectional). The first client message must be `start`
//!   (`INVALID_ARGUMENT: first message must be start`): with `session_id` it attaches to that
//!   session, otherwise it starts one exactly like `RunSession`; refusals end the RPC before
//!   any server message. The server sends `session_started` (model, limits, timestamps,
//!   evidence; on attach also the conversation so far), then on attach a catch-up in order:
//!   the assistant text of the turn in progress as one `text_delta`, that turn's `tool_call`,
//!   `tool_result` and `approval_decided` messages, then the state (`status`, and the pending
//!   `approval_required` with `awaiting_input{input_blocked_reason: "awaiting_approval"}`, or
//!   `awaiting_input{…"awaiting_tool"}`, or the `awaiting_input` of a parked conversation, or
//!   the terminal message of an ended session). Then every event live, with no gap and no
//!   duplicate: `tool_call`, `tool_result` (with `error_code`/`policy_ref`; a rejected approval
//!   is `approval_denied` with the text the model receives), `approval_required`,
//!   `approval_decided` (every vote, `pending` below the quorum, and every decision, from any
//!   source), `status` (non-terminal status changes), `awaiting_input` (a conversation's turn
//!   ended), `text_delta`, and `completed` (with the output; a task completes when its turn
//!   ends) / `failed` / `cancelled`, after which the stream ends with `OK`. A slow reader slows
//!   the stream (bounded, awaited sends) and gets every event; only streamed text may arrive
//!   coalesced. `user_message` is recorded at once and runs in order after the running turn
//!   (never dropped); `tool_approval` (empty `approval_id` = the pending one) is a vote through
//!   the engine, like `DecideApproval`, by the stream's [`ACTOR_HEADER`] actor, else the
//!   default actor. **A refused client message never ends the stream**: it is logged and
//!   answered with a `status` repeating the session's current status with the refusal as
//!   `reason` (e.g. `user_message.text must be non-empty`, `actor "X" already decided on this
//!   approval`, a task-mode session taking no messages); while a limit blocks input, a user
//!   message is answered with `awaiting_input` carrying the reason. A second `start` ends the
//!   stream (`INVALID_ARGUMENT: unexpected start after attach`). Closing or dropping the stream
//!   only detaches: the session carries on.
//! - Timestamps are RFC 3339 UTC strings with second precision; empty means "not set".

pub mod auth;
mod convert;
pub mod health;
mod peer;
mod publish;
mod service;

pub use peer::{certificate_subject, peer_subject};
pub use phrony_auth::{ACTOR_HEADER, Actor, ActorError, is_unprintable};
/// The Work stream's handling below the tonic service (first-message rules, protobuf to
/// `phrony-dispatch` conversion, the reader task, the response stream). The daemon uses it
/// through [`RuntimeService`]; it is public, hidden, only for the `work_stream` fuzz target.
#[doc(hidden)]
pub use service::work::{WorkHub, WorkResponse};
pub use service::{DEFAULT_WATCH_BUFFER, DEFAULT_WATCH_GRACE, RuntimeService};

/// The largest request or stream message the runtime accepts (gRPC's default, set explicitly):
/// it bounds every payload a client or worker can hand in (a session input, a user message, a
/// tool result, edited arguments, a comment). Responses that may carry many payloads are
/// bounded separately: `InspectSession` stays under 3 MiB and `GetSessionPayload` streams 1 MiB
/// chunks, so clients with the default receive limit read every session the runtime accepted.
pub const MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
