//! The router's shared state and every transition on it. All transitions run under one
//! mutex and never await; events for the observer are collected and emitted after the lock
//! is released.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::ack::AckHandle;
use crate::allowlist::{Allowlist, IntegrityViolation, WorkerClaims};
use crate::config::RouterConfig;
use crate::error::{DispatchError, DispatchFailure, WorkerLost};
use crate::hooks::{
    AbandonReason, CompletedCalls, LateOutcome, LateReason, LateResult, RouterEvent, RouterObserver,
};
use crate::snapshot::{HandlerSnapshot, QueueSnapshot, RouterSnapshot, WorkerSnapshot};
use crate::types::{HandlerAd, Invocation, ToWorker, ToolError, ToolOutcome, WorkerProvenance};

/// Where a connection's termination reason is published for its [`crate::Outbox`].
pub(crate) type CloseSlot = OnceLock<DispatchError>;

/// Messages from the router to one dispatch attempt.
#[derive(Debug)]
pub(crate) enum CallEvent {
    /// A handler slot on this worker is reserved; send the invoke.
    Reserved(WorkerProvenance),
    /// The dispatched call ended.
    Resolved(Resolution),
    /// The queued call was failed by the router (shutdown).
    Failed(DispatchFailure),
}

/// How a reserved or dispatched call ended.
#[derive(Debug)]
pub(crate) enum Resolution {
    Result {
        outcome: ToolOutcome,
        ack: AckHandle,
    },
    Nack(ToolError),
    /// The worker was dropped. Before the invoke was sent this only means "try again".
    Lost(WorkerLost),
}

/// The result of admitting a dispatch attempt.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Admission {
    /// A slot is reserved; the `Reserved` event is in the channel.
    Reserved,
    /// The call waits in the key's queue.
    Queued,
    /// A nack retry found no other eligible worker.
    NoAlternative,
}

/// A worker answer to a call.
#[derive(Debug)]
pub(crate) enum Answer {
    Result(ToolOutcome),
    Nack(ToolError),
}

/// What an attempt asks the router for.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request<'a> {
    pub(crate) call_id: &'a str,
    pub(crate) key: &'a str,
    pub(crate) agent: &'a str,
    pub(crate) tool: &'a str,
    pub(crate) version: &'a str,
    pub(crate) excluded: &'a [String],
    /// The calling agent version's descriptor pin: only workers advertising it (or no hash).
    pub(crate) pin: Option<&'a str>,
}

#[derive(Debug)]
struct WorkerEntry {
    conn: u64,
    workload_identity: String,
    image_digest: String,
    /// Advertised handlers in advertisement order.
    handlers: Vec<(String, HandlerAd)>,
    busy: HashMap<String, u32>,
    lease_expires: Instant,
    last_used: u64,
    outbox: mpsc::Sender<ToWorker>,
    close: Arc<CloseSlot>,
}

impl WorkerEntry {
    fn handler(&self, key: &str) -> Option<&HandlerAd> {
        self.handlers
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, ad)| ad)
    }

    fn busy(&self, key: &str) -> u32 {
        self.busy.get(key).copied().unwrap_or(0)
    }

    fn provenance(&self, worker_id: &str, key: &str) -> WorkerProvenance {
        let ad = self.handler(key);
        WorkerProvenance {
            worker_id: worker_id.to_owned(),
            workload_identity: self.workload_identity.clone(),
            image_digest: self.image_digest.clone(),
            descriptor_hash: ad.map(|a| a.descriptor_hash.clone()).unwrap_or_default(),
            contract_version: ad.map(|a| a.contract_version.clone()).unwrap_or_default(),
        }
    }
}

#[derive(Debug)]
enum CallState {
    Reserved {
        events: mpsc::UnboundedSender<CallEvent>,
    },
    Active {
        events: mpsc::UnboundedSender<CallEvent>,
    },
    Abandoned {
        since: Instant,
        reason: AbandonReason,
    },
}

#[derive(Debug)]
struct CallEntry {
    key: String,
    worker_id: String,
    token: u64,
    state: CallState,
}

#[derive(Debug)]
struct Waiter {
    token: u64,
    call_id: String,
    agent: String,
    tool: String,
    version: String,
    excluded: Vec<String>,
    pin: Option<String>,
    events: mpsc::UnboundedSender<CallEvent>,
}

/// Everything behind the lock.
#[derive(Debug, Default)]
pub(crate) struct State {
    shutting_down: bool,
    seq: u64,
    workers: HashMap<String, WorkerEntry>,
    /// Reserved, dispatched and abandoned calls by call id.
    calls: HashMap<String, CallEntry>,
    /// Results handed to a caller whose ack is pending: call id → (worker, liveness).
    awaiting_ack: HashMap<String, (String, Weak<()>)>,
    awaiting_prune_at: usize,
    queues: HashMap<String, VecDeque<Waiter>>,
    /// Queued call ids → attempt token.
    queued: HashMap<String, u64>,
    events: Vec<RouterEvent>,
}

impl State {
    fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }
}

/// The result of looking for a worker.
enum Pick {
    Worker(String),
    Busy,
    NoAdvertiser,
    Integrity(IntegrityViolation),
    /// Only workers advertising another descriptor hash than the call's pin serve the key
    /// (one of their hashes).
    Mismatch(String),
}

/// The router's shared core.
pub(crate) struct Inner {
    pub(crate) config: RouterConfig,
    allowlist: Option<Allowlist>,
    observer: Option<Arc<dyn RouterObserver>>,
    pub(crate) completed: Option<Arc<dyn CompletedCalls>>,
    state: Mutex<State>,
    pub(crate) reaper_wake: Arc<Notify>,
    pub(crate) stop: CancellationToken,
    weak: Weak<Inner>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn now_unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn duration_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl Inner {
    pub(crate) fn new(
        config: RouterConfig,
        allowlist: Option<Allowlist>,
        observer: Option<Arc<dyn RouterObserver>>,
        completed: Option<Arc<dyn CompletedCalls>>,
    ) -> Arc<Self> {
        let allowlist = allowlist.filter(|a| !a.is_empty());
        Arc::new_cyclic(|weak| Self {
            config,
            allowlist,
            observer,
            completed,
            state: Mutex::new(State {
                awaiting_prune_at: 64,
                ..State::default()
            }),
            reaper_wake: Arc::new(Notify::new()),
            stop: CancellationToken::new(),
            weak: weak.clone(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave a half-applied transition that is worse
        // than refusing all further work, so keep serving.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` under the lock, then emits the events it produced.
    fn with_state<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let (result, events) = {
            let mut st = self.lock();
            let result = f(&mut st);
            (result, std::mem::take(&mut st.events))
        };
        self.emit(events);
        result
    }

    pub(crate) fn emit(&self, events: Vec<RouterEvent>) {
        for event in events {
            match &self.observer {
                Some(observer) => observer.on_event(event),
                None => {
                    if let RouterEvent::LateResult(late) = event {
                        late.ack.ack();
                    }
                }
            }
        }
    }

    // ---------------------------------------------------------------- registration

    pub(crate) fn is_shutting_down(&self) -> bool {
        self.lock().shutting_down
    }

    /// Registers a validated hello; returns the connection id, the outbox receiver and the
    /// close slot.
    pub(crate) fn register(
        &self,
        hello: crate::types::WorkerHello,
        completed: &HashSet<String>,
    ) -> Result<(u64, mpsc::Receiver<ToWorker>, Arc<CloseSlot>), DispatchError> {
        let result = self.with_state(|st| {
            if st.shutting_down {
                return Err(DispatchError::ShuttingDown);
            }
            let now = Instant::now();
            let conn = st.next_seq();
            let (tx, rx) = mpsc::channel(self.config.outbox_capacity);
            let close = Arc::new(CloseSlot::new());
            let worker_id = hello.worker_id;
            if tx
                .try_send(ToWorker::Registered {
                    worker_id: worker_id.clone(),
                    lease_ttl_ms: self.config.lease_ttl_ms(),
                })
                .is_err()
            {
                // A fresh channel with capacity ≥ 16 always has room.
                return Err(DispatchError::UnknownWorker { worker_id });
            }
            let in_flight: HashSet<&str> = hello.in_flight.iter().map(String::as_str).collect();

            let replaced = st.workers.contains_key(&worker_id);
            let mut reattached: Vec<String> = Vec::new();
            if replaced {
                reattached = st
                    .calls
                    .iter()
                    .filter(|(id, c)| {
                        c.worker_id == worker_id
                            && in_flight.contains(id.as_str())
                            && !matches!(c.state, CallState::Reserved { .. })
                    })
                    .map(|(id, _)| id.clone())
                    .collect();
                reattached.sort();
                let keep: HashSet<String> = reattached.iter().cloned().collect();
                self.remove_worker(
                    st,
                    &worker_id,
                    WorkerLost::Replaced,
                    Some(DispatchError::Superseded {
                        worker_id: worker_id.clone(),
                    }),
                    &keep,
                );
            }

            let mut busy: HashMap<String, u32> = HashMap::new();
            for id in &reattached {
                if let Some(call) = st.calls.get(id) {
                    *busy.entry(call.key.clone()).or_default() += 1;
                }
            }
            let handlers: Vec<(String, HandlerAd)> = hello
                .handlers
                .into_iter()
                .map(|ad| (ad.key(), ad))
                .collect();
            let keys: Vec<String> = handlers.iter().map(|(k, _)| k.clone()).collect();
            let mut entry = WorkerEntry {
                conn,
                workload_identity: hello.workload_identity,
                image_digest: hello.image_digest,
                handlers,
                busy,
                lease_expires: now + self.config.lease_ttl,
                last_used: 0,
                outbox: tx,
                close: Arc::clone(&close),
            };

            // Acknowledge in-flight calls whose results are already recorded.
            let mut acknowledged = Vec::new();
            let mut seen = HashSet::new();
            for call_id in &hello.in_flight {
                if !completed.contains(call_id) || !seen.insert(call_id.as_str()) {
                    continue;
                }
                match st.calls.get(call_id) {
                    Some(call) if call.worker_id != worker_id => continue,
                    Some(call) if !matches!(call.state, CallState::Abandoned { .. }) => continue,
                    Some(call) => {
                        // An abandoned call whose outcome the runtime already recorded: the
                        // worker forgets it, so its slot is free again.
                        let key = call.key.clone();
                        st.calls.remove(call_id);
                        if let Some(n) = entry.busy.get_mut(&key) {
                            *n = n.saturating_sub(1);
                        }
                    }
                    None => {}
                }
                if entry
                    .outbox
                    .try_send(ToWorker::ResultAck {
                        call_id: call_id.clone(),
                    })
                    .is_ok()
                {
                    acknowledged.push(call_id.clone());
                }
            }

            tracing::info!(
                worker_id = %worker_id,
                handlers = ?keys,
                replaced,
                reattached = reattached.len(),
                acknowledged = acknowledged.len(),
                "tool worker registered"
            );
            st.workers.insert(worker_id.clone(), entry);
            for key in &keys {
                self.drain(st, key);
            }
            st.events.push(RouterEvent::WorkerRegistered {
                worker_id,
                replaced,
                reattached,
                acknowledged,
            });
            Ok((conn, rx, close))
        });
        self.reaper_wake.notify_one();
        result
    }

    /// Drops a worker: its dispatched calls become indeterminate (except those in `keep`,
    /// which stay attached to the worker id), reserved calls are told to try again, and its
    /// outbox closes with `close` as the stream's final status.
    fn remove_worker(
        &self,
        st: &mut State,
        worker_id: &str,
        reason: WorkerLost,
        close: Option<DispatchError>,
        keep: &HashSet<String>,
    ) {
        let Some(worker) = st.workers.remove(worker_id) else {
            return;
        };
        if let Some(close) = close {
            let _ = worker.close.set(close);
        }
        let owned: Vec<String> = st
            .calls
            .iter()
            .filter(|(id, c)| c.worker_id == worker_id && !keep.contains(*id))
            .map(|(id, _)| id.clone())
            .collect();
        let mut indeterminate = Vec::new();
        for id in owned {
            let Some(call) = st.calls.remove(&id) else {
                continue;
            };
            match call.state {
                CallState::Reserved { events } => {
                    let _ = events.send(CallEvent::Resolved(Resolution::Lost(reason)));
                }
                CallState::Active { events } => {
                    let _ = events.send(CallEvent::Resolved(Resolution::Lost(reason)));
                    indeterminate.push(id);
                }
                CallState::Abandoned { .. } => {}
            }
        }
        indeterminate.sort();
        match reason {
            WorkerLost::StreamEnded | WorkerLost::Replaced => tracing::info!(
                worker_id,
                reason = reason.as_str(),
                indeterminate = indeterminate.len(),
                "tool worker removed"
            ),
            WorkerLost::LeaseExpired | WorkerLost::Unresponsive => tracing::warn!(
                worker_id,
                reason = reason.as_str(),
                indeterminate = indeterminate.len(),
                "tool worker removed"
            ),
        }
        st.events.push(RouterEvent::WorkerRemoved {
            worker_id: worker_id.to_owned(),
            reason,
            indeterminate,
        });
        drop(worker);
    }

    /// The connection's stream ended.
    pub(crate) fn disconnect(&self, worker_id: &str, conn: u64) {
        self.with_state(|st| {
            if st.workers.get(worker_id).is_some_and(|w| w.conn == conn) {
                self.remove_worker(
                    st,
                    worker_id,
                    WorkerLost::StreamEnded,
                    None,
                    &HashSet::new(),
                );
            }
        });
    }

    /// Queues `msg` on the worker's outbox; a full or closed outbox drops the worker.
    fn send(&self, st: &mut State, worker_id: &str, msg: ToWorker) -> bool {
        let Some(worker) = st.workers.get(worker_id) else {
            return false;
        };
        match worker.outbox.try_send(msg) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                let capacity = self.config.outbox_capacity;
                self.remove_worker(
                    st,
                    worker_id,
                    WorkerLost::Unresponsive,
                    Some(DispatchError::OutboxOverflow {
                        worker_id: worker_id.to_owned(),
                        capacity,
                    }),
                    &HashSet::new(),
                );
                false
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                self.remove_worker(
                    st,
                    worker_id,
                    WorkerLost::StreamEnded,
                    None,
                    &HashSet::new(),
                );
                false
            }
        }
    }

    // ---------------------------------------------------------------- worker messages

    /// Handles a message of connection `conn`; `f` runs only while it is the registered one.
    fn on_connection<R>(
        &self,
        worker_id: &str,
        conn: u64,
        close: &CloseSlot,
        f: impl FnOnce(&Self, &mut State) -> R,
    ) -> Result<R, DispatchError> {
        let gone = || {
            close
                .get()
                .cloned()
                .unwrap_or_else(|| DispatchError::UnknownWorker {
                    worker_id: worker_id.to_owned(),
                })
        };
        self.with_state(|st| {
            let Some(worker) = st.workers.get_mut(worker_id).filter(|w| w.conn == conn) else {
                return Err(gone());
            };
            // Any message proves the worker alive.
            worker.lease_expires = Instant::now() + self.config.lease_ttl;
            let result = f(self, st);
            if st.workers.get(worker_id).is_some_and(|w| w.conn == conn) {
                Ok(result)
            } else {
                Err(gone())
            }
        })
    }

    pub(crate) fn heartbeat(
        &self,
        worker_id: &str,
        conn: u64,
        close: &CloseSlot,
    ) -> Result<(), DispatchError> {
        self.on_connection(worker_id, conn, close, |inner, st| {
            inner.send(st, worker_id, ToWorker::HeartbeatAck);
        })
    }

    pub(crate) fn answer(
        &self,
        worker_id: &str,
        conn: u64,
        close: &CloseSlot,
        call_id: String,
        answer: Answer,
    ) -> Result<(), DispatchError> {
        self.on_connection(worker_id, conn, close, |inner, st| {
            inner.apply_answer(st, worker_id, call_id, answer);
        })
    }

    fn apply_answer(&self, st: &mut State, worker_id: &str, call_id: String, answer: Answer) {
        let Some(call) = st.calls.get(&call_id) else {
            if matches!(answer, Answer::Result(_))
                && st
                    .awaiting_ack
                    .get(&call_id)
                    .is_some_and(|(_, live)| live.strong_count() > 0)
            {
                tracing::debug!(
                    worker_id,
                    call_id,
                    "duplicate result while its ack is pending"
                );
                return;
            }
            self.push_late(st, worker_id, call_id, answer, LateReason::Unknown);
            return;
        };
        if call.worker_id != worker_id {
            tracing::warn!(
                worker_id,
                call_id,
                owner = %call.worker_id,
                "ignoring an answer for a call owned by another worker"
            );
            st.events.push(RouterEvent::ForeignResult {
                worker_id: worker_id.to_owned(),
                owner: call.worker_id.clone(),
                call_id,
            });
            return;
        }
        if matches!(call.state, CallState::Reserved { .. }) {
            // The invoke for this attempt was not sent yet: the answer belongs to an older
            // attempt the router no longer tracks.
            self.push_late(st, worker_id, call_id, answer, LateReason::Unknown);
            return;
        }
        let Some(call) = st.calls.remove(&call_id) else {
            return;
        };
        self.release_slot(st, &call.worker_id, &call.key);
        match call.state {
            CallState::Active { events } => match answer {
                Answer::Result(outcome) => {
                    let live = Arc::new(());
                    self.track_ack(st, &call_id, worker_id, &live);
                    let ack = AckHandle::new(
                        self.weak.clone(),
                        call_id.clone(),
                        worker_id.to_owned(),
                        Some(live),
                    );
                    let resolved = CallEvent::Resolved(Resolution::Result { outcome, ack });
                    if let Err(mpsc::error::SendError(CallEvent::Resolved(Resolution::Result {
                        outcome,
                        ack,
                    }))) = events.send(resolved)
                    {
                        st.events.push(RouterEvent::LateResult(LateResult {
                            worker_id: worker_id.to_owned(),
                            call_id: call_id.clone(),
                            outcome: LateOutcome::Result(outcome),
                            reason: LateReason::Abandoned(AbandonReason::CallerGone),
                            ack,
                        }));
                    }
                }
                Answer::Nack(error) => {
                    if events
                        .send(CallEvent::Resolved(Resolution::Nack(error.clone())))
                        .is_err()
                    {
                        self.push_late(
                            st,
                            worker_id,
                            call_id.clone(),
                            Answer::Nack(error),
                            LateReason::Abandoned(AbandonReason::CallerGone),
                        );
                    }
                }
            },
            CallState::Abandoned { reason, .. } => {
                self.push_late(
                    st,
                    worker_id,
                    call_id.clone(),
                    answer,
                    LateReason::Abandoned(reason),
                );
            }
            CallState::Reserved { .. } => {}
        }
        self.drain(st, &call.key);
    }

    fn push_late(
        &self,
        st: &mut State,
        worker_id: &str,
        call_id: String,
        answer: Answer,
        reason: LateReason,
    ) {
        tracing::info!(worker_id, call_id, ?reason, "late tool result");
        let outcome = match answer {
            Answer::Result(outcome) => LateOutcome::Result(outcome),
            Answer::Nack(error) => LateOutcome::Nack(error),
        };
        let ack = AckHandle::new(
            self.weak.clone(),
            call_id.clone(),
            worker_id.to_owned(),
            None,
        );
        st.events.push(RouterEvent::LateResult(LateResult {
            worker_id: worker_id.to_owned(),
            call_id,
            outcome,
            reason,
            ack,
        }));
    }

    fn track_ack(&self, st: &mut State, call_id: &str, worker_id: &str, live: &Arc<()>) {
        if st.awaiting_ack.len() >= st.awaiting_prune_at {
            st.awaiting_ack
                .retain(|_, (_, live)| live.strong_count() > 0);
            st.awaiting_prune_at = (st.awaiting_ack.len() * 2).max(64);
        }
        st.awaiting_ack.insert(
            call_id.to_owned(),
            (worker_id.to_owned(), Arc::downgrade(live)),
        );
    }

    pub(crate) fn send_result_ack(
        &self,
        call_id: &str,
        worker_id: &str,
        live: Option<&Arc<()>>,
    ) -> bool {
        self.with_state(|st| {
            if let Some(live) = live
                && st
                    .awaiting_ack
                    .get(call_id)
                    .is_some_and(|(_, w)| w.ptr_eq(&Arc::downgrade(live)))
            {
                st.awaiting_ack.remove(call_id);
            }
            self.send(
                st,
                worker_id,
                ToWorker::ResultAck {
                    call_id: call_id.to_owned(),
                },
            )
        })
    }

    fn release_slot(&self, st: &mut State, worker_id: &str, key: &str) {
        if let Some(worker) = st.workers.get_mut(worker_id)
            && let Some(n) = worker.busy.get_mut(key)
        {
            *n = n.saturating_sub(1);
        }
    }

    // ---------------------------------------------------------------- routing

    fn pick(&self, st: &State, now: Instant, req: &Request<'_>) -> Pick {
        let mut advertised = false;
        let mut violation: Option<(u64, IntegrityViolation)> = None;
        let mut full = false;
        let mut mismatch: Option<(u64, &str)> = None;
        let mut best: Option<((u32, u64, u64), &String)> = None;
        for (id, worker) in &st.workers {
            if worker.lease_expires <= now || req.excluded.contains(id) {
                continue;
            }
            let Some(ad) = worker.handler(req.key) else {
                continue;
            };
            if let Some(pin) = req.pin
                && !ad.descriptor_hash.is_empty()
                && ad.descriptor_hash != pin
            {
                if mismatch.is_none_or(|(conn, _)| worker.conn < conn) {
                    mismatch = Some((worker.conn, &ad.descriptor_hash));
                }
                continue;
            }
            advertised = true;
            if let Some(allowlist) = &self.allowlist {
                let claims = WorkerClaims {
                    workload_identity: &worker.workload_identity,
                    image_digest: &worker.image_digest,
                    contract_version: &ad.contract_version,
                };
                if let Err(v) = allowlist.check(req.agent, req.tool, req.version, claims) {
                    if violation
                        .as_ref()
                        .is_none_or(|(conn, _)| worker.conn < *conn)
                    {
                        violation = Some((worker.conn, v));
                    }
                    continue;
                }
            }
            let busy = worker.busy(req.key);
            if busy >= ad.effective_max_concurrency() {
                full = true;
                continue;
            }
            let rank = (busy, worker.last_used, worker.conn);
            if best.as_ref().is_none_or(|(r, _)| rank < *r) {
                best = Some((rank, id));
            }
        }
        match (best, full, violation) {
            (Some((_, id)), _, _) => Pick::Worker(id.clone()),
            (None, true, _) => Pick::Busy,
            (None, false, Some((_, v))) => Pick::Integrity(v),
            (None, false, None) if advertised => Pick::Busy,
            (None, false, None) => match mismatch {
                Some((_, hash)) => Pick::Mismatch(hash.to_owned()),
                None => Pick::NoAdvertiser,
            },
        }
    }

    /// Reserves a slot on `worker_id` for `call_id` and tells the attempt.
    fn reserve(
        &self,
        st: &mut State,
        worker_id: &str,
        call_id: &str,
        key: &str,
        token: u64,
        events: mpsc::UnboundedSender<CallEvent>,
    ) {
        let stamp = st.next_seq();
        let Some(worker) = st.workers.get_mut(worker_id) else {
            return;
        };
        *worker.busy.entry(key.to_owned()).or_default() += 1;
        worker.last_used = stamp;
        let provenance = worker.provenance(worker_id, key);
        let _ = events.send(CallEvent::Reserved(provenance));
        st.calls.insert(
            call_id.to_owned(),
            CallEntry {
                key: key.to_owned(),
                worker_id: worker_id.to_owned(),
                token,
                state: CallState::Reserved { events },
            },
        );
    }

    /// Admits one dispatch attempt: reserves a slot now or queues it.
    pub(crate) fn admit(
        &self,
        req: &Request<'_>,
        retry: bool,
        events: mpsc::UnboundedSender<CallEvent>,
    ) -> Result<(u64, Admission), DispatchFailure> {
        self.with_state(|st| {
            if st.shutting_down {
                return Err(DispatchFailure::ShuttingDown);
            }
            if st.queued.contains_key(req.call_id) {
                return Err(DispatchFailure::AlreadyInFlight {
                    call_id: req.call_id.to_owned(),
                });
            }
            if let Some(call) = st.calls.get(req.call_id) {
                if !matches!(call.state, CallState::Abandoned { .. }) {
                    return Err(DispatchFailure::AlreadyInFlight {
                        call_id: req.call_id.to_owned(),
                    });
                }
                // A new attempt of an abandoned call (e.g. re-dispatch after an approval):
                // stop holding the old attempt's slot.
                if let Some(old) = st.calls.remove(req.call_id) {
                    self.release_slot(st, &old.worker_id, &old.key);
                    self.drain(st, &old.key);
                }
            }
            let token = st.next_seq();
            let now = Instant::now();
            match self.pick(st, now, req) {
                Pick::Worker(worker_id) => {
                    self.reserve(st, &worker_id, req.call_id, req.key, token, events);
                    return Ok((token, Admission::Reserved));
                }
                Pick::Integrity(_) | Pick::NoAdvertiser | Pick::Mismatch(_) if retry => {
                    return Ok((token, Admission::NoAlternative));
                }
                Pick::Integrity(violation) => {
                    return Err(DispatchFailure::IntegrityViolation {
                        key: req.key.to_owned(),
                        violation,
                    });
                }
                Pick::Busy | Pick::NoAdvertiser | Pick::Mismatch(_) => {}
            }
            let queue = st.queues.entry(req.key.to_owned()).or_default();
            if queue.len() >= self.config.queue_capacity {
                return Err(DispatchFailure::CapacityExhausted {
                    key: req.key.to_owned(),
                    queue_full: true,
                });
            }
            queue.push_back(Waiter {
                token,
                call_id: req.call_id.to_owned(),
                agent: req.agent.to_owned(),
                tool: req.tool.to_owned(),
                version: req.version.to_owned(),
                excluded: req.excluded.to_vec(),
                pin: req.pin.map(str::to_owned),
                events,
            });
            st.queued.insert(req.call_id.to_owned(), token);
            Ok((token, Admission::Queued))
        })
    }

    /// Gives free slots of `key` to queued calls, oldest first.
    fn drain(&self, st: &mut State, key: &str) {
        let now = Instant::now();
        loop {
            let Some(queue) = st.queues.get_mut(key) else {
                return;
            };
            // Forget waiters whose dispatch future is gone.
            let mut i = 0;
            while i < queue.len() {
                if queue[i].events.is_closed() {
                    if let Some(w) = queue.remove(i) {
                        st.queued.remove(&w.call_id);
                    }
                } else {
                    i += 1;
                }
            }
            if queue.is_empty() {
                st.queues.remove(key);
                return;
            }
            let Some(queue) = st.queues.get(key) else {
                return;
            };
            let mut chosen = None;
            for (index, waiter) in queue.iter().enumerate() {
                let req = Request {
                    call_id: &waiter.call_id,
                    key,
                    agent: &waiter.agent,
                    tool: &waiter.tool,
                    version: &waiter.version,
                    excluded: &waiter.excluded,
                    pin: waiter.pin.as_deref(),
                };
                if let Pick::Worker(worker_id) = self.pick(st, now, &req) {
                    chosen = Some((index, worker_id));
                    break;
                }
            }
            let Some((index, worker_id)) = chosen else {
                return;
            };
            let Some(waiter) = st.queues.get_mut(key).and_then(|q| q.remove(index)) else {
                return;
            };
            st.queued.remove(&waiter.call_id);
            self.reserve(
                st,
                &worker_id,
                &waiter.call_id,
                key,
                waiter.token,
                waiter.events,
            );
        }
    }

    /// Takes a queued attempt out of its queue (queue wait passed or cancelled). Returns the
    /// failure to report, or `None` when the attempt is no longer queued (a slot was reserved
    /// or the router failed it: the event is in its channel).
    pub(crate) fn withdraw(&self, req: &Request<'_>, token: u64) -> Option<DispatchFailure> {
        self.with_state(|st| {
            if st.queued.get(req.call_id) != Some(&token) {
                return None;
            }
            st.queued.remove(req.call_id);
            if let Some(queue) = st.queues.get_mut(req.key) {
                queue.retain(|w| w.token != token);
                if queue.is_empty() {
                    st.queues.remove(req.key);
                }
            }
            let key = req.key.to_owned();
            Some(match self.pick(st, Instant::now(), req) {
                Pick::NoAdvertiser => DispatchFailure::NoHandler { key },
                Pick::Mismatch(advertised) => DispatchFailure::DescriptorMismatch {
                    key,
                    pin: req.pin.unwrap_or_default().to_owned(),
                    advertised,
                },
                Pick::Integrity(violation) => {
                    DispatchFailure::IntegrityViolation { key, violation }
                }
                Pick::Busy | Pick::Worker(_) => DispatchFailure::CapacityExhausted {
                    key,
                    queue_full: false,
                },
            })
        })
    }

    /// Sends the invoke of a reserved attempt. `None` means the worker was lost before the
    /// invoke went out: nothing was sent, try again.
    pub(crate) fn send_invoke(
        &self,
        invocation: &Invocation,
        token: u64,
        exec_timeout: Option<Duration>,
    ) -> Option<Instant> {
        self.with_state(|st| {
            let call = st
                .calls
                .get(&invocation.call_id)
                .filter(|c| c.token == token)?;
            if !matches!(call.state, CallState::Reserved { .. }) {
                return None;
            }
            let worker_id = call.worker_id.clone();
            let exec_deadline = exec_timeout.map(|t| now_unix_ms().saturating_add(duration_ms(t)));
            let deadline_unix_ms = match (invocation.deadline_unix_ms, exec_deadline) {
                (session, Some(exec)) if session > 0 => session.min(exec),
                (_, Some(exec)) => exec,
                (session, None) => session.max(0),
            };
            let mut invoke = invocation.clone();
            invoke.deadline_unix_ms = deadline_unix_ms;
            if !self.send(st, &worker_id, ToWorker::Invoke(Box::new(invoke))) {
                return None;
            }
            let call = st.calls.get_mut(&invocation.call_id)?;
            if let CallState::Reserved { events } = &call.state {
                call.state = CallState::Active {
                    events: events.clone(),
                };
            }
            Some(Instant::now())
        })
    }

    /// Abandons a dispatched attempt: sends a cancel and keeps the slot until the worker
    /// answers or the abandon grace passes. Returns false when the attempt is already
    /// resolved (its resolution is in its channel).
    pub(crate) fn abandon(&self, call_id: &str, token: u64, reason: AbandonReason) -> bool {
        let abandoned = self.with_state(|st| {
            let Some(call) = st.calls.get_mut(call_id).filter(|c| c.token == token) else {
                return false;
            };
            match call.state {
                CallState::Active { .. } => {
                    call.state = CallState::Abandoned {
                        since: Instant::now(),
                        reason,
                    };
                    let worker_id = call.worker_id.clone();
                    tracing::info!(worker_id, call_id, %reason, "tool call abandoned; cancel sent");
                    self.send(
                        st,
                        &worker_id,
                        ToWorker::Cancel {
                            call_id: call_id.to_owned(),
                        },
                    );
                    true
                }
                CallState::Reserved { .. } => {
                    if let Some(call) = st.calls.remove(call_id) {
                        self.release_slot(st, &call.worker_id, &call.key);
                        self.drain(st, &call.key);
                    }
                    true
                }
                CallState::Abandoned { .. } => true,
            }
        });
        if abandoned {
            self.reaper_wake.notify_one();
        }
        abandoned
    }

    /// Cleans up an attempt whose future ended without settling (dropped, or failed while
    /// reserved or queued).
    pub(crate) fn release_attempt(&self, req: &Request<'_>, token: u64) {
        if self.withdraw(req, token).is_some() {
            return;
        }
        self.abandon(req.call_id, token, AbandonReason::CallerGone);
    }

    /// Reports results found in a dropped attempt's channel as late.
    pub(crate) fn report_orphans(&self, call_id: &str, resolutions: Vec<Resolution>) {
        let mut events = Vec::new();
        for resolution in resolutions {
            if let Resolution::Result { outcome, ack } = resolution {
                let worker_id = ack.worker_id().unwrap_or_default().to_owned();
                events.push(RouterEvent::LateResult(LateResult {
                    worker_id,
                    call_id: call_id.to_owned(),
                    outcome: LateOutcome::Result(outcome),
                    reason: LateReason::Abandoned(AbandonReason::CallerGone),
                    ack,
                }));
            }
        }
        self.emit(events);
    }

    // ---------------------------------------------------------------- leases and shutdown

    /// Drops workers whose lease passed and frees slots of abandoned calls whose grace
    /// passed. Returns the next instant something may expire.
    pub(crate) fn reap(&self, now: Instant) -> Option<Instant> {
        self.with_state(|st| {
            let expired: Vec<String> = st
                .workers
                .iter()
                .filter(|(_, w)| w.lease_expires <= now)
                .map(|(id, _)| id.clone())
                .collect();
            let lease_ttl_ms = u64::try_from(self.config.lease_ttl.as_millis()).unwrap_or(u64::MAX);
            for worker_id in expired {
                let close = DispatchError::LeaseExpired {
                    worker_id: worker_id.clone(),
                    lease_ttl_ms,
                };
                self.remove_worker(
                    st,
                    &worker_id,
                    WorkerLost::LeaseExpired,
                    Some(close),
                    &HashSet::new(),
                );
            }
            let grace = self.config.abandon_grace;
            let stale: Vec<String> = st
                .calls
                .iter()
                .filter(|(_, c)| {
                    matches!(c.state, CallState::Abandoned { since, .. } if since + grace <= now)
                })
                .map(|(id, _)| id.clone())
                .collect();
            for call_id in stale {
                if let Some(call) = st.calls.remove(&call_id) {
                    tracing::warn!(
                        worker_id = %call.worker_id,
                        call_id,
                        "worker never answered an abandoned call; releasing its slot"
                    );
                    self.release_slot(st, &call.worker_id, &call.key);
                    self.drain(st, &call.key);
                }
            }
            let leases = st.workers.values().map(|w| w.lease_expires);
            let graces = st.calls.values().filter_map(|c| match c.state {
                CallState::Abandoned { since, .. } => Some(since + grace),
                _ => None,
            });
            leases.chain(graces).min()
        })
    }

    pub(crate) fn shutdown(&self) {
        self.with_state(|st| {
            if st.shutting_down {
                return;
            }
            st.shutting_down = true;
            let mut cancelled = 0usize;
            for (_, queue) in st.queues.drain() {
                for waiter in queue {
                    cancelled += 1;
                    let _ = waiter
                        .events
                        .send(CallEvent::Failed(DispatchFailure::ShuttingDown));
                }
            }
            st.queued.clear();
            tracing::info!(cancelled, "tool worker registry shutting down");
        });
    }

    /// Whether a worker with an unexpired lease advertises `key` (whatever its load, pin or
    /// allowlist standing: those are judged when a call is dispatched).
    pub(crate) fn advertises(&self, key: &str) -> bool {
        let st = self.lock();
        let now = Instant::now();
        st.workers
            .values()
            .any(|w| w.lease_expires > now && w.handler(key).is_some())
    }

    /// The handler keys workers with an unexpired lease advertise, sorted, without repeats.
    pub(crate) fn advertised_keys(&self) -> Vec<String> {
        let st = self.lock();
        let now = Instant::now();
        let mut keys: Vec<String> = st
            .workers
            .values()
            .filter(|w| w.lease_expires > now)
            .flat_map(|w| w.handlers.iter().map(|(k, _)| k.clone()))
            .collect();
        keys.sort_unstable();
        keys.dedup();
        keys
    }

    pub(crate) fn snapshot(&self) -> RouterSnapshot {
        let st = self.lock();
        let now = Instant::now();
        let mut workers: Vec<WorkerSnapshot> = st
            .workers
            .iter()
            .map(|(id, w)| {
                let mut in_flight: Vec<String> = st
                    .calls
                    .iter()
                    .filter(|(_, c)| {
                        c.worker_id == *id && !matches!(c.state, CallState::Abandoned { .. })
                    })
                    .map(|(call_id, _)| call_id.clone())
                    .collect();
                in_flight.sort();
                let abandoned = st
                    .calls
                    .values()
                    .filter(|c| {
                        c.worker_id == *id && matches!(c.state, CallState::Abandoned { .. })
                    })
                    .count();
                WorkerSnapshot {
                    worker_id: id.clone(),
                    workload_identity: w.workload_identity.clone(),
                    image_digest: w.image_digest.clone(),
                    lease_remaining: w.lease_expires.saturating_duration_since(now),
                    handlers: w
                        .handlers
                        .iter()
                        .map(|(key, ad)| HandlerSnapshot {
                            tool: ad.tool.clone(),
                            version: ad.version.clone(),
                            contract_version: ad.contract_version.clone(),
                            descriptor_hash: ad.descriptor_hash.clone(),
                            max_concurrency: ad.effective_max_concurrency(),
                            busy: w.busy(key),
                        })
                        .collect(),
                    in_flight,
                    abandoned,
                }
            })
            .collect();
        workers.sort_by(|a, b| a.worker_id.cmp(&b.worker_id));
        let mut queues: Vec<QueueSnapshot> = st
            .queues
            .iter()
            .filter(|(_, q)| !q.is_empty())
            .map(|(key, q)| QueueSnapshot {
                key: key.clone(),
                depth: q.len(),
            })
            .collect();
        queues.sort_by(|a, b| a.key.cmp(&b.key));
        RouterSnapshot {
            shutting_down: st.shutting_down,
            workers,
            queues,
            awaiting_ack: st
                .awaiting_ack
                .values()
                .filter(|(_, l)| l.strong_count() > 0)
                .count(),
        }
    }
}

/// Drops expired leases and stale abandoned calls until the router goes away.
pub(crate) async fn reaper(inner: Weak<Inner>, wake: Arc<Notify>, stop: CancellationToken) {
    loop {
        let next = match inner.upgrade() {
            Some(inner) => inner.reap(Instant::now()),
            None => return,
        };
        let sleep = async {
            match next {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = wake.notified() => {}
            () = sleep => {}
        }
    }
}
