//! The session driver: one task per live session running the model/tool turn loop (§5.5).
//!
//! The driver reads the session's event stream back into a [`Fold`] before every step, so the
//! live path and recovery are the same code: whatever the stream says was requested but not
//! resolved is resolved next, whatever turn was started but not finished is continued.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use chrono::{DateTime, Utc};
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use phrony_ledger::{
    Approval, ApprovalStatus, AssistantMessage, CallStatus, EventBody, HiddenTool, ModelCompletion,
    NewEvent, OnLimit, OnReject, OutputAccepted, OutputAction, OutputInvalid, Session,
    SessionEvent, SessionLimits, SessionMode, SessionStatus, StatusChange, ToolInvocation, Usage,
};
use phrony_manifest::CompiledAgent;
use phrony_providers::{CompletionRequest, Event as ModelEvent, ModelProvider};
use serde_json::Value;
use tracing::Instrument as _;

use crate::error::{ErrorKind, StoreError};
use crate::fold::{CompletionRecord, Fold, ToolCallRecord, TurnRecord};
use crate::setup::DriverSetup;
use crate::state::{Inner, Live, first_user_message};

/// Why a driver (or one of its calls) stopped early.
#[derive(Debug)]
pub(crate) enum Stop {
    /// The session fails with this message.
    Fail(String),
    /// The session ended elsewhere, or the engine is stopping.
    Cancelled,
    /// The store failed.
    Store(StoreError),
    /// Every open call of the session waits for a human: the driver unloads (the session is
    /// parked) and the session is resumed from its event log when a decision comes.
    Parked,
    /// A queued call needs a tool only the workers of this other replica serve: the driver
    /// stops with nothing in flight and hands the session's lease to it (issue #20).
    HandOff(String),
}

impl From<StoreError> for Stop {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

/// Why a tool call stopped early.
#[derive(Debug)]
pub(crate) enum CallStop {
    /// The session fails (`on_reject: fail`, no handler, …).
    Fail(String),
    /// A limit was hit while the call waited.
    Halt(String),
    /// The session ended or the engine is stopping.
    Stopped,
    /// The store failed.
    Store(StoreError),
    /// The call waits for a human and the session may be parked meanwhile.
    Parked,
    /// The call is queued for a tool only the workers of this other replica serve: the session
    /// moves there (see [`Stop::HandOff`]).
    HandOff(String),
}

impl From<StoreError> for CallStop {
    fn from(e: StoreError) -> Self {
        Self::Store(e)
    }
}

/// `run limit <kind> exceeded (on_limit=<halt|escalate>)`.
pub(crate) fn limit_message(kind: &str, on_limit: OnLimit) -> String {
    format!("run limit {kind} exceeded (on_limit={})", on_limit.as_str())
}

/// Time spent waiting for approvals: the union of the waits, so parallel waits count once.
#[derive(Debug, Default)]
pub(crate) struct WaitTracker {
    closed: chrono::Duration,
    open: u32,
    open_since: Option<DateTime<Utc>>,
}

impl WaitTracker {
    /// The union of the waits of already decided (or still pending) approvals, up to `now`.
    fn from_approvals(approvals: &[Approval], now: DateTime<Utc>) -> Self {
        let mut spans: Vec<(DateTime<Utc>, DateTime<Utc>)> = approvals
            .iter()
            .map(|a| (a.created_at, a.decided_at.unwrap_or(now).min(now)))
            .filter(|(a, b)| b > a)
            .collect();
        spans.sort();
        let mut total = chrono::Duration::zero();
        let mut current: Option<(DateTime<Utc>, DateTime<Utc>)> = None;
        for (start, end) in spans {
            current = match current {
                Some((s, e)) if start <= e => Some((s, e.max(end))),
                Some((s, e)) => {
                    total += e - s;
                    Some((start, end))
                }
                None => Some((start, end)),
            };
        }
        if let Some((s, e)) = current {
            total += e - s;
        }
        Self {
            closed: total,
            open: 0,
            open_since: None,
        }
    }

    pub(crate) fn open(&mut self, now: DateTime<Utc>) {
        if self.open == 0 {
            self.open_since = Some(now);
        }
        self.open += 1;
    }

    pub(crate) fn close(&mut self, now: DateTime<Utc>) {
        self.open = self.open.saturating_sub(1);
        if self.open == 0
            && let Some(since) = self.open_since.take()
        {
            self.closed += (now - since).max(chrono::Duration::zero());
        }
    }

    pub(crate) fn used(&self, now: DateTime<Utc>) -> chrono::Duration {
        self.closed
            + self.open_since.map_or(chrono::Duration::zero(), |since| {
                (now - since).max(chrono::Duration::zero())
            })
    }
}

#[derive(Debug)]
pub(crate) struct StatusState {
    pub(crate) status: SessionStatus,
}

/// What a session's calls share (immutable, except the status and wait trackers).
pub(crate) struct Ctx {
    pub(crate) inner: Arc<Inner>,
    pub(crate) live: Arc<Live>,
    pub(crate) session: Session,
    pub(crate) agent: Arc<CompiledAgent>,
    pub(crate) setup: Arc<DriverSetup>,
    pub(crate) metadata: Value,
    pub(crate) principal: Option<Value>,
    pub(crate) limits: SessionLimits,
    pub(crate) status: tokio::sync::Mutex<StatusState>,
    pub(crate) waits: Mutex<WaitTracker>,
    pub(crate) park: ParkGate,
    /// The session's MCP clients, one per server, connected on first use.
    pub(crate) mcp: crate::mcp_clients::McpClients,
    /// Set by the driver for the calls of a completion when nothing can stop the next one
    /// (no limit can be reached before it): the worker result that closes the last open call
    /// then also moves the session back to `running`, in its transaction.
    pub(crate) resume_after_calls: std::sync::atomic::AtomicBool,
}

/// When the calls of one completion may be parked: only once *every* call still running waits
/// for a human, so a parked session has nothing in flight. Reset per completion by
/// `process_calls`; the waiting calls re-check on `changed`.
#[derive(Default)]
pub(crate) struct ParkGate {
    /// Calls of the completion not finished yet.
    running: std::sync::atomic::AtomicUsize,
    /// Of those, the calls in a wait that may be parked.
    waiting: std::sync::atomic::AtomicUsize,
    /// Set once `waiting` reached `running`: every waiting call ends with `CallStop::Parked`.
    parking: std::sync::atomic::AtomicBool,
    pub(crate) changed: tokio::sync::Notify,
}

impl ParkGate {
    fn reset(&self, running: usize) {
        use std::sync::atomic::Ordering::SeqCst;
        self.running.store(running, SeqCst);
        self.waiting.store(0, SeqCst);
        self.parking.store(false, SeqCst);
    }

    /// A call entered a parkable wait.
    pub(crate) fn wait_started(&self) {
        self.waiting
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.settle();
    }

    /// A call left its parkable wait (its decision came).
    pub(crate) fn wait_ended(&self) {
        self.waiting
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// A call finished.
    fn call_done(&self) {
        self.running
            .fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        self.settle();
    }

    fn settle(&self) {
        use std::sync::atomic::Ordering::SeqCst;
        let running = self.running.load(SeqCst);
        if running > 0 && self.waiting.load(SeqCst) >= running {
            self.parking.store(true, SeqCst);
            self.changed.notify_waiters();
        }
    }

    /// Whether the waiting calls park now.
    pub(crate) fn parking(&self) -> bool {
        self.parking.load(std::sync::atomic::Ordering::SeqCst)
    }
}

impl Ctx {
    /// A driver that starts after decisions were taken without it (the session was parked, or
    /// the daemon restarted) moves the session on as a waiting driver would have: out of
    /// `awaiting_approval` once nothing is pending, and the votes waiting for the decisions
    /// (`Engine::vote` on a parked session) are answered with that status.
    async fn acknowledge_taken_decisions(&self, approvals: &[Approval]) -> Result<(), Stop> {
        let decided = || {
            approvals.iter().filter(|a| {
                !matches!(
                    a.status,
                    ApprovalStatus::Pending | ApprovalStatus::Escalated
                )
            })
        };
        if decided().next().is_none() {
            return Ok(());
        }
        let mut state = self.status.lock().await;
        if state.status == SessionStatus::AwaitingApproval
            && !approvals
                .iter()
                .any(|a| a.status == ApprovalStatus::Pending)
        {
            self.set_status_locked(&mut state, SessionStatus::AwaitingTool, None)
                .await?;
        }
        for a in decided() {
            self.live.decision_taken(a.id, state.status);
        }
        Ok(())
    }

    pub(crate) fn store(&self) -> &crate::store::LedgerStore {
        self.inner.store.as_ref()
    }

    pub(crate) fn now(&self) -> DateTime<Utc> {
        self.inner.clock.now()
    }

    /// This driver committed a change to its session: wakes its subscriptions and waiters
    /// (the events are in the live session's `recent`).
    pub(crate) fn notify(&self) {
        self.live.notify_local();
    }

    pub(crate) fn waits(&self) -> std::sync::MutexGuard<'_, WaitTracker> {
        self.waits
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Moves the session to `to` (no-op when it is there).
    pub(crate) async fn set_status(
        &self,
        to: SessionStatus,
        reason: Option<String>,
    ) -> Result<(), Stop> {
        let mut state = self.status.lock().await;
        self.set_status_locked(&mut state, to, reason).await
    }

    pub(crate) async fn set_status_locked(
        &self,
        state: &mut StatusState,
        to: SessionStatus,
        reason: Option<String>,
    ) -> Result<(), Stop> {
        if state.status == to {
            return Ok(());
        }
        let mut change = StatusChange::to(to).from(state.status);
        change.reason = reason;
        match self.store().set_status(&self.session.id, change).await {
            Ok(changed) => {
                state.status = changed.session.status;
                self.notify();
                Ok(())
            }
            Err(e) if e.kind == ErrorKind::FailedPrecondition => {
                let now = self.store().get_session(&self.session.id).await?;
                if now.status.is_terminal() {
                    return Err(Stop::Cancelled);
                }
                if now.status == to {
                    state.status = to;
                    return Ok(());
                }
                Err(e.into())
            }
            Err(e) => Err(e.into()),
        }
    }
}

struct Driver {
    ctx: Arc<Ctx>,
    fold: Fold,
    provider: Box<dyn ModelProvider>,
    /// Approved limit escalations per limit kind.
    grants: HashMap<String, u64>,
    /// Tool calls recorded with the completion that requested them ([`Ctx::record_step`]),
    /// by call id: taken by `process_calls` instead of recording them a second time.
    prerecorded: HashMap<String, ToolInvocation>,
    /// When `fold` last caught up with the log ([`sync`]).
    caught_up: CaughtUp,
}

enum TurnEnd {
    Finished,
    Halted(String),
    /// The task ended with this turn's answer, recorded with the move to `completed`.
    Completed,
}

enum LimitOutcome {
    Raised,
    Halt(String),
}

/// Where a task stands after its final answer was checked.
enum OutputStep {
    /// The output is settled: complete the session.
    Done,
    /// The model is asked again (a feedback turn was recorded).
    AskAgain,
}

/// Why a task completed (the reason of its `session.completed`).
const TASK_COMPLETED: &str = "the task's turn ended";

/// `max_tokens_per_run`.
pub(crate) const TOKEN_LIMIT: &str = "max_tokens_per_run";
/// `max_loop_iterations`.
pub(crate) const LOOP_LIMIT: &str = "max_loop_iterations";

/// A limit hit that may be escalated to a human.
pub(crate) struct LimitEscalation<'a> {
    pub(crate) turn: u32,
    pub(crate) iteration: u32,
    pub(crate) kind: &'static str,
    pub(crate) used: u64,
    pub(crate) max: u64,
    /// Escalations of this kind already approved.
    pub(crate) grants: u64,
    pub(crate) message: &'a str,
}

/// Where a call handed to `Ctx::drive_call` comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recorded {
    /// Recorded by this driver with the completion that requested it, moments ago: no approval
    /// or decision can refer to it yet.
    JustNow,
    /// Read from the ledger (a resumed session, a call driven again): it may have an approval.
    Earlier,
}

/// Runs one session until it ends, its input is blocked, or the engine stops.
pub(crate) async fn run(
    inner: Arc<Inner>,
    live: Arc<Live>,
    session: Session,
    agent: Arc<CompiledAgent>,
    setup: Arc<DriverSetup>,
    provider: Box<dyn ModelProvider>,
) {
    let session_id = session.id.clone();
    let cancel = live.cancel.clone();
    // With session leases (several replicas), drive only under this replica's lease.
    let epoch = match crate::lease::acquire(&inner, &session_id).await {
        Ok(Some(epoch)) => {
            live.lease_epoch
                .store(epoch, std::sync::atomic::Ordering::Release);
            epoch
        }
        Ok(None) => {
            // Driven by another replica: nothing to do here.
            inner.unregister(&live, false);
            return;
        }
        Err(e) => {
            tracing::warn!(%session_id, error = %e, "could not acquire the session's lease");
            inner.unregister(&live, false);
            if e.kind == ErrorKind::Unavailable && !cancel.is_cancelled() {
                inner.suspend(&session_id);
            }
            return;
        }
    };
    let outcome = tokio::select! {
        r = drive(Arc::clone(&inner), Arc::clone(&live), session, agent, setup, provider) => r,
        () = cancel.cancelled() => Err(Stop::Cancelled),
    };
    let parked = matches!(outcome, Err(Stop::Parked));
    crate::trace::session_outcome(
        &tracing::Span::current(),
        match &outcome {
            Ok(()) => "ended",
            Err(Stop::Fail(_)) => "failed",
            Err(Stop::Cancelled) => "stopped",
            Err(Stop::Store(_)) => "store_error",
            Err(Stop::Parked) => "parked",
            Err(Stop::HandOff(_)) => "handed_off",
        },
    );
    let fenced = matches!(&outcome, Err(Stop::Store(e)) if crate::lease::is_fenced(e));
    let hand_off = match &outcome {
        Err(Stop::HandOff(to)) => Some(to.clone()),
        _ => None,
    };
    let suspend = match outcome {
        Ok(()) | Err(Stop::Cancelled | Stop::Parked | Stop::HandOff(_)) => false,
        Err(Stop::Store(_)) if fenced => {
            // Another replica took the session over: it drives it now. Never retried here.
            tracing::warn!(%session_id, "session lease lost; its driver stopped here");
            false
        }
        Err(Stop::Fail(message)) => !fail_session(&inner, &session_id, &message).await,
        Err(Stop::Store(e)) if e.kind == ErrorKind::Unavailable => {
            // A storage outage never fails a session: it is resumed by the recovery path.
            if cancel.is_cancelled() {
                false
            } else {
                tracing::warn!(%session_id, error = %e, "session suspended: database unavailable");
                true
            }
        }
        Err(Stop::Store(e)) => {
            let ended = inner
                .store
                .get_session(&session_id)
                .await
                .map(|s| s.status.is_terminal())
                .unwrap_or(false);
            if !ended && !cancel.is_cancelled() {
                tracing::error!(%session_id, error = %e, "session driver failed on a store error");
                !fail_session(&inner, &session_id, &format!("internal error: {e}")).await
            } else {
                false
            }
        }
    };
    if parked {
        // Before unregistering: from then on a decision may resume the session, whose next
        // driver continues this trace.
        inner.park_trace(
            &session_id,
            crate::trace::context_of(&tracing::Span::current()),
        );
    }
    // Before unregistering (a driver this replica starts next acquires a new epoch). Not when
    // the engine stops or the session is suspended: the lease then runs out and another
    // replica (or this one, resuming) takes the session over.
    if let Some(to) = hand_off {
        crate::lease::hand_off(&inner, &session_id, epoch, &to).await;
    } else if !suspend && !inner.stop.is_cancelled() {
        crate::lease::release(&inner, &session_id, epoch).await;
    }
    inner.unregister(&live, parked);
    // A session that ended took its running children with it in the ledger (the cascade):
    // their drivers stop too. (Children of a session that merely stopped keep running.)
    let children = live.children();
    if !children.is_empty()
        && let Err(e) = inner.stop_ended(&children).await
    {
        tracing::warn!(%session_id, error = %e, "could not stop the drivers of ended children");
    }
    // After unregistering: the resume task's recovery skips live sessions.
    if suspend {
        inner.suspend(&session_id);
    }
    if parked {
        tracing::debug!(%session_id, "session parked until a decision");
        settle_parked(&inner, &session_id).await;
    }
}

/// Closes the race between parking and a decision: a vote recorded while the driver was
/// unloading found the session live and woke nobody. Checked after unregistering, so a
/// decision recorded after this check finds the session parked and resumes it itself
/// (`Engine::vote`, the approval timer); one recorded before is seen here.
async fn settle_parked(inner: &Inner, session_id: &str) {
    let wake = match still_parked(inner, session_id).await {
        Ok(parked) => !parked,
        Err(e) => {
            // Resuming re-reads everything: a spurious resume only parks again.
            tracing::debug!(%session_id, error = %e, "parked session re-check failed; resuming");
            true
        }
    };
    if wake {
        inner.request_unpark(session_id);
    }
}

/// Whether the session still waits only for humans: `awaiting_approval`, an approval still
/// pending, and no call approved meanwhile that waits to be sent.
async fn still_parked(inner: &Inner, session_id: &str) -> Result<bool, StoreError> {
    let session = inner.store.get_session(session_id).await?;
    if session.status != SessionStatus::AwaitingApproval {
        return Ok(session.status.is_terminal());
    }
    let approvals = inner.store.session_approvals(session_id).await?;
    if !approvals
        .iter()
        .any(|a| a.status == ApprovalStatus::Pending)
    {
        return Ok(false);
    }
    for a in approvals
        .iter()
        .filter(|a| a.status == ApprovalStatus::Approved)
    {
        let status = inner.store.get_tool_call(&a.call_id).await?.status;
        if matches!(status, CallStatus::Pending | CallStatus::Queued) {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Fails the session; `false` when the store was unavailable, so the session is still live in
/// the store and must be suspended instead (recovery runs its turn again).
async fn fail_session(inner: &Inner, session_id: &str, message: &str) -> bool {
    match inner
        .store
        .set_status(session_id, StatusChange::failed(message))
        .await
    {
        Ok(_) => {
            tracing::info!(%session_id, %message, "session failed");
            true
        }
        Err(e) if e.kind == ErrorKind::Unavailable => {
            tracing::warn!(
                %session_id,
                %message,
                error = %e,
                "session suspended: database unavailable (it could not be failed)"
            );
            false
        }
        Err(e) => {
            tracing::debug!(%session_id, error = %e, "session not failed (it ended meanwhile)");
            true
        }
    }
}

/// Events read per page when the driver catches up with the log.
const SYNC_PAGE: u32 = 500;

/// Folds the events recorded since the fold's last one. A short page is the end of the log
/// (events are appended in sequence order under the session's stream head), so catching up
/// costs one read, not one more to find the log empty. Events this process committed and the
/// live session still holds ([`Live::recent_after`]) are folded without a read when they
/// continue the fold: the log held exactly those at their commit, so that is a read taken
/// then; the store is read when they do not, or when none are new (another replica's writes
/// are only there).
///
/// A sync that finds nothing new held, no news signalled for the store
/// ([`Live::notify_changed`]) and the fold caught up less than [`CAUGHT_UP_FRESH`] ago reads
/// nothing either: the driver's steps sync several times in a row, and only another replica's
/// write its announcement did not reach can be missed that way, for that long at most.
async fn sync(
    inner: &Inner,
    live: &Live,
    session_id: &str,
    fold: &mut Fold,
    caught_up: &mut CaughtUp,
) -> Result<(), StoreError> {
    // Read before anything else: news signalled after it makes the next sync read the store.
    let store_news = live.changed.borrow().store;
    let held = live.recent_after(fold.last_seq(), SYNC_PAGE as usize);
    if !held.events.is_empty() {
        for event in &held.events {
            fold.apply(event)?;
        }
        if fold.last_seq() >= held.head {
            *caught_up = CaughtUp(held.heard_at.map(|at| (at, store_news)));
            return Ok(());
        }
    } else if held.head <= fold.last_seq()
        && caught_up
            .0
            .is_some_and(|(at, news)| news == store_news && at.elapsed() < CAUGHT_UP_FRESH)
    {
        return Ok(());
    }
    let started = std::time::Instant::now();
    loop {
        let page = inner
            .store
            .events_after(session_id, fold.last_seq(), SYNC_PAGE)
            .await?;
        for event in &page {
            fold.apply(event)?;
        }
        if page.len() < SYNC_PAGE as usize {
            *caught_up = CaughtUp(Some((started, store_news)));
            return Ok(());
        }
    }
}

/// How long after catching up with the log a driver's sync with no news skips the read.
const CAUGHT_UP_FRESH: std::time::Duration = std::time::Duration::from_millis(20);

/// When a driver's fold last caught up with the whole log (read from the store, or from held
/// events up to the head this process knew), and the store news it had seen then.
#[derive(Debug, Default, Clone, Copy)]
struct CaughtUp(Option<(std::time::Instant, u64)>);

async fn drive(
    inner: Arc<Inner>,
    live: Arc<Live>,
    session: Session,
    agent: Arc<CompiledAgent>,
    setup: Arc<DriverSetup>,
    provider: Box<dyn ModelProvider>,
) -> Result<(), Stop> {
    let mut fold = Fold::default();
    let mut caught_up = CaughtUp::default();
    sync(&inner, &live, &session.id, &mut fold, &mut caught_up).await?;
    // The first user message comes from the input (recorded here, so a crash right after the
    // session was created loses nothing).
    if !fold.user_turns.contains(&1)
        && fold.max_started_turn == 0
        && let Ok(Some(text)) = first_user_message(&session.input)
    {
        inner
            .store
            .record_session_event(
                &session.id,
                SessionEvent::UserMessage {
                    actor: starter(&session),
                    turn: 1,
                    content: text,
                },
            )
            .await?;
        sync(&inner, &live, &session.id, &mut fold, &mut caught_up).await?;
    }
    let approvals = inner.store.session_approvals(&session.id).await?;
    let now = inner.clock.now();
    let current = inner.store.get_session(&session.id).await?;
    if current.status.is_terminal() {
        return Ok(());
    }
    // A rejection with `on_reject: fail` fails the session. The ledger closes the call with the
    // decision; a driver that was not waiting when it was recorded (the session was parked, or
    // the daemon restarted in between) applies the rest here.
    // (An output escalation's rejection is applied by the output check, with its own message.)
    if let Some(rejected) = approvals.iter().find(|a| {
        a.status == ApprovalStatus::Denied
            && a.on_reject == OnReject::Fail
            && a.tool != crate::fold::OUTPUT_TOOL
    }) {
        return Err(Stop::Fail(crate::fold::rejection_text(
            &rejected.call_id,
            rejected.decided_by.as_deref().unwrap_or("an approver"),
            rejected.comment.as_deref().unwrap_or(""),
        )));
    }
    {
        let mut input = live.input.lock().await;
        input.blocked.clone_from(&fold.input_blocked);
        input.next_turn = input
            .next_turn
            .max(fold.max_user_turn.max(fold.max_started_turn) + 1);
    }
    // Messages other replicas queued while nobody (or another replica) drove it.
    if inner.config.session_lease_ttl.is_some() && session.mode == SessionMode::Conversation {
        crate::inbox::accept_queued(&inner, &live).await?;
    }
    let ctx = Arc::new(Ctx {
        metadata: phrony_manifest::session_metadata(&session.metadata),
        principal: fold.principal.clone(),
        limits: session.limits.clone().unwrap_or_default(),
        status: tokio::sync::Mutex::new(StatusState {
            status: current.status,
        }),
        waits: Mutex::new(WaitTracker::from_approvals(&approvals, now)),
        park: ParkGate::default(),
        mcp: crate::mcp_clients::McpClients::default(),
        resume_after_calls: std::sync::atomic::AtomicBool::new(false),
        inner,
        live,
        session,
        agent,
        setup,
    });
    ctx.acknowledge_taken_decisions(&approvals).await?;
    let watchdog = wall_watchdog(Arc::clone(&ctx));
    let grants = crate::fold::limit_grants(&approvals);
    let mut driver = Driver {
        ctx,
        fold,
        provider,
        grants,
        prerecorded: HashMap::new(),
        caught_up,
    };
    tokio::select! {
        r = driver.main_loop() => r,
        message = watchdog => Err(Stop::Fail(message)),
    }
}

/// Resolves when the session's wall-clock budget (approval waits excluded) is spent.
async fn wall_watchdog(ctx: Arc<Ctx>) -> String {
    let Some(max) = ctx.limits.max_wall_clock_seconds else {
        return std::future::pending().await;
    };
    let budget = chrono::Duration::seconds(i64::try_from(max).unwrap_or(i64::MAX / 1000));
    loop {
        let now = ctx.now();
        let waited = ctx.waits().used(now);
        let elapsed = now - ctx.session.created_at - waited;
        let remaining = budget - elapsed;
        if remaining <= chrono::Duration::zero() {
            return limit_message("max_wall_clock_seconds", ctx.limits.on_limit);
        }
        ctx.inner.clock.sleep_until(now + remaining).await;
    }
}

impl Driver {
    async fn sync(&mut self) -> Result<(), Stop> {
        sync(
            &self.ctx.inner,
            &self.ctx.live,
            &self.ctx.session.id,
            &mut self.fold,
            &mut self.caught_up,
        )
        .await?;
        Ok(())
    }

    async fn main_loop(&mut self) -> Result<(), Stop> {
        loop {
            self.sync().await?;
            let blocked = self.ctx.live.input.lock().await.blocked.clone();
            // A task ends with its first finished turn whose answer passes the output check;
            // an answer that fails it may ask the model again (a feedback turn).
            if self.ctx.session.mode == SessionMode::Task
                && self.fold.last_finished_turn >= 1
                && self.fold.max_user_turn <= self.fold.last_finished_turn
            {
                match self.check_output().await? {
                    OutputStep::Done => return self.complete_task().await,
                    OutputStep::AskAgain => continue,
                }
            }
            match self.next_turn(blocked.is_some()) {
                Some(turn) => match self.start_turn(turn).await? {
                    TurnEnd::Finished => {
                        if self.ctx.session.mode == SessionMode::Task {
                            // Checked and completed at the top of the loop.
                            continue;
                        }
                        self.sync().await?;
                        if let Some(message) = self.session_limit_reached() {
                            self.halt(message).await?;
                        }
                    }
                    TurnEnd::Halted(message) => self.halt(message).await?,
                    TurnEnd::Completed => return Ok(()),
                },
                None => {
                    let reason = blocked.clone();
                    self.ctx
                        .set_status(SessionStatus::AwaitingInput, reason)
                        .await?;
                    let live = Arc::clone(&self.ctx.live);
                    let inbox = live.inbox.notified();
                    tokio::pin!(inbox);
                    // A message recorded between the sync above and now left a permit.
                    self.sync().await?;
                    if self.next_turn(blocked.is_some()).is_none() {
                        // Waiting for a person: the held events are not read soon.
                        self.ctx.live.forget_recent();
                        self.wait_for_input(inbox).await?;
                    }
                }
            }
        }
    }

    /// Waits for a user message: a local one (`inbox`), or with session leases on one another
    /// replica queued, taken at its announcement (`lease::wake_session`) or, if that was lost,
    /// at this safety-net re-read every ten poll intervals.
    async fn wait_for_input(
        &self,
        mut inbox: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>,
    ) -> Result<(), Stop> {
        if self.ctx.inner.config.session_lease_ttl.is_none() {
            inbox.await;
            return Ok(());
        }
        let period = self.ctx.inner.config.poll_interval.saturating_mul(10);
        loop {
            tokio::select! {
                () = &mut inbox => return Ok(()),
                () = tokio::time::sleep(period) => {
                    if crate::inbox::accept_queued(&self.ctx.inner, &self.ctx.live).await? > 0 {
                        return Ok(());
                    }
                }
            }
        }
    }

    /// Runs `turn`, first marking it started: its user message stops counting against
    /// `EngineConfig::max_queued_user_messages`.
    async fn start_turn(&mut self, turn: u32) -> Result<TurnEnd, Stop> {
        self.ctx.live.turn_started(turn).await;
        self.run_turn(turn)
            .instrument(crate::trace::turn(turn))
            .await
    }

    /// The turn to run next: an unfinished one, the next one with a user message, or (task
    /// mode) the first one.
    fn next_turn(&self, blocked: bool) -> Option<u32> {
        if blocked {
            return None;
        }
        let f = &self.fold;
        if f.max_started_turn > f.last_finished_turn {
            return Some(f.max_started_turn);
        }
        if f.max_user_turn > f.last_finished_turn {
            return Some(f.last_finished_turn + 1);
        }
        if self.ctx.session.mode == SessionMode::Task && f.last_finished_turn == 0 {
            return Some(1);
        }
        None
    }

    /// A conversation-wide limit that blocks further input.
    fn session_limit_reached(&self) -> Option<String> {
        let l = &self.ctx.limits;
        if let Some(max) = l.max_tokens_per_run
            && self.fold.tokens_used >= self.effective(TOKEN_LIMIT, max)
        {
            return Some(limit_message("max_tokens_per_run", l.on_limit));
        }
        if let Some(max) = l.max_loop_iterations
            && u64::from(self.fold.last_finished_turn) >= self.effective(LOOP_LIMIT, max)
        {
            return Some(limit_message("max_loop_iterations", l.on_limit));
        }
        None
    }

    /// The output of a task that ends with `answer`, the final segment of a turn with no
    /// calls: `None` for a conversation, a task whose answer is checked (`output`), or one
    /// with a later turn to run.
    fn task_output_with(&self, answer: &AssistantMessage) -> Option<Value> {
        let ends = self.ctx.session.mode == SessionMode::Task
            && self.ctx.setup.output.is_none()
            && self.fold.max_user_turn <= answer.turn;
        let last = TurnRecord::finished_by(answer).filter(|_| ends)?;
        Some(self.fold.output_after(last, &answer.content))
    }

    /// Whether no limit can stop `turn`'s next completion once the open calls have their
    /// outcomes: no token budget (its check needs the request, tool results included) and
    /// a loop budget the next iteration stays under. The checks before that completion
    /// (`run_turn`) are the judges; this only lets the last result resume the session.
    fn next_completion_unbounded(&self, turn: u32) -> bool {
        let limits = &self.ctx.limits;
        limits.max_tokens_per_run.is_none()
            && limits.max_loop_iterations.is_none_or(|max| {
                u64::from(self.fold.next_iteration(turn)) < self.effective(LOOP_LIMIT, max)
            })
    }

    /// A limit's budget after the escalations approved so far: each approval grants the
    /// configured budget once more.
    fn effective(&self, kind: &str, max: u64) -> u64 {
        let grants = self.grants.get(kind).copied().unwrap_or(0);
        max.saturating_mul(grants.saturating_add(1))
    }

    /// A limit was hit: halt, or (`on_limit: escalate` with a `limit:escalate` policy) ask a
    /// human to raise it.
    async fn on_limit(
        &mut self,
        turn: u32,
        iteration: u32,
        kind: &'static str,
        used: u64,
        max: u64,
    ) -> Result<LimitOutcome, Stop> {
        let message = limit_message(kind, self.ctx.limits.on_limit);
        if self.ctx.limits.on_limit != OnLimit::Escalate {
            return Ok(LimitOutcome::Halt(message));
        }
        let grants = self.grants.get(kind).copied().unwrap_or(0);
        let escalation = LimitEscalation {
            turn,
            iteration,
            kind,
            used,
            max,
            grants,
            message: &message,
        };
        match self.ctx.escalate_limit(&escalation).await {
            Ok(true) => {
                self.grants = self.ctx.limit_grants().await?;
                self.ctx.notify();
                Ok(LimitOutcome::Raised)
            }
            Ok(false) => Ok(LimitOutcome::Halt(message)),
            Err(CallStop::Halt(m)) => Ok(LimitOutcome::Halt(m)),
            Err(CallStop::Fail(m)) => Err(Stop::Fail(m)),
            Err(CallStop::Stopped) => Err(Stop::Cancelled),
            Err(CallStop::Store(e)) => Err(Stop::Store(e)),
            Err(CallStop::Parked) => Err(Stop::Parked),
            Err(CallStop::HandOff(to)) => Err(Stop::HandOff(to)),
        }
    }

    /// Checks the task's final answer against the agent's output contract (`output.format:
    /// json`), records the outcome (`output.accepted`, or `output.invalid` with what happens
    /// next) and acts on it. A check already recorded for the answer (a restarted driver) is
    /// acted on again, not repeated.
    async fn check_output(&mut self) -> Result<OutputStep, Stop> {
        let Some(check) = self.ctx.setup.output.as_ref() else {
            return Ok(OutputStep::Done);
        };
        let turn = self.fold.last_finished_turn;
        if self
            .fold
            .output_accepted
            .as_ref()
            .is_some_and(|(t, _)| *t == turn)
        {
            return Ok(OutputStep::Done);
        }
        let answer = self.fold.last_assistant.clone().unwrap_or_default();
        let invalid = match self.fold.output_invalid.clone() {
            Some(invalid) if invalid.turn == turn => invalid,
            _ => {
                let attempt = self.fold.output_failures.saturating_add(1);
                match check.validator.check(&answer) {
                    Ok(output) => {
                        self.record_output(OutputAccepted {
                            turn,
                            attempt,
                            output,
                            approval_id: None,
                            accepted_by: None,
                        })
                        .await?;
                        return Ok(OutputStep::Done);
                    }
                    Err(errors) => {
                        let action = check.action(attempt);
                        let feedback =
                            crate::output::feedback(action, &errors, check.validator.schema());
                        let invalid = OutputInvalid {
                            turn,
                            attempt,
                            errors,
                            on_invalid: check.on_invalid,
                            action,
                            feedback,
                        };
                        self.ctx
                            .store()
                            .append_engine_event(
                                &self.ctx.session.id,
                                system_event(turn, EventBody::OutputInvalid(invalid.clone()))?,
                            )
                            .await?;
                        self.sync().await?;
                        self.ctx.notify();
                        invalid
                    }
                }
            }
        };
        match invalid.action {
            OutputAction::Retry | OutputAction::Repair => Ok(OutputStep::AskAgain),
            OutputAction::Fail => Err(Stop::Fail(crate::output::failure_message(&invalid))),
            OutputAction::Escalate => self.escalate_output(&invalid, &answer).await,
        }
    }

    /// `on_invalid: escalate`: a human accepts the answer (the session completes with it) or
    /// rejects it (the session fails).
    async fn escalate_output(
        &mut self,
        invalid: &OutputInvalid,
        answer: &str,
    ) -> Result<OutputStep, Stop> {
        let iteration = self.fold.next_iteration(invalid.turn).saturating_sub(1);
        let decision = match self.ctx.escalate_output(invalid, iteration, answer).await {
            Ok(d) => d,
            Err(CallStop::Fail(m) | CallStop::Halt(m)) => return Err(Stop::Fail(m)),
            Err(CallStop::Stopped) => return Err(Stop::Cancelled),
            Err(CallStop::Store(e)) => return Err(Stop::Store(e)),
            Err(CallStop::Parked) => return Err(Stop::Parked),
            Err(CallStop::HandOff(to)) => return Err(Stop::HandOff(to)),
        };
        match decision {
            crate::output::OutputDecision::Accepted {
                approval_id,
                accepted_by,
            } => {
                let output = phrony_manifest::OutputValidator::parse(answer)
                    .unwrap_or_else(|| Value::String(answer.to_owned()));
                self.record_output(OutputAccepted {
                    turn: invalid.turn,
                    attempt: invalid.attempt,
                    output,
                    approval_id: Some(approval_id),
                    accepted_by: Some(accepted_by),
                })
                .await?;
                Ok(OutputStep::Done)
            }
            crate::output::OutputDecision::Rejected { message } => Err(Stop::Fail(message)),
        }
    }

    async fn record_output(&mut self, accepted: OutputAccepted) -> Result<(), Stop> {
        let turn = accepted.turn;
        self.ctx
            .store()
            .append_engine_event(
                &self.ctx.session.id,
                system_event(turn, EventBody::OutputAccepted(accepted))?,
            )
            .await?;
        self.sync().await?;
        self.ctx.notify();
        Ok(())
    }

    async fn complete_task(&mut self) -> Result<(), Stop> {
        let change = StatusChange::completed(Some(self.fold.output())).because(TASK_COMPLETED);
        match self
            .ctx
            .store()
            .set_status(&self.ctx.session.id, change)
            .await
        {
            Ok(_) => {
                self.ctx.notify();
                Ok(())
            }
            Err(e) => self.ended_anyway(e).await,
        }
    }

    /// A task's last completion with its answer and the move to `completed`, in one
    /// transaction (what `complete_task` does after the completion is recorded, one durable
    /// commit sooner); `output` is the session's output with the answer folded.
    async fn record_final(
        &mut self,
        completion: NewEvent,
        answer: Option<SessionEvent>,
        output: Value,
    ) -> Result<TurnEnd, Stop> {
        let change = StatusChange::completed(Some(output)).because(TASK_COMPLETED);
        let mut state = self.ctx.status.lock().await;
        let step = self
            .ctx
            .store()
            .record_step(
                &self.ctx.session.id,
                completion,
                answer,
                Some(change),
                Vec::new(),
            )
            .await;
        match step {
            Ok(step) => {
                if let Some(changed) = &step.status {
                    state.status = changed.session.status;
                }
                drop(state);
                self.ctx.notify();
                Ok(TurnEnd::Completed)
            }
            Err(e) => {
                drop(state);
                self.ended_anyway(e).await.map(|()| TurnEnd::Completed)
            }
        }
    }

    /// A task's completion failed with `e`: done if the session ended meanwhile (cancelled,
    /// or its version retired), the error otherwise.
    async fn ended_anyway(&self, e: StoreError) -> Result<(), Stop> {
        let now = self.ctx.store().get_session(&self.ctx.session.id).await?;
        if now.status.is_terminal() {
            Ok(())
        } else {
            Err(e.into())
        }
    }

    /// A limit stopped the turn: a task fails; a conversation parks with its input blocked
    /// (its open calls cancelled, their approvals closed).
    async fn halt(&mut self, message: String) -> Result<(), Stop> {
        if self.ctx.session.mode == SessionMode::Task {
            return Err(Stop::Fail(message));
        }
        for call in self.ctx.store().open_calls(&self.ctx.session.id).await? {
            if let Err(e) = self
                .ctx
                .store()
                .cancel_tool_call(&call.call_id, &message)
                .await
            {
                tracing::debug!(call_id = %call.call_id, error = %e, "call not cancelled");
            }
        }
        self.ctx.live.input.lock().await.blocked = Some(message.clone());
        {
            let mut state = self.ctx.status.lock().await;
            // Re-read: cancelling calls may have closed approvals without a status change.
            state.status = self
                .ctx
                .store()
                .get_session(&self.ctx.session.id)
                .await?
                .status;
            self.ctx
                .set_status_locked(&mut state, SessionStatus::AwaitingInput, Some(message))
                .await?;
            // Its approvals are closed: a vote that decided one meanwhile is answered now.
            self.ctx.live.decisions_closed(Some(state.status));
        }
        Ok(())
    }

    async fn run_turn(&mut self, turn: u32) -> Result<TurnEnd, Stop> {
        let started = self.ctx.now();
        let session_id = self.ctx.session.id.clone();
        let version_id = self.ctx.session.agent_version_id;
        loop {
            self.sync().await?;
            if let Some((iteration, calls)) =
                self.fold.unresolved_calls(turn, &session_id, version_id)
            {
                {
                    // A recovered session still waiting for a decision stays so.
                    let mut state = self.ctx.status.lock().await;
                    let waiting = state.status == SessionStatus::AwaitingApproval
                        && self
                            .ctx
                            .store()
                            .session_approvals(&self.ctx.session.id)
                            .await?
                            .iter()
                            .any(|a| a.status == phrony_ledger::ApprovalStatus::Pending);
                    if !waiting {
                        self.ctx
                            .set_status_locked(&mut state, SessionStatus::AwaitingTool, None)
                            .await?;
                    }
                }
                match self.process_calls(turn, iteration, calls).await {
                    Ok(()) => continue,
                    Err(CallStop::Halt(message)) => return Ok(TurnEnd::Halted(message)),
                    Err(CallStop::Fail(message)) => return Err(Stop::Fail(message)),
                    Err(CallStop::Stopped) => return Err(Stop::Cancelled),
                    Err(CallStop::Store(e)) => return Err(Stop::Store(e)),
                    Err(CallStop::Parked) => return Err(Stop::Parked),
                    Err(CallStop::HandOff(to)) => return Err(Stop::HandOff(to)),
                }
            }
            let iteration = self.fold.next_iteration(turn);
            let limits = self.ctx.limits.clone();
            if let Some(max) = limits.max_loop_iterations
                && u64::from(iteration) >= self.effective(LOOP_LIMIT, max)
            {
                match self
                    .on_limit(turn, iteration, LOOP_LIMIT, u64::from(iteration), max)
                    .await?
                {
                    LimitOutcome::Raised => continue,
                    LimitOutcome::Halt(message) => return Ok(TurnEnd::Halted(message)),
                }
            }
            let (request, hidden) = self.next_request(turn);
            let needed = self
                .fold
                .tokens_used
                .saturating_add(request.estimated_input_tokens());
            if let Some(max) = limits.max_tokens_per_run
                && needed > self.effective(TOKEN_LIMIT, max)
            {
                match self
                    .on_limit(turn, iteration, TOKEN_LIMIT, needed, max)
                    .await?
                {
                    LimitOutcome::Raised => continue,
                    LimitOutcome::Halt(message) => return Ok(TurnEnd::Halted(message)),
                }
            }
            self.ctx.set_status(SessionStatus::Running, None).await?;
            let completion = self.call_model(request, hidden, turn, iteration).await?;
            let has_calls = !completion.tool_calls.is_empty();
            if !has_calls && completion.stop_reason == "tool_use" {
                return Err(Stop::Fail(
                    "model stopped for tool_use without tool calls".to_owned(),
                ));
            }
            // The completion and its assistant message commit together: a crash cannot leave a
            // recorded completion without its text, which recovery would have to ask again.
            let assistant = if has_calls {
                (!completion.text.is_empty())
                    .then(|| self.assistant_message(turn, completion.text.clone(), None, started))
            } else {
                let stop_reason = Some(completion.stop_reason.clone());
                let mut message =
                    self.assistant_message(turn, completion.text.clone(), stop_reason, started);
                // The turn's usage includes this completion's (not folded yet).
                if let Some(u) = message.turn_usage.as_mut() {
                    let own = &completion.record.usage;
                    u.input_tokens = u.input_tokens.saturating_add(own.input_tokens);
                    u.output_tokens = u.output_tokens.saturating_add(own.output_tokens);
                    u.estimated |= own.estimated;
                }
                Some(message)
            };
            let completion_event = engine_event(
                turn,
                EventBody::ModelCompletion(ModelCompletion::from(&completion.record)),
            )?;
            let final_output = assistant
                .as_ref()
                .filter(|_| !has_calls)
                .and_then(|message| self.task_output_with(message));
            let assistant = assistant.map(SessionEvent::AssistantMessage);
            if let Some(output) = final_output {
                return self.record_final(completion_event, assistant, output).await;
            }
            // With calls that will run (no token budget in the way), the completion, the move
            // to `awaiting_tool` and the calls are recorded in one transaction.
            let within_budget = self.ctx.limits.max_tokens_per_run.is_none_or(|max| {
                self.fold
                    .tokens_used
                    .saturating_add(completion.record.usage.total())
                    <= self.effective(TOKEN_LIMIT, max)
            });
            if has_calls && within_budget {
                let calls = completion
                    .tool_calls
                    .iter()
                    .map(|rec| self.ctx.new_tool_call(turn, iteration, rec))
                    .collect();
                for call in self
                    .ctx
                    .record_step(completion_event, assistant, calls)
                    .await?
                {
                    self.prerecorded.insert(call.call_id.clone(), call);
                }
            } else {
                self.ctx
                    .store()
                    .record_completion(&session_id, completion_event, assistant)
                    .await?;
            }
            self.sync().await?;
            self.ctx.notify();
            if !has_calls {
                return Ok(TurnEnd::Finished);
            }
            if let Some(max) = self.ctx.limits.max_tokens_per_run
                && self.fold.tokens_used > self.effective(TOKEN_LIMIT, max)
            {
                // The calls of this completion run only if the budget is raised.
                let used = self.fold.tokens_used;
                match self
                    .on_limit(turn, iteration, TOKEN_LIMIT, used, max)
                    .await?
                {
                    LimitOutcome::Raised => {}
                    LimitOutcome::Halt(message) => return Ok(TurnEnd::Halted(message)),
                }
            }
        }
    }

    /// The assistant message of `turn` (on the final segment: the turn's usage as folded so
    /// far and its duration).
    fn assistant_message(
        &self,
        turn: u32,
        content: String,
        stop_reason: Option<String>,
        started: DateTime<Utc>,
    ) -> AssistantMessage {
        let final_segment = stop_reason.is_some();
        let usage = self.fold.turn_usage.get(&turn).copied().unwrap_or_default();
        AssistantMessage {
            turn,
            content,
            stop_reason,
            turn_usage: final_segment.then_some(Usage {
                input_tokens: usage.input_tokens,
                output_tokens: usage.output_tokens,
                estimated: usage.estimated,
            }),
            turn_duration_ms: final_segment
                .then(|| u64::try_from((self.ctx.now() - started).num_milliseconds()).unwrap_or(0)),
        }
    }

    /// Streams one completion, forwarding text to subscribers.
    /// The next completion's request: the agent's template, the turn's messages, and the tools
    /// policy does not hide in the session's context now (time conditions change between
    /// completions); with the tools it hid.
    fn next_request(&self, turn: u32) -> (CompletionRequest, Vec<HiddenTool>) {
        let mut request = self.ctx.setup.base_request.clone();
        request.messages = self.fold.messages(turn);
        let hidden = self.ctx.hide_denied_tools(&mut request.tools);
        (request, hidden)
    }

    /// One model call ([`Driver::complete`]) with its metrics and its GenAI span.
    async fn call_model(
        &mut self,
        request: CompletionRequest,
        hidden: Vec<HiddenTool>,
        turn: u32,
        iteration: u32,
    ) -> Result<Completed, Stop> {
        let model = &self.ctx.agent.spec.model;
        let span = crate::trace::model_call(&model.provider, &model.name, iteration);
        let model_started = std::time::Instant::now();
        let completion = self
            .complete(request, hidden, turn, iteration)
            .instrument(span.clone())
            .await;
        phrony_metrics::MODEL_CALL.observe(model_started.elapsed());
        match &completion {
            Ok(c) => crate::trace::model_usage(
                &span,
                c.record.usage.input_tokens,
                c.record.usage.output_tokens,
                &c.stop_reason,
            ),
            Err(_) => {
                phrony_metrics::MODEL_ERRORS.inc();
                crate::trace::failed(&span, "model_error");
            }
        }
        completion
    }

    async fn complete(
        &mut self,
        request: CompletionRequest,
        hidden_tools: Vec<HiddenTool>,
        turn: u32,
        iteration: u32,
    ) -> Result<Completed, Stop> {
        let started = self.ctx.now();
        let mut stream = self
            .provider
            .stream(request)
            .await
            .map_err(|e| Stop::Fail(e.to_string()))?;
        let mut text = String::new();
        let mut reasoning = Vec::new();
        let mut calls = Vec::new();
        let mut done = None;
        while let Some(item) = stream.next().await {
            match item.map_err(|e| Stop::Fail(e.to_string()))? {
                ModelEvent::TextDelta(delta) => {
                    let offset = text.len();
                    text.push_str(&delta);
                    self.ctx
                        .live
                        .record_streaming(turn, iteration, offset, &delta);
                    self.ctx.live.send_delta(crate::state::TextDelta {
                        turn,
                        iteration,
                        offset,
                        text: delta,
                    });
                }
                ModelEvent::Reasoning(block) => reasoning.push(block),
                ModelEvent::ToolCall { name, args, .. } => calls.push((name, args)),
                ModelEvent::Completed { stop_reason, usage } => {
                    done = Some((stop_reason, usage));
                }
            }
        }
        let Some((stop_reason, usage)) = done else {
            return Err(Stop::Fail(
                "the model stream ended before the completion finished".to_owned(),
            ));
        };
        let config = &self.ctx.inner.config;
        let total = calls.len();
        let calls: Vec<ToolCallRecord> = calls
            .into_iter()
            .enumerate()
            .map(|(i, (name, args))| {
                ToolCallRecord::bounded(
                    u32::try_from(i).unwrap_or(u32::MAX),
                    name,
                    args,
                    total,
                    config.max_tool_calls_per_turn,
                    config.max_tool_args_bytes,
                )
            })
            .collect();
        let duration_ms = u64::try_from((self.ctx.now() - started).num_milliseconds()).unwrap_or(0);
        let stop_reason = stop_reason.as_str().to_owned();
        Ok(Completed {
            text,
            stop_reason: stop_reason.clone(),
            tool_calls: calls.clone(),
            record: CompletionRecord {
                turn,
                iteration,
                stop_reason,
                usage,
                duration_ms,
                tool_calls: calls,
                reasoning,
                hidden_tools,
            },
        })
    }

    /// Runs the calls of `turn`'s latest completion ([`Self::run_calls`]); the result that
    /// closes the last of them also moves the session back to `running` when no limit can
    /// stop the next completion.
    async fn process_calls(
        &mut self,
        turn: u32,
        iteration: u32,
        calls: Vec<ToolCallRecord>,
    ) -> Result<(), CallStop> {
        use std::sync::atomic::Ordering::Relaxed;
        let resume = self.next_completion_unbounded(turn);
        self.ctx.resume_after_calls.store(resume, Relaxed);
        let ran = self.run_calls(turn, iteration, calls).await;
        self.ctx.resume_after_calls.store(false, Relaxed);
        ran
    }

    /// Records and resolves one completion's tool calls concurrently. The first call that
    /// fails the session or hits a limit ends the others (their dispatches are cancelled).
    async fn run_calls(
        &mut self,
        turn: u32,
        iteration: u32,
        calls: Vec<ToolCallRecord>,
    ) -> Result<(), CallStop> {
        // Recorded with their completion, or else all of them now in one transaction (a
        // session resting on approvals never has a call only its event log knows).
        let mut stored: Vec<Option<ToolInvocation>> = calls
            .iter()
            .map(|rec| {
                self.prerecorded.remove(&phrony_ledger::tool_call_id(
                    &self.ctx.session.id,
                    self.ctx.session.agent_version_id,
                    turn,
                    iteration,
                    rec.index,
                ))
            })
            .collect();
        // Calls this driver recorded with their completion moments ago: nothing refers to
        // them yet (no approval, no decision), so they need no lookup before deciding.
        let just_recorded: HashSet<String> =
            stored.iter().flatten().map(|c| c.call_id.clone()).collect();
        if stored.iter().any(Option::is_none) {
            let missing: Vec<_> = calls
                .iter()
                .zip(&stored)
                .filter(|(_, s)| s.is_none())
                .map(|(rec, _)| self.ctx.new_tool_call(turn, iteration, rec))
                .collect();
            let mut fresh = self
                .ctx
                .store()
                .record_tool_calls(missing)
                .await?
                .into_iter();
            for slot in stored.iter_mut().filter(|s| s.is_none()) {
                *slot = fresh.next();
            }
        }
        let mut recorded = Vec::with_capacity(calls.len());
        for (rec, call) in calls.iter().zip(stored) {
            let Some(call) = call else {
                return Err(CallStop::Store(crate::error::StoreError::internal(
                    "the ledger recorded fewer tool calls than it was given",
                )));
            };
            match &rec.refused {
                // A refused call gets its tool error now (again after a restart that came
                // before it was recorded); it never reaches binding, policy or a worker.
                Some(refusal) if !call.status.is_terminal() => {
                    self.ctx
                        .store()
                        .fail_tool_call(&call.call_id, &refusal.code, &refusal.message)
                        .await?;
                }
                Some(_) => {}
                None => recorded.push(call),
            }
        }
        self.ctx.notify();
        self.ctx.park.reset(recorded.len());
        let mut running: FuturesUnordered<_> = recorded
            .into_iter()
            .map(|call| {
                let ctx = Arc::clone(&self.ctx);
                let recorded = if just_recorded.contains(&call.call_id) {
                    Recorded::JustNow
                } else {
                    Recorded::Earlier
                };
                async move {
                    let result = ctx.drive_call(call, recorded).await;
                    ctx.park.call_done();
                    result
                }
            })
            .collect();
        // A call that parks or is handed off ends its future; the others run to their end
        // first, so a parked or handed-off session has nothing in flight.
        let mut parked = false;
        let mut hand_off = None;
        while let Some(result) = running.next().await {
            match result {
                Err(CallStop::Parked) => parked = true,
                Err(CallStop::HandOff(to)) => hand_off = Some(to),
                other => other?,
            }
        }
        if let Some(to) = hand_off {
            // The replica taking the session over also waits for the parked calls' approvals.
            return Err(CallStop::HandOff(to));
        }
        if parked {
            return Err(CallStop::Parked);
        }
        Ok(())
    }
}

struct Completed {
    text: String,
    stop_reason: String,
    tool_calls: Vec<ToolCallRecord>,
    record: CompletionRecord,
}

/// An event of the runtime's own checks (actor `system`).
fn system_event(turn: u32, body: EventBody) -> Result<NewEvent, StoreError> {
    let mut e = body.into_new_event("system")?;
    e.turn = Some(turn);
    Ok(e)
}

fn engine_event(turn: u32, body: EventBody) -> Result<NewEvent, StoreError> {
    let mut e = body.into_new_event("agent")?;
    e.turn = Some(turn);
    Ok(e)
}

/// Who a session's first user message is attributed to: its starter, as recorded (a session
/// recorded before attribution existed: the bare name, unverified).
pub(crate) fn starter(session: &phrony_ledger::Session) -> phrony_ledger::Attribution {
    session
        .started_by()
        .unwrap_or_else(|| session.created_by.clone().into())
}
