//! `phrony sessions inspect ID`: a session, its delegated children and its merged timeline.

use std::io::{self, Write};

use phrony_client::{
    PayloadRef, SessionDetail, SessionInspection, TimelineDetail, TimelineEntry, TokenUsage,
    TruncatedPayload,
};
use serde_json::{Value, json};

use crate::cmd::approvals::approval_json;
use crate::cmd::table::Table;
use crate::cmd::{Global, Output, remote, render};

/// Longest JSON shown on one line of the text timeline (`--output json` has everything).
const MAX_INLINE_JSON: usize = 200;

/// Arguments of `phrony sessions inspect`.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The session id (`run_…`).
    session_id: String,
    /// Also print each event's payload (compact JSON, long ones cut) under its timeline line.
    #[arg(long)]
    payloads: bool,
    /// Output format (JSON has every field; payloads the runtime shortened are listed under
    /// `truncated`, with the `phrony sessions payload` command that prints each whole).
    #[arg(long, value_enum, default_value_t)]
    output: Output,
}

/// Prints the `=== Session <id> ===` block, the timeline and the children.
pub(crate) fn run(args: &Args, global: &Global) -> anyhow::Result<()> {
    let id = super::session_id(&args.session_id)?;
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let inspection = client
            .inspect_session(id)
            .await
            .map_err(remote::fails("inspect"))?;
        match args.output {
            Output::Json => render::json(&inspection_json(&inspection)),
            Output::Text => Ok(write_inspection(
                &inspection,
                args.payloads,
                &mut io::stdout().lock(),
            )?),
        }
    })
}

pub(crate) fn write_inspection(
    inspection: &SessionInspection,
    payloads: bool,
    out: &mut impl Write,
) -> io::Result<()> {
    write_session(&inspection.session, out)?;
    writeln!(out)?;
    writeln!(out, "Timeline:")?;
    if inspection.timeline.is_empty() {
        writeln!(out, "  (no entries)")?;
    }
    for entry in &inspection.timeline {
        write_entry(entry, &inspection.session.id, payloads, out)?;
    }
    for child in &inspection.session.children {
        write_children(child, out)?;
    }
    Ok(())
}

fn write_children(session: &SessionDetail, out: &mut impl Write) -> io::Result<()> {
    writeln!(out)?;
    write_session(session, out)?;
    for child in &session.children {
        write_children(child, out)?;
    }
    Ok(())
}

/// The header block of one session.
fn write_session(s: &SessionDetail, out: &mut impl Write) -> io::Result<()> {
    render::write_line(out, &format!("=== Session {} ===", s.id))?;
    let mut table = Table::headless(2);
    let mut field = |key: &str, value: String| table.row(vec![format!("{key}:"), value]);
    field("status", s.status.clone());
    if let Some(agent) = &s.agent {
        field("agent", agent.agent.to_string());
        field(
            "model",
            format!("{}/{}", agent.model_provider, agent.model_name),
        );
        let mut limits = Vec::new();
        if agent.max_tokens_per_run > 0 {
            limits.push(format!("max_tokens_per_run={}", agent.max_tokens_per_run));
        }
        if agent.max_wall_clock_seconds > 0 {
            limits.push(format!(
                "max_wall_clock_seconds={}",
                agent.max_wall_clock_seconds
            ));
        }
        if !limits.is_empty() {
            field("limits", limits.join(" "));
        }
    }
    if let Some(mode) = s.mode {
        field("mode", mode.to_string());
    }
    if let Some(starter) = &s.started_by {
        field("started_by", starter.to_string());
    }
    field("depth", s.depth.to_string());
    if let Some(parent) = &s.parent_session_id {
        field("parent", parent.clone());
    }
    if let Some(bundle) = &s.bundle_version_id {
        field("bundle_version", bundle.clone());
    }
    if !s.metadata.is_empty() {
        field(
            "metadata",
            s.metadata
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" "),
        );
    }
    if let Some(started) = s.started_at {
        let end = s.ended_at.unwrap_or_else(chrono::Utc::now);
        let elapsed = (end - started).num_milliseconds();
        #[allow(
            clippy::cast_precision_loss,
            reason = "a session's elapsed milliseconds are far below 2^52"
        )]
        let seconds = elapsed as f64 / 1000.0;
        let running = if s.ended_at.is_none() {
            " (running)"
        } else {
            ""
        };
        field("elapsed", format!("{seconds:.1}s{running}"));
    }
    if let Some(usage) = s.output.as_ref().and_then(|o| o.session_usage) {
        field("tokens", usage_text(usage));
    }
    if let Some(t) = s.created_at {
        field("created_at", render::time(t));
    }
    if let Some(t) = s.updated_at {
        field("updated_at", render::time(t));
    }
    if let Some(t) = s.ended_at {
        field("ended_at", render::time(t));
    }
    field("input", shown_json(&s.input, s.truncation("input")));
    if let Some(output) = &s.output {
        field(
            "output",
            match s.truncation("output.message") {
                Some(t) => truncated_text(&output.message, t),
                None => output.message.clone(),
            },
        );
        if !output.stop_reason.is_empty() {
            field("stop_reason", output.stop_reason.clone());
        }
        // `output.format: json`: the accepted output.
        match (&output.json, s.truncation("output.json")) {
            (_, Some(t)) => field("output_json", truncated_text("", t)),
            (Some(json), None) => field("output_json", inline_json(json)),
            (None, None) => {}
        }
    }
    if let Some(error) = &s.error {
        field("error", error.clone());
    }
    if !s.children.is_empty() {
        field(
            "children",
            s.children
                .iter()
                .map(|c| c.id.as_str())
                .collect::<Vec<_>>()
                .join(" "),
        );
    }
    table.write(out)
}

/// Actors the runtime itself records; any other actor is a person or a client (shown).
const RUNTIME_ACTORS: &[&str] = &["system", "agent", "policy", "worker"];

/// `ts +gap [source/kind] summary`, then detail lines indented by four spaces: the actor of
/// events caused by a person, the payload (with `payloads`), a call's worker, arguments and
/// result, an approval's outcome and votes.
fn write_entry(
    entry: &TimelineEntry,
    root: &str,
    payloads: bool,
    out: &mut impl Write,
) -> io::Result<()> {
    let ts = entry.timestamp.map_or_else(|| "-".to_owned(), render::time);
    let session = if entry.session_id.is_empty() || entry.session_id == root {
        String::new()
    } else {
        format!("(session {} depth {}) ", entry.session_id, entry.depth)
    };
    render::write_line(
        out,
        &format!(
            "{ts} +{}ms [{}/{}] {session}{}",
            entry.gap_ms, entry.source, entry.kind, entry.summary
        ),
    )?;
    match &entry.detail {
        TimelineDetail::Event(event) => {
            if !event.actor.is_empty() && !RUNTIME_ACTORS.contains(&event.actor.as_str()) {
                render::write_line(out, &format!("    actor: {}", event.actor_display()))?;
            }
            if payloads && !event.payload.is_null() {
                render::write_line(
                    out,
                    &format!(
                        "    payload: {}",
                        shown_json(&event.payload, entry.truncation("event.payload"))
                    ),
                )?;
            }
        }
        TimelineDetail::Invocation(call) => {
            let mut worker = format!("    status: {} attempt: {}", call.status, call.attempt);
            if let Some(identity) = &call.worker_identity {
                worker.push_str(&format!(" worker: {identity}"));
            }
            worker.push_str(&format!(
                " queue_ms: {} exec_ms: {}",
                call.queue_delay_ms, call.execution_duration_ms
            ));
            render::write_line(out, &worker)?;
            render::write_line(
                out,
                &format!(
                    "    args: {}",
                    shown_json(&call.args, entry.truncation("invocation.args"))
                ),
            )?;
            if !call.result.is_null() {
                render::write_line(
                    out,
                    &format!(
                        "    result: {}",
                        shown_json(&call.result, entry.truncation("invocation.result"))
                    ),
                )?;
            }
            if call.error_code.is_some() || call.error_message.is_some() {
                render::write_line(
                    out,
                    &format!(
                        "    error: {} {}",
                        call.error_code.as_deref().unwrap_or("-"),
                        call.error_message.as_deref().unwrap_or("")
                    ),
                )?;
            }
        }
        TimelineDetail::Approval(approval) if approval.is_outcome_review() => {
            // "Did it happen?": its resolution, by whom, and why.
            let mut line = format!(
                "    outcome review: {} status: {} resolution: {}",
                approval.id,
                approval.status,
                approval.resolution.as_deref().unwrap_or("-")
            );
            if let Some(by) = approval.decided_by_display() {
                line.push_str(&format!(" decided_by: {by}"));
            }
            if let Some(comment) = &approval.comment {
                line.push_str(&format!(" comment: {comment:?}"));
            }
            writeln!(out, "{line}")?;
            if let Some(question) = &approval.reason {
                writeln!(out, "    question: {question}")?;
            }
        }
        TimelineDetail::Approval(approval) => {
            let mut line = format!(
                "    approval: {} status: {} approvals: {}/{}",
                approval.id,
                approval.status,
                approval.approvals_received,
                approval.approvals_required
            );
            if let Some(by) = approval.decided_by_display() {
                line.push_str(&format!(" decided_by: {by}"));
            }
            if let Some(comment) = &approval.comment {
                line.push_str(&format!(" comment: {comment:?}"));
            }
            render::write_line(out, &line)?;
            for vote in &approval.votes {
                render::write_line(
                    out,
                    &format!("    vote: {}", crate::cmd::approvals::vote_text(vote)),
                )?;
                if let Some(voter) = crate::cmd::approvals::voter_text(vote) {
                    render::write_line(out, &format!("      {voter}"))?;
                }
            }
            // Edited arguments: the proposed and the effective ones together, as `approvals
            // show` prints them, at the approval's latest milestone.
            if approval.effective_args.is_some()
                && (entry.kind == "approval_decided" || approval.status == "pending")
            {
                write_approval_args(entry, approval, out)?;
            }
        }
        TimelineDetail::None => {}
    }
    Ok(())
}

/// The `args:` and `effective_args:` blocks of an approval entry; a field the runtime shortened
/// is one line saying how to print it whole.
fn write_approval_args(
    entry: &TimelineEntry,
    approval: &phrony_client::Approval,
    out: &mut impl Write,
) -> io::Result<()> {
    let shortened = ["args", "effective_args"]
        .iter()
        .any(|k| entry.truncation(&format!("approval.{k}")).is_some());
    if !shortened {
        return crate::cmd::approvals::write_args(out, "    ", approval);
    }
    for (key, value) in [
        ("args", Some(&approval.args)),
        ("effective_args", approval.effective_args.as_ref()),
    ] {
        let Some(value) = value else { continue };
        match entry.truncation(&format!("approval.{key}")) {
            Some(t) => {
                render::write_line(out, &format!("    {key}: {}", shown_json(value, Some(t))))?
            }
            None => crate::cmd::approvals::write_json_block(out, "    ", key, value)?,
        }
    }
    Ok(())
}

/// A JSON field on one line: [`inline_json`], or for a field the runtime shortened, its start,
/// its size and the command that prints it whole.
fn shown_json(value: &Value, truncated: Option<&TruncatedPayload>) -> String {
    match truncated {
        None => inline_json(value),
        Some(t) => truncated_text(&value.to_string(), t),
    }
}

/// `<start>… (3.1 MB, truncated; phrony sessions payload ID SEQ to print it whole)`.
fn truncated_text(shown: &str, t: &TruncatedPayload) -> String {
    let start: String = shown
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX_INLINE_JSON)
        .collect();
    format!(
        "{start}… ({}, truncated; {} to print it whole)",
        size_text(t.size_bytes),
        payload_command(&t.reference)
    )
}

/// `900 B`, `65.5 KB`, `3.1 MB` (decimal units).
fn size_text(bytes: u64) -> String {
    #[allow(clippy::cast_precision_loss, reason = "a size shown with one decimal")]
    let b = bytes as f64;
    if bytes >= 1_000_000 {
        format!("{:.1} MB", b / 1e6)
    } else if bytes >= 1_000 {
        format!("{:.1} KB", b / 1e3)
    } else {
        format!("{bytes} B")
    }
}

/// The `phrony sessions payload …` command that prints the payload `r` whole.
pub(super) fn payload_command(r: &PayloadRef) -> String {
    let mut cmd = format!("phrony sessions payload {}", r.session_id);
    if r.seq > 0 {
        cmd.push_str(&format!(" {}", r.seq));
        if r.field != "payload" {
            cmd.push_str(&format!(" --field {}", r.field));
        }
        return cmd;
    }
    if let Some(call) = &r.call_id {
        cmd.push_str(&format!(" --call {call}"));
    } else if let Some(approval) = &r.approval_id {
        cmd.push_str(&format!(" --approval {approval}"));
    }
    cmd.push_str(&format!(" --field {}", r.field));
    cmd
}

fn truncated_json(list: &[TruncatedPayload]) -> Value {
    Value::Array(
        list.iter()
            .map(|t| {
                json!({
                    "field": t.field,
                    "size_bytes": t.size_bytes,
                    "command": payload_command(&t.reference),
                })
            })
            .collect(),
    )
}

fn usage_text(u: TokenUsage) -> String {
    let estimated = if u.estimated { " (estimated)" } else { "" };
    format!(
        "input={} output={} total={}{estimated}",
        u.input_tokens, u.output_tokens, u.total_tokens
    )
}

/// Compact JSON on one line, cut at [`MAX_INLINE_JSON`] characters.
fn inline_json(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() <= MAX_INLINE_JSON {
        return text;
    }
    let cut: String = text.chars().take(MAX_INLINE_JSON).collect();
    format!("{cut}… (truncated; see --output json)")
}

fn usage_json(u: Option<TokenUsage>) -> Value {
    u.map_or(Value::Null, |u| {
        json!({
            "input_tokens": u.input_tokens,
            "output_tokens": u.output_tokens,
            "total_tokens": u.total_tokens,
            "estimated": u.estimated,
        })
    })
}

fn session_json(s: &SessionDetail) -> Value {
    json!({
        "id": s.id,
        "status": s.status,
        "parent_session_id": s.parent_session_id,
        "depth": s.depth,
        "agent_version_id": s.agent_version_id,
        "bundle_version_id": s.bundle_version_id,
        "agent": s.agent.as_ref().map(|a| json!({
            "agent": a.agent.to_string(),
            "namespace": a.agent.name.namespace,
            "name": a.agent.name.name,
            "version": a.agent.version,
            "model_provider": a.model_provider,
            "model_name": a.model_name,
            "max_tokens_per_run": a.max_tokens_per_run,
            "max_wall_clock_seconds": a.max_wall_clock_seconds,
        })),
        "mode": s.mode.map(|m| m.as_str()),
        "metadata": s.metadata,
        "started_by": super::ls::started_by_json(s.started_by.as_ref()),
        "created_at": render::json_time(s.created_at),
        "updated_at": render::json_time(s.updated_at),
        "started_at": render::json_time(s.started_at),
        "ended_at": render::json_time(s.ended_at),
        "input": s.input,
        "output": s.output.as_ref().map(|o| json!({
            "message": o.message,
            "stop_reason": o.stop_reason,
            "turn_usage": usage_json(o.turn_usage),
            "session_usage": usage_json(o.session_usage),
            "turns": o.turns.iter().map(|t| json!({
                "stop_reason": t.stop_reason,
                "usage": usage_json(t.usage),
                "duration_ms": t.duration_ms,
            })).collect::<Vec<_>>(),
        })),
        "error": s.error,
        "descriptive_metadata": s.descriptive_metadata,
        "children": s.children.iter().map(session_json).collect::<Vec<_>>(),
        "truncated": truncated_json(&s.truncated),
    })
}

fn entry_json(e: &TimelineEntry) -> Value {
    let mut entry = json!({
        "timestamp": render::json_time(e.timestamp),
        "gap_ms": e.gap_ms,
        "source": e.source,
        "kind": e.kind,
        "summary": e.summary,
        "session_id": e.session_id,
        "depth": e.depth,
        "truncated": truncated_json(&e.truncated),
    });
    let detail = match &e.detail {
        TimelineDetail::Event(ev) => Some((
            "event",
            json!({
                "id": ev.id,
                "type": ev.event_type,
                "seq": ev.seq,
                "session_id": ev.session_id,
                "turn": ev.turn,
                "call_id": ev.call_id,
                "actor": ev.actor,
                "actor_verification": ev.actor_verification,
                "actor_via": ev.actor_via,
                "payload": ev.payload,
            }),
        )),
        TimelineDetail::Invocation(call) => Some((
            "invocation",
            json!({
                "call_id": call.call_id,
                "tool": call.tool,
                "version": call.version,
                "turn": call.turn,
                "status": call.status,
                "attempt": call.attempt,
                "worker_identity": call.worker_identity,
                "args": call.args,
                "result": call.result,
                "error_code": call.error_code,
                "error_message": call.error_message,
                "queue_delay_ms": call.queue_delay_ms,
                "execution_duration_ms": call.execution_duration_ms,
            }),
        )),
        TimelineDetail::Approval(approval) => Some(("approval", approval_json(approval))),
        TimelineDetail::None => None,
    };
    if let (Some((key, value)), Some(map)) = (detail, entry.as_object_mut()) {
        map.insert(key.to_owned(), value);
    }
    entry
}

fn inspection_json(inspection: &SessionInspection) -> Value {
    json!({
        "session": session_json(&inspection.session),
        "timeline": inspection.timeline.iter().map(entry_json).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use std::collections::BTreeMap;

    use chrono::{DateTime, Utc};
    use phrony_client::SessionEvent;

    use super::*;

    fn at(text: &str) -> Option<DateTime<Utc>> {
        Some(
            DateTime::parse_from_rfc3339(text)
                .unwrap()
                .with_timezone(&Utc),
        )
    }

    fn session(id: &str) -> SessionDetail {
        SessionDetail {
            id: id.into(),
            status: "completed".into(),
            parent_session_id: None,
            depth: 0,
            agent_version_id: "v1".into(),
            bundle_version_id: None,
            agent: None,
            created_at: at("2025-01-31T09:30:00Z"),
            updated_at: None,
            started_at: at("2025-01-31T09:30:00Z"),
            ended_at: at("2025-01-31T09:30:02.500Z"),
            input: json!({"message": "hi"}),
            output: None,
            error: None,
            descriptive_metadata: Value::Null,
            metadata: BTreeMap::new(),
            mode: None,
            started_by: Some(phrony_client::Starter {
                actor: "emad".into(),
                verification: Some("unverified".into()),
                via: None,
            }),
            children: Vec::new(),
            truncated: Vec::new(),
        }
    }

    #[test]
    fn the_dump_has_a_header_a_timeline_and_children() {
        let mut root = session("run_root");
        let mut child = session("run_child");
        child.depth = 1;
        child.parent_session_id = Some("run_root".into());
        // A child started by a relaying principal: `alice via approvals-ui`.
        child.started_by = Some(phrony_client::Starter {
            actor: "alice".into(),
            verification: Some("token".into()),
            via: Some("approvals-ui".into()),
        });
        root.children.push(child);
        let inspection = SessionInspection {
            session: root,
            timeline: vec![
                TimelineEntry {
                    timestamp: at("2025-01-31T09:30:00Z"),
                    gap_ms: 0,
                    source: "event".into(),
                    kind: "approval.vote".into(),
                    summary: "vote approved by emad".into(),
                    session_id: "run_root".into(),
                    depth: 0,
                    seq: 1,
                    detail: TimelineDetail::Event(SessionEvent {
                        id: 1,
                        event_type: "approval.vote".into(),
                        payload: json!({"decision": "approved"}),
                        seq: 1,
                        session_id: "run_root".into(),
                        turn: 0,
                        call_id: None,
                        actor: "emad".into(),
                        // A relayed, verified voter.
                        actor_verification: Some("token".into()),
                        actor_via: Some("approvals-ui".into()),
                    }),
                    truncated: Vec::new(),
                },
                TimelineEntry {
                    timestamp: at("2025-01-31T09:30:01Z"),
                    gap_ms: 1000,
                    source: "event".into(),
                    kind: "session.completed".into(),
                    summary: "completed".into(),
                    session_id: "run_child".into(),
                    depth: 1,
                    seq: 2,
                    detail: TimelineDetail::None,
                    truncated: Vec::new(),
                },
            ],
        };
        let mut out = Vec::new();
        write_inspection(&inspection, false, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        insta::with_settings!({prepend_module_to_snapshot => false, omit_expression => true}, {
            insta::assert_snapshot!("inspect_dump", text);
        });
        let field = |key: &str, value: &str| {
            text.lines().any(|l| {
                l.strip_prefix(key)
                    .is_some_and(|rest| rest.trim_start() == value && rest.starts_with(' '))
            })
        };
        assert!(
            text.starts_with("=== Session run_root ===\nstatus: "),
            "{text}"
        );
        assert!(field("status:", "completed"), "{text}");
        assert!(field("elapsed:", "2.5s"), "{text}");
        assert!(field("input:", "{\"message\":\"hi\"}"), "{text}");
        assert!(field("children:", "run_child"), "{text}");
        assert!(
            text.contains(
                "2025-01-31T09:30:00Z +0ms [event/approval.vote] vote approved by emad\n    actor: emad via approvals-ui\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "+1000ms [event/session.completed] (session run_child depth 1) completed\n"
            ),
            "{text}"
        );
        assert!(text.contains("\n=== Session run_child ===\n"), "{text}");
        assert!(!text.contains("payload:"), "{text}");
        let mut out = Vec::new();
        write_inspection(&inspection, true, &mut out).unwrap();
        let with_payloads = String::from_utf8(out).unwrap();
        insta::with_settings!({prepend_module_to_snapshot => false, omit_expression => true}, {
            insta::assert_snapshot!("inspect_dump_with_payloads", with_payloads);
        });
        assert!(
            with_payloads.contains(
                "    actor: emad via approvals-ui\n    payload: {\"decision\":\"approved\"}\n"
            ),
            "{with_payloads}"
        );
        let json = inspection_json(&inspection);
        assert_eq!(json["timeline"][0]["event"]["actor"], "emad");
        assert_eq!(
            json["session"]["children"][0]["parent_session_id"],
            "run_root"
        );
    }

    fn approval(effective_args: Option<Value>, status: &str) -> phrony_client::Approval {
        phrony_client::Approval {
            id: "ap-1".into(),
            kind: "policy".into(),
            resolution: None,
            status: status.into(),
            session_id: "run_root".into(),
            call_id: "call-1".into(),
            agent_ref: None,
            agent_version_id: None,
            tool: "payments.issue-refund".into(),
            version: "1.0.0".into(),
            args: json!({"amount": 400, "order_id": "ORD-1"}),
            effective_args,
            route: None,
            reason: None,
            policy_ref: None,
            policy_name: None,
            policy_runtime: Value::Null,
            authority_ref: None,
            approvals_required: 1,
            approvals_received: 1,
            comprehension_required: false,
            on_reject: None,
            on_modify: None,
            call_hash: None,
            parent_approval_id: None,
            created_at: None,
            expires_at: None,
            decided_at: None,
            decided_by: Some("emad".into()),
            // Recorded before attribution existed: printed as before, without a marker.
            decided_by_verification: None,
            decided_by_via: None,
            allow_self_approval: false,
            comment: None,
            votes: Vec::new(),
        }
    }

    fn approval_entry(kind: &str, approval: phrony_client::Approval) -> TimelineEntry {
        TimelineEntry {
            timestamp: at("2025-01-31T09:30:00Z"),
            gap_ms: 0,
            source: "approval".into(),
            kind: kind.into(),
            summary: format!("approval {}", approval.status),
            session_id: "run_root".into(),
            depth: 0,
            seq: 0,
            detail: TimelineDetail::Approval(Box::new(approval)),
            truncated: Vec::new(),
        }
    }

    fn text_of(timeline: Vec<TimelineEntry>, root: SessionDetail) -> String {
        let mut out = Vec::new();
        write_inspection(
            &SessionInspection {
                session: root,
                timeline,
            },
            false,
            &mut out,
        )
        .unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn an_approval_decided_with_edited_arguments_shows_both_as_approvals_show_does() {
        let edited = json!({"amount": 300, "order_id": "ORD-1"});
        let text = text_of(
            vec![
                approval_entry(
                    "approval_created",
                    approval(Some(edited.clone()), "approved"),
                ),
                approval_entry(
                    "approval_decided",
                    approval(Some(edited.clone()), "approved"),
                ),
            ],
            session("run_root"),
        );
        let decided = text
            .split_once("[approval/approval_decided]")
            .unwrap_or_else(|| panic!("{text}"))
            .1;
        assert!(
            decided.contains(
                "    args:\n      {\n        \"amount\": 400,\n        \"order_id\": \"ORD-1\"\n      }\n    \
                 effective_args:\n      {\n        \"amount\": 300,\n        \"order_id\": \"ORD-1\"\n      }\n"
            ),
            "{text}"
        );
        // Once per approval: not again at the milestone before the decision.
        assert_eq!(text.matches("effective_args:").count(), 1, "{text}");
        // The same blocks as `approvals show`, indented under the entry.
        let mut shown = Vec::new();
        crate::cmd::approvals::write_args(&mut shown, "    ", &approval(Some(edited), "approved"))
            .unwrap();
        assert!(
            decided.contains(std::str::from_utf8(&shown).unwrap()),
            "{text}"
        );
        // Without an edit, nothing more than before.
        let plain = text_of(
            vec![approval_entry(
                "approval_decided",
                approval(None, "approved"),
            )],
            session("run_root"),
        );
        assert!(!plain.contains("args:"), "{plain}");
        // A pending approval an approver already edited (a quorum not reached yet) shows them at
        // its creation, its only milestone so far.
        let pending = text_of(
            vec![approval_entry(
                "approval_created",
                approval(Some(json!({"amount": 1})), "pending"),
            )],
            session("run_root"),
        );
        assert!(
            pending.contains("    effective_args:\n      {\n        \"amount\": 1\n"),
            "{pending}"
        );
    }

    #[test]
    fn shortened_payloads_say_their_size_and_how_to_print_them_whole() {
        let reference = |seq: u64, call: Option<&str>, field: &str| PayloadRef {
            session_id: "run_root".into(),
            seq,
            call_id: call.map(str::to_owned),
            approval_id: None,
            field: field.into(),
        };
        let mut root = session("run_root");
        root.input = json!("Refund… [truncated: 3500016 bytes of JSON]");
        root.truncated.push(TruncatedPayload {
            field: "input".into(),
            size_bytes: 3_500_016,
            reference: reference(0, None, "input"),
        });
        let event = TimelineEntry {
            timestamp: at("2025-01-31T09:30:00Z"),
            gap_ms: 0,
            source: "event".into(),
            kind: "message.user".into(),
            summary: "user (alice): Refund…".into(),
            session_id: "run_root".into(),
            depth: 0,
            seq: 3,
            detail: TimelineDetail::Event(SessionEvent {
                id: 3,
                event_type: "message.user".into(),
                payload: json!({"content": "yyyy… [truncated: 3500030 bytes of JSON]"}),
                seq: 3,
                session_id: "run_root".into(),
                turn: 1,
                call_id: None,
                actor: "alice".into(),
                actor_verification: Some("unverified".into()),
                actor_via: None,
            }),
            truncated: vec![TruncatedPayload {
                field: "event.payload".into(),
                size_bytes: 3_500_030,
                reference: reference(3, None, "payload"),
            }],
        };
        let call = TimelineEntry {
            source: "invocation".into(),
            kind: "invocation_completed".into(),
            summary: "succeeded orders.lookup-order@1.0.0".into(),
            seq: 0,
            detail: TimelineDetail::Invocation(phrony_client::ToolInvocation {
                call_id: "c1".into(),
                tool: "orders.lookup-order".into(),
                version: "1.0.0".into(),
                turn: 1,
                args: json!({"order_id": "ORD-1"}),
                result: json!({"found": false, "order_id": "ORD-999… [truncated: 3000030 bytes of JSON]"}),
                status: "succeeded".into(),
                worker_identity: None,
                attempt: 1,
                error_code: None,
                error_message: None,
                queue_delay_ms: 0,
                execution_duration_ms: 1,
            }),
            truncated: vec![TruncatedPayload {
                field: "invocation.result".into(),
                size_bytes: 3_000_030,
                reference: reference(0, Some("c1"), "result"),
            }],
            ..event.clone()
        };
        let mut out = Vec::new();
        write_inspection(
            &SessionInspection {
                session: root,
                timeline: vec![event, call],
            },
            true,
            &mut out,
        )
        .unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains(
                "input:       \"Refund… [truncated: 3500016 bytes of JSON]\"… (3.5 MB, truncated; \
                 phrony sessions payload run_root --field input to print it whole)\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "    payload: {\"content\":\"yyyy… [truncated: 3500030 bytes of JSON]\"}… (3.5 MB, \
                 truncated; phrony sessions payload run_root 3 to print it whole)\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "    result: {\"found\":false,\"order_id\":\"ORD-999… [truncated: 3000030 bytes of \
                 JSON]\"}… (3.0 MB, truncated; phrony sessions payload run_root --call c1 --field \
                 result to print it whole)\n"
            ),
            "{text}"
        );
        // Untouched fields print as before.
        assert!(
            text.contains("    args: {\"order_id\":\"ORD-1\"}\n"),
            "{text}"
        );
        assert_eq!(size_text(999), "999 B");
        assert_eq!(size_text(65_536), "65.5 KB");
    }

    #[test]
    fn long_json_is_cut_on_one_line() {
        let long = json!({"text": "x".repeat(500)});
        let shown = inline_json(&long);
        assert!(shown.ends_with("… (truncated; see --output json)"));
        assert!(shown.chars().count() < 260);
    }
}
