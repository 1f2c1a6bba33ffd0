//! The real `phrony-runtime` daemon for end-to-end tests, on a free port, against SQLite or a
//! fresh PostgreSQL database, driven by the real `phrony` CLI.
//!
//! ```no_run
//! use tests::daemon::{Backend, Daemon};
//! let Some(daemon) = Daemon::start(Backend::Postgres) else { return }; // skipped on request
//! let out = daemon.phrony().args(["agents", "ls"]).output().unwrap();
//! assert!(out.status.success());
//! ```
//!
//! - The binaries are built once per test process with `cargo build --workspace --bins` (as
//!   `.ci/test` builds them) into the target directory the tests run from, so they are never
//!   stale.
//! - PostgreSQL: a [`PgDatabase`] `phrony_test_<uuid>` is created on the server at
//!   `PHRONY_TEST_POSTGRES_URL` (default the local one) and dropped when the daemon is dropped.
//!   If PostgreSQL does not answer the test fails, unless `PHRONY_TEST_SKIP_POSTGRES=1`, in which
//!   case [`Daemon::start`] returns `None`.
//! - Dropping a [`Daemon`] stops it with SIGTERM (a clean stop must exit 0) and removes its files.

use std::fs::File;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use phrony_client::{Client, ClientTls, Health};
use phrony_test_support::postgres::PgDatabase;
use phrony_test_support::private_postgres::PrivatePostgres;

/// How long a daemon may take to answer `SERVING`.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a daemon may take to stop after SIGTERM.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);

/// The storage a daemon runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// An SQLite file in the daemon's temporary directory.
    Sqlite,
    /// A fresh database on the local PostgreSQL server.
    Postgres,
    /// A database on a private PostgreSQL cluster of the daemon's own (see
    /// [`PrivatePostgres`]), which a test may stop and start again under the running daemon
    /// ([`Daemon::private_postgres`]).
    PrivatePostgres,
}

/// The built `phrony` and `phrony-runtime` binaries.
#[derive(Debug)]
pub struct Binaries {
    /// The `phrony` CLI.
    pub phrony: PathBuf,
    /// The `phrony-runtime` daemon.
    pub runtime: PathBuf,
}

/// Builds (once per process) and returns the binaries.
///
/// # Panics
/// When the build fails; its output is in the message.
pub fn binaries() -> &'static Binaries {
    static BUILT: OnceLock<Binaries> = OnceLock::new();
    BUILT.get_or_init(|| {
        let (target_dir, profile_dir) = target_dir();
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut build = Command::new(cargo);
        build
            .current_dir(crate::workspace_root())
            .env("CARGO_TARGET_DIR", &target_dir)
            // The whole workspace's binaries, as `.ci/test` builds them before the tests: one
            // feature resolution for both, so this build finds everything fresh (`-p runtime
            // -p cli` resolves other features and rebuilt dozens of dependencies, ≈ 80 s of CI).
            .args(["build", "--quiet", "--workspace", "--bins"]);
        match profile_dir.as_str() {
            "debug" => {}
            "release" => {
                build.arg("--release");
            }
            other => {
                build.args(["--profile", other]);
            }
        }
        let output = build
            .output()
            .unwrap_or_else(|e| panic!("cannot run cargo: {e}"));
        assert!(
            output.status.success(),
            "cargo build --workspace --bins failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let dir = target_dir.join(&profile_dir);
        let exe = |name: &str| dir.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
        Binaries {
            phrony: exe("phrony"),
            runtime: exe("phrony-runtime"),
        }
    })
}

/// The target directory and profile directory (`debug`, `release`…) of the running test,
/// from its own path: `<target>/<profile>/deps/<test>-<hash>`, or `<target>/<profile>/<bin>`
/// for a binary of this package (the soak).
fn target_dir() -> (PathBuf, String) {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("current_exe: {e}"));
    let parent = exe
        .parent()
        .unwrap_or_else(|| panic!("unexpected test executable path {}", exe.display()));
    let profile = if parent.file_name().is_some_and(|n| n == "deps") {
        parent.parent()
    } else {
        Some(parent)
    }
    .unwrap_or_else(|| panic!("unexpected test executable path {}", exe.display()));
    let target = profile
        .parent()
        .map_or_else(|| crate::workspace_root().join("target"), Path::to_path_buf);
    let profile_name = profile
        .file_name()
        .map_or_else(|| "debug".to_owned(), |n| n.to_string_lossy().into_owned());
    (target, profile_name)
}

/// A free TCP port on 127.0.0.1 (free when this returns; a daemon binding it may still race).
///
/// # Panics
/// When no port can be bound.
#[must_use]
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("cannot find a free port: {e}"))
}

/// The `phrony` CLI with a clean environment for assertions: no colour, no inherited runtime
/// address or actor.
#[must_use]
pub fn phrony() -> Command {
    let mut cmd = Command::new(&binaries().phrony);
    cmd.env_remove("PHRONY_RUNTIME_ADDR")
        .env_remove("PHRONY_ACTOR")
        .env_remove("PHRONY_TOKEN")
        .env_remove("PHRONY_TLS_CA")
        .env_remove("PHRONY_TLS_CERT")
        .env_remove("PHRONY_TLS_KEY")
        .env("NO_COLOR", "1");
    cmd
}

/// A running daemon. Dropping it stops the daemon and removes its database.
#[derive(Debug)]
pub struct Daemon {
    child: Option<Child>,
    addr: String,
    backend: Backend,
    dir: tempfile::TempDir,
    _postgres: Option<PgDatabase>,
    /// The private cluster of [`Backend::PrivatePostgres`] (stopped and removed after the daemon
    /// stopped).
    private: Option<PrivatePostgres>,
    /// The database it runs on.
    database_url: String,
    /// Extra environment variables of the daemon.
    env: Vec<(String, String)>,
    /// How the readiness probe connects when the daemon serves TLS.
    tls: Option<ClientTls>,
}

impl Daemon {
    /// Starts a daemon on a free port and waits until its health is `SERVING`. `None` only for
    /// [`Backend::Postgres`] when PostgreSQL is down and `PHRONY_TEST_SKIP_POSTGRES=1`, and for
    /// [`Backend::PrivatePostgres`] when this environment cannot host a private cluster (no
    /// `initdb`; the reason is printed).
    ///
    /// # Panics
    /// When the daemon does not become healthy (its log is in the message), or PostgreSQL is
    /// down and skipping was not asked for.
    #[must_use]
    pub fn start(backend: Backend) -> Option<Self> {
        Self::start_with_env(backend, &[])
    }

    /// [`start`](Self::start) with extra environment variables for the daemon, e.g.
    /// `("RUNTIME_ENABLE_STUB_PROVIDER", "1")` for agents on the scripted `stub` model.
    ///
    /// # Panics
    /// As [`start`](Self::start).
    #[must_use]
    pub fn start_with_env(backend: Backend, env: &[(&str, &str)]) -> Option<Self> {
        Self::start_with_tls(backend, env, None)
    }

    /// [`start_with_env`](Self::start_with_env) for a daemon whose `env` turns TLS on
    /// (`RUNTIME_TLS_CERT`…): the readiness probe connects with `tls`.
    ///
    /// # Panics
    /// As [`start`](Self::start).
    #[must_use]
    pub fn start_with_tls(
        backend: Backend,
        env: &[(&str, &str)],
        tls: Option<ClientTls>,
    ) -> Option<Self> {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let (url, postgres, private) = match backend {
            Backend::Sqlite => (
                format!("sqlite://{}", dir.path().join("phrony.db").display()),
                None,
                None,
            ),
            Backend::Postgres => {
                let db = PgDatabase::create_blocking()?;
                (db.url().to_owned(), Some(db), None)
            }
            Backend::PrivatePostgres => {
                let cluster = PrivatePostgres::start()?;
                (cluster.create_database("phrony"), None, Some(cluster))
            }
        };
        let mut daemon = Self {
            child: None,
            addr: String::new(),
            backend,
            dir,
            _postgres: postgres,
            private,
            database_url: url.clone(),
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            tls,
        };
        // A port found free can be taken before the daemon binds it: retry on that only.
        for _ in 0..3 {
            daemon.addr = format!("127.0.0.1:{}", free_port());
            daemon.spawn(&url);
            match daemon.wait_ready() {
                Ok(()) => return Some(daemon),
                Err(log) if log.contains("already in use") => {}
                Err(log) => panic!("phrony-runtime ({backend:?}) did not become ready:\n{log}"),
            }
        }
        panic!("phrony-runtime could not find a free port three times");
    }

    /// Another daemon on this daemon's database — a replica, as several runtime processes share
    /// one PostgreSQL — with this daemon's extra environment and then `env`, its own port and
    /// files. The database stays this daemon's (dropped with it): drop replicas first. The
    /// replicas must share the audit key and the secrets key (pass `RUNTIME_AUDIT_KEY_FILE`
    /// and `RUNTIME_SECRETS_ENCRYPTION_KEY` to all).
    ///
    /// # Panics
    /// As [`start`](Self::start).
    #[must_use]
    pub fn replica(&self, env: &[(&str, &str)]) -> Self {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let mut extra = self.env.clone();
        extra.extend(env.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        let mut daemon = Self {
            child: None,
            addr: String::new(),
            backend: self.backend,
            dir,
            _postgres: None,
            private: None,
            database_url: self.database_url.clone(),
            env: extra,
            tls: self.tls.clone(),
        };
        let url = self.database_url.clone();
        for _ in 0..3 {
            daemon.addr = format!("127.0.0.1:{}", free_port());
            daemon.spawn(&url);
            match daemon.wait_ready() {
                Ok(()) => return daemon,
                Err(log) if log.contains("already in use") => {}
                Err(log) => panic!("phrony-runtime replica did not become ready:\n{log}"),
            }
        }
        panic!("phrony-runtime could not find a free port three times");
    }

    /// Stops the process with SIGSTOP (a replica paused, or cut off from its database) or
    /// lets it go on with SIGCONT (`run: false`).
    pub fn pause(&self, paused: bool) {
        if let Some(pid) = self.pid() {
            let signal = if paused { "-STOP" } else { "-CONT" };
            let _ = Command::new("kill")
                .args([signal, &pid.to_string()])
                .status();
        }
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("runtime.log")
    }

    fn spawn(&mut self, database_url: &str) {
        // Appended to, so that a restarted daemon's log follows the killed one's.
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap_or_else(|e| panic!("log file: {e}"));
        let err = log.try_clone().unwrap_or_else(|e| panic!("log file: {e}"));
        let data = self.dir.path().join("data");
        let child = Command::new(&binaries().runtime)
            .env("RUNTIME_GRPC_ADDR", &self.addr)
            .env("RUNTIME_DATABASE_URL", database_url)
            .env("RUNTIME_LOG", "info")
            .env("XDG_DATA_HOME", &data)
            .env("HOME", self.dir.path())
            .env_remove("RUNTIME_SECRETS_ENCRYPTION_KEY")
            .env_remove("RUNTIME_LOG_FORMAT")
            .env_remove("PHRONY_ACTOR")
            .env_remove("RUNTIME_ENABLE_STUB_PROVIDER")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start phrony-runtime: {e}"));
        self.child = Some(child);
    }

    /// Polls health until `SERVING`; on failure returns the daemon's log.
    fn wait_ready(&mut self) -> Result<(), String> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("tokio: {e}"));
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                return Err(format!("exited with {status}\n{}", self.logs()));
            }
            let healthy = rt.block_on(async {
                let client = match &self.tls {
                    Some(tls) => Client::connect_tls(&self.addr, tls).await,
                    None => Client::connect(&self.addr).await,
                };
                match client {
                    Ok(client) => client.health().await.ok() == Some(Health::Serving),
                    Err(_) => false,
                }
            });
            if healthy {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.kill();
                return Err(format!(
                    "not SERVING after {}s\n{}",
                    READY_TIMEOUT.as_secs(),
                    self.logs()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `host:port` the daemon listens on.
    #[must_use]
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The storage this daemon runs on.
    #[must_use]
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The private cluster the daemon runs on ([`Backend::PrivatePostgres`]), to stop and start
    /// under it.
    pub fn private_postgres(&mut self) -> Option<&mut PrivatePostgres> {
        self.private.as_mut()
    }

    /// The SQLite file the daemon runs on ([`Backend::Sqlite`]).
    #[must_use]
    pub fn sqlite_path(&self) -> Option<PathBuf> {
        self.database_url
            .strip_prefix("sqlite://")
            .map(PathBuf::from)
    }

    /// What the daemon logged so far.
    #[must_use]
    pub fn logs(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The `phrony` CLI pointed at this daemon through `PHRONY_RUNTIME_ADDR` (see [`phrony`]).
    #[must_use]
    pub fn phrony(&self) -> Command {
        let mut cmd = phrony();
        cmd.env("PHRONY_RUNTIME_ADDR", &self.addr);
        cmd
    }

    /// The `phrony-runtime` binary on this daemon's database (for `tokens …`, which work while
    /// the daemon runs), with the daemon's extra environment.
    #[must_use]
    pub fn runtime(&self) -> Command {
        let mut cmd = Command::new(&binaries().runtime);
        cmd.env("RUNTIME_DATABASE_URL", &self.database_url)
            .env("RUNTIME_LOG", "warn")
            .env("XDG_DATA_HOME", self.dir.path().join("data"))
            .env("HOME", self.dir.path())
            .env_remove("PHRONY_ACTOR")
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        cmd
    }

    /// Stops the daemon with SIGTERM and returns its exit status.
    ///
    /// # Panics
    /// When it does not stop within 15 s (it is then killed).
    pub fn stop(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                _ => {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!(
                        "phrony-runtime did not stop within {}s of SIGTERM\n{}",
                        STOP_TIMEOUT.as_secs(),
                        self.logs()
                    );
                }
            }
        }
    }

    /// Kills the daemon with SIGKILL (no clean-up of any kind) and waits for it to exit.
    pub fn kill9(&mut self) {
        self.kill();
    }

    /// The daemon's process id, while it runs.
    #[must_use]
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Starts the daemon again on the same address, database and files (after [`kill9`](Self::kill9)
    /// or [`stop`](Self::stop)) and waits until it is `SERVING`, as recovery runs.
    ///
    /// # Panics
    /// When it is still running, or does not become ready (its log is in the message).
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "restart of a running daemon");
        let url = self.database_url.clone();
        self.spawn(&url);
        if let Err(log) = self.wait_ready() {
            panic!("phrony-runtime did not become ready again:\n{log}");
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The secrets key every replica of a [`Replicas`] group shares (a fixed test key).
const REPLICAS_SECRETS_KEY: &str =
    "6b1c1e2e3a4f5061728394a5b6c7d8e9f00112233445566778899aabbccddeef";

/// Several daemons on one fresh PostgreSQL database (issue #20): replica `i` runs with
/// `RUNTIME_REPLICA_ID=replica-i`, and all share one audit key file and one secrets key.
/// Dropping it stops the replicas, then the first daemon, which drops the database.
#[derive(Debug)]
pub struct Replicas {
    // Declared before the first daemon: the replicas stop before it drops the database.
    replicas: Vec<Daemon>,
    first: Daemon,
    _keys: tempfile::TempDir,
}

impl Replicas {
    /// Starts `n` (at least one) replicas on a fresh PostgreSQL database with the extra
    /// environment `env` each, one after the other, each waited for until `SERVING`. `None`
    /// when PostgreSQL is down and `PHRONY_TEST_SKIP_POSTGRES=1`.
    ///
    /// # Panics
    /// As [`Daemon::start`].
    #[must_use]
    pub fn start(n: usize, env: &[(&str, &str)]) -> Option<Self> {
        let keys = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
        let audit_key = keys.path().join("audit.key").display().to_string();
        let mut shared = env.to_vec();
        shared.extend([
            ("RUNTIME_AUDIT_KEY_FILE", audit_key.as_str()),
            ("RUNTIME_SECRETS_ENCRYPTION_KEY", REPLICAS_SECRETS_KEY),
        ]);
        let mut with_id = shared.clone();
        with_id.push(("RUNTIME_REPLICA_ID", "replica-0"));
        let first = Daemon::start_with_env(Backend::Postgres, &with_id)?;
        let replicas = (1..n.max(1))
            .map(|i| first.replica(&[("RUNTIME_REPLICA_ID", &format!("replica-{i}"))]))
            .collect();
        Some(Self {
            replicas,
            first,
            _keys: keys,
        })
    }

    /// How many replicas.
    #[must_use]
    pub fn len(&self) -> usize {
        self.replicas.len() + 1
    }

    /// Always false: a group has its first daemon.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Replica `i` (`replica-i`).
    ///
    /// # Panics
    /// When `i` is not below [`len`](Self::len).
    #[must_use]
    pub fn get(&self, i: usize) -> &Daemon {
        if i == 0 {
            &self.first
        } else {
            &self.replicas[i - 1]
        }
    }

    /// Replica `i`, to kill or restart.
    ///
    /// # Panics
    /// When `i` is not below [`len`](Self::len).
    pub fn get_mut(&mut self, i: usize) -> &mut Daemon {
        if i == 0 {
            &mut self.first
        } else {
            &mut self.replicas[i - 1]
        }
    }

    /// The replicas in order.
    pub fn iter(&self) -> impl Iterator<Item = &Daemon> {
        std::iter::once(&self.first).chain(&self.replicas)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.kill();
        } else if let Some(status) = self.stop() {
            assert!(
                status.success(),
                "phrony-runtime exited with {status} on SIGTERM\n{}",
                self.logs()
            );
        }
        // The database (if any) is dropped with `self._postgres`, the private cluster with
        // `self.private`, after the daemon stopped.
    }
}
