//! The attach view-model: a state machine fed by the session's events and the operator's key
//! presses, independent of any terminal. [`View::apply`] folds a [`SessionEvent`] into the
//! transcript and the status; [`View::key`] turns a [`Key`] into at most one [`Action`] for the
//! event loop to perform (send a message, decide an approval, complete, cancel, detach).
//!
//! # Focus
//!
//! The input box has the focus by default: what you type goes into it and Enter sends it. The
//! single-letter commands (`a` approve, `d` deny, `e` edit the arguments, `G` follow the tail;
//! on an outcome review `h` it happened, `f` fail, `s` send it again after a y/n confirmation)
//! act only while the input box is **empty**, so a message can contain any letter. Tab moves
//! the focus to the transcript, where every letter is a command (plus `j`/`k` to scroll) and
//! nothing is typed; Tab, Enter or Esc gives the focus back to the input box.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};

use chrono::{DateTime, Utc};
use phrony_client::OUTCOME_REVIEW;
use phrony_client::interactive::{
    ApprovalDecided, ApprovalRequired, ApprovalStatus, AwaitingInput, Decision, Role, SessionEvent,
    SessionStarted, SessionStats, ToolOutcome,
};

/// What `a`, `d` and `e` say on an outcome review.
pub(crate) const REVIEW_HINT: &str = "outcome unknown: h it happened · f fail, not re-sent · \
                                      s send it again (asks you to confirm)";

/// Where the session stands, as the status bar shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Waiting for the runtime to confirm the session.
    Connecting,
    /// A turn runs: the model streams, or a tool runs.
    Streaming,
    /// The turn ended; the session waits for a message.
    Ready,
    /// A tool call waits for a human decision.
    AwaitingApproval,
    /// A run limit was reached: input is blocked; the session can only be completed or
    /// cancelled.
    LimitReached,
    /// The session completed.
    Finished,
    /// The session failed.
    Failed,
    /// The session was cancelled.
    Cancelled,
}

impl Phase {
    /// The status bar's label.
    pub(crate) fn label(self) -> &'static str {
        match self {
            Self::Connecting => "Connecting",
            Self::Streaming => "Streaming",
            Self::Ready => "Ready",
            Self::AwaitingApproval => "Awaiting approval",
            Self::LimitReached => "Limit reached",
            Self::Finished => "Finished",
            Self::Failed => "Failed",
            Self::Cancelled => "Cancelled",
        }
    }

    /// True once the session runs no more.
    pub(crate) fn is_terminal(self) -> bool {
        matches!(self, Self::Finished | Self::Failed | Self::Cancelled)
    }
}

/// A key press, independent of the terminal library.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Key {
    /// A printable character.
    Char(char),
    /// Ctrl + a letter (lower case).
    Ctrl(char),
    Enter,
    Esc,
    Tab,
    Backspace,
    Delete,
    Left,
    Right,
    Up,
    Down,
    PageUp,
    PageDown,
    Home,
    End,
}

/// What the event loop must do after a key press.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Action {
    /// Send a user message.
    Send(String),
    /// Send a decision on the pending approval.
    Decide(Decision),
    /// End the session as completed (`CompleteSession`).
    Complete,
    /// End the session as cancelled (`CancelSession`).
    Cancel,
    /// Leave the viewer; the session keeps running.
    Detach,
    /// Switch the viewer to this child session (a delegation's); leaving it comes back here.
    Open(String),
}

/// How a notice reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tone {
    Good,
    Bad,
}

/// One labelled block of the transcript.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Block {
    /// A user message.
    User(String),
    /// Assistant text; `footer` summarises the turn it ended.
    Agent {
        text: String,
        footer: Option<String>,
    },
    /// The model asked for a tool.
    ToolCall {
        tool: String,
        args: String,
        delegation: Option<String>,
    },
    /// A tool's result.
    ToolResult { tool: String, payload: String },
    /// A tool's failure (or an approver's rejection).
    ToolFailed {
        tool: String,
        code: Option<String>,
        message: String,
    },
    /// A policy denied the call at dispatch.
    PolicyDenied {
        tool: String,
        policy_ref: Option<String>,
        reason: String,
    },
    /// A call waits for a human; `review` for an outcome review (did the call happen?).
    ApprovalRequired {
        tool: String,
        policy_ref: Option<String>,
        reason: Option<String>,
        review: bool,
    },
    /// An approval was decided, or received a vote.
    Decided(ApprovalDecided),
    /// A status line.
    Notice { text: String, tone: Tone },
}

/// The approval the session waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Pending {
    pub(crate) approval: ApprovalRequired,
    /// Set once this viewer sent a decision: approve (true) or deny.
    pub(crate) sent: Option<bool>,
}

/// Which part of the screen takes the letters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Focus {
    Input,
    Transcript,
}

/// A multi-line text editor (the arguments editor).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Editor {
    pub(crate) lines: Vec<String>,
    /// Cursor row and column (in characters).
    pub(crate) row: usize,
    pub(crate) col: usize,
}

impl Editor {
    pub(crate) fn new(text: &str) -> Self {
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        if lines.is_empty() {
            lines.push(String::new());
        }
        let row = lines.len() - 1;
        let col = lines[row].chars().count();
        Self { lines, row, col }
    }

    pub(crate) fn text(&self) -> String {
        self.lines.join("\n")
    }

    fn byte_at(line: &str, col: usize) -> usize {
        line.char_indices().nth(col).map_or(line.len(), |(i, _)| i)
    }

    fn width(&self, row: usize) -> usize {
        self.lines[row].chars().count()
    }

    fn key(&mut self, key: Key) {
        match key {
            Key::Char(c) => {
                let at = Self::byte_at(&self.lines[self.row], self.col);
                self.lines[self.row].insert(at, c);
                self.col += 1;
            }
            Key::Enter => {
                let at = Self::byte_at(&self.lines[self.row], self.col);
                let rest = self.lines[self.row].split_off(at);
                self.row += 1;
                self.lines.insert(self.row, rest);
                self.col = 0;
            }
            Key::Backspace => {
                if self.col > 0 {
                    let at = Self::byte_at(&self.lines[self.row], self.col - 1);
                    self.lines[self.row].remove(at);
                    self.col -= 1;
                } else if self.row > 0 {
                    let line = self.lines.remove(self.row);
                    self.row -= 1;
                    self.col = self.width(self.row);
                    self.lines[self.row].push_str(&line);
                }
            }
            Key::Delete => {
                if self.col < self.width(self.row) {
                    let at = Self::byte_at(&self.lines[self.row], self.col);
                    self.lines[self.row].remove(at);
                } else if self.row + 1 < self.lines.len() {
                    let next = self.lines.remove(self.row + 1);
                    self.lines[self.row].push_str(&next);
                }
            }
            Key::Left => {
                if self.col > 0 {
                    self.col -= 1;
                } else if self.row > 0 {
                    self.row -= 1;
                    self.col = self.width(self.row);
                }
            }
            Key::Right => {
                if self.col < self.width(self.row) {
                    self.col += 1;
                } else if self.row + 1 < self.lines.len() {
                    self.row += 1;
                    self.col = 0;
                }
            }
            Key::Up if self.row > 0 => {
                self.row -= 1;
                self.col = self.col.min(self.width(self.row));
            }
            Key::Down if self.row + 1 < self.lines.len() => {
                self.row += 1;
                self.col = self.col.min(self.width(self.row));
            }
            Key::Home => self.col = 0,
            Key::End => self.col = self.width(self.row),
            _ => {}
        }
    }
}

/// A modal prompt over the normal view.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Prompt {
    /// An optional comment for `decision` (typed into [`View::prompt_text`]).
    Comment(Decision),
    /// "Did you understand the call?" before an approve.
    Comprehension(Decision),
    /// "Did you check it did NOT happen?" before an outcome review's resend.
    ConfirmResend(Decision),
    /// Editing the arguments before an approve; `error` is the last validation failure.
    EditArgs {
        editor: Editor,
        error: Option<String>,
    },
    /// The action menu; `selected` indexes [`View::menu_items`].
    Menu { selected: usize },
}

/// An entry of the action menu.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MenuItem {
    Complete,
    Cancel,
    /// Open the `n`-th delegation's child session ([`View::children`]).
    OpenChild(usize),
    Detach,
    Close,
}

impl MenuItem {
    pub(crate) fn label(self, view: &View) -> String {
        match self {
            Self::Complete => "Complete session".to_owned(),
            Self::Cancel => "Cancel session".to_owned(),
            Self::OpenChild(i) => view
                .children
                .get(i)
                .map_or_else(String::new, |(target, id)| {
                    format!("Open child {target} ({id})")
                }),
            Self::Detach => "Detach (the session keeps running)".to_owned(),
            Self::Close => "Close viewer".to_owned(),
        }
    }
}

/// The scroll position of the transcript.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Scroll {
    /// Show the latest lines as they arrive.
    Follow,
    /// Keep this line at the top.
    Top(usize),
}

/// The transcript's size as last drawn: total wrapped lines and visible rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Geometry {
    pub(crate) total: usize,
    pub(crate) height: usize,
}

/// Everything the attach views show.
#[derive(Debug)]
pub(crate) struct View {
    pub(crate) session_id: String,
    /// `namespace/name@version`, when known.
    pub(crate) agent: Option<String>,
    pub(crate) agent_version_id: String,
    pub(crate) model: String,
    pub(crate) blocks: Vec<Block>,
    /// The last block is assistant text still streaming.
    streaming: bool,
    pub(crate) phase: Phase,
    /// Why input is blocked (a limit's message).
    pub(crate) blocked_reason: Option<String>,
    pub(crate) failure: Option<String>,
    pub(crate) turn: u32,
    pub(crate) tokens: u64,
    pub(crate) max_tokens: Option<u64>,
    pub(crate) started_at: Option<DateTime<Utc>>,
    pub(crate) ended_at: Option<DateTime<Utc>>,
    pub(crate) max_wall_clock: Option<u64>,
    pub(crate) pending: Option<Pending>,
    pub(crate) input: String,
    pub(crate) prompt: Option<Prompt>,
    pub(crate) prompt_text: String,
    pub(crate) focus: Focus,
    /// A one-line message for the operator (a hint or an error).
    pub(crate) hint: Option<String>,
    pub(crate) scroll: Scroll,
    pub(crate) geometry: Cell<Geometry>,
    /// The runtime ended the stream.
    pub(crate) stream_closed: bool,
    /// The status of the last `status` message.
    last_status: Option<String>,
    tools: HashMap<String, String>,
    approvals_seen: HashSet<String>,
    /// The child sessions of the session's delegations, in call order: (target, session id).
    pub(crate) children: Vec<(String, String)>,
}

/// What an empty Enter says.
const EMPTY_MESSAGE_HINT: &str = "type a message, or Ctrl+P for the session menu";

impl View {
    /// A view waiting for the session (agent `ns/name@version` when already known).
    pub(crate) fn new(agent: Option<String>) -> Self {
        Self {
            session_id: String::new(),
            agent,
            agent_version_id: String::new(),
            model: String::new(),
            blocks: Vec::new(),
            streaming: false,
            phase: Phase::Connecting,
            blocked_reason: None,
            failure: None,
            turn: 0,
            tokens: 0,
            max_tokens: None,
            started_at: None,
            ended_at: None,
            max_wall_clock: None,
            pending: None,
            input: String::new(),
            prompt: None,
            prompt_text: String::new(),
            focus: Focus::Input,
            hint: None,
            scroll: Scroll::Follow,
            geometry: Cell::new(Geometry::default()),
            stream_closed: false,
            last_status: None,
            tools: HashMap::new(),
            approvals_seen: HashSet::new(),
            children: Vec::new(),
        }
    }

    /// The tool label (`tool@version`) of a call seen on the stream.
    pub(crate) fn tool_of(&self, call_id: &str) -> String {
        self.tools
            .get(call_id)
            .cloned()
            .unwrap_or_else(|| format!("call {call_id}"))
    }

    fn notice(&mut self, text: impl Into<String>, tone: Tone) {
        self.blocks.push(Block::Notice {
            text: text.into(),
            tone,
        });
    }

    fn end(&mut self, phase: Phase, at: Option<DateTime<Utc>>, now: DateTime<Utc>) {
        self.phase = phase;
        self.ended_at = Some(at.unwrap_or(now));
        self.pending = None;
        self.close_decision_prompt();
    }

    /// Closes a prompt about the pending approval (comment, acknowledgement, argument edit);
    /// true when one was open.
    fn close_decision_prompt(&mut self) -> bool {
        let open = matches!(
            self.prompt,
            Some(Prompt::Comment(_) | Prompt::Comprehension(_) | Prompt::EditArgs { .. })
        );
        if open {
            self.prompt = None;
            self.prompt_text.clear();
        }
        open
    }

    fn stats(&mut self, stats: &SessionStats) {
        if stats.turn > 0 {
            self.turn = stats.turn;
        }
        if let Some(usage) = stats.session_usage {
            self.tokens = usage.total;
        }
    }

    /// Folds one event of the session into the view.
    pub(crate) fn apply(&mut self, event: SessionEvent, now: DateTime<Utc>) {
        let delta = matches!(event, SessionEvent::TextDelta(_));
        if !delta {
            self.streaming = false;
        }
        match event {
            SessionEvent::Started(started) => self.started(started),
            SessionEvent::TextDelta(text) => {
                if text.is_empty() {
                    return;
                }
                if !self.phase.is_terminal() {
                    self.phase = Phase::Streaming;
                }
                match self.blocks.last_mut() {
                    Some(Block::Agent { text: open, .. }) if self.streaming => {
                        open.push_str(&text);
                    }
                    _ => self.blocks.push(Block::Agent { text, footer: None }),
                }
                self.streaming = true;
            }
            SessionEvent::ToolCall(call) => {
                let tool = format!("{}@{}", call.tool, call.version);
                self.tools.insert(call.call_id, tool.clone());
                if let Some(d) = &call.delegation
                    && !self
                        .children
                        .iter()
                        .any(|(_, id)| id == &d.child_session_id)
                {
                    self.children
                        .push((d.target.clone(), d.child_session_id.clone()));
                }
                self.blocks.push(Block::ToolCall {
                    tool,
                    args: call.args,
                    delegation: call.delegation.map(|d| {
                        format!("delegates to {} (session {})", d.target, d.child_session_id)
                    }),
                });
                if !self.phase.is_terminal() {
                    self.phase = Phase::Streaming;
                }
            }
            SessionEvent::ToolResult(result) => {
                let tool = self.tool_of(&result.call_id);
                let denied = result.outcome.is_policy_denial();
                self.blocks.push(match result.outcome {
                    ToolOutcome::Succeeded { payload } => Block::ToolResult { tool, payload },
                    ToolOutcome::Failed {
                        message,
                        policy_ref,
                        ..
                    } if denied => Block::PolicyDenied {
                        tool,
                        policy_ref,
                        reason: message,
                    },
                    ToolOutcome::Failed { code, message, .. } => Block::ToolFailed {
                        tool,
                        code,
                        message,
                    },
                });
                if self
                    .pending
                    .as_ref()
                    .is_some_and(|p| p.approval.call_id == result.call_id)
                {
                    self.pending = None;
                }
            }
            SessionEvent::ApprovalRequired(approval) => {
                let tool = format!("{}@{}", approval.tool, approval.version);
                self.tools.insert(approval.call_id.clone(), tool.clone());
                if self.approvals_seen.insert(approval.approval_id.clone()) {
                    self.blocks.push(Block::ApprovalRequired {
                        tool,
                        policy_ref: approval.policy_ref.clone(),
                        reason: approval.reason.clone(),
                        review: approval.kind == OUTCOME_REVIEW,
                    });
                }
                let sent = self
                    .pending
                    .as_ref()
                    .filter(|p| p.approval.approval_id == approval.approval_id)
                    .and_then(|p| p.sent);
                self.pending = Some(Pending { approval, sent });
                if !self.phase.is_terminal() {
                    self.phase = Phase::AwaitingApproval;
                }
            }
            SessionEvent::ApprovalDecided(decided) => self.decided(decided),
            SessionEvent::Status(status) => {
                if let Some(reason) = &status.reason {
                    // Why the status changed, or why the runtime refused something sent on
                    // the stream: it then repeats the status it last sent, which a change
                    // never does (no status changes to itself). A vote of ours followed by a
                    // repeated `awaiting_approval` with a reason was refused: show it, and let
                    // the operator decide again. The change *into* `awaiting_approval` can
                    // arrive after the approval it opened, and after a vote sent on it.
                    let repeated = self.last_status.as_deref() == Some(status.status.as_str());
                    let refused_vote = repeated
                        && status.status == "awaiting_approval"
                        && self.pending.as_ref().is_some_and(|p| p.sent.is_some());
                    if refused_vote {
                        if let Some(pending) = self.pending.as_mut() {
                            pending.sent = None;
                        }
                        self.notice(
                            format!("The runtime refused the decision: {reason}"),
                            Tone::Bad,
                        );
                    }
                    // A reason with an unchanged status answers something sent on the stream
                    // (e.g. a refused message); reasons of real changes are not news here.
                    if repeated {
                        self.hint = Some(format!("runtime: {reason}"));
                    }
                }
                self.last_status = Some(status.status.clone());
                if self.phase.is_terminal() {
                    return;
                }
                self.phase = match status.status.as_str() {
                    "awaiting_approval" => Phase::AwaitingApproval,
                    "awaiting_input" if self.blocked_reason.is_some() => Phase::LimitReached,
                    "awaiting_input" => Phase::Ready,
                    // Terminal statuses are shown when their own event arrives.
                    "completed" | "failed" | "cancelled" => self.phase,
                    _ => Phase::Streaming,
                };
            }
            SessionEvent::AwaitingInput(awaiting) => self.awaiting(awaiting),
            SessionEvent::Completed(completed) => {
                self.stats(&completed.stats);
                self.end(Phase::Finished, completed.ended_at, now);
                self.notice("Session completed", Tone::Good);
            }
            SessionEvent::Failed { message } => {
                self.end(Phase::Failed, None, now);
                self.notice(format!("Session failed: {message}"), Tone::Bad);
                self.failure = Some(message);
            }
            SessionEvent::Cancelled { ended_at } => {
                self.end(Phase::Cancelled, ended_at, now);
                self.notice("Session cancelled", Tone::Bad);
            }
        }
    }

    fn started(&mut self, started: SessionStarted) {
        self.session_id = started.session_id;
        self.agent_version_id = started.agent_version_id;
        self.model = model_label(&started.model_provider, &started.model_name);
        self.max_tokens = started.max_tokens_per_run;
        self.max_wall_clock = started.max_wall_clock_seconds;
        self.started_at = started.started_at;
        let mut tokens = 0;
        for entry in started.history {
            match entry.role {
                Role::User => self.blocks.push(Block::User(entry.content)),
                Role::Assistant | Role::Other(_) => {
                    if let Some(usage) = entry.turn_usage {
                        tokens += usage.total;
                    }
                    let footer = entry.stop_reason.map(|reason| {
                        let mut footer = reason;
                        if let Some(usage) = entry.turn_usage {
                            footer.push_str(&format!(" · {} tokens", usage.total));
                        }
                        if let Some(ms) = entry.turn_duration_ms {
                            footer.push_str(&format!(" · {:.1}s", ms as f64 / 1000.0));
                        }
                        footer
                    });
                    self.blocks.push(Block::Agent {
                        text: entry.content,
                        footer,
                    });
                }
            }
        }
        self.tokens = tokens;
        if started.ended_at.is_some() {
            self.ended_at = started.ended_at;
        }
        // Until the runtime says where the session stands, a turn is assumed to run.
        self.phase = Phase::Streaming;
    }

    fn decided(&mut self, decided: ApprovalDecided) {
        let ours = self
            .pending
            .as_ref()
            .is_some_and(|p| p.approval.approval_id == decided.approval_id);
        if decided.status == ApprovalStatus::Pending {
            if let Some(pending) = self.pending.as_mut().filter(|_| ours) {
                pending.approval.approvals_received = decided.approvals_received;
            }
        } else if ours {
            self.pending = None;
            if self.close_decision_prompt() {
                self.hint = Some("the approval was decided elsewhere".to_owned());
            }
            if !self.phase.is_terminal() {
                self.phase = Phase::Streaming;
            }
        }
        self.blocks.push(Block::Decided(decided));
    }

    fn awaiting(&mut self, awaiting: AwaitingInput) {
        self.stats(&awaiting.stats);
        if let (Some(reason), Some(Block::Agent { footer, .. })) =
            (awaiting.stop_reason.as_ref(), self.blocks.last_mut())
        {
            let mut text = format!("turn {}", self.turn);
            text.push_str(&format!(" · {reason}"));
            if let Some(usage) = awaiting.stats.turn_usage {
                text.push_str(&format!(" · {} tokens", usage.total));
            }
            *footer = Some(text);
        }
        if self.phase.is_terminal() {
            return;
        }
        match awaiting.input_blocked_reason.as_deref() {
            None => {
                self.blocked_reason = None;
                self.phase = Phase::Ready;
            }
            Some("awaiting_approval") => self.phase = Phase::AwaitingApproval,
            Some("awaiting_tool") => self.phase = Phase::Streaming,
            Some(reason) => {
                if self.blocked_reason.as_deref() != Some(reason) {
                    self.notice(
                        format!(
                            "Limit reached: {reason}. Input is blocked; complete or cancel the \
                             session (Ctrl+P)."
                        ),
                        Tone::Bad,
                    );
                }
                self.blocked_reason = Some(reason.to_owned());
                self.phase = Phase::LimitReached;
            }
        }
    }

    /// The runtime ended the stream (after a terminal event, or on its own).
    pub(crate) fn closed(&mut self, error: Option<String>) {
        self.stream_closed = true;
        self.streaming = false;
        match error {
            Some(error) => self.notice(format!("Lost the session stream: {error}"), Tone::Bad),
            None if !self.phase.is_terminal() => {
                self.notice("The runtime closed the stream", Tone::Bad);
            }
            None => {}
        }
    }

    /// Records that a message was sent.
    pub(crate) fn sent_message(&mut self, text: String) {
        self.blocks.push(Block::User(text));
        self.scroll = Scroll::Follow;
    }

    /// Wall-clock time left, in seconds (frozen once the session ended); `None` without a
    /// budget.
    pub(crate) fn wall_clock_left(&self, now: DateTime<Utc>) -> Option<i64> {
        let budget = i64::try_from(self.max_wall_clock?).ok()?;
        let started = self.started_at?;
        let until = self.ended_at.unwrap_or(now);
        Some(budget - (until - started).num_seconds())
    }

    /// The entries of the action menu.
    pub(crate) fn menu_items(&self) -> Vec<MenuItem> {
        // The latest delegation first: its child is the one most likely waiting for a human.
        let children = (0..self.children.len()).rev().map(MenuItem::OpenChild);
        if self.ended() {
            children.chain([MenuItem::Close]).collect()
        } else {
            [MenuItem::Complete, MenuItem::Cancel]
                .into_iter()
                .chain(children)
                .chain([MenuItem::Detach])
                .collect()
        }
    }

    /// True while the last block is assistant text still streaming.
    pub(crate) fn is_streaming(&self) -> bool {
        self.streaming
    }

    /// True once nothing more can happen on this stream.
    pub(crate) fn ended(&self) -> bool {
        self.phase.is_terminal() || self.stream_closed
    }

    /// Whether the letter commands act (the input box is empty or not focused).
    fn commands_active(&self) -> bool {
        self.focus == Focus::Transcript || self.input.is_empty()
    }

    fn can_decide(&self) -> bool {
        self.pending.as_ref().is_some_and(|p| p.sent.is_none()) && !self.phase.is_terminal()
    }

    /// Turns a key press into at most one action.
    pub(crate) fn key(&mut self, key: Key) -> Option<Action> {
        if key == Key::Ctrl('c') {
            return Some(Action::Detach);
        }
        if let Some(prompt) = self.prompt.take() {
            return self.prompt_key(prompt, key);
        }
        self.hint = None;
        if key == Key::Ctrl('p') {
            self.prompt = Some(Prompt::Menu { selected: 0 });
            return None;
        }
        match key {
            Key::PageUp => self.scroll_by(-(self.page() as isize)),
            Key::PageDown => self.scroll_by(self.page() as isize),
            Key::Up => self.scroll_by(-1),
            Key::Down => self.scroll_by(1),
            Key::End => self.scroll = Scroll::Follow,
            Key::Tab => {
                self.focus = match self.focus {
                    Focus::Input => Focus::Transcript,
                    Focus::Transcript => Focus::Input,
                };
            }
            Key::Esc if self.focus == Focus::Transcript => self.focus = Focus::Input,
            Key::Char('q') if self.commands_active() && self.ended() => {
                return Some(Action::Detach);
            }
            Key::Char(c) if self.commands_active() && self.command(c) => {}
            Key::Char(c) if self.focus == Focus::Input => self.input.push(c),
            Key::Backspace if self.focus == Focus::Input => {
                self.input.pop();
            }
            Key::Enter if self.focus == Focus::Transcript => self.focus = Focus::Input,
            Key::Enter => return self.submit(),
            _ => {}
        }
        None
    }

    /// A letter command; false when `c` is not one here (it is then typed, if the input box
    /// has the focus).
    fn command(&mut self, c: char) -> bool {
        let transcript = self.focus == Focus::Transcript;
        if self.can_decide() && self.reviewing() {
            // An outcome review: its own keys; approve, deny and edit do not apply.
            match c {
                'h' | 'f' => {
                    let resolution = if c == 'h' { "happened" } else { "fail" };
                    self.prompt = Some(Prompt::Comment(Decision::resolve(resolution)));
                    self.prompt_text.clear();
                    return true;
                }
                's' => {
                    self.prompt = Some(Prompt::ConfirmResend(Decision::resolve("resend")));
                    return true;
                }
                'a' | 'd' | 'e' => {
                    self.hint = Some(REVIEW_HINT.to_owned());
                    return true;
                }
                _ => {}
            }
        }
        match c {
            'a' if self.can_decide() => self.ask_comprehension_or_comment(Decision::approve()),
            'd' if self.can_decide() => {
                self.prompt = Some(Prompt::Comment(Decision::deny()));
                self.prompt_text.clear();
            }
            'e' if self.can_decide() => {
                let args = self
                    .pending
                    .as_ref()
                    .map(|p| super::pretty_json(&p.approval.args))
                    .unwrap_or_default();
                self.prompt = Some(Prompt::EditArgs {
                    editor: Editor::new(&args),
                    error: None,
                });
            }
            'G' => self.scroll = Scroll::Follow,
            'g' if transcript => self.scroll = Scroll::Top(0),
            'j' if transcript => self.scroll_by(1),
            'k' if transcript => self.scroll_by(-1),
            _ => return transcript,
        }
        true
    }

    /// Whether the pending approval is an outcome review.
    pub(crate) fn reviewing(&self) -> bool {
        self.pending
            .as_ref()
            .is_some_and(|p| p.approval.kind == OUTCOME_REVIEW)
    }

    fn ask_comprehension_or_comment(&mut self, decision: Decision) {
        let required = self
            .pending
            .as_ref()
            .is_some_and(|p| p.approval.comprehension_required);
        self.prompt_text.clear();
        self.prompt = Some(if decision.approve && required {
            Prompt::Comprehension(decision)
        } else {
            Prompt::Comment(decision)
        });
    }

    fn submit(&mut self) -> Option<Action> {
        let text = self.input.trim().to_owned();
        if text.is_empty() {
            self.hint = Some(EMPTY_MESSAGE_HINT.to_owned());
            return None;
        }
        if self.ended() {
            self.hint = Some("the session has ended; q or Ctrl+C leaves the viewer".to_owned());
            return None;
        }
        if self.phase == Phase::LimitReached {
            self.hint = Some(
                "input is blocked by a run limit; Ctrl+P to complete or cancel the session"
                    .to_owned(),
            );
            return None;
        }
        self.input.clear();
        if matches!(self.phase, Phase::Streaming | Phase::AwaitingApproval) {
            self.hint = Some("queued: it runs when the current turn ends".to_owned());
        }
        Some(Action::Send(text))
    }

    fn prompt_key(&mut self, prompt: Prompt, key: Key) -> Option<Action> {
        match prompt {
            Prompt::Comment(decision) => match key {
                Key::Esc => {
                    self.prompt_text.clear();
                    self.hint = Some("decision cancelled".to_owned());
                }
                Key::Enter => {
                    let comment = std::mem::take(&mut self.prompt_text).trim().to_owned();
                    if let Some(pending) = self.pending.as_mut() {
                        pending.sent = Some(decision.approve);
                    }
                    let decision = match self.pending.as_ref() {
                        Some(p) => decision.for_approval(p.approval.approval_id.clone()),
                        None => decision,
                    };
                    return Some(Action::Decide(decision.with_comment(comment)));
                }
                Key::Backspace => {
                    self.prompt_text.pop();
                    self.prompt = Some(Prompt::Comment(decision));
                }
                Key::Char(c) => {
                    self.prompt_text.push(c);
                    self.prompt = Some(Prompt::Comment(decision));
                }
                _ => self.prompt = Some(Prompt::Comment(decision)),
            },
            Prompt::ConfirmResend(decision) => match key {
                Key::Char('y' | 'Y') => {
                    self.prompt_text.clear();
                    self.prompt = Some(Prompt::Comment(decision));
                }
                Key::Char('n' | 'N') | Key::Esc => {
                    self.hint = Some("not re-sent".to_owned());
                }
                _ => self.prompt = Some(Prompt::ConfirmResend(decision)),
            },
            Prompt::Comprehension(decision) => match key {
                Key::Char('y' | 'Y') => {
                    self.prompt_text.clear();
                    self.prompt = Some(Prompt::Comment(decision.with_comprehension(true)));
                }
                Key::Char('n' | 'N') | Key::Esc => {
                    self.hint = Some(
                        "not approved: this approval needs your acknowledgement that you \
                         understood the call"
                            .to_owned(),
                    );
                }
                _ => self.prompt = Some(Prompt::Comprehension(decision)),
            },
            Prompt::EditArgs { mut editor, error } => match key {
                Key::Esc => self.hint = Some("edit cancelled".to_owned()),
                Key::Ctrl('s') => match validate_args(&editor.text()) {
                    Ok(args) => {
                        self.ask_comprehension_or_comment(Decision::approve().with_args(args));
                    }
                    Err(error) => {
                        self.prompt = Some(Prompt::EditArgs {
                            editor,
                            error: Some(error),
                        });
                    }
                },
                other => {
                    editor.key(other);
                    self.prompt = Some(Prompt::EditArgs { editor, error });
                }
            },
            Prompt::Menu { selected } => {
                let items = self.menu_items();
                let last = items.len().saturating_sub(1);
                match key {
                    Key::Esc | Key::Ctrl('p') | Key::Char('q') => {}
                    Key::Up | Key::Char('k') => {
                        self.prompt = Some(Prompt::Menu {
                            selected: selected.saturating_sub(1),
                        });
                    }
                    Key::Down | Key::Char('j') | Key::Tab => {
                        self.prompt = Some(Prompt::Menu {
                            selected: (selected + 1).min(last),
                        });
                    }
                    Key::Enter => {
                        return match items.get(selected) {
                            Some(MenuItem::Complete) => Some(Action::Complete),
                            Some(MenuItem::Cancel) => Some(Action::Cancel),
                            Some(MenuItem::OpenChild(i)) => self
                                .children
                                .get(*i)
                                .map(|(_, id)| Action::Open(id.clone())),
                            Some(MenuItem::Detach | MenuItem::Close) => Some(Action::Detach),
                            None => None,
                        };
                    }
                    _ => self.prompt = Some(Prompt::Menu { selected }),
                }
            }
        }
        None
    }

    fn page(&self) -> usize {
        self.geometry.get().height.saturating_sub(1).max(1)
    }

    fn scroll_by(&mut self, delta: isize) {
        let Geometry { total, height } = self.geometry.get();
        let bottom = total.saturating_sub(height);
        let top = match self.scroll {
            Scroll::Follow => bottom,
            Scroll::Top(top) => top.min(bottom),
        };
        let next = top.saturating_add_signed(delta).min(bottom);
        self.scroll = if next >= bottom {
            Scroll::Follow
        } else {
            Scroll::Top(next)
        };
    }

    /// The first visible transcript line for `total` lines in `height` rows (records the
    /// geometry for scrolling).
    pub(crate) fn top_line(&self, total: usize, height: usize) -> usize {
        self.geometry.set(Geometry { total, height });
        let bottom = total.saturating_sub(height);
        match self.scroll {
            Scroll::Follow => bottom,
            Scroll::Top(top) => top.min(bottom),
        }
    }
}

/// `provider/name`, or whichever of the two the runtime sent.
pub(crate) fn model_label(provider: &str, name: &str) -> String {
    match (provider.is_empty(), name.is_empty()) {
        (false, false) => format!("{provider}/{name}"),
        (false, true) => provider.to_owned(),
        (true, _) => name.to_owned(),
    }
}

/// Checks edited arguments: a JSON object. Returns the compact JSON to send.
pub(crate) fn validate_args(text: &str) -> Result<String, String> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| {
        format!(
            "invalid JSON at line {} column {}: {e}",
            e.line(),
            e.column()
        )
    })?;
    if !value.is_object() {
        return Err("the arguments must be a JSON object ({…})".to_owned());
    }
    Ok(value.to_string())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use super::*;
    use crate::cmd::attach::testing::*;

    fn keys(view: &mut View, keys: &[Key]) -> Vec<Action> {
        keys.iter().filter_map(|k| view.key(*k)).collect()
    }

    fn typed(view: &mut View, text: &str) -> Vec<Action> {
        text.chars()
            .filter_map(|c| view.key(Key::Char(c)))
            .collect()
    }

    #[test]
    fn started_fills_the_header_and_replays_history() {
        let mut view = View::new(Some("support/refund-agent@0.1.0".into()));
        assert_eq!(view.phase, Phase::Connecting);
        view.apply(started_with_history(), now());
        assert_eq!(view.session_id, SESSION);
        assert_eq!(view.model, "stub/scripted");
        assert_eq!(view.max_tokens, Some(20_000));
        assert_eq!(view.tokens, 120);
        assert_eq!(
            view.blocks,
            vec![
                Block::User("Can you check order ORD-1?".into()),
                Block::Agent {
                    text: "ORD-1 is a €400 order, delivered.".into(),
                    footer: Some("end_turn · 120 tokens · 1.5s".into())
                },
            ]
        );
    }

    #[test]
    fn deltas_stream_into_one_agent_block_until_another_event() {
        let mut view = started_view();
        view.apply(delta("Let me "), now());
        view.apply(delta("check."), now());
        assert_eq!(view.phase, Phase::Streaming);
        view.apply(
            tool_call("c1", "orders.lookup-order", r#"{"order_id":"ORD-1"}"#),
            now(),
        );
        view.apply(delta("Done."), now());
        view.apply(ready(1, 300), now());
        assert_eq!(view.phase, Phase::Ready);
        assert_eq!(view.turn, 1);
        assert_eq!(view.tokens, 300);
        let agents: Vec<_> = view
            .blocks
            .iter()
            .filter_map(|b| match b {
                Block::Agent { text, footer } => Some((text.as_str(), footer.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(
            agents,
            vec![
                ("Let me check.", None),
                ("Done.", Some("turn 1 · end_turn · 100 tokens".into()))
            ]
        );
    }

    #[test]
    fn tool_results_are_labelled_with_their_call_and_denials_with_the_policy() {
        let mut view = started_view();
        view.apply(tool_call("c1", "payments.issue-refund", "{}"), now());
        view.apply(policy_denied("c1"), now());
        view.apply(tool_call("c2", "orders.lookup-order", "{}"), now());
        view.apply(tool_ok("c2", r#"{"status":"delivered"}"#), now());
        view.apply(tool_failed("c3", "timeout", "worker timed out"), now());
        assert_eq!(
            view.blocks[1],
            Block::PolicyDenied {
                tool: "payments.issue-refund@1.0.0".into(),
                policy_ref: Some("payments/refund-hard-limit@1.0.0".into()),
                reason: "refunds over 10000 are never agent-initiated".into()
            }
        );
        assert_eq!(
            view.blocks[3],
            Block::ToolResult {
                tool: "orders.lookup-order@1.0.0".into(),
                payload: r#"{"status":"delivered"}"#.into()
            }
        );
        assert_eq!(
            view.blocks[4],
            Block::ToolFailed {
                tool: "call c3".into(),
                code: Some("timeout".into()),
                message: "worker timed out".into()
            }
        );
    }

    #[test]
    fn approve_prompts_for_a_comment_and_sends_a_decision_for_the_approval() {
        let mut view = started_view();
        view.apply(approval(false), now());
        assert_eq!(view.phase, Phase::AwaitingApproval);
        assert_eq!(view.key(Key::Char('a')), None);
        assert!(matches!(view.prompt, Some(Prompt::Comment(_))));
        assert!(typed(&mut view, "Damage claim verified").is_empty());
        let action = view.key(Key::Enter).unwrap();
        assert_eq!(
            action,
            Action::Decide(
                Decision::approve()
                    .for_approval("apr_1")
                    .with_comment("Damage claim verified")
            )
        );
        assert_eq!(view.pending.as_ref().unwrap().sent, Some(true));
        assert_eq!(view.key(Key::Char('a')), None, "a vote is sent only once");
        assert_eq!(view.prompt, None);
        assert_eq!(view.input, "a", "once decided, letters are typed");
        view.apply(decided("approved", 1), now());
        assert_eq!(view.pending, None);
        assert_eq!(view.phase, Phase::Streaming);
    }

    #[test]
    fn deny_can_be_cancelled_with_esc_and_then_sent_without_comment() {
        let mut view = started_view();
        view.apply(approval(false), now());
        assert!(keys(&mut view, &[Key::Char('d'), Key::Char('x'), Key::Esc]).is_empty());
        assert_eq!(view.prompt, None);
        assert_eq!(view.pending.as_ref().unwrap().sent, None);
        let actions = keys(&mut view, &[Key::Char('d'), Key::Enter]);
        assert_eq!(
            actions,
            vec![Action::Decide(Decision::deny().for_approval("apr_1"))]
        );
    }

    #[test]
    fn letters_are_text_while_the_input_box_has_text_and_commands_when_focused_away() {
        let mut view = started_view();
        view.apply(approval(false), now());
        typed(&mut view, "hold on");
        assert_eq!(view.input, "hold on", "'d' was typed, not a deny");
        assert_eq!(view.prompt, None);
        view.key(Key::Tab);
        assert_eq!(view.focus, Focus::Transcript);
        view.key(Key::Char('d'));
        assert!(matches!(view.prompt, Some(Prompt::Comment(ref d)) if !d.approve));
        assert_eq!(view.input, "hold on");
    }

    #[test]
    fn an_outcome_review_has_its_own_keys_and_resend_needs_a_confirmation() {
        let mut view = started_view();
        view.apply(review(), now());
        assert!(view.reviewing());
        for key in ['a', 'd', 'e'] {
            assert_eq!(view.key(Key::Char(key)), None);
            assert_eq!(view.prompt, None, "{key} does nothing on a review");
            assert_eq!(view.hint.as_deref(), Some(REVIEW_HINT));
        }
        // s asks first; n keeps the call unsent.
        view.key(Key::Char('s'));
        assert!(matches!(view.prompt, Some(Prompt::ConfirmResend(_))));
        assert_eq!(view.key(Key::Char('n')), None);
        assert_eq!(view.prompt, None);
        assert_eq!(view.hint.as_deref(), Some("not re-sent"));
        let actions = keys(&mut view, &[Key::Char('s'), Key::Char('y'), Key::Enter]);
        assert_eq!(
            actions,
            vec![Action::Decide(
                Decision::resolve("resend").for_approval("apr_1")
            )]
        );
        let mut view = started_view();
        view.apply(review(), now());
        let actions = keys(
            &mut view,
            &[Key::Char('h'), Key::Char('o'), Key::Char('k'), Key::Enter],
        );
        assert_eq!(
            actions,
            vec![Action::Decide(
                Decision::resolve("happened")
                    .for_approval("apr_1")
                    .with_comment("ok")
            )]
        );
        assert!(
            view.blocks
                .iter()
                .any(|b| matches!(b, Block::ApprovalRequired { review: true, .. }))
        );
    }

    #[test]
    fn comprehension_is_asked_before_an_approve_when_required() {
        let mut view = started_view();
        view.apply(approval(true), now());
        view.key(Key::Char('a'));
        assert!(matches!(view.prompt, Some(Prompt::Comprehension(_))));
        view.key(Key::Char('n'));
        assert_eq!(view.prompt, None, "n cancels the approve");
        assert!(view.hint.as_deref().unwrap().contains("acknowledgement"));
        let actions = keys(
            &mut view,
            &[
                Key::Char('a'),
                Key::Char('y'),
                Key::Char('o'),
                Key::Char('k'),
                Key::Enter,
            ],
        );
        assert_eq!(
            actions,
            vec![Action::Decide(
                Decision::approve()
                    .for_approval("apr_1")
                    .with_comprehension(true)
                    .with_comment("ok")
            )]
        );
        // A deny needs no acknowledgement.
        let mut view = started_view();
        view.apply(approval(true), now());
        view.key(Key::Char('d'));
        assert!(matches!(view.prompt, Some(Prompt::Comment(_))));
    }

    #[test]
    fn edited_args_are_validated_before_the_approve() {
        let mut view = started_view();
        view.apply(approval(false), now());
        view.key(Key::Char('e'));
        let Some(Prompt::EditArgs { editor, .. }) = &view.prompt else {
            panic!("{:?}", view.prompt)
        };
        assert_eq!(
            editor.text(),
            "{\n  \"amount\": 400,\n  \"order_id\": \"ORD-1\"\n}"
        );
        // Break the JSON: delete the closing brace.
        view.key(Key::Backspace);
        assert_eq!(view.key(Key::Ctrl('s')), None);
        let Some(Prompt::EditArgs {
            error: Some(error), ..
        }) = &view.prompt
        else {
            panic!("{:?}", view.prompt)
        };
        assert!(error.starts_with("invalid JSON at line 4"), "{error}");
        // Fix it: amount 300.
        view.key(Key::Char('}'));
        for _ in 0..3 {
            view.key(Key::Up);
        }
        view.key(Key::Down);
        view.key(Key::End);
        for _ in 0..4 {
            view.key(Key::Backspace);
        }
        typed(&mut view, "300,");
        view.key(Key::Ctrl('s'));
        assert!(
            matches!(view.prompt, Some(Prompt::Comment(_))),
            "{:?}",
            view.prompt
        );
        typed(&mut view, "lowered");
        assert_eq!(
            view.key(Key::Enter),
            Some(Action::Decide(
                Decision::approve()
                    .for_approval("apr_1")
                    .with_args(r#"{"amount":300,"order_id":"ORD-1"}"#)
                    .with_comment("lowered")
            ))
        );
        assert_eq!(
            validate_args("[1]").unwrap_err(),
            "the arguments must be a JSON object ({…})"
        );
    }

    #[test]
    fn a_quorum_vote_keeps_the_approval_pending_with_progress() {
        let mut view = started_view();
        let mut two = approval(false);
        if let SessionEvent::ApprovalRequired(a) = &mut two {
            a.approvals_required = 2;
        }
        view.apply(two, now());
        view.apply(decided("pending", 1), now());
        let pending = view.pending.as_ref().unwrap();
        assert_eq!(pending.approval.approvals_received, 1);
        assert_eq!(view.phase, Phase::AwaitingApproval);
        // Replayed on re-attach: no duplicate block, same pending approval.
        view.apply(approval(false), now());
        let approvals = view
            .blocks
            .iter()
            .filter(|b| matches!(b, Block::ApprovalRequired { .. }))
            .count();
        assert_eq!(approvals, 1);
    }

    #[test]
    fn a_refused_vote_is_shown_and_can_be_sent_again() {
        let mut view = started_view();
        view.apply(approval(true), now());
        view.apply(status("awaiting_approval"), now());
        keys(&mut view, &[Key::Char('a'), Key::Char('y'), Key::Enter]);
        assert_eq!(view.pending.as_ref().unwrap().sent, Some(true));
        view.apply(
            SessionEvent::Status(phrony_client::interactive::StatusChanged {
                status: "awaiting_approval".into(),
                reason: Some("emad already voted on approval apr_1".into()),
            }),
            now(),
        );
        assert_eq!(view.pending.as_ref().unwrap().sent, None);
        assert_eq!(
            view.hint.as_deref(),
            Some("runtime: emad already voted on approval apr_1")
        );
        assert_eq!(view.phase, Phase::AwaitingApproval);
        view.key(Key::Char('d'));
        assert!(matches!(view.prompt, Some(Prompt::Comment(_))));
    }

    #[test]
    fn a_vote_sent_before_the_change_into_awaiting_approval_arrives_stays_sent() {
        let mut view = started_view();
        view.apply(status("running"), now());
        // Live, the approval is forwarded before the status change that opened it.
        view.apply(approval(false), now());
        keys(&mut view, &[Key::Char('a'), Key::Enter]);
        assert_eq!(view.pending.as_ref().unwrap().sent, Some(true));
        view.apply(
            SessionEvent::Status(phrony_client::interactive::StatusChanged {
                status: "awaiting_approval".into(),
                reason: Some("approval apr_1 opened".into()),
            }),
            now(),
        );
        assert_eq!(
            view.pending.as_ref().unwrap().sent,
            Some(true),
            "a change of status is not a refusal"
        );
        assert_eq!(view.hint, None);
        assert_eq!(view.phase, Phase::AwaitingApproval);
    }

    #[test]
    fn enter_sends_the_message_and_queues_it_during_a_turn() {
        let mut view = started_view();
        assert_eq!(view.key(Key::Enter), None);
        assert_eq!(view.hint.as_deref(), Some(EMPTY_MESSAGE_HINT));
        typed(&mut view, "Refund €400 for ORD-1");
        assert_eq!(
            view.key(Key::Enter),
            Some(Action::Send("Refund €400 for ORD-1".into()))
        );
        assert_eq!(view.input, "");
        assert_eq!(
            view.hint.as_deref(),
            Some("queued: it runs when the current turn ends")
        );
        view.apply(ready(1, 10), now());
        typed(&mut view, "next");
        assert_eq!(view.key(Key::Enter), Some(Action::Send("next".into())));
        assert_eq!(view.hint, None);
    }

    #[test]
    fn limits_block_input_and_terminal_events_end_the_session() {
        let mut view = started_view();
        view.apply(
            limit("run limit max_tokens_per_run exceeded (on_limit=halt)"),
            now(),
        );
        assert_eq!(view.phase, Phase::LimitReached);
        typed(&mut view, "more");
        assert_eq!(view.key(Key::Enter), None);
        assert!(
            view.hint
                .as_deref()
                .unwrap()
                .contains("blocked by a run limit")
        );
        view.apply(status("awaiting_input"), now());
        assert_eq!(view.phase, Phase::LimitReached, "a status keeps the limit");
        view.apply(completed(), now());
        assert_eq!(view.phase, Phase::Finished);
        assert_eq!(view.menu_items(), vec![MenuItem::Close]);
        let mut failed = started_view();
        failed.apply(approval(false), now());
        failed.apply(
            SessionEvent::Failed {
                message: "boom".into(),
            },
            now(),
        );
        assert_eq!(failed.phase, Phase::Failed);
        assert_eq!(failed.pending, None);
        assert_eq!(failed.failure.as_deref(), Some("boom"));
        failed.apply(status("running"), now());
        assert_eq!(
            failed.phase,
            Phase::Failed,
            "nothing revives a failed session"
        );
    }

    #[test]
    fn the_menu_completes_cancels_or_detaches_and_ctrl_c_always_detaches() {
        let mut view = started_view();
        assert_eq!(
            keys(&mut view, &[Key::Ctrl('p'), Key::Enter]),
            vec![Action::Complete]
        );
        assert_eq!(
            keys(&mut view, &[Key::Ctrl('p'), Key::Down, Key::Enter]),
            vec![Action::Cancel]
        );
        assert_eq!(
            keys(
                &mut view,
                &[Key::Ctrl('p'), Key::Down, Key::Down, Key::Down, Key::Enter]
            ),
            vec![Action::Detach]
        );
        assert!(keys(&mut view, &[Key::Ctrl('p'), Key::Esc]).is_empty());
        assert_eq!(view.prompt, None);
        view.key(Key::Char('a'));
        view.key(Key::Ctrl('p'));
        assert_eq!(view.key(Key::Ctrl('c')), Some(Action::Detach));
    }

    #[test]
    fn the_menu_opens_a_delegations_child_session() {
        let mut view = started_view();
        let delegation = |call_id: &str, child: &str| {
            let mut call = tool_call(call_id, "./specialists/refunds.yaml", r#"{"task":"x"}"#);
            if let SessionEvent::ToolCall(c) = &mut call {
                c.delegation = Some(phrony_client::interactive::Delegation {
                    child_session_id: child.into(),
                    target: "support/refund-specialist".into(),
                });
            }
            call
        };
        view.apply(delegation("call_1", "run_child_1"), Utc::now());
        view.apply(delegation("call_2", "run_child_2"), Utc::now());
        // The same call seen again (a replay after re-attaching) adds no entry.
        view.apply(delegation("call_2", "run_child_2"), Utc::now());
        let items = view.menu_items();
        assert_eq!(
            items,
            vec![
                MenuItem::Complete,
                MenuItem::Cancel,
                MenuItem::OpenChild(1),
                MenuItem::OpenChild(0),
                MenuItem::Detach
            ]
        );
        assert_eq!(
            items[2].label(&view),
            "Open child support/refund-specialist (run_child_2)"
        );
        // The latest delegation's child comes first.
        assert_eq!(
            keys(
                &mut view,
                &[Key::Ctrl('p'), Key::Down, Key::Down, Key::Enter]
            ),
            vec![Action::Open("run_child_2".into())]
        );
        assert_eq!(
            keys(
                &mut view,
                &[Key::Ctrl('p'), Key::Down, Key::Down, Key::Down, Key::Enter]
            ),
            vec![Action::Open("run_child_1".into())]
        );
    }

    #[test]
    fn scrolling_pins_the_view_until_end_or_g_follows_the_tail() {
        let mut view = started_view();
        assert_eq!(view.top_line(100, 20), 80);
        view.key(Key::PageUp);
        assert_eq!(view.scroll, Scroll::Top(61));
        assert_eq!(
            view.top_line(150, 20),
            61,
            "new lines do not move a pinned view"
        );
        view.key(Key::Down);
        assert_eq!(view.scroll, Scroll::Top(62));
        view.key(Key::Char('G'));
        assert_eq!(view.scroll, Scroll::Follow);
        view.key(Key::Up);
        view.key(Key::End);
        assert_eq!(view.scroll, Scroll::Follow);
        view.key(Key::Up);
        view.key(Key::PageDown);
        assert_eq!(
            view.scroll,
            Scroll::Follow,
            "scrolling down to the end follows again"
        );
    }

    #[test]
    fn the_wall_clock_counts_down_and_freezes_at_the_end() {
        let mut view = started_view();
        let later = now() + chrono::Duration::seconds(90);
        assert_eq!(view.wall_clock_left(later), Some(600 - 30 - 90));
        view.apply(completed(), later);
        let much_later = later + chrono::Duration::seconds(500);
        assert_eq!(view.wall_clock_left(much_later), Some(600 - 30 - 90));
    }
}
