//! Delegation (§4.11): a call of a `spec.agents` binding runs as a governed child session.
//!
//! The call goes through the parent's argument check and policies like any tool call; once it
//! may run, [`Ctx::delegate`] starts (or, after a restart, finds) the child session, whose id
//! is derived from the call id (`run_` + UUIDv5), so the same call always means the same child.
//! The child runs the target agent version (a bundle member pinned at publish, or a published
//! version) in task mode with the call's arguments as its input, its own policies governing its
//! own tools; an approval inside the child holds the child while the parent's call waits. The
//! parent's call supervises the child: it resumes a child that is not driven (a restart, a
//! storage outage) and records the child's outcome as the call's result exactly once, with the
//! child's token usage charged to the parent. A parent that ends cancels its children in the
//! same ledger transaction (`phrony-ledger`'s cascade), and their drivers stop.

use std::sync::Arc;

use phrony_ledger::{
    AgentRef, CallStatus, Dispatch, OnLimit, Session, SessionMode, SessionStatus, ToolInvocation,
    ToolOutcome, ToolResult, Usage,
};
use phrony_manifest::{AgentTarget, CompiledAgent, ToolBinding};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::driver::{CallStop, Ctx, LimitEscalation, limit_message};
use crate::engine::{Engine, StartSession};
use crate::error::{ErrorKind, StoreError};
use crate::fold::codes;
use crate::setup::PreparedAgent;
use crate::store::PlainSecret;

/// The namespace of child session ids (the reference runtime's, so ids match across runtimes).
const CHILD_NAMESPACE: Uuid = Uuid::from_u128(0xb3f2_a1c0_1d4e_4f6a_9c2b_7e8d_9a0b_1c2d);

/// `limits.max_subagent_depth` when the delegating agent sets none.
pub const DEFAULT_MAX_SUBAGENT_DEPTH: u64 = 5;

/// The limit kind of the delegation depth (`on_limit: escalate` asks to raise it).
pub(crate) const DEPTH_LIMIT: &str = "max_subagent_depth";

/// The child session a delegation call runs: `run_` + UUIDv5(call id).
#[must_use]
pub fn child_session_id(call_id: &str) -> String {
    format!(
        "run_{}",
        Uuid::new_v5(&CHILD_NAMESPACE, call_id.as_bytes()).hyphenated()
    )
}

/// How a delegation target is named in the audit trail and to attached clients:
/// `namespace/name@version` (the version when pinned by label), else `namespace/name`, else
/// the bundle child's name.
pub(crate) fn target_label(t: &AgentTarget) -> String {
    if t.namespace.is_empty() || t.name.is_empty() {
        return t.child_name.clone();
    }
    if t.version.is_empty() {
        format!("{}/{}", t.namespace, t.name)
    } else {
        format!("{}/{}@{}", t.namespace, t.name, t.version)
    }
}

/// A delegation that cannot run: recorded as the call's tool error (the model sees it).
struct Refusal {
    code: &'static str,
    message: String,
}

impl Refusal {
    fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

/// The version a delegation runs.
struct Target {
    version_id: Uuid,
    prepared: PreparedAgent,
}

impl Ctx {
    fn engine(&self) -> Engine {
        Engine {
            inner: Arc::clone(&self.inner),
        }
    }

    /// Runs a delegation call that may run (it is `queued` or, after a restart, `dispatched`):
    /// starts or finds its child session, waits for the child to end and records its outcome.
    pub(crate) async fn delegate(
        &self,
        call: &ToolInvocation,
        binding: &ToolBinding,
        target: &AgentTarget,
    ) -> Result<(), CallStop> {
        let child_id = child_session_id(&call.call_id);
        let child = match self.store().get_session(&child_id).await {
            Ok(child) => child,
            Err(e) if e.kind == ErrorKind::NotFound => {
                match self.start_child(call, target, &child_id).await? {
                    Ok(child) => child,
                    Err(refusal) => {
                        self.store()
                            .fail_tool_call(&call.call_id, refusal.code, &refusal.message)
                            .await?;
                        return Ok(());
                    }
                }
            }
            Err(e) => return Err(e.into()),
        };
        if child.parent_session_id.as_deref() != Some(self.session.id.as_str()) {
            // Only a forged or corrupted store gets here: never adopt another session.
            self.store()
                .fail_tool_call(
                    &call.call_id,
                    codes::SUBAGENT_LOAD_FAILED,
                    &format!(
                        "session {child_id} exists and is not a child of session {}",
                        self.session.id
                    ),
                )
                .await?;
            return Ok(());
        }
        if self.store().get_tool_call(&call.call_id).await?.status == CallStatus::Queued {
            self.store()
                .dispatch_tool_call(
                    &call.call_id,
                    Dispatch {
                        worker_id: child_id.clone(),
                        worker_identity: None,
                        image_digest: None,
                        descriptor_hash: None,
                        deadline_at: None,
                    },
                )
                .await?;
            self.notify();
        }
        self.live.add_child(&child_id);
        let ended = self.supervise(&child_id).await?;
        self.record_child_outcome(call, binding, target, &ended)
            .await
    }

    /// Checks the depth, resolves the target and its secrets, and starts the child session.
    /// `Ok(Err(refusal))` when the delegation cannot run (a tool error for the model).
    async fn start_child(
        &self,
        call: &ToolInvocation,
        target: &AgentTarget,
        child_id: &str,
    ) -> Result<Result<Session, Refusal>, CallStop> {
        if let Err(refusal) = self.check_depth(call).await? {
            return Ok(Err(refusal));
        }
        let resolved = match self.resolve_target(target).await? {
            Ok(t) => t,
            Err(refusal) => return Ok(Err(refusal)),
        };
        let secrets = match self
            .child_secrets(resolved.prepared.agent(), target)
            .await?
        {
            Ok(s) => s,
            Err(refusal) => return Ok(Err(refusal)),
        };
        let request = StartSession {
            session_id: Some(child_id.to_owned()),
            agent_version_id: resolved.version_id,
            agent: resolved.prepared,
            input: call.args.clone(),
            metadata: self.session.metadata.clone(),
            mode: SessionMode::Task,
            principal: self.principal.clone(),
            secrets,
            actor: crate::driver::starter(&self.session),
            bundle: None,
        };
        match self
            .engine()
            .open(request, Some(self.session.id.clone()))
            .await
        {
            Ok(_) => Ok(Ok(self.store().get_session(child_id).await?)),
            // Started meanwhile (a concurrent recovery of this call): adopt it.
            Err(e) if e.kind == ErrorKind::AlreadyExists => {
                Ok(Ok(self.store().get_session(child_id).await?))
            }
            Err(e) if e.kind == ErrorKind::Unavailable => {
                Err(CallStop::Store(StoreError::new(e.kind, e.message)))
            }
            Err(e) => Ok(Err(Refusal::new(
                codes::SUBAGENT_LOAD_FAILED,
                format!(
                    "the child session of {} could not be started: {}",
                    target_label(target),
                    e.message
                ),
            ))),
        }
    }

    /// The child's depth against the delegating agent's `max_subagent_depth` (default
    /// [`DEFAULT_MAX_SUBAGENT_DEPTH`]); `on_limit: escalate` asks a human to raise it.
    async fn check_depth(&self, call: &ToolInvocation) -> Result<Result<(), Refusal>, CallStop> {
        let depth = u64::from(self.session.depth).saturating_add(1);
        let max = self
            .limits
            .max_subagent_depth
            .unwrap_or(DEFAULT_MAX_SUBAGENT_DEPTH);
        let grants = self
            .limit_grants()
            .await?
            .get(DEPTH_LIMIT)
            .copied()
            .unwrap_or(0);
        if depth <= max.saturating_mul(grants.saturating_add(1)) {
            return Ok(Ok(()));
        }
        let refusal = || {
            Refusal::new(
                codes::SUBAGENT_DEPTH_EXCEEDED,
                format!("delegation depth {depth} exceeds max_subagent_depth {max}"),
            )
        };
        if self.limits.on_limit != OnLimit::Escalate {
            return Ok(Err(refusal()));
        }
        let message = limit_message(DEPTH_LIMIT, self.limits.on_limit);
        let hit = LimitEscalation {
            turn: call.turn,
            iteration: call.iteration,
            kind: DEPTH_LIMIT,
            used: depth,
            max,
            grants,
            message: &message,
        };
        if self.escalate_limit(&hit).await? {
            self.set_status(SessionStatus::AwaitingTool, None)
                .await
                .map_err(|e| match e {
                    crate::driver::Stop::Store(e) => CallStop::Store(e),
                    _ => CallStop::Stopped,
                })?;
            Ok(Ok(()))
        } else {
            Ok(Err(refusal()))
        }
    }

    /// The version the delegation runs: the frozen `agent_version_id` (a bundle member), else
    /// a late-bound or version-pinned target resolved now.
    async fn resolve_target(&self, t: &AgentTarget) -> Result<Result<Target, Refusal>, CallStop> {
        let label = target_label(t);
        let version_id = if t.agent_version_id.is_empty() {
            if t.namespace.is_empty()
                || t.name.is_empty()
                || (!t.late_bound && t.version.is_empty())
            {
                let code = if t.late_bound {
                    codes::SUBAGENT_UNRESOLVED
                } else {
                    codes::SUBAGENT_UNPINNED
                };
                return Ok(Err(Refusal::new(
                    code,
                    format!(
                        "delegation target {label} is not pinned to a version: publish the \
                         delegating agent in a bundle (which freezes its members), or name an \
                         agent ns.name@version"
                    ),
                )));
            }
            let agent = AgentRef::new(&t.namespace, &t.name);
            match self.resolve_late(&agent, &t.version).await {
                Ok(id) => id,
                Err(e) if e.kind == ErrorKind::Unavailable => return Err(CallStop::Store(e)),
                Err(e) => {
                    return Ok(Err(Refusal::new(
                        codes::SUBAGENT_UNRESOLVED,
                        format!(
                            "delegation target {label} could not be resolved: {}",
                            e.message
                        ),
                    )));
                }
            }
        } else {
            match Uuid::parse_str(&t.agent_version_id) {
                Ok(id) => id,
                Err(_) => {
                    return Ok(Err(Refusal::new(
                        codes::SUBAGENT_LOAD_FAILED,
                        format!(
                            "delegation target {label} is pinned to {:?}, which is not a version id",
                            t.agent_version_id
                        ),
                    )));
                }
            }
        };
        // A pinned *published* version (an external bundle member) is frozen, but a retired
        // version or an archived agent starts no new session, as for a run of the agent itself.
        match self.pinned_version_retired(version_id).await {
            Ok(None) => {}
            Ok(Some(why)) => {
                return Ok(Err(Refusal::new(
                    codes::SUBAGENT_UNRESOLVED,
                    format!("delegation target {label} cannot run: {why}"),
                )));
            }
            Err(e) if e.kind == ErrorKind::Unavailable => return Err(e.into()),
            // Not found and the like: the load below names it.
            Err(_) => {}
        }
        if let Some(prepared) = self.inner.prepared(version_id) {
            return Ok(Ok(Target {
                version_id,
                prepared,
            }));
        }
        let stored = match self.store().agent_version(version_id).await {
            Ok(s) => s,
            Err(e) if e.kind == ErrorKind::Unavailable => return Err(e.into()),
            Err(e) => {
                return Ok(Err(Refusal::new(
                    codes::SUBAGENT_LOAD_FAILED,
                    format!("delegation target {label} could not be loaded: {e}"),
                )));
            }
        };
        let prepared =
            self.engine()
                .prepare_version(version_id, &stored.content_hash, &stored.snapshot_json);
        match prepared {
            Ok(prepared) => Ok(Ok(Target {
                version_id,
                prepared,
            })),
            Err(e) => Ok(Err(Refusal::new(
                codes::SUBAGENT_LOAD_FAILED,
                format!(
                    "delegation target {label} could not be loaded: {}",
                    e.message
                ),
            ))),
        }
    }

    /// Why the pinned version `id` may not start a session: a published version that was
    /// retired, or whose agent was archived (`None` for a runnable one and for bundle-private
    /// versions, which have no lifecycle of their own).
    async fn pinned_version_retired(&self, id: Uuid) -> Result<Option<String>, StoreError> {
        let ledger = self.store().ledger();
        let version = ledger.get_agent_version_by_id(id).await?;
        if version.origin != phrony_ledger::VersionOrigin::Published {
            return Ok(None);
        }
        if version.retired_at.is_some() {
            return Ok(Some(format!(
                "agent {} version {:?} was retired",
                version.agent, version.version
            )));
        }
        if ledger
            .get_agent(&version.agent)
            .await?
            .archived_at
            .is_some()
        {
            return Ok(Some(format!("agent {} was archived", version.agent)));
        }
        Ok(None)
    }

    /// A target resolved at call time: without a version, the agent's active deployment with
    /// the checks of a run (archived, retired, deprecated refused); with a version label, that
    /// published version even when not active, unless it was retired or its agent archived.
    async fn resolve_late(&self, agent: &AgentRef, version: &str) -> Result<Uuid, StoreError> {
        let ledger = self.store().ledger();
        if version.is_empty() {
            return Ok(ledger.runnable_version(agent, None).await?.id);
        }
        if ledger.get_agent(agent).await?.archived_at.is_some() {
            return Err(StoreError::precondition(format!(
                "agent {agent} is archived and cannot be run"
            )));
        }
        let found = ledger.get_agent_version(agent, version).await?;
        if found.retired_at.is_some() {
            return Err(StoreError::precondition(format!(
                "agent {agent} version {version:?} is retired and cannot be run"
            )));
        }
        Ok(found.id)
    }

    /// The secrets the child's manifest declares, taken from the delegation tree's root
    /// session (a bundle session holds the union of its members' secrets); no other secret
    /// reaches the child.
    async fn child_secrets(
        &self,
        child: &CompiledAgent,
        t: &AgentTarget,
    ) -> Result<Result<Vec<PlainSecret>, Refusal>, CallStop> {
        if child.secrets.is_empty() {
            return Ok(Ok(Vec::new()));
        }
        let mut pool = self
            .store()
            .load_secrets(&self.session.root_session_id)
            .await?;
        let mut out = Vec::with_capacity(child.secrets.len());
        for name in child.secrets.keys() {
            match pool.iter().position(|s| &s.name == name) {
                Some(i) => out.push(pool.swap_remove(i)),
                None => {
                    return Ok(Err(Refusal::new(
                        codes::SUBAGENT_MISSING_SECRET,
                        format!(
                            "secret {name:?} declared by {} is not among the secrets session {} \
                             was started with",
                            target_label(t),
                            self.session.root_session_id
                        ),
                    )));
                }
            }
        }
        Ok(Ok(out))
    }

    /// Waits for the child to end, driving it again whenever it is not driven here (after a
    /// restart, or once the database is back after an outage). Stops when the parent stops.
    async fn supervise(&self, child_id: &str) -> Result<Session, CallStop> {
        let poll = self.inner.config.poll_interval;
        loop {
            let mut registered = self.inner.registered.subscribe();
            let changed = self.inner.live(child_id).map(|l| l.changed.subscribe());
            let child = self.store().get_session(child_id).await?;
            if child.status.is_terminal() {
                return Ok(child);
            }
            if changed.is_none() {
                match self.engine().resume(child, None).await {
                    Ok(_) => continue,
                    // Resumed meanwhile by another path: it is driven.
                    Err(e)
                        if e.kind == ErrorKind::FailedPrecondition
                            && self.inner.live(child_id).is_some() =>
                    {
                        continue;
                    }
                    Err(e) if e.kind == ErrorKind::Unavailable => {
                        tracing::debug!(%child_id, error = %e, "child not resumed yet: database unavailable");
                    }
                    Err(e) => {
                        let message = format!("session could not be resumed: {}", e.message);
                        tracing::error!(%child_id, error = %e, "resuming a child session failed");
                        self.store()
                            .set_status(child_id, phrony_ledger::StatusChange::failed(message))
                            .await?;
                        continue;
                    }
                }
            }
            tokio::select! {
                () = self.live.cancel.cancelled() => return Err(CallStop::Stopped),
                () = async {
                    match changed {
                        Some(mut rx) => { let _ = rx.changed().await; }
                        None => { let _ = registered.changed().await; }
                    }
                } => {}
                () = tokio::time::sleep(poll) => {}
            }
        }
    }

    /// Records the ended child's outcome as the call's result (once: a call already settled,
    /// e.g. by a concurrent recovery, is left alone).
    async fn record_child_outcome(
        &self,
        call: &ToolInvocation,
        _binding: &ToolBinding,
        target: &AgentTarget,
        child: &Session,
    ) -> Result<(), CallStop> {
        if self
            .store()
            .get_tool_call(&call.call_id)
            .await?
            .status
            .is_terminal()
        {
            return Ok(());
        }
        let label = target_label(target);
        match child.status {
            SessionStatus::Completed => {
                let output = child.output.clone().unwrap_or(Value::Null);
                let result = if target.result == "full" {
                    output.clone()
                } else {
                    json!({ "output": summary(&output) })
                };
                let usage = child_usage(&output);
                let recorded = ToolResult {
                    worker_id: Some(child.id.clone()),
                    outcome: ToolOutcome::Success(result),
                    usage,
                };
                self.store()
                    .record_tool_result(&call.call_id, recorded)
                    .await?;
            }
            SessionStatus::Failed => {
                self.store()
                    .fail_tool_call(
                        &call.call_id,
                        codes::SUBAGENT_FAILED,
                        &format!(
                            "child session {} ({label}) failed: {}",
                            child.id,
                            child.error.as_deref().unwrap_or("no reason recorded")
                        ),
                    )
                    .await?;
            }
            _ => {
                if self.live.cancel.is_cancelled() {
                    return Err(CallStop::Stopped);
                }
                self.store()
                    .fail_tool_call(
                        &call.call_id,
                        codes::SUBAGENT_CANCELLED,
                        &format!("child session {} ({label}) was cancelled", child.id),
                    )
                    .await?;
            }
        }
        self.notify();
        Ok(())
    }
}

/// What a `result: summary` delegation returns: the child's last assistant text, or its
/// accepted JSON output when the child's manifest enforces one.
fn summary(output: &Value) -> Value {
    if let Some(json) = output.get("output").filter(|v| !v.is_null()) {
        return json.clone();
    }
    output
        .get("message")
        .cloned()
        .unwrap_or_else(|| Value::String(String::new()))
}

/// The child's token usage (its `session_usage`), charged to the parent.
fn child_usage(output: &Value) -> Option<Usage> {
    let u = output.get("session_usage")?;
    Some(Usage {
        input_tokens: u.get("input_tokens").and_then(Value::as_u64).unwrap_or(0),
        output_tokens: u.get("output_tokens").and_then(Value::as_u64).unwrap_or(0),
        estimated: u.get("estimated").and_then(Value::as_bool).unwrap_or(false),
    })
}
