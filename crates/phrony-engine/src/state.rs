//! The engine's shared state, a leaf of the module graph: [`Inner`] (what every part of the
//! engine reads: store, router, providers, clock, config, the live sessions), [`Live`] (one
//! running session's in-memory side), the streamed text and the update type subscribers get.
//! The modules that act on this state (`engine`, `driver`, `calls`, `attach`, `subscribe`,
//! `timer`) import it from here, never from each other in a loop.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use phrony_dispatch::Router;
use phrony_ledger::{CommitListener, CommittedAppend, Event, SessionStatus};
use phrony_manifest::CompiledAgent;
use serde_json::Value;
use tokio::sync::{Notify, broadcast, mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::clock::Clock;
use crate::config::EngineConfig;
use crate::error::{EngineError, StoreError};
use crate::fold::Fold;
use crate::provider::ProviderFactory;
use crate::setup::PreparedAgent;
use crate::store::LedgerStore;

/// One update of a followed session.
#[derive(Debug, Clone, PartialEq)]
#[allow(
    clippy::large_enum_variant,
    reason = "almost every update is an Event; boxing it would add an allocation per event for \
              the rare, smaller text delta"
)]
pub enum SessionUpdate {
    /// An event of the session's stream, in `seq` order, none skipped.
    Event(Event),
    /// A piece of assistant text as the model streams it (best-effort: dropped for a subscriber
    /// that falls behind; the `message.assistant` event carries the full text).
    TextDelta {
        /// The turn.
        turn: u32,
        /// The completion inside the turn.
        iteration: u32,
        /// Where `text` starts in the completion's text (bytes): a subscriber that missed a
        /// delta sees a gap, one that got text another way can skip what it has.
        offset: usize,
        /// The text.
        text: String,
    },
}

pub(crate) struct Inner {
    pub(crate) store: Arc<LedgerStore>,
    pub(crate) router: Option<Router>,
    pub(crate) providers: Arc<dyn ProviderFactory>,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) config: EngineConfig,
    pub(crate) live: Mutex<HashMap<String, Arc<Live>>>,
    /// Wakes the approval timer (an approval with an expiry was opened).
    pub(crate) timer_kick: Arc<Notify>,
    /// Stops the engine's tasks (not the sessions).
    pub(crate) stop: CancellationToken,
    /// The session drivers' tasks: a graceful stop waits for them (bounded), so their spans and
    /// last writes finish before the daemon flushes its traces and closes the ledger.
    pub(crate) drivers: tokio_util::task::TaskTracker,
    /// Sessions whose driver stopped because the store was unavailable: not live, not failed,
    /// waiting for the engine's resume task to re-adopt them.
    pub(crate) suspended: Mutex<HashSet<String>>,
    /// Parked sessions being resumed right now ([`Inner::begin_unpark`]): a concurrent
    /// decision, sweep or re-check leaves them to that resume instead of loading them twice.
    pub(crate) unparking: Mutex<HashSet<String>>,
    /// Wakes the resume task (a session was suspended).
    pub(crate) resume_kick: Arc<Notify>,
    /// One permit per open approval watcher ([`crate::Engine::watch_approvals`]).
    pub(crate) approval_watchers: Arc<tokio::sync::Semaphore>,
    /// Sessions that may have to be driven again: a *parked* session (its driver unloaded
    /// while it waits for an approval, see `EngineConfig::park_approval_waits`) whose approval
    /// was decided, expired or cancelled. The engine's unpark task resumes each that is not
    /// live, not suspended and not ended.
    pub(crate) unpark: mpsc::UnboundedSender<String>,
    /// Bumped whenever a session becomes live (a parked one resumed): waiters that found no
    /// live session look again at once instead of at the next poll.
    pub(crate) registered: watch::Sender<u64>,
    /// Votes waiting for a decision of a session whose driver parked before taking it: the
    /// session's next driver answers them (`register` moves them into its `Live`).
    pub(crate) handover: Mutex<HashMap<String, Decisions>>,
    /// Agent versions compiled for driving (snapshot parsed, policies and argument schemas
    /// compiled), by version id, each with the content hash it was prepared from: a stored
    /// version never changes, so every session of it shares one. Bounded by
    /// [`PREPARED_AGENTS`].
    pub(crate) prepared: Mutex<HashMap<Uuid, (String, PreparedAgent)>>,
    /// The W3C trace context of each parked session's last `phrony.session` span, by session
    /// id: the driver that resumes the session continues that trace. In memory only (a session
    /// resumed after a restart starts a new trace); bounded by [`PARKED_TRACES`].
    pub(crate) parked_traces: Mutex<HashMap<String, BTreeMap<String, String>>>,
    /// Sessions another replica handed to this one (issue #20), with when: their drivers do
    /// not hand them off again within one lease TTL (no ping-pong on a stale handler list).
    pub(crate) handed_in: Mutex<HashMap<String, tokio::time::Instant>>,
    /// Session leases a takeover or handoff acquired for the driver it starts (issue #20), by
    /// session, with their epoch: that driver takes this lease instead of acquiring a new one
    /// (one acquisition per takeover, so writes this replica records meanwhile are fenced by
    /// the epoch the driver keeps). Taken by the session's next driver; see `lease::adopt`.
    pub(crate) adopted: Mutex<HashMap<String, u64>>,
    /// The engine's [`CommitFeed`], registered with the ledger (which holds it weakly).
    pub(crate) commit_feed: std::sync::OnceLock<Arc<dyn CommitListener>>,
}

/// Parked sessions' trace contexts [`Inner::parked_traces`] keeps; when full it starts over
/// (those sessions' resumptions start new traces).
pub(crate) const PARKED_TRACES: usize = 10_000;

/// Agent versions [`Inner::prepared`] keeps; when full it starts over (versions in use are
/// compiled again on their next session).
pub(crate) const PREPARED_AGENTS: usize = 256;

/// Votes waiting for the driver to take their approval's decision, by approval.
pub(crate) type Decisions = HashMap<Uuid, Vec<oneshot::Sender<SessionStatus>>>;

/// A claimed resume of a parked session ([`Inner::begin_unpark`]), released when dropped.
pub(crate) struct Unparking<'a> {
    inner: &'a Inner,
    session_id: String,
}

impl Drop for Unparking<'_> {
    fn drop(&mut self) {
        self.inner
            .unparking
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&self.session_id);
    }
}

/// The in-memory side of one live session (one driver).
pub(crate) struct Live {
    pub(crate) session_id: String,
    /// Fires when the session ends or the engine stops: the driver and its dispatches stop.
    pub(crate) cancel: CancellationToken,
    /// A user message was recorded.
    pub(crate) inbox: Notify,
    /// Bumped whenever one of the session's approvals may have been decided.
    pub(crate) approvals: watch::Sender<u64>,
    /// Bumped whenever the session may have changed (wakes subscriptions and waiters); what
    /// changed says whether a reader must read the store or finds the news in `recent`.
    pub(crate) changed: watch::Sender<Changes>,
    /// The session's events this process committed lately, heard from the ledger
    /// ([`CommitFeed`]): its driver and subscriptions take them from here instead of reading
    /// back what was just written.
    recent: Mutex<Recent>,
    /// Streamed model text, for subscribers (lossy). Created by the first subscriber: a
    /// broadcast channel allocates its whole ring at once, and most sessions have none.
    deltas: Mutex<Option<broadcast::Sender<TextDelta>>>,
    /// The ring size of `deltas`.
    delta_buffer: usize,
    /// The text of the completion being streamed, for clients that attach mid-completion.
    pub(crate) streaming: Mutex<StreamingText>,
    /// Turn numbering of user messages and the input block of a halted session.
    pub(crate) input: tokio::sync::Mutex<InputState>,
    /// Votes waiting for the driver to take their approval's decision
    /// ([`Live::expect_decision`]).
    decisions: Mutex<Decisions>,
    /// Child sessions its delegation calls started or supervise: stopped with it when it ends.
    children: Mutex<Vec<String>>,
    /// The epoch of the session lease its driver holds (0: none yet, or leases off): a lease
    /// renewal reporting that epoch lost stops this driver, and no other.
    pub(crate) lease_epoch: std::sync::atomic::AtomicU64,
}

/// What [`Live::changed`] counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Changes {
    /// Bumped when the store may hold news this process's commit listener did not hear:
    /// a reader that last saw another value reads the store.
    pub(crate) store: u64,
    /// Bumped when this process committed to the session (the news is in [`Live::recent`]).
    pub(crate) local: u64,
}

/// What [`Live::recent_after`] found.
#[derive(Debug)]
pub(crate) struct Held {
    /// The held events continuing the reader's position, without a gap.
    pub(crate) events: Vec<Event>,
    /// The highest `seq` this process committed to the session, as far as it heard.
    pub(crate) head: u64,
    /// When the last commit was heard.
    pub(crate) heard_at: Option<std::time::Instant>,
}

/// Events held per live session at most ([`Recent`]).
pub(crate) const RECENT_EVENTS: usize = 16;

/// Payload bytes held per live session at most ([`Recent`]).
pub(crate) const RECENT_BYTES: usize = 64 * 1024;

/// The last events this process committed to one session (at most [`RECENT_EVENTS`] events
/// and [`RECENT_BYTES`] of payload: the oldest go first), by `seq`, and the highest `seq` it
/// heard of. A part of the log, not all of it: another replica's appends are not here, and
/// events are held only from the first commit heard after the session became live. A reader
/// uses a run only when it continues the reader's own position without a gap (then the run is
/// exactly what the store held at that commit) and reads the store otherwise.
#[derive(Debug, Default)]
pub(crate) struct Recent {
    head: u64,
    /// When the last commit was heard.
    heard_at: Option<std::time::Instant>,
    /// Each event with its payload's size.
    events: BTreeMap<u64, (Event, usize)>,
    bytes: usize,
}

impl Recent {
    /// The held events after `after_seq`, without a gap (at most `limit`).
    fn after(&self, after_seq: u64, limit: usize) -> Held {
        let mut events = Vec::new();
        let mut next = after_seq.saturating_add(1);
        for (seq, (event, _)) in self.events.range(next..) {
            if *seq != next || events.len() >= limit {
                break;
            }
            events.push(event.clone());
            next = next.saturating_add(1);
        }
        Held {
            events,
            head: self.head,
            heard_at: self.heard_at,
        }
    }

    fn add(&mut self, append: CommittedAppend) {
        self.head = self.head.max(append.last_seq);
        self.heard_at = Some(std::time::Instant::now());
        for held in append.events {
            let bytes = held.payload_bytes;
            if bytes > RECENT_BYTES {
                continue;
            }
            if let Some((_, replaced)) = self.events.insert(held.event.seq, (held.event, bytes)) {
                self.bytes = self.bytes.saturating_sub(replaced);
            }
            self.bytes = self.bytes.saturating_add(bytes);
        }
        while self.events.len() > RECENT_EVENTS || self.bytes > RECENT_BYTES {
            match self.events.pop_first() {
                Some((_, (_, bytes))) => self.bytes = self.bytes.saturating_sub(bytes),
                None => break,
            }
        }
    }
}

/// The engine's commit listener: hands each live session the events this process committed
/// to it.
pub(crate) struct CommitFeed(pub(crate) std::sync::Weak<Inner>);

impl CommitListener for CommitFeed {
    fn wants(&self, stream: &str) -> bool {
        self.0
            .upgrade()
            .is_some_and(|inner| inner.live(stream).is_some())
    }

    fn committed(&self, append: CommittedAppend) {
        if let Some(live) = self
            .0
            .upgrade()
            .and_then(|inner| inner.live(&append.stream))
        {
            live.committed(append);
        }
    }
}

#[derive(Debug)]
pub(crate) struct InputState {
    /// The turn the next user message starts.
    pub(crate) next_turn: u32,
    /// The last turn the driver started (0 before the first): the user messages of the turns
    /// after it, up to `next_turn - 1`, are waiting.
    pub(crate) started_turn: u32,
    /// Why input is blocked (a limit was hit), if it is.
    pub(crate) blocked: Option<String>,
}

impl InputState {
    /// How many recorded user messages wait for their turn to start.
    pub(crate) fn queued(&self) -> u32 {
        self.next_turn
            .saturating_sub(1)
            .saturating_sub(self.started_turn)
    }
}

impl Live {
    /// The driver starts running `turn`: its user message no longer waits.
    pub(crate) async fn turn_started(&self, turn: u32) {
        let mut input = self.input.lock().await;
        input.started_turn = input.started_turn.max(turn);
    }

    /// Remembers a child session this session's calls supervise.
    pub(crate) fn add_child(&self, child_id: &str) {
        let mut children = self
            .children
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !children.iter().any(|c| c == child_id) {
            children.push(child_id.to_owned());
        }
    }

    /// The child sessions this session's calls supervised.
    pub(crate) fn children(&self) -> Vec<String> {
        self.children
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn bump_approvals(&self) {
        self.approvals.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// The session may have changed in ways only the store shows (another replica's write, an
    /// end, a lost lease): readers read the store.
    pub(crate) fn notify_changed(&self) {
        self.changed
            .send_modify(|c| c.store = c.store.wrapping_add(1));
    }

    /// This process committed a change to the session: its events are in `recent` (the commit
    /// listener put them there before the write returned), so readers wake without reading
    /// the store for it.
    pub(crate) fn notify_local(&self) {
        self.changed
            .send_modify(|c| c.local = c.local.wrapping_add(1));
    }

    fn recent(&self) -> std::sync::MutexGuard<'_, Recent> {
        self.recent
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Heard from the ledger: an append to this session committed.
    fn committed(&self, append: CommittedAppend) {
        self.recent().add(append);
        self.notify_local();
    }

    /// The events after `after_seq` this process committed and still holds, without a gap
    /// (at most `limit`), and the head it last heard of. Empty when the first of them is not
    /// held. Whatever other processes wrote is not in it: see [`Recent`].
    pub(crate) fn recent_after(&self, after_seq: u64, limit: usize) -> Held {
        self.recent().after(after_seq, limit)
    }

    /// Drops the held events (the driver waits for input: nothing reads them soon).
    pub(crate) fn forget_recent(&self) {
        let mut recent = self.recent();
        recent.events.clear();
        recent.bytes = 0;
    }

    /// Resolves with the session's status once the driver took the decision of `approval_id`
    /// ([`Live::decision_taken`]); fails if the driver stops first.
    pub(crate) fn expect_decision(&self, approval_id: Uuid) -> oneshot::Receiver<SessionStatus> {
        let (tx, rx) = oneshot::channel();
        let mut waiting = self.decisions();
        let senders = waiting.entry(approval_id).or_default();
        // Votes that did not decide it, or whose caller went away, wait no more.
        senders.retain(|s| !s.is_closed());
        senders.push(tx);
        rx
    }

    /// The driver took the decision of `approval_id`: the session is now `status`.
    pub(crate) fn decision_taken(&self, approval_id: Uuid, status: SessionStatus) {
        let senders = self.decisions().remove(&approval_id).unwrap_or_default();
        for tx in senders {
            let _ = tx.send(status);
        }
    }

    /// No decision is pending any more (the session halted, or its driver stopped): every
    /// waiting vote is answered with `status`, or (`None`) left to read the stored status.
    pub(crate) fn decisions_closed(&self, status: Option<SessionStatus>) {
        let all = std::mem::take(&mut *self.decisions());
        if let Some(status) = status {
            for tx in all.into_values().flatten() {
                let _ = tx.send(status);
            }
        }
    }

    /// The votes still waiting (their callers not gone), taken out of this `Live`.
    fn take_waiting_decisions(&self) -> Decisions {
        let mut all = std::mem::take(&mut *self.decisions());
        all.retain(|_, senders| {
            senders.retain(|s| !s.is_closed());
            !senders.is_empty()
        });
        all
    }

    fn decisions(&self) -> std::sync::MutexGuard<'_, Decisions> {
        self.decisions
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Inner {
    /// The prepared form of agent version `id` with content hash `content_hash`, whose stored
    /// snapshot `load` parses: compiled once per version and kept (an entry prepared from
    /// another content hash is replaced).
    pub(crate) fn prepare(
        &self,
        id: Uuid,
        content_hash: &str,
        load: impl FnOnce() -> Result<CompiledAgent, EngineError>,
    ) -> Result<PreparedAgent, EngineError> {
        if let Some((hash, hit)) = self.lock_prepared().get(&id)
            && hash == content_hash
        {
            return Ok(hit.clone());
        }
        let prepared = PreparedAgent::new(load()?)?;
        let mut cache = self.lock_prepared();
        if cache.len() >= PREPARED_AGENTS && !cache.contains_key(&id) {
            cache.clear();
        }
        cache.insert(id, (content_hash.to_owned(), prepared.clone()));
        Ok(prepared)
    }

    /// Agent version `id` as prepared before, if it was (and is still kept).
    pub(crate) fn prepared(&self, id: Uuid) -> Option<PreparedAgent> {
        self.lock_prepared().get(&id).map(|(_, p)| p.clone())
    }

    fn lock_prepared(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, (String, PreparedAgent)>> {
        self.prepared
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn live(&self, session_id: &str) -> Option<Arc<Live>> {
        self.live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(session_id)
            .cloned()
    }

    /// Resolves with the session's status once a driver took the decision of `approval_id`:
    /// the live driver's, or (the session not live: parked, or unloading right now) the next
    /// driver's, which takes the votes handed over at its registration. Checked under the
    /// `live` lock, so no driver can register or unload between the check and the expectation.
    pub(crate) fn expect_decision(
        &self,
        session_id: &str,
        approval_id: Uuid,
    ) -> oneshot::Receiver<SessionStatus> {
        let live = self
            .live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(entry) = live.get(session_id) {
            return entry.expect_decision(approval_id);
        }
        let (tx, rx) = oneshot::channel();
        let mut handover = self
            .handover
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let senders = handover
            .entry(session_id.to_owned())
            .or_default()
            .entry(approval_id)
            .or_default();
        senders.retain(|s| !s.is_closed());
        senders.push(tx);
        rx
    }

    /// Drops the handed-over expectations of `approval_id`: with `all`, every one (no driver
    /// will take the decision: their votes read the stored status instead of waiting), else
    /// only those whose vote went away. Nothing stays behind.
    pub(crate) fn withdraw_expectations(&self, session_id: &str, approval_id: Uuid, all: bool) {
        let _live = self
            .live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut handover = self
            .handover
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(decisions) = handover.get_mut(session_id) {
            if all {
                decisions.remove(&approval_id);
            } else if let Some(senders) = decisions.get_mut(&approval_id) {
                senders.retain(|s| !s.is_closed());
                if senders.is_empty() {
                    decisions.remove(&approval_id);
                }
            }
            if decisions.is_empty() {
                handover.remove(session_id);
            }
        }
    }

    pub(crate) fn live_count(&self) -> usize {
        self.live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// Marks a session suspended by a storage outage and wakes the resume task.
    pub(crate) fn suspend(&self, session_id: &str) {
        self.suspended
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(session_id.to_owned());
        self.resume_kick.notify_one();
    }

    pub(crate) fn suspended_ids(&self) -> HashSet<String> {
        self.suspended
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn suspended_count(&self) -> usize {
        self.suspended
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// Notes that `session_id` was handed to this replica now; forgets those older than `ttl`.
    pub(crate) fn note_handed_in(&self, session_id: &str, ttl: std::time::Duration) {
        let now = tokio::time::Instant::now();
        let mut handed = self
            .handed_in
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        handed.retain(|_, at| now.duration_since(*at) < ttl);
        handed.insert(session_id.to_owned(), now);
    }

    /// Whether `session_id` was handed to this replica within the last `ttl`.
    pub(crate) fn handed_in_within(&self, session_id: &str, ttl: std::time::Duration) -> bool {
        self.handed_in
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(session_id)
            .is_some_and(|at| at.elapsed() < ttl)
    }

    /// Claims the resume of a parked session; `None` while another caller resumes it.
    pub(crate) fn begin_unpark(&self, session_id: &str) -> Option<Unparking<'_>> {
        let claimed = self
            .unparking
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(session_id.to_owned());
        claimed.then(|| Unparking {
            inner: self,
            session_id: session_id.to_owned(),
        })
    }

    /// Leaves the lease of `session_id` a takeover (or the session's creation) acquired at
    /// `epoch` to the session's next driver.
    pub(crate) fn leave_adopted(&self, session_id: &str, epoch: u64) {
        self.adopted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(session_id.to_owned(), epoch);
    }

    /// Takes the lease a takeover left for `session_id`'s driver, if any (at most once); with
    /// `only`, only that epoch's (another one stays).
    pub(crate) fn take_adopted(&self, session_id: &str, only: Option<u64>) -> Option<u64> {
        let mut adopted = self
            .adopted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match (adopted.get(session_id), only) {
            (Some(&epoch), Some(only)) if epoch != only => None,
            (Some(_), _) => adopted.remove(session_id),
            (None, _) => None,
        }
    }

    /// Whether a session is suspended by a storage outage.
    pub(crate) fn is_suspended(&self, session_id: &str) -> bool {
        self.suspended
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(session_id)
    }

    /// After a recovery round: a suspended session that is live again, or has ended, is no
    /// longer suspended. The others (not resumed: the store failed again) stay.
    pub(crate) async fn settle_suspended(&self) {
        for id in self.suspended_ids() {
            let done = self.live(&id).is_some()
                || self
                    .store
                    .get_session(&id)
                    .await
                    .is_ok_and(|s| s.status.is_terminal());
            if done {
                self.suspended
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .remove(&id);
            }
        }
    }

    /// One of the session's approvals may have changed: its live driver re-reads them, and a
    /// parked session is handed to the unpark task.
    pub(crate) fn wake_approvals(&self, session_id: &str) {
        if let Some(live) = self.live(session_id) {
            live.bump_approvals();
            live.notify_changed();
        } else {
            self.request_unpark(session_id);
        }
    }

    /// Asks the unpark task to drive `session_id` again if it is parked.
    pub(crate) fn request_unpark(&self, session_id: &str) {
        // The receiver lives as long as the engine's tasks; after a shutdown nothing resumes.
        let _ = self.unpark.send(session_id.to_owned());
    }

    /// Registers a live session whose next user message starts `next_turn` and whose last
    /// started turn is `started_turn`; `None` if one is already live.
    pub(crate) fn register(
        &self,
        session_id: &str,
        next_turn: u32,
        started_turn: u32,
    ) -> Option<Arc<Live>> {
        let mut live = self
            .live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if live.contains_key(session_id) {
            return None;
        }
        let (approvals, _) = watch::channel(0);
        let (changed, _) = watch::channel(Changes::default());
        let entry = Arc::new(Live {
            session_id: session_id.to_owned(),
            cancel: self.stop.child_token(),
            inbox: Notify::new(),
            approvals,
            changed,
            recent: Mutex::new(Recent::default()),
            deltas: Mutex::new(None),
            delta_buffer: self.config.subscription_buffer.max(16),
            streaming: Mutex::new(StreamingText::default()),
            input: tokio::sync::Mutex::new(InputState {
                next_turn,
                started_turn,
                blocked: None,
            }),
            decisions: Mutex::new(
                self.handover
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .remove(session_id)
                    .unwrap_or_default(),
            ),
            children: Mutex::new(Vec::new()),
            lease_epoch: std::sync::atomic::AtomicU64::new(0),
        });
        live.insert(session_id.to_owned(), Arc::clone(&entry));
        drop(live);
        self.registered.send_modify(|v| *v = v.wrapping_add(1));
        Some(entry)
    }

    /// Removes a live session's entry (if it is still `entry`). A parked driver hands the votes
    /// waiting for its decisions to the session's next driver; otherwise they read the stored
    /// status.
    /// Keeps a parking session's trace context (empty: no trace exported) for its next driver.
    pub(crate) fn park_trace(&self, session_id: &str, context: BTreeMap<String, String>) {
        if context.is_empty() {
            return;
        }
        let mut traces = self
            .parked_traces
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if traces.len() >= PARKED_TRACES {
            traces.clear();
        }
        traces.insert(session_id.to_owned(), context);
    }

    /// The trace context a parked session left ([`Inner::park_trace`]), taken.
    pub(crate) fn take_parked_trace(&self, session_id: &str) -> Option<BTreeMap<String, String>> {
        self.parked_traces
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(session_id)
    }

    pub(crate) fn unregister(&self, entry: &Arc<Live>, parked: bool) {
        {
            let mut live = self
                .live
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if live
                .get(&entry.session_id)
                .is_some_and(|e| Arc::ptr_eq(e, entry))
            {
                live.remove(&entry.session_id);
            }
            // Under the `live` lock, so a driver registering now finds them.
            if parked {
                let waiting = entry.take_waiting_decisions();
                let mut handover = self
                    .handover
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                handover.retain(|_, d| {
                    d.retain(|_, senders| {
                        senders.retain(|s| !s.is_closed());
                        !senders.is_empty()
                    });
                    !d.is_empty()
                });
                if !waiting.is_empty() {
                    handover
                        .entry(entry.session_id.clone())
                        .or_default()
                        .extend(waiting);
                }
            }
        }
        entry.decisions_closed(None);
        entry.notify_changed();
    }

    /// Stops the drivers of the sessions among `session_ids` that the store has already ended
    /// (their dispatches are cancelled, their waits woken); live sessions still running in the
    /// store are left alone.
    pub(crate) async fn stop_ended(&self, session_ids: &[String]) -> Result<(), StoreError> {
        for id in session_ids {
            let Some(live) = self.live(id) else {
                continue;
            };
            if self.store.get_session(id).await?.status.is_terminal() {
                live.cancel.cancel();
                live.bump_approvals();
                live.notify_changed();
            }
        }
        Ok(())
    }

    /// Reads a session's whole stream into a fold.
    pub(crate) async fn fold(&self, session_id: &str) -> Result<Fold, EngineError> {
        let mut fold = Fold::default();
        loop {
            let page = self
                .store
                .events_after(session_id, fold.last_seq(), 500)
                .await?;
            if page.is_empty() {
                return Ok(fold);
            }
            for event in &page {
                fold.apply(event)?;
            }
        }
    }
}

/// The first user message of a session input (§5.5): `message`, else `text` (both must be
/// strings), else the whole object's JSON text; `{}` has none.
pub(crate) fn first_user_message(input: &Value) -> Result<Option<String>, EngineError> {
    let Value::Object(map) = input else {
        return Err(EngineError::invalid("input must be a JSON object"));
    };
    for key in ["message", "text"] {
        match map.get(key) {
            Some(Value::String(s)) => return Ok(Some(s.clone())),
            Some(_) => {
                return Err(EngineError::invalid(format!(
                    "input.{key} must be a string"
                )));
            }
            None => {}
        }
    }
    if map.is_empty() {
        Ok(None)
    } else {
        Ok(Some(input.to_string()))
    }
}

/// The text of the completion a live session is streaming.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct StreamingText {
    pub(crate) turn: u32,
    pub(crate) iteration: u32,
    pub(crate) text: String,
}

/// A piece of streamed model text on its way to subscribers ([`SessionUpdate::TextDelta`]
/// without the event variant's size in every slot of the ring).
#[derive(Debug, Clone)]
pub(crate) struct TextDelta {
    pub(crate) turn: u32,
    pub(crate) iteration: u32,
    pub(crate) offset: usize,
    pub(crate) text: String,
}

impl From<TextDelta> for SessionUpdate {
    fn from(d: TextDelta) -> Self {
        SessionUpdate::TextDelta {
            turn: d.turn,
            iteration: d.iteration,
            offset: d.offset,
            text: d.text,
        }
    }
}

impl Live {
    /// Follows the streamed text from now on.
    pub(crate) fn subscribe_deltas(&self) -> broadcast::Receiver<TextDelta> {
        let mut deltas = self
            .deltas
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match deltas.as_ref() {
            Some(tx) => tx.subscribe(),
            None => {
                let (tx, rx) = broadcast::channel(self.delta_buffer);
                *deltas = Some(tx);
                rx
            }
        }
    }

    /// Sends a streamed delta to the subscribers, if there are any.
    pub(crate) fn send_delta(&self, delta: TextDelta) {
        let deltas = self
            .deltas
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(tx) = deltas.as_ref()
            && tx.receiver_count() > 0
        {
            let _ = tx.send(delta);
        }
    }

    /// Records a streamed delta (`offset` = where it starts in the completion's text).
    pub(crate) fn record_streaming(&self, turn: u32, iteration: u32, offset: usize, delta: &str) {
        let mut s = self
            .streaming
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if s.turn != turn || s.iteration != iteration || offset == 0 {
            *s = StreamingText {
                turn,
                iteration,
                text: String::new(),
            };
        }
        if s.text.len() == offset {
            s.text.push_str(delta);
        }
    }

    pub(crate) fn streaming_text(&self) -> StreamingText {
        self.streaming
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use phrony_ledger::{CommittedAppend, CommittedEvent, Event};

    use super::{RECENT_BYTES, RECENT_EVENTS, Recent};

    fn event(seq: u64) -> Event {
        Event {
            stream: "run_1".to_owned(),
            seq,
            event_type: "message.user".to_owned(),
            ts: chrono::Utc::now(),
            actor: "user".to_owned(),
            actor_verification: None,
            actor_via: None,
            call_id: None,
            turn: None,
            payload: serde_json::json!({"n": seq}),
            prev_hash: String::new(),
            hash: String::new(),
        }
    }

    fn append(last_seq: u64, held: &[(u64, usize)]) -> CommittedAppend {
        CommittedAppend {
            stream: "run_1".to_owned(),
            last_seq,
            events: held
                .iter()
                .map(|&(seq, payload_bytes)| CommittedEvent {
                    event: event(seq),
                    payload_bytes,
                })
                .collect(),
        }
    }

    fn seqs(recent: &Recent, after: u64) -> Vec<u64> {
        recent
            .after(after, 100)
            .events
            .iter()
            .map(|e| e.seq)
            .collect()
    }

    #[test]
    fn a_run_is_served_only_from_the_readers_next_seq_and_up_to_a_gap() {
        let mut recent = Recent::default();
        // Heard out of order (two writers), and with 4 not handed over (too large).
        recent.add(append(3, &[(3, 10)]));
        recent.add(append(2, &[(2, 10)]));
        recent.add(append(5, &[(5, 10)]));
        assert_eq!(recent.after(0, 100).head, 5);
        assert_eq!(seqs(&recent, 0), Vec::<u64>::new(), "1 is not held");
        assert_eq!(seqs(&recent, 1), [2, 3], "up to the gap at 4");
        assert_eq!(seqs(&recent, 3), Vec::<u64>::new());
        assert_eq!(seqs(&recent, 4), [5]);
        assert_eq!(recent.after(1, 1).events.len(), 1, "the limit");
    }

    #[test]
    fn what_is_held_is_bounded_by_count_and_bytes() {
        let mut recent = Recent::default();
        for seq in 1..=40 {
            recent.add(append(seq, &[(seq, 10)]));
        }
        assert_eq!(recent.events.len(), RECENT_EVENTS);
        assert_eq!(
            seqs(&recent, 40 - RECENT_EVENTS as u64).len(),
            RECENT_EVENTS
        );
        // Bytes: the oldest go first; one larger than the whole budget is not kept.
        let half = RECENT_BYTES / 2;
        recent.add(append(41, &[(41, half)]));
        recent.add(append(42, &[(42, half)]));
        assert!(recent.bytes <= RECENT_BYTES, "{}", recent.bytes);
        assert_eq!(seqs(&recent, 40), [41, 42]);
        assert_eq!(seqs(&recent, 39), Vec::<u64>::new(), "40 went");
        recent.add(append(43, &[(43, RECENT_BYTES + 1)]));
        assert_eq!(recent.after(42, 100).head, 43);
        assert_eq!(seqs(&recent, 42), Vec::<u64>::new());
    }
}
