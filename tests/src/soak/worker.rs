//! The soak's journaling tool worker, run as a child process (`soak worker …`) so that the
//! harness can SIGKILL and SIGSTOP it.
//!
//! - It serves every tool of the soak agent ([`TOOLS`]) on the `Work` stream and **executes
//!   every invoke it receives** (it does not de-duplicate by call id: catching a second
//!   execution is the point). An execution is one line appended to the journal and synced to
//!   disk *before* anything else happens, so the journal is what the outside world saw.
//! - It survives daemon restarts: when the stream ends it reconnects (every 100 ms) under the
//!   same worker id, lists its unacknowledged calls in `in_flight` and sends their results
//!   again, as a real worker must.
//! - It tells the harness what it does on stdout, one line each: `REGISTERED`,
//!   `INVOKE <call_id> <tool>` (journaled, result not sent yet), `RESULT <call_id> <tool>`
//!   (result written to the stream). A line `CUT` on stdin drops the stream (the worker reconnects); the end of
//!   stdin (the harness exited) ends the worker.
//! - `--duplicate` sends every result twice.

use std::collections::BTreeMap;
use std::io::{BufRead as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use phrony_proto::runtime::v1 as pb;
use phrony_proto::runtime::v1::runtime_client::RuntimeClient;
use serde_json::{Value, json};
use tokio::sync::{Notify, mpsc};

/// The tools the soak agent binds, with their declared side-effect class (`""`: none).
pub const TOOLS: [(&str, &str); 6] = [
    ("orders.lookup-order", "read_only"),
    ("orders.set-address", "idempotent_write"),
    ("payments.issue-refund", "irreversible_action"),
    ("payments.transfer-funds", "non_idempotent_write"),
    ("notes.append-note", "non_idempotent_write"),
    ("partners.notify-partner", ""),
];

/// The version every soak tool declares.
pub const TOOL_VERSION: &str = "1.0.0";

/// The worker id (the same across restarts, so the runtime sees a reconnection).
pub const WORKER_ID: &str = "soak-worker";

/// Whether a side-effect class may run twice by the rules (reads and idempotent writes).
#[must_use]
pub fn safe_class(class: &str) -> bool {
    matches!(class, "read_only" | "idempotent_write")
}

/// The declared class of a soak tool (`None` for a tool the agent does not bind).
#[must_use]
pub fn class_of(tool: &str) -> Option<&'static str> {
    TOOLS.iter().find(|(t, _)| *t == tool).map(|(_, c)| *c)
}

/// What the worker was started with.
#[derive(Debug, Clone)]
pub struct WorkerArgs {
    /// `host:port` of the daemon.
    pub addr: String,
    /// The journal (JSON lines, appended).
    pub journal: PathBuf,
    /// How long an execution takes between the journal line and the result.
    pub work: Duration,
    /// Send every result twice.
    pub duplicate: bool,
}

/// One line of the journal.
#[derive(Debug, Clone, PartialEq)]
pub enum JournalEntry {
    /// The worker executed the call (its `execution`-th execution of that call id).
    Exec {
        /// The call.
        call_id: String,
        /// The tool.
        tool: String,
        /// The arguments it ran with.
        args: Value,
        /// 1 for the first execution of this call id, 2 for a second one…
        execution: u64,
        /// The result it answers.
        result: Value,
        /// Milliseconds since the Unix epoch.
        at_ms: u64,
    },
}

/// Milliseconds since the Unix epoch.
#[must_use]
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Reads a journal; a missing file is empty, a line that is not an entry is an error.
///
/// # Errors
/// When the file cannot be read or holds a line that is not a journal entry.
pub fn read_journal(path: &Path) -> Result<Vec<JournalEntry>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(format!("read {}: {e}", path.display())),
    };
    let mut entries = Vec::new();
    for (n, line) in text.lines().enumerate() {
        // A worker SIGKILLed mid-write leaves at most a torn last line (never synced, so the
        // execution did not complete): skip it.
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            if n + 1 == text.lines().count() {
                continue;
            }
            return Err(format!("{}:{}: not JSON: {line}", path.display(), n + 1));
        };
        let s = |k: &str| v[k].as_str().unwrap_or_default().to_owned();
        let at_ms = v["at_ms"].as_u64().unwrap_or_default();
        match v["kind"].as_str() {
            Some("exec") => entries.push(JournalEntry::Exec {
                call_id: s("call_id"),
                tool: s("tool"),
                args: v["args"].clone(),
                execution: v["execution"].as_u64().unwrap_or_default(),
                result: v["result"].clone(),
                at_ms,
            }),
            _ => {
                return Err(format!(
                    "{}:{}: unknown entry {line}",
                    path.display(),
                    n + 1
                ));
            }
        }
    }
    Ok(entries)
}

struct State {
    journal: std::fs::File,
    /// Executions so far per call id (from the journal at start).
    executions: BTreeMap<String, u64>,
    /// Results sent but not acknowledged (tool, payload).
    unacked: BTreeMap<String, (String, Vec<u8>)>,
}

impl State {
    fn append(&mut self, line: &Value) {
        let mut text = line.to_string();
        text.push('\n');
        // The journal is the outside world: losing a line would hide an execution.
        self.journal
            .write_all(text.as_bytes())
            .and_then(|()| self.journal.sync_data())
            .unwrap_or_else(|e| panic!("journal write: {e}"));
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

fn message(body: pb::work_client_msg::Body) -> pb::WorkClientMsg {
    pb::WorkClientMsg { body: Some(body) }
}

/// Runs the worker until the process is killed.
///
/// # Panics
/// When the journal cannot be opened or written, or the Tokio runtime cannot start.
pub fn run(args: &WorkerArgs) {
    let existing = read_journal(&args.journal).unwrap_or_else(|e| panic!("{e}"));
    let mut executions = BTreeMap::new();
    for entry in existing {
        let JournalEntry::Exec { call_id, .. } = entry;
        *executions.entry(call_id).or_insert(0) += 1;
    }
    let journal = std::fs::File::options()
        .create(true)
        .append(true)
        .open(&args.journal)
        .unwrap_or_else(|e| panic!("open {}: {e}", args.journal.display()));
    let state = Arc::new(Mutex::new(State {
        journal,
        executions,
        unacked: BTreeMap::new(),
    }));
    let cut = Arc::new(Notify::new());
    {
        let cut = Arc::clone(&cut);
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                match line.as_deref() {
                    Ok("CUT") => cut.notify_one(),
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            // The harness is gone (its end of the pipe closed): so is the worker.
            std::process::exit(0);
        });
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("tokio: {e}"));
    runtime.block_on(async {
        loop {
            connection(args, &state, &cut).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
}

/// One connection: register, resend unacknowledged results, serve until the stream ends or
/// the harness cuts it.
async fn connection(args: &WorkerArgs, state: &Arc<Mutex<State>>, cut: &Arc<Notify>) {
    let Ok(endpoint) = tonic::transport::Endpoint::from_shared(format!("http://{}", args.addr))
    else {
        panic!("bad address {}", args.addr);
    };
    let Ok(channel) = endpoint.connect().await else {
        return;
    };
    let (tx, rx) = mpsc::channel::<pb::WorkClientMsg>(64);
    let pending: Vec<(String, (String, Vec<u8>))> = lock(state)
        .unacked
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let register = pb::WorkRegister {
        worker_id: WORKER_ID.into(),
        workload_identity: format!("tests/{WORKER_ID}"),
        image_digest: String::new(),
        handlers: TOOLS
            .iter()
            .map(|(tool, _)| pb::WorkHandlerAdvertisement {
                tool: (*tool).into(),
                version: TOOL_VERSION.into(),
                contract_version: String::new(),
                max_concurrency: 8,
                descriptor_hash: String::new(),
            })
            .collect(),
        in_flight: pending
            .iter()
            .map(|(call_id, _)| pb::WorkInFlightCall {
                call_id: call_id.clone(),
            })
            .collect(),
    };
    if tx
        .send(message(pb::work_client_msg::Body::Register(register)))
        .await
        .is_err()
    {
        return;
    }
    let Ok(response) = RuntimeClient::new(channel)
        .work(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
    else {
        return;
    };
    let mut inbound = response.into_inner();
    let mut heartbeat: Option<tokio::task::JoinHandle<()>> = None;
    loop {
        let msg = tokio::select! {
            msg = inbound.message() => msg,
            () = cut.notified() => break,
        };
        let Ok(Some(msg)) = msg else { break };
        match msg.body {
            Some(pb::work_server_msg::Body::Registered(registered)) => {
                let every = Duration::from_millis(
                    u64::try_from(registered.lease_ttl_ms / 4)
                        .unwrap_or(500)
                        .max(100),
                );
                heartbeat = Some(tokio::spawn(beat(tx.clone(), every)));
                say("REGISTERED");
                for (call_id, (tool, payload)) in &pending {
                    send_result(&tx, call_id, tool, payload).await;
                }
            }
            Some(pb::work_server_msg::Body::Invoke(invoke)) => {
                tokio::spawn(execute(
                    invoke,
                    Arc::clone(state),
                    tx.clone(),
                    args.work,
                    args.duplicate,
                ));
            }
            Some(pb::work_server_msg::Body::ResultAck(ack)) => {
                lock(state).unacked.remove(&ack.call_id);
            }
            _ => {}
        }
    }
    if let Some(task) = heartbeat {
        task.abort();
    }
}

fn lock(state: &Mutex<State>) -> std::sync::MutexGuard<'_, State> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Executes one invoke: journal it (the side effect), work, send the result.
async fn execute(
    invoke: pb::WorkInvoke,
    state: Arc<Mutex<State>>,
    tx: mpsc::Sender<pb::WorkClientMsg>,
    work: Duration,
    duplicate: bool,
) {
    let args: Value = serde_json::from_slice(&invoke.args).unwrap_or(Value::Null);
    let payload = {
        let mut st = lock(&state);
        let execution = {
            let n = st.executions.entry(invoke.call_id.clone()).or_insert(0);
            *n += 1;
            *n
        };
        let result = json!({
            "tool": invoke.tool,
            "call_id": invoke.call_id,
            "execution": execution,
            "args": args,
        });
        st.append(&json!({
            "kind": "exec",
            "call_id": invoke.call_id,
            "tool": invoke.tool,
            "args": args,
            "execution": execution,
            "result": result,
            "at_ms": now_ms(),
        }));
        let payload = result.to_string().into_bytes();
        st.unacked.insert(
            invoke.call_id.clone(),
            (invoke.tool.clone(), payload.clone()),
        );
        payload
    };
    say(&format!("INVOKE {} {}", invoke.call_id, invoke.tool));
    tokio::time::sleep(work).await;
    send_result(&tx, &invoke.call_id, &invoke.tool, &payload).await;
    if duplicate {
        send_result(&tx, &invoke.call_id, &invoke.tool, &payload).await;
    }
}

async fn send_result(
    tx: &mpsc::Sender<pb::WorkClientMsg>,
    call_id: &str,
    tool: &str,
    payload: &[u8],
) {
    let result = pb::WorkToolResult {
        call_id: call_id.to_owned(),
        payload: payload.to_vec(),
        error: None,
    };
    if tx
        .send(message(pb::work_client_msg::Body::Result(result)))
        .await
        .is_ok()
    {
        say(&format!("RESULT {call_id} {tool}"));
    }
}

async fn beat(tx: mpsc::Sender<pb::WorkClientMsg>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    loop {
        tick.tick().await;
        let beat = message(pb::work_client_msg::Body::Heartbeat(pb::WorkHeartbeat {}));
        if tx.send(beat).await.is_err() {
            break;
        }
    }
}
