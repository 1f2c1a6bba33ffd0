//! Unit tests of the attach view (`attach.rs`): catch-up folding and live activity.

#![allow(
    clippy::unwrap_used,
    reason = "tests: a panic is a failed assertion, with its message"
)]

use serde_json::json;

use super::*;

struct Log {
    seq: u64,
}

impl Log {
    fn new() -> Self {
        Self { seq: 0 }
    }

    fn event(&mut self, event_type: &str, turn: Option<u32>, payload: Value) -> Event {
        self.seq += 1;
        Event {
            stream: "run_x".into(),
            seq: self.seq,
            event_type: event_type.into(),
            ts: Utc::now(),
            actor: "system".into(),
            actor_verification: None,
            actor_via: None,
            call_id: None,
            turn,
            payload,
            prev_hash: String::new(),
            hash: String::new(),
        }
    }

    fn completion(&mut self, turn: u32, iteration: u32) -> Event {
        self.event(
            types::MODEL_COMPLETION,
            Some(turn),
            json!({"turn": turn, "iteration": iteration, "stop_reason": "end_turn",
                   "usage": {"input_tokens": 20, "output_tokens": 5}, "duration_ms": 3}),
        )
    }

    fn assistant(&mut self, turn: u32, content: &str, stop_reason: Option<&str>) -> Event {
        let mut payload = json!({"role": "assistant", "content": content});
        if let Some(r) = stop_reason {
            payload["stop_reason"] = json!(r);
        }
        self.event(types::MESSAGE_ASSISTANT, Some(turn), payload)
    }
}

fn texts(items: &[Activity]) -> String {
    items
        .iter()
        .filter_map(|a| match a {
            Activity::Text(t) => Some(t.as_str()),
            _ => None,
        })
        .collect()
}

#[test]
fn streamed_text_is_shown_once() {
    let mut log = Log::new();
    let mut view = SessionView::default();
    let mut shown = Vec::new();
    shown.extend(view.delta(1, 0, 0, "Refund "));
    shown.extend(view.delta(1, 0, 7, "issued."));
    // A delta delivered twice (e.g. by a catch-up and the subscription) is shown once.
    shown.extend(view.delta(1, 0, 7, "issued."));
    shown.extend(view.apply(&log.completion(1, 0)).unwrap());
    // A delta that arrives after its completion was recorded is dropped.
    shown.extend(view.delta(1, 0, 7, "issued."));
    shown.extend(
        view.apply(&log.assistant(1, "Refund issued.", Some("end_turn")))
            .unwrap(),
    );
    assert_eq!(texts(&shown), "Refund issued.");
}

#[test]
fn a_missed_delta_is_filled_in_from_the_recorded_message() {
    let mut log = Log::new();
    let mut view = SessionView::default();
    let mut shown = Vec::new();
    shown.extend(view.delta(1, 0, 0, "Looking "));
    // "up " was lost (a slow subscriber); what follows is not shown out of order.
    shown.extend(view.delta(1, 0, 11, "the order."));
    assert_eq!(texts(&shown), "Looking ");
    shown.extend(view.apply(&log.completion(1, 0)).unwrap());
    shown.extend(
        view.apply(&log.assistant(1, "Looking up the order.", None))
            .unwrap(),
    );
    assert_eq!(texts(&shown), "Looking up the order.");
    // A client that saw no delta at all gets the whole text from the event.
    let mut log = Log::new();
    let mut fresh = SessionView::default();
    let mut all = fresh.apply(&log.completion(1, 0)).unwrap();
    all.extend(
        fresh
            .apply(&log.assistant(1, "Looking up the order.", None))
            .unwrap(),
    );
    assert_eq!(texts(&all), "Looking up the order.");
}

#[test]
fn deltas_of_the_next_completion_may_overtake_the_previous_ones_events() {
    let mut log = Log::new();
    let mut view = SessionView::default();
    let mut shown = Vec::new();
    shown.extend(view.delta(1, 0, 0, "Let me look. "));
    // The second completion streams before the first one's events were read.
    shown.extend(view.delta(1, 1, 0, "Found "));
    shown.extend(view.apply(&log.completion(1, 0)).unwrap());
    shown.extend(
        view.apply(&log.assistant(1, "Let me look. ", None))
            .unwrap(),
    );
    shown.extend(view.delta(1, 1, 6, "it."));
    shown.extend(view.apply(&log.completion(1, 1)).unwrap());
    shown.extend(
        view.apply(&log.assistant(1, "Found it.", Some("end_turn")))
            .unwrap(),
    );
    assert_eq!(texts(&shown), "Let me look. Found it.");
}

fn approval_required(log: &mut Log, id: Uuid, required: u32) -> Event {
    log.event(
        types::APPROVAL_REQUIRED,
        None,
        json!({
            "approval_id": id, "call_id": "c1", "tool": "payments.issue-refund",
            "version": "1.0.0", "args": {"amount": 400}, "call_hash": "h",
            "agent_version_id": Uuid::nil(), "agent_ref": "support/refund-agent@0.1.0",
            "policy_ref": "payments/refund-approval-boundary@1.0.0", "policy_runtime": {},
            "reason": "Refund amount above delegated limit.", "route": "", "authority_ref": "",
            "approvals_required": required, "comprehension_required": false,
            "on_reject": "return_to_agent", "on_modify": "revalidate", "escalation_depth": 0
        }),
    )
}

fn vote(log: &mut Log, id: Uuid, by: &str, decision: &str, comment: &str) -> Event {
    log.event(
        types::APPROVAL_VOTE,
        None,
        json!({"approval_id": id, "call_id": "c1", "decided_by": by, "decision": decision,
               "comment": comment, "comprehension_acknowledged": false}),
    )
}

fn decided(log: &mut Log, id: Uuid, status: &str, by: &str, comment: &str) -> Event {
    log.event(
        types::APPROVAL_DECIDED,
        None,
        json!({"approval_id": id, "call_id": "c1", "status": status,
               "approved": status == "approved", "decided_by": by, "comment": comment,
               "on_reject": "return_to_agent"}),
    )
}

#[test]
fn votes_below_the_quorum_are_pending_decisions() {
    let mut log = Log::new();
    let mut view = SessionView::default();
    let id = Uuid::new_v4();
    let opened = view.apply(&approval_required(&mut log, id, 2)).unwrap();
    assert!(matches!(&opened[..], [Activity::ApprovalRequired(r)] if r.approvals_required == 2));
    let first = view
        .apply(&vote(&mut log, id, "emad", "approved", "ok"))
        .unwrap();
    let [Activity::ApprovalDecided(d)] = &first[..] else {
        panic!("{first:?}")
    };
    assert_eq!(
        (d.status, d.approvals_received, d.decided_by.as_str()),
        (ApprovalStatus::Pending, 1, "emad")
    );
    // The deciding vote shows only as the decision.
    assert!(
        view.apply(&vote(&mut log, id, "sara", "approved", ""))
            .unwrap()
            .is_empty()
    );
    let done = view
        .apply(&decided(&mut log, id, "approved", "sara", ""))
        .unwrap();
    let [Activity::ApprovalDecided(d)] = &done[..] else {
        panic!("{done:?}")
    };
    assert_eq!(
        (d.status, d.approvals_received),
        (ApprovalStatus::Approved, 2)
    );
}

#[test]
fn a_rejection_is_the_calls_result_with_the_comment() {
    let mut log = Log::new();
    let mut view = SessionView::default();
    let id = Uuid::new_v4();
    view.apply(&approval_required(&mut log, id, 1)).unwrap();
    assert!(
        view.apply(&vote(&mut log, id, "emad", "denied", "No damage claim."))
            .unwrap()
            .is_empty()
    );
    let out = view
        .apply(&decided(&mut log, id, "denied", "emad", "No damage claim."))
        .unwrap();
    let [Activity::ApprovalDecided(d), Activity::ToolResult(r)] = &out[..] else {
        panic!("{out:?}")
    };
    assert_eq!(d.status, ApprovalStatus::Denied);
    assert_eq!(r.error_code.as_deref(), Some("approval_denied"));
    assert_eq!(
        r.error_message.as_deref(),
        Some("tool call c1 was rejected by emad: No damage claim.")
    );
    // A later cancellation of the same call is not a second result.
    let again = view
        .apply(&log.event(
            types::TOOL_CANCELLED,
            None,
            json!({"call_id": "c1", "from": "failed", "reason": "session ended"}),
        ))
        .unwrap();
    assert!(again.is_empty(), "{again:?}");
}

#[test]
fn an_event_the_schema_cannot_read_is_an_error_not_a_default() {
    let mut log = Log::new();
    let mut view = SessionView::default();
    // A renamed field: `text` instead of `content`.
    let renamed = log.event(
        types::MESSAGE_ASSISTANT,
        Some(1),
        json!({"role": "assistant", "text": "Refund issued."}),
    );
    let err = view.apply(&renamed).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Internal);
    assert!(
        err.message
            .contains("seq 1: event type message.assistant: payload")
            && err.message.contains("missing field `content`"),
        "{err}"
    );
    assert_eq!(view.last_seq(), 0, "the unreadable event is not applied");
    let unknown = log.event("tool.teleported", None, json!({}));
    let err = view.apply(&unknown).unwrap_err();
    assert!(err.message.contains("unknown event type"), "{err}");
}
