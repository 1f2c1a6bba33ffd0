//! A runtime embedded in another process, for `phrony demo`: the daemon's `serve()` on a
//! loopback port the system picks, on an SQLite database, audit key and secrets key in a
//! directory the caller owns (a temporary one for the demo), in `local` auth mode, with the
//! scripted `stub` model provider enabled and no other provider configuration read from the
//! environment.
//!
//! It is the same assembly as the daemon (migrations, the start-up audit check, the engine,
//! the router, the access edge); only the configuration is fixed instead of read.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use phrony_engine::DefaultProviderFactory;
use phrony_providers::ProviderEnv;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::config::{Database, sqlite_url};
use crate::serve::{ServeError, bind, serve};
use crate::serve_config::{SecretsKey, ServeConfig};

/// The actor recorded for the runtime's own changes in an embedded runtime.
const EMBEDDED_ACTOR: &str = "demo";

/// A running embedded runtime; [`stop`](Self::stop) stops it gracefully, dropping it stops it
/// too (without waiting).
#[derive(Debug)]
pub struct EmbeddedRuntime {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<Result<(), ServeError>>>,
}

impl EmbeddedRuntime {
    /// Starts a runtime on `127.0.0.1:<free port>` over the SQLite database `dir/phrony.db`
    /// (created and migrated), with its audit key and secrets key in `dir`.
    ///
    /// # Errors
    /// When the port cannot be bound, the database cannot be created or migrated, a key file
    /// cannot be written, or the audit check at start fails.
    pub async fn start(dir: &Path) -> anyhow::Result<Self> {
        let listener = bind("127.0.0.1:0").await?;
        let addr = listener.local_addr();
        let file = dir.join("phrony.db");
        let db = Database {
            url: sqlite_url(&file),
            sqlite_file: Some(file),
        };
        let ledger =
            crate::daemon::open_ledger(&db, phrony_ledger::LedgerOptions::default()).await?;
        let (audit_key, key_file) = crate::audit::load_key(&dir.join(crate::AUDIT_KEY_FILE), true)?;
        let ledger = ledger.with_audit_key(audit_key);
        crate::audit::check_at_start(&ledger, key_file, false, EMBEDDED_ACTOR).await?;
        let (secrets_key, _) = SecretsKey::load_or_create(&dir.join(crate::SECRETS_KEY_FILE))?;
        let mut config = ServeConfig::new(secrets_key);
        config.default_actor = EMBEDDED_ACTOR.to_owned();
        config.shutdown_grace = Duration::from_secs(2);
        // The scripted model only: no base URL or switch is read from the environment.
        let providers = ProviderEnv::from_lookup(|name| {
            (name == "RUNTIME_ENABLE_STUB_PROVIDER").then(|| "1".to_owned())
        });
        config.providers = Some(Arc::new(DefaultProviderFactory::new(providers)));
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(serve(listener, ledger, config, async move {
            let _ = stopped.await;
        }));
        Ok(Self {
            addr,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// The address clients and workers dial (`127.0.0.1:<port>`).
    #[must_use]
    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// Stops the runtime gracefully and waits for it.
    ///
    /// # Errors
    /// The server's failure, if it failed while running.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.task.take() {
            Some(task) => Ok(task.await??),
            None => Ok(()),
        }
    }
}

impl Drop for EmbeddedRuntime {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
