//! The gRPC surface of the Phrony runtime.
//!
//! This crate is the only one (besides the CLI's client) that sees protobuf types. It serves:
//!
//! - `phrony.runtime.v1.Runtime` ([`RuntimeService`]), wire-compatible with the published SDKs.
//!   This release implements the agent lifecycle: `GetVersion`, `Publish`, `Deploy`,
//!   `Rollback`, `GetActiveVersion`, `ListDeployments`, `GetAgentVersion`, `ListAgents`,
//!   `ListAgentVersions`, `DeprecateAgentVersion`, `RetireAgentVersion` and `ArchiveAgent`,
//!   and the tool workers' `Work` stream, whose workers register with a `phrony-dispatch`
//!   router ([`ServeConfig::router`]) that dispatches tool calls to them.
//!   Every other RPC answers `UNIMPLEMENTED` with a message naming it.
//! - `grpc.health.v1.Health`: `SERVING` for `""` and `phrony.runtime.v1.Runtime` only while the
//!   database answers a ping (re-checked in the background every few seconds).
//! - gRPC server reflection (`grpc.reflection.v1` and `v1alpha`), so `grpcurl list` works.
//!
//! ```no_run
//! # #[cfg(feature = "server")]
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
//! # Cargo features
//!
//! - `server` (default): the service, health, reflection and [`serve`], with the SQL ledger
//!   they store into.
//! - `client` (default): the typed [`client`] alone. The CLI depends on this crate with
//!   `default-features = false, features = ["client"]`, so no SQL driver is linked into it.
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
//!   Deprecate/Retire/Archive, whose messages have no actor field), else
//!   [`ServeConfig::default_actor`].
//! - **Errors** map one-to-one from the ledger (`NOT_FOUND`, `FAILED_PRECONDITION`,
//!   `ALREADY_EXISTS`, `INVALID_ARGUMENT`); a lost write race is `ABORTED` (retry), an unreachable
//!   database `UNAVAILABLE`, corrupt ledger data `DATA_LOSS`, other storage failures `INTERNAL`
//!   without driver details (those are logged).
//! - Timestamps are RFC 3339 UTC strings with second precision; empty means "not set".

#[cfg(feature = "client")]
pub mod client;
#[cfg(feature = "server")]
mod config;
#[cfg(feature = "server")]
mod convert;
#[cfg(feature = "server")]
mod health;
#[cfg(feature = "server")]
mod publish;
#[cfg(feature = "server")]
mod server;
#[cfg(feature = "server")]
mod service;

#[cfg(feature = "server")]
pub use config::{KeyError, KeyFileOutcome, SECRETS_KEY_FILE, SecretsKey, ServeConfig};
#[cfg(feature = "server")]
pub use server::{Listener, ServeError, bind, serve};
#[cfg(feature = "server")]
pub use service::RuntimeService;

/// The request metadata header naming the actor of a change whose request message has no
/// `actor` field (e.g. `DeprecateAgentVersion`), or leaves it empty. The client always sends
/// it; the server reads it when the request's own `actor` field is empty.
pub const ACTOR_HEADER: &str = "phrony-actor";
