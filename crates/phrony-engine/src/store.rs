//! [`LedgerStore`]: the durable operations the engine needs, on the ledger (SQLite or
//! PostgreSQL), nothing more.
//!
//! The domain types are the ledger's (`phrony_ledger::{Session, ToolInvocation, Approval, …}`),
//! and so are the rules: each operation is one atomic ledger step appending its events to the
//! session's hash-chained stream, with the ledger's state machines of sessions, tool calls and
//! approvals, its voting rules and its terminal cascade. The engine adds only what the ledger
//! does not know: sealing secrets with the runtime's key, refusing engine events on ended
//! sessions, and gathering a session's approvals in the order they were opened. The engine's
//! tests run on this same store (SQLite in memory, with the ledger's clock following the test's
//! manual clock), so there is one implementation of the rules.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use phrony_ledger::{
    Approval, ApprovalFilter, Dispatch, Event, LeaseClaim, Ledger, NewApproval, NewEvent,
    NewSession, NewToolCall, Opening, PageRequest, PolicyShadowed, RecordedResult, RecordedStep,
    SecretCipher, Session, SessionEvent, StatusChange, StatusChanged, TimeoutOutcome,
    ToolInvocation, ToolResult, Vote, VoteOutcome,
};
use secrecy::{ExposeSecret as _, SecretSlice};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::error::{StoreError, StoreResult};
/// A resolved secret in plaintext, on its way into (or out of) a store. The store seals it at
/// rest; it never appears in events.
pub struct PlainSecret {
    /// The secret's name (`secrets.<name>` of the manifest).
    pub name: String,
    /// The value.
    pub value: SecretSlice<u8>,
}

impl fmt::Debug for PlainSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlainSecret")
            .field("name", &self.name)
            .field("value", &"***")
            .finish()
    }
}

impl PlainSecret {
    /// A secret named `name` with `value`.
    pub fn new(name: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        Self {
            name: name.into(),
            value: SecretSlice::from(value.into()),
        }
    }
}

/// A published agent version as the engine loads it for recovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredAgentVersion {
    /// The compiled snapshot JSON, exactly as published.
    pub snapshot_json: String,
    /// Its content hash.
    pub content_hash: String,
}

/// The engine's durable state: the ledger. Secrets are sealed with AES-256-GCM by `cipher`
/// (`RUNTIME_SECRETS_ENCRYPTION_KEY`); without one, sessions with secrets are refused.
#[derive(Debug, Clone)]
pub struct LedgerStore {
    ledger: Ledger,
    cipher: Option<SecretCipher>,
    /// The approval change counter: bumped after every committed step that can open, vote on
    /// or decide an approval (approval watchers re-read the pending set when it moves).
    approval_changes: Arc<watch::Sender<u64>>,
    /// Pages of a session's events read through this store ([`LedgerStore::event_reads`]).
    event_reads: Arc<std::sync::atomic::AtomicU64>,
}

impl LedgerStore {
    /// A store on `ledger`, sealing secrets with `cipher`.
    #[must_use]
    pub fn new(ledger: Ledger, cipher: Option<SecretCipher>) -> Self {
        Self {
            ledger,
            cipher,
            approval_changes: Arc::new(watch::Sender::new(0)),
            event_reads: Arc::default(),
        }
    }

    /// How many pages of session events were read from the ledger through this store (drivers
    /// catching up, subscriptions, attaches): a diagnostic of what the engine takes from the
    /// events it committed itself instead.
    #[must_use]
    pub fn event_reads(&self) -> u64 {
        self.event_reads.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Bumps the approval change counter. Called after each committed step that can open,
    /// vote on or decide an approval, whether it succeeded or not (a failed step may have
    /// committed nothing; a spurious bump costs watchers one re-read).
    pub(crate) fn approvals_changed(&self) {
        self.approval_changes
            .send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A receiver of the approval change counter ([`Self::approvals_changed`]).
    pub(crate) fn watch_approval_changes(&self) -> watch::Receiver<u64> {
        self.approval_changes.subscribe()
    }

    /// The underlying ledger.
    #[must_use]
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// A real, durable write that proves the database takes writes now
    /// ([`Ledger::probe_write`]).
    pub async fn probe_write(&self) -> StoreResult<()> {
        Ok(self.ledger.probe_write().await?)
    }

    /// Waits until a write probe succeeds: probes, then sleeps with a capped backoff
    /// ([`FIRST_BACKOFF`] doubling up to [`MAX_BACKOFF`]), woken early when the ledger reports
    /// a successful write by anyone. `false` when `cancel` fired first.
    pub(crate) async fn until_writable(&self, cancel: &CancellationToken) -> bool {
        let mut writable = self.ledger.writable();
        let mut backoff = FIRST_BACKOFF;
        loop {
            if cancel.is_cancelled() {
                return false;
            }
            match self.probe_write().await {
                Ok(()) => return true,
                Err(e) => tracing::debug!(error = %e, "the database does not take writes yet"),
            }
            // The failed probe marked the ledger not writable; wait for a change or the backoff.
            writable.borrow_and_update();
            tokio::select! {
                () = cancel.cancelled() => return false,
                () = tokio::time::sleep(backoff) => {}
                _ = writable.wait_for(|w| *w) => {}
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
}

/// The first wait between write probes while the store is unavailable.
pub(crate) const FIRST_BACKOFF: Duration = Duration::from_millis(250);
/// The longest wait between write probes.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(5);

fn cipher_error(e: phrony_ledger::CipherError) -> StoreError {
    StoreError::internal(e.to_string())
}

impl LedgerStore {
    /// Creates a session (status `running`, event `session.started`) and stores its secrets
    /// sealed, in one step. `new.secrets` is ignored: plaintext secrets come in `secrets`.
    pub async fn create_session(
        &self,
        new: NewSession,
        secrets: Vec<PlainSecret>,
    ) -> StoreResult<Session> {
        self.create_session_within(new, secrets, None).await
    }

    /// [`LedgerStore::create_session`], refused (`ResourceExhausted`, nothing created) when the
    /// agent already has `max_live_per_agent` live sessions; `None` sets no bound. The count
    /// and the insert are one ledger transaction (`Ledger::create_session_within`).
    pub async fn create_session_within(
        &self,
        new: NewSession,
        secrets: Vec<PlainSecret>,
        max_live_per_agent: Option<u64>,
    ) -> StoreResult<Session> {
        self.open_session(new, secrets, max_live_per_agent, Vec::new(), None)
            .await
            .map(|(session, _)| session)
    }

    /// [`LedgerStore::create_session_within`] with the session's `opening` events (its
    /// principal, first user message, evidence snapshot) appended after `session.started` in
    /// the same ledger transaction ([`Ledger::open_session`]). With `lease_ttl` (session
    /// leases on), this replica's lease of the new session is acquired in that transaction too
    /// ([`Ledger::open_session_leased`]) and its claim returned.
    pub async fn open_session(
        &self,
        mut new: NewSession,
        secrets: Vec<PlainSecret>,
        max_live_per_agent: Option<u64>,
        opening: Vec<Opening>,
        lease_ttl: Option<Duration>,
    ) -> StoreResult<(Session, Option<LeaseClaim>)> {
        new.secrets.clear();
        if !secrets.is_empty() {
            let Some(cipher) = &self.cipher else {
                return Err(StoreError::precondition(
                    "RUNTIME_SECRETS_ENCRYPTION_KEY must be set on the runtime to run agents \
                     with secrets",
                ));
            };
            for s in &secrets {
                new.secrets.push(
                    cipher
                        .seal(&new.id, &s.name, s.value.expose_secret())
                        .map_err(cipher_error)?,
                );
            }
        }
        Ok(match lease_ttl {
            Some(ttl) => {
                let (session, claim) = self
                    .ledger
                    .open_session_leased(new, max_live_per_agent, opening, ttl)
                    .await?;
                (session, Some(claim))
            }
            None => (
                self.ledger
                    .open_session(new, max_live_per_agent, opening)
                    .await?,
                None,
            ),
        })
    }

    /// One session.
    pub async fn get_session(&self, session_id: &str) -> StoreResult<Session> {
        Ok(self.ledger.get_session(session_id).await?)
    }

    /// Changes a session's status (a terminal change cascades; see the module docs).
    pub async fn set_status(
        &self,
        session_id: &str,
        change: StatusChange,
    ) -> StoreResult<StatusChanged> {
        let changed = self.ledger.set_session_status(session_id, change).await;
        // A terminal change closes the session's (and its children's) pending approvals.
        self.approvals_changed();
        Ok(changed?)
    }

    /// Appends a user or assistant message or the evidence snapshot to a live session.
    pub async fn record_session_event(
        &self,
        session_id: &str,
        event: SessionEvent,
    ) -> StoreResult<Event> {
        Ok(self.ledger.record_session_event(session_id, event).await?)
    }

    /// Queues a user message for the replica driving `session_id` ([`Ledger::queue_user_message`]).
    pub async fn queue_user_message(
        &self,
        session_id: &str,
        actor: &phrony_ledger::Attribution,
        content: &str,
        max_waiting: usize,
    ) -> StoreResult<i64> {
        Ok(self
            .ledger
            .queue_user_message(session_id, actor, content, max_waiting)
            .await?)
    }

    /// The user messages other replicas queued for `session_id`, oldest first.
    pub async fn queued_user_messages(
        &self,
        session_id: &str,
    ) -> StoreResult<Vec<phrony_ledger::QueuedUserMessage>> {
        Ok(self.ledger.queued_user_messages(session_id).await?)
    }

    /// Records the queued message `id` as `message.user` starting `turn` and takes it off the
    /// queue, in one transaction; `None` when it was taken already.
    pub async fn accept_user_message(
        &self,
        session_id: &str,
        id: i64,
        turn: u32,
    ) -> StoreResult<Option<Event>> {
        Ok(self
            .ledger
            .accept_user_message(session_id, id, turn)
            .await?)
    }

    /// Appends an engine event of a type the store does not own (e.g. `model.completion`).
    pub async fn append_engine_event(
        &self,
        session_id: &str,
        event: NewEvent,
    ) -> StoreResult<Event> {
        // The raw append does not look at the session: check it exists and is live first.
        let session = self.ledger.get_session(session_id).await?;
        if session.status.is_terminal() {
            return Err(StoreError::precondition(format!(
                "session {session_id} is {} and accepts no further events",
                session.status
            )));
        }
        Ok(self.ledger.append_session_event(session_id, event).await?)
    }

    /// Appends a model completion and the assistant message it produced in one ledger
    /// transaction (see [`phrony_ledger::Ledger::record_completion`]).
    pub async fn record_completion(
        &self,
        session_id: &str,
        completion: NewEvent,
        assistant: Option<SessionEvent>,
    ) -> StoreResult<Vec<Event>> {
        Ok(self
            .ledger
            .record_completion(session_id, completion, assistant)
            .await?)
    }

    /// A completion, its assistant message, a status change and the tool calls it requested,
    /// in one ledger transaction (see [`phrony_ledger::Ledger::record_step`]).
    pub async fn record_step(
        &self,
        session_id: &str,
        completion: NewEvent,
        assistant: Option<SessionEvent>,
        next: Option<StatusChange>,
        calls: Vec<NewToolCall>,
    ) -> StoreResult<RecordedStep> {
        let terminal = next.as_ref().is_some_and(|c| c.to.is_terminal());
        let step = self
            .ledger
            .record_step(session_id, completion, assistant, next, calls)
            .await;
        if terminal {
            // As `set_status`: a terminal change closes pending approvals.
            self.approvals_changed();
        }
        Ok(step?)
    }

    /// Events with `seq > after_seq`, ascending, at most `limit`.
    pub async fn events_after(
        &self,
        session_id: &str,
        after_seq: u64,
        limit: u32,
    ) -> StoreResult<Vec<Event>> {
        self.event_reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(self
            .ledger
            .events_after(session_id, after_seq, limit)
            .await?)
    }

    /// The session's secrets in plaintext (empty once it has ended).
    pub async fn load_secrets(&self, session_id: &str) -> StoreResult<Vec<PlainSecret>> {
        let sealed = self.ledger.load_session_secrets(session_id).await?;
        if sealed.is_empty() {
            return Ok(Vec::new());
        }
        let Some(cipher) = &self.cipher else {
            return Err(StoreError::precondition(format!(
                "session {session_id} has stored secrets but RUNTIME_SECRETS_ENCRYPTION_KEY is \
                 not set on the runtime"
            )));
        };
        sealed
            .iter()
            .map(|s| {
                let value = cipher.open(session_id, s).map_err(cipher_error)?;
                Ok(PlainSecret {
                    name: s.name.clone(),
                    value,
                })
            })
            .collect()
    }

    /// The agent version a session runs.
    pub async fn agent_version(&self, agent_version_id: Uuid) -> StoreResult<StoredAgentVersion> {
        let v = self
            .ledger
            .get_agent_version_by_id(agent_version_id)
            .await?;
        Ok(StoredAgentVersion {
            snapshot_json: v.snapshot_json,
            content_hash: v.content_hash,
        })
    }

    /// Every non-terminal session, oldest first (what recovery reconciles).
    pub async fn sessions_needing_recovery(&self) -> StoreResult<Vec<Session>> {
        Ok(self.ledger.sessions_needing_recovery().await?)
    }

    /// One page of the sessions not seen to end, oldest first, after `after` (its
    /// `created_at` and id) ([`Ledger::sessions_needing_recovery_after`]).
    pub async fn sessions_needing_recovery_after(
        &self,
        after: Option<(DateTime<Utc>, String)>,
        limit: u32,
    ) -> StoreResult<Vec<Session>> {
        Ok(self
            .ledger
            .sessions_needing_recovery_after(after, limit)
            .await?)
    }

    /// Sessions waiting for approval with an approval decided since `since` (see
    /// `Ledger::sessions_with_waits_decided_since`).
    pub async fn sessions_with_waits_decided_since(
        &self,
        since: DateTime<Utc>,
        limit: u32,
    ) -> StoreResult<Vec<String>> {
        Ok(self
            .ledger
            .sessions_with_waits_decided_since(since, limit)
            .await?)
    }

    /// Records a model tool call (`pending`); idempotent for the same call.
    pub async fn record_tool_call(&self, new: NewToolCall) -> StoreResult<ToolInvocation> {
        Ok(self.ledger.record_tool_call(new).await?)
    }

    /// Records the calls of one completion in one ledger transaction (all or none).
    pub async fn record_tool_calls(
        &self,
        calls: Vec<NewToolCall>,
    ) -> StoreResult<Vec<ToolInvocation>> {
        Ok(self.ledger.record_tool_calls(calls).await?)
    }

    /// Root task sessions in `awaiting_approval` resting on pending approvals alone
    /// ([`Ledger::sessions_resting_on_approvals`]).
    pub async fn sessions_resting_on_approvals(&self) -> StoreResult<HashSet<String>> {
        Ok(self.ledger.sessions_resting_on_approvals().await?)
    }

    /// `pending | dispatched | indeterminate → queued`.
    pub async fn queue_tool_call(&self, call_id: &str) -> StoreResult<ToolInvocation> {
        Ok(self.ledger.queue_tool_call(call_id).await?)
    }

    /// `queued → dispatched`, before the invoke is sent.
    pub async fn dispatch_tool_call(
        &self,
        call_id: &str,
        dispatch: Dispatch,
    ) -> StoreResult<ToolInvocation> {
        Ok(self.ledger.dispatch_tool_call(call_id, dispatch).await?)
    }

    /// `queued` (unless it is) then `dispatched`, in one transaction, before the invoke is sent.
    pub async fn queue_and_dispatch_tool_call(
        &self,
        call_id: &str,
        dispatch: Dispatch,
    ) -> StoreResult<ToolInvocation> {
        Ok(self
            .ledger
            .queue_and_dispatch_tool_call(call_id, dispatch)
            .await?)
    }

    /// Records a worker's result (late and duplicate results are recorded without effect).
    pub async fn record_tool_result(
        &self,
        call_id: &str,
        result: ToolResult,
    ) -> StoreResult<RecordedResult> {
        let recorded = self.ledger.record_tool_result(call_id, result).await?;
        if recorded.applied {
            count_outcome(&recorded.invocation);
        }
        Ok(recorded)
    }

    /// [`Self::record_tool_result`], with the session's move `resume` when the result closes
    /// its last open call ([`Ledger::record_tool_result_and_resume`]).
    pub async fn record_tool_result_and_resume(
        &self,
        call_id: &str,
        result: ToolResult,
        resume: StatusChange,
    ) -> StoreResult<RecordedResult> {
        let recorded = self
            .ledger
            .record_tool_result_and_resume(call_id, result, resume)
            .await?;
        if recorded.applied {
            count_outcome(&recorded.invocation);
        }
        Ok(recorded)
    }

    /// Fails an open call on the runtime's side.
    pub async fn fail_tool_call(
        &self,
        call_id: &str,
        code: &str,
        message: &str,
    ) -> StoreResult<ToolInvocation> {
        let call = self.ledger.fail_tool_call(call_id, code, message).await?;
        count_outcome(&call);
        Ok(call)
    }

    /// Fails an open call on the runtime's side unless a result was recorded first: a worker
    /// that reconnects may re-send the result of a call the engine is about to fail as
    /// indeterminate (a late result, recorded by the router hooks). When the ledger refuses the
    /// transition because the call is already terminal, the call as recorded is returned and
    /// nothing is written; the caller goes on with the recorded outcome (the call is never
    /// re-sent, so it cannot run twice).
    pub async fn fail_tool_call_unless_settled(
        &self,
        call_id: &str,
        code: &str,
        message: &str,
    ) -> StoreResult<ToolInvocation> {
        match self.fail_tool_call(call_id, code, message).await {
            Ok(call) => Ok(call),
            Err(refused) => self.settled_or(call_id, refused).await,
        }
    }

    /// `dispatched → indeterminate` unless a late result settled the call first (see
    /// [`Self::fail_tool_call_unless_settled`]): then the call as recorded.
    pub async fn mark_indeterminate_unless_settled(
        &self,
        call_id: &str,
        reason: &str,
    ) -> StoreResult<ToolInvocation> {
        match self.mark_tool_call_indeterminate(call_id, reason).await {
            Ok(call) => Ok(call),
            Err(refused) => self.settled_or(call_id, refused).await,
        }
    }

    /// The call when `refused` is a refused transition of a call that is already terminal;
    /// otherwise `refused`.
    async fn settled_or(&self, call_id: &str, refused: StoreError) -> StoreResult<ToolInvocation> {
        if refused.kind != crate::ErrorKind::FailedPrecondition {
            return Err(refused);
        }
        let current = self.get_tool_call(call_id).await?;
        if current.status.is_terminal() {
            Ok(current)
        } else {
            Err(refused)
        }
    }

    /// Records what a shadow policy would have changed about a call (once per call and
    /// policy; a repeat writes nothing).
    ///
    /// # Errors
    /// Ledger errors.
    pub async fn record_shadow_decision(&self, shadowed: PolicyShadowed) -> StoreResult<()> {
        self.ledger.record_shadow_decision(shadowed).await?;
        Ok(())
    }

    /// The history aggregates a decision of `call_id` needs (see [`Ledger::history_facts`]).
    ///
    /// # Errors
    /// Ledger errors.
    pub async fn history_facts(
        &self,
        call_id: &str,
        reads: &[phrony_ledger::HistoryRead],
    ) -> StoreResult<Vec<phrony_ledger::HistoryCounts>> {
        Ok(self.ledger.history_facts(call_id, reads).await?)
    }

    /// Reserves a decided call's history contributions; `false` when a group changed since
    /// it was read (see [`Ledger::reserve_history`]).
    ///
    /// # Errors
    /// Ledger errors.
    pub async fn reserve_history(
        &self,
        session_id: &str,
        call_id: &str,
        reservations: &[phrony_ledger::HistoryReservation],
    ) -> StoreResult<bool> {
        Ok(self
            .ledger
            .reserve_history(session_id, call_id, reservations)
            .await?)
    }

    /// Moves a call's history reservations to arguments an approver edited; `false` when a
    /// group changed since it was read (see [`Ledger::replace_history`]).
    ///
    /// # Errors
    /// Ledger errors.
    pub async fn replace_history(
        &self,
        session_id: &str,
        call_id: &str,
        reservations: &[phrony_ledger::HistoryReservation],
    ) -> StoreResult<bool> {
        Ok(self
            .ledger
            .replace_history(session_id, call_id, reservations)
            .await?)
    }

    /// A policy denied the call (`tool.policy_denied`).
    pub async fn deny_tool_call(
        &self,
        call_id: &str,
        reason: &str,
        policy_ref: Option<&str>,
    ) -> StoreResult<ToolInvocation> {
        Ok(self
            .ledger
            .deny_tool_call(call_id, reason, policy_ref)
            .await?)
    }

    /// `dispatched → indeterminate`.
    pub async fn mark_tool_call_indeterminate(
        &self,
        call_id: &str,
        reason: &str,
    ) -> StoreResult<ToolInvocation> {
        let call = self
            .ledger
            .mark_tool_call_indeterminate(call_id, reason)
            .await?;
        count_outcome(&call);
        Ok(call)
    }

    /// Cancels an open call (a pending approval for it is closed).
    pub async fn cancel_tool_call(
        &self,
        call_id: &str,
        reason: &str,
    ) -> StoreResult<ToolInvocation> {
        let call = self.ledger.cancel_tool_call(call_id, reason).await?;
        count_outcome(&call);
        Ok(call)
    }

    /// One call.
    pub async fn get_tool_call(&self, call_id: &str) -> StoreResult<ToolInvocation> {
        Ok(self.ledger.get_tool_call(call_id).await?)
    }

    /// A session's open (non-terminal) calls, oldest first.
    pub async fn open_calls(&self, session_id: &str) -> StoreResult<Vec<ToolInvocation>> {
        Ok(self.ledger.in_flight_calls(session_id).await?)
    }

    /// The subset of `call_ids` whose outcome is recorded (terminal calls).
    pub async fn completed_calls(&self, call_ids: &[String]) -> StoreResult<HashSet<String>> {
        let mut done = HashSet::new();
        for id in call_ids {
            if self.ledger.completed_call(id).await?.is_some() {
                done.insert(id.clone());
            }
        }
        Ok(done)
    }

    /// Opens an approval; the call and the session go to `awaiting_approval` in the same step.
    pub async fn open_approval(&self, new: NewApproval) -> StoreResult<Approval> {
        let opened = self.ledger.open_approval(new).await;
        self.approvals_changed();
        Ok(opened?)
    }

    /// Records a vote and decides the approval when the quorum or a veto is reached.
    pub async fn cast_vote(&self, approval_id: Uuid, vote: Vote) -> StoreResult<VoteOutcome> {
        let outcome = self.ledger.cast_vote(approval_id, vote).await;
        self.approvals_changed();
        let outcome = outcome?;
        if outcome.decided {
            count_decided(&outcome.approval, false);
        }
        Ok(outcome)
    }

    /// Applies an expired approval's timeout default as of `now`.
    pub async fn expire_approval(
        &self,
        approval_id: Uuid,
        now: DateTime<Utc>,
    ) -> StoreResult<TimeoutOutcome> {
        let outcome = self.ledger.expire_approval(approval_id, now).await;
        self.approvals_changed();
        let outcome = outcome?;
        count_decided(&outcome.approval, true);
        Ok(outcome)
    }

    /// One approval with its votes.
    pub async fn get_approval(&self, approval_id: Uuid) -> StoreResult<Approval> {
        Ok(self.ledger.get_approval(approval_id).await?)
    }

    /// Every approval of a session (with votes), oldest first.
    pub async fn session_approvals(&self, session_id: &str) -> StoreResult<Vec<Approval>> {
        let filter = ApprovalFilter {
            session_id: Some(session_id.to_owned()),
            ..ApprovalFilter::default()
        };
        let mut page = PageRequest::first(phrony_ledger::MAX_PAGE_SIZE);
        let mut all = Vec::new();
        loop {
            let got = self.ledger.list_approvals(&filter, &page).await?;
            all.extend(got.items);
            match got.next_token {
                Some(token) => page = PageRequest::after(phrony_ledger::MAX_PAGE_SIZE, token),
                None => break,
            }
        }
        // Pages are newest first; the engine wants them in the order they were opened.
        all.sort_by_key(|a| (a.created_at, a.id));
        Ok(all)
    }

    /// Pending approvals whose expiry is at or before `now`, soonest first.
    pub async fn due_approvals(
        &self,
        now: DateTime<Utc>,
        limit: u32,
    ) -> StoreResult<Vec<Approval>> {
        Ok(self.ledger.due_approvals(now, limit).await?)
    }

    /// The earliest expiry among pending approvals.
    pub async fn next_approval_expiry(&self) -> StoreResult<Option<DateTime<Utc>>> {
        Ok(self.ledger.next_approval_expiry().await?)
    }
}

/// `phrony_tool_call_outcomes_total`: a call that reached an outcome (recorded once, here, after
/// the write committed).
fn count_outcome(call: &ToolInvocation) {
    use phrony_ledger::CallStatus;
    let outcome = match call.status {
        CallStatus::Succeeded => phrony_metrics::Outcome::Succeeded,
        CallStatus::Failed => phrony_metrics::Outcome::Failed,
        CallStatus::Indeterminate => phrony_metrics::Outcome::Indeterminate,
        CallStatus::Cancelled => phrony_metrics::Outcome::Cancelled,
        _ => return,
    };
    phrony_metrics::TOOL_CALL_OUTCOMES.inc(outcome);
}

/// The approval metrics of a decided (`expired`: timed out) approval: the decision or the
/// expiry, and its wait.
fn count_decided(approval: &Approval, expired: bool) {
    use phrony_ledger::ApprovalStatus;
    if expired {
        phrony_metrics::APPROVALS_EXPIRED.inc();
    } else {
        match approval.status {
            ApprovalStatus::Approved => {
                phrony_metrics::APPROVALS_DECIDED.inc(phrony_metrics::ApprovalDecision::Approved);
            }
            ApprovalStatus::Denied => {
                phrony_metrics::APPROVALS_DECIDED.inc(phrony_metrics::ApprovalDecision::Rejected);
            }
            _ => return,
        }
    }
    let decided_at = approval.decided_at.unwrap_or_else(Utc::now);
    if let Ok(wait) = (decided_at - approval.created_at).to_std() {
        phrony_metrics::APPROVAL_WAIT.observe(wait);
    }
}
