//! The two commands, wired from configuration to the libraries.

use crate::serve::{self, ServeError};
use crate::serve_config::ServeConfig;
use std::time::Duration;

use anyhow::Context as _;
use phrony_ledger::{Backend, Ledger, LedgerError};

use crate::config::{Database, Env, Settings};

/// `phrony-runtime serve`: configured key and tool-worker settings, listener, database and
/// migrations, generated key, dispatch router, then serve until a signal. Each step fails before the next has side effects.
pub fn serve(settings: &Settings, env: &Env) -> anyhow::Result<()> {
    tokio_runtime()?.block_on(async {
        // Before anything slow, so a signal during start-up is a clean stop too.
        let mut shutdown = Box::pin(shutdown_signal()?);
        let db = settings.database(env);
        let configured_key = settings.configured_secrets_key()?;
        let workers = settings.workers()?;
        let ledger_options = settings.ledger_options()?;
        let database_wait = settings.database_start_timeout()?;
        let tls = settings.tls()?;
        let oidc = settings.oidc()?;
        // Before anything starts: a bad webhooks file is a start-up error naming file:line:col.
        let webhooks = match settings.webhooks_file.as_deref() {
            Some(path) if !path.as_os_str().is_empty() => Some(std::sync::Arc::new(
                crate::webhooks::WebhooksConfig::load(path)
                    .map_err(|e| anyhow::anyhow!("RUNTIME_WEBHOOKS_FILE {e}"))?,
            )),
            _ => None,
        };
        let mut listener = serve::bind(&settings.grpc_addr)
            .await
            .map_err(|e| match e {
                ServeError::AddrInUse { addr } => {
                    anyhow::anyhow!("address {addr} is already in use; set RUNTIME_GRPC_ADDR")
                }
                ServeError::InvalidAddress { addr, error } => {
                    anyhow::anyhow!(
                        "invalid RUNTIME_GRPC_ADDR {addr:?}: expected host:port ({error})"
                    )
                }
                other => anyhow::Error::new(other),
            })?;
        // Before the database is touched: a daemon reachable from other hosts must not serve
        // unauthenticated.
        // OIDC or a client-certificate roles file configured means `required` by default.
        let auth_configured = oidc.is_some() || tls.as_ref().is_some_and(|t| t.clients.is_some());
        let auth =
            crate::auth::resolve_mode(settings.auth, auth_configured, listener.local_addr())?;
        // The probes answer from now on (`/readyz` 503 until recovery is done); a non-loopback
        // HTTP address needs `required` mode, like the gRPC one.
        let http = match settings.http_addr.as_deref().filter(|a| !a.is_empty()) {
            None => None,
            Some(addr) => Some(crate::http::HttpServer::start(addr, auth).await.map_err(
                |e| match e {
                    ServeError::AddrInUse { addr } => {
                        anyhow::anyhow!("address {addr} is already in use; set RUNTIME_HTTP_ADDR")
                    }
                    other => anyhow::Error::new(other).context("RUNTIME_HTTP_ADDR"),
                },
            )?),
        };
        // Health checks get NOT_SERVING (not a silent port) until the server runs.
        listener.serve_starting(tls.as_ref().map(|t| t.server.clone()))?;
        let Some(ledger) =
            open_ledger_waiting(&db, ledger_options, database_wait, &mut shutdown).await?
        else {
            tracing::info!("stopped while waiting for the database");
            if let Some(http) = http {
                http.stop(HTTP_STOP_GRACE).await;
            }
            return Ok(());
        };
        let (audit_key, key_file) =
            crate::audit::load_key(&settings.audit_key_file(env, &db), true)?;
        let replica_id = settings
            .replica_id
            .clone()
            .filter(|id| !id.trim().is_empty())
            .unwrap_or_else(|| default_replica_id(ledger.backend()));
        let ledger = ledger
            .with_audit_key(audit_key)
            .with_replica_id(&replica_id)
            .map_err(|e| anyhow::anyhow!("invalid RUNTIME_REPLICA_ID: {e}"))?;
        tracing::info!(replica_id = %replica_id, "runtime replica");
        crate::audit::check_at_start(
            &ledger,
            key_file,
            settings.allow_unverified_log,
            &settings.default_actor,
        )
        .await?;
        let secrets_key = match configured_key {
            Some(key) => key,
            None => settings.key_file_secrets_key(env, &db)?,
        };
        let mut config = ServeConfig::new(secrets_key);
        config.default_actor = settings.default_actor.clone();
        config.park_approval_waits = settings.park_approval_waits;
        config.auth = auth;
        config.session_lease_ttl = workers.session_lease_ttl(ledger.backend());
        workers.apply(&mut config)?;
        if let Some(tls) = tls {
            tracing::info!(
                mutual = tls.mutual,
                "TLS on the gRPC listener{}",
                if tls.mutual {
                    ", client certificates required"
                } else {
                    ""
                }
            );
            config.tls = Some(tls.server);
            config.mtls = tls.clients;
        }
        if let Some(oidc) = oidc {
            config.oidc = Some(std::sync::Arc::new(
                crate::oidc::OidcAuthenticator::load(oidc).await?,
            ));
        }
        config.http = http.as_ref().map(crate::http::HttpServer::readiness);
        config.webhooks = webhooks;
        let served = serve::serve(listener, ledger, config, shutdown).await;
        // After the gRPC server's graceful stop (probes said `not ready: shutting down` during
        // it).
        if let Some(http) = http {
            http.stop(HTTP_STOP_GRACE).await;
        }
        served?;
        Ok(())
    })
}

/// How long open HTTP requests (a scrape) get to finish once the daemon stopped.
const HTTP_STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// `phrony-runtime migrate`: apply the migrations and exit.
pub fn migrate(settings: &Settings, env: &Env) -> anyhow::Result<()> {
    tokio_runtime()?.block_on(async {
        let db = settings.database(env);
        let ledger = open_ledger(&db, settings.ledger_options()?).await?;
        ledger.close().await;
        Ok(())
    })
}

/// `phrony-runtime audit verify`: the full verification on the database directly, with the
/// audit key file the daemon uses (which must exist).
pub fn audit_verify(
    settings: &Settings,
    env: &Env,
    args: &crate::config::AuditVerifyArgs,
) -> anyhow::Result<()> {
    tokio_runtime()?.block_on(async {
        let db = settings.database(env);
        let (key, _) = crate::audit::load_key(&settings.audit_key_file(env, &db), false)?;
        let ledger = open_ledger(&db, settings.ledger_options()?)
            .await?
            .with_audit_key(key);
        let result = crate::audit::verify(&ledger, args).await;
        ledger.close().await;
        result
    })
}

fn tokio_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// `phrony-runtime tokens …`: on the daemon's database (migrated first, under its audit key),
/// printing to stdout.
pub fn tokens(
    settings: &Settings,
    env: &Env,
    command: &crate::tokens::TokensCommand,
) -> anyhow::Result<()> {
    tokio_runtime()?.block_on(async {
        let db = settings.database(env);
        // Token changes are events: appended under the audit key, on a log that passes the
        // daemon's own start-up check (a new key seals the existing log first, as `serve` does).
        let (audit_key, key_file) =
            crate::audit::load_key(&settings.audit_key_file(env, &db), true)?;
        let ledger = open_ledger(&db, settings.ledger_options()?)
            .await?
            .with_audit_key(audit_key);
        crate::audit::check_at_start(&ledger, key_file, false, &settings.default_actor).await?;
        let mut out = std::io::stdout().lock();
        let result = crate::tokens::run(&ledger, command, &settings.default_actor, &mut out).await;
        ledger.close().await;
        result
    })
}

/// The first wait between two attempts of [`open_ledger_waiting`]; it doubles up to
/// [`OPEN_RETRY_MAX`].
const OPEN_RETRY_FIRST: Duration = Duration::from_millis(250);
const OPEN_RETRY_MAX: Duration = Duration::from_secs(5);

/// [`open_ledger`], waiting up to `wait` for a PostgreSQL database that is unreachable
/// ([`LedgerError::Unavailable`]: refused, starting, shutting down, out of connections) and
/// retrying with backoff; `None` when `shutdown` completed first. Any other failure, and any
/// failure of a SQLite file (a path problem, not an outage), is returned at once.
async fn open_ledger_waiting(
    db: &Database,
    options: phrony_ledger::LedgerOptions,
    wait: Duration,
    shutdown: &mut (impl Future<Output = ()> + Unpin),
) -> anyhow::Result<Option<Ledger>> {
    let deadline = tokio::time::Instant::now() + wait;
    let mut backoff = OPEN_RETRY_FIRST;
    let mut retries = 0u32;
    loop {
        let attempt = tokio::select! {
            attempt = try_open(db, options.clone()) => attempt,
            () = &mut *shutdown => return Ok(None),
        };
        let (error, report) = match attempt {
            Ok(ledger) => {
                if retries > 0 {
                    tracing::info!(retries, "the database is reachable");
                }
                return Ok(Some(ledger));
            }
            Err(failed) => failed,
        };
        let outage = matches!(error, LedgerError::Unavailable { .. }) && db.sqlite_file.is_none();
        let now = tokio::time::Instant::now();
        if !outage || wait.is_zero() {
            return Err(report);
        }
        if now >= deadline {
            return Err(report.context(format!(
                "gave up waiting for the database after {} (RUNTIME_DATABASE_START_TIMEOUT)",
                humantime::format_duration(wait)
            )));
        }
        retries += 1;
        let pause = backoff.min(deadline - now);
        tracing::warn!(
            error = format!("{report:#}"),
            retry_in_ms = u64::try_from(pause.as_millis()).unwrap_or(u64::MAX),
            "database unreachable at start-up; health answers NOT_SERVING until it is reachable"
        );
        tokio::select! {
            () = tokio::time::sleep(pause) => {}
            () = &mut *shutdown => return Ok(None),
        }
        backoff = (backoff * 2).min(OPEN_RETRY_MAX);
    }
}

/// Connects, migrates and reports where the data lives.
pub(crate) async fn open_ledger(
    db: &Database,
    options: phrony_ledger::LedgerOptions,
) -> anyhow::Result<Ledger> {
    try_open(db, options).await.map_err(|(_, report)| report)
}

/// [`open_ledger`], keeping the ledger's own error beside the report (to tell an outage from a
/// configuration problem).
async fn try_open(
    db: &Database,
    options: phrony_ledger::LedgerOptions,
) -> Result<Ledger, (LedgerError, anyhow::Error)> {
    let ledger = Ledger::connect_with(&db.url, options).await.map_err(|e| {
        let report = match &e {
            LedgerError::Config { message } => {
                anyhow::anyhow!("invalid RUNTIME_DATABASE_URL: {message}")
            }
            LedgerError::Unavailable { .. } => anyhow::anyhow!("database unreachable: {e}"),
            other => anyhow::anyhow!("cannot open the database: {other}"),
        };
        (e, report)
    })?;
    match (ledger.backend(), &db.sqlite_file) {
        (Backend::Sqlite, Some(file)) => {
            let shown = std::path::absolute(file).unwrap_or_else(|_| file.clone());
            tracing::info!("database: SQLite file {}", shown.display());
        }
        _ => tracing::info!("database: {}", ledger.display_url()),
    }
    if let Err(e) = ledger.migrate().await {
        let report = anyhow::anyhow!("cannot migrate the database {}: {e}", ledger.display_url());
        ledger.close().await;
        return Err((e, report));
    }
    let schema = match ledger.schema_version().await {
        Ok(schema) => schema,
        Err(e) => {
            let report = anyhow::anyhow!(
                "cannot read the schema version of {}: {e}",
                ledger.display_url()
            );
            ledger.close().await;
            return Err((e, report));
        }
    };
    tracing::info!(
        "database migrated to schema version {}",
        schema.as_deref().unwrap_or("(none)")
    );
    Ok(ledger)
}

/// Completes on the first SIGINT or SIGTERM. The handlers are installed immediately.
#[cfg(unix)]
fn shutdown_signal() -> anyhow::Result<impl Future<Output = ()> + Send> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    let mut terminate = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => tracing::info!("SIGINT received"),
            _ = terminate.recv() => tracing::info!("SIGTERM received"),
        }
    })
}

/// Completes on the first Ctrl-C.
#[cfg(not(unix))]
fn shutdown_signal() -> anyhow::Result<impl Future<Output = ()> + Send> {
    Ok(async {
        if tokio::signal::ctrl_c().await.is_ok() {
            tracing::info!("Ctrl-C received");
        } else {
            std::future::pending::<()>().await;
        }
    })
}

/// A replica id for a process nobody named (`RUNTIME_REPLICA_ID`). On SQLite, whose file one
/// daemon serves at a time, always `local`: a daemon restarted after a crash takes its sessions'
/// leases back at once instead of waiting for them to expire. On PostgreSQL the host name and 8
/// random hex digits, so two processes on one host differ too.
fn default_replica_id(backend: Backend) -> String {
    if backend == Backend::Sqlite {
        return "local".to_owned();
    }
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| {
            h.trim()
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
                .take(64)
                .collect::<String>()
        })
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "runtime".to_owned());
    let random = uuid::Uuid::new_v4().simple().to_string();
    format!("{host}-{}", &random[..8])
}
