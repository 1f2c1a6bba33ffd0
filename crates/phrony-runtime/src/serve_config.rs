//! Server settings and the secrets-encryption key.
//!
//! The key encrypts the secrets a client resolves for a session (`RunSessionRequest.resolved_secrets`)
//! while they are stored. It comes from `RUNTIME_SECRETS_ENCRYPTION_KEY` ([`SecretsKey::parse`]) or,
//! for zero set-up, from an owner-only key file that is generated on first start and reused
//! afterwards ([`SecretsKey::load_or_create`]).

use std::fmt;
use std::fs;
use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
use phrony_dispatch::{Allowlist, Router, RouterConfig};
use phrony_engine::ProviderFactory;
use rand::TryRngCore as _;
use sha2::{Digest as _, Sha256};

/// Settings of [`crate::serve`] other than the listener and the ledger.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Encrypts session secrets at rest.
    pub secrets_key: SecretsKey,
    /// Recorded as the actor of a change whose request names none (neither the request's
    /// `actor` field nor the `phrony-actor` metadata header).
    pub default_actor: String,
    /// How often the health monitor pings the database.
    pub health_check_interval: Duration,
    /// How long a ping may take before the database counts as unreachable.
    pub health_check_timeout: Duration,
    /// After the shutdown signal, how long in-flight calls may take before they are cut off.
    /// Tool calls already sent to workers get the first half of it to finish; then the
    /// workers' `Work` streams are closed cleanly.
    pub shutdown_grace: Duration,
    /// A router built by the caller for tool workers to register with over `Work`. `None`
    /// (the normal case) makes [`crate::serve`] build one from [`Self::router_config`] and
    /// [`Self::tool_allowlist`], with the session engine's hooks installed (late results are
    /// recorded before they are acknowledged; reconnecting workers learn which of their calls
    /// are already recorded). A router passed here is used as is: install
    /// `phrony_engine::RouterHooks` on it yourself if you need them. `serve` shuts the router
    /// down when it stops, so a router serves one run of the server.
    pub router: Option<Router>,
    /// Settings of the router `serve` builds when [`Self::router`] is `None` (worker lease,
    /// queue bounds).
    pub router_config: RouterConfig,
    /// The integrity allowlist of the router `serve` builds (`RUNTIME_TOOL_ALLOWLIST`);
    /// `None` lets any registered worker serve a call.
    pub tool_allowlist: Option<Allowlist>,
    /// Builds each session's model provider. `None` uses a
    /// `phrony_engine::DefaultProviderFactory` over [`crate::config::provider_env`]
    /// (`OPENAI_BASE_URL`, `ANTHROPIC_BASE_URL`, `RUNTIME_ENABLE_STUB_PROVIDER` from the process
    /// environment); tests
    /// inject scripted providers here.
    pub providers: Option<Arc<dyn ProviderFactory>>,
    /// How long a tool call may wait for a free worker slot (`RUNTIME_DISPATCH_QUEUE_WAIT`);
    /// it does not bound the call's execution. Passed as `DispatchCall::queue_wait` by the
    /// session engine.
    pub dispatch_queue_wait: Duration,
    /// How long a worker may run a tool call whose binding sets no `timeout`
    /// (`RUNTIME_TOOL_EXEC_TIMEOUT`); passed as `DispatchCall::exec_timeout` by the session
    /// engine.
    pub tool_exec_timeout: Duration,
    /// The largest tool-call arguments (bytes of JSON) sent to a worker
    /// (`RUNTIME_MAX_TOOL_ARGS_BYTES`); see `phrony_engine::EngineConfig::max_tool_args_bytes`.
    pub max_tool_args_bytes: usize,
    /// The most tool calls one model response may request (`RUNTIME_MAX_TOOL_CALLS_PER_TURN`);
    /// see `phrony_engine::EngineConfig::max_tool_calls_per_turn`.
    pub max_tool_calls_per_turn: usize,
    /// After a restart, how long an in-flight call waits for its worker before it is judged
    /// (`RUNTIME_RECOVERY_GRACE`); see `phrony_engine::EngineConfig::recovery_grace`.
    pub recovery_grace: Duration,
    /// The most user messages that may wait in one conversation
    /// (`RUNTIME_MAX_QUEUED_USER_MESSAGES`); see
    /// `phrony_engine::EngineConfig::max_queued_user_messages`.
    pub max_queued_user_messages: usize,
    /// The most live sessions of one agent (`RUNTIME_MAX_SESSIONS_PER_AGENT`; `None`:
    /// unlimited); see `phrony_engine::EngineConfig::max_sessions_per_agent`.
    pub max_sessions_per_agent: Option<u64>,
    /// The most `WatchApprovals` streams open at once; see
    /// `phrony_engine::EngineConfig::max_approval_watchers`.
    pub max_approval_watchers: usize,
    /// Whether task sessions waiting only for approvals are parked (`RUNTIME_PARK_APPROVAL_WAITS`);
    /// see `phrony_engine::EngineConfig::park_approval_waits`.
    pub park_approval_waits: bool,
    /// Session leases for several replicas on one database (`RUNTIME_SESSION_LEASE_TTL`, the
    /// daemon's default 10 s); `None` (the default here) runs without; see
    /// `phrony_engine::EngineConfig::session_lease_ttl`.
    pub session_lease_ttl: Option<Duration>,
    /// Changes buffered per `WatchApprovals` stream; see
    /// `phrony_grpc::RuntimeService::with_watch_buffer`.
    pub approval_watch_buffer: usize,
    /// How long a `WatchApprovals` client may leave its buffer full before it is ended
    /// (`RESOURCE_EXHAUSTED`).
    pub approval_watch_grace: Duration,
    /// Who may call (`RUNTIME_AUTH`): `local` admits everyone unverified (loopback only;
    /// [`crate::serve`] refuses it on any other address), `required` needs a credential on
    /// every RPC of the Runtime service.
    pub auth: crate::auth::AuthMode,
    /// TLS on the listener (`RUNTIME_TLS_CERT`, `RUNTIME_TLS_KEY`, and `RUNTIME_TLS_CLIENT_CA`
    /// for mutual TLS); `None` serves plaintext.
    pub tls: Option<tonic::transport::ServerTlsConfig>,
    /// The OIDC authenticator (`RUNTIME_OIDC_*`), for the edge's composite authenticator.
    pub oidc: Option<Arc<crate::oidc::OidcAuthenticator>>,
    /// The mutual-TLS subject mapping (`RUNTIME_TLS_CLIENT_ROLES`), for the edge's composite
    /// authenticator.
    pub mtls: Option<Arc<crate::tls::MtlsAuthenticator>>,
    /// The HTTP listener's readiness handle ([`crate::http::HttpServer::readiness`]), when
    /// `RUNTIME_HTTP_ADDR` is set: [`crate::serve`] marks it ready after start-up recovery.
    pub http: Option<crate::http::Readiness>,
    /// The webhooks (`RUNTIME_WEBHOOKS_FILE`): [`crate::serve`] gives the ledger their routes
    /// (outbox rows in the notifying events' transactions) and runs the sender; `None` is off.
    pub webhooks: Option<Arc<crate::webhooks::WebhooksConfig>>,
}

impl ServeConfig {
    /// Settings with defaults: `local` auth, actor `anonymous`, a health check every 3 s (2 s timeout), a
    /// 10 s shutdown grace period, a default router, a 10 s dispatch queue wait, a 60 s
    /// tool execution timeout, the engine's default bounds on tool calls (1 MiB of
    /// arguments, 64 calls per model response), a 30 s recovery grace, at most 32 waiting user
    /// messages per session, 10,000 live sessions per agent, 256 approval watchers
    /// buffering 256 changes each (ended after 10 s not reading), plaintext and no OIDC or mTLS
    /// mapping.
    #[must_use]
    pub fn new(secrets_key: SecretsKey) -> Self {
        Self {
            secrets_key,
            default_actor: "anonymous".to_owned(),
            health_check_interval: Duration::from_secs(3),
            health_check_timeout: Duration::from_secs(2),
            shutdown_grace: Duration::from_secs(10),
            router: None,
            router_config: RouterConfig::default(),
            tool_allowlist: None,
            providers: None,
            dispatch_queue_wait: Duration::from_secs(10),
            tool_exec_timeout: Duration::from_secs(60),
            max_tool_args_bytes: phrony_engine::DEFAULT_MAX_TOOL_ARGS_BYTES,
            max_tool_calls_per_turn: phrony_engine::DEFAULT_MAX_TOOL_CALLS_PER_TURN,
            recovery_grace: Duration::from_secs(30),
            max_queued_user_messages: phrony_engine::DEFAULT_MAX_QUEUED_USER_MESSAGES,
            max_sessions_per_agent: Some(phrony_engine::DEFAULT_MAX_SESSIONS_PER_AGENT),
            max_approval_watchers: phrony_engine::DEFAULT_MAX_APPROVAL_WATCHERS,
            park_approval_waits: true,
            session_lease_ttl: None,
            approval_watch_buffer: phrony_grpc::DEFAULT_WATCH_BUFFER,
            approval_watch_grace: phrony_grpc::DEFAULT_WATCH_GRACE,
            auth: crate::auth::AuthMode::Local,
            tls: None,
            oidc: None,
            mtls: None,
            http: None,
            webhooks: None,
        }
    }
}

/// The name of the generated key file.
pub const SECRETS_KEY_FILE: &str = "secrets.key";

/// A 32-byte AES-256 key for session secrets. `Debug` never shows the key.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretsKey([u8; SecretsKey::LEN]);

/// Why a secrets key could not be parsed, read or created. Messages never contain key material.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The text is not 32 bytes in one of the accepted encodings.
    #[error("must be 32 bytes encoded as hex (64 digits), base64 or unpadded base64 ({problem})")]
    Malformed {
        /// What is wrong, e.g. `decodes to 16 bytes`.
        problem: String,
    },
    /// The key file exists but does not hold a valid key.
    ///
    /// The cause is part of the message and not also a [`std::error::Error::source`] (here and
    /// in [`KeyError::Io`]), so that a report printing the chain names it once.
    #[error("key file {}: {error}", path.display())]
    BadFile {
        /// The key file.
        path: PathBuf,
        /// Why its content was refused.
        error: Box<KeyError>,
    },
    /// Reading or writing the key file failed.
    #[error("{action} {}: {error}", path.display())]
    Io {
        /// What was being done, e.g. `cannot create key file`.
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        error: io::Error,
    },
    /// The operating system's random number generator failed.
    #[error("cannot generate a secrets key: {message}")]
    Random {
        /// The generator's error.
        message: String,
    },
}

/// Where [`SecretsKey::load_or_create`] got the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyFileOutcome {
    /// The file existed and was read.
    Loaded,
    /// The file did not exist; a new random key was written to it.
    Created,
}

impl SecretsKey {
    /// Key length in bytes.
    pub const LEN: usize = 32;

    /// Wraps raw key bytes.
    #[must_use]
    pub fn from_bytes(bytes: [u8; Self::LEN]) -> Self {
        Self(bytes)
    }

    /// The raw key bytes.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8; Self::LEN] {
        &self.0
    }

    /// Parses a key given as 64 hex digits, standard base64 or unpadded standard base64
    /// (surrounding whitespace is ignored).
    ///
    /// # Errors
    /// [`KeyError::Malformed`] naming the problem (never the value).
    pub fn parse(text: &str) -> Result<Self, KeyError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(KeyError::Malformed {
                problem: "it is empty".to_owned(),
            });
        }
        let decoded = if text.len() == 2 * Self::LEN && text.bytes().all(|b| b.is_ascii_hexdigit())
        {
            hex::decode(text).ok()
        } else {
            STANDARD
                .decode(text)
                .or_else(|_| STANDARD_NO_PAD.decode(text))
                .ok()
        };
        let Some(bytes) = decoded else {
            return Err(KeyError::Malformed {
                problem: "it is neither hex nor base64".to_owned(),
            });
        };
        let bytes: [u8; Self::LEN] =
            bytes
                .as_slice()
                .try_into()
                .map_err(|_| KeyError::Malformed {
                    problem: format!("it decodes to {} bytes", bytes.len()),
                })?;
        Ok(Self(bytes))
    }

    /// A new random key from the operating system's generator.
    ///
    /// # Errors
    /// [`KeyError::Random`] when the generator fails.
    pub fn generate() -> Result<Self, KeyError> {
        let mut bytes = [0_u8; Self::LEN];
        rand::rngs::OsRng
            .try_fill_bytes(&mut bytes)
            .map_err(|e| KeyError::Random {
                message: e.to_string(),
            })?;
        Ok(Self(bytes))
    }

    /// A short, non-secret identifier of the key (16 hex digits of a domain-separated SHA-256),
    /// to check in logs that two runs use the same key.
    #[must_use]
    pub fn fingerprint(&self) -> String {
        let digest = Sha256::new()
            .chain_update(b"phrony secrets key fingerprint\0")
            .chain_update(self.0)
            .finalize();
        hex::encode(&digest[..8])
    }

    /// Reads the key stored at `path`, or, when there is no such file, generates one and stores
    /// it there as hex, readable and writable by the owner only (mode 0600 on Unix). Creation
    /// is atomic: two processes starting at once end up with the same key. Missing parent
    /// directories are created (mode 0700 on Unix).
    ///
    /// # Errors
    /// [`KeyError::BadFile`] for an existing file that does not hold a key; [`KeyError::Io`];
    /// [`KeyError::Random`].
    pub fn load_or_create(path: &Path) -> Result<(Self, KeyFileOutcome), KeyError> {
        Self::load_or_create_named(path, "secrets key file")
    }

    /// [`SecretsKey::load_or_create`] for a key file of the same format that holds another key
    /// (`noun` names it in the warning about its permissions, e.g. `"audit key file"`).
    ///
    /// # Errors
    /// As [`SecretsKey::load_or_create`].
    pub fn load_or_create_named(
        path: &Path,
        noun: &'static str,
    ) -> Result<(Self, KeyFileOutcome), KeyError> {
        match Self::read(path, noun) {
            Ok(key) => return Ok((key, KeyFileOutcome::Loaded)),
            Err(KeyError::Io { error, .. }) if error.kind() == io::ErrorKind::NotFound => {}
            Err(other) => return Err(other),
        }
        let key = Self::generate()?;
        if key.write_new(path)? {
            Ok((key, KeyFileOutcome::Created))
        } else {
            // Another process created the file first: use its key.
            Ok((Self::read(path, noun)?, KeyFileOutcome::Loaded))
        }
    }

    fn read(path: &Path, noun: &'static str) -> Result<Self, KeyError> {
        let text = fs::read_to_string(path).map_err(|error| KeyError::Io {
            action: "cannot read key file",
            path: path.to_path_buf(),
            error,
        })?;
        warn_if_shared(path, noun);
        Self::parse(&text).map_err(|e| KeyError::BadFile {
            path: path.to_path_buf(),
            error: Box::new(e),
        })
    }

    /// Writes the key to a new file at `path`. Returns `false` (and writes nothing) when the
    /// file already exists.
    fn write_new(&self, path: &Path) -> Result<bool, KeyError> {
        let io_err = |action: &'static str, path: &Path| {
            let path = path.to_path_buf();
            move |error| KeyError::Io {
                action,
                path,
                error,
            }
        };
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        create_private_dir(&dir).map_err(io_err("cannot create directory", &dir))?;

        // Write a temporary file completely, then link it into place: the final name never
        // refers to a partly written key, and linking fails if the name already exists.
        let file_name = path.file_name().map_or_else(
            || SECRETS_KEY_FILE.into(),
            |n| n.to_string_lossy().into_owned(),
        );
        let tmp = dir.join(format!(
            ".{file_name}.{}-{:016x}.tmp",
            std::process::id(),
            rand::random::<u64>()
        ));
        let written = (|| {
            let mut file = private_file(&tmp)?;
            file.write_all(format!("{}\n", hex::encode(self.0)).as_bytes())?;
            file.sync_all()
        })();
        if let Err(error) = written {
            let _ = fs::remove_file(&tmp);
            return Err(KeyError::Io {
                action: "cannot create key file",
                path: tmp,
                error,
            });
        }
        let linked = fs::hard_link(&tmp, path);
        let _ = fs::remove_file(&tmp);
        match linked {
            Ok(()) => {
                sync_dir(&dir);
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
            Err(error) => Err(KeyError::Io {
                action: "cannot create key file",
                path: path.to_path_buf(),
                error,
            }),
        }
    }
}

impl fmt::Debug for SecretsKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretsKey(fingerprint {})", self.fingerprint())
    }
}

#[cfg(unix)]
fn private_file(path: &Path) -> io::Result<fs::File> {
    use std::os::unix::fs::OpenOptionsExt as _;
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
}

#[cfg(not(unix))]
fn private_file(path: &Path) -> io::Result<fs::File> {
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
}

#[cfg(unix)]
fn create_private_dir(dir: &Path) -> io::Result<()> {
    use std::os::unix::fs::DirBuilderExt as _;
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
}

#[cfg(not(unix))]
fn create_private_dir(dir: &Path) -> io::Result<()> {
    fs::create_dir_all(dir)
}

/// Makes the new directory entry durable (best effort; not possible on every platform).
fn sync_dir(dir: &Path) {
    if let Ok(d) = fs::File::open(dir) {
        let _ = d.sync_all();
    }
}

#[cfg(unix)]
fn warn_if_shared(path: &Path, noun: &str) {
    use std::os::unix::fs::PermissionsExt as _;
    if let Ok(meta) = fs::metadata(path) {
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            tracing::warn!(
                path = %path.display(),
                mode = format!("{mode:o}"),
                "the {noun} is readable by other users; run chmod 600 on it"
            );
        }
    }
}

#[cfg(not(unix))]
fn warn_if_shared(_path: &Path, _noun: &str) {}

#[cfg(test)]
mod tests {
    use super::*;

    const HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    fn sample() -> [u8; 32] {
        std::array::from_fn(|i| u8::try_from(i).unwrap())
    }

    /// A report that prints the error's chain (`{:#}`, the daemon's) names the OS error once:
    /// it was printed by the message and again as the source.
    #[test]
    fn a_key_file_error_names_its_cause_once_in_a_report() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("a-file");
        fs::write(&blocker, "x").unwrap();
        for path in [blocker.join("key"), blocker.join("sub").join("key")] {
            let error = SecretsKey::load_or_create(&path).unwrap_err();
            let report = format!("{:#}", anyhow::Error::from(error).context("the audit key"));
            assert_eq!(report.matches("(os error").count(), 1, "{report}");
        }
        let bad = dir.path().join("bad.key");
        fs::write(&bad, "not a key").unwrap();
        let report = format!(
            "{:#}",
            anyhow::Error::from(SecretsKey::load_or_create(&bad).unwrap_err())
        );
        assert_eq!(report.matches("must be 32 bytes").count(), 1, "{report}");
    }

    #[test]
    fn parses_hex_base64_and_unpadded_base64() {
        let want = SecretsKey::from_bytes(sample());
        assert_eq!(SecretsKey::parse(HEX).unwrap(), want);
        assert_eq!(SecretsKey::parse(&HEX.to_uppercase()).unwrap(), want);
        let padded = STANDARD.encode(sample());
        assert!(padded.ends_with('='));
        assert_eq!(SecretsKey::parse(&padded).unwrap(), want);
        assert_eq!(
            SecretsKey::parse(&STANDARD_NO_PAD.encode(sample())).unwrap(),
            want
        );
        assert_eq!(SecretsKey::parse(&format!("  {HEX}\n")).unwrap(), want);
    }

    #[test]
    fn refuses_wrong_lengths_and_encodings_without_echoing_the_value() {
        let short = STANDARD.encode([7_u8; 16]);
        let err = SecretsKey::parse(&short).unwrap_err().to_string();
        assert!(err.contains("decodes to 16 bytes"), "{err}");
        assert!(!err.contains(&short), "{err}");

        let err = SecretsKey::parse("not a key!").unwrap_err().to_string();
        assert!(err.contains("neither hex nor base64"), "{err}");
        assert!(err.starts_with("must be 32 bytes"), "{err}");

        // 63 hex digits: not hex-shaped, and not base64 of 32 bytes either.
        assert!(SecretsKey::parse(&HEX[1..]).is_err());
        assert!(
            SecretsKey::parse("")
                .unwrap_err()
                .to_string()
                .contains("empty")
        );
    }

    #[test]
    fn debug_hides_the_key() {
        let key = SecretsKey::from_bytes(sample());
        let shown = format!("{key:?}");
        assert!(!shown.contains(HEX), "{shown}");
        assert!(shown.contains(&key.fingerprint()));
        assert_eq!(key.fingerprint().len(), 16);
        assert_ne!(
            key.fingerprint(),
            SecretsKey::from_bytes([0; 32]).fingerprint()
        );
    }

    #[test]
    fn generated_keys_differ() {
        assert_ne!(
            SecretsKey::generate().unwrap(),
            SecretsKey::generate().unwrap()
        );
    }

    #[test]
    fn key_file_is_created_private_then_reused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data").join(SECRETS_KEY_FILE);
        let (first, outcome) = SecretsKey::load_or_create(&path).unwrap();
        assert_eq!(outcome, KeyFileOutcome::Created);
        let text = fs::read_to_string(&path).unwrap();
        assert_eq!(text, format!("{}\n", hex::encode(first.as_bytes())));
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600);
            let dir_mode = fs::metadata(path.parent().unwrap())
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(dir_mode & 0o077, 0);
        }
        let (again, outcome) = SecretsKey::load_or_create(&path).unwrap();
        assert_eq!(outcome, KeyFileOutcome::Loaded);
        assert_eq!(again, first);
        // No temporary files are left behind.
        let entries: Vec<_> = fs::read_dir(path.parent().unwrap()).unwrap().collect();
        assert_eq!(entries.len(), 1);
    }

    #[test]
    fn a_corrupt_key_file_is_an_error_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SECRETS_KEY_FILE);
        fs::write(&path, "garbage").unwrap();
        let err = SecretsKey::load_or_create(&path).unwrap_err().to_string();
        assert!(err.contains(&path.display().to_string()), "{err}");
        assert!(err.contains("neither hex nor base64"), "{err}");
        // The broken file is left for the operator to inspect, not overwritten.
        assert_eq!(fs::read_to_string(&path).unwrap(), "garbage");
    }

    #[test]
    fn concurrent_creators_agree_on_one_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SECRETS_KEY_FILE);
        let keys: Vec<SecretsKey> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| SecretsKey::load_or_create(&path).unwrap().0))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(keys.windows(2).all(|w| w[0] == w[1]));
    }
}
