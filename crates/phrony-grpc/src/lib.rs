//! The gRPC surface of the Phrony runtime.
//!
//! This crate is the only one (besides the CLI's client) that sees protobuf types. It serves:
//!
//! - `phrony.runtime.v1.Runtime` ([`RuntimeService`]), wire-compatible with the published SDKs.
//!   This release implements the agent lifecycle: `GetVersion`, `Publish`, `Deploy`,
//!   `Rollback`, `GetActiveVersion`, `ListDeployments`, `GetAgentVersion`, `ListAgents`,
//!   `ListAgentVersions`, `DeprecateAgentVersion`, `RetireAgentVersion` and `ArchiveAgent`.
//!   Every other RPC answers `UNIMPLEMENTED` with a message naming it.
//! - `grpc.health.v1.Health`: `SERVING` for `""` and `phrony.runtime.v1.Runtime` only while the
//!   database answers a ping (re-checked in the background every few seconds).
//! - gRPC server reflection (`grpc.reflection.v1` and `v1alpha`), so `grpcurl list` works.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use phrony_grpc::{SecretsKey, ServeConfig};
//! let ledger = phrony_ledger::Ledger::connect("sqlite://./phrony.db").await?;
//! ledger.migrate().await?;
//! let listener = phrony_grpc::bind("127.0.0.1:7777").await?;
//! let config = ServeConfig::new(SecretsKey::generate()?);
//! phrony_grpc::serve(listener, ledger, config, async {
//!     let _ = tokio::signal::ctrl_c().await;
//! })
//! .await?;
//! # Ok(()) }
//! ```
//!
//! # Semantics worth knowing
//!
//! - **Publish re-validates the snapshot** (the reference trusts the client): it must parse as
//!   a compiled agent (known fields only, the compiler's annotation), have the invariants of
//!   compiled output (identity, a supported model, inline prompt and schemas, unique tool
//!   names), have policies that compile with `phrony-policy`, and be byte-for-byte in canonical
//!   form. The content hash
//!   is recomputed on the server. Failures are `INVALID_ARGUMENT` (`parse manifest: …` /
//!   `invalid manifest: …`). Re-publishing identical content returns the existing version;
//!   different content for an existing version is `ALREADY_EXISTS`.
//! - **Actors.** Every change records who made it: the request's `actor` field, else the
//!   [`ACTOR_HEADER`] (`phrony-actor`) request metadata (the only way to name the actor of
//!   Deprecate/Retire/Archive, whose messages have no actor field), else
//!   [`ServeConfig::default_actor`].
//! - **Errors** map one-to-one from the ledger (`NOT_FOUND`, `FAILED_PRECONDITION`,
//!   `ALREADY_EXISTS`, `INVALID_ARGUMENT`); a lost write race is `ABORTED` (retry), an unreachable
//!   database `UNAVAILABLE`, corrupt ledger data `DATA_LOSS`, other storage failures `INTERNAL`
//!   without driver details (those are logged).
//! - Timestamps are RFC 3339 UTC strings with second precision; empty means "not set".

pub mod client;
mod config;
mod convert;
mod health;
mod publish;
mod server;
mod service;

pub use config::{KeyError, KeyFileOutcome, SECRETS_KEY_FILE, SecretsKey, ServeConfig};
pub use server::{Listener, ServeError, bind, serve};
pub use service::{ACTOR_HEADER, RuntimeService};
