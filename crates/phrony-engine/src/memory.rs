//! [`MemoryStore`]: an in-process [`SessionStore`] with the ledger's semantics, for fast,
//! deterministic tests of the engine (and for embedding without a database).
//!
//! Every operation runs under one lock, appends its events to the session's hash-chained stream
//! (the same hash as the ledger's, [`Event::recompute_hash`]) with the same snake_case payloads,
//! and applies the same state machines. Nothing survives the process.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use chrono::{DateTime, SubsecRound as _, Utc};
use phrony_ledger::{
    Approval, ApprovalKind, ApprovalStatus, ApprovalVote, CallStatus, Dispatch, Event,
    GENESIS_HASH, MAX_ESCALATION_DEPTH, NewApproval, NewEvent, NewSession, NewToolCall,
    RecordedResult, ReviewResolution, Session, SessionEvent, SessionStatus, StatusChange,
    StatusChanged, TIMEOUT_ACTOR, TimeoutDefault, TimeoutOutcome, ToolInvocation, ToolOutcome,
    ToolResult, Vote, VoteDecision, VoteOutcome, call_hash, error_codes, event_types as types,
    is_ledger_owned, not_resent_message, tool_call_id, vote_resolution,
};
use secrecy::{ExposeSecret as _, SecretSlice};
use serde_json::{Map, Value, json};
use uuid::Uuid;

use crate::clock::Clock;
use crate::error::{StoreError, StoreResult};
use crate::store::{PlainSecret, SessionStore, StoredAgentVersion};

/// An in-memory [`SessionStore`]. Cheap to clone; clones share the data.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
    clock: Arc<dyn Clock>,
}

#[derive(Debug, Default)]
struct State {
    sessions: HashMap<String, Session>,
    streams: HashMap<String, Vec<Event>>,
    calls: HashMap<String, ToolInvocation>,
    /// Call ids in creation order.
    call_order: Vec<String>,
    approvals: HashMap<Uuid, Approval>,
    /// Approval ids in creation order.
    approval_order: Vec<Uuid>,
    secrets: HashMap<String, Vec<(String, SecretSlice<u8>)>>,
    versions: HashMap<Uuid, StoredAgentVersion>,
}

impl MemoryStore {
    /// An empty store whose timestamps and approval expiries come from `clock`.
    #[must_use]
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            state: Arc::new(Mutex::new(State::default())),
            clock,
        }
    }

    /// Registers a published agent version (what the ledger's `publish_agent_version` stores),
    /// so sessions can be created for it and recovered.
    pub fn register_agent_version(&self, id: Uuid, snapshot_json: String, content_hash: String) {
        self.lock().versions.insert(
            id,
            StoredAgentVersion {
                snapshot_json,
                content_hash,
            },
        );
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn now(&self) -> DateTime<Utc> {
        self.clock.now().trunc_subsecs(6)
    }
}

fn not_found_session(id: &str) -> StoreError {
    StoreError::not_found(format!("session {id} not found"))
}

fn not_found_call(id: &str) -> StoreError {
    StoreError::not_found(format!("tool call {id:?} not found"))
}

fn not_found_approval(id: Uuid) -> StoreError {
    StoreError::not_found(format!("approval {id} not found"))
}

fn require_text(what: &str, value: &str) -> StoreResult<()> {
    if value.trim().is_empty() {
        return Err(StoreError::invalid(format!("{what} is required")));
    }
    Ok(())
}

impl State {
    fn session(&self, id: &str) -> StoreResult<&Session> {
        self.sessions.get(id).ok_or_else(|| not_found_session(id))
    }

    fn call(&self, id: &str) -> StoreResult<&ToolInvocation> {
        self.calls.get(id).ok_or_else(|| not_found_call(id))
    }

    fn approval(&self, id: Uuid) -> StoreResult<&Approval> {
        self.approvals
            .get(&id)
            .ok_or_else(|| not_found_approval(id))
    }

    /// Appends one event to a stream, chaining its hash.
    fn append(&mut self, stream: &str, new: NewEvent, now: DateTime<Utc>) -> Event {
        let events = self.streams.entry(stream.to_owned()).or_default();
        let (seq, prev_hash) = events.last().map_or((1, GENESIS_HASH.to_owned()), |e| {
            (e.seq + 1, e.hash.clone())
        });
        // Keep timestamps strictly ordered within a stream, like the database clock.
        let ts = events.last().map_or(now, |e| now.max(e.ts));
        let mut event = Event {
            stream: stream.to_owned(),
            seq,
            event_type: new.event_type,
            ts,
            actor: new.actor,
            call_id: new.call_id,
            turn: new.turn,
            payload: new.payload,
            prev_hash,
            hash: String::new(),
        };
        event.hash = event.recompute_hash();
        events.push(event.clone());
        event
    }

    fn emit_call(
        &mut self,
        call: &ToolInvocation,
        event_type: &str,
        actor: &str,
        payload: Value,
        now: DateTime<Utc>,
    ) -> Event {
        let mut new = NewEvent::new(event_type, actor, payload);
        new.call_id = Some(call.call_id.clone());
        new.turn = Some(call.turn);
        self.append(&call.session_id.clone(), new, now)
    }

    fn check_call_from(
        call: &ToolInvocation,
        to: CallStatus,
        allowed: &[CallStatus],
    ) -> StoreResult<()> {
        if allowed.contains(&call.status) {
            Ok(())
        } else {
            Err(StoreError::precondition(format!(
                "tool call {} cannot go from {} to {to}",
                call.call_id, call.status
            )))
        }
    }

    fn update_call(&mut self, call_id: &str, f: impl FnOnce(&mut ToolInvocation)) {
        if let Some(call) = self.calls.get_mut(call_id) {
            f(call);
        }
    }

    /// Applies a status change to a session (and its cascade when terminal).
    fn transition(
        &mut self,
        session_id: &str,
        change: &StatusChange,
        out: &mut StatusChanged,
        now: DateTime<Utc>,
    ) -> StoreResult<()> {
        let session = self.session(session_id)?.clone();
        if change.to.is_terminal() {
            let why = format!("session {} ended ({})", session.id, change.to);
            let pending: Vec<Uuid> = self
                .approval_order
                .iter()
                .filter(|id| {
                    self.approvals.get(id).is_some_and(|a| {
                        a.session_id == session.id && a.status == ApprovalStatus::Pending
                    })
                })
                .copied()
                .collect();
            for id in pending {
                self.decide(
                    id,
                    ApprovalStatus::Cancelled,
                    "system",
                    &why,
                    None,
                    None,
                    now,
                )?;
                out.closed_approvals.push(id);
            }
            let open: Vec<String> = self
                .call_order
                .iter()
                .filter(|id| {
                    self.calls
                        .get(*id)
                        .is_some_and(|c| c.session_id == session.id && !c.status.is_terminal())
                })
                .cloned()
                .collect();
            for id in open {
                self.cancel_call_locked(&id, &why, now)?;
                out.cancelled_calls.push(id);
            }
            let children: Vec<String> = self
                .sessions
                .values()
                .filter(|s| {
                    s.parent_session_id.as_deref() == Some(session.id.as_str())
                        && !s.status.is_terminal()
                })
                .map(|s| s.id.clone())
                .collect();
            for child in children {
                let cascade = StatusChange::cancelled()
                    .by(change.actor.clone())
                    .because(format!(
                        "parent session {} ended ({})",
                        session.id, change.to
                    ));
                out.cancelled_children.push(child.clone());
                self.transition(&child, &cascade, out, now)?;
            }
            if session.id == out.session.id {
                out.secrets_purged = self.secrets.get(&session.id).map_or(0, |s| s.len() as u64);
            }
        }
        let mut payload = Map::new();
        payload.insert("from".into(), json!(session.status.as_str()));
        payload.insert("to".into(), json!(change.to.as_str()));
        if let Some(reason) = &change.reason {
            payload.insert("reason".into(), json!(reason));
        }
        if let Some(message) = &change.error {
            payload.insert("message".into(), json!(message));
        }
        if let Some(output) = &change.output {
            payload.insert("output".into(), output.clone());
        }
        let event_type = match change.to {
            SessionStatus::Completed => types::SESSION_COMPLETED,
            SessionStatus::Failed => types::SESSION_FAILED,
            SessionStatus::Cancelled => types::SESSION_CANCELLED,
            _ => types::SESSION_STATUS_CHANGED,
        };
        let event = self.append(
            &session.id,
            NewEvent::new(event_type, &change.actor, Value::Object(payload)),
            now,
        );
        if let Some(s) = self.sessions.get_mut(&session.id) {
            s.status = change.to;
            if change.error.is_some() {
                s.error.clone_from(&change.error);
            }
            if change.output.is_some() {
                s.output.clone_from(&change.output);
            }
            s.updated_at = event.ts;
            if change.to.is_terminal() {
                s.ended_at = Some(event.ts);
            }
        }
        if change.to.is_terminal() {
            self.secrets.remove(&session.id);
        }
        Ok(())
    }

    fn check_change(session: &Session, change: &StatusChange) -> StoreResult<()> {
        if change.actor.trim().is_empty() {
            return Err(StoreError::invalid("actor is required"));
        }
        match (change.to, &change.error) {
            (SessionStatus::Failed, None) => {
                return Err(StoreError::invalid(
                    "a failed session needs an error message",
                ));
            }
            (to, Some(_)) if to != SessionStatus::Failed => {
                return Err(StoreError::invalid(
                    "an error message is only allowed for failed",
                ));
            }
            _ => {}
        }
        if change.output.is_some() && change.to != SessionStatus::Completed {
            return Err(StoreError::invalid(
                "an output is only allowed for completed",
            ));
        }
        if let Some(from) = change.expect_from
            && session.status != from
        {
            return Err(StoreError::precondition(format!(
                "session {} is {}, not {from}",
                session.id, session.status
            )));
        }
        if !session.status.can_change_to(change.to) {
            return Err(StoreError::precondition(format!(
                "session {} cannot change status from {} to {}",
                session.id, session.status, change.to
            )));
        }
        Ok(())
    }

    fn cancel_call_locked(
        &mut self,
        call_id: &str,
        reason: &str,
        now: DateTime<Utc>,
    ) -> StoreResult<()> {
        let call = self.call(call_id)?.clone();
        let after_dispatch = matches!(
            call.status,
            CallStatus::Dispatched | CallStatus::Indeterminate
        );
        let reason = match (&call.worker_id, after_dispatch) {
            (Some(worker), true) => format!(
                "{reason}; the call had been sent to worker {worker:?} and may have taken effect"
            ),
            _ => reason.to_owned(),
        };
        let mut payload =
            json!({"call_id": call.call_id, "from": call.status.as_str(), "reason": reason});
        if after_dispatch {
            payload["after_dispatch"] = json!(true);
        }
        let event = self.emit_call(&call, types::TOOL_CANCELLED, "system", payload, now);
        self.update_call(call_id, |c| {
            c.status = CallStatus::Cancelled;
            c.error_code = Some(
                if after_dispatch {
                    error_codes::CANCELLED_AFTER_DISPATCH
                } else {
                    error_codes::CANCELLED
                }
                .to_owned(),
            );
            c.error_message = Some(reason.clone());
            c.completed_at = Some(event.ts);
            c.updated_at = event.ts;
        });
        Ok(())
    }

    /// Decides an approval (`approval.decided`) and applies the outcome to its call.
    #[allow(
        clippy::too_many_arguments,
        reason = "one decision's fields, as in the ledger's `decide`; a struct would only rename them"
    )]
    fn decide(
        &mut self,
        id: Uuid,
        status: ApprovalStatus,
        decided_by: &str,
        comment: &str,
        effective_args: Option<Value>,
        resolution: Option<ReviewResolution>,
        now: DateTime<Utc>,
    ) -> StoreResult<()> {
        let approval = self.approval(id)?.clone();
        let turn = self.calls.get(&approval.call_id).map(|c| c.turn);
        let mut payload = json!({
            "approval_id": id,
            "call_id": approval.call_id,
            "status": status.as_str(),
            "approved": status == ApprovalStatus::Approved,
            "decided_by": decided_by,
            "comment": comment,
            "on_reject": approval.on_reject.as_str(),
        });
        if let Some(args) = &effective_args {
            payload["effective_args"] = args.clone();
        }
        if let Some(r) = resolution {
            payload["resolution"] = json!(r.as_str());
        }
        let mut new = NewEvent::new(types::APPROVAL_DECIDED, "system", payload);
        new.call_id = Some(approval.call_id.clone());
        new.turn = turn;
        let event = self.append(&approval.session_id, new, now);
        if let Some(a) = self.approvals.get_mut(&id) {
            a.status = status;
            a.decided_by = Some(decided_by.to_owned());
            a.comment = Some(comment.to_owned());
            a.decided_at = Some(event.ts);
            a.resolution = resolution;
            if effective_args.is_some() {
                a.effective_args.clone_from(&effective_args);
            }
        }
        if matches!(
            resolution,
            Some(ReviewResolution::Happened | ReviewResolution::Fail)
        ) {
            // The call's outcome is the `tool.completed` the caller records next.
            return Ok(());
        }
        let message = if comment.is_empty() {
            "tool call denied".to_owned()
        } else {
            comment.to_owned()
        };
        let ts = event.ts;
        self.update_call(&approval.call_id, |c| {
            if c.status != CallStatus::AwaitingApproval {
                return;
            }
            match status {
                ApprovalStatus::Approved => {
                    c.status = CallStatus::Pending;
                    if let Some(args) = &effective_args {
                        c.args = args.clone();
                    }
                }
                ApprovalStatus::Denied => {
                    c.status = CallStatus::Failed;
                    c.error_code = Some(error_codes::APPROVAL_DENIED.to_owned());
                    c.error_message = Some(message.clone());
                    c.completed_at = Some(ts);
                }
                ApprovalStatus::Cancelled => {
                    c.status = CallStatus::Cancelled;
                    c.error_code = Some(error_codes::CANCELLED.to_owned());
                    c.error_message = Some(message.clone());
                    c.completed_at = Some(ts);
                }
                ApprovalStatus::Pending | ApprovalStatus::Escalated => {}
            }
            c.updated_at = ts;
        });
        Ok(())
    }

    /// Inserts a pending approval and its `approval.required` event.
    fn insert_approval(&mut self, approval: Approval, actor: &str, now: DateTime<Utc>) -> Event {
        let turn = self.calls.get(&approval.call_id).map(|c| c.turn);
        let mut payload = json!({
            "approval_id": approval.id,
            "call_id": approval.call_id,
            "tool": approval.tool,
            "version": approval.tool_version,
            "args": approval.args,
            "call_hash": approval.call_hash,
            "agent_version_id": approval.agent_version_id,
            "agent_ref": approval.agent.to_string(),
            "policy_runtime": approval.policy_runtime,
            "reason": approval.reason,
            "route": approval.route,
            "authority_ref": approval.authority_ref,
            "approvals_required": approval.approvals_required,
            "comprehension_required": approval.comprehension_required,
            "on_reject": approval.on_reject.as_str(),
            "on_modify": approval.on_modify.as_str(),
            "escalation_depth": approval.escalation_depth,
        });
        if !approval.kind.is_policy() {
            payload["kind"] = json!(approval.kind.as_str());
        }
        if let Some(p) = &approval.policy_ref {
            payload["policy_ref"] = json!(p);
        }
        if let Some(t) = &approval.timeout {
            payload["timeout"] = serde_json::to_value(t).unwrap_or(Value::Null);
        }
        if let Some(e) = &approval.expires_at {
            payload["expires_at"] = json!(e);
        }
        if let Some(p) = &approval.parent_approval_id {
            payload["parent_approval_id"] = json!(p);
        }
        let mut new = NewEvent::new(types::APPROVAL_REQUIRED, actor, payload);
        new.call_id = Some(approval.call_id.clone());
        new.turn = turn;
        let event = self.append(&approval.session_id, new, now);
        let call_id = approval.call_id.clone();
        let mut approval = approval;
        approval.created_at = event.ts;
        self.approval_order.push(approval.id);
        self.approvals.insert(approval.id, approval);
        self.update_call(&call_id, |c| {
            c.status = CallStatus::AwaitingApproval;
            c.updated_at = event.ts;
        });
        event
    }
}

impl State {
    /// Records the outcome an operator gave an outcome review (see the ledger's
    /// `complete_by_review`): `Ok(result)` = it happened, `Err(message)` = outcome unknown.
    fn complete_by_review(
        &mut self,
        call_id: &str,
        actor: &str,
        outcome: Result<Option<Value>, String>,
        now: DateTime<Utc>,
    ) -> StoreResult<()> {
        let call = self.call(call_id)?.clone();
        if call.status != CallStatus::AwaitingApproval {
            return Err(StoreError::precondition(format!(
                "tool call {} is {} and no longer waits for its review",
                call.call_id, call.status
            )));
        }
        let (status, result, code, message) = match outcome {
            Ok(result) => (
                CallStatus::Succeeded,
                Some(result.unwrap_or(Value::Null)),
                None,
                None,
            ),
            Err(message) => (
                CallStatus::Failed,
                None,
                Some(error_codes::OUTCOME_UNKNOWN.to_owned()),
                Some(message),
            ),
        };
        let mut payload = json!({
            "call_id": call_id,
            "status": status.as_str(),
            "resolved_by": actor,
        });
        if let Some(r) = &result {
            payload["result"] = r.clone();
        }
        if let Some(c) = &code {
            payload["error_code"] = json!(c);
        }
        if let Some(m) = &message {
            payload["error_message"] = json!(m);
        }
        let event = self.emit_call(&call, types::TOOL_COMPLETED, actor, payload, now);
        self.update_call(call_id, |c| {
            c.status = status;
            c.result = result;
            c.error_code = code;
            c.error_message = message;
            c.completed_at = Some(event.ts);
            c.updated_at = event.ts;
        });
        Ok(())
    }
}

fn expiry(now: DateTime<Utc>, minutes: u32) -> DateTime<Utc> {
    now + chrono::Duration::minutes(i64::from(minutes))
}

#[async_trait]
impl SessionStore for MemoryStore {
    async fn create_session(
        &self,
        new: NewSession,
        secrets: Vec<PlainSecret>,
    ) -> StoreResult<Session> {
        let now = self.now();
        if !new.input.is_object() {
            return Err(StoreError::invalid("input must be a JSON object"));
        }
        require_text("actor", &new.actor)?;
        let mut seen = HashSet::new();
        for s in &secrets {
            require_text("secret name", &s.name)?;
            if !seen.insert(s.name.clone()) {
                return Err(StoreError::invalid(format!(
                    "duplicate secret {:?}",
                    s.name
                )));
            }
        }
        let mut st = self.lock();
        if !st.versions.contains_key(&new.agent_version_id) {
            return Err(StoreError::not_found(format!(
                "agent version \"{}\" not found",
                new.agent_version_id
            )));
        }
        if st.sessions.contains_key(&new.id) {
            return Err(StoreError::already_exists(format!(
                "session {} already exists",
                new.id
            )));
        }
        let (root, depth) = match &new.parent_session_id {
            None => (new.id.clone(), 0),
            Some(parent) => {
                let p = st.sessions.get(parent).ok_or_else(|| {
                    StoreError::not_found(format!("parent session {parent} not found"))
                })?;
                if p.status.is_terminal() {
                    return Err(StoreError::precondition(format!(
                        "parent session {parent} is {}",
                        p.status
                    )));
                }
                (p.root_session_id.clone(), p.depth + 1)
            }
        };
        let mut payload = json!({
            "session_id": new.id,
            "agent_version_id": new.agent_version_id,
            "agent_namespace": new.agent.namespace,
            "agent_name": new.agent.name,
            "agent_version": new.agent.version,
            "mode": new.mode.as_str(),
            "input": new.input,
            "metadata": new.metadata,
            "root_session_id": root,
            "depth": depth,
            "status": SessionStatus::Running.as_str(),
        });
        if let Some(p) = &new.parent_session_id {
            payload["parent_session_id"] = json!(p);
        }
        if let Some(l) = &new.limits {
            payload["limits"] = serde_json::to_value(l).unwrap_or(Value::Null);
        }
        let event = st.append(
            &new.id,
            NewEvent::new(types::SESSION_STARTED, &new.actor, payload),
            now,
        );
        let session = Session {
            id: new.id.clone(),
            agent_version_id: new.agent_version_id,
            agent: new.agent,
            mode: new.mode,
            input: new.input,
            metadata: new.metadata,
            status: SessionStatus::Running,
            error: None,
            output: None,
            parent_session_id: new.parent_session_id,
            root_session_id: root,
            depth,
            limits: new.limits,
            created_by: new.actor,
            created_at: event.ts,
            updated_at: event.ts,
            ended_at: None,
        };
        st.sessions.insert(new.id.clone(), session.clone());
        if !secrets.is_empty() {
            st.secrets.insert(
                new.id,
                secrets.into_iter().map(|s| (s.name, s.value)).collect(),
            );
        }
        Ok(session)
    }

    async fn get_session(&self, session_id: &str) -> StoreResult<Session> {
        self.lock().session(session_id).cloned()
    }

    async fn set_status(
        &self,
        session_id: &str,
        change: StatusChange,
    ) -> StoreResult<StatusChanged> {
        let now = self.now();
        let mut st = self.lock();
        let session = st.session(session_id)?.clone();
        State::check_change(&session, &change)?;
        let mut out = StatusChanged {
            session: session.clone(),
            from: session.status,
            closed_approvals: Vec::new(),
            cancelled_calls: Vec::new(),
            cancelled_children: Vec::new(),
            secrets_purged: 0,
        };
        st.transition(session_id, &change, &mut out, now)?;
        out.session = st.session(session_id)?.clone();
        Ok(out)
    }

    async fn record_session_event(
        &self,
        session_id: &str,
        event: SessionEvent,
    ) -> StoreResult<Event> {
        let new = event.to_new_event().map_err(StoreError::from)?;
        let now = self.now();
        let mut st = self.lock();
        let session = st.session(session_id)?;
        if session.status.is_terminal() {
            return Err(StoreError::precondition(format!(
                "session {session_id} is {} and accepts no further events",
                session.status
            )));
        }
        Ok(st.append(session_id, new, now))
    }

    async fn append_engine_event(&self, session_id: &str, event: NewEvent) -> StoreResult<Event> {
        if is_ledger_owned(&event.event_type) {
            return Err(StoreError::invalid(format!(
                "event type {} is written by the store's own operations",
                event.event_type
            )));
        }
        let now = self.now();
        let mut st = self.lock();
        let session = st.session(session_id)?;
        if session.status.is_terminal() {
            return Err(StoreError::precondition(format!(
                "session {session_id} is {} and accepts no further events",
                session.status
            )));
        }
        Ok(st.append(session_id, event, now))
    }

    async fn events_after(
        &self,
        session_id: &str,
        after_seq: u64,
        limit: u32,
    ) -> StoreResult<Vec<Event>> {
        let st = self.lock();
        st.session(session_id)?;
        let limit = limit.clamp(1, 1000) as usize;
        Ok(st
            .streams
            .get(session_id)
            .map(|events| {
                events
                    .iter()
                    .filter(|e| e.seq > after_seq)
                    .take(limit)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default())
    }

    async fn load_secrets(&self, session_id: &str) -> StoreResult<Vec<PlainSecret>> {
        let st = self.lock();
        st.session(session_id)?;
        Ok(st
            .secrets
            .get(session_id)
            .map(|all| {
                all.iter()
                    .map(|(name, value)| {
                        PlainSecret::new(name.clone(), value.expose_secret().to_vec())
                    })
                    .collect()
            })
            .unwrap_or_default())
    }

    async fn agent_version(&self, agent_version_id: Uuid) -> StoreResult<StoredAgentVersion> {
        self.lock()
            .versions
            .get(&agent_version_id)
            .cloned()
            .ok_or_else(|| {
                StoreError::not_found(format!("agent version \"{agent_version_id}\" not found"))
            })
    }

    async fn sessions_needing_recovery(&self) -> StoreResult<Vec<Session>> {
        let st = self.lock();
        let mut live: Vec<Session> = st
            .sessions
            .values()
            .filter(|s| !s.status.is_terminal())
            .cloned()
            .collect();
        live.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        Ok(live)
    }

    async fn record_tool_call(&self, new: NewToolCall) -> StoreResult<ToolInvocation> {
        require_text("tool", &new.tool)?;
        require_text("tool version", &new.version)?;
        let now = self.now();
        let mut st = self.lock();
        let session = st.session(&new.session_id)?.clone();
        if session.status.is_terminal() {
            return Err(StoreError::precondition(format!(
                "session {} is {} and cannot record tool calls",
                session.id, session.status
            )));
        }
        let call_id = tool_call_id(
            &session.id,
            session.agent_version_id,
            new.turn,
            new.iteration,
            new.index,
        );
        if let Some(existing) = st.calls.get(&call_id) {
            let same = existing.tool == new.tool
                && existing.version == new.version
                && existing.wire_name == new.wire_name
                && existing.proposed_args == new.args
                && existing.side_effect_class == new.side_effect_class;
            if same {
                return Ok(existing.clone());
            }
            return Err(StoreError::already_exists(format!(
                "tool call {call_id} was already recorded with a different tool or arguments"
            )));
        }
        let mut payload = json!({
            "call_id": call_id,
            "agent_version_id": session.agent_version_id,
            "tool": new.tool,
            "version": new.version,
            "args": new.args,
            "turn": new.turn,
            "iteration": new.iteration,
            "index": new.index,
            "status": CallStatus::Pending.as_str(),
        });
        if let Some(w) = &new.wire_name {
            payload["wire_name"] = json!(w);
        }
        if let Some(c) = new.side_effect_class {
            payload["side_effect_class"] = json!(c.as_str());
        }
        let mut event = NewEvent::new(types::TOOL_REQUESTED, "agent", payload);
        event.call_id = Some(call_id.clone());
        event.turn = Some(new.turn);
        let event = st.append(&session.id, event, now);
        let call = ToolInvocation {
            call_id: call_id.clone(),
            session_id: session.id.clone(),
            agent_version_id: session.agent_version_id,
            turn: new.turn,
            iteration: new.iteration,
            index: new.index,
            tool: new.tool,
            version: new.version,
            wire_name: new.wire_name,
            side_effect_class: new.side_effect_class,
            proposed_args: new.args.clone(),
            args: new.args,
            status: CallStatus::Pending,
            result: None,
            error_code: None,
            error_message: None,
            usage: None,
            attempt: 0,
            worker_id: None,
            worker_identity: None,
            image_digest: None,
            descriptor_hash: None,
            manifest_content_hash: None,
            deadline_at: None,
            created_at: event.ts,
            updated_at: event.ts,
            queued_at: None,
            dispatched_at: None,
            completed_at: None,
        };
        st.call_order.push(call_id.clone());
        st.calls.insert(call_id, call.clone());
        Ok(call)
    }

    async fn queue_tool_call(&self, call_id: &str) -> StoreResult<ToolInvocation> {
        use CallStatus as C;
        let now = self.now();
        let mut st = self.lock();
        let call = st.call(call_id)?.clone();
        State::check_call_from(
            &call,
            C::Queued,
            &[C::Pending, C::Dispatched, C::Indeterminate],
        )?;
        let payload = json!({"call_id": call_id, "from": call.status.as_str()});
        let event = st.emit_call(&call, types::TOOL_QUEUED, "system", payload, now);
        st.update_call(call_id, |c| {
            c.status = C::Queued;
            c.queued_at = Some(event.ts);
            c.updated_at = event.ts;
        });
        st.call(call_id).cloned()
    }

    async fn dispatch_tool_call(
        &self,
        call_id: &str,
        dispatch: Dispatch,
    ) -> StoreResult<ToolInvocation> {
        require_text("worker_id", &dispatch.worker_id)?;
        let now = self.now();
        let mut st = self.lock();
        let call = st.call(call_id)?.clone();
        State::check_call_from(&call, CallStatus::Dispatched, &[CallStatus::Queued])?;
        let content_hash = st
            .versions
            .get(&call.agent_version_id)
            .map(|v| v.content_hash.clone());
        let attempt = call.attempt.saturating_add(1);
        let mut payload = json!({
            "call_id": call_id,
            "tool": call.tool,
            "version": call.version,
            "args": call.args,
            "attempt": attempt,
            "worker_id": dispatch.worker_id,
        });
        for (key, value) in [
            ("worker_identity", &dispatch.worker_identity),
            ("image_digest", &dispatch.image_digest),
            ("descriptor_hash", &dispatch.descriptor_hash),
            ("manifest_content_hash", &content_hash),
        ] {
            if let Some(v) = value {
                payload[key] = json!(v);
            }
        }
        if let Some(d) = dispatch.deadline_at {
            payload["deadline_at"] = json!(d.trunc_subsecs(6));
        }
        let event = st.emit_call(&call, types::TOOL_DISPATCHED, "system", payload, now);
        st.update_call(call_id, |c| {
            c.status = CallStatus::Dispatched;
            c.attempt = attempt;
            c.worker_id = Some(dispatch.worker_id.clone());
            c.worker_identity.clone_from(&dispatch.worker_identity);
            c.image_digest.clone_from(&dispatch.image_digest);
            c.descriptor_hash.clone_from(&dispatch.descriptor_hash);
            c.manifest_content_hash.clone_from(&content_hash);
            c.deadline_at = dispatch.deadline_at.map(|d| d.trunc_subsecs(6));
            c.dispatched_at = Some(event.ts);
            c.updated_at = event.ts;
        });
        st.call(call_id).cloned()
    }

    async fn record_tool_result(
        &self,
        call_id: &str,
        result: ToolResult,
    ) -> StoreResult<RecordedResult> {
        if let ToolOutcome::Error { code, .. } = &result.outcome {
            require_text("error code", code)?;
        }
        let now = self.now();
        let mut st = self.lock();
        let call = st.call(call_id)?.clone();
        let (value, error_code, error_message) = match &result.outcome {
            ToolOutcome::Success(v) => (Some(v.clone()), None, None),
            ToolOutcome::Error { code, message } => {
                (None, Some(code.clone()), Some(message.clone()))
            }
        };
        let mut fields = Map::new();
        fields.insert("call_id".into(), json!(call_id));
        if let Some(w) = &result.worker_id {
            fields.insert("worker_id".into(), json!(w));
        }
        if let Some(v) = &value {
            fields.insert("result".into(), v.clone());
        }
        if let Some(c) = &error_code {
            fields.insert("error_code".into(), json!(c));
        }
        if let Some(m) = &error_message {
            fields.insert("error_message".into(), json!(m));
        }
        let in_doubt = match call.status {
            CallStatus::Cancelled => true,
            CallStatus::Failed => call.error_code.as_deref() == Some(error_codes::OUTCOME_UNKNOWN),
            _ => false,
        };
        if call.attempt < 1 || (call.status.is_terminal() && !in_doubt) {
            let reason = if call.status.is_terminal() {
                format!("the call is already {}", call.status)
            } else {
                format!("the call was never dispatched (status {})", call.status)
            };
            fields.insert("status".into(), json!(call.status.as_str()));
            fields.insert("reason".into(), json!(reason));
            st.emit_call(
                &call,
                types::TOOL_LATE_RESULT,
                "worker",
                Value::Object(fields),
                now,
            );
            return Ok(RecordedResult {
                applied: false,
                invocation: call,
                closed_approval: None,
            });
        }
        let status = if value.is_some() {
            CallStatus::Succeeded
        } else {
            CallStatus::Failed
        };
        fields.insert("status".into(), json!(status.as_str()));
        if let Some(u) = &result.usage {
            fields.insert(
                "usage".into(),
                serde_json::to_value(u).unwrap_or(Value::Null),
            );
        }
        let event = st.emit_call(
            &call,
            types::TOOL_COMPLETED,
            "worker",
            Value::Object(fields),
            now,
        );
        let was_awaiting = call.status == CallStatus::AwaitingApproval;
        st.update_call(call_id, |c| {
            c.status = status;
            c.result.clone_from(&value);
            c.error_code.clone_from(&error_code);
            c.error_message.clone_from(&error_message);
            c.usage = result.usage;
            c.completed_at = Some(event.ts);
            c.updated_at = event.ts;
        });
        let mut closed_approval = None;
        if was_awaiting {
            let pending = st.approval_order.iter().copied().find(|id| {
                st.approvals
                    .get(id)
                    .is_some_and(|a| a.call_id == call_id && a.status == ApprovalStatus::Pending)
            });
            if let Some(id) = pending {
                st.decide(
                    id,
                    ApprovalStatus::Cancelled,
                    "system",
                    "the tool outcome arrived before a decision",
                    None,
                    None,
                    now,
                )?;
                closed_approval = Some(id);
            }
        }
        Ok(RecordedResult {
            applied: true,
            invocation: st.call(call_id)?.clone(),
            closed_approval,
        })
    }

    async fn fail_tool_call(
        &self,
        call_id: &str,
        code: &str,
        message: &str,
    ) -> StoreResult<ToolInvocation> {
        use CallStatus as C;
        require_text("error code", code)?;
        let now = self.now();
        let mut st = self.lock();
        let call = st.call(call_id)?.clone();
        State::check_call_from(
            &call,
            C::Failed,
            &[C::Pending, C::Queued, C::Dispatched, C::Indeterminate],
        )?;
        let payload = json!({
            "call_id": call_id,
            "status": C::Failed.as_str(),
            "error_code": code,
            "error_message": message,
        });
        let event = st.emit_call(&call, types::TOOL_COMPLETED, "system", payload, now);
        st.update_call(call_id, |c| {
            c.status = C::Failed;
            c.error_code = Some(code.to_owned());
            c.error_message = Some(message.to_owned());
            c.completed_at = Some(event.ts);
            c.updated_at = event.ts;
        });
        st.call(call_id).cloned()
    }

    async fn deny_tool_call(
        &self,
        call_id: &str,
        reason: &str,
        policy_ref: Option<&str>,
    ) -> StoreResult<ToolInvocation> {
        use CallStatus as C;
        require_text("reason", reason)?;
        let now = self.now();
        let mut st = self.lock();
        let call = st.call(call_id)?.clone();
        State::check_call_from(&call, C::Failed, &[C::Pending, C::Queued])?;
        let mut payload = json!({"call_id": call_id, "reason": reason});
        if let Some(p) = policy_ref {
            payload["policy_ref"] = json!(p);
        }
        let event = st.emit_call(&call, types::TOOL_POLICY_DENIED, "policy", payload, now);
        st.update_call(call_id, |c| {
            c.status = C::Failed;
            c.error_code = Some(error_codes::POLICY_DENIED.to_owned());
            c.error_message = Some(reason.to_owned());
            c.completed_at = Some(event.ts);
            c.updated_at = event.ts;
        });
        st.call(call_id).cloned()
    }

    async fn mark_tool_call_indeterminate(
        &self,
        call_id: &str,
        reason: &str,
    ) -> StoreResult<ToolInvocation> {
        require_text("reason", reason)?;
        let now = self.now();
        let mut st = self.lock();
        let call = st.call(call_id)?.clone();
        State::check_call_from(&call, CallStatus::Indeterminate, &[CallStatus::Dispatched])?;
        let mut payload = json!({"call_id": call_id, "reason": reason});
        if let Some(w) = &call.worker_id {
            payload["worker_id"] = json!(w);
        }
        let event = st.emit_call(&call, types::TOOL_INDETERMINATE, "system", payload, now);
        st.update_call(call_id, |c| {
            c.status = CallStatus::Indeterminate;
            c.error_code = Some(error_codes::INDETERMINATE.to_owned());
            c.error_message = Some(reason.to_owned());
            c.updated_at = event.ts;
        });
        st.call(call_id).cloned()
    }

    async fn cancel_tool_call(&self, call_id: &str, reason: &str) -> StoreResult<ToolInvocation> {
        require_text("reason", reason)?;
        let now = self.now();
        let mut st = self.lock();
        let call = st.call(call_id)?.clone();
        if call.status.is_terminal() {
            return Err(StoreError::precondition(format!(
                "tool call {} cannot go from {} to cancelled",
                call.call_id, call.status
            )));
        }
        let pending = st.approval_order.iter().copied().find(|id| {
            st.approvals
                .get(id)
                .is_some_and(|a| a.call_id == call_id && a.status == ApprovalStatus::Pending)
        });
        match pending {
            Some(id) => st.decide(
                id,
                ApprovalStatus::Cancelled,
                "system",
                reason,
                None,
                None,
                now,
            )?,
            None => st.cancel_call_locked(call_id, reason, now)?,
        }
        st.call(call_id).cloned()
    }

    async fn get_tool_call(&self, call_id: &str) -> StoreResult<ToolInvocation> {
        self.lock().call(call_id).cloned()
    }

    async fn open_calls(&self, session_id: &str) -> StoreResult<Vec<ToolInvocation>> {
        let st = self.lock();
        st.session(session_id)?;
        Ok(st
            .call_order
            .iter()
            .filter_map(|id| st.calls.get(id))
            .filter(|c| c.session_id == session_id && !c.status.is_terminal())
            .cloned()
            .collect())
    }

    async fn completed_calls(&self, call_ids: &[String]) -> StoreResult<HashSet<String>> {
        let st = self.lock();
        Ok(call_ids
            .iter()
            .filter(|id| st.calls.get(*id).is_some_and(|c| c.status.is_terminal()))
            .cloned()
            .collect())
    }

    async fn open_approval(&self, new: NewApproval) -> StoreResult<Approval> {
        use CallStatus as C;
        if new.approvals_required < 1 {
            return Err(StoreError::invalid("approvals_required must be at least 1"));
        }
        require_text("actor", &new.actor)?;
        if new
            .policy_ref
            .as_deref()
            .is_some_and(|p| p.trim().is_empty())
        {
            return Err(StoreError::invalid(
                "policy_ref must not be empty when given",
            ));
        }
        if new.kind == ApprovalKind::OutcomeReview
            && (new.approvals_required != 1 || new.timeout.is_some())
        {
            return Err(StoreError::invalid(
                "an outcome review takes exactly one decision and has no timeout",
            ));
        }
        if let Some(t) = &new.timeout {
            if t.after_minutes < 1 {
                return Err(StoreError::invalid(
                    "timeout after_minutes must be at least 1",
                ));
            }
            if t.escalate_after_minutes == Some(0) {
                return Err(StoreError::invalid(
                    "timeout escalate_after_minutes must be at least 1",
                ));
            }
        }
        let now = self.now();
        let mut st = self.lock();
        let session = st.session(&new.session_id)?.clone();
        if session.status != SessionStatus::AwaitingApproval
            && !session
                .status
                .can_change_to(SessionStatus::AwaitingApproval)
        {
            return Err(StoreError::precondition(format!(
                "session {} is {} and cannot wait for an approval",
                session.id, session.status
            )));
        }
        let call = st.call(&new.call_id)?.clone();
        if call.session_id != session.id {
            return Err(StoreError::invalid(format!(
                "tool call {} belongs to session {}, not {}",
                call.call_id, call.session_id, session.id
            )));
        }
        if !matches!(call.status, C::Pending | C::Queued | C::Indeterminate) {
            return Err(StoreError::precondition(format!(
                "tool call {} is {} and cannot wait for an approval",
                call.call_id, call.status
            )));
        }
        if new.kind == ApprovalKind::OutcomeReview && call.attempt < 1 {
            return Err(StoreError::precondition(format!(
                "tool call {} was never sent to a worker, so its outcome cannot be in doubt",
                call.call_id
            )));
        }
        if st.approvals.contains_key(&new.id) {
            return Err(StoreError::already_exists(format!(
                "approval {} already exists",
                new.id
            )));
        }
        let approval = Approval {
            id: new.id,
            session_id: session.id.clone(),
            call_id: call.call_id.clone(),
            parent_approval_id: None,
            kind: new.kind,
            resolution: None,
            status: ApprovalStatus::Pending,
            route: new.route,
            reason: new.reason,
            tool: call.tool.clone(),
            tool_version: call.version.clone(),
            // The arguments this approval is about: the model's, or an approver's edit that a
            // revalidation sent back for another approval.
            args: call.args.clone(),
            effective_args: None,
            call_hash: {
                let mut about = call.clone();
                about.proposed_args = call.args.clone();
                call_hash(&session.id, &about)
            },
            agent_version_id: session.agent_version_id,
            agent: session.agent.clone(),
            policy_ref: new.policy_ref,
            policy_runtime: new.policy_runtime,
            authority_ref: new.authority_ref,
            approvals_required: new.approvals_required,
            approvals_received: 0,
            comprehension_required: new.comprehension_required,
            on_reject: new.on_reject,
            on_modify: new.on_modify,
            expires_at: new.timeout.as_ref().map(|t| expiry(now, t.after_minutes)),
            timeout: new.timeout,
            escalation_depth: 0,
            decided_by: None,
            comment: None,
            created_at: now,
            decided_at: None,
            votes: Vec::new(),
        };
        st.insert_approval(approval, &new.actor, now);
        if session.status != SessionStatus::AwaitingApproval {
            let change = StatusChange::to(SessionStatus::AwaitingApproval)
                .because(format!("approval {} opened", new.id));
            let mut ignored = StatusChanged {
                session: session.clone(),
                from: session.status,
                closed_approvals: Vec::new(),
                cancelled_calls: Vec::new(),
                cancelled_children: Vec::new(),
                secrets_purged: 0,
            };
            st.transition(&session.id, &change, &mut ignored, now)?;
        }
        st.approval(new.id).cloned()
    }

    async fn cast_vote(&self, approval_id: Uuid, vote: Vote) -> StoreResult<VoteOutcome> {
        require_text("actor", &vote.actor)?;
        if let Some(edited) = &vote.edited_args {
            if vote.decision == VoteDecision::Reject {
                return Err(StoreError::invalid(
                    "edited args can only accompany an approve vote",
                ));
            }
            if !edited.is_object() {
                return Err(StoreError::invalid("edited args must be a JSON object"));
            }
        }
        let now = self.now();
        let mut st = self.lock();
        let approval = st.approval(approval_id)?.clone();
        if approval.status != ApprovalStatus::Pending {
            return Err(StoreError::precondition(format!(
                "approval {} is already {}",
                approval.id, approval.status
            )));
        }
        let resolution = vote_resolution(&approval, &vote)?;
        let decision = resolution.map_or(vote.decision, ReviewResolution::decision);
        if approval.comprehension_required && !vote.comprehension_acknowledged {
            return Err(StoreError::invalid(
                "comprehension acknowledgement is required",
            ));
        }
        if let Some(earlier) = approval
            .votes
            .iter()
            .find(|v| phrony_ledger::same_voter(&v.decided_by, &vote.actor))
        {
            return Err(StoreError::precondition(
                phrony_ledger::duplicate_vote_message(&vote.actor, &earlier.decided_by),
            ));
        }
        if vote.decision == VoteDecision::Approve
            && approval.approvals_received > 0
            && let Some(edited) = &vote.edited_args
            && edited != approval.args_to_dispatch()
        {
            return Err(StoreError::precondition(format!(
                "approval {} already has approve votes for other arguments; approve those \
                 arguments or reject",
                approval.id
            )));
        }
        let turn = st.calls.get(&approval.call_id).map(|c| c.turn);
        let mut payload = json!({
            "approval_id": approval_id,
            "call_id": approval.call_id,
            "decided_by": vote.actor,
            "decision": decision.as_str(),
            "comment": vote.comment,
            "comprehension_acknowledged": vote.comprehension_acknowledged,
        });
        if let Some(e) = &vote.edited_args {
            payload["edited_args"] = e.clone();
        }
        if let Some(r) = resolution {
            payload["resolution"] = json!(r.as_str());
        }
        if let Some(r) = &vote.result {
            payload["result"] = r.clone();
        }
        let mut new = NewEvent::new(types::APPROVAL_VOTE, &vote.actor, payload);
        new.call_id = Some(approval.call_id.clone());
        new.turn = turn;
        let event = st.append(&approval.session_id, new, now);
        if let Some(a) = st.approvals.get_mut(&approval_id) {
            a.votes.push(ApprovalVote {
                decided_by: vote.actor.clone(),
                decision,
                comment: vote.comment.clone(),
                comprehension_acknowledged: vote.comprehension_acknowledged,
                edited_args: vote.edited_args.clone(),
                created_at: event.ts,
            });
            if decision == VoteDecision::Approve {
                a.approvals_received += 1;
                if a.effective_args.is_none() {
                    a.effective_args.clone_from(&vote.edited_args);
                }
            }
        }
        let after = st.approval(approval_id)?.clone();
        if let Some(resolution) = resolution {
            let (status, args) = match resolution {
                ReviewResolution::Happened | ReviewResolution::Resend => {
                    (ApprovalStatus::Approved, Some(after.args.clone()))
                }
                ReviewResolution::Fail => (ApprovalStatus::Denied, None),
            };
            st.decide(
                approval_id,
                status,
                &vote.actor,
                &vote.comment,
                args,
                Some(resolution),
                now,
            )?;
            match resolution {
                ReviewResolution::Resend => {}
                ReviewResolution::Happened => {
                    st.complete_by_review(&after.call_id, &vote.actor, Ok(vote.result), now)?;
                }
                ReviewResolution::Fail => {
                    let message = not_resent_message(&vote.actor, &vote.comment);
                    st.complete_by_review(&after.call_id, &vote.actor, Err(message), now)?;
                }
            }
            return Ok(VoteOutcome {
                approval: st.approval(approval_id)?.clone(),
                decided: true,
            });
        }
        let decided = match decision {
            VoteDecision::Reject => {
                st.decide(
                    approval_id,
                    ApprovalStatus::Denied,
                    &vote.actor,
                    &vote.comment,
                    None,
                    None,
                    now,
                )?;
                true
            }
            VoteDecision::Approve if after.approvals_received >= after.approvals_required => {
                let args = after.args_to_dispatch().clone();
                st.decide(
                    approval_id,
                    ApprovalStatus::Approved,
                    &vote.actor,
                    &vote.comment,
                    Some(args),
                    None,
                    now,
                )?;
                true
            }
            VoteDecision::Approve => false,
        };
        Ok(VoteOutcome {
            approval: st.approval(approval_id)?.clone(),
            decided,
        })
    }

    async fn expire_approval(
        &self,
        approval_id: Uuid,
        at: DateTime<Utc>,
    ) -> StoreResult<TimeoutOutcome> {
        let now = self.now();
        let mut st = self.lock();
        let approval = st.approval(approval_id)?.clone();
        if approval.status != ApprovalStatus::Pending {
            return Err(StoreError::precondition(format!(
                "approval {} is already {}",
                approval.id, approval.status
            )));
        }
        let (Some(timeout), Some(expires_at)) = (approval.timeout.clone(), approval.expires_at)
        else {
            return Err(StoreError::precondition(format!(
                "approval {approval_id} has no timeout"
            )));
        };
        if expires_at > at {
            return Err(StoreError::precondition(format!(
                "approval {approval_id} does not expire until {expires_at}"
            )));
        }
        let mut escalated_to = None;
        match timeout.default {
            TimeoutDefault::Deny => st.decide(
                approval_id,
                ApprovalStatus::Denied,
                TIMEOUT_ACTOR,
                "approval timed out",
                None,
                None,
                now,
            )?,
            TimeoutDefault::Allow => {
                let args = approval.args_to_dispatch().clone();
                st.decide(
                    approval_id,
                    ApprovalStatus::Approved,
                    TIMEOUT_ACTOR,
                    "approval timed out; allowed by the timeout default",
                    Some(args),
                    None,
                    now,
                )?;
            }
            TimeoutDefault::Escalate if approval.escalation_depth >= MAX_ESCALATION_DEPTH => {
                st.decide(
                    approval_id,
                    ApprovalStatus::Denied,
                    TIMEOUT_ACTOR,
                    "approval escalation depth exceeded",
                    None,
                    None,
                    now,
                )?;
            }
            TimeoutDefault::Escalate => {
                let new_id = Uuid::new_v4();
                let turn = st.calls.get(&approval.call_id).map(|c| c.turn);
                let mut new = NewEvent::new(
                    types::APPROVAL_ESCALATED,
                    "system",
                    json!({
                        "approval_id": approval_id,
                        "call_id": approval.call_id,
                        "escalated_to": new_id,
                        "decided_by": TIMEOUT_ACTOR,
                        "comment": "approval timed out; escalated",
                    }),
                );
                new.call_id = Some(approval.call_id.clone());
                new.turn = turn;
                let event = st.append(&approval.session_id, new, now);
                if let Some(a) = st.approvals.get_mut(&approval_id) {
                    a.status = ApprovalStatus::Escalated;
                    a.decided_by = Some(TIMEOUT_ACTOR.to_owned());
                    a.comment = Some("approval timed out; escalated".to_owned());
                    a.decided_at = Some(event.ts);
                }
                let minutes = timeout
                    .escalate_after_minutes
                    .unwrap_or(timeout.after_minutes);
                let next = Approval {
                    id: new_id,
                    parent_approval_id: Some(approval_id),
                    status: ApprovalStatus::Pending,
                    route: timeout
                        .escalate_to_route
                        .clone()
                        .unwrap_or_else(|| approval.route.clone()),
                    effective_args: None,
                    approvals_received: 0,
                    expires_at: Some(expiry(now, minutes)),
                    timeout: Some(timeout.clone()),
                    escalation_depth: approval.escalation_depth.saturating_add(1),
                    decided_by: None,
                    comment: None,
                    decided_at: None,
                    votes: Vec::new(),
                    ..approval.clone()
                };
                st.insert_approval(next, "system", now);
                escalated_to = Some(st.approval(new_id)?.clone());
            }
        }
        Ok(TimeoutOutcome {
            approval: st.approval(approval_id)?.clone(),
            escalated_to,
        })
    }

    async fn get_approval(&self, approval_id: Uuid) -> StoreResult<Approval> {
        self.lock().approval(approval_id).cloned()
    }

    async fn session_approvals(&self, session_id: &str) -> StoreResult<Vec<Approval>> {
        let st = self.lock();
        Ok(st
            .approval_order
            .iter()
            .filter_map(|id| st.approvals.get(id))
            .filter(|a| a.session_id == session_id)
            .cloned()
            .collect())
    }

    async fn due_approvals(&self, now: DateTime<Utc>, limit: u32) -> StoreResult<Vec<Approval>> {
        let st = self.lock();
        let mut due: Vec<Approval> = st
            .approvals
            .values()
            .filter(|a| {
                a.status == ApprovalStatus::Pending && a.expires_at.is_some_and(|e| e <= now)
            })
            .cloned()
            .collect();
        due.sort_by_key(|a| (a.expires_at, a.id));
        due.truncate(limit.clamp(1, 1000) as usize);
        Ok(due)
    }

    async fn next_approval_expiry(&self) -> StoreResult<Option<DateTime<Utc>>> {
        Ok(self
            .lock()
            .approvals
            .values()
            .filter(|a| a.status == ApprovalStatus::Pending)
            .filter_map(|a| a.expires_at)
            .min())
    }
}
