//! A faithful local twin of the Regent Control Decision API.
//!
//! The published `regent-control` SDK (0.12.1) and `regent-receipt-verify` (0.7.0) work
//! against it unchanged: `POST /v1/control/decisions` answers allow, deny and escalate with
//! HTTP 200 and every decision code of the contract; allow tokens are RS256 JWTs with a `kid`
//! published at `/v1/control/.well-known/jwks.json`, a 60 s life, `aud` = tool,
//! `scope` = `tool:action`, `args_hash` and the amount/mandate/policy claims; `complete`
//! returns a `receipt+jwt`.
//!
//! Two ways to configure it:
//! - [`Settings::flags`]: the drop-in for `regent-control dev` (`--deny-over`,
//!   `--escalate-over`, `--deny-tool`, `--deny-all`), with hard caps checked before escalation,
//!   amounts it cannot check failed closed, unique decision ids and real tokens;
//! - [`Settings::load`]: a YAML file with agents and API keys, a tool catalog, Cedar policies
//!   (see [`cedar`]), mandates with per-transaction, daily, monthly, per-entity and relational
//!   caps, OIDC delegation, approvals, velocity and duplicate windows, and a risk model.
//!
//! A small web console for managers ([`console`], under `/console/`) shows decisions, pending
//! escalations, mandates and the audit export, behind a manager login or the admin key.
//!
//! The decision pipeline, idempotency and holds are described in [`engine`]. State lives in a
//! [`GateStore`]: its hash-chained event log is both the audit log and the source of every
//! projection, so a restarted gate resumes with its pending escalations.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use phrony_gate::{FlagRules, Gate, MemoryStore, Settings, SigningKey, SystemClock};
//! // The admin key guards approvals and the audit log: never a well-known default.
//! let admin_key = phrony_gate::admin::generate_admin_key()?;
//! let settings = Settings::flags(FlagRules::default(), Some(admin_key));
//! let gate = Gate::open(settings, SigningKey::generate()?, Arc::new(MemoryStore::new()),
//!                       Arc::new(SystemClock)).await?;
//! let app = phrony_gate::router(Arc::new(gate));
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8009").await?;
//! axum::serve(listener, app).await?;
//! # Ok(()) }
//! ```

pub mod admin;
pub mod admin_client;
pub mod canonical;
pub mod config;
pub mod console;
pub mod engine;
mod error;
mod http;
pub mod keys;
pub mod ledger_store;
mod log_writer;
pub mod money;
pub mod oidc;
pub mod provider;
mod request;
pub mod routing;
pub mod service;
pub mod signing;
mod state;
pub mod store;
pub mod tokens;
pub mod vault;

pub use admin::ApproverName;
pub use admin_client::{AdminClient, AdminError};
pub use config::{ConfigError, FlagRules, Settings};
pub use engine::{Caller, Clock, ForwardState, Gate, Resolution, SystemClock, codes};
pub use error::{ApiError, GateError};
pub use http::router;
pub use keys::{KeyError, SigningKey};
pub use ledger_store::LedgerStore;
pub use log_writer::LogStats;
/// Cedar with gate semantics, from `phrony-policy` (feature `cedar`).
pub use phrony_policy::cedar;
pub use request::{DecisionRequest, Money};
pub use state::{ApprovalOutcome, CompleteStatus, Verdict};
pub use store::{AuditEvent, GateStore, MemoryStore, NewAuditEvent, StoreError};

#[cfg(test)]
mod tests;
