//! Test support: the real `phrony-runtime` binary on a free port, fresh databases, a compiled
//! test agent and the generated gRPC clients.

#![allow(
    dead_code,
    reason = "each test file uses a different subset of the helpers"
)]
#![allow(clippy::unwrap_used, reason = "test support: a panic is a failed test")]

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pb::runtime_client::RuntimeClient;
use phrony_proto::runtime::v1 as pb;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_phrony-runtime");

/// How long a daemon may take to become healthy or to exit.
pub(crate) const PATIENCE: Duration = Duration::from_secs(30);

/// A port nobody listens on right now.
pub(crate) fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A running daemon. Killed on drop; its stderr is collected for assertions and diagnostics.
pub(crate) struct Daemon {
    child: Child,
    pub(crate) addr: String,
    stderr: Arc<Mutex<String>>,
    /// The thread copying the daemon's stderr into `stderr`: finished once the pipe closed.
    reader: std::thread::JoinHandle<()>,
}

/// How to start a daemon.
#[derive(Clone, Debug)]
pub(crate) struct Launch {
    pub(crate) database_url: Option<String>,
    /// XDG_DATA_HOME and HOME of the daemon (the default database and key live below it).
    pub(crate) home: PathBuf,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) addr: String,
    /// The umask the daemon starts with (through `sh -c 'umask …; exec …'`); `None` inherits.
    pub(crate) umask: Option<u32>,
}

impl Launch {
    pub(crate) fn new(home: &Path, database_url: Option<&str>) -> Self {
        Self {
            database_url: database_url.map(str::to_owned),
            home: home.to_path_buf(),
            env: Vec::new(),
            addr: format!("127.0.0.1:{}", free_port()),
            umask: None,
        }
    }

    /// `phrony-runtime tokens create --name <name> --role <role>` on this daemon's database:
    /// the new token's secret.
    pub(crate) fn token(&self, name: &str, role: &str) -> String {
        let out = self
            .command()
            .args(["tokens", "create", "--name", name, "--role", role])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .last()
            .unwrap()
            .trim()
            .to_owned()
    }

    pub(crate) fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    pub(crate) fn command(&self) -> Command {
        let mut cmd = match self.umask {
            None => Command::new(BIN),
            Some(mask) => {
                let mut sh = Command::new("sh");
                sh.arg("-c")
                    .arg(format!("umask {mask:03o} && exec \"$0\" \"$@\""))
                    .arg(BIN);
                sh
            }
        };
        for var in [
            "RUNTIME_DATABASE_URL",
            "RUNTIME_GRPC_ADDR",
            "RUNTIME_HTTP_ADDR",
            "RUNTIME_AUTH",
            "RUNTIME_LOG_FORMAT",
            "RUNTIME_LOG",
            "RUST_LOG",
            "RUNTIME_SECRETS_ENCRYPTION_KEY",
            "RUNTIME_AUDIT_KEY_FILE",
            "RUNTIME_ALLOW_UNVERIFIED_LOG",
            "RUNTIME_DISPATCH_QUEUE_WAIT",
            "RUNTIME_TOOL_EXEC_TIMEOUT",
            "RUNTIME_WORKER_LEASE_TTL",
            "RUNTIME_TOOL_ALLOWLIST",
            "RUNTIME_SQLITE_BUSY_TIMEOUT",
            "RUNTIME_SQLITE_MIN_FREE_BYTES",
            "RUNTIME_DATABASE_MAX_CONNECTIONS",
            "RUNTIME_ENABLE_STUB_PROVIDER",
            "PHRONY_ACTOR",
        ] {
            cmd.env_remove(var);
        }
        // Trace export only where a test asks for it.
        for (var, _) in std::env::vars_os() {
            if var.to_string_lossy().starts_with("OTEL_") {
                cmd.env_remove(var);
            }
        }
        cmd.env("XDG_DATA_HOME", self.home.join("xdg"))
            .env("HOME", &self.home)
            .env("RUNTIME_GRPC_ADDR", &self.addr)
            .current_dir(&self.home);
        if let Some(url) = &self.database_url {
            cmd.env("RUNTIME_DATABASE_URL", url);
        }
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    /// Starts the daemon without waiting for it.
    pub(crate) fn spawn(&self) -> Daemon {
        self.spawn_args(&[])
    }

    /// Starts the binary with `args` without waiting for it.
    pub(crate) fn spawn_args(&self, args: &[&str]) -> Daemon {
        let mut child = self
            .command()
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = Arc::new(Mutex::new(String::new()));
        let pipe = child.stderr.take().unwrap();
        let sink = Arc::clone(&stderr);
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines() {
                let Ok(line) = line else { break };
                let mut s = sink.lock().unwrap();
                s.push_str(&line);
                s.push('\n');
            }
        });
        Daemon {
            child,
            addr: self.addr.clone(),
            stderr,
            reader,
        }
    }

    /// Starts the daemon and waits until its health check reports SERVING.
    pub(crate) async fn start(&self) -> Daemon {
        let mut daemon = self.spawn();
        daemon.wait_for_health(ServingStatus::Serving).await;
        daemon
    }

    /// Runs the binary to completion (for commands and start-up failures).
    pub(crate) fn run(&self, args: &[&str]) -> (ExitStatus, String) {
        let mut daemon = self.spawn_args(args);
        let status = daemon.wait_exit();
        (status, daemon.stderr())
    }
}

impl Daemon {
    pub(crate) fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// The daemon's log once it holds `text` (waiting up to [`PATIENCE`]: the log reaches the
    /// test through a pipe and a reader thread, after the request that caused it was answered).
    pub(crate) async fn logged(&self, text: &str) -> String {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let log = self.stderr();
            if log.contains(text) {
                return log;
            }
            assert!(
                Instant::now() < deadline,
                "the daemon did not log {text:?}; stderr:\n{log}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits (up to [`PATIENCE`]) for the process to exit.
    pub(crate) fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // The whole log, once the reader thread has drained the pipe (a process the
                // daemon started may hold the pipe open after it exits: not waited for long).
                let drained = Instant::now() + Duration::from_secs(2);
                while !self.reader.is_finished() && Instant::now() < drained {
                    std::thread::sleep(Duration::from_millis(10));
                }
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "daemon did not exit; stderr:\n{}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits (up to [`PATIENCE`]) for the process to exit without blocking the test's runtime:
    /// the test's own client connections live on it, and the daemon's graceful shutdown waits
    /// for them to answer its HTTP/2 GOAWAY (blocked, they held every stop for the whole
    /// 10 s grace period).
    pub(crate) async fn exited(&mut self) -> ExitStatus {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // The whole log, once the reader thread has drained the pipe (a process the
                // daemon started may hold the pipe open after it exits: not waited for long).
                let drained = Instant::now() + Duration::from_secs(2);
                while !self.reader.is_finished() && Instant::now() < drained {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "daemon did not exit; stderr:\n{}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Sends SIGTERM and waits for the exit ([`Daemon::exited`]).
    pub(crate) async fn terminate(&mut self) -> ExitStatus {
        let status = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -TERM failed");
        self.exited().await
    }

    pub(crate) async fn channel(&self) -> Channel {
        tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(20))
            .connect()
            .await
            .unwrap_or_else(|e| panic!("cannot connect to {}: {e}\n{}", self.addr, self.stderr()))
    }

    pub(crate) async fn client(&self) -> RuntimeClient<Channel> {
        RuntimeClient::new(self.channel().await)
    }

    /// The health of `service` ("" = the whole server), or `None` when nothing answers.
    pub(crate) async fn health(&self, service: &str) -> Option<ServingStatus> {
        let endpoint =
            tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr)).unwrap();
        let channel = endpoint
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(5))
            .connect()
            .await
            .ok()?;
        let response = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .ok()?;
        Some(response.into_inner().status())
    }

    /// Polls health until both `""` and the runtime service report `want`.
    pub(crate) async fn wait_for_health(&mut self, want: ServingStatus) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                std::thread::sleep(Duration::from_millis(100));
                panic!(
                    "daemon exited with {status} before becoming {want:?}:\n{}",
                    self.stderr()
                );
            }
            let server = self.health("").await;
            let runtime = self.health("phrony.runtime.v1.Runtime").await;
            if server == Some(want) && runtime == Some(want) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "health stayed {server:?}/{runtime:?}, wanted {want:?}; stderr:\n{}",
                self.stderr()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------------------------
// Databases

/// A fresh PostgreSQL database `phrony_test_<uuid>`, dropped (with its connections) on drop.
pub(crate) use phrony_test_support::postgres::PgDatabase;

/// A SQLite URL for a file in `dir`.
pub(crate) fn sqlite_url(dir: &Path) -> String {
    format!("sqlite://{}", dir.join("ledger.db").display())
}

// ---------------------------------------------------------------------------------------------
// Agents

/// Writes a small agent (one tool, one deny policy) to `dir` and compiles it with
/// phrony-manifest: the snapshot the CLI would publish.
pub(crate) fn compile_agent(dir: &Path, version: &str, purpose: &str) -> Vec<u8> {
    std::fs::create_dir_all(dir.join("tools")).unwrap();
    std::fs::create_dir_all(dir.join("policies")).unwrap();
    std::fs::write(
        dir.join("agent.yaml"),
        format!(
            "apiVersion: phrony.com/v1
kind: Agent
metadata:
  name: refund-agent
  namespace: support
  version: {version}
  owner: payments-team
spec:
  purpose: {purpose}
  instructions:
    text: Always look up the order before issuing a refund.
  model:
    provider: openai
    name: gpt-4o
  tools:
    - ref: payments.issue-refund
      policies:
        - ref: policies/refund-limit.yaml
"
        ),
    )
    .unwrap();
    std::fs::write(
        dir.join("tools/payments.issue-refund.yaml"),
        "apiVersion: phrony.com/v1
kind: Tool
metadata:
  name: issue-refund
  namespace: payments
  version: 1.0.0
spec:
  description: Issue a refund to the original payment method.
  side_effect_class: irreversible_action
  input_schema:
    inline:
      type: object
      properties:
        order_id:
          type: string
        amount:
          type: number
      required: [order_id, amount]
",
    )
    .unwrap();
    std::fs::write(
        dir.join("policies/refund-limit.yaml"),
        "apiVersion: phrony.com/v1
kind: Policy
metadata:
  name: refund-limit
  namespace: payments
  version: 1.0.0
spec:
  conditions:
    field: amount
    op: gt
    value: 5000
  decision:
    type: deny
    reason: Refund amount exceeds the ceiling.
",
    )
    .unwrap();
    let compiled = phrony_manifest::load_agent(dir.join("agent.yaml"))
        .unwrap_or_else(|d| panic!("the test agent does not compile:\n{d}"));
    compiled.agent.snapshot_json()
}

/// `msg` with `authorization: Bearer <bearer>` when a token is given (`required` auth mode).
pub(crate) fn authed<T>(msg: T, bearer: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(msg);
    if let Some(token) = bearer {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
    }
    request
}

pub(crate) fn agent_ref(version: &str) -> pb::AgentRef {
    pb::AgentRef {
        namespace: "support".into(),
        name: "refund-agent".into(),
        version: version.into(),
    }
}

/// Stops a test worker: it owns a Tokio runtime, which must not be dropped inside the test's.
pub(crate) async fn stop_worker(worker: phrony_test_support::worker::RefundWorker) {
    tokio::task::spawn_blocking(move || drop(worker))
        .await
        .unwrap();
}
