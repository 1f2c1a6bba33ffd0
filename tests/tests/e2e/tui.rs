//! The interactive client end to end: the real `phrony` binary against the real
//! `phrony-runtime` (scripted `stub` model) and a tool worker on the `Work` stream.
//!
//! - `phrony run --attach` in a real terminal (tmux, 120×40): the approval panel appears, `a`
//!   and a typed comment approve the held refund, the refund is dispatched and confirmed, the
//!   vote is attributed to `PHRONY_ACTOR`, the session menu completes the session, and `q`
//!   leaves with the terminal restored.
//! - `phrony sessions attach ID` with the plain renderer (stdin/stdout are pipes): `/approve`
//!   on stdin decides the approval and end of input detaches once the turn has ended.
//! - `phrony run --attach` exits 1 (`Error: session failed: …`) when the session fails.
//! - The client library's stream (`Client::start_interactive`, `decide`, `attach`): domain
//!   events for every step, a decision with a comment and edited arguments attributed to the
//!   stream's actor, and closing the stream only detaches.
//!
//! The tmux test needs `tmux` on the PATH; `PHRONY_TEST_SKIP_TMUX=1` skips it.

#![allow(
    clippy::unwrap_used,
    reason = "test helpers as well as tests: a panic is a failed assertion, with its message"
)]

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tests::cli::{json, ok, phrony};
use tests::daemon::{Backend, Daemon, binaries};
use tests::stub::{REFUND_AGENT as AGENT, publish_and_deploy, stub_daemon, write_refund_agent};
use tests::worker::RefundWorker;

/// How long the screen or a session may take to reach a state (a failure guard, not a pace).
const WAIT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// The agent and its worker

/// The refund agent on the stub model: it says it will refund, asks for a €400 refund (held for
/// approval by the boundary policy), then confirms.
fn refund_agent(dir: &Path) {
    write_refund_agent(
        dir,
        &json!([
            [
                {"type": "text_delta", "text": "I will issue the refund for ORD-1."},
                {"type": "tool_call", "name": "issue_refund",
                 "args": {"order_id": "ORD-1", "amount": 400, "currency": "EUR"}},
                {"type": "completed", "stop_reason": "tool_use"}
            ],
            [
                {"type": "text_delta", "text": "Refund confirmed for ORD-1."},
                {"type": "completed", "stop_reason": "end_turn"}
            ]
        ]),
    );
}

/// A daemon on SQLite accepting the stub model, with a worker registered and the refund agent
/// deployed from `dir`.
fn deployed(dir: &Path) -> (Daemon, RefundWorker) {
    let daemon = stub_daemon(Backend::Sqlite).expect("an SQLite daemon always starts");
    let worker = RefundWorker::start(daemon.addr(), "tui-test-worker");
    refund_agent(dir);
    publish_and_deploy(&daemon, dir, AGENT);
    (daemon, worker)
}

/// The vote lines of `approvals show` for the session's only approval.
fn votes(daemon: &Daemon, session_id: &str) -> Vec<String> {
    let listed = json(&ok(phrony(daemon, "ci").args([
        "approvals",
        "list",
        "--status",
        "approved",
        "--session-id",
        session_id,
        "--output",
        "json",
    ])));
    let approval_id = listed["approvals"][0]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no approved approval for {session_id}: {listed}"))
        .to_owned();
    ok(phrony(daemon, "ci").args(["approvals", "show", &approval_id]))
        .lines()
        .filter(|l| l.starts_with("vote: "))
        .map(str::to_owned)
        .collect()
}

// ---------------------------------------------------------------------------------------------
// tmux

/// A tmux server of its own (its own socket), killed on drop.
struct Tmux {
    socket: String,
}

impl Tmux {
    /// `None` when tmux is missing and `PHRONY_TEST_SKIP_TMUX=1`.
    fn start(command: &str) -> Option<Self> {
        let skip = std::env::var("PHRONY_TEST_SKIP_TMUX").is_ok_and(|v| v == "1");
        let available = Command::new("tmux")
            .arg("-V")
            .output()
            .is_ok_and(|o| o.status.success());
        if !available {
            assert!(
                skip,
                "tmux is required for this test (PHRONY_TEST_SKIP_TMUX=1 skips it)"
            );
            return None;
        }
        let tmux = Self {
            socket: format!("phrony-tui-{}", uuid::Uuid::new_v4()),
        };
        let status = tmux
            .cmd()
            .args([
                "new-session",
                "-d",
                "-s",
                "t",
                "-x",
                "120",
                "-y",
                "40",
                command,
            ])
            .status()
            .unwrap();
        assert!(status.success(), "tmux new-session failed");
        Some(tmux)
    }

    fn cmd(&self) -> Command {
        let mut cmd = Command::new("tmux");
        cmd.args(["-L", &self.socket, "-f", "/dev/null"]);
        cmd
    }

    fn screen(&self) -> String {
        let out = self
            .cmd()
            .args(["capture-pane", "-p", "-t", "t"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn keys(&self, keys: &[&str]) {
        let status = self
            .cmd()
            .args(["send-keys", "-t", "t"])
            .args(keys)
            .status()
            .unwrap();
        assert!(status.success());
    }

    fn type_text(&self, text: &str) {
        let status = self
            .cmd()
            .args(["send-keys", "-t", "t", "-l", text])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Polls the screen until `done` holds; returns it. Panics with the screen after [`WAIT`].
    fn wait(&self, what: &str, done: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let screen = self.screen();
            if done(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}; the screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd().arg("kill-server").status();
    }
}

/// Single-quotes `s` for `sh`.
fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// The session id shown in the TUI's header.
fn header_session_id(screen: &str) -> String {
    let header = screen.lines().next().unwrap_or_default();
    header
        .split_whitespace()
        .find(|word| word.starts_with("run_"))
        .unwrap_or_else(|| panic!("no session id in the header: {header:?}"))
        .to_owned()
}

#[test]
fn run_attach_tui_approves_a_refund_with_a_comment() {
    let project = tempfile::tempdir().unwrap();
    let (daemon, worker) = deployed(project.path());

    let exit_file: PathBuf = project.path().join("exit");
    let command = format!(
        "env PHRONY_RUNTIME_ADDR={addr} PHRONY_ACTOR=emad NO_COLOR=1 TERM=xterm-256color \
         {phrony} run {AGENT} --attach --input {input}; echo $? > {exit}; sleep 600",
        addr = daemon.addr(),
        phrony = quoted(binaries().phrony.to_str().unwrap()),
        input = quoted("Refund €400 for ORD-1, the item arrived damaged."),
        exit = quoted(exit_file.to_str().unwrap()),
    );
    let Some(tmux) = Tmux::start(&command) else {
        return;
    };

    // The approval lands in the TUI: tool, arguments, the deciding policy and its reason.
    let screen = tmux.wait("the approval panel", |s| {
        s.contains("┌ APPROVAL REQUIRED") && s.contains("a approve · d deny")
    });
    let session_id = header_session_id(&screen);
    for expected in [
        "support/refund-agent@0.1.0 · stub/scripted",
        "I will issue the refund for ORD-1.",
        "TOOL CALL payments.issue-refund@1.0.0",
        "│Tool    payments.issue-refund@1.0.0",
        "│Policy  payments/refund-approval-boundary@1.0.0",
        "│Reason  Refund amount above delegated limit.",
        "│Quorum  0/1 approvals · on reject: return_to_agent",
        "\"amount\": 400,",
        " Awaiting approval ",
    ] {
        assert!(screen.contains(expected), "{expected:?} missing:\n{screen}");
    }
    assert!(
        worker.invocations().is_empty(),
        "dispatched before approval"
    );

    // `a`, a comment, Enter.
    tmux.keys(&["a"]);
    tmux.wait("the comment prompt", |s| {
        s.contains("┌ Approve · comment (optional)")
    });
    tmux.type_text("Damage claim verified, within policy.");
    tmux.wait("the typed comment", |s| {
        s.contains("│Damage claim verified, within policy.")
    });
    tmux.keys(&["Enter"]);

    // The refund runs and the agent confirms it.
    let screen = tmux.wait("the confirmation", |s| {
        s.contains("Refund confirmed for ORD-1.") && s.contains(" Ready ")
    });
    for expected in [
        "APPROVED",
        "by emad · 1/1 approvals · “Damage claim verified, within policy.”",
        "TOOL RESULT payments.issue-refund@1.0.0",
        "\"refund_id\": \"rf_ORD-1\"",
    ] {
        assert!(screen.contains(expected), "{expected:?} missing:\n{screen}");
    }
    assert!(
        !screen.contains("┌ APPROVAL REQUIRED"),
        "the panel closes once decided:\n{screen}"
    );
    let invocations = worker.invocations();
    assert_eq!(invocations.len(), 1, "{invocations:?}");
    assert_eq!(invocations[0]["amount"], 400);
    // The vote went through the ledger, attributed to the attached operator, with the comment.
    let votes = votes(&daemon, &session_id);
    assert_eq!(votes.len(), 1, "{votes:?}");
    assert!(
        votes[0].starts_with("vote: emad approved")
            && votes[0].ends_with(": \"Damage claim verified, within policy.\""),
        "{votes:?}"
    );

    // Ctrl+P → Complete session, then q leaves.
    tmux.keys(&["C-p"]);
    tmux.wait("the session menu", |s| s.contains("› Complete session"));
    tmux.keys(&["Enter"]);
    tmux.wait("the completion", |s| {
        s.contains("── Session completed ──") && s.contains(" Finished ")
    });
    tmux.keys(&["q"]);
    let deadline = Instant::now() + WAIT;
    let code = loop {
        if let Ok(code) = std::fs::read_to_string(&exit_file)
            && !code.is_empty()
        {
            break code;
        }
        assert!(
            Instant::now() < deadline,
            "phrony did not exit:\n{}",
            tmux.screen()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(code.trim(), "0");
    // The alternate screen is gone: the shell's screen shows what was printed before.
    let screen = tmux.screen();
    assert!(
        screen.contains(&format!("session {session_id} started")),
        "{screen}"
    );
    assert!(!screen.contains("┌ Message"), "{screen}");
}

/// A `phrony` process with piped stdio, fed line by line as its stderr shows what it waits for.
struct Piped {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    lines: std::sync::mpsc::Receiver<String>,
    stderr: Vec<String>,
}

impl Piped {
    fn spawn(cmd: &mut Command) -> Self {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let stderr = child.stderr.take().unwrap();
        let (lines_tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { return };
                if lines_tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self {
            child,
            stdin,
            lines,
            stderr: Vec::new(),
        }
    }

    /// Reads stderr until a line contains `text`.
    fn wait_for(&mut self, text: &str) {
        loop {
            let line = self.lines.recv_timeout(WAIT).unwrap_or_else(|_| {
                panic!(
                    "{text:?} never came; stderr so far:\n{}",
                    self.stderr.join("\n")
                )
            });
            let done = line.contains(text);
            self.stderr.push(line);
            if done {
                return;
            }
        }
    }

    fn send(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    /// Closes stdin and waits for the exit: (exit code, stdout, stderr).
    fn finish(mut self) -> (Option<i32>, String, String) {
        drop(self.stdin.take());
        let mut stdout = String::new();
        self.child
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut stdout)
            .unwrap();
        let status = self.child.wait().unwrap();
        // The reader thread ends with the pipe; collect what it has left.
        while let Ok(line) = self.lines.recv_timeout(WAIT) {
            self.stderr.push(line);
        }
        (status.code(), stdout, self.stderr.join("\n"))
    }
}

#[test]
fn run_attach_plain_exits_non_zero_when_the_session_fails() {
    let project = tempfile::tempdir().unwrap();
    let (daemon, _worker) = deployed(project.path());
    let mut run = Piped::spawn(phrony(&daemon, "emad").args([
        "run",
        AGENT,
        "--attach",
        "--input",
        "Refund €400 for ORD-1.",
    ]));
    run.wait_for("approve with /approve [comment]");
    run.send("/approve");
    run.wait_for("── turn 1 · end_turn");
    // The scripted model has no third completion: this turn fails the session.
    run.send("Anything else?");
    let (code, stdout, stderr) = run.finish();
    assert_eq!(code, Some(1), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stdout.contains("Refund confirmed for ORD-1."), "{stdout}");
    assert!(
        stderr.contains("── session failed: unexpected completion call 3"),
        "{stderr}"
    );
    assert!(
        stderr
            .ends_with("Error: session failed: unexpected completion call 3 (script has 2 turns)"),
        "{stderr}"
    );
}

#[test]
fn sessions_attach_plain_approves_from_stdin() {
    let project = tempfile::tempdir().unwrap();
    let (daemon, worker) = deployed(project.path());
    let started = ok(phrony(&daemon, "ci").args([
        "run",
        AGENT,
        "--conversation",
        "--input",
        "Refund €400 for ORD-1.",
    ]));
    let session_id = started
        .strip_prefix("session ")
        .and_then(|rest| rest.strip_suffix(" started\n"))
        .unwrap_or_else(|| panic!("unexpected run output: {started:?}"))
        .to_owned();

    let mut attach =
        Piped::spawn(phrony(&daemon, "alice").args(["sessions", "attach", &session_id]));
    attach.wait_for("approve with /approve [comment]");
    attach.send("/approve Verified by phone.");
    // End of input detaches once the turn the approval unblocked has ended.
    let (code, stdout, stderr) = attach.finish();
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("Refund confirmed for ORD-1."),
        "stdout: {stdout}\nstderr: {stderr}"
    );
    for expected in [
        "── approval required: payments.issue-refund@1.0.0 · policy payments/refund-approval-boundary@1.0.0",
        "── approve sent ──",
        "── approval approved by alice (1/1): Verified by phone. ──",
        "── tool result payments.issue-refund@1.0.0",
        &format!("detached from session {session_id}; it keeps running"),
    ] {
        assert!(stderr.contains(expected), "{expected:?} missing:\n{stderr}");
    }
    assert_eq!(worker.invocations().len(), 1);
    let votes = votes(&daemon, &session_id);
    assert_eq!(votes.len(), 1, "{votes:?}");
    assert!(votes[0].starts_with("vote: alice approved"), "{votes:?}");
}

/// The client library's interactive stream (what the CLI is built on): start a conversation on
/// the stream, decide the approval on it with a comment and edited arguments, and see every
/// step as a domain event.
#[test]
fn the_interactive_client_starts_decides_and_follows_a_session() {
    use phrony_client::interactive::{ApprovalStatus, Decision, SessionEvent, ToolOutcome};
    use phrony_client::{AgentName, Client, RunSession, SessionMode};

    let project = tempfile::tempdir().unwrap();
    let (daemon, worker) = deployed(project.path());

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = Client::connect(daemon.addr()).await.unwrap();
        let mut run = RunSession::new(AgentName::new("support", "refund-agent"));
        run.input = Some(json!("Refund €400 for ORD-1."));
        run.mode = SessionMode::Conversation;
        let session = client.start_interactive(&run, "carol").await.unwrap();
        let session_id = session.started().session_id.clone();
        assert!(session_id.starts_with("run_"), "{session_id}");
        assert_eq!(session.started().model_provider, "stub");
        let (sender, mut events) = session.split();
        let mut text = String::new();
        let approval = loop {
            match next_event(&mut events).await {
                SessionEvent::TextDelta(delta) => text.push_str(&delta),
                SessionEvent::ApprovalRequired(approval) => break approval,
                _ => {}
            }
        };
        assert_eq!(text, "I will issue the refund for ORD-1.");
        assert_eq!(approval.tool, "payments.issue-refund");
        assert_eq!(
            approval.policy_ref.as_deref(),
            Some("payments/refund-approval-boundary@1.0.0")
        );
        assert_eq!(approval.on_reject.as_deref(), Some("return_to_agent"));
        let args: Value = serde_json::from_str(&approval.args).unwrap();
        assert_eq!(args["amount"], 400);

        // Approve with an edit: 300 is under the boundary, so the revalidated call runs.
        sender
            .decide(
                Decision::approve()
                    .for_approval(approval.approval_id.clone())
                    .with_comment("partial refund agreed")
                    .with_args(r#"{"order_id":"ORD-1","amount":300,"currency":"EUR"}"#),
            )
            .await
            .unwrap();
        let mut decided = None;
        let mut result = None;
        loop {
            match next_event(&mut events).await {
                SessionEvent::ApprovalDecided(d) => decided = Some(d),
                SessionEvent::ToolResult(r) => result = Some(r),
                SessionEvent::AwaitingInput(a) if a.input_blocked_reason.is_none() => break,
                SessionEvent::Failed { message } => panic!("failed: {message}"),
                _ => {}
            }
        }
        let decided = decided.expect("the decision is on the stream");
        assert_eq!(decided.status, ApprovalStatus::Approved);
        assert_eq!(decided.decided_by, "carol");
        assert_eq!(decided.comment.as_deref(), Some("partial refund agreed"));
        let result = result.expect("the tool result is on the stream");
        assert_eq!(result.call_id, approval.call_id);
        let ToolOutcome::Succeeded { payload } = result.outcome else {
            panic!("{result:?}")
        };
        let payload: Value = serde_json::from_str(&payload).unwrap();
        assert_eq!(payload["amount"], 300);
        assert_eq!(worker.invocations()[0]["amount"], 300);

        // Closing our side only detaches: the session is still waiting for input.
        drop(sender);
        drop(events);
        let again = client.attach(&session_id, "carol").await.unwrap();
        assert_eq!(again.started().session_id, session_id);
        client.complete_session(&session_id, "carol").await.unwrap();
        let (_sender, mut events) = again.split();
        loop {
            match next_event(&mut events).await {
                SessionEvent::Completed(_) => break,
                SessionEvent::Failed { message } => panic!("failed: {message}"),
                _ => {}
            }
        }
    });
}

/// The next event of an interactive stream that must stay open.
async fn next_event(
    events: &mut phrony_client::interactive::InteractiveEvents,
) -> phrony_client::interactive::SessionEvent {
    tokio::time::timeout(WAIT, events.next())
        .await
        .expect("an event in time")
        .unwrap()
        .expect("the stream stays open")
}
