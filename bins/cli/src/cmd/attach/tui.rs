//! The terminal UI (ratatui + crossterm): header, transcript, approval panel, status bar and
//! input box, drawn from the [`View`]; keys read on a thread and mapped to [`Key`]s.
//!
//! The terminal is always restored (raw mode off, alternate screen left, cursor shown): by a
//! guard on every return path, and by ratatui's panic hook on a panic.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use phrony_client::interactive::ApprovalStatus;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::layout::{Alignment, Constraint, Layout, Position, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{
    Block as Border, Borders, Clear, Paragraph, Scrollbar, ScrollbarOrientation, ScrollbarState,
};
use ratatui::{DefaultTerminal, Frame};
use tokio::sync::mpsc;
use unicode_width::{UnicodeWidthChar as _, UnicodeWidthStr as _};

use super::view::{Action, Block, Focus, Key, MenuItem, Phase, Prompt, Scroll, Tone, View};
use super::{Directed, Link, Outcome, pretty_json, sanitize};

/// How often the screen is redrawn without events (the wall-clock countdown).
const TICK: Duration = Duration::from_secs(1);

/// How often the key reader checks whether it should stop.
const KEY_POLL: Duration = Duration::from_millis(100);

/// The longest tool result shown in full in the transcript, in lines.
const MAX_RESULT_LINES: usize = 24;

/// Runs the TUI until the operator leaves.
pub(crate) async fn run(link: impl Link, view: View) -> anyhow::Result<Outcome> {
    run_directed(link, view, mpsc::channel(1).1).await
}

/// [`run`], also taking [`Directed`] steps from `director` (`phrony demo`'s script): its
/// messages appear as the operator's, its notes in the hint line.
pub(crate) async fn run_directed(
    mut link: impl Link,
    mut view: View,
    mut director: mpsc::Receiver<Directed>,
) -> anyhow::Result<Outcome> {
    let mut directed = true;
    let mut screen = Screen::enter().context("set up the terminal")?;
    let (keys_tx, mut keys) = mpsc::channel(64);
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || read_keys(&keys_tx, &stop))
    };
    let mut tick = tokio::time::interval(TICK);
    let mut lost: Option<String> = None;
    let mut open: Option<String> = None;
    let result = loop {
        if let Err(e) = screen.terminal.draw(|frame| draw(frame, &view, Utc::now())) {
            break Err(anyhow::Error::new(e).context("draw the terminal"));
        }
        tokio::select! {
            event = link.next(), if !view.stream_closed => match event {
                Ok(Some(event)) => view.apply(event, Utc::now()),
                Ok(None) => view.closed(None),
                Err(error) => {
                    view.closed(Some(error.clone()));
                    lost = Some(error);
                }
            },
            input = keys.recv() => match input {
                Some(Input::Key(key)) => {
                    let Some(action) = view.key(key) else { continue };
                    if action == Action::Detach {
                        break Ok(());
                    }
                    if let Action::Open(child) = action {
                        open = Some(child);
                        break Ok(());
                    }
                    match link.perform(&action).await {
                        Ok(()) => {
                            if let Action::Send(text) = action {
                                view.sent_message(text);
                            }
                        }
                        Err(error) => view.hint = Some(error),
                    }
                }
                Some(Input::Resize) => {}
                None => break Err(anyhow::anyhow!("the terminal stopped delivering input")),
            },
            step = director.recv(), if directed => match step {
                Some(Directed::Note(text)) => view.hint = Some(text),
                Some(Directed::Act(Action::Detach)) => break Ok(()),
                Some(Directed::Act(action)) => match link.perform(&action).await {
                    Ok(()) => {
                        if let Action::Send(text) = action {
                            view.sent_message(text);
                        }
                    }
                    Err(error) => view.hint = Some(error),
                },
                None => directed = false,
            },
            _ = tick.tick() => {}
        }
    };
    stop.store(true, Ordering::Relaxed);
    drop(screen);
    // The reader notices `stop` within KEY_POLL; a failed join only means it panicked.
    let _ = reader.join();
    result?;
    Ok(match (open, lost) {
        (Some(child), _) => Outcome::Open(child),
        (None, Some(error)) if !view.phase.is_terminal() => Outcome::Lost(error),
        _ => Outcome::Detached {
            phase: view.phase,
            failure: view.failure.clone(),
        },
    })
}

/// The terminal in raw mode on the alternate screen; restored when dropped.
struct Screen {
    terminal: DefaultTerminal,
}

impl Screen {
    fn enter() -> io::Result<Self> {
        // try_init also installs a panic hook that restores the terminal first.
        match ratatui::try_init() {
            Ok(terminal) => Ok(Self { terminal }),
            Err(error) => {
                ratatui::restore();
                Err(error)
            }
        }
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let _ = self.terminal.show_cursor();
        ratatui::restore();
    }
}

/// Terminal input the loop cares about.
#[derive(Debug)]
enum Input {
    Key(Key),
    Resize,
}

/// Reads terminal events until `stop` is set or the loop is gone.
fn read_keys(keys: &mpsc::Sender<Input>, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        match event::poll(KEY_POLL) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(_) => return,
        }
        let input = match event::read() {
            Ok(Event::Key(key)) if key.kind != KeyEventKind::Release => {
                map_key(key).map(Input::Key)
            }
            Ok(Event::Resize(..)) => Some(Input::Resize),
            Ok(_) => None,
            Err(_) => return,
        };
        if let Some(input) = input
            && keys.blocking_send(input).is_err()
        {
            return;
        }
    }
}

/// A crossterm key as a [`Key`]; `None` for keys the viewer ignores.
fn map_key(key: KeyEvent) -> Option<Key> {
    let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
    Some(match key.code {
        KeyCode::Char(c) if ctrl => Key::Ctrl(c.to_ascii_lowercase()),
        KeyCode::Char(c) => Key::Char(c),
        KeyCode::Enter => Key::Enter,
        KeyCode::Esc => Key::Esc,
        KeyCode::Tab | KeyCode::BackTab => Key::Tab,
        KeyCode::Backspace => Key::Backspace,
        KeyCode::Delete => Key::Delete,
        KeyCode::Left => Key::Left,
        KeyCode::Right => Key::Right,
        KeyCode::Up => Key::Up,
        KeyCode::Down => Key::Down,
        KeyCode::PageUp => Key::PageUp,
        KeyCode::PageDown => Key::PageDown,
        KeyCode::Home => Key::Home,
        KeyCode::End => Key::End,
        _ => return None,
    })
}

// ---------------------------------------------------------------------------------------------
// Drawing

const DIM: Style = Style::new().fg(Color::DarkGray);

fn bold(color: Color) -> Style {
    Style::new().fg(color).add_modifier(Modifier::BOLD)
}

/// Draws the whole screen for `view` at `now`.
pub(crate) fn draw(frame: &mut Frame<'_>, view: &View, now: DateTime<Utc>) {
    let area = frame.area();
    if area.width < 4 || area.height < 4 {
        return;
    }
    let panel_lines = approval_panel_lines(view, area.width.saturating_sub(2), now);
    let fixed = 1 + 1 + 3; // header, status bar, input box
    let room = area.height.saturating_sub(fixed);
    let panel_height = if panel_lines.is_empty() {
        0
    } else {
        // At most two thirds of the room, leaving the transcript at least three lines.
        let wanted = u16::try_from(panel_lines.len() + 2).unwrap_or(u16::MAX);
        wanted
            .min(room.saturating_sub(3).min(room * 2 / 3))
            .max(3.min(room))
    };
    let [header, transcript, panel, status, input] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(0),
        Constraint::Length(panel_height),
        Constraint::Length(1),
        Constraint::Length(3),
    ])
    .areas(area);
    draw_header(frame, view, header);
    draw_transcript(frame, view, transcript);
    if panel_height > 0 {
        draw_approval_panel(frame, view, panel, panel_lines, now);
    }
    draw_status(frame, view, status, now);
    draw_input(frame, view, input);
    match &view.prompt {
        Some(Prompt::Menu { selected }) => draw_menu(frame, view, *selected, area),
        Some(Prompt::EditArgs { editor, error }) => {
            draw_editor(
                frame,
                &editor.lines,
                (editor.row, editor.col),
                error.as_deref(),
                area,
            );
        }
        _ => {}
    }
}

/// `text` cut to `width` columns, with `…` when cut.
fn fit(text: &str, width: usize) -> String {
    if text.width() <= width {
        return text.to_owned();
    }
    let mut out = String::new();
    let mut used = 0;
    for c in text.chars() {
        let w = c.width().unwrap_or(0);
        if used + w + 1 > width {
            break;
        }
        out.push(c);
        used += w;
    }
    if width > 0 {
        out.push('…');
    }
    out
}

/// Word-wraps `text` to `width` columns (hard-breaking words longer than a line); a wrapped
/// line keeps its paragraph's indentation (pretty-printed JSON stays readable).
pub(crate) fn wrap(text: &str, width: usize) -> Vec<String> {
    let width = width.max(1);
    let mut out = Vec::new();
    for paragraph in text.split('\n') {
        let content = paragraph.trim_start_matches(' ');
        let indent = paragraph.len() - content.len();
        if indent > 0 && indent * 2 < width {
            let pad = " ".repeat(indent);
            out.extend(
                wrap_paragraph(content, width - indent)
                    .into_iter()
                    .map(|line| format!("{pad}{line}")),
            );
        } else {
            out.extend(wrap_paragraph(paragraph, width));
        }
    }
    out
}

fn wrap_paragraph(paragraph: &str, width: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut line = String::new();
    let mut line_width = 0;
    // Byte offset just after the last space of `line`, and the width up to it.
    let mut last_break: Option<(usize, usize)> = None;
    for c in paragraph.chars() {
        let w = c.width().unwrap_or(0);
        if line_width + w > width && !line.is_empty() {
            if c == ' ' {
                // The line is full: break here and drop the space.
                out.push(line.trim_end().to_owned());
                line.clear();
                line_width = 0;
                last_break = None;
                continue;
            }
            match last_break.filter(|&(at, _)| at < line.len()) {
                Some((at, at_width)) => {
                    let tail = line.split_off(at);
                    out.push(line.trim_end().to_owned());
                    line = tail;
                    line_width -= at_width;
                }
                None => {
                    out.push(line.trim_end().to_owned());
                    line.clear();
                    line_width = 0;
                }
            }
            last_break = None;
        }
        line.push(c);
        line_width += w;
        if c == ' ' {
            last_break = Some((line.len(), line_width));
        }
    }
    out.push(line);
    out
}

fn draw_header(frame: &mut Frame<'_>, view: &View, area: Rect) {
    let width = usize::from(area.width);
    let session = if view.session_id.is_empty() {
        "connecting…".to_owned()
    } else {
        format!("session {}", view.session_id)
    };
    let agent = view.agent.clone().unwrap_or_else(|| {
        if view.agent_version_id.is_empty() {
            String::new()
        } else {
            format!("agent version {}", view.agent_version_id)
        }
    });
    let header = |session: &str| {
        let mut parts = vec![" phrony", session];
        if !agent.is_empty() {
            parts.push(&agent);
        }
        if !view.model.is_empty() {
            parts.push(&view.model);
        }
        // The session id, agent and model come from the runtime.
        sanitize(&parts.join(" · "))
    };
    let mut text = header(&session);
    if text.width() > width {
        // A shorter session id before cutting the agent and model.
        let short: String = view.session_id.chars().take(12).collect();
        text = header(&format!("session {short}…"));
    }
    let style = Style::new()
        .fg(Color::Black)
        .bg(Color::Cyan)
        .add_modifier(Modifier::BOLD);
    frame.render_widget(
        Paragraph::new(format!("{:<width$}", fit(&text, width))).style(style),
        area,
    );
}

/// A transcript block's label, label style, detail (shown bold after the label) and body;
/// `None` for a notice, which is drawn as a coloured rule instead. `cursor` marks the agent's
/// block that is still streaming.
fn block_parts(block: &Block, cursor: bool) -> Option<(&'static str, Style, String, String)> {
    Some(match block {
        Block::User(text) => ("YOU", bold(Color::Cyan), String::new(), text.clone()),
        Block::Agent { text, footer } => {
            let mut body = text.clone();
            if cursor {
                body.push('▍');
            }
            if let Some(footer) = footer {
                body.push_str(&format!("\n── {footer}"));
            }
            ("AGENT", bold(Color::Green), String::new(), body)
        }
        Block::ToolCall {
            tool,
            args,
            delegation,
        } => {
            let mut body = pretty_json(args);
            if let Some(delegation) = delegation {
                body = format!("{delegation}\n{body}");
            }
            ("TOOL CALL", bold(Color::Yellow), tool.clone(), body)
        }
        Block::ToolResult { tool, payload } => {
            let pretty = pretty_json(payload);
            let shown: Vec<&str> = pretty.lines().collect();
            let body = if shown.len() > MAX_RESULT_LINES {
                format!(
                    "{}\n… {} more lines",
                    shown[..MAX_RESULT_LINES].join("\n"),
                    shown.len() - MAX_RESULT_LINES
                )
            } else {
                pretty
            };
            ("TOOL RESULT", bold(Color::Blue), tool.clone(), body)
        }
        Block::ToolFailed {
            tool,
            code,
            message,
        } => {
            let body = match code {
                Some(code) => format!("[{code}] {message}"),
                None => message.clone(),
            };
            ("TOOL FAILED", bold(Color::Red), tool.clone(), body)
        }
        Block::PolicyDenied {
            tool,
            policy_ref,
            reason,
        } => (
            "DENIED BY POLICY",
            bold(Color::Red),
            policy_ref.clone().unwrap_or_default(),
            format!("{tool} was not dispatched: {reason}"),
        ),
        Block::ApprovalRequired {
            tool,
            reason,
            review: true,
            ..
        } => (
            "OUTCOME UNKNOWN",
            bold(Color::Magenta),
            tool.clone(),
            reason.clone().unwrap_or_default(),
        ),
        Block::ApprovalRequired {
            tool,
            policy_ref,
            reason,
            review: false,
        } => {
            let mut body = String::new();
            if let Some(policy) = policy_ref {
                body.push_str(&format!("held by {policy}"));
            }
            if let Some(reason) = reason {
                if !body.is_empty() {
                    body.push_str(": ");
                }
                body.push_str(reason);
            }
            (
                "APPROVAL REQUIRED",
                bold(Color::Magenta),
                tool.clone(),
                body,
            )
        }
        Block::Decided(decided) => {
            let (label, color) = match decided.status {
                ApprovalStatus::Approved => ("APPROVED", Color::Green),
                ApprovalStatus::Denied => ("DENIED", Color::Red),
                ApprovalStatus::Pending => ("VOTE RECORDED", Color::Magenta),
                ApprovalStatus::Escalated => ("ESCALATED", Color::Magenta),
                ApprovalStatus::Cancelled | ApprovalStatus::Other(_) => {
                    ("APPROVAL CLOSED", Color::DarkGray)
                }
            };
            let mut body = format!(
                "by {} · {}/{} approvals",
                decided.decided_by, decided.approvals_received, decided.approvals_required
            );
            if let Some(comment) = &decided.comment {
                body.push_str(&format!(" · “{comment}”"));
            }
            (label, bold(color), String::new(), body)
        }
        Block::Notice { .. } => return None,
    })
}

/// The transcript as styled, wrapped lines for `width` columns.
pub(crate) fn transcript_lines(view: &View, width: usize) -> Vec<Line<'static>> {
    let body_width = width.saturating_sub(2).max(1);
    let mut lines: Vec<Line<'static>> = Vec::new();
    let last = view.blocks.len().saturating_sub(1);
    for (index, block) in view.blocks.iter().enumerate() {
        if let Block::Notice { text, tone } = block {
            let color = match tone {
                Tone::Good => Color::Green,
                Tone::Bad => Color::Red,
            };
            for line in wrap(&format!("── {} ──", sanitize(text)), width.max(1)) {
                lines.push(Line::styled(line, Style::new().fg(color)));
            }
            lines.push(Line::default());
            continue;
        }
        let cursor = index == last && view.is_streaming();
        let Some((label, style, detail, body)) = block_parts(block, cursor) else {
            continue;
        };
        let mut head = vec![Span::styled(label.to_owned(), style)];
        if !detail.is_empty() {
            head.push(Span::raw(" "));
            head.push(Span::styled(
                fit(&sanitize(&detail), width.saturating_sub(label.len() + 1)),
                Style::new().add_modifier(Modifier::BOLD),
            ));
        }
        lines.push(Line::from(head));
        for line in wrap(&sanitize(&body), body_width) {
            let style = if line.starts_with("── ") {
                DIM
            } else {
                Style::new()
            };
            lines.push(Line::styled(format!("  {line}"), style));
        }
        lines.push(Line::default());
    }
    if lines.is_empty() {
        let waiting = if view.phase == Phase::Connecting {
            "Connecting to the session…"
        } else {
            "No messages yet. Type one below and press Enter."
        };
        lines.push(Line::styled(waiting.to_owned(), DIM));
    }
    lines
}

fn draw_transcript(frame: &mut Frame<'_>, view: &View, area: Rect) {
    if area.height == 0 {
        return;
    }
    let text_width = usize::from(area.width.saturating_sub(1)).max(1);
    let lines = transcript_lines(view, text_width);
    let height = usize::from(area.height);
    let top = view.top_line(lines.len(), height);
    let visible: Vec<Line<'static>> = lines.iter().skip(top).take(height).cloned().collect();
    frame.render_widget(Paragraph::new(visible), area);
    if lines.len() > height {
        let mut state = ScrollbarState::new(lines.len().saturating_sub(height)).position(top);
        frame.render_stateful_widget(
            Scrollbar::new(ScrollbarOrientation::VerticalRight)
                .begin_symbol(None)
                .end_symbol(None),
            area,
            &mut state,
        );
    }
}

/// "14:59", "1:02:03"; negative durations read as 0:00.
fn clock(seconds: i64) -> String {
    let s = seconds.max(0);
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, (s % 3600) / 60, s % 60)
    } else {
        format!("{}:{:02}", s / 60, s % 60)
    }
}

/// The narrowest panel (inside its border) whose title shows the expiry; narrower panels
/// show it as a field.
const EXPIRY_TITLE_WIDTH: usize = 48;

/// "expires in 14:59", "expired"; `None` without an expiry.
fn expiry_text(expires_at: Option<DateTime<Utc>>, now: DateTime<Utc>) -> Option<String> {
    let left = (expires_at? - now).num_seconds();
    Some(if left > 0 {
        format!("expires in {}", clock(left))
    } else {
        "expired".to_owned()
    })
}

/// The approval panel's lines for `width` columns (inside the border); empty without a
/// pending approval.
fn approval_panel_lines(view: &View, width: u16, now: DateTime<Utc>) -> Vec<Line<'static>> {
    let Some(pending) = view.pending.as_ref().filter(|_| !view.ended()) else {
        return Vec::new();
    };
    let a = &pending.approval;
    let width = usize::from(width).max(1);
    let label_width = 8;
    let value_width = width.saturating_sub(label_width).max(1);
    let mut lines = Vec::new();
    let mut field = |label: &str, value: &str, style: Style| {
        for (i, part) in wrap(&sanitize(value), value_width).into_iter().enumerate() {
            let head = if i == 0 { label } else { "" };
            lines.push(Line::from(vec![
                Span::styled(format!("{head:<label_width$}"), DIM),
                Span::styled(part, style),
            ]));
        }
    };
    field(
        "Tool",
        &format!("{}@{}", a.tool, a.version),
        Style::new().add_modifier(Modifier::BOLD),
    );
    if a.kind == phrony_client::OUTCOME_REVIEW {
        // "Did it happen?", not "may it run?": no policy, quorum or rejection rule.
        if let Some(question) = &a.reason {
            field("Question", question, bold(Color::Yellow));
        }
        field(
            "Answer",
            "h it happened (recorded succeeded) · f fail (outcome unknown, not re-sent) · s \
             send it again (only if it did not happen)",
            Style::new(),
        );
        field(
            "Args",
            &pretty_json(&a.args),
            Style::new().fg(Color::Yellow),
        );
        return lines;
    }
    if let Some(policy) = a.policy_ref.as_ref().or(a.policy_name.as_ref()) {
        field("Policy", policy, Style::new());
    }
    if let Some(reason) = &a.reason {
        field("Reason", reason, Style::new());
    }
    let mut quorum = format!(
        "{}/{} approvals",
        a.approvals_received,
        a.approvals_required.max(1)
    );
    if let Some(on_reject) = &a.on_reject {
        quorum.push_str(&format!(" · on reject: {on_reject}"));
    }
    field("Quorum", &quorum, Style::new());
    if width < EXPIRY_TITLE_WIDTH
        && let Some(expiry) = expiry_text(a.expires_at, now)
    {
        field("Expires", &expiry, Style::new());
    }
    if let Some(route) = &a.route {
        field("Route", route, Style::new());
    }
    if a.comprehension_required {
        field(
            "Confirm",
            "approving asks you to acknowledge you understood this call",
            bold(Color::Yellow),
        );
    }
    field(
        "Args",
        &pretty_json(&a.args),
        Style::new().fg(Color::Yellow),
    );
    lines
}

fn draw_approval_panel(
    frame: &mut Frame<'_>,
    view: &View,
    area: Rect,
    lines: Vec<Line<'static>>,
    now: DateTime<Utc>,
) {
    let Some(pending) = view.pending.as_ref() else {
        return;
    };
    let expiry = expiry_text(pending.approval.expires_at, now)
        .filter(|_| usize::from(area.width.saturating_sub(2)) >= EXPIRY_TITLE_WIDTH)
        .map(|text| format!(" {text} "));
    let review = view.reviewing();
    let hint = match pending.sent {
        Some(_) if review => " resolution sent · waiting for the runtime ".to_owned(),
        Some(true) => " approve sent · waiting for the runtime ".to_owned(),
        Some(false) => " deny sent · waiting for the runtime ".to_owned(),
        None if review => " h happened · f fail · s resend ".to_owned(),
        None => " a approve · d deny · e edit args ".to_owned(),
    };
    let title = if review {
        " OUTCOME UNKNOWN · DID IT HAPPEN? "
    } else {
        " APPROVAL REQUIRED "
    };
    let mut border = Border::default()
        .borders(Borders::ALL)
        .border_style(Style::new().fg(Color::Magenta))
        .title(Line::styled(title, bold(Color::Magenta)))
        .title_bottom(Line::styled(hint, bold(Color::Magenta)));
    if let Some(expiry) = expiry {
        border = border.title(Line::from(expiry).alignment(Alignment::Right));
    }
    let inner = border.inner(area);
    frame.render_widget(Clear, area);
    frame.render_widget(border, area);
    let shown = usize::from(inner.height);
    let mut visible: Vec<Line<'static>> = lines.into_iter().collect();
    if visible.len() > shown && shown > 0 {
        let hidden = visible.len() - shown + 1;
        visible.truncate(shown - 1);
        visible.push(Line::styled(
            fit(
                &format!("… {hidden} more lines (e shows all arguments)"),
                usize::from(inner.width),
            ),
            DIM,
        ));
    }
    frame.render_widget(Paragraph::new(visible), inner);
}

fn phase_style(phase: Phase) -> Style {
    let bg = match phase {
        Phase::Connecting => Color::DarkGray,
        Phase::Streaming => Color::Blue,
        Phase::Ready | Phase::Finished => Color::Green,
        Phase::AwaitingApproval => Color::Magenta,
        Phase::LimitReached => Color::Yellow,
        Phase::Failed | Phase::Cancelled => Color::Red,
    };
    Style::new()
        .fg(Color::Black)
        .bg(bg)
        .add_modifier(Modifier::BOLD)
}

/// `1,234`.
fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The key hints for the current state, longest first (the status bar shows the longest
/// that fits).
fn hints(view: &View) -> [&'static str; 3] {
    match &view.prompt {
        Some(Prompt::Comment(_)) => ["Enter send · Esc cancel", "Enter · Esc", ""],
        Some(Prompt::Comprehension(_)) => ["y acknowledge · n cancel", "y · n", ""],
        Some(Prompt::ConfirmResend(_)) => ["y send it again · n cancel", "y · n", ""],
        Some(Prompt::EditArgs { .. }) => ["Ctrl+S apply · Esc cancel", "Ctrl+S · Esc", ""],
        Some(Prompt::Menu { .. }) => [
            "↑↓ select · Enter choose · Esc close",
            "Enter choose · Esc close",
            "Enter · Esc",
        ],
        None if view.phase == Phase::LimitReached => [
            "Ctrl+P complete or cancel · Ctrl+C detach",
            "Ctrl+P menu · Ctrl+C detach",
            "Ctrl+P menu",
        ],
        None if view.ended() => [
            "q/Ctrl+C leave · PgUp/PgDn scroll",
            "q/Ctrl+C leave",
            "q leave",
        ],
        None if view.reviewing()
            && view.pending.as_ref().is_some_and(|p| p.sent.is_none())
            && (view.input.is_empty() || view.focus == Focus::Transcript) =>
        {
            [
                "h happened · f fail · s resend · Ctrl+P menu · Ctrl+C detach",
                "h happened · f fail · s resend · Ctrl+P menu",
                "h · f · s · Ctrl+P",
            ]
        }
        None if view.pending.as_ref().is_some_and(|p| p.sent.is_none())
            && (view.input.is_empty() || view.focus == Focus::Transcript) =>
        {
            [
                "a approve · d deny · e edit · Ctrl+P menu · Ctrl+C detach",
                "a approve · d deny · e edit · Ctrl+P menu",
                "a · d · e · Ctrl+P",
            ]
        }
        None => [
            "Enter send · PgUp/PgDn scroll · Ctrl+P menu · Ctrl+C detach",
            "Enter send · Ctrl+P menu · Ctrl+C detach",
            "Ctrl+P menu",
        ],
    }
}

fn draw_status(frame: &mut Frame<'_>, view: &View, area: Rect, now: DateTime<Utc>) {
    let mut spans = vec![Span::styled(
        format!(" {} ", view.phase.label()),
        phase_style(view.phase),
    )];
    let mut metrics = Vec::new();
    if view.turn > 0 {
        metrics.push(format!("turn {}", view.turn));
    }
    metrics.push(match view.max_tokens {
        Some(max) if max > 0 => format!(
            "tokens {}/{} ({}%)",
            thousands(view.tokens),
            thousands(max),
            view.tokens.saturating_mul(100) / max
        ),
        _ => format!("tokens {}", thousands(view.tokens)),
    });
    if let Some(left) = view.wall_clock_left(now) {
        metrics.push(format!("time left {}", clock(left)));
    }
    if let Scroll::Top(_) = view.scroll {
        metrics.push("↓ End follows".to_owned());
    }
    spans.push(Span::raw(format!(" {}", metrics.join(" │ "))));
    frame.render_widget(Paragraph::new(Line::from(spans)), area);
}

fn draw_input(frame: &mut Frame<'_>, view: &View, area: Rect) {
    let focused = view.focus == Focus::Input && view.prompt.is_none();
    let (title, text, placeholder): (String, String, Option<String>) = match &view.prompt {
        Some(Prompt::Comment(decision)) if decision.resolution.is_some() => (
            format!(
                " Resolve: {} · comment (optional) ",
                decision.resolution.as_deref().unwrap_or_default()
            ),
            view.prompt_text.clone(),
            None,
        ),
        Some(Prompt::ConfirmResend(_)) => (
            " Resend · confirmation required ".to_owned(),
            String::new(),
            Some(
                "Send it again? Only if you checked it did NOT take effect: a resend repeats \
                 it (y/n)"
                    .to_owned(),
            ),
        ),
        Some(Prompt::Comment(decision)) => (
            if decision.approve {
                " Approve · comment (optional) ".to_owned()
            } else {
                " Deny · comment (optional) ".to_owned()
            },
            view.prompt_text.clone(),
            None,
        ),
        Some(Prompt::Comprehension(_)) => (
            " Approve · acknowledgement required ".to_owned(),
            String::new(),
            Some("Did you review the call and understand what it does? (y/n)".to_owned()),
        ),
        _ if view.ended() => (
            " Message ".to_owned(),
            String::new(),
            Some("the session has ended".to_owned()),
        ),
        _ if view.phase == Phase::LimitReached => (
            " Message ".to_owned(),
            String::new(),
            Some("input is blocked by a run limit".to_owned()),
        ),
        _ if view.focus == Focus::Transcript => (
            " Message (Tab to type) ".to_owned(),
            view.input.clone(),
            None,
        ),
        _ => (" Message ".to_owned(), view.input.clone(), None),
    };
    let prompting = matches!(
        view.prompt,
        Some(Prompt::Comment(_) | Prompt::Comprehension(_) | Prompt::ConfirmResend(_))
    );
    let border_style = if prompting {
        Style::new().fg(Color::Magenta)
    } else if focused {
        Style::new().fg(Color::Cyan)
    } else {
        DIM
    };
    let mut border = Border::default()
        .borders(Borders::ALL)
        .border_style(border_style)
        .title(Line::styled(
            title,
            border_style.add_modifier(Modifier::BOLD),
        ));
    // The bottom border: the operator's hint (left), the key hints that fit (right).
    let mut room = usize::from(area.width).saturating_sub(4);
    if let Some(hint) = &view.hint {
        let hint = fit(&format!(" {} ", sanitize(hint)), room);
        room = room.saturating_sub(hint.width() + 1);
        border = border.title_bottom(Line::styled(hint, Style::new().fg(Color::Yellow)));
    }
    if let Some(keys) = hints(view)
        .into_iter()
        .find(|keys| !keys.is_empty() && keys.width() + 2 <= room)
    {
        border =
            border.title_bottom(Line::styled(format!(" {keys} "), DIM).alignment(Alignment::Right));
    }
    let inner = border.inner(area);
    frame.render_widget(border, area);
    let width = usize::from(inner.width);
    if let Some(placeholder) = placeholder.filter(|_| text.is_empty()) {
        frame.render_widget(
            Paragraph::new(Line::styled(fit(&placeholder, width), DIM)),
            inner,
        );
        return;
    }
    // Show the end of a long line, keeping the cursor visible.
    let shown = {
        let mut shown = String::new();
        let mut used = 0;
        for c in text.chars().rev() {
            let w = c.width().unwrap_or(0);
            if used + w + 1 > width {
                break;
            }
            shown.insert(0, c);
            used += w;
        }
        shown
    };
    let cursor_x = inner
        .x
        .saturating_add(u16::try_from(shown.width()).unwrap_or(u16::MAX));
    frame.render_widget(Paragraph::new(sanitize(&shown)), inner);
    if (focused || prompting) && inner.height > 0 {
        frame.set_cursor_position(Position::new(cursor_x.min(inner.right()), inner.y));
    }
}

/// A rectangle of `width` × `height` centred in `area` (clamped to it).
fn centered(area: Rect, width: u16, height: u16) -> Rect {
    let width = width.min(area.width);
    let height = height.min(area.height);
    Rect::new(
        area.x + (area.width - width) / 2,
        area.y + (area.height - height) / 2,
        width,
        height,
    )
}

fn draw_menu(frame: &mut Frame<'_>, view: &View, selected: usize, area: Rect) {
    let items = view.menu_items();
    let width = items
        .iter()
        .map(|i| i.label(view).width())
        .max()
        .unwrap_or(0)
        + 6;
    let rect = centered(
        area,
        u16::try_from(width).unwrap_or(u16::MAX),
        u16::try_from(items.len() + 2).unwrap_or(u16::MAX),
    );
    let lines: Vec<Line<'static>> = items
        .iter()
        .enumerate()
        .map(|(i, item): (usize, &MenuItem)| {
            if i == selected {
                Line::styled(
                    format!(" › {} ", item.label(view)),
                    Style::new().add_modifier(Modifier::REVERSED | Modifier::BOLD),
                )
            } else {
                Line::raw(format!("   {} ", item.label(view)))
            }
        })
        .collect();
    let border = Border::default()
        .borders(Borders::ALL)
        .border_style(Style::new().fg(Color::Cyan))
        .title(Line::styled(" Session ", bold(Color::Cyan)));
    frame.render_widget(Clear, rect);
    frame.render_widget(Paragraph::new(lines).block(border), rect);
}

fn draw_editor(
    frame: &mut Frame<'_>,
    lines: &[String],
    (row, col): (usize, usize),
    error: Option<&str>,
    area: Rect,
) {
    // Everything but the header: the editor has the screen to itself.
    let rect = Rect::new(
        area.x,
        area.y + 1,
        area.width,
        area.height.saturating_sub(1),
    );
    let border = Border::default()
        .borders(Borders::ALL)
        .border_style(Style::new().fg(Color::Yellow))
        .title(Line::styled(
            " Edit the arguments (JSON object) ",
            bold(Color::Yellow),
        ))
        .title_bottom(Line::styled(
            " Ctrl+S apply · Esc cancel ",
            bold(Color::Yellow),
        ));
    let inner = border.inner(rect);
    frame.render_widget(Clear, rect);
    frame.render_widget(border, rect);
    let error_lines = error.map_or(0, |_| 1);
    let height = usize::from(inner.height).saturating_sub(error_lines).max(1);
    let top = row.saturating_sub(height - 1);
    let text: Vec<Line<'static>> = lines
        .iter()
        .skip(top)
        .take(height)
        .map(|l| Line::raw(sanitize(l)))
        .collect();
    frame.render_widget(Paragraph::new(text), inner);
    if let Some(error) = error
        && inner.height > 0
    {
        let at = Rect::new(inner.x, inner.bottom() - 1, inner.width, 1);
        frame.render_widget(
            Paragraph::new(Line::styled(
                fit(&format!("✗ {error}"), usize::from(inner.width)),
                bold(Color::Red),
            )),
            at,
        );
    }
    let before: String = lines
        .get(row)
        .map(|l| l.chars().take(col).collect())
        .unwrap_or_default();
    let x = inner
        .x
        .saturating_add(u16::try_from(before.width()).unwrap_or(u16::MAX));
    let y = inner
        .y
        .saturating_add(u16::try_from(row - top).unwrap_or(u16::MAX));
    if x < inner.right() && y < inner.bottom() {
        frame.set_cursor_position(Position::new(x, y));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use ratatui::Terminal;
    use ratatui::backend::TestBackend;

    use super::*;
    use crate::cmd::attach::testing::*;
    use crate::cmd::attach::view::{Action, Key};

    /// The screen as text lines (trailing spaces trimmed).
    fn screen(view: &View, width: u16, height: u16) -> Vec<String> {
        let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
        terminal.draw(|frame| draw(frame, view, now())).unwrap();
        let buffer = terminal.backend().buffer().clone();
        (0..height)
            .map(|y| {
                let mut line = String::new();
                for x in 0..width {
                    line.push_str(buffer[(x, y)].symbol());
                }
                line.trim_end().to_owned()
            })
            .collect()
    }

    fn show(lines: &[String]) -> String {
        lines.join("\n")
    }

    /// Compares the whole screen with the committed snapshot `snapshots/tui_<name>.snap`
    /// (`INSTA_UPDATE=always` rewrites it; CI never writes and fails on a difference).
    fn assert_screen(name: &str, lines: &[String]) {
        insta::with_settings!({prepend_module_to_snapshot => false, omit_expression => true}, {
            insta::assert_snapshot!(format!("tui_{name}"), show(lines));
        });
    }

    #[test]
    fn terminal_keys_map_to_viewer_keys() {
        let key = |code, modifiers| map_key(KeyEvent::new(code, modifiers));
        assert_eq!(
            key(KeyCode::Char('c'), KeyModifiers::CONTROL),
            Some(Key::Ctrl('c'))
        );
        assert_eq!(
            key(KeyCode::Char('P'), KeyModifiers::CONTROL),
            Some(Key::Ctrl('p'))
        );
        assert_eq!(
            key(KeyCode::Char('G'), KeyModifiers::SHIFT),
            Some(Key::Char('G'))
        );
        assert_eq!(
            key(KeyCode::Char('€'), KeyModifiers::NONE),
            Some(Key::Char('€'))
        );
        assert_eq!(key(KeyCode::PageUp, KeyModifiers::NONE), Some(Key::PageUp));
        assert_eq!(key(KeyCode::End, KeyModifiers::CONTROL), Some(Key::End));
        assert_eq!(key(KeyCode::BackTab, KeyModifiers::SHIFT), Some(Key::Tab));
        assert_eq!(key(KeyCode::F(5), KeyModifiers::NONE), None);
    }

    #[test]
    fn wrapping_breaks_at_spaces_and_hard_breaks_long_words() {
        assert_eq!(wrap("one two three", 7), vec!["one two", "three"]);
        assert_eq!(wrap("abcdefghij", 4), vec!["abcd", "efgh", "ij"]);
        assert_eq!(wrap("a\n\nb", 10), vec!["a", "", "b"]);
        assert_eq!(wrap("€400 refund", 5), vec!["€400", "refun", "d"]);
        assert_eq!(
            wrap("    \"call_id\": \"run_abc:def\"", 17),
            vec!["    \"call_id\":", "    \"run_abc:def\""]
        );
        assert_eq!(fit("support/refund-agent", 8), "support…");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(clock(3723), "1:02:03");
        assert_eq!(clock(-5), "0:00");
    }

    #[test]
    fn streaming_shows_header_transcript_status_and_input() {
        let mut view = started_view();
        view.apply(
            SessionEventExt::user("Can you check order ORD-1 for me?"),
            now(),
        );
        view.apply(delta("Let me look that up for you."), now());
        let lines = screen(&view, 100, 12);
        assert_screen("streaming", &lines);
        let expected = [
            " phrony · session run_6f1c2a9e… · support/refund-agent@0.1.0 · stub/scripted",
            "YOU",
            "  Can you check order ORD-1 for me?",
            "",
            "AGENT",
            "  Let me look that up for you.▍",
            "",
            "",
            " Streaming  tokens 0/20,000 (0%) │ time left 9:30",
            "┌ Message ─────────────────────────────────────────────────────────────────────────────────────────┐",
            "│                                                                                                  │",
            "└───────────────────────────────────── Enter send · PgUp/PgDn scroll · Ctrl+P menu · Ctrl+C detach ┘",
        ];
        assert_eq!(show(&lines), expected.join("\n"), "\n{}", show(&lines));
    }

    #[test]
    fn tool_calls_and_results_are_labelled_blocks() {
        let mut view = started_view();
        view.apply(
            tool_call("c1", "orders.lookup-order", r#"{"order_id":"ORD-1"}"#),
            now(),
        );
        view.apply(
            tool_ok("c1", r#"{"amount":400,"status":"delivered"}"#),
            now(),
        );
        view.apply(tool_failed("c2", "timeout", "worker timed out"), now());
        let lines = screen(&view, 60, 24);
        assert_screen("tool_blocks", &lines);
        let transcript = &lines[1..16];
        let expected = [
            "TOOL CALL orders.lookup-order@1.0.0",
            "  {",
            "    \"order_id\": \"ORD-1\"",
            "  }",
            "",
            "TOOL RESULT orders.lookup-order@1.0.0",
            "  {",
            "    \"amount\": 400,",
            "    \"status\": \"delivered\"",
            "  }",
            "",
            "TOOL FAILED call c2",
            "  [timeout] worker timed out",
            "",
            "",
        ];
        assert_eq!(transcript, expected, "\n{}", show(&lines));
    }

    #[test]
    fn the_approval_panel_shows_tool_policy_quorum_expiry_and_args() {
        let mut view = started_view();
        view.apply(
            tool_call(
                "c9",
                "payments.issue-refund",
                r#"{"amount":400,"order_id":"ORD-1"}"#,
            ),
            now(),
        );
        view.apply(approval(true), now());
        view.apply(status("awaiting_approval"), now());
        let lines = screen(&view, 80, 30);
        assert_screen("approval_panel", &lines);
        let start = lines
            .iter()
            .position(|l| l.starts_with("┌ APPROVAL REQUIRED"))
            .unwrap_or_else(|| panic!("\n{}", show(&lines)));
        let expected = [
            "┌ APPROVAL REQUIRED ───────────────────────────────────────── expires in 15:00 ┐",
            "│Tool    payments.issue-refund@1.0.0                                           │",
            "│Policy  payments/refund-approval-boundary@1.0.0                               │",
            "│Reason  refunds over 250 need a human                                         │",
            "│Quorum  0/1 approvals · on reject: return_to_agent                            │",
            "│Route   support-leads                                                         │",
            "│Confirm approving asks you to acknowledge you understood this call            │",
            "│Args    {                                                                     │",
            "│          \"amount\": 400,                                                      │",
            "│          \"order_id\": \"ORD-1\"                                                 │",
            "│        }                                                                     │",
            "└ a approve · d deny · e edit args ────────────────────────────────────────────┘",
            " Awaiting approval  tokens 0/20,000 (0%) │ time left 9:30",
            "┌ Message ─────────────────────────────────────────────────────────────────────┐",
            "│                                                                              │",
            "└─────────────────── a approve · d deny · e edit · Ctrl+P menu · Ctrl+C detach ┘",
        ];
        assert_eq!(
            &lines[start..start + expected.len()],
            expected,
            "\n{}",
            show(&lines)
        );
        assert!(
            lines[1..start]
                .iter()
                .any(|l| l == "APPROVAL REQUIRED payments.issue-refund@1.0.0")
        );

        // Pressing `a` asks for the acknowledgement, then the comment in the input box.
        view.key(Key::Char('a'));
        let lines = screen(&view, 80, 30);
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("┌ Approve · acknowledgement required")),
            "\n{}",
            show(&lines)
        );
        assert!(
            lines
                .iter()
                .any(|l| l.contains("Did you review the call and understand what it does? (y/n)"))
        );
        view.key(Key::Char('y'));
        for c in "Damage claim verified".chars() {
            view.key(Key::Char(c));
        }
        let lines = screen(&view, 80, 30);
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("┌ Approve · comment (optional)")),
            "\n{}",
            show(&lines)
        );
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("│Damage claim verified")),
            "\n{}",
            show(&lines)
        );
        assert!(matches!(view.key(Key::Enter), Some(Action::Decide(_))));
        let lines = screen(&view, 80, 30);
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with("└ approve sent · waiting for the runtime")),
            "\n{}",
            show(&lines)
        );
    }

    #[test]
    fn the_args_editor_shows_validation_errors_inline() {
        let mut view = started_view();
        view.apply(approval(false), now());
        view.key(Key::Char('e'));
        view.key(Key::Backspace);
        view.key(Key::Ctrl('s'));
        let lines = screen(&view, 80, 24);
        assert!(
            lines
                .iter()
                .any(|l| l.contains("Edit the arguments (JSON object)")),
            "\n{}",
            show(&lines)
        );
        assert!(
            lines.iter().any(|l| l.contains("✗ invalid JSON at line 4")),
            "\n{}",
            show(&lines)
        );
    }

    #[test]
    fn policy_denials_name_the_policy_and_reason() {
        let mut view = started_view();
        view.apply(
            tool_call("c1", "payments.issue-refund", r#"{"amount":14000}"#),
            now(),
        );
        view.apply(policy_denied("c1"), now());
        let lines = screen(&view, 80, 20);
        assert_screen("policy_denied", &lines);
        let at = lines
            .iter()
            .position(|l| l.starts_with("DENIED BY POLICY"))
            .unwrap_or_else(|| panic!("\n{}", show(&lines)));
        assert_eq!(
            lines[at],
            "DENIED BY POLICY payments/refund-hard-limit@1.0.0"
        );
        assert_eq!(
            lines[at + 1],
            "  payments.issue-refund@1.0.0 was not dispatched: refunds over 10000 are never"
        );
        assert_eq!(lines[at + 2], "  agent-initiated");
    }

    #[test]
    fn a_limit_blocks_the_input_and_says_so() {
        let mut view = started_view();
        view.apply(
            limit("run limit max_tokens_per_run exceeded (on_limit=halt)"),
            now(),
        );
        let lines = screen(&view, 90, 12);
        assert_screen("limit", &lines);
        let expected = [
            " phrony · session run_6f1c2a9e… · support/refund-agent@0.1.0 · stub/scripted",
            "── Limit reached: run limit max_tokens_per_run exceeded (on_limit=halt). Input is",
            "blocked; complete or cancel the session (Ctrl+P). ──",
            "",
            "",
            "",
            "",
            "",
            " Limit reached  turn 3 │ tokens 20,400/20,000 (102%) │ time left 9:30",
            "┌ Message ───────────────────────────────────────────────────────────────────────────────┐",
            "│input is blocked by a run limit                                                         │",
            "└───────────────────────────────────────────── Ctrl+P complete or cancel · Ctrl+C detach ┘",
        ];
        assert_eq!(show(&lines), expected.join("\n"), "\n{}", show(&lines));
    }

    #[test]
    fn a_finished_session_freezes_the_clock_and_offers_to_leave() {
        let mut view = started_view();
        view.apply(delta("Refund issued: rf_123."), now());
        view.apply(ready(1, 850), now());
        view.apply(completed(), now());
        let lines = screen(&view, 90, 12);
        assert_screen("finished", &lines);
        assert_eq!(lines[1], "AGENT");
        assert_eq!(lines[2], "  Refund issued: rf_123.");
        assert_eq!(lines[3], "  ── turn 1 · end_turn · 100 tokens");
        assert_eq!(lines[5], "── Session completed ──");
        assert_eq!(
            lines[8],
            " Finished  turn 1 │ tokens 850/20,000 (4%) │ time left 9:30"
        );
        assert_eq!(
            lines[10],
            "│the session has ended                                                                   │"
        );
        assert_eq!(
            lines[11],
            "└───────────────────────────────────────────────────── q/Ctrl+C leave · PgUp/PgDn scroll ┘"
        );
        view.key(Key::Ctrl('p'));
        let lines = screen(&view, 90, 12);
        assert!(
            lines.iter().any(|l| l.contains("› Close viewer")),
            "\n{}",
            show(&lines)
        );
    }

    #[test]
    fn a_narrow_terminal_truncates_without_losing_the_essentials() {
        let mut view = started_view();
        view.apply(
            delta("A long answer that has to wrap on a narrow terminal."),
            now(),
        );
        view.apply(approval(false), now());
        let lines = screen(&view, 30, 16);
        assert_screen("narrow", &lines);
        let expected = [
            " phrony · session run_6f1c2a9…",
            "  payments/refund-approval-bo║",
            "  undary@1.0.0: refunds over ║",
            "  250 need a human           █",
            "                             █",
            "┌ APPROVAL REQUIRED ─────────┐",
            "│Tool    payments.issue-refun│",
            "│        d@1.0.0             │",
            "│Policy  payments/refund-appr│",
            "│        oval-boundary@1.0.0 │",
            "│… 12 more lines (e shows al…│",
            "└ a approve · d deny · e edit┘",
            " Awaiting approval  tokens 0/2",
            "┌ Message ───────────────────┐",
            "│                            │",
            "└──────── a · d · e · Ctrl+P ┘",
        ];
        assert_eq!(show(&lines), expected.join("\n"), "\n{}", show(&lines));
        // Too small to draw anything useful: nothing panics.
        let _ = screen(&view, 3, 3);
        let _ = screen(&view, 12, 5);
    }

    #[test]
    fn control_characters_from_the_model_are_not_drawn() {
        let mut view = started_view();
        view.apply(delta("\u{1b}[2J\u{1b}[31mred\u{1b}[0m\u{7} text"), now());
        let lines = screen(&view, 40, 10);
        assert_eq!(lines[2], "  red text▍");
    }

    #[test]
    fn escape_sequences_in_the_header_are_not_drawn() {
        use phrony_client::interactive::SessionEvent;
        let mut evil = started();
        evil.model_name = "\u{1b}]0;evil title\u{7}scripted\u{1b}[2J".into();
        let mut view = View::new(None);
        view.apply(SessionEvent::Started(evil), now());
        let header = &screen(&view, 160, 10)[0];
        assert!(header.contains("stub/scripted"), "{header}");
        assert!(!header.contains("evil"), "{header}");
        assert!(!header.contains('\u{1b}'), "{header}");
    }

    /// Events the fixtures do not have.
    struct SessionEventExt;

    impl SessionEventExt {
        fn user(text: &str) -> phrony_client::interactive::SessionEvent {
            use phrony_client::interactive::{HistoryEntry, Role, SessionEvent};
            let mut started = started();
            started.history.push(HistoryEntry {
                role: Role::User,
                content: text.into(),
                stop_reason: None,
                turn_usage: None,
                turn_duration_ms: None,
            });
            SessionEvent::Started(started)
        }
    }
}
