//! The interactive client: `phrony run --attach` and `phrony sessions attach ID`.
//!
//! Both open a `RunSessionInteractive` stream (the operator, `PHRONY_ACTOR`, travels with it
//! and every decision sent on it is attributed to them) and show the session with one of two
//! renderers, fed by the same view-model ([`view::View`]):
//!
//! - the **TUI** ([`tui`], ratatui + crossterm) when stdin and stdout are terminals, `--no-tui`
//!   is not given and `PHRONY_NO_TUI` is unset or empty;
//! - the **plain renderer** ([`plain`]) otherwise: streamed text on stdout, `── … ──` status
//!   lines and the `> ` prompt on stderr, `/approve`, `/deny`, `/complete`, `/cancel`,
//!   `/detach` commands on stdin.
//!
//! Leaving the viewer (Ctrl+C, the menu's Detach, `/detach`, end of stdin) only detaches: the
//! session keeps running on the runtime. Model and tool text is stripped of control characters
//! before it is drawn or printed ([`sanitize`]).

pub(crate) mod plain;
#[cfg(test)]
mod testing;
pub(crate) mod tui;
pub(crate) mod view;

use std::io::IsTerminal as _;

use anyhow::bail;
use phrony_client::Client;
use phrony_client::interactive::{
    InteractiveEvents, InteractiveSender, InteractiveSession, SessionEvent,
};

use crate::cmd::{Global, remote};
use view::{Action, Phase, View};

/// The keys and commands, for `--help`.
const KEYS: &str = "\
TUI keys (when stdin and stdout are terminals):
  Enter           send the typed message (queued if a turn is running)
  a / d           approve / deny the pending approval; each asks for an optional comment
                  (Enter sends, Esc cancels); approving may first ask y/n to acknowledge
                  you understood the call
  e               edit the arguments as JSON, then approve (Ctrl+S applies, Esc cancels)
  Tab             move the focus between the input box and the transcript; a, d, e and G
                  act only while the input box is empty or not focused
  PgUp/PgDn/↑/↓   scroll (j/k with the transcript focused); End or G follows the tail
  Ctrl+P          menu: complete, cancel or detach from the session
  Ctrl+C          detach; the session keeps running
Plain renderer (no terminal, --no-tui, or PHRONY_NO_TUI set): each stdin line is a message, or
/approve [comment], /deny [comment], /complete, /cancel, /detach; end of input detaches once
the session waits for input.";

/// Arguments of `phrony sessions attach`.
#[derive(Debug, clap::Args)]
#[command(after_help = KEYS)]
pub(crate) struct Args {
    /// The session id (`run_…`).
    session_id: String,
    /// Use the plain line-oriented renderer even on a terminal (also: PHRONY_NO_TUI=1).
    #[arg(long)]
    no_tui: bool,
}

/// How a viewer ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The operator left; the session keeps running (or had already ended, see `phase`).
    Detached {
        /// Where the session stood.
        phase: Phase,
        /// The failure message, when it failed.
        failure: Option<String>,
    },
    /// The stream broke before the session ended.
    Lost(String),
    /// The operator opened this child session (a delegation's) from the viewer.
    Open(String),
}

/// `phrony sessions attach ID`: attaches to an existing session.
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    let id = crate::cmd::sessions::session_id(&args.session_id)?;
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let outcome = attach(&client, id, args.no_tui).await?;
        finish(id, &outcome, false)
    })
}

/// `phrony run --attach`: attaches to the session just started; fails (exit 1) when the
/// session fails.
pub(crate) async fn run_attached(
    client: &Client,
    session_id: &str,
    no_tui: bool,
) -> anyhow::Result<()> {
    let outcome = attach(client, session_id, no_tui).await?;
    finish(session_id, &outcome, true)
}

/// Views `session_id` until the operator leaves it; a child session opened from the viewer is
/// viewed in turn, and leaving it returns to its parent's view.
async fn attach(client: &Client, session_id: &str, no_tui: bool) -> anyhow::Result<Outcome> {
    let mut stack = vec![session_id.to_owned()];
    loop {
        let current = stack.last().map_or(session_id, String::as_str);
        match attach_one(client, current, no_tui).await? {
            Outcome::Open(child) if stack.len() < MAX_OPEN_CHILDREN => stack.push(child),
            Outcome::Open(_) => {}
            _ if stack.len() > 1 => {
                stack.pop();
            }
            outcome => return Ok(outcome),
        }
    }
}

/// How deep the viewer follows delegations (parent → child → …) before it stops opening more.
const MAX_OPEN_CHILDREN: usize = 16;

/// Opens the stream to `session_id` and runs the chosen renderer until the operator leaves or
/// the session ends.
async fn attach_one(client: &Client, session_id: &str, no_tui: bool) -> anyhow::Result<Outcome> {
    let actor = remote::actor(client.sends_credential())?;
    let session = client
        .attach(session_id, &actor)
        .await
        .map_err(remote::fails("attach"))?;
    let agent = agent_label(client, session_id).await;
    let link = RemoteLink::new(client, session, actor);
    if use_tui(no_tui, |name| std::env::var(name).ok()) {
        tui::run(link, View::new(agent)).await
    } else {
        plain::run_stdio(link, View::new(agent)).await
    }
}

/// What to print (and whether to fail) once the viewer ended.
fn finish(session_id: &str, outcome: &Outcome, fail_on_failure: bool) -> anyhow::Result<()> {
    match outcome {
        Outcome::Lost(reason) => bail!("lost the stream of session {session_id}: {reason}"),
        // `attach` follows an opened child itself; this never reaches here.
        Outcome::Open(_) => Ok(()),
        Outcome::Detached {
            phase: Phase::Failed,
            failure,
        } if fail_on_failure => bail!(
            "session failed: {}",
            failure.as_deref().unwrap_or("no reason given")
        ),
        Outcome::Detached { phase, .. } if phase.is_terminal() => Ok(()),
        Outcome::Detached { .. } => {
            eprintln!(
                "detached from session {session_id}; it keeps running \
                 (reattach with: phrony sessions attach {session_id})"
            );
            Ok(())
        }
    }
}

/// `namespace/name@version` of the session's agent, when the runtime can say (best effort: the
/// header shows the agent version id otherwise).
async fn agent_label(client: &Client, session_id: &str) -> Option<String> {
    let inspection = client.inspect_session(session_id).await.ok()?;
    inspection
        .session
        .agent
        .map(|agent| agent.agent.to_string())
}

/// The TUI when stdin and stdout are terminals and neither `--no-tui` nor `PHRONY_NO_TUI` asks
/// for the plain renderer.
pub(crate) fn use_tui(no_tui: bool, env: impl Fn(&str) -> Option<String>) -> bool {
    let env_says_no = env("PHRONY_NO_TUI").is_some_and(|v| !v.trim().is_empty());
    !no_tui && !env_says_no && std::io::stdin().is_terminal() && std::io::stdout().is_terminal()
}

/// A step of a scripted operator (`phrony demo`), taken by a renderer as if typed.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Directed {
    /// A narration line (a status line; the TUI's hint).
    Note(String),
    /// An action, performed on the session and shown as the operator's.
    Act(Action),
}

/// The renderers' connection to the session: its events in, the operator's actions out.
pub(crate) trait Link {
    /// The next event; `Ok(None)` when the runtime ended the stream.
    async fn next(&mut self) -> Result<Option<SessionEvent>, String>;
    /// Performs an action other than [`Action::Detach`].
    async fn perform(&mut self, action: &Action) -> Result<(), String>;
}

/// The real link: the interactive stream plus the unary Complete/Cancel RPCs.
pub(crate) struct RemoteLink<'a> {
    client: &'a Client,
    session_id: String,
    actor: String,
    sender: InteractiveSender,
    events: InteractiveEvents,
    /// The first event (session_started), handed out by the first `next`.
    started: Option<SessionEvent>,
}

impl<'a> RemoteLink<'a> {
    pub(crate) fn new(client: &'a Client, session: InteractiveSession, actor: String) -> Self {
        let started = SessionEvent::Started(session.started().clone());
        let session_id = session.started().session_id.clone();
        let (sender, events) = session.split();
        Self {
            client,
            session_id,
            actor,
            sender,
            events,
            started: Some(started),
        }
    }
}

impl Link for RemoteLink<'_> {
    async fn next(&mut self) -> Result<Option<SessionEvent>, String> {
        if let Some(started) = self.started.take() {
            return Ok(Some(started));
        }
        self.events.next().await.map_err(|e| e.to_string())
    }

    async fn perform(&mut self, action: &Action) -> Result<(), String> {
        match action {
            Action::Send(text) => self
                .sender
                .send_user_message(text)
                .await
                .map_err(|e| e.to_string()),
            Action::Decide(decision) => self
                .sender
                .decide(decision.clone())
                .await
                .map_err(|e| e.to_string()),
            Action::Complete => self
                .client
                .complete_session(&self.session_id, &self.actor)
                .await
                .map_err(|e| format!("complete: {e}")),
            Action::Cancel => self
                .client
                .cancel_session(&self.session_id, &self.actor)
                .await
                .map_err(|e| format!("cancel: {e}")),
            Action::Detach | Action::Open(_) => Ok(()),
        }
    }
}

/// Text from the model, tools or the runtime made safe to draw: escape sequences (CSI, OSC)
/// and unprintable characters ([`phrony_client::is_unprintable`]: controls, bidirectional
/// overrides, zero-width and separator characters) removed, tabs expanded, `\r\n` and lone `\r` read as line breaks.
pub(crate) fn sanitize(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\n' => out.push('\n'),
            '\t' => out.push_str("    "),
            '\r' => {
                if chars.peek() != Some(&'\n') {
                    out.push('\n');
                }
            }
            '\u{1b}' => match chars.peek() {
                // CSI: ESC [ parameters… final byte (0x40–0x7e).
                Some('[') => {
                    chars.next();
                    for c in chars.by_ref() {
                        if ('\u{40}'..='\u{7e}').contains(&c) {
                            break;
                        }
                    }
                }
                // OSC: ESC ] … terminated by BEL or ESC \.
                Some(']') => {
                    chars.next();
                    while let Some(c) = chars.next() {
                        if c == '\u{7}' {
                            break;
                        }
                        if c == '\u{1b}' {
                            if chars.peek() == Some(&'\\') {
                                chars.next();
                            }
                            break;
                        }
                    }
                }
                // Any other escape: drop ESC and the next character.
                Some(_) => {
                    chars.next();
                }
                None => {}
            },
            c if phrony_client::is_unprintable(c) => {}
            c => out.push(c),
        }
    }
    out
}

/// JSON text pretty-printed (two-space indent); other text unchanged.
pub(crate) fn pretty_json(text: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(value) => serde_json::to_string_pretty(&value).unwrap_or_else(|_| text.to_owned()),
        Err(_) => text.to_owned(),
    }
}

/// JSON text on one line (compact); other text unchanged.
pub(crate) fn compact_json(text: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(value) => value.to_string(),
        Err(_) => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_and_escape_sequences_are_stripped() {
        assert_eq!(
            sanitize("\u{1b}[31mred\u{1b}[0m text\u{7}\u{0}"),
            "red text"
        );
        assert_eq!(
            sanitize("a\u{1b}]0;evil title\u{7}b\u{1b}]8;;http://x\u{1b}\\c"),
            "abc"
        );
        assert_eq!(
            sanitize("line\r\nnext\rover\ttab"),
            "line\nnext\nover    tab"
        );
        assert_eq!(sanitize("C1\u{9b}2J ok"), "C12J ok");
        assert_eq!(sanitize("€400 — ünïcode ✓"), "€400 — ünïcode ✓");
    }

    #[test]
    fn json_is_pretty_printed_or_left_alone() {
        assert_eq!(pretty_json(r#"{"a":1}"#), "{\n  \"a\": 1\n}");
        assert_eq!(pretty_json("not json"), "not json");
        assert_eq!(compact_json("{ \"a\" : 1 }"), r#"{"a":1}"#);
    }

    #[test]
    fn the_tui_is_off_when_asked() {
        let unset = |_: &str| None;
        let set = |_: &str| Some("1".to_owned());
        let empty = |_: &str| Some(String::new());
        assert!(!use_tui(true, unset), "--no-tui");
        assert!(!use_tui(false, set), "PHRONY_NO_TUI=1");
        // Under `cargo test` stdin/stdout are not both terminals: plain either way.
        assert!(!use_tui(false, empty) || std::io::stdout().is_terminal());
    }

    #[test]
    fn finishing_fails_only_for_a_failed_run() {
        let failed = Outcome::Detached {
            phase: Phase::Failed,
            failure: Some("boom".into()),
        };
        let err = finish("run_1", &failed, true).unwrap_err();
        assert_eq!(err.to_string(), "session failed: boom");
        assert!(
            finish("run_1", &failed, false).is_ok(),
            "attach only shows it"
        );
        let done = Outcome::Detached {
            phase: Phase::Finished,
            failure: None,
        };
        assert!(finish("run_1", &done, true).is_ok());
        let lost = Outcome::Lost("connection reset".into());
        assert!(finish("run_1", &lost, false).is_err());
    }
}
