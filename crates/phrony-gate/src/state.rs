//! The gate's events and the projections rebuilt from them.
//!
//! One `apply` function serves both the live path (after an append) and the replay on start,
//! so a restarted gate holds exactly the state it had (pending escalations included).

use std::collections::{BTreeMap, HashMap, VecDeque};

use chrono::{DateTime, Datelike as _, Utc};
use rust_decimal::Decimal;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::oidc::VerifiedUser;

pub(crate) const EV_DECISION: &str = "gate.decision";
pub(crate) const EV_REPLAY: &str = "gate.decision_replayed";
pub(crate) const EV_APPROVAL: &str = "gate.approval_decided";
pub(crate) const EV_COMPLETED: &str = "gate.completed";
pub(crate) const EV_CONSOLE_LOGIN: &str = "gate.console_login";

/// allow | deny | escalate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Allowed.
    Allow,
    /// Denied.
    Deny,
    /// Escalated to a human.
    Escalate,
}

impl Verdict {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Deny => "deny",
            Self::Escalate => "escalate",
        }
    }
}

/// An amount reserved against a mandate's counters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Hold {
    pub(crate) mandate_id: String,
    #[serde(with = "rust_decimal::serde::str")]
    pub(crate) amount: Decimal,
    /// UTC day `YYYY-MM-DD` and month `YYYY-MM` the amount counts in.
    pub(crate) day: String,
    pub(crate) month: String,
    pub(crate) entity: Option<String>,
    pub(crate) reference: Option<String>,
    #[serde(default, with = "rust_decimal::serde::str_option")]
    pub(crate) reference_amount: Option<Decimal>,
}

/// The escalation object of an escalate decision.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Escalation {
    #[serde(rename = "type")]
    pub(crate) kind: String,
    #[serde(rename = "ref")]
    pub(crate) reference: String,
    pub(crate) approver: String,
    pub(crate) expires_at: DateTime<Utc>,
}

/// The payload of `gate.decision`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct DecisionEvent {
    pub(crate) decision_id: String,
    pub(crate) at: DateTime<Utc>,
    pub(crate) agent_id: String,
    pub(crate) tool: String,
    pub(crate) action: String,
    pub(crate) resource: Option<String>,
    pub(crate) args_hash: String,
    pub(crate) fingerprint: String,
    pub(crate) idempotency_key: Option<String>,
    pub(crate) verdict: Verdict,
    pub(crate) code: Option<String>,
    pub(crate) reason: Option<String>,
    /// The purchase currency a refusal is about.
    pub(crate) refusal_currency: Option<String>,
    pub(crate) policies: Vec<String>,
    #[serde(default, with = "rust_decimal::serde::str_option")]
    pub(crate) amount: Option<Decimal>,
    pub(crate) currency: Option<String>,
    pub(crate) payee: Option<String>,
    pub(crate) mandate_id: Option<String>,
    pub(crate) hold: Option<Hold>,
    /// Counted for `DUPLICATE_REQUEST` (a money allow without idempotency key).
    pub(crate) duplicate_guard: bool,
    pub(crate) user: Option<VerifiedUser>,
    pub(crate) intent: Option<String>,
    /// The request's context as received, without `user_token` (evidence for audits and
    /// replays of the policy).
    #[serde(default)]
    pub(crate) facts: serde_json::Map<String, Value>,
    pub(crate) escalation: Option<Escalation>,
    /// The approval this allow consumed.
    pub(crate) approval_ref: Option<String>,
    pub(crate) risk_score: Option<f64>,
    pub(crate) assertion_scheme: String,
    pub(crate) assertion_kid: Option<String>,
    pub(crate) key_label: Option<String>,
    /// The allow token's claims without `iat`, `exp` and `jti` (re-minted on replay).
    pub(crate) claims: Option<Value>,
    /// Observe mode: the refusal this allow would have been.
    #[serde(default)]
    pub(crate) observed_code: Option<String>,
    /// Observe mode: its reason.
    #[serde(default)]
    pub(crate) observed_reason: Option<String>,
    /// Decided on a routing route: on allow, the gate itself forwards the call. After a restart
    /// an uncompleted routed allow may have been forwarded already, so it is never forwarded
    /// again until someone completes it (see `Gate::forward_state`). Absent in older logs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(crate) routed: bool,
}

/// The payload of `gate.console_login`: a console sign-in, successful or refused (refusals only
/// for a configured manager or the admin key, so that guessed usernames cannot grow the log).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ConsoleLoginEvent {
    pub(crate) at: DateTime<Utc>,
    /// The manager's username, or `admin` for the admin key.
    pub(crate) user: String,
    /// `manager` or `admin_key`.
    pub(crate) via: String,
    /// The manager's role, on success.
    pub(crate) role: Option<String>,
    /// `signed_in` or `refused`.
    pub(crate) outcome: String,
}

/// The payload of `gate.decision_replayed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ReplayEvent {
    pub(crate) decision_id: String,
    pub(crate) at: DateTime<Utc>,
    pub(crate) agent_id: String,
    pub(crate) idempotency_key: Option<String>,
    pub(crate) verdict: Verdict,
}

/// approved | rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovalOutcome {
    /// A human approved.
    Approved,
    /// A human rejected.
    Rejected,
}

/// Who decided an approval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Approver {
    pub(crate) sub: String,
    pub(crate) role: Option<String>,
    pub(crate) email: Option<String>,
    /// `id_token` (verified), `admin_key`, or `console_login` (a console manager login whose
    /// password the gate checked).
    pub(crate) via: String,
    /// The approver name the decision was made under (absent in events recorded before
    /// decisions named their approver).
    #[serde(default)]
    pub(crate) name: Option<String>,
}

/// The payload of `gate.approval_decided`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct ApprovalEvent {
    #[serde(rename = "ref")]
    pub(crate) reference: String,
    pub(crate) at: DateTime<Utc>,
    pub(crate) outcome: ApprovalOutcome,
    pub(crate) approver: Approver,
    pub(crate) comment: Option<String>,
}

/// success | failed | aborted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompleteStatus {
    /// The action happened.
    Success,
    /// The action failed.
    Failed,
    /// The action was not attempted.
    Aborted,
}

impl CompleteStatus {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::Failed => "failed",
            Self::Aborted => "aborted",
        }
    }
}

/// committed | released | none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum HoldOutcome {
    Committed,
    Released,
    None,
}

/// The payload of `gate.completed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct CompletionEvent {
    pub(crate) decision_id: String,
    pub(crate) at: DateTime<Utc>,
    pub(crate) status: CompleteStatus,
    pub(crate) downstream_ref: Option<String>,
    pub(crate) error: Option<String>,
    pub(crate) hold: HoldOutcome,
    pub(crate) receipt: String,
}

/// Where a hold stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HoldState {
    Held,
    Committed,
    Released,
}

#[derive(Debug, Clone)]
pub(crate) struct DecisionRecord {
    /// The seq of its `gate.decision` event.
    pub(crate) seq: u64,
    pub(crate) event: DecisionEvent,
    pub(crate) hold_state: Option<HoldState>,
    pub(crate) completion: Option<CompletionEvent>,
}

/// pending | approved | rejected | consumed (expiry is computed against the clock).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum ApprovalStatus {
    Pending,
    Decided(ApprovalEvent),
    Consumed {
        decision_id: String,
        decided: ApprovalEvent,
    },
}

#[derive(Debug, Clone)]
pub(crate) struct ApprovalRecord {
    pub(crate) escalation: Escalation,
    /// The escalate decision that asked for it.
    pub(crate) decision_id: String,
    pub(crate) created_at: DateTime<Utc>,
    pub(crate) status: ApprovalStatus,
}

/// Counter keys: a mandate's day, month, entity-month and reference totals.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum Counter {
    Day(String, String),
    Month(String, String),
    Entity(String, String, String),
    Reference(String, String),
}

impl Hold {
    pub(crate) fn counters(&self) -> Vec<Counter> {
        let m = &self.mandate_id;
        let mut keys = vec![
            Counter::Day(m.clone(), self.day.clone()),
            Counter::Month(m.clone(), self.month.clone()),
        ];
        if let Some(entity) = &self.entity {
            keys.push(Counter::Entity(
                m.clone(),
                entity.clone(),
                self.month.clone(),
            ));
        }
        if let Some(reference) = &self.reference {
            keys.push(Counter::Reference(m.clone(), reference.clone()));
        }
        keys
    }
}

/// UTC calendar day and month keys of `at`.
pub(crate) fn windows(at: DateTime<Utc>) -> (String, String) {
    (
        at.format("%Y-%m-%d").to_string(),
        format!("{:04}-{:02}", at.year(), at.month()),
    )
}

/// The projections.
#[derive(Debug, Default)]
pub(crate) struct State {
    pub(crate) decisions: HashMap<String, DecisionRecord>,
    /// (agent, idempotency key) → (fingerprint, the decision the key answers with).
    pub(crate) idempotency: HashMap<(String, String), (String, String)>,
    pub(crate) approvals: BTreeMap<String, ApprovalRecord>,
    /// (agent, fingerprint) → the latest approval asked for without an idempotency key.
    pub(crate) approvals_by_fingerprint: HashMap<(String, String), String>,
    /// Held + committed amounts.
    pub(crate) usage: HashMap<Counter, Decimal>,
    /// (mandate, reference) → the original amount pinned by the first allow.
    pub(crate) reference_pins: HashMap<(String, String), Decimal>,
    /// Decision times per agent (velocity).
    pub(crate) recent: HashMap<String, VecDeque<DateTime<Utc>>>,
    /// (agent, fingerprint) → (time, decision id) of the last keyless money allow.
    pub(crate) recent_allows: HashMap<(String, String), (DateTime<Utc>, String)>,
    /// Events applied.
    pub(crate) applied: u64,
}

/// A projection could not apply an event (a corrupt or foreign log).
#[derive(Debug, Clone, thiserror::Error)]
#[error("cannot apply event {seq} ({event_type}): {message}")]
pub struct ApplyError {
    /// The event's seq.
    pub seq: u64,
    /// Its type.
    pub event_type: String,
    /// What is wrong.
    pub message: String,
}

impl State {
    pub(crate) fn usage(&self, key: &Counter) -> Decimal {
        self.usage.get(key).copied().unwrap_or_default()
    }

    /// Decisions of `agent` since `since`.
    pub(crate) fn decisions_since(&self, agent: &str, since: DateTime<Utc>) -> usize {
        self.recent
            .get(agent)
            .map_or(0, |times| times.iter().filter(|t| **t > since).count())
    }

    pub(crate) fn apply(
        &mut self,
        seq: u64,
        event_type: &str,
        payload: &Value,
    ) -> Result<(), ApplyError> {
        let fail = |message: String| ApplyError {
            seq,
            event_type: event_type.to_owned(),
            message,
        };
        match event_type {
            EV_DECISION => {
                let e: DecisionEvent =
                    serde_json::from_value(payload.clone()).map_err(|e| fail(e.to_string()))?;
                self.apply_decision(seq, e);
            }
            EV_REPLAY => {
                let _: ReplayEvent =
                    serde_json::from_value(payload.clone()).map_err(|e| fail(e.to_string()))?;
            }
            EV_APPROVAL => {
                let e: ApprovalEvent =
                    serde_json::from_value(payload.clone()).map_err(|e| fail(e.to_string()))?;
                let record = self
                    .approvals
                    .get_mut(&e.reference)
                    .ok_or_else(|| fail(format!("unknown approval `{}`", e.reference)))?;
                record.status = ApprovalStatus::Decided(e);
            }
            EV_CONSOLE_LOGIN => {
                // Audit only: no projection reads sign-ins.
                let _: ConsoleLoginEvent =
                    serde_json::from_value(payload.clone()).map_err(|e| fail(e.to_string()))?;
            }
            EV_COMPLETED => {
                let e: CompletionEvent =
                    serde_json::from_value(payload.clone()).map_err(|e| fail(e.to_string()))?;
                self.apply_completion(e).map_err(fail)?;
            }
            other => return Err(fail(format!("unknown event type `{other}`"))),
        }
        self.applied = seq;
        Ok(())
    }

    fn apply_decision(&mut self, seq: u64, e: DecisionEvent) {
        let agent = e.agent_id.clone();
        self.recent
            .entry(agent.clone())
            .or_default()
            .push_back(e.at);
        // Keep the velocity window bounded: nothing older than a day matters.
        if let Some(times) = self.recent.get_mut(&agent) {
            let horizon = e.at - chrono::Duration::days(1);
            while times.front().is_some_and(|t| *t < horizon) {
                times.pop_front();
            }
        }
        if let Some(key) = &e.idempotency_key {
            let slot = (agent.clone(), key.clone());
            // A deny never rebinds a key that already answers with an allow or escalation.
            let keep = e.verdict == Verdict::Deny && self.idempotency.contains_key(&slot);
            if !keep {
                self.idempotency
                    .insert(slot, (e.fingerprint.clone(), e.decision_id.clone()));
            }
        }
        let mut hold_state = None;
        if e.verdict == Verdict::Allow {
            if let Some(hold) = &e.hold {
                for key in hold.counters() {
                    *self.usage.entry(key).or_default() += hold.amount;
                }
                if let (Some(reference), Some(amount)) = (&hold.reference, hold.reference_amount) {
                    self.reference_pins
                        .entry((hold.mandate_id.clone(), reference.clone()))
                        .or_insert(amount);
                }
                hold_state = Some(HoldState::Held);
            }
            if e.duplicate_guard {
                self.recent_allows.insert(
                    (agent.clone(), e.fingerprint.clone()),
                    (e.at, e.decision_id.clone()),
                );
            }
            if let Some(reference) = &e.approval_ref
                && let Some(record) = self.approvals.get_mut(reference)
                && let ApprovalStatus::Decided(decided) = &record.status
            {
                record.status = ApprovalStatus::Consumed {
                    decision_id: e.decision_id.clone(),
                    decided: decided.clone(),
                };
            }
        }
        if e.verdict == Verdict::Escalate
            && let Some(esc) = &e.escalation
            && !self.approvals.contains_key(&esc.reference)
        {
            self.approvals.insert(
                esc.reference.clone(),
                ApprovalRecord {
                    escalation: esc.clone(),
                    decision_id: e.decision_id.clone(),
                    created_at: e.at,
                    status: ApprovalStatus::Pending,
                },
            );
            if e.idempotency_key.is_none() {
                self.approvals_by_fingerprint
                    .insert((agent, e.fingerprint.clone()), esc.reference.clone());
            }
        }
        self.decisions.insert(
            e.decision_id.clone(),
            DecisionRecord {
                seq,
                event: e,
                hold_state,
                completion: None,
            },
        );
    }

    fn apply_completion(&mut self, e: CompletionEvent) -> Result<(), String> {
        let record = self
            .decisions
            .get_mut(&e.decision_id)
            .ok_or_else(|| format!("unknown decision `{}`", e.decision_id))?;
        if let (Some(HoldState::Held), Some(hold)) = (record.hold_state, &record.event.hold) {
            match e.hold {
                HoldOutcome::Committed => record.hold_state = Some(HoldState::Committed),
                HoldOutcome::Released => {
                    record.hold_state = Some(HoldState::Released);
                    // A failed action may be retried at once: it no longer counts as a duplicate.
                    let slot = (
                        record.event.agent_id.clone(),
                        record.event.fingerprint.clone(),
                    );
                    if self
                        .recent_allows
                        .get(&slot)
                        .is_some_and(|(_, id)| *id == e.decision_id)
                    {
                        self.recent_allows.remove(&slot);
                    }
                    for key in hold.counters() {
                        if let Some(v) = self.usage.get_mut(&key) {
                            *v -= hold.amount;
                        }
                    }
                }
                HoldOutcome::None => {}
            }
        }
        record.completion = Some(e);
        Ok(())
    }
}
