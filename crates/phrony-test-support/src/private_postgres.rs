//! A private PostgreSQL cluster a test may stop, kill and restart: `initdb` into a temporary
//! directory, a free port on 127.0.0.1, its Unix socket inside that directory.
//!
//! ```no_run
//! use phrony_test_support::private_postgres::{PrivatePostgres, StopMode};
//! let Some(mut pg) = PrivatePostgres::start() else { return }; // skipped, with the reason
//! let url = pg.url(); // postgres://postgres@127.0.0.1:<port>/postgres
//! pg.stop(StopMode::Immediate); // a crash as the clients see it
//! pg.start_again(); // the same data, port and URL
//! # let _ = url;
//! ```
//!
//! - The binaries are the newest `/usr/lib/postgresql/<major>/bin` (or
//!   `PHRONY_TEST_PG_BIN`). `initdb` and `pg_ctl` refuse to run as root: as root they run as
//!   the `postgres` user (`runuser -u postgres --`), which owns the directory; as any other user
//!   they run as that user.
//! - The cluster is the test's own: it never touches the shared server at 5432 (nor any server
//!   it did not start), and `fsync` is on, so a stop in `immediate` mode is a crash the server
//!   recovers from with its WAL.
//! - Skip-or-fail: [`PrivatePostgres::start`] returns `None` (saying why on stderr) only when the
//!   environment cannot host a cluster at all (no `initdb`, root without a `postgres` user or
//!   `runuser`); a cluster that is there but fails to start fails the test.
//! - Dropping it stops the server (immediate mode) and removes the directory.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// The variable naming the directory of `initdb`, `pg_ctl` (default: the newest
/// `/usr/lib/postgresql/<major>/bin`).
pub const BIN_VAR: &str = "PHRONY_TEST_PG_BIN";

/// How long `pg_ctl` may wait for the server to start or stop (`-t`).
const PG_CTL_WAIT: Duration = Duration::from_secs(60);

/// Why a private cluster cannot run here (a skip), or failed (a test failure).
#[derive(Debug, thiserror::Error)]
pub enum PrivatePgError {
    /// The environment cannot host a cluster: the test is skipped.
    #[error("no private PostgreSQL cluster here: {reason}")]
    Unavailable {
        /// What is missing.
        reason: String,
    },
    /// A step that should have worked failed.
    #[error("{step} failed: {detail}")]
    Failed {
        /// The step (`initdb`, `pg_ctl start`…).
        step: String,
        /// Its output or error.
        detail: String,
    },
}

/// How [`PrivatePostgres::stop`] stops the server (`pg_ctl stop -m`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopMode {
    /// Ends the sessions, checkpoints and exits (`-m fast`).
    Fast,
    /// Exits at once without a checkpoint, as a crash would; the next start replays the WAL
    /// (`-m immediate`).
    Immediate,
}

impl StopMode {
    fn flag(self) -> &'static str {
        match self {
            Self::Fast => "fast",
            Self::Immediate => "immediate",
        }
    }
}

/// A running (or stopped) private cluster; see the [module docs](self).
#[derive(Debug)]
pub struct PrivatePostgres {
    bin: PathBuf,
    /// As root: the `postgres` user the tools run as.
    run_as: Option<String>,
    dir: tempfile::TempDir,
    port: u16,
    running: bool,
}

impl PrivatePostgres {
    /// Creates and starts a cluster; `None` (with the reason on stderr) when this environment
    /// cannot host one.
    ///
    /// # Panics
    /// When the environment can host one but a step fails.
    #[must_use]
    pub fn start() -> Option<Self> {
        match Self::try_start() {
            Ok(pg) => Some(pg),
            Err(error @ PrivatePgError::Unavailable { .. }) => {
                eprintln!("skipping private-PostgreSQL test: {error}");
                None
            }
            Err(error) => panic!("private PostgreSQL cluster: {error}"),
        }
    }

    /// Creates and starts a cluster, leaving what to do when it cannot to the caller.
    ///
    /// # Errors
    /// [`PrivatePgError::Unavailable`] when the environment cannot host a cluster,
    /// [`PrivatePgError::Failed`] when a step fails.
    pub fn try_start() -> Result<Self, PrivatePgError> {
        let bin = find_bin()?;
        let run_as = if is_root() {
            if !Path::new("/usr/sbin/runuser").exists() && which("runuser").is_none() {
                return Err(unavailable("running as root and `runuser` is missing"));
            }
            if !command_ok(Command::new("id").args(["-u", "postgres"])) {
                return Err(unavailable(
                    "running as root and there is no `postgres` user to run initdb as",
                ));
            }
            Some("postgres".to_owned())
        } else {
            None
        };
        let dir = tempfile::Builder::new()
            .prefix("phrony-pg-")
            .tempdir()
            .map_err(|e| failed("create the cluster directory", &e))?;
        if let Some(user) = &run_as {
            let chown = Command::new("chown")
                .arg(format!("{user}:"))
                .arg(dir.path())
                .output()
                .map_err(|e| failed("chown", &e))?;
            check("chown", &chown)?;
        }
        let mut pg = Self {
            bin,
            run_as,
            dir,
            port: 0,
            running: false,
        };
        pg.initdb()?;
        // A port found free may be taken before the server binds it: retry on that only.
        let mut last = None;
        for _ in 0..3 {
            pg.port = free_port()?;
            pg.write_config()?;
            match pg.try_start_again() {
                Ok(()) => return Ok(pg),
                Err(error) => {
                    let busy = pg.log().contains("could not bind")
                        || pg.log().contains("Address already in use");
                    last = Some(error);
                    if !busy {
                        break;
                    }
                }
            }
        }
        Err(last.unwrap_or_else(|| failed("pg_ctl start", &"no attempt was made")))
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres` (trust authentication on 127.0.0.1).
    #[must_use]
    pub fn url(&self) -> String {
        self.database_url("postgres")
    }

    /// The URL of database `name` on this cluster (see [`create_database`](Self::create_database)).
    #[must_use]
    pub fn database_url(&self, name: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{name}", self.port)
    }

    /// The TCP port the server listens on (the same across restarts).
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The cluster's directory (data in `data/`, the server's log in `server.log`).
    #[must_use]
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Whether the server was started and not stopped since.
    #[must_use]
    pub fn is_running(&self) -> bool {
        self.running
    }

    /// Creates database `name` (`createdb`), returning its URL.
    ///
    /// # Panics
    /// When the server refuses.
    #[must_use]
    pub fn create_database(&self, name: &str) -> String {
        let out = self
            .tool("createdb")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "-U",
                "postgres",
            ])
            .arg(name)
            .output()
            .unwrap_or_else(|e| panic!("cannot run createdb: {e}"));
        if let Err(error) = check("createdb", &out) {
            panic!("{error}");
        }
        self.database_url(name)
    }

    /// Stops the server and waits until it exited. Stopping a stopped server does nothing.
    ///
    /// # Panics
    /// When `pg_ctl stop` fails.
    pub fn stop(&mut self, mode: StopMode) {
        if let Err(error) = self.try_stop(mode) {
            panic!("{error}\n{}", self.log());
        }
    }

    /// Starts the stopped server again on the same data, port and socket directory, and waits
    /// until it accepts connections (after replaying its WAL, following an immediate stop).
    ///
    /// # Panics
    /// When it does not start; the server's log is in the message.
    pub fn start_again(&mut self) {
        if let Err(error) = self.try_start_again() {
            panic!("{error}\n{}", self.log());
        }
    }

    /// [`stop`](Self::stop) then [`start_again`](Self::start_again).
    ///
    /// # Panics
    /// As those.
    pub fn restart(&mut self, mode: StopMode) {
        self.stop(mode);
        self.start_again();
    }

    /// The server's log so far.
    #[must_use]
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// One of the cluster's binaries, run as the cluster's owner.
    fn tool(&self, name: &str) -> Command {
        let exe = self.bin.join(name);
        let mut cmd = match &self.run_as {
            Some(user) => {
                let mut cmd = Command::new("runuser");
                cmd.args(["-u", user, "--"]).arg(exe);
                cmd
            }
            None => Command::new(exe),
        };
        // The tools must not pick up a PGDATA, PGPORT… the test process inherited.
        for var in ["PGDATA", "PGPORT", "PGHOST", "PGUSER", "PGDATABASE"] {
            cmd.env_remove(var);
        }
        cmd.current_dir(self.dir.path());
        cmd
    }

    fn initdb(&self) -> Result<(), PrivatePgError> {
        let out = self
            .tool("initdb")
            .arg("-D")
            .arg(self.data())
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                // initdb's own final sync only; the server runs with fsync on.
                "--no-sync",
            ])
            .output()
            .map_err(|e| failed("run initdb", &e))?;
        check("initdb", &out)
    }

    fn write_config(&self) -> Result<(), PrivatePgError> {
        let socket_dir = self.dir.path().display().to_string().replace('\'', "''");
        // postgresql.auto.conf is read last and owned by the server user already.
        let settings = format!(
            "port = {}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{socket_dir}'\n\
             fsync = on\nsynchronous_commit = on\nfull_page_writes = on\nmax_connections = 60\n\
             shared_buffers = '16MB'\nlogging_collector = off\n",
            self.port
        );
        let path = self.data().join("postgresql.auto.conf");
        std::fs::write(&path, settings).map_err(|e| failed("write postgresql.auto.conf", &e))
    }

    fn try_start_again(&mut self) -> Result<(), PrivatePgError> {
        if self.running {
            return Ok(());
        }
        let out = self
            .tool("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.dir.path().join("server.log"))
            .args(["-w", "-t", &PG_CTL_WAIT.as_secs().to_string(), "start"])
            .output()
            .map_err(|e| failed("run pg_ctl start", &e))?;
        check("pg_ctl start", &out)?;
        self.running = true;
        Ok(())
    }

    fn try_stop(&mut self, mode: StopMode) -> Result<(), PrivatePgError> {
        if !self.running {
            return Ok(());
        }
        let out = self
            .tool("pg_ctl")
            .arg("-D")
            .arg(self.data())
            .args([
                "-w",
                "-t",
                &PG_CTL_WAIT.as_secs().to_string(),
                "-m",
                mode.flag(),
                "stop",
            ])
            .output()
            .map_err(|e| failed("run pg_ctl stop", &e))?;
        check("pg_ctl stop", &out)?;
        self.running = false;
        Ok(())
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        if let Err(error) = self.try_stop(StopMode::Immediate) {
            eprintln!(
                "warning: could not stop the private PostgreSQL cluster in {}: {error}",
                self.dir.path().display()
            );
        }
        // The directory goes with `self.dir` (root may remove the postgres user's files; any
        // other user owns them).
    }
}

fn unavailable(reason: &str) -> PrivatePgError {
    PrivatePgError::Unavailable {
        reason: reason.to_owned(),
    }
}

fn failed(step: &str, error: &dyn std::fmt::Display) -> PrivatePgError {
    PrivatePgError::Failed {
        step: step.to_owned(),
        detail: error.to_string(),
    }
}

fn check(step: &str, out: &Output) -> Result<(), PrivatePgError> {
    if out.status.success() {
        return Ok(());
    }
    Err(PrivatePgError::Failed {
        step: step.to_owned(),
        detail: format!(
            "{}: {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    })
}

fn command_ok(cmd: &mut Command) -> bool {
    cmd.output().is_ok_and(|o| o.status.success())
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// The directory holding `initdb`: `PHRONY_TEST_PG_BIN`, the newest
/// `/usr/lib/postgresql/<major>/bin`, or the one on `PATH`.
fn find_bin() -> Result<PathBuf, PrivatePgError> {
    if let Some(dir) = std::env::var_os(BIN_VAR) {
        let dir = PathBuf::from(dir);
        return if dir.join("initdb").is_file() {
            Ok(dir)
        } else {
            Err(unavailable(&format!(
                "{BIN_VAR}={} holds no initdb",
                dir.display()
            )))
        };
    }
    let mut majors: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let major = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((major, bin))
        })
        .collect();
    majors.sort();
    if let Some((_, bin)) = majors.pop() {
        return Ok(bin);
    }
    which("initdb")
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .ok_or_else(|| {
            unavailable(&format!(
                "no initdb in /usr/lib/postgresql/*/bin or on PATH (set {BIN_VAR})"
            ))
        })
}

fn free_port() -> Result<u16, PrivatePgError> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| failed("find a free port", &e))
}
