//! The plain renderer, for pipes, logs and dumb terminals: assistant text streams to stdout;
//! tool, approval and status lines go to stderr as `── … ──`, with a `> ` prompt when the
//! session waits for a message. Each stdin line is a message, or a command:
//!
//! | Line | Effect |
//! |---|---|
//! | `/approve [comment]` | approve the pending approval (asks y/n first when it requires comprehension) |
//! | `/deny [comment]` | deny the pending approval |
//! | `/happened`, `/fail`, `/resend [comment]` | resolve an outcome review (a call whose outcome is unknown); `/resend` asks y/n first |
//! | `/complete`, `/cancel` | end the session (`CompleteSession`, `CancelSession`) |
//! | `/detach` | leave; the session keeps running |
//! | `/help` | list the commands |
//! | `//text` | send `/text` as a message |
//!
//! End of stdin detaches once the session is idle (waiting for input or for an approval, or
//! ended), so `echo "Check ORD-1" | phrony sessions attach ID` prints the answer before leaving.

use std::io::{self, IsTerminal as _, Write};

use chrono::{DateTime, Utc};
use phrony_client::OUTCOME_REVIEW;
use phrony_client::interactive::{
    ApprovalRequired, Decision, SessionEvent, ToolOutcome, ToolResult,
};
use tokio::sync::mpsc;

use super::view::{Action, Phase, View, model_label};
use super::{Directed, Link, Outcome, compact_json, pretty_json, sanitize};

/// The longest tool result or argument text shown on a status line, in characters.
const MAX_INLINE: usize = 240;

/// How to resolve an outcome review.
const REVIEW_HELP: &str = "this call's outcome is unknown: /happened [comment] if it took \
                           effect, /fail [comment] to not send it again, /resend [comment] to \
                           send it again (you will confirm it did not happen)";

const HELP: &str = "commands: /approve [comment] · /deny [comment] · /happened · /fail · \
                    /resend · /complete · /cancel · /detach · //text sends /text";

/// When the renderer takes the operator's next line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pacing {
    /// As it comes: a terminal, where the operator types when they choose (a `/cancel` in
    /// the middle of a turn included).
    Immediate,
    /// Each line once the session waits on the operator: piped input, whose lines are all
    /// there at once, so that a script's `/approve` answers the approval it was written for
    /// instead of arriving before it and finding none pending.
    WhenWaiting,
}

impl Pacing {
    /// [`Pacing::Immediate`] for a terminal on stdin, [`Pacing::WhenWaiting`] otherwise.
    pub(crate) fn of_stdin() -> Self {
        if io::stdin().is_terminal() {
            Self::Immediate
        } else {
            Self::WhenWaiting
        }
    }
}

/// Runs the plain renderer on the process's stdin, stdout and stderr.
pub(crate) async fn run_stdio(link: impl Link, view: View) -> anyhow::Result<Outcome> {
    let pacing = Pacing::of_stdin();
    run(
        link,
        view,
        stdin_lines(),
        pacing,
        io::stdout(),
        io::stderr(),
    )
    .await
}

/// Reads stdin lines on a thread of its own (a blocking read cannot be cancelled, and must
/// not keep the process alive once the viewer is done); the channel closes at end of input.
pub(crate) fn stdin_lines() -> mpsc::Receiver<String> {
    let (lines, receiver) = mpsc::channel(16);
    std::thread::spawn(move || {
        for line in io::stdin().lines() {
            let Ok(line) = line else { return };
            if lines.blocking_send(line).is_err() {
                return;
            }
        }
    });
    receiver
}

/// Runs the plain renderer: session events from `link`, operator lines from `input` (closed
/// at end of input) taken as `pacing` says, text to `out`, status lines to `err`.
pub(crate) async fn run(
    link: impl Link,
    view: View,
    input: mpsc::Receiver<String>,
    pacing: Pacing,
    out: impl Write,
    err: impl Write,
) -> anyhow::Result<Outcome> {
    let (_none, director) = mpsc::channel(1);
    drive(link, view, (input, pacing), director, true, out, err).await
}

/// [`run`], also taking [`Directed`] steps from `director` (`phrony demo`'s script): a
/// message it sends is shown as `you: …`, a note as a status line. While the director has a
/// step queued, end of input does not detach.
pub(crate) async fn run_directed(
    link: impl Link,
    view: View,
    input: mpsc::Receiver<String>,
    pacing: Pacing,
    director: mpsc::Receiver<Directed>,
    out: impl Write,
    err: impl Write,
) -> anyhow::Result<Outcome> {
    drive(link, view, (input, pacing), director, false, out, err).await
}

/// The renderer's loop; `prompting` shows the `> ` prompt when the session waits for a
/// message (not when a director types them).
async fn drive(
    mut link: impl Link,
    view: View,
    (mut input, pacing): (mpsc::Receiver<String>, Pacing),
    mut director: mpsc::Receiver<Directed>,
    prompting: bool,
    out: impl Write,
    err: impl Write,
) -> anyhow::Result<Outcome> {
    let mut plain = Plain::new(view, out, err);
    plain.prompting = prompting;
    let mut input_open = true;
    let mut directed = true;
    let mut lost = None;
    loop {
        let take_line =
            input_open && (pacing == Pacing::Immediate || plain.awaits_a_line(prompting));
        tokio::select! {
            biased;
            // A step the last event led to goes first, so it follows that event.
            step = director.recv(), if directed => match step {
                Some(Directed::Note(text)) => plain.status(&text)?,
                Some(Directed::Act(Action::Detach)) => break,
                Some(Directed::Act(action)) => {
                    if let Action::Send(text) = &action {
                        plain.status(&format!("you: {text}"))?;
                    }
                    match link.perform(&action).await {
                        Ok(()) => plain.performed(action)?,
                        Err(error) => plain.status(&error)?,
                    }
                }
                None => directed = false,
            },
            event = link.next(), if !plain.view.stream_closed => match event {
                Ok(Some(event)) => {
                    plain.event(event, Utc::now())?;
                    if plain.view.phase.is_terminal() {
                        break;
                    }
                }
                Ok(None) => {
                    plain.view.closed(None);
                    plain.status("the runtime closed the stream")?;
                    break;
                }
                Err(error) => {
                    plain.view.closed(Some(error.clone()));
                    lost = Some(error);
                    break;
                }
            },
            line = input.recv(), if take_line => match line {
                Some(line) => match plain.line(&line)? {
                    Some(Action::Detach) => break,
                    Some(action) => match link.perform(&action).await {
                        Ok(()) => plain.performed(action)?,
                        Err(error) => plain.status(&error)?,
                    },
                    None => {}
                },
                None => input_open = false,
            },
        }
        if !input_open && plain.waits_on_operator(prompting) && director.is_empty() {
            break;
        }
    }
    plain.end_line()?;
    Ok(match lost {
        Some(error) if !plain.view.phase.is_terminal() => Outcome::Lost(error),
        _ => Outcome::Detached {
            phase: plain.view.phase,
            failure: plain.view.failure.clone(),
        },
    })
}

/// The plain renderer's state: the shared view-model plus what the output needs.
struct Plain<O, E> {
    view: View,
    out: O,
    err: E,
    /// Assistant text was printed without a final newline.
    mid_line: bool,
    /// An approve waiting for the operator's y/n acknowledgement.
    acknowledging: Option<Decision>,
    /// Messages sent whose turn has not ended yet.
    outstanding: usize,
    /// The `> ` prompt is the last thing on stderr.
    prompted: bool,
    /// Whether to show the prompt at all.
    prompting: bool,
}

/// `text` cut to [`MAX_INLINE`] characters.
fn inline(text: &str) -> String {
    let text = sanitize(text).replace('\n', " ");
    if text.chars().count() <= MAX_INLINE {
        return text;
    }
    let mut cut: String = text.chars().take(MAX_INLINE).collect();
    cut.push('…');
    cut
}

impl<O: Write, E: Write> Plain<O, E> {
    fn new(view: View, out: O, err: E) -> Self {
        Self {
            view,
            out,
            err,
            mid_line: false,
            acknowledging: None,
            outstanding: 0,
            prompted: false,
            prompting: true,
        }
    }

    /// Ends a line of streamed text, or the prompt, before anything else is printed.
    fn end_line(&mut self) -> io::Result<()> {
        if self.prompted {
            writeln!(self.err)?;
            self.prompted = false;
        }
        if self.mid_line {
            writeln!(self.out)?;
            self.out.flush()?;
            self.mid_line = false;
        }
        Ok(())
    }

    /// A `── … ──` status line on stderr.
    fn status(&mut self, text: &str) -> io::Result<()> {
        self.end_line()?;
        writeln!(self.err, "── {} ──", sanitize(text))?;
        self.err.flush()
    }

    fn prompt(&mut self) -> io::Result<()> {
        if !self.prompting {
            return Ok(());
        }
        self.prompted = true;
        write!(self.err, "> ")?;
        self.err.flush()
    }

    /// Nothing more will happen without the operator. Directed (`prompting` false), only a
    /// held approval waits on the operator: the director sends the rest.
    fn waits_on_operator(&self, prompting: bool) -> bool {
        if prompting {
            self.idle()
        } else {
            self.view.phase == Phase::AwaitingApproval && self.idle()
        }
    }

    /// [`Self::waits_on_operator`], and a line has something to answer: a session awaiting
    /// approval whose approval has arrived (its status can come first).
    fn awaits_a_line(&self, prompting: bool) -> bool {
        self.waits_on_operator(prompting)
            && (self.view.phase != Phase::AwaitingApproval || self.view.pending.is_some())
    }

    /// Nothing more will happen without the operator: waiting for input with no message of
    /// ours outstanding, waiting for an approval, blocked by a limit, or ended.
    fn idle(&self) -> bool {
        match self.view.phase {
            Phase::Ready => self.outstanding == 0,
            // Waiting for an approval nobody here decided (a sent vote's outcome is awaited).
            Phase::AwaitingApproval => self.view.pending.as_ref().is_none_or(|p| p.sent.is_none()),
            Phase::LimitReached => true,
            Phase::Connecting | Phase::Streaming => self.view.stream_closed,
            Phase::Finished | Phase::Failed | Phase::Cancelled => true,
        }
    }

    fn event(&mut self, event: SessionEvent, now: DateTime<Utc>) -> io::Result<()> {
        match &event {
            SessionEvent::Started(started) => {
                let agent = self
                    .view
                    .agent
                    .clone()
                    .unwrap_or_else(|| format!("agent version {}", started.agent_version_id));
                let model = model_label(&started.model_provider, &started.model_name);
                self.status(&format!(
                    "session {} · {agent} · model {model}",
                    started.session_id
                ))?;
                for entry in &started.history {
                    let label = match entry.role {
                        phrony_client::interactive::Role::User => "YOU",
                        _ => "AGENT",
                    };
                    writeln!(self.out, "{label}: {}", sanitize(&entry.content))?;
                }
                self.out.flush()?;
            }
            SessionEvent::TextDelta(text) => {
                let text = sanitize(text);
                if !text.is_empty() {
                    write!(self.out, "{text}")?;
                    self.out.flush()?;
                    self.mid_line = !text.ends_with('\n');
                }
            }
            SessionEvent::ToolCall(call) => {
                let mut line = format!(
                    "tool call {}@{} {}",
                    call.tool,
                    call.version,
                    inline(&compact_json(&call.args))
                );
                if let Some(delegation) = &call.delegation {
                    line.push_str(&format!(
                        " · delegates to {} (session {})",
                        delegation.target, delegation.child_session_id
                    ));
                }
                self.status(&line)?;
            }
            SessionEvent::ToolResult(result) => {
                let line = tool_result_line(&self.view.tool_of(&result.call_id), result);
                self.status(&line)?;
            }
            SessionEvent::ApprovalRequired(a) if a.kind == OUTCOME_REVIEW => {
                // Not "may it run?" but "did it already happen?": no policy, no quorum.
                self.status(&format!(
                    "outcome review: {}@{} · {}",
                    a.tool,
                    a.version,
                    a.reason.as_deref().unwrap_or("its outcome is unknown")
                ))?;
                for arg_line in pretty_json(&a.args).lines() {
                    writeln!(self.err, "   {}", sanitize(arg_line))?;
                }
                self.status(REVIEW_HELP)?;
            }
            SessionEvent::ApprovalRequired(a) => self.approval_required(a)?,
            SessionEvent::ApprovalDecided(d) => {
                let mut line = format!(
                    "approval {} by {} ({}/{})",
                    d.status, d.decided_by, d.approvals_received, d.approvals_required
                );
                if let Some(comment) = &d.comment {
                    line.push_str(&format!(": {comment}"));
                }
                self.status(&line)?;
            }
            SessionEvent::Status(status) => {
                if let Some(reason) = &status.reason {
                    self.status(&format!("{} · {reason}", status.status))?;
                }
            }
            SessionEvent::AwaitingInput(awaiting) => {
                self.end_line()?;
                let turn_ended = !matches!(
                    awaiting.input_blocked_reason.as_deref(),
                    Some("awaiting_tool" | "awaiting_approval")
                );
                if turn_ended {
                    self.outstanding = self.outstanding.saturating_sub(1);
                    if let Some(reason) = &awaiting.stop_reason {
                        let mut line = format!("turn {} · {reason}", awaiting.stats.turn);
                        if let Some(usage) = awaiting.stats.session_usage {
                            line.push_str(&format!(" · {} tokens", usage.total));
                        }
                        self.status(&line)?;
                    }
                }
                if let Some(reason) = awaiting
                    .input_blocked_reason
                    .as_deref()
                    .filter(|_| turn_ended)
                {
                    self.status(&format!(
                        "limit reached: {reason}; input is blocked (/complete or /cancel)"
                    ))?;
                }
            }
            SessionEvent::Completed(completed) => {
                let mut line = "session complete".to_owned();
                if completed.stats.turn > 0 {
                    line.push_str(&format!(" · turn {}", completed.stats.turn));
                }
                if let Some(usage) = completed.stats.session_usage {
                    line.push_str(&format!(" · {} tokens", usage.total));
                }
                self.status(&line)?;
            }
            SessionEvent::Failed { message } => {
                self.status(&format!("session failed: {message}"))?;
            }
            SessionEvent::Cancelled { .. } => self.status("session cancelled")?,
        }
        let was_ready = self.view.phase == Phase::Ready;
        self.view.apply(event, now);
        if self.view.phase == Phase::Ready && (!was_ready || self.outstanding == 0) {
            self.prompt()?;
        }
        Ok(())
    }

    /// Announces an approval the operator can vote on: what is held and why, its arguments,
    /// and how to vote.
    fn approval_required(&mut self, a: &ApprovalRequired) -> io::Result<()> {
        let mut line = format!("approval required: {}@{}", a.tool, a.version);
        if let Some(policy) = a.policy_ref.as_ref().or(a.policy_name.as_ref()) {
            line.push_str(&format!(" · policy {policy}"));
        }
        if let Some(reason) = &a.reason {
            line.push_str(&format!(" · {reason}"));
        }
        line.push_str(&format!(
            " · {}/{} approvals",
            a.approvals_received,
            a.approvals_required.max(1)
        ));
        if let Some(expires) = a.expires_at {
            line.push_str(&format!(" · expires {}", crate::cmd::render::time(expires)));
        }
        self.status(&line)?;
        for arg_line in pretty_json(&a.args).lines() {
            writeln!(self.err, "   {}", sanitize(arg_line))?;
        }
        if a.comprehension_required {
            self.status(
                "approve with /approve [comment] (you will confirm you understood the \
                 call), deny with /deny [comment]",
            )?;
        } else {
            self.status("approve with /approve [comment], deny with /deny [comment]")?;
        }
        Ok(())
    }

    /// One line of operator input; the action to perform, if any.
    fn line(&mut self, line: &str) -> io::Result<Option<Action>> {
        // The operator's Enter ended the prompt's line.
        self.prompted = false;
        let text = line.trim();
        if let Some(decision) = self.acknowledging.take() {
            let resend = decision.resolution.as_deref() == Some("resend");
            return match (matches!(text, "y" | "Y" | "yes"), resend) {
                (true, true) => Ok(Some(Action::Decide(decision))),
                (true, false) => Ok(Some(Action::Decide(decision.with_comprehension(true)))),
                (false, true) => {
                    self.status("not re-sent")?;
                    Ok(None)
                }
                (false, false) => {
                    self.status("not approved: the acknowledgement is required")?;
                    Ok(None)
                }
            };
        }
        if text.is_empty() {
            return Ok(None);
        }
        let message = match text.strip_prefix('/') {
            Some(escaped) if escaped.starts_with('/') => escaped,
            Some(command) => return self.command(command),
            None => text,
        };
        if self.view.ended() {
            self.status("the session has ended; nothing more can be sent")?;
            return Ok(None);
        }
        if self.view.phase == Phase::LimitReached {
            self.status("input is blocked by a run limit; /complete or /cancel")?;
            return Ok(None);
        }
        Ok(Some(Action::Send(message.to_owned())))
    }

    fn command(&mut self, command: &str) -> io::Result<Option<Action>> {
        let (name, argument) = command
            .split_once(char::is_whitespace)
            .map_or((command, ""), |(n, a)| (n, a.trim()));
        match name {
            "happened" | "fail" | "resend" => {
                let Some(pending) = self.view.pending.as_ref() else {
                    self.status("no approval is pending")?;
                    return Ok(None);
                };
                if pending.approval.kind != OUTCOME_REVIEW {
                    self.status("this is a policy approval: /approve or /deny it")?;
                    return Ok(None);
                }
                let decision = Decision::resolve(name)
                    .for_approval(pending.approval.approval_id.clone())
                    .with_comment(argument);
                if name == "resend" {
                    self.acknowledging = Some(decision);
                    self.status(
                        "send the call to a worker again? Only if you checked that it did NOT \
                         take effect: a resend repeats it (y/n)",
                    )?;
                    self.prompt()?;
                    return Ok(None);
                }
                Ok(Some(Action::Decide(decision)))
            }
            "approve" | "deny"
                if self
                    .view
                    .pending
                    .as_ref()
                    .is_some_and(|p| p.approval.kind == OUTCOME_REVIEW) =>
            {
                self.status(REVIEW_HELP)?;
                Ok(None)
            }
            "approve" | "deny" => {
                let Some(pending) = self.view.pending.as_ref() else {
                    self.status("no approval is pending")?;
                    return Ok(None);
                };
                let approve = name == "approve";
                let comprehension = pending.approval.comprehension_required;
                let base = if approve {
                    Decision::approve()
                } else {
                    Decision::deny()
                };
                let decision = base
                    .for_approval(pending.approval.approval_id.clone())
                    .with_comment(argument);
                if approve && comprehension {
                    self.acknowledging = Some(decision);
                    self.status("did you review the call and understand what it does? (y/n)")?;
                    self.prompt()?;
                    return Ok(None);
                }
                Ok(Some(Action::Decide(decision)))
            }
            "complete" => Ok(Some(Action::Complete)),
            "cancel" => Ok(Some(Action::Cancel)),
            "detach" | "quit" | "exit" => Ok(Some(Action::Detach)),
            "help" => {
                self.status(HELP)?;
                Ok(None)
            }
            other => {
                self.status(&format!("unknown command /{other}; {HELP}"))?;
                Ok(None)
            }
        }
    }

    /// Notes an action the runtime accepted.
    fn performed(&mut self, action: Action) -> io::Result<()> {
        match action {
            Action::Send(text) => {
                self.outstanding += 1;
                self.view.sent_message(text);
            }
            Action::Decide(decision) => {
                if let Some(pending) = self.view.pending.as_mut() {
                    pending.sent = Some(decision.approve);
                }
                let verb = match decision.resolution.as_deref() {
                    Some(resolution) => resolution,
                    None if decision.approve => "approve",
                    None => "deny",
                };
                self.status(&format!("{verb} sent"))?;
            }
            Action::Complete => self.status("completing the session")?,
            Action::Cancel => self.status("cancelling the session")?,
            Action::Detach | Action::Open(_) => {}
        }
        Ok(())
    }
}

/// The status line of a tool result: its payload, a policy denial or a failure.
fn tool_result_line(tool: &str, result: &ToolResult) -> String {
    match &result.outcome {
        ToolOutcome::Succeeded { payload } => {
            format!("tool result {tool} {}", inline(&compact_json(payload)))
        }
        ToolOutcome::Failed {
            message,
            policy_ref,
            ..
        } if result.outcome.is_policy_denial() => format!(
            "denied by policy {}: {tool} was not dispatched: {message}",
            policy_ref.as_deref().unwrap_or("(unnamed)")
        ),
        ToolOutcome::Failed { code, message, .. } => match code {
            Some(code) => format!("tool failed {tool} [{code}] {message}"),
            None => format!("tool failed {tool} {message}"),
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};

    use tokio::sync::Notify;

    use super::*;
    use crate::cmd::attach::testing::*;

    /// One step of a scripted session.
    #[allow(
        clippy::large_enum_variant,
        reason = "a short test script; size does not matter"
    )]
    enum Step {
        Event(SessionEvent),
        /// Wait until the renderer performed an action.
        AwaitAction,
        /// Have nothing ready once, so the renderer reads its input (here: the end of it).
        Yield,
        /// Never answer again (the session stays open).
        Hang,
    }

    /// A link that plays a script and records the actions performed.
    struct Scripted {
        steps: VecDeque<Step>,
        actions: Arc<Mutex<Vec<Action>>>,
        acted: Arc<Notify>,
    }

    impl Link for Scripted {
        async fn next(&mut self) -> Result<Option<SessionEvent>, String> {
            // Cancel-safe like the real stream: a step is consumed only once it is done.
            loop {
                match self.steps.front() {
                    Some(Step::Event(_)) => {
                        let Some(Step::Event(event)) = self.steps.pop_front() else {
                            unreachable!("the front step is an event")
                        };
                        return Ok(Some(event));
                    }
                    Some(Step::AwaitAction) => {
                        self.acted.notified().await;
                        self.steps.pop_front();
                    }
                    Some(Step::Yield) => {
                        self.steps.pop_front();
                        tokio::task::yield_now().await;
                    }
                    Some(Step::Hang) => std::future::pending::<()>().await,
                    None => return Ok(None),
                }
            }
        }

        async fn perform(&mut self, action: &Action) -> Result<(), String> {
            self.actions.lock().unwrap().push(action.clone());
            self.acted.notify_one();
            Ok(())
        }
    }

    struct Run {
        outcome: Outcome,
        out: String,
        err: String,
        actions: Vec<Action>,
    }

    async fn play(steps: Vec<Step>, lines: &[&str]) -> Run {
        play_paced(steps, lines, Pacing::Immediate).await
    }

    async fn play_paced(steps: Vec<Step>, lines: &[&str], pacing: Pacing) -> Run {
        let actions = Arc::new(Mutex::new(Vec::new()));
        let link = Scripted {
            steps: steps.into(),
            actions: Arc::clone(&actions),
            acted: Arc::new(Notify::new()),
        };
        let (tx, rx) = mpsc::channel(lines.len().max(1));
        for line in lines {
            tx.send((*line).to_owned()).await.unwrap();
        }
        drop(tx);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let view = View::new(Some("support/refund-agent@0.1.0".into()));
        let outcome = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            run(link, view, rx, pacing, &mut out, &mut err),
        )
        .await
        .expect("the renderer finished")
        .unwrap();
        let actions = actions.lock().unwrap().clone();
        Run {
            outcome,
            out: String::from_utf8(out).unwrap(),
            err: String::from_utf8(err).unwrap(),
            actions,
        }
    }

    fn ev(event: SessionEvent) -> Step {
        Step::Event(event)
    }

    #[tokio::test]
    async fn approving_on_stdin_sends_the_decision_and_shows_the_outcome() {
        let run = play(
            vec![
                ev(SessionEvent::Started(started())),
                ev(delta("I'll issue the refund.")),
                ev(tool_call(
                    "c9",
                    "payments.issue-refund",
                    r#"{"amount":400,"order_id":"ORD-1"}"#,
                )),
                ev(approval(false)),
                Step::AwaitAction,
                ev(decided("approved", 1)),
                ev(tool_ok("c9", r#"{"refund_id":"rf_123"}"#)),
                ev(delta("Refund rf_123 issued.")),
                ev(ready(1, 850)),
                Step::Hang,
            ],
            &["/approve Damage claim verified"],
        )
        .await;
        assert_eq!(
            run.actions,
            vec![Action::Decide(
                Decision::approve()
                    .for_approval("apr_1")
                    .with_comment("Damage claim verified")
            )]
        );
        assert_eq!(run.out, "I'll issue the refund.\nRefund rf_123 issued.\n");
        let expected_err = format!(
            "── session {SESSION} · support/refund-agent@0.1.0 · model stub/scripted ──\n\
             ── tool call payments.issue-refund@1.0.0 {{\"amount\":400,\"order_id\":\"ORD-1\"}} ──\n\
             ── approval required: payments.issue-refund@1.0.0 · policy payments/refund-approval-boundary@1.0.0 · refunds over 250 need a human · 0/1 approvals · expires 2026-01-01T10:15:00Z ──\n   \
             {{\n     \"amount\": 400,\n     \"order_id\": \"ORD-1\"\n   }}\n\
             ── approve with /approve [comment], deny with /deny [comment] ──\n\
             ── approve sent ──\n\
             ── approval approved by emad (1/1): Damage claim verified ──\n\
             ── tool result payments.issue-refund@1.0.0 {{\"refund_id\":\"rf_123\"}} ──\n\
             ── turn 1 · end_turn · 850 tokens ──\n\
             > \n"
        );
        assert_eq!(run.err, expected_err);
        assert_eq!(
            run.outcome,
            Outcome::Detached {
                phase: Phase::Ready,
                failure: None
            },
            "end of stdin detaches once the session is idle"
        );
    }

    #[tokio::test]
    async fn piped_input_answers_the_approval_it_was_written_for_not_earlier() {
        // Piped lines are all there from the start, while the session's events come one by
        // one (each `Yield` lets the renderer look at its input). The `/approve` and the
        // acknowledgement it needs wait for the approval instead of finding none pending.
        let run = play_paced(
            vec![
                ev(SessionEvent::Started(started())),
                Step::Yield,
                ev(delta("I'll issue the refund.")),
                Step::Yield,
                ev(tool_call(
                    "c9",
                    "payments.issue-refund",
                    r#"{"amount":400,"order_id":"ORD-1"}"#,
                )),
                Step::Yield,
                ev(approval(true)),
                Step::AwaitAction,
                ev(decided("approved", 1)),
                ev(tool_ok("c9", r#"{"refund_id":"rf_123"}"#)),
                ev(ready(1, 850)),
                Step::Hang,
            ],
            &["/approve Damage claim verified", "y"],
            Pacing::WhenWaiting,
        )
        .await;
        assert_eq!(
            run.actions,
            vec![Action::Decide(
                Decision::approve()
                    .for_approval("apr_1")
                    .with_comment("Damage claim verified")
                    .with_comprehension(true)
            )]
        );
        assert!(!run.err.contains("no approval is pending"), "{}", run.err);
        assert_eq!(
            run.outcome,
            Outcome::Detached {
                phase: Phase::Ready,
                failure: None
            }
        );
    }

    #[tokio::test]
    async fn end_of_input_waits_for_a_vote_sent_before_the_change_into_awaiting_approval() {
        let run = play(
            vec![
                ev(SessionEvent::Started(started())),
                ev(status("running")),
                ev(approval(false)),
                Step::AwaitAction,
                // Stdin ends (the vote was its last line) before the change that opened the
                // approval is forwarded, after the approval and the vote.
                Step::Yield,
                ev(SessionEvent::Status(
                    phrony_client::interactive::StatusChanged {
                        status: "awaiting_approval".into(),
                        reason: Some("approval apr_1 opened".into()),
                    },
                )),
                ev(decided("approved", 1)),
                ev(tool_ok("c9", r#"{"refund_id":"rf_123"}"#)),
                ev(delta("Refund rf_123 issued.")),
                ev(ready(1, 850)),
                Step::Hang,
            ],
            &["/approve"],
        )
        .await;
        assert_eq!(run.out, "Refund rf_123 issued.\n", "{}", run.err);
        assert!(!run.err.contains("refused"), "{}", run.err);
        assert!(
            run.err
                .contains("── approval approved by emad (1/1): Damage claim verified ──"),
            "{}",
            run.err
        );
        assert_eq!(
            run.outcome,
            Outcome::Detached {
                phase: Phase::Ready,
                failure: None
            }
        );
    }

    #[tokio::test]
    async fn an_outcome_review_asks_its_own_question_and_resend_needs_a_confirmation() {
        let run = play(
            vec![
                ev(SessionEvent::Started(started())),
                ev(review()),
                Step::AwaitAction,
                ev(decided("approved", 1)),
                ev(ready(1, 100)),
                Step::Hang,
            ],
            &["/approve", "/resend", "n", "/resend checked the PSP", "y"],
        )
        .await;
        assert_eq!(
            run.actions,
            vec![Action::Decide(
                Decision::resolve("resend")
                    .for_approval("apr_1")
                    .with_comment("checked the PSP")
            )],
            "approve is refused; the first resend was not confirmed"
        );
        assert!(
            run.err.contains(
                "── outcome review: payments.issue-refund@1.0.0 · worker \"w-1\" was lost. The \
                 runtime cannot tell whether payments.issue-refund@1.0.0 took effect: did it \
                 happen? ──"
            ),
            "{}",
            run.err
        );
        assert!(
            !run.err.contains("approvals"),
            "no quorum on a review: {}",
            run.err
        );
        assert_eq!(
            run.err.matches(&format!("── {REVIEW_HELP} ──")).count(),
            2,
            "{}",
            run.err
        );
        assert!(run.err.contains("── not re-sent ──"), "{}", run.err);
        assert!(run.err.contains("── resend sent ──"), "{}", run.err);
    }

    #[tokio::test]
    async fn messages_and_commands_from_stdin() {
        let run = play(
            vec![
                ev(SessionEvent::Started(started())),
                ev(ready(1, 10)),
                Step::AwaitAction,
                ev(delta("ORD-2 is €14,000.")),
                ev(tool_call(
                    "c1",
                    "payments.issue-refund",
                    r#"{"amount":14000}"#,
                )),
                ev(policy_denied("c1")),
                ev(ready(2, 400)),
                Step::AwaitAction,
                Step::AwaitAction,
                ev(completed()),
            ],
            &["Check ORD-2", "/deny", "/bogus", "//slash", "/complete"],
        )
        .await;
        assert_eq!(
            run.actions,
            vec![
                Action::Send("Check ORD-2".into()),
                Action::Send("/slash".into()),
                Action::Complete
            ]
        );
        assert!(
            run.err.contains("── no approval is pending ──"),
            "{}",
            run.err
        );
        assert!(
            run.err.contains("── unknown command /bogus;"),
            "{}",
            run.err
        );
        assert!(
            run.err.contains(
                "── denied by policy payments/refund-hard-limit@1.0.0: payments.issue-refund@1.0.0 \
                 was not dispatched: refunds over 10000 are never agent-initiated ──"
            ),
            "{}",
            run.err
        );
        assert!(run.err.ends_with("── session complete ──\n"), "{}", run.err);
        assert_eq!(
            run.outcome,
            Outcome::Detached {
                phase: Phase::Finished,
                failure: None
            }
        );
    }

    #[tokio::test]
    async fn comprehension_is_confirmed_before_the_approve_is_sent() {
        let run = play(
            vec![
                ev(SessionEvent::Started(started())),
                ev(approval(true)),
                Step::AwaitAction,
                ev(SessionEvent::Failed {
                    message: "approval rejected (on_reject=fail)".into(),
                }),
            ],
            &["/approve", "n", "/approve ok", "y"],
        )
        .await;
        assert_eq!(
            run.actions,
            vec![Action::Decide(
                Decision::approve()
                    .for_approval("apr_1")
                    .with_comment("ok")
                    .with_comprehension(true)
            )]
        );
        assert!(
            run.err
                .contains("── not approved: the acknowledgement is required ──")
        );
        assert!(
            run.err
                .contains("── session failed: approval rejected (on_reject=fail) ──")
        );
        assert_eq!(
            run.outcome,
            Outcome::Detached {
                phase: Phase::Failed,
                failure: Some("approval rejected (on_reject=fail)".into())
            }
        );
    }

    #[tokio::test]
    async fn end_of_input_waits_for_the_running_turn_and_control_text_is_stripped() {
        let run = play(
            vec![
                ev(SessionEvent::Started(started())),
                ev(delta("\u{1b}[31mpartial\u{1b}[0m ")),
                ev(delta("answer")),
                ev(ready(1, 100)),
                Step::Hang,
            ],
            &[],
        )
        .await;
        assert_eq!(run.out, "partial answer\n");
        assert_eq!(
            run.outcome,
            Outcome::Detached {
                phase: Phase::Ready,
                failure: None
            }
        );
    }

    #[tokio::test]
    async fn a_broken_stream_is_lost_and_a_closed_one_detaches() {
        struct Broken(bool);
        impl Link for Broken {
            async fn next(&mut self) -> Result<Option<SessionEvent>, String> {
                if std::mem::replace(&mut self.0, true) {
                    Err("connection reset".into())
                } else {
                    Ok(Some(SessionEvent::Started(started())))
                }
            }
            async fn perform(&mut self, _: &Action) -> Result<(), String> {
                Ok(())
            }
        }
        let (_tx, rx) = mpsc::channel(1);
        let outcome = run(
            Broken(false),
            View::new(None),
            rx,
            Pacing::Immediate,
            io::sink(),
            io::sink(),
        )
        .await
        .unwrap();
        assert_eq!(outcome, Outcome::Lost("connection reset".into()));
    }
}
