//! Binding the listener and running the server until shutdown.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use phrony_dispatch::Router;
use phrony_engine::{
    DefaultProviderFactory, Engine, EngineConfig, EngineDeps, LedgerStore, RouterHooks, SystemClock,
};
use phrony_ledger::{Ledger, SecretCipher};
use phrony_proto::runtime::v1::runtime_server::RuntimeServer;
use tokio::net::TcpListener;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;

use phrony_grpc::auth::Authenticated;
use phrony_grpc::health::{self, Health};
use phrony_grpc::{MAX_MESSAGE_BYTES, RuntimeService};

use crate::serve_config::ServeConfig;

/// Why the server could not start or stopped with an error. A cause with a chain of its own (the
/// transport's, the engine's) is the `source()`, which a report (`{:#}`) prints after the message;
/// a leaf cause (an OS error, the router's settings) is in the message.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Another process listens on the address.
    #[error("address {addr} is already in use")]
    AddrInUse {
        /// The address as configured.
        addr: String,
    },
    /// The address is not `host:port`, or the host does not resolve.
    #[error("invalid listen address {addr:?}: {error}")]
    InvalidAddress {
        /// The address as configured.
        addr: String,
        /// The resolver's error (in the message, not a source: a report names it once).
        error: io::Error,
    },
    /// Listening failed for another reason (e.g. permission denied on a low port).
    #[error("cannot listen on {addr}: {error}")]
    Bind {
        /// The address as configured.
        addr: String,
        /// The OS error (in the message, not a source).
        error: io::Error,
    },
    /// The webhook sender could not start (its HTTP client).
    #[error("cannot start the webhook sender: {message}")]
    Webhooks {
        /// Why.
        message: String,
    },
    /// The reflection service could not be built from the descriptor sets.
    #[error("cannot build the reflection service: {message}")]
    Reflection {
        /// The builder's error.
        message: String,
    },
    /// The default Work-stream router could not be started.
    #[error("cannot start the tool dispatch router: {error}")]
    Router {
        /// The router's settings error (a leaf: in the message, not a source).
        error: phrony_dispatch::ConfigError,
    },
    /// The sessions that were live at the last stop could not be read back.
    #[error("cannot recover the sessions that were live at the last stop")]
    Recovery {
        /// The engine's error.
        #[source]
        source: phrony_engine::EngineError,
    },
    /// `local` auth on an address other hosts can reach.
    #[error(transparent)]
    UnsafeBind(#[from] crate::auth::UnsafeBind),
    /// The TLS settings could not be turned into a TLS acceptor.
    #[error("cannot configure TLS")]
    Tls {
        /// The transport error.
        #[source]
        source: tonic::transport::Error,
    },
    /// The transport failed while serving.
    #[error("gRPC server failed")]
    Transport {
        /// The transport error.
        #[source]
        source: tonic::transport::Error,
    },
}

/// A bound TCP listener, ready for [`serve`].
#[derive(Debug)]
pub struct Listener {
    listener: Arc<TcpListener>,
    local_addr: SocketAddr,
    starting: Option<Starting>,
}

/// The placeholder server of [`Listener::serve_starting`].
#[derive(Debug)]
struct Starting {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
}

/// How long the placeholder's connections get to finish when [`serve`] takes the listener over.
const STARTING_HANDOVER: Duration = Duration::from_millis(500);

impl Listener {
    /// The address actually bound (useful with port 0).
    #[must_use]
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Until [`serve`] takes the listener over, answers `grpc.health.v1.Health` on it with
    /// `NOT_SERVING` (every other RPC is `UNIMPLEMENTED`), so that a daemon waiting for its
    /// database at start-up says so instead of leaving clients' connections unanswered. With
    /// `tls`, the placeholder speaks TLS as the real server will.
    ///
    /// # Errors
    /// [`ServeError::Tls`] when the TLS settings are refused.
    pub fn serve_starting(
        &mut self,
        tls: Option<tonic::transport::ServerTlsConfig>,
    ) -> Result<(), ServeError> {
        if self.starting.is_some() {
            return Ok(());
        }
        let mut builder = Server::builder();
        if let Some(tls) = tls {
            builder = builder
                .tls_config(tls)
                .map_err(|source| ServeError::Tls { source })?;
        }
        let health = Health::new();
        let incoming = SharedIncoming(Arc::clone(&self.listener));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = builder
            .add_service(health.service())
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stopped.await;
            });
        let task = tokio::spawn(async move {
            if let Err(e) = server.await {
                tracing::warn!(error = %e, "the start-up health server failed");
            }
        });
        self.starting = Some(Starting { stop, task });
        Ok(())
    }

    /// Stops the placeholder of [`Listener::serve_starting`] (its connections get
    /// [`STARTING_HANDOVER`] to finish) and returns the listener for the real server.
    async fn take(self) -> Result<TcpListener, ServeError> {
        if let Some(Starting { stop, mut task }) = self.starting {
            let _ = stop.send(());
            if tokio::time::timeout(STARTING_HANDOVER, &mut task)
                .await
                .is_err()
            {
                task.abort();
                let _ = task.await;
            }
        }
        // The placeholder's incoming stream (the only other owner) was dropped with its task.
        Arc::try_unwrap(self.listener).map_err(|_| ServeError::Bind {
            addr: self.local_addr.to_string(),
            error: io::Error::other("the start-up health server did not release the listener"),
        })
    }
}

/// Accepts connections on a listener the placeholder server shares with [`Listener`].
struct SharedIncoming(Arc<TcpListener>);

impl tonic::codegen::tokio_stream::Stream for SharedIncoming {
    type Item = io::Result<tokio::net::TcpStream>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.0
            .poll_accept(cx)
            .map(|accepted| Some(accepted.map(|(stream, _)| stream)))
    }
}

/// Binds `addr` (`host:port`; the host may be a name). Separate from [`serve`] so that a port
/// conflict is reported before anything else starts.
///
/// # Errors
/// [`ServeError::AddrInUse`], [`ServeError::InvalidAddress`] or [`ServeError::Bind`].
pub async fn bind(addr: &str) -> Result<Listener, ServeError> {
    let listener = bind_tcp(addr).await?;
    let local_addr = listener.local_addr().map_err(|error| ServeError::Bind {
        addr: addr.to_owned(),
        error,
    })?;
    Ok(Listener {
        listener: Arc::new(listener),
        local_addr,
        starting: None,
    })
}

/// Binds a TCP listener on `addr`, naming a port conflict, a bad address or another failure.
pub(crate) async fn bind_tcp(addr: &str) -> Result<TcpListener, ServeError> {
    TcpListener::bind(addr)
        .await
        .map_err(|error| match error.kind() {
            io::ErrorKind::AddrInUse => ServeError::AddrInUse {
                addr: addr.to_owned(),
            },
            io::ErrorKind::InvalidInput => ServeError::InvalidAddress {
                addr: addr.to_owned(),
                error,
            },
            // Name resolution failures surface as "other" errors from getaddrinfo.
            _ if error.raw_os_error().is_none() => ServeError::InvalidAddress {
                addr: addr.to_owned(),
                error,
            },
            _ => ServeError::Bind {
                addr: addr.to_owned(),
                error,
            },
        })
}

/// The gRPC reflection services (v1 and v1alpha) over the runtime's and health's descriptors.
fn reflection_services() -> Result<
    (
        tonic_reflection::server::v1::ServerReflectionServer<
            impl tonic_reflection::server::v1::ServerReflection,
        >,
        tonic_reflection::server::v1alpha::ServerReflectionServer<
            impl tonic_reflection::server::v1alpha::ServerReflection,
        >,
    ),
    ServeError,
> {
    let reflection = |e: tonic_reflection::server::Error| ServeError::Reflection {
        message: e.to_string(),
    };
    let v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(phrony_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(health::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(reflection)?;
    let v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(phrony_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(health::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .map_err(reflection)?;
    Ok((v1, v1alpha))
}

/// The edge's authenticator in `mode` (with the configured OIDC and mTLS arms), said once at
/// start-up: a warning in `local` mode, which verifies nobody.
fn edge_authenticator(
    mode: crate::auth::AuthMode,
    ledger: &Ledger,
    config: &ServeConfig,
) -> Arc<dyn phrony_auth::Authenticator> {
    match mode {
        crate::auth::AuthMode::Local => tracing::warn!(
            "the runtime is unauthenticated (RUNTIME_AUTH=local): any local process may call it \
             under any name, recorded as unverified; set RUNTIME_AUTH=required to require tokens"
        ),
        crate::auth::AuthMode::Required => {
            tracing::info!("authentication required on every RPC (RUNTIME_AUTH=required)");
        }
    }
    crate::auth::authenticator(
        mode,
        ledger,
        &config.default_actor,
        config
            .oidc
            .clone()
            .map(|o| o as Arc<dyn phrony_auth::Authenticator>),
        config
            .mtls
            .clone()
            .map(|m| m as Arc<dyn phrony_auth::Authenticator>),
    )
}

/// The session engine's settings from the daemon's.
fn engine_config(config: &ServeConfig) -> EngineConfig {
    EngineConfig {
        queue_wait: config.dispatch_queue_wait,
        exec_timeout: config.tool_exec_timeout,
        max_tool_args_bytes: config.max_tool_args_bytes,
        max_tool_calls_per_turn: config.max_tool_calls_per_turn,
        recovery_grace: config.recovery_grace,
        max_queued_user_messages: config.max_queued_user_messages,
        max_sessions_per_agent: config.max_sessions_per_agent,
        max_approval_watchers: config.max_approval_watchers,
        park_approval_waits: config.park_approval_waits,
        session_lease_ttl: config.session_lease_ttl,
        ..EngineConfig::default()
    }
}

/// Serves `phrony.runtime.v1.Runtime` (behind the access edge, in [`ServeConfig::auth`] mode),
/// `grpc.health.v1.Health` and server reflection (v1 and v1alpha) on `listener` until
/// `shutdown` completes, then stops gracefully: health turns
/// `NOT_SERVING`, no new connections are accepted, the worker registry refuses new
/// registrations and dispatches (queued tool calls fail), in-flight calls get
/// [`ServeConfig::shutdown_grace`] to finish (then they are cut off, which rolls back any
/// uncommitted transaction), and the ledger's pool is closed. Tool calls already sent to a
/// worker get the first half of the grace period to finish; then every `Work` stream ends
/// with `OK`. `ledger` must be migrated.
///
/// With [`ServeConfig::tls`] the listener speaks TLS only (and, with a client CA, requires a
/// client certificate signed by it).
///
/// Tool workers register with [`ServeConfig::router`] (or a default router when `None`).
///
/// # Errors
/// [`ServeError::UnsafeBind`] (`local` auth on a non-loopback address, before anything
/// starts), [`ServeError::Reflection`] (a build defect), [`ServeError::Router`], [`ServeError::Tls`] or
/// [`ServeError::Transport`].
pub async fn serve(
    listener: Listener,
    ledger: Ledger,
    config: ServeConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let mode = crate::auth::resolve_mode(Some(config.auth), false, listener.local_addr)?;
    let (ledger, background) = start_background(ledger, config.webhooks.clone())?;
    let authenticator = edge_authenticator(mode, &ledger, &config);
    let health = Health::new();
    let monitor = health.spawn_monitor(
        ledger.clone(),
        config.health_check_interval,
        config.health_check_timeout,
    );

    let (reflection_v1, reflection_v1alpha) = reflection_services()?;
    let cipher = SecretCipher::new(config.secrets_key.as_bytes());
    let store = Arc::new(LedgerStore::new(ledger.clone(), Some(cipher)));
    let engine_settings = engine_config(&config);
    let router = match config.router {
        Some(router) => router,
        None => {
            let hooks = Arc::new(RouterHooks::new(Arc::clone(&store)));
            let mut builder = Router::builder(config.router_config.clone())
                .observer(hooks.clone())
                .completed_calls(hooks.clone())
                .descriptor_pins(hooks);
            if let Some(allowlist) = config.tool_allowlist.clone() {
                builder = builder.allowlist(allowlist);
            }
            builder
                .build()
                .map_err(|error| ServeError::Router { error })?
        }
    };
    // Secrets of sessions that ended while the daemon was down (or whose purge failed).
    match ledger.purge_orphan_secrets().await {
        Ok(0) => {}
        Ok(n) => tracing::info!(sessions = n, "purged the secrets of ended sessions"),
        Err(e) => tracing::warn!(error = %e, "could not purge the secrets of ended sessions"),
    }
    let providers = config
        .providers
        .clone()
        .unwrap_or_else(|| Arc::new(DefaultProviderFactory::new(crate::config::provider_env())));
    let engine = Engine::new(EngineDeps {
        store,
        router: Some(router.clone()),
        providers,
        clock: Arc::new(SystemClock),
        config: engine_settings,
    });
    // Sessions that were live when the daemon stopped resume where their event log says.
    let report = engine
        .recover()
        .await
        .map_err(|source| ServeError::Recovery { source })?;
    log_recovery(&report);
    let service = RuntimeService::new(ledger.clone(), config.default_actor, router.clone())
        .with_engine(engine.clone())
        .with_watch_buffer(config.approval_watch_buffer, config.approval_watch_grace);
    let work_streams = service.clone();
    let console_service = service.clone();
    let runtime = Authenticated::new(
        RuntimeServer::new(service).max_decoding_message_size(MAX_MESSAGE_BYTES),
        Arc::clone(&authenticator),
    );

    let local_addr = listener.local_addr;
    let incoming = TcpIncoming::from(listener.take().await?).with_nodelay(Some(true));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    // Boxed (not stack-pinned) so it can be dropped before the pool is closed: dropping it
    // cancels calls still running after the grace period and returns their connections.
    let tls = config.tls.is_some();
    let mut builder = Server::builder();
    if let Some(tls) = config.tls.clone() {
        builder = builder
            .tls_config(tls)
            .map_err(|source| ServeError::Tls { source })?;
    }
    let mut server = Box::pin(
        builder
            .trace_fn(crate::telemetry::rpc_span)
            .add_service(health.service())
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha)
            .add_service(runtime)
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stop_rx.await;
            }),
    );
    // Recovery is done: `/readyz` follows the health state from now on.
    if let Some(http) = &config.http {
        http.serving(crate::http::Serving {
            health: health.clone(),
            ledger: ledger.clone(),
            router: router.clone(),
            authenticator,
            service: console_service,
        });
    }
    tracing::info!(
        address = %local_addr,
        tls,
        secrets_key_fingerprint = %config.secrets_key.fingerprint(),
        "phrony-runtime listening on {local_addr}"
    );

    let result = tokio::select! {
        result = &mut server => result,
        () = shutdown => {
            tracing::info!(
                grace_seconds = config.shutdown_grace.as_secs_f64(),
                "shutting down: no new connections; waiting for in-flight calls"
            );
            monitor.abort();
            health.set_stopping();
            let _ = stop_tx.send(());
            router.shutdown();
            work_streams.close_session_streams();
            // Work streams never end on their own: close them once the tool calls sent to
            // workers are answered (or half the grace period is over), while the server keeps
            // running the other calls.
            let close_work_streams = async {
                drain_dispatched_calls(&router, config.shutdown_grace / 2).await;
                work_streams.close_work_streams();
                std::future::pending::<std::convert::Infallible>().await
            };
            let stopped = async {
                tokio::select! {
                    result = &mut server => result,
                    never = close_work_streams => match never {},
                }
            };
            match tokio::time::timeout(config.shutdown_grace, stopped).await {
                Ok(result) => result,
                Err(_) => {
                    tracing::warn!("grace period over; closing the remaining connections");
                    Ok(())
                }
            }
        }
    };
    monitor.abort();
    drop((background, server));
    // Drivers stop where they are; their sessions resume from the log at the next start.
    stop_engine(&engine).await;
    ledger.close().await;
    match result {
        Ok(()) => {
            tracing::info!("stopped");
            Ok(())
        }
        Err(source) => Err(ServeError::Transport { source }),
    }
}

/// Stops the engine's tasks and waits for the session drivers, bounded: a driver stops at its
/// next await point; one that does not within the limit resumes from the log at the next start
/// like any other.
async fn stop_engine(engine: &Engine) {
    engine.shutdown();
    if !engine.drained(std::time::Duration::from_secs(5)).await {
        tracing::warn!("some session drivers were still stopping at shutdown");
    }
}

/// The daemon's background tasks beside the server (each stopped when dropped).
type Background = (
    Option<crate::webhooks::WebhookSender>,
    crate::history_prune::HistoryPruner,
);

/// The history pruner and, with webhooks, their sender and the ledger writing their outbox
/// rows in every notifying event's transaction from now on.
fn start_background(
    ledger: Ledger,
    webhooks: Option<Arc<crate::webhooks::WebhooksConfig>>,
) -> Result<(Ledger, Background), ServeError> {
    let Some(webhooks) = webhooks else {
        // Deliveries written while a webhooks file was configured can never be sent now.
        tokio::spawn(crate::webhooks::fail_unconfigured(ledger.clone()));
        let pruner = crate::history_prune::HistoryPruner::start(ledger.clone());
        return Ok((ledger, (None, pruner)));
    };
    let ledger = ledger.with_webhooks(webhooks.routes());
    let sender = crate::webhooks::WebhookSender::start(ledger.clone(), webhooks).map_err(|e| {
        ServeError::Webhooks {
            message: format!("{e:#}"),
        }
    })?;
    let pruner = crate::history_prune::HistoryPruner::start(ledger.clone());
    Ok((ledger, (Some(sender), pruner)))
}

/// Waits until no tool call is running on a worker and no result awaits its acknowledgement,
/// or `limit` passes.
async fn drain_dispatched_calls(router: &Router, limit: Duration) {
    const POLL: Duration = Duration::from_millis(25);
    let deadline = tokio::time::Instant::now() + limit;
    let mut reported = false;
    loop {
        let snapshot = router.snapshot();
        let running: usize = snapshot.workers.iter().map(|w| w.in_flight.len()).sum();
        if running == 0 && snapshot.awaiting_ack == 0 {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(
                running,
                awaiting_ack = snapshot.awaiting_ack,
                "closing worker streams with tool calls unfinished; their outcome is unknown"
            );
            return;
        }
        if !reported {
            reported = true;
            tracing::info!(
                running,
                awaiting_ack = snapshot.awaiting_ack,
                "waiting for tool calls sent to workers to finish"
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Logs what start-up recovery did with the sessions that were live at the last stop.
fn log_recovery(report: &phrony_engine::RecoveryReport) {
    if !report.resumed.is_empty()
        || !report.failed.is_empty()
        || !report.suspended.is_empty()
        || !report.parked.is_empty()
        || !report.driven_elsewhere.is_empty()
    {
        tracing::info!(
            resumed = report.resumed.len(),
            failed = report.failed.len(),
            suspended = report.suspended.len(),
            parked = report.parked.len(),
            driven_elsewhere = report.driven_elsewhere.len(),
            "recovered the sessions that were live at the last stop"
        );
    }
    for (session_id, reason) in &report.failed {
        tracing::warn!(%session_id, %reason, "session could not be resumed and was failed");
    }
}
