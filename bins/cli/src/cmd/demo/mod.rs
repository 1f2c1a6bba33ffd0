//! `phrony demo [refund]`: the tutorial in one command, with no API key and nothing set up.
//!
//! It starts a runtime embedded in the CLI on a temporary SQLite database (or, with
//! `--runtime-addr` / `PHRONY_RUNTIME_ADDR`, uses that runtime, which must run with
//! `RUNTIME_ENABLE_STUB_PROVIDER=1`), publishes and deploys the tutorial's refund agent on the
//! scripted `stub` model, starts an in-process tool worker for its two tools (the SDK's
//! `Worker`), and walks the tutorial's three scenarios in one conversation shown by the attach
//! view (the TUI, or the plain renderer with `--no-tui` or without a terminal): a €100 refund
//! is dispatched; a €400 refund waits for the operator's `a`/`d` (`/approve`, `/deny`; `--yes`
//! approves it) and the agent answers either way; a €14,000 refund is denied at dispatch by
//! the hard-limit policy. It ends with the session's audit trail (`phrony sessions inspect`)
//! and the commands that do the same with a real model and the Python worker.

mod agent;
mod worker;

use std::io::{self, Write as _};

use anyhow::{Context as _, bail};
use phrony_client::interactive::{Decision, InteractiveSession, SessionEvent};
use phrony_client::{AgentName, Client, RunSession, SessionMode};
use tokio::sync::mpsc;

use crate::cmd::attach::view::{Action, Phase, View};
use crate::cmd::attach::{self, Directed, Link, Outcome, RemoteLink, plain, tui};
use crate::cmd::{Global, manifest, remote};

/// The comment recorded with the approval `--yes` gives.
const YES_COMMENT: &str = "approved by phrony demo --yes";

/// The commands that run the tutorial for real, printed at the end.
const NEXT_STEPS: &str = "\
Do the same with a real model and the Python worker:
  phrony init refund-agent && cd refund-agent     # the tutorial's agent, tools, policies and worker.py
  phrony-runtime &                                # the daemon (SQLite under ~/.local/share/phrony)
  export PHRONY_ACTOR=you                         # your name in the audit trail
  phrony agents publish ./agent.yaml && phrony agents deploy support/refund-agent@0.1.0
  uv run worker.py                                # the tool worker (pip install phrony)
  echo OPENAI_API_KEY=sk-... > .env
  phrony run support/refund-agent -e .env --attach";

/// Which demo.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Which {
    /// The refund tutorial: dispatched, held for approval, denied by policy.
    #[default]
    Refund,
}

/// Arguments of `phrony demo`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The demo to run.
    #[arg(value_enum, default_value_t)]
    demo: Which,
    /// Use the plain line-oriented renderer even on a terminal (also: PHRONY_NO_TUI=1).
    #[arg(long)]
    no_tui: bool,
    /// Approve the €400 refund without asking (for scripts and CI).
    #[arg(long)]
    yes: bool,
}

/// Where the demo's runtime runs.
enum Runtime {
    /// Embedded in this process, on a temporary database.
    #[cfg(feature = "embedded-runtime")]
    Embedded {
        runtime: phrony_runtime::embedded::EmbeddedRuntime,
        _dir: tempfile::TempDir,
    },
    /// The one at `--runtime-addr`.
    External,
}

/// `phrony demo`.
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    let Which::Refund = args.demo;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("start the async runtime")?
        .block_on(demo(args, global))
}

async fn demo(args: &Args, global: &Global) -> anyhow::Result<()> {
    let mut out = io::stdout();
    let (runtime, client) = start_runtime(global, &mut out).await?;
    // You, as the tutorial has it: PHRONY_ACTOR, else the OS user (or a token's principal).
    let actor = remote::actor(client.sends_credential())?;
    let project = tempfile::tempdir().context("create a temporary directory")?;
    let manifest_path = agent::write(project.path()).context("write the demo agent")?;
    let compiled = manifest::load_agent(&manifest_path)?;
    let published = client
        .publish(&compiled, &actor)
        .await
        .map_err(remote::fails("publish"))?;
    let name = AgentName::new("support", "refund-agent");
    client
        .deploy(&name, agent::VERSION, &actor)
        .await
        .map_err(remote::fails("deploy"))?;
    writeln!(
        out,
        "published and deployed {}@{}{} (the tutorial's agent, tools and policies; a scripted model)",
        agent::AGENT,
        published.version,
        if published.created {
            ""
        } else {
            " (already published)"
        }
    )?;

    let mut worker = worker_for(client.addr(), global, &runtime)?.start();
    worker
        .registered()
        .await
        .context("start the demo's tool worker")?;
    writeln!(
        out,
        "tool worker {} serves orders.lookup-order@1.0.0 and payments.issue-refund@1.0.0",
        worker.id()
    )?;

    let session_id = converse(&client, &actor, args).await?;
    audit_trail(&client, &session_id, &mut out).await?;
    writeln!(out)?;
    writeln!(out, "{NEXT_STEPS}")?;
    out.flush()?;
    worker.drain(std::time::Duration::from_secs(5)).await;
    #[cfg(feature = "embedded-runtime")]
    if let Runtime::Embedded { runtime, .. } = runtime {
        runtime.stop().await.context("stop the embedded runtime")?;
    }
    Ok(())
}

/// The runtime the demo uses: the one `--runtime-addr` names when it was given, else one
/// embedded in this process.
async fn start_runtime(
    global: &Global,
    out: &mut impl io::Write,
) -> anyhow::Result<(Runtime, Client)> {
    if global.runtime_addr_given {
        let (client, _) = remote::connect(global).await?;
        writeln!(out, "phrony demo: using the runtime at {}", client.addr())?;
        return Ok((Runtime::External, client));
    }
    embedded(out).await
}

#[cfg(feature = "embedded-runtime")]
async fn embedded(out: &mut impl io::Write) -> anyhow::Result<(Runtime, Client)> {
    let dir = tempfile::tempdir().context("create a temporary directory")?;
    let runtime = phrony_runtime::embedded::EmbeddedRuntime::start(dir.path())
        .await
        .context("start the embedded runtime")?;
    let client = Client::connect(&runtime.addr())
        .await
        .map_err(remote::fails("connect"))?;
    writeln!(
        out,
        "phrony demo: started a runtime in this process on a temporary SQLite database (gone when the demo ends)"
    )?;
    Ok((Runtime::Embedded { runtime, _dir: dir }, client))
}

#[cfg(not(feature = "embedded-runtime"))]
async fn embedded(_out: &mut impl io::Write) -> anyhow::Result<(Runtime, Client)> {
    bail!(
        "this phrony was built without its embedded runtime (cargo feature `embedded-runtime`): \
         start phrony-runtime with RUNTIME_ENABLE_STUB_PROVIDER=1 and pass --runtime-addr"
    )
}

/// The demo's worker, with the CLI's credentials when it talks to an external runtime.
fn worker_for(
    addr: &str,
    global: &Global,
    runtime: &Runtime,
) -> anyhow::Result<phrony_sdk::Worker> {
    let mut builder = worker::builder(addr);
    if matches!(runtime, Runtime::External) {
        if let Some(token) = global.token.as_deref().filter(|t| !t.trim().is_empty()) {
            builder = builder.token(token);
        }
        if let Some(ca) = global.tls_ca.as_deref() {
            let tls = phrony_client::ClientTls::from_files(
                ca,
                global.tls_cert.as_deref(),
                global.tls_key.as_deref(),
            )?;
            builder = builder.tls(tls);
        }
    }
    Ok(builder.build()?)
}

/// Starts the conversation with the first scenario's message and walks the others; returns
/// the session id once the session completed.
async fn converse(client: &Client, actor: &str, args: &Args) -> anyhow::Result<String> {
    let first = agent::SCENARIOS[0];
    // The first scenario's message is the session's input; the director sends the others.
    let mut run = RunSession::new(AgentName::new("support", "refund-agent"));
    run.mode = SessionMode::Conversation;
    run.input = Some(serde_json::Value::String(first.message.to_owned()));
    run.metadata.insert("demo".to_owned(), "refund".to_owned());
    let session: InteractiveSession = client
        .start_interactive(&run, actor)
        .await
        .map_err(remote::fails("start the demo session"))?;
    let session_id = session.started().session_id.clone();
    let tui = attach::use_tui(args.no_tui, |name| std::env::var(name).ok());
    let (steps, director) = mpsc::channel(16);
    let link = Director {
        inner: RemoteLink::new(client, session, actor.to_owned()),
        steps,
        next: 1,
        yes: args.yes,
        tui,
        held: None,
    };
    let view = View::new(Some(format!("{}@{}", agent::AGENT, agent::VERSION)));
    let outcome = if tui {
        tui::run_directed(link, view, director).await?
    } else {
        // With --yes nothing is read from stdin (it may be closed); else stdin lines are the
        // operator's commands (`/approve`, `/deny`).
        let (keep_open, never) = mpsc::channel::<String>(1);
        let input = if args.yes {
            never
        } else {
            plain::stdin_lines()
        };
        // Status lines and the agent's text on stdout both, in order.
        let outcome = plain::run_directed(
            link,
            view,
            input,
            plain::Pacing::of_stdin(),
            director,
            io::stdout(),
            io::stdout(),
        )
        .await;
        drop(keep_open);
        outcome?
    };
    match outcome {
        Outcome::Detached {
            phase: Phase::Finished,
            ..
        } => Ok(session_id),
        Outcome::Detached {
            phase: Phase::AwaitingApproval,
            ..
        } => {
            let _ = client.cancel_session(&session_id, actor).await;
            bail!(
                "the €400 refund waits for a decision, but there was no input to decide it \
                 (stdin ended): run with --yes to approve it automatically"
            )
        }
        Outcome::Detached {
            phase: Phase::Failed,
            failure,
        } => bail!(
            "the demo session failed: {}",
            failure.as_deref().unwrap_or("no reason given")
        ),
        Outcome::Detached { phase, .. } => {
            if !phase.is_terminal() {
                let _ = client.cancel_session(&session_id, actor).await;
            }
            bail!("the demo ended early (session {})", phase.label())
        }
        Outcome::Lost(reason) => bail!("lost the demo session's stream: {reason}"),
        // The demo agent delegates nothing, and its plain renderer opens no child.
        Outcome::Open(child) => bail!("the demo ended early (opened session {child})"),
    }
}

/// The session's link, plus the demo's script: it narrates each scenario, sends the next
/// message when the agent waits for one, approves with `--yes`, and completes the session
/// after the last answer.
struct Director<'a> {
    inner: RemoteLink<'a>,
    steps: mpsc::Sender<Directed>,
    /// The next scenario to send.
    next: usize,
    yes: bool,
    tui: bool,
    /// `--yes`'s approval, sent once the session reports `awaiting_approval`.
    held: Option<Decision>,
}

impl Director<'_> {
    fn step(&self, step: Directed) {
        // The renderer drains the queue between events; 16 steps are never outstanding.
        let _ = self.steps.try_send(step);
    }

    fn react(&mut self, event: &SessionEvent) {
        match event {
            SessionEvent::Started(_) => {
                let first = agent::SCENARIOS[0];
                self.step(Directed::Note(first.title.to_owned()));
                self.step(Directed::Note(format!("you: {}", first.message)));
            }
            SessionEvent::ApprovalRequired(required) if required.kind == "policy" => {
                if self.yes {
                    let mut decision = Decision::approve();
                    decision.approval_id = Some(required.approval_id.clone());
                    decision.comment = YES_COMMENT.to_owned();
                    decision.comprehension_acknowledged = required.comprehension_required;
                    self.held = Some(decision);
                } else if self.tui {
                    self.step(Directed::Note(
                        "your call: press a to approve or d to deny (the policy waits for you)"
                            .to_owned(),
                    ));
                } else {
                    self.step(Directed::Note(
                        "your call: type /approve or /deny (with an optional comment) and Enter"
                            .to_owned(),
                    ));
                }
            }
            SessionEvent::Status(changed) if changed.status == "awaiting_approval" => {
                if let Some(decision) = self.held.take() {
                    self.step(Directed::Note(
                        "--yes: approving the held call as the operator".to_owned(),
                    ));
                    self.step(Directed::Act(Action::Decide(decision)));
                }
            }
            SessionEvent::AwaitingInput(waiting) if waiting.input_blocked_reason.is_none() => {
                match agent::SCENARIOS.get(self.next) {
                    Some(scenario) => {
                        self.next += 1;
                        self.step(Directed::Note(scenario.title.to_owned()));
                        self.step(Directed::Act(Action::Send(scenario.message.to_owned())));
                    }
                    None => {
                        self.step(Directed::Note(
                            "all three scenarios done: completing the session".to_owned(),
                        ));
                        self.step(Directed::Act(Action::Complete));
                    }
                }
            }
            SessionEvent::Completed(_) if self.tui => self.step(Directed::Note(
                "the demo is done: press Ctrl+C to leave and see the audit trail".to_owned(),
            )),
            _ => {}
        }
    }
}

impl Link for Director<'_> {
    async fn next(&mut self) -> Result<Option<SessionEvent>, String> {
        let event = self.inner.next().await?;
        if let Some(event) = &event {
            self.react(event);
        }
        Ok(event)
    }

    async fn perform(&mut self, action: &Action) -> Result<(), String> {
        self.inner.perform(action).await
    }
}

/// Prints `phrony sessions inspect <id>` of the demo session.
async fn audit_trail(
    client: &Client,
    session_id: &str,
    out: &mut impl io::Write,
) -> anyhow::Result<()> {
    let inspection = client
        .inspect_session(session_id)
        .await
        .map_err(remote::fails("inspect"))?;
    writeln!(out)?;
    writeln!(
        out,
        "The audit trail of what happened (phrony sessions inspect {session_id}):"
    )?;
    writeln!(out)?;
    crate::cmd::sessions::write_inspection(&inspection, false, out)?;
    Ok(())
}
