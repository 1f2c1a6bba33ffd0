//! Command line and environment: what the daemon runs on and where its files live.
//!
//! With nothing configured the daemon runs on an embedded SQLite file under the user's data
//! directory (`$XDG_DATA_HOME/phrony/`, else `~/.local/share/phrony/`, else the current
//! directory) and keeps a generated secrets key next to it.

use std::path::{Path, PathBuf};

use crate::serve_config::{KeyFileOutcome, SECRETS_KEY_FILE, SecretsKey};

/// The name of the generated audit key file.
pub const AUDIT_KEY_FILE: &str = "audit.key";
use anyhow::Context as _;
use clap::{Args, Parser, Subcommand, ValueEnum};
use percent_encoding::{AsciiSet, CONTROLS, percent_decode_str, utf8_percent_encode};

/// The Phrony runtime daemon: stores versioned agents and serves the phrony.runtime.v1 gRPC API.
#[derive(Debug, Parser)]
#[command(name = "phrony-runtime", version, max_term_width = 100)]
pub struct Cli {
    /// What to do (`serve` when absent).
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Settings shared by every command.
    #[command(flatten)]
    pub settings: Settings,
}

#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum Command {
    /// Migrate the database and serve the gRPC API (the default).
    Serve,
    /// Apply the database migrations and exit.
    Migrate,
    /// Create, list and revoke API tokens on the daemon's database (running or not).
    #[command(subcommand)]
    Tokens(crate::tokens::TokensCommand),
    /// Audit the event log offline, on the database directly (the daemon may be down).
    Audit {
        /// What to do.
        #[command(subcommand)]
        command: AuditCommand,
    },
}

/// `phrony-runtime audit …`.
#[derive(Debug, Clone, PartialEq, Eq, Subcommand)]
pub enum AuditCommand {
    /// Verify the hash chains, the sealed stream heads (with the audit key), the append-only
    /// triggers and the projections re-folded from the events. Prints `verified N events in M
    /// streams`, or names the first bad event and exits 1.
    Verify(AuditVerifyArgs),
}

/// What `audit verify` covers (default: everything).
#[derive(Debug, Clone, PartialEq, Eq, Args)]
#[group(multiple = false)]
pub struct AuditVerifyArgs {
    /// Only this session.
    #[arg(long, value_name = "ID")]
    pub session: Option<String>,
    /// Only this agent's lifecycle stream.
    #[arg(long, value_name = "NS/NAME")]
    pub agent: Option<String>,
    /// Every stream and projection (the default).
    #[arg(long)]
    pub all: bool,
}

/// Settings shared by every command; each can also come from the environment.
#[derive(Debug, Clone, Args)]
pub struct Settings {
    /// Address to listen on (host:port).
    #[arg(
        long,
        env = "RUNTIME_GRPC_ADDR",
        default_value = "127.0.0.1:7777",
        global = true
    )]
    pub(crate) grpc_addr: String,

    /// HTTP address (host:port) for `/healthz`, `/readyz` and `/metrics` (Prometheus).
    /// Loopback only unless RUNTIME_AUTH=required (then `/metrics` needs a token with `read`).
    /// [default: off]
    #[arg(long, env = "RUNTIME_HTTP_ADDR", value_name = "ADDR", global = true)]
    pub(crate) http_addr: Option<String>,

    /// Webhooks file (YAML): a list of `{name, url, events, format: json|slack, secret_env,
    /// console_url, timeout, max_attempts, backoff_initial, backoff_max,
    /// allow_insecure_http}`; HMAC keys come from the environment variables it names.
    /// [default: off]
    #[arg(
        long = "webhooks-file",
        env = "RUNTIME_WEBHOOKS_FILE",
        value_name = "FILE",
        global = true
    )]
    pub(crate) webhooks_file: Option<PathBuf>,

    /// Database URL: sqlite://PATH or postgres://USER@HOST:PORT/DB.
    /// [default: SQLite file phrony.db in the data directory]
    #[arg(long, env = "RUNTIME_DATABASE_URL", value_name = "URL", global = true)]
    pub(crate) database_url: Option<String>,

    /// Log format.
    #[arg(long, env = "RUNTIME_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,

    /// Log filter, e.g. `info` or `info,phrony_grpc=debug` (falls back to RUST_LOG, then `info`).
    #[arg(
        long = "log",
        env = "RUNTIME_LOG",
        value_name = "FILTER",
        global = true
    )]
    pub(crate) log_filter: Option<String>,

    /// Secrets encryption key: 32 bytes as hex, base64 or unpadded base64. Prefer the
    /// environment variable. [default: generated into secrets.key next to the database]
    #[arg(
        long = "secrets-encryption-key",
        env = "RUNTIME_SECRETS_ENCRYPTION_KEY",
        value_name = "KEY",
        hide_env_values = true,
        global = true
    )]
    pub(crate) secrets_key: Option<String>,

    /// Who may call: `local` (nobody is verified; loopback addresses only) or `required`
    /// (every RPC needs a credential, e.g. a token from `tokens create`).
    /// [default: local on a loopback address; a non-loopback address requires `required`]
    #[arg(
        long,
        env = "RUNTIME_AUTH",
        value_enum,
        value_name = "MODE",
        global = true
    )]
    pub(crate) auth: Option<crate::auth::AuthMode>,
    /// The audit key file: 32 bytes (hex) that MAC the event log's stream heads, kept outside
    /// the database. Created owner-only on first start. [default: audit.key next to the
    /// database]
    #[arg(
        long,
        env = "RUNTIME_AUDIT_KEY_FILE",
        value_name = "FILE",
        global = true
    )]
    pub(crate) audit_key_file: Option<PathBuf>,

    /// Serve a log that fails its start-up audit check (recovery): the override is logged,
    /// recorded as an `audit.unverified_log_allowed` event, and the heads are re-sealed.
    #[arg(
        long,
        env = "RUNTIME_ALLOW_UNVERIFIED_LOG",
        value_parser = clap::builder::BoolishValueParser::new(),
        action = clap::ArgAction::SetTrue,
        global = true
    )]
    pub(crate) allow_unverified_log: bool,

    /// Park a task session while every open call waits for a human: its driver is unloaded
    /// and the session resumes from its event log when a decision comes (memory then does not
    /// grow with the sessions waiting). `false` keeps every waiting driver in memory.
    #[arg(
        long,
        env = "RUNTIME_PARK_APPROVAL_WAITS",
        value_name = "BOOL",
        value_parser = clap::builder::BoolishValueParser::new(),
        default_value = "true",
        global = true
    )]
    pub(crate) park_approval_waits: bool,

    /// Actor recorded for changes whose request names none.
    #[arg(long, env = "PHRONY_ACTOR", default_value = "anonymous", global = true)]
    pub(crate) default_actor: String,

    /// How long a tool call may wait for a free worker: whole seconds, or a duration such as
    /// 500ms, 30s or 2m. It does not limit how long the tool runs. [default: 10s]
    #[arg(
        long,
        env = "RUNTIME_DISPATCH_QUEUE_WAIT",
        value_name = "DURATION",
        global = true
    )]
    pub(crate) dispatch_queue_wait: Option<String>,

    /// How many tool calls may wait for a free worker slot per `tool@version`; a call beyond
    /// that fails at once as not dispatched (`dispatch:capacity_exhausted`). [default: 4096]
    #[arg(
        long,
        env = "RUNTIME_DISPATCH_QUEUE_CAPACITY",
        value_name = "N",
        global = true
    )]
    pub(crate) dispatch_queue_capacity: Option<String>,

    /// How long a worker may run a tool call whose binding sets no timeout; then the call is
    /// cancelled. Seconds or a duration. [default: 60s]
    #[arg(
        long,
        env = "RUNTIME_TOOL_EXEC_TIMEOUT",
        value_name = "DURATION",
        global = true
    )]
    pub(crate) tool_exec_timeout: Option<String>,

    /// The worker lease: a worker that sends no heartbeat for this long is dropped. Seconds or
    /// a duration, at least 2s. [default: 30s]
    #[arg(
        long,
        env = "RUNTIME_WORKER_LEASE_TTL",
        value_name = "DURATION",
        global = true
    )]
    pub(crate) worker_lease_ttl: Option<String>,

    /// This process's replica id, recorded as the owner of the session leases it holds when
    /// several runtime processes share one PostgreSQL database. Must differ between processes
    /// running at once. [default: `local` on SQLite, else the host name and 8 random hex digits]
    #[arg(long, env = "RUNTIME_REPLICA_ID", value_name = "ID", global = true)]
    pub(crate) replica_id: Option<String>,

    /// The session lease: a session whose driving process renews nothing for this long is
    /// taken over by another process on the same database (renewed every third of it). Seconds
    /// or a duration, at least 300ms, or `off`. [default: 10s on PostgreSQL, off on SQLite]
    #[arg(
        long,
        env = "RUNTIME_SESSION_LEASE_TTL",
        value_name = "DURATION",
        global = true
    )]
    pub(crate) session_lease_ttl: Option<String>,

    /// Refuse tool workers that advertise a handler without a `descriptor_hash` (the pin of
    /// the Tool document, `phrony tools pin`). A non-empty hash that matches no pin of a
    /// published agent version is refused either way. [default: false: an empty hash, the
    /// published Python SDK's default, registers unpinned]
    #[arg(
        long,
        env = "RUNTIME_REQUIRE_DESCRIPTOR_PINS",
        value_name = "BOOL",
        value_parser = clap::builder::BoolishValueParser::new(),
        action = clap::ArgAction::Set,
        default_value = "false",
        global = true
    )]
    pub(crate) require_descriptor_pins: bool,

    /// Tool integrity allowlist (YAML): which workers may serve which agent's tool calls.
    /// [default: none, every registered worker may serve every call]
    #[arg(
        long,
        env = "RUNTIME_TOOL_ALLOWLIST",
        value_name = "FILE",
        global = true
    )]
    pub(crate) tool_allowlist: Option<std::ffi::OsString>,

    /// The largest tool-call arguments (bytes of JSON) the runtime sends to a worker; a larger
    /// call is a tool error for the model. [default: 1048576 (1 MiB)]
    #[arg(
        long,
        env = "RUNTIME_MAX_TOOL_ARGS_BYTES",
        value_name = "BYTES",
        global = true
    )]
    pub(crate) max_tool_args_bytes: Option<String>,

    /// The most tool calls one model response may request; each call beyond it is a tool
    /// error for the model. [default: 64]
    #[arg(
        long,
        env = "RUNTIME_MAX_TOOL_CALLS_PER_TURN",
        value_name = "COUNT",
        global = true
    )]
    pub(crate) max_tool_calls_per_turn: Option<String>,

    /// After a restart, how long a tool call that was in flight waits for its worker to
    /// reconnect and report before it is handled as indeterminate. Seconds or a duration.
    /// [default: 30s]
    #[arg(
        long,
        env = "RUNTIME_RECOVERY_GRACE",
        value_name = "DURATION",
        global = true
    )]
    pub(crate) recovery_grace: Option<String>,

    /// The most user messages that may wait in one conversation (recorded, their turn not
    /// started); one more is refused with RESOURCE_EXHAUSTED. [default: 32]
    #[arg(
        long,
        env = "RUNTIME_MAX_QUEUED_USER_MESSAGES",
        value_name = "COUNT",
        global = true
    )]
    pub(crate) max_queued_user_messages: Option<String>,

    /// The most live sessions (created, not yet ended) one agent may have; one more is refused
    /// with RESOURCE_EXHAUSTED. A whole number, or `unlimited`. [default: 10000]
    #[arg(
        long,
        env = "RUNTIME_MAX_SESSIONS_PER_AGENT",
        value_name = "COUNT",
        global = true
    )]
    pub(crate) max_sessions_per_agent: Option<String>,

    /// How long a SQLite write waits for the database's write lock (held by another process)
    /// before it counts as a database outage: the session waits, health turns NOT_SERVING.
    /// Seconds or a duration. [default: 10s]
    #[arg(
        long,
        env = "RUNTIME_SQLITE_BUSY_TIMEOUT",
        value_name = "DURATION",
        global = true
    )]
    pub(crate) sqlite_busy_timeout: Option<String>,

    /// The free space (bytes) the SQLite database's filesystem must keep: below it, writes are
    /// refused as a database outage (health NOT_SERVING, sessions wait) before anything is
    /// written, until space is freed. `0` keeps no reserve. [default: 33554432 (32 MiB)]
    #[arg(
        long,
        env = "RUNTIME_SQLITE_MIN_FREE_BYTES",
        value_name = "BYTES",
        global = true
    )]
    pub(crate) sqlite_min_free_bytes: Option<String>,

    /// The most database connections the daemon's main pool opens (PostgreSQL: plus a quarter
    /// of it, at least 2, for history lookups; SQLite: also the most read connections). Size it
    /// against the server's `max_connections` times the number of replicas. [default: 10]
    #[arg(
        long,
        env = "RUNTIME_DATABASE_MAX_CONNECTIONS",
        value_name = "COUNT",
        global = true
    )]
    pub(crate) database_max_connections: Option<String>,

    /// How long `serve` waits at start-up for a PostgreSQL database it cannot reach (connection
    /// refused, server starting or shutting down, too many connections), retrying with backoff
    /// while health answers NOT_SERVING, before it gives up and exits 1. A SQLite file that
    /// cannot be opened is a configuration error and fails at once. Seconds or a duration;
    /// `0` does not wait. [default: 5m]
    #[arg(
        long,
        env = "RUNTIME_DATABASE_START_TIMEOUT",
        value_name = "DURATION",
        global = true
    )]
    pub(crate) database_start_timeout: Option<String>,

    /// TLS certificate chain (PEM) of the gRPC listener; with RUNTIME_TLS_KEY it turns TLS on.
    #[arg(long, env = "RUNTIME_TLS_CERT", value_name = "FILE", global = true)]
    pub(crate) tls_cert: Option<std::ffi::OsString>,

    /// TLS private key (PEM: PKCS#8, PKCS#1 or SEC1) of the certificate in RUNTIME_TLS_CERT.
    #[arg(long, env = "RUNTIME_TLS_KEY", value_name = "FILE", global = true)]
    pub(crate) tls_key: Option<std::ffi::OsString>,

    /// CA certificates (PEM) for mutual TLS: when set, every client must present a
    /// certificate signed by one of them.
    #[arg(
        long,
        env = "RUNTIME_TLS_CLIENT_CA",
        value_name = "FILE",
        global = true
    )]
    pub(crate) tls_client_ca: Option<std::ffi::OsString>,

    /// Mutual TLS: YAML mapping each client certificate's subject CN to roles, routes and tools.
    #[arg(
        long,
        env = "RUNTIME_TLS_CLIENT_ROLES",
        value_name = "FILE",
        global = true
    )]
    pub(crate) tls_client_roles: Option<std::ffi::OsString>,

    /// OIDC: the exact issuer (`iss`) of accepted bearer JWTs.
    #[arg(long, env = "RUNTIME_OIDC_ISSUER", value_name = "URL", global = true)]
    pub(crate) oidc_issuer: Option<String>,

    /// OIDC: the audience (`aud`) accepted JWTs must carry.
    #[arg(
        long,
        env = "RUNTIME_OIDC_AUDIENCE",
        value_name = "AUDIENCE",
        global = true
    )]
    pub(crate) oidc_audience: Option<String>,

    /// OIDC: the issuer's JWKS, an http(s):// URL or a file path.
    #[arg(
        long,
        env = "RUNTIME_OIDC_JWKS",
        value_name = "URL|FILE",
        global = true
    )]
    pub(crate) oidc_jwks: Option<String>,

    /// OIDC: the claim holding the roles; a dotted path descends into objects
    /// (`realm_access.roles`). [default: roles]
    #[arg(
        long,
        env = "RUNTIME_OIDC_ROLES_CLAIM",
        value_name = "CLAIM",
        global = true
    )]
    pub(crate) oidc_roles_claim: Option<String>,

    /// OIDC: the shortest time between two JWKS reloads caused by an unknown key id: whole
    /// seconds or a duration. [default: 60s]
    #[arg(
        long,
        env = "RUNTIME_OIDC_JWKS_REFRESH",
        value_name = "DURATION",
        global = true
    )]
    pub(crate) oidc_jwks_refresh: Option<String>,
}

/// `RUNTIME_LOG_FORMAT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The environment the defaults are derived from (injected for tests).
#[derive(Debug, Clone, Default)]
pub struct Env {
    pub(crate) xdg_data_home: Option<PathBuf>,
    pub(crate) home: Option<PathBuf>,
}

impl Env {
    /// `XDG_DATA_HOME` and `HOME` from the process environment (empty values are unset).
    #[must_use]
    pub fn from_process() -> Self {
        let var = |name| {
            std::env::var_os(name)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        Self {
            xdg_data_home: var("XDG_DATA_HOME"),
            home: var("HOME"),
        }
    }

    /// `$XDG_DATA_HOME/phrony` (absolute only, per the XDG spec), else
    /// `~/.local/share/phrony`; `None` when neither can be determined.
    pub(crate) fn data_dir(&self) -> Option<PathBuf> {
        if let Some(xdg) = self.xdg_data_home.as_ref().filter(|p| p.is_absolute()) {
            return Some(xdg.join("phrony"));
        }
        self.home
            .as_ref()
            .map(|h| h.join(".local").join("share").join("phrony"))
    }
}

/// The providers' settings (`OPENAI_BASE_URL`, `ANTHROPIC_BASE_URL`,
/// `RUNTIME_ENABLE_STUB_PROVIDER`) from the process environment: the daemon reads them here, the
/// providers only take the values.
#[must_use]
pub fn provider_env() -> phrony_providers::ProviderEnv {
    phrony_providers::ProviderEnv::from_lookup(|name| std::env::var(name).ok())
}

/// Where the database is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Database {
    /// The URL given to the ledger.
    pub(crate) url: String,
    /// The SQLite file, when the database is one.
    pub(crate) sqlite_file: Option<PathBuf>,
}

impl Settings {
    fn configured_url(&self) -> Option<&str> {
        self.database_url
            .as_deref()
            .map(str::trim)
            .filter(|u| !u.is_empty())
    }

    /// The configured database, or the embedded default.
    pub(crate) fn database(&self, env: &Env) -> Database {
        match self.configured_url() {
            Some(url) => Database {
                url: url.to_owned(),
                sqlite_file: sqlite_file(url),
            },
            None => {
                let file = env
                    .data_dir()
                    .map_or_else(|| PathBuf::from("phrony.db"), |d| d.join("phrony.db"));
                Database {
                    url: sqlite_url(&file),
                    sqlite_file: Some(file),
                }
            }
        }
    }

    /// The ledger's connection options: `RUNTIME_SQLITE_BUSY_TIMEOUT` (default 10 s); the
    /// write probe's busy timeout is the smaller of 1 s and that; `RUNTIME_SQLITE_MIN_FREE_BYTES`
    /// (default 32 MiB, `0` for none); `RUNTIME_DATABASE_MAX_CONNECTIONS` (default 10).
    pub(crate) fn ledger_options(&self) -> anyhow::Result<phrony_ledger::LedgerOptions> {
        let defaults = phrony_ledger::LedgerOptions::default();
        let busy = crate::workers::duration(
            "RUNTIME_SQLITE_BUSY_TIMEOUT",
            self.sqlite_busy_timeout.as_deref(),
            defaults.sqlite_busy_timeout,
        )?;
        let min_free = match self.sqlite_min_free_bytes.as_deref().map(str::trim) {
            None | Some("") => defaults.sqlite_min_free_bytes,
            Some(text) => text.parse::<u64>().map_err(|_| {
                anyhow::anyhow!(
                    "invalid RUNTIME_SQLITE_MIN_FREE_BYTES {text:?}: expected a whole number of \
                     bytes (0 keeps no reserve)"
                )
            })?,
        };
        let max_connections = match self.database_max_connections.as_deref().map(str::trim) {
            None | Some("") => defaults.max_connections,
            Some(text) => match text.parse::<u32>() {
                Ok(n) if (1..=1000).contains(&n) => n,
                _ => anyhow::bail!(
                    "invalid RUNTIME_DATABASE_MAX_CONNECTIONS {text:?}: expected a whole number \
                     from 1 to 1000"
                ),
            },
        };
        Ok(phrony_ledger::LedgerOptions {
            max_connections,
            sqlite_busy_timeout: busy,
            probe_busy_timeout: defaults.probe_busy_timeout.min(busy),
            sqlite_min_free_bytes: min_free,
            ..defaults
        })
    }

    /// `RUNTIME_DATABASE_START_TIMEOUT` (default 5 minutes; `0`: do not wait).
    pub(crate) fn database_start_timeout(&self) -> anyhow::Result<std::time::Duration> {
        if self.database_start_timeout.as_deref().map(str::trim) == Some("0") {
            return Ok(std::time::Duration::ZERO);
        }
        crate::workers::duration(
            "RUNTIME_DATABASE_START_TIMEOUT",
            self.database_start_timeout.as_deref(),
            std::time::Duration::from_secs(300),
        )
    }

    /// Where a generated key is kept: beside the SQLite file, else in the data directory.
    pub(crate) fn key_file(&self, env: &Env, db: &Database) -> PathBuf {
        let dir = match db.sqlite_file.as_deref().and_then(Path::parent) {
            Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
            Some(_) => PathBuf::from("."),
            None => env.data_dir().unwrap_or_else(|| PathBuf::from(".")),
        };
        dir.join(SECRETS_KEY_FILE)
    }

    /// Where the audit key is kept: `RUNTIME_AUDIT_KEY_FILE`, else `audit.key` where a
    /// generated secrets key would be.
    pub(crate) fn audit_key_file(&self, env: &Env, db: &Database) -> PathBuf {
        match self
            .audit_key_file
            .as_ref()
            .filter(|p| !p.as_os_str().is_empty())
        {
            Some(path) => path.clone(),
            None => self.key_file(env, db).with_file_name(AUDIT_KEY_FILE),
        }
    }

    /// The secrets key given by `RUNTIME_SECRETS_ENCRYPTION_KEY` (or the flag), if any.
    pub(crate) fn configured_secrets_key(&self) -> anyhow::Result<Option<SecretsKey>> {
        let Some(text) = self.secrets_key.as_deref().filter(|k| !k.trim().is_empty()) else {
            return Ok(None);
        };
        let key = SecretsKey::parse(text).context("invalid RUNTIME_SECRETS_ENCRYPTION_KEY")?;
        tracing::info!(
            fingerprint = %key.fingerprint(),
            "secrets key: from RUNTIME_SECRETS_ENCRYPTION_KEY"
        );
        Ok(Some(key))
    }

    /// The key kept in [`Settings::key_file`], generated on first use.
    pub(crate) fn key_file_secrets_key(
        &self,
        env: &Env,
        db: &Database,
    ) -> anyhow::Result<SecretsKey> {
        let path = self.key_file(env, db);
        let (key, outcome) =
            SecretsKey::load_or_create(&path).context("cannot set up the secrets key")?;
        match outcome {
            KeyFileOutcome::Created => tracing::info!(
                fingerprint = %key.fingerprint(),
                "generated a new secrets key in {} (owner-only); back it up with the database, \
                 or set RUNTIME_SECRETS_ENCRYPTION_KEY",
                path.display()
            ),
            KeyFileOutcome::Loaded => tracing::info!(
                fingerprint = %key.fingerprint(),
                "secrets key: {}",
                path.display()
            ),
        }
        Ok(key)
    }
}

/// Characters that cannot appear literally in the path of a `sqlite://` URL.
const SQLITE_PATH: &AsciiSet = &CONTROLS.add(b'%').add(b'?').add(b'#');

/// `sqlite://` URL of a file path.
pub(crate) fn sqlite_url(file: &Path) -> String {
    format!(
        "sqlite://{}",
        utf8_percent_encode(&file.to_string_lossy(), SQLITE_PATH)
    )
}

/// The file of a `sqlite:` URL, read the way the SQLite driver reads it; `None` for other
/// schemes and in-memory databases.
pub(crate) fn sqlite_file(url: &str) -> Option<PathBuf> {
    let (scheme, _) = url.split_once(':')?;
    if !scheme.eq_ignore_ascii_case("sqlite") {
        return None;
    }
    let rest = &url[scheme.len() + 1..];
    let rest = rest.strip_prefix("//").unwrap_or(rest);
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    if path.is_empty() || path == ":memory:" || query.split('&').any(|p| p == "mode=memory") {
        return None;
    }
    let decoded = percent_decode_str(path).decode_utf8().ok()?;
    Some(PathBuf::from(decoded.as_ref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(url: Option<&str>) -> Settings {
        Settings {
            grpc_addr: "127.0.0.1:7777".into(),
            http_addr: None,
            webhooks_file: None,
            database_url: url.map(str::to_owned),
            log_format: LogFormat::Text,
            log_filter: None,
            secrets_key: None,
            auth: None,
            audit_key_file: None,
            allow_unverified_log: false,
            park_approval_waits: true,
            default_actor: "anonymous".into(),
            dispatch_queue_wait: None,
            dispatch_queue_capacity: None,
            tool_exec_timeout: None,
            worker_lease_ttl: None,
            replica_id: None,
            session_lease_ttl: None,
            require_descriptor_pins: false,
            tool_allowlist: None,
            max_tool_args_bytes: None,
            max_tool_calls_per_turn: None,
            recovery_grace: None,
            max_queued_user_messages: None,
            max_sessions_per_agent: None,
            sqlite_busy_timeout: None,
            sqlite_min_free_bytes: None,
            database_max_connections: None,
            database_start_timeout: None,
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            tls_client_roles: None,
            oidc_issuer: None,
            oidc_audience: None,
            oidc_jwks: None,
            oidc_roles_claim: None,
            oidc_jwks_refresh: None,
        }
    }

    fn env(xdg: Option<&str>, home: Option<&str>) -> Env {
        Env {
            xdg_data_home: xdg.map(PathBuf::from),
            home: home.map(PathBuf::from),
        }
    }

    #[test]
    fn default_database_lives_in_the_data_dir() {
        let db = settings(None).database(&env(Some("/xdg"), Some("/home/u")));
        assert_eq!(db.url, "sqlite:///xdg/phrony/phrony.db");
        assert_eq!(
            db.sqlite_file.as_deref(),
            Some(Path::new("/xdg/phrony/phrony.db"))
        );

        let db = settings(None).database(&env(None, Some("/home/u")));
        assert_eq!(db.url, "sqlite:///home/u/.local/share/phrony/phrony.db");

        // A relative XDG_DATA_HOME is invalid per the spec and ignored.
        let db = settings(Some("  ")).database(&env(Some("rel"), Some("/home/u")));
        assert_eq!(db.url, "sqlite:///home/u/.local/share/phrony/phrony.db");

        let db = settings(None).database(&env(None, None));
        assert_eq!(db.url, "sqlite://phrony.db");
        assert_eq!(db.sqlite_file.as_deref(), Some(Path::new("phrony.db")));
    }

    #[test]
    fn awkward_paths_survive_the_url_round_trip() {
        let file = Path::new("/data/50% off?/#1/phrony.db");
        let url = sqlite_url(file);
        assert_eq!(url, "sqlite:///data/50%25 off%3F/%231/phrony.db");
        assert_eq!(sqlite_file(&url).as_deref(), Some(file));
    }

    #[test]
    fn sqlite_files_are_found_in_configured_urls() {
        let cases = [
            ("sqlite://./x.db", Some("./x.db")),
            ("sqlite:///abs/x.db?mode=rwc", Some("/abs/x.db")),
            ("sqlite:rel.db", Some("rel.db")),
            ("SQLITE://y.db", Some("y.db")),
            ("sqlite::memory:", None),
            ("sqlite://?mode=memory", None),
            ("postgres://u@h/db", None),
            ("nonsense", None),
        ];
        for (url, want) in cases {
            assert_eq!(sqlite_file(url).as_deref(), want.map(Path::new), "{url}");
        }
    }

    #[test]
    fn key_file_sits_next_to_sqlite_or_in_the_data_dir() {
        let e = env(None, Some("/home/u"));
        let s = settings(Some("sqlite:///srv/phrony/ledger.db"));
        assert_eq!(
            s.key_file(&e, &s.database(&e)),
            Path::new("/srv/phrony/secrets.key")
        );
        let s = settings(Some("sqlite://ledger.db"));
        assert_eq!(s.key_file(&e, &s.database(&e)), Path::new("./secrets.key"));
        let s = settings(Some("postgres://u@h/db"));
        assert_eq!(
            s.key_file(&e, &s.database(&e)),
            Path::new("/home/u/.local/share/phrony/secrets.key")
        );
        let s = settings(Some("postgres://u@h/db"));
        assert_eq!(
            s.key_file(&env(None, None), &s.database(&e)),
            Path::new("./secrets.key")
        );
    }

    #[test]
    fn a_configured_key_is_parsed_and_blank_means_unset() {
        let mut s = settings(None);
        assert!(s.configured_secrets_key().unwrap().is_none());
        s.secrets_key = Some(" ".into());
        assert!(s.configured_secrets_key().unwrap().is_none());
        s.secrets_key = Some("ab".repeat(32));
        let key = s.configured_secrets_key().unwrap().unwrap();
        assert_eq!(key.as_bytes(), &[0xab; 32]);
    }

    #[test]
    fn an_invalid_key_is_refused_with_the_variable_name() {
        let mut s = settings(None);
        s.secrets_key = Some("c2hvcnQ=".into());
        let err = s.configured_secrets_key().unwrap_err();
        let shown = format!("{err:#}");
        assert!(
            shown.starts_with("invalid RUNTIME_SECRETS_ENCRYPTION_KEY: must be 32 bytes"),
            "{shown}"
        );
        assert!(!shown.contains("c2hvcnQ"), "{shown}");
    }

    #[test]
    fn cli_defaults_to_serve_and_reads_flags() {
        let cli = Cli::try_parse_from(["phrony-runtime"]).unwrap();
        assert_eq!(cli.command, None);
        let cli = Cli::try_parse_from([
            "phrony-runtime",
            "migrate",
            "--database-url",
            "sqlite::memory:",
        ])
        .unwrap();
        assert_eq!(cli.command, Some(Command::Migrate));
        assert_eq!(
            cli.settings.database_url.as_deref(),
            Some("sqlite::memory:")
        );
        assert!(Cli::try_parse_from(["phrony-runtime", "--log-format", "xml"]).is_err());
    }

    #[test]
    fn the_sqlite_free_space_reserve_is_read_in_bytes_and_zero_keeps_none() {
        let defaults = phrony_ledger::LedgerOptions::default();
        let read = |value: Option<&str>| {
            let mut s = settings(None);
            s.sqlite_min_free_bytes = value.map(str::to_owned);
            s.ledger_options().map(|o| o.sqlite_min_free_bytes)
        };
        assert_eq!(read(None).unwrap(), defaults.sqlite_min_free_bytes);
        assert_eq!(read(Some(" ")).unwrap(), defaults.sqlite_min_free_bytes);
        assert_eq!(read(Some("1048576")).unwrap(), 1_048_576);
        assert_eq!(read(Some("0")).unwrap(), 0);
        let error = read(Some("32MiB")).unwrap_err().to_string();
        assert!(
            error.contains("invalid RUNTIME_SQLITE_MIN_FREE_BYTES \"32MiB\""),
            "{error}"
        );
    }

    #[test]
    fn the_database_pool_size_is_a_bounded_whole_number() {
        let read = |value: Option<&str>| {
            let mut s = settings(None);
            s.database_max_connections = value.map(str::to_owned);
            s.ledger_options().map(|o| o.max_connections)
        };
        assert_eq!(
            read(None).unwrap(),
            phrony_ledger::LedgerOptions::default().max_connections
        );
        assert_eq!(read(Some("32")).unwrap(), 32);
        for bad in ["0", "1001", "ten", "-1"] {
            let error = read(Some(bad)).unwrap_err().to_string();
            assert!(
                error.contains(&format!("invalid RUNTIME_DATABASE_MAX_CONNECTIONS {bad:?}")),
                "{error}"
            );
        }
    }
}
