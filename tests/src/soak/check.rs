//! The soak's invariants, checked after every session of a trial ended, from the worker's
//! journal, the operator's record and the ledger as the runtime serves it (`VerifyAudit`,
//! `ExportAudit`, `InspectSession`); and the classification of each kill by the affected
//! call's last durable event.
//!
//! - **No double execution.** A `non_idempotent_write`, `irreversible_action` or unclassed
//!   call ran at most once (the journal); reads and idempotent writes may run again (counted),
//!   but no call ran more often than its dispatch was journaled.
//! - **Nothing lost or duplicated.** Every stream's sequence numbers are 1..n without a gap;
//!   each approval is opened once and decided once, and none is left pending; each voter
//!   votes at most once per approval, every vote the runtime acknowledged is recorded, and no
//!   recorded vote is one the operator did not cast; a call completes at most once.
//! - **The audit holds.** `VerifyAudit` (every chain, the sealed heads, the projections
//!   re-folded from the events) finds nothing; the harness also runs the offline
//!   `phrony-runtime audit verify --all` on the stopped daemon's database.
//! - **What was recorded is what happened.** Every session ended `completed`; a call the
//!   ledger says succeeded carries a result the worker returned for it (or the operator
//!   reported from the journal); a non-safe call the worker ran is never recorded as failed
//!   (the model was told it happened); the worker ran each call with the dispatched arguments,
//!   and an approver's edited arguments are the ones that ran.

use std::collections::BTreeMap;
use std::path::Path;

use phrony_client::{AuditScope, Client, ExportedEvent};
use serde_json::Value;

use super::worker::{JournalEntry, class_of, read_journal, safe_class};
use super::{Fault, TrialOutcome};

/// A vote the operator cast.
#[derive(Debug, Clone)]
pub struct Cast {
    /// The approval.
    pub approval_id: String,
    /// The voter.
    pub voter: String,
    /// Whether `DecideApproval` returned OK.
    pub acknowledged: bool,
}

/// A daemon kill.
#[derive(Debug, Clone)]
pub struct KillRecord {
    /// Which fault.
    pub fault: Fault,
    /// When the daemon was dead (after its exit was reaped), ms since the epoch.
    pub at_ms: u64,
    /// The call the trigger was about (none for a random kill).
    pub call_id: Option<String>,
}

/// What the checks read.
#[derive(Debug)]
pub struct Inputs<'a> {
    /// Runs the client's futures.
    pub rt: &'a tokio::runtime::Runtime,
    /// The client of the running daemon.
    pub client: &'a Client,
    /// The trial's sessions.
    pub sessions: &'a [String],
    /// The worker's journal.
    pub journal: &'a Path,
    /// The operator's votes.
    pub casts: &'a [Cast],
    /// The daemon kills.
    pub kills: &'a [KillRecord],
    /// The worker's stdout lines with their arrival time.
    pub lines: &'a [(u64, String)],
    /// See [`super::Options::tolerate_final_turn_rerun`].
    pub tolerate_final_turn_rerun: bool,
    /// See [`super::Options::tolerate_late_result_race`].
    pub tolerate_late_result_race: bool,
}

/// One exported event, decoded.
struct Ev {
    stream: String,
    seq: u64,
    kind: String,
    call_id: Option<String>,
    at_ms: u64,
    payload: Value,
}

fn decode(e: ExportedEvent) -> Ev {
    let at_ms = chrono::DateTime::parse_from_rfc3339(&e.ts)
        .map_or(0, |t| u64::try_from(t.timestamp_millis()).unwrap_or(0));
    Ev {
        stream: e.stream,
        seq: e.seq,
        kind: e.event_type,
        call_id: e.call_id.filter(|c| !c.is_empty()),
        at_ms,
        payload: serde_json::from_str(&e.payload_json).unwrap_or(Value::Null),
    }
}

fn text(v: &Value, key: &str) -> String {
    v[key].as_str().unwrap_or_default().to_owned()
}

/// Checks every invariant of a finished trial and classifies its kills.
#[must_use]
pub fn check_trial(inputs: &Inputs<'_>) -> TrialOutcome {
    let mut out = TrialOutcome::default();
    let v = &mut out.violations;
    match inputs
        .rt
        .block_on(inputs.client.verify_audit(&AuditScope::All))
    {
        Ok(report) => {
            if let Some(problem) = report.problem {
                v.push(format!("VerifyAudit: {problem:?}"));
            }
        }
        Err(e) => v.push(format!("VerifyAudit failed: {e}")),
    }
    let events = match export(inputs) {
        Ok(events) => events,
        Err(e) => {
            v.push(e);
            return out;
        }
    };
    out.events = events.len() as u64;
    check_sequences(&events, v);
    check_approvals(&events, inputs.casts, v);
    let journal = read_journal(inputs.journal).unwrap_or_else(|e| {
        v.push(e);
        Vec::new()
    });
    let (duplicates, reruns) = check_calls(&events, &journal, v);
    out.duplicates = duplicates;
    out.safe_reruns = reruns;
    for id in inputs.sessions {
        match inputs.rt.block_on(inputs.client.inspect_session(id)) {
            Ok(s) if s.session.status == "completed" => {}
            Ok(s) => {
                let log: Vec<String> = events
                    .iter()
                    .filter(|e| e.stream.contains(id.as_str()))
                    .map(|e| format!("{} {} @{}", e.seq, e.kind, e.at_ms))
                    .collect();
                let error = s.session.error.as_deref().unwrap_or_default();
                let known = s.session.status == "failed"
                    && ((inputs.tolerate_final_turn_rerun
                        && error.starts_with("unexpected completion call"))
                        || (inputs.tolerate_late_result_race
                            && error.ends_with("cannot go from succeeded to failed")));
                let target = if known {
                    &mut out.known_issues
                } else {
                    &mut *v
                };
                target.push(format!(
                    "session {id} ended {} ({:?}), expected completed; its log: {log:?}; kills at {:?}",
                    s.session.status,
                    s.session.error,
                    inputs.kills.iter().map(|k| k.at_ms).collect::<Vec<_>>()
                ));
            }
            Err(e) => v.push(format!("InspectSession {id}: {e}")),
        }
    }
    out.kills = inputs
        .kills
        .iter()
        .map(|k| {
            (
                k.fault.name().to_owned(),
                classify(k, &events, &journal, inputs.lines),
            )
        })
        .collect();
    out
}

fn export(inputs: &Inputs<'_>) -> Result<Vec<Ev>, String> {
    inputs.rt.block_on(async {
        let mut stream = inputs
            .client
            .export_audit(None, None)
            .await
            .map_err(|e| format!("ExportAudit: {e}"))?;
        let mut events = Vec::new();
        while let Some(e) = stream
            .next()
            .await
            .map_err(|e| format!("ExportAudit: {e}"))?
        {
            events.push(decode(e));
        }
        Ok(events)
    })
}

/// Every stream's sequence numbers are exactly 1..n.
fn check_sequences(events: &[Ev], v: &mut Vec<String>) {
    let mut streams: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for e in events {
        streams.entry(&e.stream).or_default().push(e.seq);
    }
    for (stream, mut seqs) in streams {
        seqs.sort_unstable();
        let expected: Vec<u64> = (1..=seqs.len() as u64).collect();
        if seqs != expected {
            v.push(format!(
                "stream {stream}: sequence numbers {seqs:?} are not 1..n"
            ));
        }
    }
}

/// Approvals opened and decided once, votes neither lost nor duplicated nor invented.
fn check_approvals(events: &[Ev], casts: &[Cast], v: &mut Vec<String>) {
    let mut opened: BTreeMap<String, u32> = BTreeMap::new();
    let mut decided: BTreeMap<String, u32> = BTreeMap::new();
    let mut votes: BTreeMap<(String, String), u32> = BTreeMap::new();
    for e in events {
        let id = text(&e.payload, "approval_id");
        match e.kind.as_str() {
            "approval.required" => *opened.entry(id).or_default() += 1,
            "approval.decided" => *decided.entry(id).or_default() += 1,
            "approval.vote" => {
                *votes
                    .entry((id, text(&e.payload, "decided_by")))
                    .or_default() += 1;
            }
            _ => {}
        }
    }
    for (id, n) in &opened {
        if *n != 1 {
            v.push(format!("approval {id} opened {n} times"));
        }
        match decided.get(id) {
            Some(1) => {}
            Some(n) => v.push(format!("approval {id} decided {n} times")),
            None => v.push(format!("approval {id} never decided")),
        }
    }
    for id in decided.keys() {
        if !opened.contains_key(id) {
            v.push(format!("approval {id} decided but never opened"));
        }
    }
    for ((id, voter), n) in &votes {
        if *n != 1 {
            v.push(format!("{voter} voted {n} times on approval {id}"));
        }
        if !casts
            .iter()
            .any(|c| c.approval_id == *id && c.voter == *voter)
        {
            v.push(format!(
                "a vote by {voter} on {id} that the operator never cast"
            ));
        }
    }
    for c in casts.iter().filter(|c| c.acknowledged) {
        if !votes.contains_key(&(c.approval_id.clone(), c.voter.clone())) {
            v.push(format!(
                "LOST VOTE: {} on {} was acknowledged but is not in the log",
                c.voter, c.approval_id
            ));
        }
    }
}

/// The calls against the worker's journal; returns (duplicates, allowed re-runs).
fn check_calls(events: &[Ev], journal: &[JournalEntry], v: &mut Vec<String>) -> (u64, u64) {
    let mut tools: BTreeMap<&str, String> = BTreeMap::new();
    let mut dispatched: BTreeMap<&str, Vec<&Value>> = BTreeMap::new();
    let mut completed: BTreeMap<&str, Vec<&Value>> = BTreeMap::new();
    let mut edited: BTreeMap<&str, &Value> = BTreeMap::new();
    for e in events {
        let Some(call) = e.call_id.as_deref() else {
            continue;
        };
        match e.kind.as_str() {
            "tool.requested" => {
                tools.insert(call, text(&e.payload, "tool"));
            }
            "tool.dispatched" => dispatched.entry(call).or_default().push(&e.payload["args"]),
            "tool.completed" => completed.entry(call).or_default().push(&e.payload),
            "approval.decided" if e.payload["approved"] == Value::Bool(true) => {
                if let Some(args) = e.payload.get("effective_args").filter(|a| !a.is_null()) {
                    edited.insert(call, args);
                }
            }
            _ => {}
        }
    }
    let mut runs: BTreeMap<&str, Vec<(&Value, &Value)>> = BTreeMap::new();
    for entry in journal {
        let JournalEntry::Exec {
            call_id,
            args,
            result,
            ..
        } = entry;
        runs.entry(call_id).or_default().push((args, result));
    }
    let (mut duplicates, mut reruns) = (0, 0);
    for (call, execs) in &runs {
        let tool = tools.get(call).map_or("?", String::as_str);
        let class = class_of(tool).unwrap_or("?");
        let extra = execs.len() as u64 - 1;
        if safe_class(class) {
            reruns += extra;
        } else if extra > 0 {
            duplicates += extra;
            v.push(format!(
                "DOUBLE EXECUTION: {call} ({tool}, class {class:?}) ran {} times",
                execs.len()
            ));
        }
        // Every execution follows its own durable dispatch (the journal line before the
        // invoke), so a re-run of a read is one the runtime decided, never a stray resend.
        let journaled = dispatched.get(call).map_or(0, Vec::len);
        if execs.len() > journaled {
            v.push(format!(
                "{call} ({tool}) ran {} times but was dispatched {journaled} times",
                execs.len()
            ));
        }
        for (args, _) in execs {
            if !dispatched.get(call).is_some_and(|d| d.contains(args)) {
                v.push(format!(
                    "{call} ran with {args}, which was never dispatched"
                ));
            }
            if let Some(want) = edited.get(call)
                && *args != *want
            {
                v.push(format!("{call} ran with {args}, the approver set {want}"));
            }
        }
        match completed.get(call).map(Vec::as_slice) {
            Some([done]) if done["status"] == "succeeded" => {}
            Some([done]) if safe_class(class) => {
                // A read may be reported failed (its outcome unknown) and re-run later.
                let _ = done;
            }
            Some([done]) => v.push(format!(
                "{call} ({tool}) ran but the model was told {}: {}",
                done["status"], done["error_message"]
            )),
            Some(_) => {} // reported below
            None => v.push(format!("{call} ran but its result was never recorded")),
        }
    }
    for (call, done) in &completed {
        if done.len() > 1 {
            v.push(format!("{call} completed {} times", done.len()));
        }
        for d in done.iter().filter(|d| d["status"] == "succeeded") {
            let ran = runs
                .get(call)
                .is_some_and(|r| r.iter().any(|(_, res)| **res == d["result"]));
            if !ran {
                v.push(format!(
                    "{call} recorded the result {} that the worker never returned",
                    d["result"]
                ));
            }
        }
    }
    (duplicates, reruns)
}

/// The commit point a kill hit: the affected call's last event before the kill, refined by
/// what the worker had done (received the invoke, sent the result).
fn classify(
    kill: &KillRecord,
    events: &[Ev],
    journal: &[JournalEntry],
    lines: &[(u64, String)],
) -> String {
    let before: Vec<&Ev> = events.iter().filter(|e| e.at_ms <= kill.at_ms).collect();
    let call = kill.call_id.clone().or_else(|| {
        before
            .iter()
            .filter(|e| e.call_id.is_some())
            .max_by_key(|e| (e.at_ms, e.seq))
            .and_then(|e| e.call_id.clone())
    });
    let Some(call) = call else {
        return "before_any_call".to_owned();
    };
    let last = before
        .iter()
        .filter(|e| e.call_id.as_deref() == Some(call.as_str()))
        .max_by_key(|e| (e.at_ms, e.seq));
    let Some(last) = last else {
        return "decision_pending".to_owned();
    };
    let point = match last.kind.as_str() {
        "tool.requested" | "tool.queued" | "tool.policy_denied" => "decision_recorded",
        "approval.required" => "approval_opened",
        "approval.vote" | "approval.decided" => "vote_recorded",
        "tool.dispatched" => {
            let sent = lines.iter().any(|(at, l)| {
                *at <= kill.at_ms
                    && l.strip_prefix("RESULT ")
                        .and_then(|rest| rest.split_whitespace().next())
                        == Some(call.as_str())
            });
            let received = journal
                .iter()
                .any(|JournalEntry::Exec { call_id, at_ms, .. }| {
                    *call_id == call && *at_ms <= kill.at_ms
                });
            if sent {
                "result_received"
            } else if received {
                "invoke_sent"
            } else {
                "dispatch_journaled"
            }
        }
        "tool.completed" | "tool.late_result" => {
            // The session may have moved on: name the step it had recorded last.
            let latest = before
                .iter()
                .filter(|e| e.stream == last.stream)
                .max_by_key(|e| e.seq)
                .map_or("", |e| e.kind.as_str());
            match latest {
                "model.completion" => "next_model_turn_recorded",
                "message.assistant" => "assistant_message_recorded",
                "session.completed" | "session.status_changed" => "session_status_recorded",
                _ => "result_recorded",
            }
        }
        "tool.indeterminate" => "indeterminate_recorded",
        other => return format!("other:{other}"),
    };
    point.to_owned()
}

#[cfg(test)]
mod tests {
    //! The checks themselves, on made-up logs: each broken invariant is reported.

    use serde_json::json;

    use super::*;

    fn ev(stream: &str, seq: u64, kind: &str, call: &str, payload: Value) -> Ev {
        Ev {
            stream: stream.into(),
            seq,
            kind: kind.into(),
            call_id: Some(call.into()).filter(|c: &String| !c.is_empty()),
            at_ms: seq,
            payload,
        }
    }

    fn cast(voter: &str, acknowledged: bool) -> Cast {
        Cast {
            approval_id: "ap".into(),
            voter: voter.into(),
            acknowledged,
        }
    }

    #[test]
    fn a_gap_in_a_stream_is_reported() {
        let mut v = Vec::new();
        let events = [
            ev("s", 1, "session.started", "", json!({})),
            ev("s", 3, "session.completed", "", json!({})),
        ];
        check_sequences(&events, &mut v);
        assert_eq!(v, ["stream s: sequence numbers [1, 3] are not 1..n"]);
    }

    #[test]
    fn lost_duplicated_and_invented_votes_are_reported() {
        let vote = |seq, by: &str| {
            ev(
                "s",
                seq,
                "approval.vote",
                "c",
                json!({"approval_id": "ap", "decided_by": by}),
            )
        };
        let events = [
            ev(
                "s",
                1,
                "approval.required",
                "c",
                json!({"approval_id": "ap"}),
            ),
            vote(2, "alice"),
            vote(3, "alice"),
            vote(4, "mallory"),
            ev(
                "s",
                5,
                "approval.decided",
                "c",
                json!({"approval_id": "ap"}),
            ),
        ];
        let mut v = Vec::new();
        check_approvals(&events, &[cast("alice", true), cast("bob", true)], &mut v);
        assert_eq!(
            v,
            [
                "alice voted 2 times on approval ap",
                "a vote by mallory on ap that the operator never cast",
                "LOST VOTE: bob on ap was acknowledged but is not in the log",
            ]
        );
    }

    #[test]
    fn a_second_execution_of_a_write_is_a_double_execution_and_of_a_read_a_rerun() {
        let args = json!({"to": "ACC-9", "amount": 450});
        let exec = |call: &str, tool: &str, n| JournalEntry::Exec {
            call_id: call.into(),
            tool: tool.into(),
            args: args.clone(),
            execution: n,
            result: json!({"execution": n}),
            at_ms: 0,
        };
        let mut events = Vec::new();
        for (call, tool) in [
            ("w", "payments.transfer-funds"),
            ("r", "orders.lookup-order"),
        ] {
            events.push(ev("s", 1, "tool.requested", call, json!({"tool": tool})));
            for seq in [2, 3] {
                events.push(ev("s", seq, "tool.dispatched", call, json!({"args": args})));
            }
            events.push(ev(
                "s",
                4,
                "tool.completed",
                call,
                json!({"status": "succeeded", "result": {"execution": 2}}),
            ));
        }
        let journal = [
            exec("w", "payments.transfer-funds", 1),
            exec("w", "payments.transfer-funds", 2),
            exec("r", "orders.lookup-order", 1),
            exec("r", "orders.lookup-order", 2),
        ];
        let mut v = Vec::new();
        assert_eq!(check_calls(&events, &journal, &mut v), (1, 1));
        assert_eq!(
            v,
            [
                "DOUBLE EXECUTION: w (payments.transfer-funds, class \"non_idempotent_write\") ran 2 times"
            ]
        );
    }

    #[test]
    fn a_result_the_worker_never_returned_and_an_unrecorded_run_are_reported() {
        let events = [
            ev(
                "s",
                1,
                "tool.requested",
                "a",
                json!({"tool": "notes.append-note"}),
            ),
            ev("s", 2, "tool.dispatched", "a", json!({"args": {}})),
            ev(
                "s",
                3,
                "tool.completed",
                "a",
                json!({"status": "succeeded", "result": {"x": 1}}),
            ),
            ev(
                "s",
                4,
                "tool.requested",
                "b",
                json!({"tool": "notes.append-note"}),
            ),
            ev("s", 5, "tool.dispatched", "b", json!({"args": {}})),
        ];
        let journal = [JournalEntry::Exec {
            call_id: "b".into(),
            tool: "notes.append-note".into(),
            args: json!({}),
            execution: 1,
            result: json!({"x": 2}),
            at_ms: 0,
        }];
        let mut v = Vec::new();
        check_calls(&events, &journal, &mut v);
        assert_eq!(
            v,
            [
                "b ran but its result was never recorded",
                "a recorded the result {\"x\":1} that the worker never returned",
            ]
        );
    }
}
