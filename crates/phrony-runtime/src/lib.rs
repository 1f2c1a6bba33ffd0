//! The Phrony runtime daemon's assembly: it reads the configuration (flags, the process
//! environment, the secrets-key file) and composes the ledger, the tool dispatch router, the
//! session engine and the gRPC services of `phrony-grpc` into the running daemon.
//!
//! This is the one library that reads the process environment; every other crate takes its
//! configuration as values. The `phrony-runtime` binary (package `runtime`) only parses the
//! command line and calls [`daemon::serve`] or [`daemon::migrate`].
//!
//! - [`config`]: the command line and environment ([`Cli`], [`Settings`], [`Env`],
//!   [`provider_env`]): what the daemon listens on, where the database and key file live.
//! - [`serve()`]: given a bound [`Listener`], a migrated ledger and a [`ServeConfig`], serves
//!   `phrony.runtime.v1.Runtime`, health and reflection until shutdown, recovering the sessions
//!   that were live at the last stop first.
//! - [`auth`]: the auth mode (`RUNTIME_AUTH=local|required`) and the composite authenticator
//!   (API tokens; OIDC and mTLS arms) the gRPC edge asks on every RPC.
//! - [`tokens`]: `phrony-runtime tokens create|list|revoke` on the daemon's database.
//! - [`http`]: the optional HTTP listener (`RUNTIME_HTTP_ADDR`): `/healthz`, `/readyz` and the
//!   Prometheus `/metrics`.
//! - [`SecretsKey`]: the key that encrypts session secrets at rest, from
//!   `RUNTIME_SECRETS_ENCRYPTION_KEY` or a generated owner-only key file.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use phrony_runtime::{SecretsKey, ServeConfig};
//! let ledger = phrony_ledger::Ledger::connect("sqlite://./phrony.db").await?;
//! ledger.migrate().await?;
//! let listener = phrony_runtime::bind("127.0.0.1:7777").await?;
//! let config = ServeConfig::new(SecretsKey::generate()?);
//! phrony_runtime::serve(listener, ledger, config, async {
//!     let _ = tokio::signal::ctrl_c().await;
//! })
//! .await?;
//! # Ok(()) }
//! ```

#![allow(
    clippy::disallowed_methods,
    reason = "phrony-runtime is the daemon's assembly crate: it reads the process environment and hands the libraries values"
)]

mod audit;
pub mod auth;
pub mod config;
pub mod console;
pub mod daemon;
pub mod embedded;
pub mod history_prune;
pub mod http;
pub mod logging;
pub mod oidc;
mod serve;
mod serve_config;
pub mod telemetry;
pub mod tls;
pub mod tokens;
pub mod webhooks;
mod workers;

pub use config::{
    AUDIT_KEY_FILE, AuditCommand, AuditVerifyArgs, Cli, Command, Env, LogFormat, Settings,
    provider_env,
};
pub use oidc::OidcAuthenticator;
pub use serve::{Listener, ServeError, bind, serve};
pub use serve_config::{KeyError, KeyFileOutcome, SECRETS_KEY_FILE, SecretsKey, ServeConfig};
pub use tls::MtlsAuthenticator;
