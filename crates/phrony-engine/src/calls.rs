//! One tool call from the model's request to its recorded outcome (§4.1, §2, §3):
//! binding → argument validation → policy → (deny | approval | dispatch) → failure routing.
//!
//! Every step starts from the call's durable status, so a call interrupted by a restart
//! continues where it stopped ([`Ctx::drive_call`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use chrono::DateTime;
use phrony_dispatch::{
    DispatchCall, DispatchFailure, DispatchJournal, HookError, Invocation, WorkerProvenance,
};
use phrony_ledger::{
    Approval, ApprovalKind, ApprovalStatus, ApprovalTimeout, CallStatus, Dispatch, NewApproval,
    NewToolCall, OnModify, OnReject, OutputInvalid, PolicyShadowed, PolicyVerdict, SessionMode,
    SessionStatus, SideEffectClass, TimeoutDefault, ToolInvocation, ToolResult,
};
pub(crate) use phrony_manifest::CallScope;
use phrony_manifest::ToolBinding;
use phrony_policy::{
    AgentCtx, Decision, DecisionKind, Policy, Request, SessionCtx, ShadowOutcome, ToolCtx, Trigger,
};
use serde_json::{Map, Value, json};
use tracing::Instrument as _;
use uuid::Uuid;

use crate::driver::{CallStop, Ctx, LimitEscalation, Recorded, Stop, limit_message};
use crate::error::{ErrorKind, StoreError};
use crate::fold::{FAILURE_KEY, OUTPUT_TOOL, TRIGGER_KEY, codes, rejection_text};
use crate::hooks::ledger_outcome;
use crate::output::{OutputDecision, rejected_message};
use crate::setup::DriverSetup;
use crate::store::LedgerStore;

pub use crate::fold::LIMIT_TOOL;

pub(crate) mod history;
mod mcp;

/// Call indexes of limit escalations start here (model calls use 0, 1, …).
const LIMIT_INDEX: u32 = 1_000_000;
/// Call indexes of output escalations: this plus the check's attempt number.
const OUTPUT_INDEX: u32 = 2_000_000;

/// Records each dispatch in the store before the invoke is sent; a re-dispatch after a nack
/// re-queues the call first.
/// Journals a router dispatch in the ledger. A call reaches the router `pending` or already
/// `queued`; it is recorded `queued` before it waits for a slot ([`DispatchJournal::queued`]),
/// and a call that gets one at once is queued and dispatched in one transaction.
struct Journal {
    store: Arc<LedgerStore>,
    /// Whether the ledger holds the call `queued` (so a dispatch need not queue it first).
    queued: AtomicBool,
}

/// Why a dispatch produced no outcome: the Work-stream router's failure, or an MCP call whose
/// outcome is unknown (routed like a lost worker, §2.7).
pub(crate) enum Failure {
    /// From the router.
    Worker(DispatchFailure),
    /// An MCP `tools/call` was sent and no answer came (transport error, HTTP 5xx, timeout):
    /// the message.
    McpUnknown(String),
}

impl From<DispatchFailure> for Failure {
    fn from(f: DispatchFailure) -> Self {
        Self::Worker(f)
    }
}

impl Failure {
    fn worker(&self) -> Option<&DispatchFailure> {
        match self {
            Self::Worker(f) => Some(f),
            Self::McpUnknown(_) => None,
        }
    }

    fn outcome_unknown(&self) -> bool {
        self.worker().is_none_or(DispatchFailure::outcome_unknown)
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Worker(w) => w.fmt(f),
            Self::McpUnknown(m) => f.write_str(m),
        }
    }
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}

#[async_trait]
impl DispatchJournal for Journal {
    async fn queued(&self, invocation: &Invocation, _attempt: u32) -> Result<(), HookError> {
        if !self.queued.load(Ordering::SeqCst) {
            self.store.queue_tool_call(&invocation.call_id).await?;
            self.queued.store(true, Ordering::SeqCst);
        }
        Ok(())
    }

    async fn dispatching(
        &self,
        invocation: &Invocation,
        worker: &WorkerProvenance,
        _attempt: u32,
    ) -> Result<(), HookError> {
        let deadline_at = (invocation.deadline_unix_ms > 0)
            .then(|| DateTime::from_timestamp_millis(invocation.deadline_unix_ms))
            .flatten();
        let dispatch = Dispatch {
            worker_id: worker.worker_id.clone(),
            worker_identity: non_empty(&worker.workload_identity),
            image_digest: non_empty(&worker.image_digest),
            descriptor_hash: non_empty(&worker.descriptor_hash),
            deadline_at,
        };
        if self.queued.load(Ordering::SeqCst) {
            self.store
                .dispatch_tool_call(&invocation.call_id, dispatch)
                .await?;
        } else {
            self.store
                .queue_and_dispatch_tool_call(&invocation.call_id, dispatch)
                .await?;
        }
        // A later attempt (after a nack) queues the call again.
        self.queued.store(false, Ordering::SeqCst);
        Ok(())
    }
}

fn on_reject(p: &Policy) -> OnReject {
    match p.on_reject() {
        phrony_policy::OnReject::Fail => OnReject::Fail,
        phrony_policy::OnReject::ReturnToAgent => OnReject::ReturnToAgent,
    }
}

fn on_modify(p: &Policy) -> OnModify {
    match p.on_modify() {
        phrony_policy::OnModify::Revalidate => OnModify::Revalidate,
        phrony_policy::OnModify::Unchecked => OnModify::Unchecked,
    }
}

fn runtime_text<'a>(runtime: &'a Map<String, Value>, keys: &[&str]) -> Option<&'a str> {
    keys.iter()
        .find_map(|k| runtime.get(*k).and_then(Value::as_str))
        .filter(|s| !s.trim().is_empty())
}

fn runtime_minutes(runtime: &Map<String, Value>, key: &str) -> Option<u32> {
    match runtime.get(key)? {
        Value::Number(n) => n.as_u64().and_then(|v| u32::try_from(v).ok()),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
    .filter(|m| *m > 0)
}

fn side_effect_class(binding: &ToolBinding) -> Option<SideEffectClass> {
    binding.side_effect_class.parse().ok()
}

/// Whether a call whose outcome is unknown may simply be reported or re-sent (reads and
/// idempotent writes). A missing or unknown class counts as the most dangerous one
/// (`irreversible_action`), unlike the reference, which treated it as a read and re-sent it.
fn safe_class(binding: &ToolBinding) -> bool {
    side_effect_class(binding).is_some_and(SideEffectClass::safe_to_redispatch)
}

/// The question an outcome review asks, from what went wrong.
fn review_question(call: &ToolInvocation, what_happened: &str) -> String {
    format!(
        "{what_happened}. The runtime cannot tell whether {}@{} took effect: did it happen?",
        call.tool, call.version
    )
}

/// Why arguments an approver edited may not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EditRefusal {
    /// They do not match the binding's input schema (the violations, as one message).
    Schema(String),
    /// A deny policy (or an allow-list) forbids them.
    Denied {
        /// The policy's ref.
        policy: String,
        /// Its reason.
        message: String,
    },
}

/// What [`Ctx::accept_edit`] decided about arguments an approver edited.
enum EditOutcome {
    /// Refused: the call was failed or denied.
    Refused,
    /// A fresh approval was opened for them (`on_modify: revalidate`).
    Approval(Uuid),
    /// They go on to dispatch.
    Dispatch,
}

/// The ledger's name of a policy decision kind.
fn verdict(kind: DecisionKind) -> PolicyVerdict {
    match kind {
        DecisionKind::Allow => PolicyVerdict::Allow,
        DecisionKind::Deny => PolicyVerdict::Deny,
        DecisionKind::RequireApproval => PolicyVerdict::RequireApproval,
    }
}

/// The `policy.shadow` record of what a shadow policy would have changed about `call`.
fn shadow_record(
    session: &phrony_ledger::Session,
    call: &ToolInvocation,
    enforced: &Decision<'_>,
    outcome: &ShadowOutcome<'_>,
) -> PolicyShadowed {
    PolicyShadowed {
        session_id: session.id.clone(),
        call_id: call.call_id.clone(),
        agent: session.agent.to_string(),
        tool: call.tool.clone(),
        args_digest: phrony_ledger::call_hash(&session.id, call),
        enforced: verdict(enforced.kind()),
        enforced_policy: enforced.policy().map(|p| p.id().to_string()),
        shadow: verdict(outcome.shadow.kind()),
        policy: outcome.policy.id().to_string(),
        reason: outcome.shadow.reason().map(str::to_owned),
    }
}

impl DriverSetup {
    /// The schema violations of `args` for the tool `wire`, as one message.
    /// Arguments the model sent as text that is not JSON (the providers pass such text on as a
    /// JSON string) are named as such rather than as "not of type object".
    pub(crate) fn invalid_args(&self, wire: &str, args: &Value) -> Option<String> {
        let validator = self.validators.get(wire)?;
        if let Value::String(raw) = args
            && let Err(e) = serde_json::from_str::<Value>(raw)
        {
            return Some(format!(
                "the arguments are not valid JSON ({e}); send one JSON object that matches the \
                 tool's input schema"
            ));
        }
        validator.validate(args).err().map(|errors| {
            errors
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; ")
        })
    }

    /// Checks arguments an approver edited: they must match the input schema and pass every
    /// deny policy (and allow-list), whatever `on_modify` says, with the history facts of the
    /// edited call (`history`, read for the edited arguments; without them history-aware
    /// policies fail closed). `Ok(Some(policy))` when a `require_approval` policy matches them
    /// (a fresh approval with `on_modify: revalidate`).
    pub(crate) fn check_edit(
        &self,
        scope: &CallScope<'_>,
        binding: &ToolBinding,
        wire: &str,
        args: &Value,
        history: Option<&phrony_policy::HistoryFacts>,
    ) -> Result<Option<&Policy>, EditRefusal> {
        if let Some(message) = self.invalid_args(wire, args) {
            return Err(EditRefusal::Schema(message));
        }
        let mut request = scope.request(binding, wire, args);
        if let Some(facts) = history {
            request = request.with_history(facts);
        }
        match self.policies.evaluate(&request) {
            Decision::Allow => Ok(None),
            Decision::Deny { policy, message } => Err(EditRefusal::Denied {
                policy: policy.id().to_string(),
                message: message.into_owned(),
            }),
            Decision::RequireApproval { policy } => Ok(Some(policy)),
        }
    }
}

impl Ctx {
    /// Tool visibility: removes from `tools` (a completion request's) every tool whose every
    /// call policy denies in this session's context now, whatever the arguments
    /// ([`phrony_policy::PolicySet::hidden_tool`], asked with the dispatch-time context and
    /// `null` arguments), and returns each with the policy that hid it. A call the model makes
    /// to a hidden tool anyway is decided like any other (and denied).
    pub(crate) fn hide_denied_tools(
        &self,
        tools: &mut Vec<phrony_providers::ToolSpec>,
    ) -> Vec<phrony_ledger::HiddenTool> {
        let scope = self.scope();
        let mut hidden = Vec::new();
        tools.retain(|tool| {
            let Some(binding) = self.setup.binding(&tool.name) else {
                return true;
            };
            let request = scope.request(binding, &tool.name, &Value::Null);
            let Some(policy) = self.setup.policies.hidden_tool(&request) else {
                return true;
            };
            hidden.push(phrony_ledger::HiddenTool {
                name: tool.name.clone(),
                policy: policy.id().to_string(),
            });
            false
        });
        hidden
    }

    pub(crate) fn scope(&self) -> CallScope<'_> {
        CallScope {
            agent: &self.agent,
            session_id: &self.session.id,
            metadata: &self.metadata,
            principal: self.principal.as_ref(),
            now: self.now().timestamp(),
        }
    }

    /// Records a completion that requested tool calls, the move to `awaiting_tool` and the
    /// calls, in one ledger transaction (`Ledger::record_step`); returns the calls as stored.
    pub(crate) async fn record_step(
        &self,
        completion: phrony_ledger::NewEvent,
        assistant: Option<phrony_ledger::SessionEvent>,
        calls: Vec<NewToolCall>,
    ) -> Result<Vec<ToolInvocation>, StoreError> {
        let mut state = self.status.lock().await;
        let next = (state.status != SessionStatus::AwaitingTool).then(|| {
            phrony_ledger::StatusChange::to(SessionStatus::AwaitingTool).from(state.status)
        });
        let step = self
            .store()
            .record_step(&self.session.id, completion, assistant, next, calls)
            .await?;
        if let Some(changed) = &step.status {
            state.status = changed.session.status;
        }
        drop(state);
        self.notify();
        Ok(step.calls)
    }

    /// Records a worker's result; when the driver allows it (`resume_after_calls`) and the
    /// session waits for its tools, with the move back to `running` should this result close
    /// the last open call ([`phrony_ledger::Ledger::record_tool_result_and_resume`]).
    pub(crate) async fn record_result(
        &self,
        call_id: &str,
        result: phrony_ledger::ToolResult,
    ) -> Result<(), StoreError> {
        if self
            .resume_after_calls
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            // Held across the write: the status this driver keeps follows the ledger's.
            let mut state = self.status.lock().await;
            if state.status == SessionStatus::AwaitingTool {
                let resume = phrony_ledger::StatusChange::to(SessionStatus::Running)
                    .from(SessionStatus::AwaitingTool);
                let recorded = self
                    .store()
                    .record_tool_result_and_resume(call_id, result, resume)
                    .await?;
                if let Some(changed) = &recorded.resumed {
                    state.status = changed.session.status;
                }
                return Ok(());
            }
        }
        self.store().record_tool_result(call_id, result).await?;
        Ok(())
    }

    /// The ledger row of one model tool call, from its binding.
    pub(crate) fn new_tool_call(
        &self,
        turn: u32,
        iteration: u32,
        rec: &crate::fold::ToolCallRecord,
    ) -> NewToolCall {
        let binding = self.setup.binding(&rec.name);
        let (tool, version, class) = match binding {
            Some(b) => (
                b.reference.clone(),
                b.dispatch_version().to_owned(),
                side_effect_class(b),
            ),
            None => (
                rec.name.clone(),
                phrony_dispatch::DEFAULT_VERSION.to_owned(),
                None,
            ),
        };
        let delegation = binding
            .and_then(|b| b.agent.as_ref())
            .map(crate::delegate::target_label);
        NewToolCall {
            session_id: self.session.id.clone(),
            turn,
            iteration,
            index: rec.index,
            tool,
            version,
            wire_name: Some(rec.name.clone()),
            args: rec.args.clone(),
            side_effect_class: class,
            delegation,
        }
    }

    /// Takes a recorded call from its current status to an outcome.
    pub(crate) async fn drive_call(
        &self,
        call: ToolInvocation,
        recorded: Recorded,
    ) -> Result<(), CallStop> {
        if call.status.is_terminal() {
            return Ok(());
        }
        let wire = call.wire_name.clone().unwrap_or_else(|| call.tool.clone());
        let Some(binding) = self.setup.binding(&wire).cloned() else {
            if call.status == CallStatus::Pending {
                self.store()
                    .fail_tool_call(
                        &call.call_id,
                        codes::UNKNOWN_TOOL,
                        &format!("unknown tool {wire:?}"),
                    )
                    .await?;
            }
            return Ok(());
        };
        match call.status {
            CallStatus::Pending => {
                // A pending call approved earlier (a restart, a dispatch-failure approval)
                // goes on from its approval; one recorded just now has none.
                let approved = match recorded {
                    Recorded::JustNow => None,
                    Recorded::Earlier => self
                        .latest_approval(&call.call_id)
                        .await?
                        .filter(|a| a.status == ApprovalStatus::Approved),
                };
                if let Some(approval) = approved {
                    self.took_decision(approval.id, SessionStatus::AwaitingTool)
                        .await?;
                    return self.after_approval(&call, &binding, &wire, approval).await;
                }
                let args = call.proposed_args.clone();
                self.decide(&call, &binding, &wire, &args).await
            }
            CallStatus::Queued => self.dispatch(&call, &binding, &wire, false).await,
            // A delegation in flight: its child session is found and supervised again.
            CallStatus::Dispatched if binding.agent.is_some() => {
                self.dispatch(&call, &binding, &wire, false).await
            }
            CallStatus::Dispatched if binding.mcp.is_some() => {
                self.recover_mcp_dispatched(&call, &binding, &wire).await
            }
            CallStatus::Dispatched => self.recover_dispatched(&call, &binding, &wire).await,
            CallStatus::Indeterminate => {
                let reason = call
                    .error_message
                    .clone()
                    .unwrap_or_else(|| "the worker was lost while the call was in flight".into());
                self.unknown_outcome(&call, &binding, &wire, &reason, None)
                    .await
            }
            CallStatus::AwaitingApproval => {
                let approval = self.latest_approval(&call.call_id).await?;
                match approval {
                    Some(a) if a.status == ApprovalStatus::Pending => {
                        self.wait_and_apply(&call, &binding, &wire, a.id).await
                    }
                    Some(a) => {
                        self.took_decision(a.id, SessionStatus::AwaitingTool)
                            .await?;
                        self.after_approval(&call, &binding, &wire, a).await
                    }
                    None => Ok(()),
                }
            }
            CallStatus::Succeeded | CallStatus::Failed | CallStatus::Cancelled => Ok(()),
        }
    }

    async fn latest_approval(&self, call_id: &str) -> Result<Option<Approval>, CallStop> {
        Ok(self
            .store()
            .session_approvals(&self.session.id)
            .await?
            .into_iter()
            .rfind(|a| a.call_id == call_id))
    }

    /// Validates `args`, then applies the policies: deny, open an approval, or dispatch.
    async fn decide(
        &self,
        call: &ToolInvocation,
        binding: &ToolBinding,
        wire: &str,
        args: &Value,
    ) -> Result<(), CallStop> {
        if let Some(message) = self.setup.invalid_args(wire, args) {
            self.store()
                .fail_tool_call(&call.call_id, codes::INVALID_ARGS, &message)
                .await?;
            return Ok(());
        }
        let scope = self.scope();
        let mut attempt = 1;
        let (decision, prepared) = loop {
            // History facts are read before each decision; its reservation is written only if
            // nothing it read changed meanwhile, else the call is decided again.
            let prepared = self.history_for(call, binding, wire, args).await?;
            let mut request = scope.request(binding, wire, args);
            if let Some(p) = &prepared {
                request = request.with_history(&p.facts);
            }
            let decision = self.evaluate_call(call, &request);
            // Shadow policies are evaluated on every decided call and never change it: what
            // they would have changed is recorded (once per call and policy, so a re-decide
            // after a crash adds nothing) before the call goes on exactly as enforced.
            if let Some(outcome) = self.setup.policies.shadow(&request, decision.kind()) {
                let shadowed = shadow_record(&self.session, call, &decision, &outcome);
                self.store().record_shadow_decision(shadowed).await?;
            }
            let reserves = matches!(decision, Decision::Allow | Decision::RequireApproval { .. })
                && prepared
                    .as_ref()
                    .is_some_and(|p| !p.reservations.is_empty());
            if !reserves {
                break (Some(decision), prepared);
            }
            let reservations = prepared
                .as_ref()
                .map_or(&[][..], |p| p.reservations.as_slice());
            if self
                .store()
                .reserve_history(&self.session.id, &call.call_id, reservations)
                .await?
            {
                break (Some(decision), prepared);
            }
            if attempt >= history::MAX_DECIDE_ATTEMPTS {
                break (None, prepared);
            }
            attempt += 1;
        };
        drop(prepared);
        let Some(decision) = decision else {
            // The groups kept changing under this call: fail closed.
            let message = format!(
                "the call's history-aware policies could not be decided: the history they read \
                 changed {} times while deciding",
                history::MAX_DECIDE_ATTEMPTS
            );
            phrony_metrics::TOOL_CALLS.inc(phrony_metrics::Decision::Deny);
            self.store()
                .deny_tool_call(&call.call_id, &message, None)
                .await?;
            return Ok(());
        };
        phrony_metrics::TOOL_CALLS.inc(match &decision {
            Decision::Allow => phrony_metrics::Decision::Allow,
            Decision::Deny { .. } => phrony_metrics::Decision::Deny,
            Decision::RequireApproval { .. } => phrony_metrics::Decision::Approval,
        });
        match decision {
            Decision::Allow => self.dispatch(call, binding, wire, false).await,
            Decision::Deny { policy, message } => {
                self.store()
                    .deny_tool_call(&call.call_id, &message, Some(&policy.id().to_string()))
                    .await?;
                Ok(())
            }
            Decision::RequireApproval { policy } => {
                let new = self.policy_approval(call, policy, None, Map::new());
                let approval = self.open_approval(new).await?;
                Box::pin(self.wait_and_apply(call, binding, wire, approval.id)).await
            }
        }
    }

    /// Evaluates the policies on one request, traced and timed.
    fn evaluate_call<'s>(
        &'s self,
        call: &ToolInvocation,
        request: &phrony_policy::Request<'_>,
    ) -> Decision<'s> {
        let span = crate::trace::decision(&call.call_id, &call.tool, &call.version);
        let started = std::time::Instant::now();
        let decision = span.in_scope(|| self.setup.policies.evaluate(request));
        phrony_metrics::POLICY_EVALUATION.observe(started.elapsed());
        match &decision {
            Decision::Allow => crate::trace::decided(&span, "allow", None),
            Decision::Deny { policy, .. } => {
                crate::trace::decided(&span, "deny", Some(&policy.id().to_string()));
            }
            Decision::RequireApproval { policy } => {
                crate::trace::decided(&span, "require_approval", Some(&policy.id().to_string()))
            }
        }
        decision
    }

    /// An approval request from a policy decision.
    fn policy_approval(
        &self,
        call: &ToolInvocation,
        policy: &Policy,
        reason: Option<String>,
        extra_runtime: Map<String, Value>,
    ) -> NewApproval {
        let mut runtime = policy.runtime().cloned().unwrap_or_default();
        runtime.extend(extra_runtime);
        let timeout = policy.timeout().map(|t| ApprovalTimeout {
            after_minutes: t.after_minutes.max(1),
            default: match t.default {
                phrony_policy::TimeoutDefault::Deny => TimeoutDefault::Deny,
                phrony_policy::TimeoutDefault::Allow => TimeoutDefault::Allow,
                phrony_policy::TimeoutDefault::Escalate => TimeoutDefault::Escalate,
            },
            escalate_to_route: runtime_text(
                &runtime,
                &[
                    "phrony.com/escalate_to_role",
                    "decision.runtime.phrony.com/escalate_to_role",
                ],
            )
            .map(str::to_owned),
            escalate_after_minutes: runtime_minutes(&runtime, "phrony.com/escalate_after_minutes"),
        });
        NewApproval {
            id: Uuid::new_v4(),
            session_id: self.session.id.clone(),
            call_id: call.call_id.clone(),
            kind: ApprovalKind::Policy,
            policy_ref: Some(policy.id().to_string()),
            reason: reason
                .or_else(|| policy.reason().map(str::to_owned))
                .unwrap_or_else(|| format!("policy {} requires approval", policy.id())),
            route: policy.route().unwrap_or_default().to_owned(),
            authority_ref: policy.authority_ref().unwrap_or_default().to_owned(),
            approvals_required: policy.approvals_required().max(1),
            allow_self_approval: policy.allow_self_approval(),
            comprehension_required: policy.comprehension_required(),
            on_reject: on_reject(policy),
            on_modify: on_modify(policy),
            timeout,
            policy_runtime: runtime,
            actor: "policy".into(),
        }
    }

    /// Opens an approval: the call and the session wait for it.
    async fn open_approval(&self, new: NewApproval) -> Result<Approval, CallStop> {
        let mut state = self.status.lock().await;
        let approval = match self.store().open_approval(new).await {
            Ok(a) => a,
            Err(e) => {
                let session = self.store().get_session(&self.session.id).await?;
                if session.status.is_terminal() {
                    return Err(CallStop::Stopped);
                }
                return Err(e.into());
            }
        };
        state.status = SessionStatus::AwaitingApproval;
        drop(state);
        if approval.expires_at.is_some() {
            self.inner.timer_kick.notify_one();
        }
        self.notify();
        Ok(approval)
    }

    /// Waits for `approval_id` (and its escalations) to be decided, then applies the
    /// decision.
    async fn wait_and_apply(
        &self,
        call: &ToolInvocation,
        binding: &ToolBinding,
        wire: &str,
        approval_id: Uuid,
    ) -> Result<(), CallStop> {
        let span = crate::trace::approval_wait(&call.call_id, &approval_id);
        let approval = self
            .wait_for_decision(
                approval_id,
                SessionStatus::AwaitingTool,
                Some(&call.call_id),
            )
            .instrument(span.clone())
            .await;
        crate::trace::approval_outcome(
            &span,
            match &approval {
                Ok(a) => a.status.as_str(),
                Err(CallStop::Parked) => "parked",
                Err(CallStop::HandOff(_)) => "handed_off",
                Err(CallStop::Stopped) => "stopped",
                Err(CallStop::Halt(_)) => "halted",
                Err(CallStop::Fail(_)) => "failed",
                Err(CallStop::Store(_)) => "store_error",
            },
        );
        drop(span);
        Box::pin(self.after_approval(call, binding, wire, approval?)).await
    }

    /// Waits for a decision, counting the wait against the approval-wait budget and out of the
    /// wall clock; once no approval of the session is pending any more, the session leaves
    /// `awaiting_approval` for `resume_to`.
    ///
    /// With `park_call`, the call waiting: when the session may be parked
    /// ([`Ctx::may_park`]) and that call's stored state is what recovery resumes (it is
    /// `awaiting_approval` on this approval), the wait ends with [`CallStop::Parked`] instead.
    async fn wait_for_decision(
        &self,
        approval_id: Uuid,
        resume_to: SessionStatus,
        park_call: Option<&str>,
    ) -> Result<Approval, CallStop> {
        self.waits().open(self.now());
        let decided = self.await_decision(approval_id, park_call).await;
        self.waits().close(self.now());
        let approval = decided?;
        self.settle_decision(approval.id, resume_to).await?;
        Ok(approval)
    }

    /// A decision of `approval_id` was taken: once no approval of the session is pending any
    /// more, the session leaves `awaiting_approval` for `resume_to`; then the votes waiting for
    /// the decision are answered with the status.
    async fn settle_decision(
        &self,
        approval_id: Uuid,
        resume_to: SessionStatus,
    ) -> Result<(), CallStop> {
        let mut state = self.status.lock().await;
        // A cancelled or completed session stops here: its driver is being dropped, so nothing
        // more is recorded for it (the end already closed its approvals and calls).
        if self.live.cancel.is_cancelled() {
            return Err(CallStop::Stopped);
        }
        if state.status == SessionStatus::AwaitingApproval {
            // Under the status lock, so no approval can open meanwhile.
            let pending = self
                .store()
                .session_approvals(&self.session.id)
                .await?
                .iter()
                .any(|a| a.status == ApprovalStatus::Pending);
            if !pending {
                match self.set_status_locked(&mut state, resume_to, None).await {
                    Ok(()) => {}
                    Err(Stop::Cancelled) => return Err(CallStop::Stopped),
                    Err(Stop::Fail(m)) => return Err(CallStop::Fail(m)),
                    Err(Stop::Store(e)) => return Err(CallStop::Store(e)),
                    Err(Stop::Parked) => return Err(CallStop::Parked),
                    Err(Stop::HandOff(to)) => return Err(CallStop::HandOff(to)),
                }
            }
        }
        self.live.decision_taken(approval_id, state.status);
        Ok(())
    }

    /// A decision taken without waiting for it (it was already recorded when the driver came
    /// to the call: the session was parked, or the daemon restarted) is settled as a waited one
    /// (see [`Ctx::settle_decision`]).
    async fn took_decision(
        &self,
        approval_id: Uuid,
        resume_to: SessionStatus,
    ) -> Result<(), CallStop> {
        self.settle_decision(approval_id, resume_to).await
    }

    /// Waits until the approval is decided (following escalations), the session ends, or the
    /// approval-wait budget (`max_hitl_wait_minutes`) is spent.
    async fn await_decision(
        &self,
        mut approval_id: Uuid,
        park_call: Option<&str>,
    ) -> Result<Approval, CallStop> {
        let mut changes = self.live.approvals.subscribe();
        let mut parkable = false;
        if let Some(call_id) = park_call
            && self.may_park()
            && self.parkable(call_id, approval_id).await?
        {
            parkable = true;
            self.park.wait_started();
        }
        let result = self
            .await_decision_in(&mut approval_id, &mut changes, parkable)
            .await;
        if parkable && !matches!(result, Err(CallStop::Parked)) {
            self.park.wait_ended();
        }
        result
    }

    async fn await_decision_in(
        &self,
        approval_id: &mut Uuid,
        changes: &mut tokio::sync::watch::Receiver<u64>,
        parkable: bool,
    ) -> Result<Approval, CallStop> {
        let approval_id_ref = approval_id;
        loop {
            let approval_id = *approval_id_ref;
            // Enabled before the check below, so a call that parks meanwhile wakes this wait.
            let gate = self.park.changed.notified();
            tokio::pin!(gate);
            gate.as_mut().enable();
            let approval = self.store().get_approval(approval_id).await?;
            match approval.status {
                ApprovalStatus::Pending => {}
                ApprovalStatus::Escalated => {
                    let next = self
                        .store()
                        .session_approvals(&self.session.id)
                        .await?
                        .into_iter()
                        .find(|a| a.parent_approval_id == Some(approval_id));
                    if let Some(next) = next {
                        // The vote that escalated it is answered now: the session waits on
                        // the escalation's approval.
                        self.live
                            .decision_taken(approval_id, SessionStatus::AwaitingApproval);
                        *approval_id_ref = next.id;
                        continue;
                    }
                }
                _ => return Ok(approval),
            }
            if parkable && self.park.parking() {
                return Err(CallStop::Parked);
            }
            let hitl = self.limits.max_hitl_wait_minutes.map(|max| {
                let now = self.now();
                let budget =
                    chrono::Duration::minutes(i64::try_from(max).unwrap_or(i64::MAX / 60_000));
                now + (budget - self.waits().used(now))
            });
            let clock = Arc::clone(&self.inner.clock);
            let hitl_expired = async move {
                match hitl {
                    Some(at) => clock.sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = changes.changed() => {}
                () = &mut gate, if parkable => {}
                // Decisions made by this engine wake the wait at once; this re-read is a safety
                // net for decisions made elsewhere.
                () = tokio::time::sleep(self.inner.config.poll_interval * 10) => {}
                () = self.live.cancel.cancelled() => return Err(CallStop::Stopped),
                () = hitl_expired => {
                    return Err(CallStop::Halt(limit_message(
                        "max_hitl_wait_minutes",
                        self.limits.on_limit,
                    )));
                }
            }
        }
    }

    /// Whether this session may be unloaded while a call waits for a human: parking is on, the
    /// session runs in task mode (no user message can arrive for a driver that is gone), no
    /// approval-wait budget has to be timed, and the session is not ending.
    fn may_park(&self) -> bool {
        // A child session never parks: its parent's call waits on its driver.
        self.inner.config.park_approval_waits
            && self.session.parent_session_id.is_none()
            && self.session.mode == SessionMode::Task
            && self.limits.max_hitl_wait_minutes.is_none()
            && !self.live.cancel.is_cancelled()
    }

    /// Whether recovery would resume `call_id` waiting on `approval_id`: the stored call is
    /// `awaiting_approval` and the approval is its latest.
    async fn parkable(&self, call_id: &str, approval_id: Uuid) -> Result<bool, CallStop> {
        let call = self.store().get_tool_call(call_id).await?;
        if call.status != CallStatus::AwaitingApproval {
            return Ok(false);
        }
        Ok(self
            .latest_approval(call_id)
            .await?
            .is_some_and(|a| a.id == approval_id))
    }

    /// Applies a decided approval to its call.
    async fn after_approval(
        &self,
        call: &ToolInvocation,
        binding: &ToolBinding,
        wire: &str,
        approval: Approval,
    ) -> Result<(), CallStop> {
        match approval.status {
            ApprovalStatus::Approved => {
                let current = self.store().get_tool_call(&call.call_id).await?;
                if current.status.is_terminal() {
                    return Ok(());
                }
                // An outcome review resolved `resend`: send the recorded call again (a review
                // resolved `happened` or `fail` left it terminal above).
                if approval.kind == ApprovalKind::OutcomeReview {
                    return Box::pin(self.dispatch(&current, binding, wire, true)).await;
                }
                let failure_approval = approval.policy_runtime.contains_key(TRIGGER_KEY);
                let args = approval.args_to_dispatch().clone();
                if args != approval.args {
                    // Edited arguments always meet the schema and the deny policies; the vote
                    // already checked them, this catches edits stored before that check and
                    // history that changed since. `on_modify` decides only whether they may
                    // open a fresh approval.
                    let revalidate =
                        approval.on_modify == OnModify::Revalidate && !failure_approval;
                    match self
                        .accept_edit(&current, binding, wire, &args, revalidate)
                        .await?
                    {
                        EditOutcome::Refused => return Ok(()),
                        EditOutcome::Approval(approval_id) => {
                            return Box::pin(self.wait_and_apply(
                                &current,
                                binding,
                                wire,
                                approval_id,
                            ))
                            .await;
                        }
                        EditOutcome::Dispatch => {}
                    }
                }
                Box::pin(self.dispatch(&current, binding, wire, failure_approval)).await
            }
            ApprovalStatus::Denied => {
                if approval.on_reject == OnReject::Fail {
                    let by = approval.decided_by.as_deref().unwrap_or("an approver");
                    return Err(CallStop::Fail(rejection_text(
                        &call.call_id,
                        by,
                        approval.comment.as_deref().unwrap_or(""),
                    )));
                }
                Ok(())
            }
            ApprovalStatus::Cancelled => {
                let current = self.store().get_tool_call(&call.call_id).await?;
                if current.status.is_terminal() {
                    Ok(())
                } else {
                    Err(CallStop::Stopped)
                }
            }
            ApprovalStatus::Pending | ApprovalStatus::Escalated => Ok(()),
        }
    }

    /// Checks arguments an approver edited with the edited call's history facts and moves the
    /// call's history reservation to them (decided again, at most
    /// [`history::MAX_DECIDE_ATTEMPTS`] times, while concurrent calls change the groups it
    /// read). A refusal fails or denies the call; with `revalidate`, a `require_approval`
    /// policy matching them opens a fresh approval.
    async fn accept_edit(
        &self,
        call: &ToolInvocation,
        binding: &ToolBinding,
        wire: &str,
        args: &Value,
        revalidate: bool,
    ) -> Result<EditOutcome, CallStop> {
        let scope = self.scope();
        for _attempt in 0..history::MAX_DECIDE_ATTEMPTS {
            let prepared = self.history_for(call, binding, wire, args).await?;
            let facts = prepared.as_ref().map(|p| &p.facts);
            let approval = match self.setup.check_edit(&scope, binding, wire, args, facts) {
                Err(EditRefusal::Schema(message)) => {
                    self.store()
                        .fail_tool_call(
                            &call.call_id,
                            codes::INVALID_ARGS,
                            &format!("the arguments edited by the approver: {message}"),
                        )
                        .await?;
                    return Ok(EditOutcome::Refused);
                }
                Err(EditRefusal::Denied { policy, message }) => {
                    self.store()
                        .deny_tool_call(&call.call_id, &message, Some(&policy))
                        .await?;
                    return Ok(EditOutcome::Refused);
                }
                Ok(Some(policy)) if revalidate => Some(policy),
                Ok(_) => None,
            };
            // The reservation follows the edited arguments (released and written again in
            // one transaction), unless a group changed since it was read.
            if let Some(p) = &prepared
                && !self
                    .store()
                    .replace_history(&self.session.id, &call.call_id, &p.reservations)
                    .await?
            {
                continue;
            }
            return Ok(match approval {
                Some(policy) => {
                    let new = self.policy_approval(call, policy, None, Map::new());
                    EditOutcome::Approval(self.open_approval(new).await?.id)
                }
                None => EditOutcome::Dispatch,
            });
        }
        let message = format!(
            "the arguments edited by the approver could not be decided: the history they read \
             changed {} times while deciding",
            history::MAX_DECIDE_ATTEMPTS
        );
        self.store()
            .deny_tool_call(&call.call_id, &message, None)
            .await?;
        Ok(EditOutcome::Refused)
    }

    /// Sends the call to a worker and records the outcome (then acknowledges it).
    async fn dispatch(
        &self,
        call: &ToolInvocation,
        binding: &ToolBinding,
        wire: &str,
        after_hitl: bool,
    ) -> Result<(), CallStop> {
        let in_flight = call.status == CallStatus::Queued
            || (call.status == CallStatus::Dispatched && binding.agent.is_some());
        // A call for a worker is queued by the router's journal: before it waits for a slot, or
        // with its dispatch in one transaction when a worker is free at once.
        let by_worker = binding.agent.is_none() && binding.mcp.is_none();
        let call = if in_flight || by_worker {
            call.clone()
        } else {
            self.store().queue_tool_call(&call.call_id).await?
        };
        if let Some(target) = &binding.agent {
            return self.delegate(&call, binding, target).await;
        }
        if let Some(mcp) = &binding.mcp {
            let timeout = self.exec_timeout(binding);
            return self
                .dispatch_mcp(&call, binding, wire, mcp, timeout, after_hitl)
                .await;
        }
        let Some(router) = self.inner.router.clone() else {
            let failure = DispatchFailure::NoHandler {
                key: phrony_dispatch::handler_key(&call.tool, &call.version),
            };
            return self
                .dispatch_failed(&call, binding, wire, failure, after_hitl)
                .await;
        };
        if let Some(to) = self.hand_off_target(&call, &router).await {
            // Queued first, so the replica taking the session sends it (never decides again).
            if call.status != CallStatus::Queued {
                self.store().queue_tool_call(&call.call_id).await?;
            }
            tracing::info!(
                call_id = %call.call_id,
                tool = %call.tool,
                to = %to,
                "no worker here serves the call's tool: handing the session to a replica whose \
                 workers do"
            );
            return Err(CallStop::HandOff(to));
        }
        // The worker's spans join the session's trace under this one.
        let span = crate::trace::dispatch(&call.call_id, &call.tool, &call.version);
        let invocation = Invocation {
            trace_context: crate::trace::context_of(&span),
            call_id: call.call_id.clone(),
            session_id: self.session.id.clone(),
            agent_version_id: self.session.agent_version_id.hyphenated().to_string(),
            turn: i32::try_from(call.turn).unwrap_or(i32::MAX),
            tool: call.tool.clone(),
            version: call.version.clone(),
            args: call.args.clone(),
            side_effect_class: binding.side_effect_class.clone(),
            deadline_unix_ms: 0,
        };
        let journal = Arc::new(Journal {
            store: Arc::clone(&self.inner.store),
            queued: AtomicBool::new(call.status == CallStatus::Queued),
        });
        let request = DispatchCall::new(
            invocation,
            self.agent.qualified_name(),
            self.inner.config.queue_wait,
            Some(self.exec_timeout(binding)),
        )
        .with_cancel(self.live.cancel.child_token())
        .with_journal(journal)
        // Only workers serving the descriptor this version was published with (or unpinned).
        .with_descriptor_pin(binding.descriptor_pin());
        let dispatched = router.dispatch(request).instrument(span.clone()).await;
        match &dispatched {
            Ok(done) => crate::trace::dispatched(&span, done),
            Err(failure) => crate::trace::dispatch_failed(&span, failure),
        }
        drop(span);
        match dispatched {
            Ok(done) => {
                let result = ToolResult {
                    worker_id: Some(done.worker.worker_id.clone()),
                    outcome: ledger_outcome(&done.outcome),
                    usage: None,
                };
                // The worker's result is held (and not acknowledged) until it is recorded: a
                // storage outage makes this wait for the database instead of dropping it. A
                // result that did commit before a lost connection is recorded again as
                // `tool.late_result`, never as a second outcome.
                loop {
                    match self.record_result(&call.call_id, result.clone()).await {
                        Ok(()) => break,
                        Err(e) if e.kind == ErrorKind::Unavailable => {
                            tracing::warn!(
                                call_id = %call.call_id,
                                error = %e,
                                "tool result held: database unavailable"
                            );
                            if !self.store().until_writable(&self.live.cancel).await {
                                return Err(CallStop::Stopped);
                            }
                        }
                        Err(e) => return Err(e.into()),
                    }
                }
                done.ack.ack();
                self.notify();
                Ok(())
            }
            Err(failure) => {
                self.dispatch_failed(&call, binding, wire, failure, after_hitl)
                    .await
            }
        }
    }

    /// The replica to hand the session to for `call` (issue #20: any worker serves any
    /// session): with session leases on, when no worker connected here advertises the call's
    /// tool and another replica's workers do. Not for a session handed here within one lease
    /// TTL (it waits for a worker here instead: no ping-pong on a stale handler list). A
    /// failed lookup is no handoff (the call waits for a worker here, as without replicas).
    async fn hand_off_target(
        &self,
        call: &ToolInvocation,
        router: &phrony_dispatch::Router,
    ) -> Option<String> {
        let ttl = self.inner.config.session_lease_ttl?;
        let version = if call.version.is_empty() {
            phrony_dispatch::DEFAULT_VERSION
        } else {
            call.version.as_str()
        };
        let key = phrony_dispatch::handler_key(&call.tool, version);
        if router.advertises(&key) || self.inner.handed_in_within(&self.session.id, ttl) {
            return None;
        }
        match self.store().ledger().replica_serving(&key).await {
            Ok(target) => target,
            Err(error) => {
                tracing::warn!(%key, %error, "could not look for a replica serving the tool");
                None
            }
        }
    }

    /// The call's execution deadline: the binding's `timeout` (from the manifest), else the
    /// daemon's default (`RUNTIME_TOOL_EXEC_TIMEOUT`). The wait for a free worker is bounded
    /// separately (`queue_wait`).
    fn exec_timeout(&self, binding: &ToolBinding) -> Duration {
        binding.timeout().unwrap_or(self.inner.config.exec_timeout)
    }

    /// Routes a dispatch failure (§2.7): a matching trigger policy escalates to a human;
    /// otherwise no handler / no capacity fail the turn, an unknown outcome goes by
    /// side-effect class, an integrity violation is a tool error.
    async fn dispatch_failed(
        &self,
        call: &ToolInvocation,
        binding: &ToolBinding,
        wire: &str,
        failure: impl Into<Failure>,
        after_hitl: bool,
    ) -> Result<(), CallStop> {
        let failure = failure.into();
        if self.live.cancel.is_cancelled()
            || matches!(failure.worker(), Some(DispatchFailure::Cancelled { .. }))
        {
            return Err(CallStop::Stopped);
        }
        if matches!(
            failure.worker(),
            Some(DispatchFailure::JournalFailed { .. })
        ) && !self.store().ledger().is_writable()
        {
            // The dispatch could not be journaled because the database is down: nothing was
            // sent, the call stays queued and is dispatched when the session resumes.
            return Err(CallStop::Store(StoreError::new(
                ErrorKind::Unavailable,
                format!("the database is unavailable: {failure}"),
            )));
        }
        let message = failure.to_string();
        let trigger = match failure.worker() {
            Some(DispatchFailure::NoHandler { .. }) => Some(Trigger::NoHandler),
            Some(DispatchFailure::CapacityExhausted { .. }) => Some(Trigger::CapacityExhausted),
            _ if failure.outcome_unknown() => Some(Trigger::Indeterminate),
            _ => None,
        };
        let mut current = self.store().get_tool_call(&call.call_id).await?;
        if failure.outcome_unknown() && current.status == CallStatus::Dispatched {
            current = self
                .store()
                .mark_indeterminate_unless_settled(&call.call_id, &message)
                .await?;
        }
        if current.status.is_terminal() {
            // A late result beat the failure (recorded by the router hooks).
            return Ok(());
        }
        if let Some(trigger) = trigger
            && !after_hitl
        {
            let args = current.args.clone();
            let scope = self.scope();
            let req = scope.request(binding, wire, &args);
            let policy = self.setup.policies.evaluate_failure(&req, trigger);
            if trigger == Trigger::Indeterminate && !safe_class(binding) {
                // "Did it happen?" is not "may it run?": a trigger policy routes the review, but
                // the review is an outcome review whatever the policy says.
                let route = policy.and_then(Policy::route).map(str::to_owned);
                return self
                    .unknown_outcome(&current, binding, wire, &message, route)
                    .await;
            }
            if let Some(policy) = policy {
                let mut extra = Map::new();
                extra.insert(TRIGGER_KEY.into(), json!(trigger.as_str()));
                extra.insert(FAILURE_KEY.into(), json!(message));
                let reason = policy
                    .reason()
                    .map_or_else(|| message.clone(), str::to_owned);
                let new = self.policy_approval(&current, policy, Some(reason), extra);
                let approval = self.open_approval(new).await?;
                return Box::pin(self.wait_and_apply(&current, binding, wire, approval.id)).await;
            }
        }
        match failure.worker() {
            Some(DispatchFailure::IntegrityViolation { violation, .. }) => {
                self.store()
                    .fail_tool_call(&call.call_id, violation.kind.as_str(), &message)
                    .await?;
                Ok(())
            }
            _ if failure.outcome_unknown() && after_hitl && safe_class(binding) => {
                let current = self
                    .store()
                    .fail_tool_call_unless_settled(&call.call_id, codes::INDETERMINATE, &message)
                    .await?;
                if current.error_code.as_deref() == Some(codes::INDETERMINATE) {
                    Err(CallStop::Fail(message))
                } else {
                    // A late result settled the call first: the model gets it.
                    Ok(())
                }
            }
            _ if failure.outcome_unknown() => {
                self.unknown_outcome(&current, binding, wire, &message, None)
                    .await
            }
            f => {
                let code = f.map_or(codes::INDETERMINATE, DispatchFailure::code);
                self.store()
                    .fail_tool_call(&call.call_id, code, &message)
                    .await?;
                Err(CallStop::Fail(message))
            }
        }
    }

    /// A call that may or may not have run (§4.7): reads and idempotent writes report it to the
    /// model; other writes (and calls of unknown class) open an outcome review ("did it
    /// happen?"), resolved by a human with `happened`, `resend` or `fail`. `route` is the
    /// reviewers' route (from a matching `dispatch:indeterminate` trigger policy).
    async fn unknown_outcome(
        &self,
        call: &ToolInvocation,
        binding: &ToolBinding,
        wire: &str,
        reason: &str,
        route: Option<String>,
    ) -> Result<(), CallStop> {
        if safe_class(binding) {
            // A late result may have settled the call since it was marked indeterminate: then
            // the model gets the recorded result (and the call is not re-sent).
            self.store()
                .fail_tool_call_unless_settled(&call.call_id, codes::INDETERMINATE, reason)
                .await?;
            return Ok(());
        }
        let mut runtime = Map::new();
        runtime.insert(TRIGGER_KEY.into(), json!(Trigger::Indeterminate.as_str()));
        runtime.insert(FAILURE_KEY.into(), json!(reason));
        let new = NewApproval {
            id: Uuid::new_v4(),
            session_id: self.session.id.clone(),
            call_id: call.call_id.clone(),
            kind: ApprovalKind::OutcomeReview,
            policy_ref: None,
            reason: review_question(call, reason),
            route: route.unwrap_or_default(),
            authority_ref: String::new(),
            approvals_required: 1,
            allow_self_approval: false,
            comprehension_required: false,
            on_reject: OnReject::ReturnToAgent,
            on_modify: OnModify::Unchecked,
            timeout: None,
            policy_runtime: runtime,
            actor: "system".into(),
        };
        let approval = self.open_approval(new).await?;
        Box::pin(self.wait_and_apply(call, binding, wire, approval.id)).await
    }

    /// A call that was sent to a worker before a restart: wait for the worker to reconnect
    /// and report; then re-send it (reads, idempotent writes) or ask a human (other writes).
    async fn recover_dispatched(
        &self,
        call: &ToolInvocation,
        binding: &ToolBinding,
        wire: &str,
    ) -> Result<(), CallStop> {
        let deadline = tokio::time::Instant::now() + self.inner.config.recovery_grace;
        loop {
            let current = self.store().get_tool_call(&call.call_id).await?;
            if current.status != CallStatus::Dispatched {
                return Box::pin(self.drive_call(current, Recorded::Earlier)).await;
            }
            if tokio::time::Instant::now() >= deadline {
                break;
            }
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(200)) => {}
                () = self.live.cancel.cancelled() => return Err(CallStop::Stopped),
            }
        }
        let reason = format!(
            "the runtime restarted while the call was with worker {:?}, and the worker did not \
             report within {}s",
            call.worker_id.as_deref().unwrap_or("unknown"),
            self.inner.config.recovery_grace.as_secs()
        );
        if safe_class(binding) {
            let queued = self.store().queue_tool_call(&call.call_id).await?;
            return self.dispatch(&queued, binding, wire, false).await;
        }
        let current = self
            .store()
            .mark_tool_call_indeterminate(&call.call_id, &reason)
            .await?;
        self.unknown_outcome(&current, binding, wire, &reason, None)
            .await
    }

    /// Approved limit escalations per limit kind, from the store.
    pub(crate) async fn limit_grants(
        &self,
    ) -> Result<std::collections::HashMap<String, u64>, StoreError> {
        Ok(crate::fold::limit_grants(
            &self.store().session_approvals(&self.session.id).await?,
        ))
    }

    /// `on_limit: escalate`: when a policy matches the `limit:escalate` trigger, records the
    /// limit hit as a pseudo call and waits for a human. `true` when the limit was raised.
    pub(crate) async fn escalate_limit(&self, hit: &LimitEscalation<'_>) -> Result<bool, CallStop> {
        let args = json!({"limit": hit.kind, "used": hit.used, "max": hit.max});
        let md = &self.agent.metadata;
        let mut req = Request::new(
            ToolCtx {
                r#ref: LIMIT_TOOL,
                version: hit.kind,
                side_effect_class: "",
                name: "",
            },
            &args,
        )
        .with_agent(AgentCtx {
            namespace: &md.namespace,
            name: &md.name,
            version: &md.version,
        })
        .with_session(SessionCtx {
            id: &self.session.id,
            metadata: Some(&self.metadata),
        })
        .at(self.now().timestamp());
        if let Some(claims) = &self.principal {
            req = req.with_principal(claims);
        }
        let Some(policy) = self
            .setup
            .policies
            .evaluate_failure(&req, Trigger::LimitEscalate)
        else {
            return Ok(false);
        };
        let kind_index: u32 = match hit.kind {
            crate::driver::TOKEN_LIMIT => 0,
            crate::driver::LOOP_LIMIT => 1,
            _ => 2,
        };
        let grants = u32::try_from(hit.grants).unwrap_or(u32::MAX / 2).min(9_999);
        let call = self
            .store()
            .record_tool_call(NewToolCall {
                session_id: self.session.id.clone(),
                turn: hit.turn,
                iteration: hit.iteration,
                index: LIMIT_INDEX + kind_index * 10_000 + grants,
                tool: LIMIT_TOOL.to_owned(),
                version: hit.kind.to_owned(),
                wire_name: None,
                args,
                side_effect_class: None,
                delegation: None,
            })
            .await?;
        let latest = self.latest_approval(&call.call_id).await?;
        let approval_id = match (call.status, latest) {
            (CallStatus::AwaitingApproval, Some(a)) if a.status == ApprovalStatus::Pending => a.id,
            (_, Some(a)) if a.status == ApprovalStatus::Approved => {
                self.took_decision(a.id, SessionStatus::Running).await?;
                self.close_limit_call(&call.call_id, a.id).await?;
                return Ok(true);
            }
            (CallStatus::Pending, _) => {
                let mut extra = Map::new();
                extra.insert(TRIGGER_KEY.into(), json!(Trigger::LimitEscalate.as_str()));
                extra.insert(FAILURE_KEY.into(), json!(hit.message));
                let reason = policy
                    .reason()
                    .map_or_else(|| hit.message.to_owned(), str::to_owned);
                let new = self.policy_approval(&call, policy, Some(reason), extra);
                self.open_approval(new).await?.id
            }
            _ => return Ok(false),
        };
        let approval = self
            .wait_for_decision(approval_id, SessionStatus::Running, None)
            .await?;
        if approval.status == ApprovalStatus::Approved {
            self.close_limit_call(&call.call_id, approval.id).await?;
            return Ok(true);
        }
        Ok(false)
    }

    async fn close_limit_call(&self, call_id: &str, approval_id: Uuid) -> Result<(), CallStop> {
        let call = self.store().get_tool_call(call_id).await?;
        if !call.status.is_terminal() {
            self.store()
                .cancel_tool_call(call_id, &format!("limit raised by approval {approval_id}"))
                .await?;
        }
        Ok(())
    }

    /// `output.on_invalid: escalate`: records the invalid answer as a call of the pseudo tool
    /// [`OUTPUT_TOOL`] (arguments `{answer, errors}`), opens an approval on it (one approver,
    /// `on_reject: fail`) and waits for the decision. The driver keeps waiting (it is not
    /// parked). A decision taken while no driver waited (a restart) is found and applied.
    pub(crate) async fn escalate_output(
        &self,
        invalid: &OutputInvalid,
        iteration: u32,
        answer: &str,
    ) -> Result<OutputDecision, CallStop> {
        let call = self
            .store()
            .record_tool_call(NewToolCall {
                session_id: self.session.id.clone(),
                turn: invalid.turn,
                iteration,
                index: OUTPUT_INDEX.saturating_add(invalid.attempt.min(999_999)),
                tool: OUTPUT_TOOL.to_owned(),
                version: "1".to_owned(),
                wire_name: None,
                args: json!({"answer": answer, "errors": invalid.errors}),
                side_effect_class: None,
                delegation: None,
            })
            .await?;
        let latest = self.latest_approval(&call.call_id).await?;
        let approval = match (call.status, latest) {
            (_, Some(a))
                if !matches!(
                    a.status,
                    ApprovalStatus::Pending | ApprovalStatus::Escalated
                ) =>
            {
                self.took_decision(a.id, SessionStatus::Running).await?;
                a
            }
            (_, Some(a)) => {
                self.wait_for_decision(a.id, SessionStatus::Running, None)
                    .await?
            }
            (CallStatus::Pending, None) => {
                let opened = self
                    .open_approval(self.output_approval(&call, invalid))
                    .await?;
                self.wait_for_decision(opened.id, SessionStatus::Running, None)
                    .await?
            }
            (status, None) => {
                return Err(CallStop::Fail(format!(
                    "the output review {} is {status} without an approval",
                    call.call_id
                )));
            }
        };
        let by = approval
            .decided_by
            .clone()
            .unwrap_or_else(|| "an approver".to_owned());
        match approval.status {
            ApprovalStatus::Approved => {
                let call = self.store().get_tool_call(&call.call_id).await?;
                if !call.status.is_terminal() {
                    self.store()
                        .cancel_tool_call(
                            &call.call_id,
                            &format!("output accepted by approval {}", approval.id),
                        )
                        .await?;
                }
                Ok(OutputDecision::Accepted {
                    approval_id: approval.id,
                    accepted_by: by,
                })
            }
            ApprovalStatus::Denied => Ok(OutputDecision::Rejected {
                message: rejected_message(
                    invalid,
                    &by,
                    approval.comment.as_deref().unwrap_or_default(),
                ),
            }),
            ApprovalStatus::Cancelled | ApprovalStatus::Pending | ApprovalStatus::Escalated => {
                Err(CallStop::Stopped)
            }
        }
    }

    /// The approval of an output escalation.
    fn output_approval(&self, call: &ToolInvocation, invalid: &OutputInvalid) -> NewApproval {
        let mut runtime = Map::new();
        runtime.insert("phrony.com/output_errors".into(), json!(invalid.errors));
        NewApproval {
            id: Uuid::new_v4(),
            session_id: self.session.id.clone(),
            call_id: call.call_id.clone(),
            kind: ApprovalKind::Policy,
            policy_ref: None,
            reason: format!(
                "the final answer does not match the agent's output format (output.format \
                 json); approve to complete the session with it, reject to fail it: {}",
                invalid.errors.join("; ")
            ),
            route: String::new(),
            authority_ref: String::new(),
            approvals_required: 1,
            allow_self_approval: false,
            comprehension_required: false,
            on_reject: OnReject::Fail,
            on_modify: OnModify::Unchecked,
            timeout: None,
            policy_runtime: runtime,
            actor: "system".into(),
        }
    }
}
