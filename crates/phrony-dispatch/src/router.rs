//! The public router: worker registration and tool dispatch.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::ack::AckHandle;
use crate::allowlist::Allowlist;
use crate::config::RouterConfig;
use crate::connection::{Outbox, WorkerConnection};
use crate::error::{ConfigError, DispatchError, DispatchFailure, WorkerLost};
use crate::hooks::{
    AbandonReason, CompletedCalls, DescriptorPins, DescriptorRefusal, DispatchJournal, HookError,
    RouterObserver,
};
use crate::snapshot::RouterSnapshot;
use crate::state::{self, Admission, CallEvent, Inner, Request, Resolution};
use crate::types::{
    DEFAULT_VERSION, Invocation, ToolError, ToolOutcome, WorkerHello, WorkerProvenance, handler_key,
};

/// The worker registry and dispatch router. Cheap to clone; all clones share one registry.
#[derive(Clone)]
pub struct Router {
    inner: Arc<Inner>,
    /// Worker id → the verified credential that registered it first (for the router's
    /// lifetime). Only verified registrations ([`Router::connect_as`]) bind ids.
    owners: Arc<std::sync::Mutex<HashMap<String, String>>>,
    /// The pins registrations are checked against.
    pins: Option<Arc<dyn DescriptorPins>>,
}

impl fmt::Debug for Router {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Router")
            .field("inner", &self.inner)
            .field("pins", &self.pins.is_some())
            .finish_non_exhaustive()
    }
}

/// Builds a [`Router`] with optional hooks.
pub struct RouterBuilder {
    config: RouterConfig,
    allowlist: Option<Allowlist>,
    observer: Option<Arc<dyn RouterObserver>>,
    completed: Option<Arc<dyn CompletedCalls>>,
    pins: Option<Arc<dyn DescriptorPins>>,
}

impl fmt::Debug for RouterBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RouterBuilder")
            .field("config", &self.config)
            .field("allowlist", &self.allowlist)
            .field("observer", &self.observer.is_some())
            .field("completed", &self.completed.is_some())
            .field("pins", &self.pins.is_some())
            .finish()
    }
}

impl RouterBuilder {
    /// Checks every dispatch against this integrity allowlist (an empty one checks nothing).
    #[must_use]
    pub fn allowlist(mut self, allowlist: Allowlist) -> Self {
        self.allowlist = Some(allowlist);
        self
    }

    /// Receives late results, worker removals and other notable events.
    #[must_use]
    pub fn observer(mut self, observer: Arc<dyn RouterObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Answers which `in_flight` calls of a registering worker are already recorded.
    #[must_use]
    pub fn completed_calls(mut self, completed: Arc<dyn CompletedCalls>) -> Self {
        self.completed = Some(completed);
        self
    }

    /// Checks registrations' descriptor hashes against these pins and records refusals there.
    #[must_use]
    pub fn descriptor_pins(mut self, pins: Arc<dyn DescriptorPins>) -> Self {
        self.pins = Some(pins);
        self
    }

    /// Validates the settings and starts the router, including its lease reaper task.
    ///
    /// # Panics
    /// When called outside a Tokio runtime (the reaper is spawned on the current one).
    pub fn build(self) -> Result<Router, ConfigError> {
        self.config.validate()?;
        let inner = Inner::new(self.config, self.allowlist, self.observer, self.completed);
        tokio::spawn(state::reaper(
            Arc::downgrade(&inner),
            Arc::clone(&inner.reaper_wake),
            inner.stop.clone(),
        ));
        Ok(Router {
            inner,
            owners: Arc::default(),
            pins: self.pins,
        })
    }
}

/// One tool call to dispatch to a worker.
pub struct DispatchCall {
    /// The invoke to send. An empty `version` is dispatched as `default`; the router lowers
    /// `deadline_unix_ms` to the execution deadline.
    pub invocation: Invocation,
    /// The calling agent as `namespace/name` (checked by the integrity allowlist).
    pub agent: String,
    /// How long to wait for a free handler slot (`RUNTIME_DISPATCH_QUEUE_WAIT`). It does not
    /// bound execution.
    pub queue_wait: Duration,
    /// How long the worker may run the call once invoked (the binding's `timeout`, else the
    /// daemon default); `None` waits indefinitely.
    pub exec_timeout: Option<Duration>,
    /// Cancels the call (the session was cancelled or completed); a dispatched call gets a
    /// `WorkToolCancel`.
    pub cancel: CancellationToken,
    /// Records the dispatch before the invoke is sent.
    pub journal: Option<Arc<dyn DispatchJournal>>,
    /// The calling agent version's descriptor pin for the tool: the call goes only to workers
    /// advertising this `descriptor_hash` or none. `None` routes to any worker of the key.
    pub descriptor_pin: Option<String>,
}

impl DispatchCall {
    /// A call with a fresh cancellation token and no journal.
    pub fn new(
        invocation: Invocation,
        agent: impl Into<String>,
        queue_wait: Duration,
        exec_timeout: Option<Duration>,
    ) -> Self {
        Self {
            invocation,
            agent: agent.into(),
            queue_wait,
            exec_timeout,
            cancel: CancellationToken::new(),
            journal: None,
            descriptor_pin: None,
        }
    }

    /// Routes the call only to workers advertising this descriptor pin (or no hash).
    #[must_use]
    pub fn with_descriptor_pin(mut self, pin: Option<String>) -> Self {
        self.descriptor_pin = pin;
        self
    }

    /// Uses this cancellation token.
    #[must_use]
    pub fn with_cancel(mut self, cancel: CancellationToken) -> Self {
        self.cancel = cancel;
        self
    }

    /// Records each dispatch in this journal before the invoke is sent.
    #[must_use]
    pub fn with_journal(mut self, journal: Arc<dyn DispatchJournal>) -> Self {
        self.journal = Some(journal);
        self
    }
}

impl fmt::Debug for DispatchCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DispatchCall")
            .field("invocation", &self.invocation)
            .field("agent", &self.agent)
            .field("queue_wait", &self.queue_wait)
            .field("exec_timeout", &self.exec_timeout)
            .field("journal", &self.journal.is_some())
            .field("descriptor_pin", &self.descriptor_pin)
            .finish_non_exhaustive()
    }
}

/// A worker's answer to a dispatched call.
#[derive(Debug)]
pub struct Completion {
    /// The handler's result or error (a final nack becomes a tool error `code: message`).
    pub outcome: ToolOutcome,
    /// The worker that answered.
    pub worker: WorkerProvenance,
    /// Invokes sent (more than 1 after a nack was retried elsewhere).
    pub attempts: u32,
    /// Time spent waiting for handler slots.
    pub queued_for: Duration,
    /// Time from the last invoke to the answer.
    pub executed_for: Duration,
    /// Acknowledge the result with [`AckHandle::ack`] after recording it durably.
    pub ack: AckHandle,
}

impl Router {
    /// Starts a router with default hooks (no allowlist, no observer, no completed-call
    /// lookup). See [`RouterBuilder::build`].
    pub fn new(config: RouterConfig) -> Result<Self, ConfigError> {
        Self::builder(config).build()
    }

    /// A builder for a router with hooks.
    #[must_use]
    pub fn builder(config: RouterConfig) -> RouterBuilder {
        RouterBuilder {
            config,
            allowlist: None,
            observer: None,
            completed: None,
            pins: None,
        }
    }

    /// The router's settings.
    #[must_use]
    pub fn config(&self) -> &RouterConfig {
        &self.inner.config
    }

    /// Registers a worker (its `WorkRegister`). Returns the connection to feed later messages
    /// to and the outbox to write to the worker, which starts with `Registered` followed by a
    /// `ResultAck` for each `in_flight` call already recorded.
    ///
    /// If the worker id is registered already, the new connection replaces the old one: calls
    /// listed in `in_flight` stay attached (their results are accepted on the new stream),
    /// the others become indeterminate, and the old stream ends with
    /// [`DispatchError::Superseded`].
    ///
    /// A worker id bound to a verified credential ([`Router::connect_as`]) is refused here
    /// ([`DispatchError::WorkerIdBound`]): an unverified caller never takes it over.
    pub async fn connect(
        &self,
        hello: WorkerHello,
    ) -> Result<(WorkerConnection, Outbox), DispatchError> {
        if let Some(owner) = self.worker_owner(&hello.worker_id) {
            return Err(DispatchError::WorkerIdBound {
                worker_id: hello.worker_id,
                owner,
                credential: "(unverified)".to_owned(),
            });
        }
        self.connect_unbound(hello, None).await
    }

    async fn connect_unbound(
        &self,
        hello: WorkerHello,
        credential: Option<&str>,
    ) -> Result<(WorkerConnection, Outbox), DispatchError> {
        validate_hello(&hello)?;
        if self.inner.is_shutting_down() {
            return Err(DispatchError::ShuttingDown);
        }
        self.check_descriptors(&hello, credential).await?;
        let completed = match &self.inner.completed {
            Some(lookup) if !hello.in_flight.is_empty() => {
                match lookup.completed(&hello.in_flight).await {
                    Ok(done) => done,
                    Err(err) => {
                        tracing::warn!(
                            worker_id = %hello.worker_id,
                            error = %err,
                            "could not look up completed in-flight calls; they are acknowledged when resent"
                        );
                        HashSet::new()
                    }
                }
            }
            _ => HashSet::new(),
        };
        let worker_id = hello.worker_id.clone();
        let (conn, rx, close) = self.inner.register(hello, &completed)?;
        Ok((
            WorkerConnection::new(Arc::clone(&self.inner), worker_id, conn, Arc::clone(&close)),
            Outbox::new(rx, close),
        ))
    }

    /// [`Router::connect`] for a worker whose credential was verified: the worker id is bound
    /// to `credential` (e.g. `"refund-bot" (token)`) by the first successful registration,
    /// for the router's lifetime. The same credential registering the id again takes the
    /// stream over as with [`Router::connect`]; another credential is refused with
    /// [`DispatchError::WorkerIdBound`] and the registered worker keeps its stream.
    ///
    /// # Errors
    /// [`DispatchError::WorkerIdBound`], or any error of [`Router::connect`].
    pub async fn connect_as(
        &self,
        hello: WorkerHello,
        credential: &str,
    ) -> Result<(WorkerConnection, Outbox), DispatchError> {
        validate_hello(&hello)?;
        let worker_id = hello.worker_id.clone();
        let claimed = {
            let mut owners = self
                .owners
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match owners.get(&worker_id) {
                Some(owner) if owner != credential => {
                    return Err(DispatchError::WorkerIdBound {
                        worker_id,
                        owner: owner.clone(),
                        credential: credential.to_owned(),
                    });
                }
                Some(_) => false,
                None => {
                    owners.insert(worker_id.clone(), credential.to_owned());
                    true
                }
            }
        };
        let connected = self.connect_unbound(hello, Some(credential)).await;
        if connected.is_err() && claimed {
            // Only a registration that succeeded binds the id.
            self.owners
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(&worker_id);
        }
        connected
    }

    /// Checks every handler's `descriptor_hash` against the pins published agent versions hold
    /// for its `tool@version` (see [`DescriptorPins`]): a non-empty hash that matches none of
    /// them, or an empty one under [`RouterConfig::require_descriptor_pins`], refuses the
    /// registration after the refusal is recorded. Without a [`DescriptorPins`] hook only the
    /// strict rule applies.
    async fn check_descriptors(
        &self,
        hello: &WorkerHello,
        credential: Option<&str>,
    ) -> Result<(), DispatchError> {
        let strict = self.inner.config.require_descriptor_pins;
        for ad in &hello.handlers {
            let expected = match &self.pins {
                Some(pins) => pins.expected(&ad.tool, &ad.version).await.map_err(|err| {
                    DispatchError::DescriptorCheckFailed {
                        worker_id: hello.worker_id.clone(),
                        message: err.to_string(),
                    }
                })?,
                None => Vec::new(),
            };
            let refused = if ad.descriptor_hash.is_empty() {
                strict
            } else {
                !expected.is_empty() && !expected.contains(&ad.descriptor_hash)
            };
            if !refused {
                continue;
            }
            let refusal = DescriptorRefusal {
                worker_id: hello.worker_id.clone(),
                workload_identity: hello.workload_identity.clone(),
                image_digest: hello.image_digest.clone(),
                credential: credential.map(str::to_owned),
                tool: ad.tool.clone(),
                version: ad.version.clone(),
                received: ad.descriptor_hash.clone(),
                expected,
            };
            let error = DispatchError::DescriptorRefused {
                worker_id: refusal.worker_id.clone(),
                key: ad.key(),
                received: refusal.received.clone(),
                expected: refusal.expected.clone(),
            };
            tracing::warn!(worker_id = %hello.worker_id, %error, "tool worker registration refused");
            if let Some(pins) = &self.pins
                && let Err(err) = pins.refused(&refusal).await
            {
                // Refusing is the safe side; the refusal is still logged above.
                tracing::warn!(worker_id = %hello.worker_id, error = %err, "could not record a descriptor refusal");
            }
            return Err(error);
        }
        Ok(())
    }

    /// The credential a worker id is bound to, if a verified registration bound it.
    #[must_use]
    pub fn worker_owner(&self, worker_id: &str) -> Option<String> {
        self.owners
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(worker_id)
            .cloned()
    }

    /// Dispatches one call to the least-busy live worker advertising `tool@version`, waiting
    /// up to `queue_wait` for a free slot and `exec_timeout` for the answer.
    ///
    /// A nack is retried on another eligible worker (up to [`RouterConfig::nack_retries`]
    /// times), else returned as a tool error. A result is returned with an [`AckHandle`]; the
    /// worker gets its `WorkResultAck` only when the caller acks after recording the result.
    pub async fn dispatch(&self, call: DispatchCall) -> Result<Completion, DispatchFailure> {
        let DispatchCall {
            mut invocation,
            agent,
            queue_wait,
            exec_timeout,
            cancel,
            journal,
            descriptor_pin,
        } = call;
        if invocation.version.is_empty() {
            invocation.version = DEFAULT_VERSION.to_owned();
        }
        let key = handler_key(&invocation.tool, &invocation.version);
        let mut excluded: Vec<String> = Vec::new();
        let mut attempts = 0u32;
        let mut queued_for = Duration::ZERO;
        let mut last_nack: Option<(ToolError, WorkerProvenance)> = None;

        loop {
            if cancel.is_cancelled() {
                return Err(DispatchFailure::Cancelled { key, worker: None });
            }
            let req = Request {
                call_id: &invocation.call_id,
                key: &key,
                agent: &agent,
                tool: &invocation.tool,
                version: &invocation.version,
                excluded: &excluded,
                pin: descriptor_pin.as_deref(),
            };
            let (tx, rx) = mpsc::unbounded_channel();
            let admitted_at = Instant::now();
            let admitted = self.inner.admit(&req, last_nack.is_some(), tx);
            let (token, admission) = match admitted {
                Ok(admitted) => admitted,
                Err(failure) => return nack_or(failure, last_nack, attempts, queued_for),
            };
            if admission == Admission::NoAlternative {
                if let Some(nack) = last_nack {
                    return Ok(nack_answer(nack, attempts, queued_for));
                }
                return Err(DispatchFailure::NoHandler { key });
            }
            let mut guard = AttemptGuard {
                inner: &self.inner,
                req,
                token,
                rx,
                armed: true,
            };

            // Phase 1: a handler slot.
            let worker = if admission == Admission::Reserved {
                match guard.rx.try_recv() {
                    Ok(CallEvent::Reserved(worker)) => worker,
                    _ => continue,
                }
            } else {
                let queue = Queue {
                    deadline: admitted_at + queue_wait,
                    cancel: &cancel,
                    key: &key,
                    journal: journal.as_deref(),
                    invocation: &invocation,
                    attempt: attempts.saturating_add(1),
                };
                match self.await_slot(&mut guard, &queue).await {
                    Ok(worker) => worker,
                    Err(SlotWait::Failed(failure)) => return Err(failure),
                    Err(SlotWait::Withdrawn(failure)) => {
                        return nack_or(
                            failure,
                            last_nack,
                            attempts,
                            queued_for + admitted_at.elapsed(),
                        );
                    }
                }
            };
            let waited = admitted_at.elapsed();
            phrony_metrics::DISPATCH_QUEUE_WAIT.observe(waited);
            queued_for += waited;

            // Phase 2: journal the dispatch, then send the invoke.
            if let Some(journal) = &journal {
                journal_dispatch(
                    journal.as_ref(),
                    &invocation,
                    &worker,
                    attempts + 1,
                    &cancel,
                    &key,
                )
                .await?;
            }
            let Some(dispatched_at) = self.inner.send_invoke(&invocation, token, exec_timeout)
            else {
                // The worker went away before the invoke was sent: nothing ran, try again.
                guard.armed = false;
                continue;
            };
            attempts += 1;

            // Phase 3: the answer.
            let attempt = Attempt {
                invocation: &invocation,
                worker: &worker,
                exec_deadline: exec_timeout.map(|t| dispatched_at + t),
                exec_timeout,
                cancel: &cancel,
                key: &key,
            };
            let resolution = self.await_answer(&mut guard, &attempt).await?;
            guard.armed = false;
            drop(guard);
            let resolution = match resolution {
                Some(CallEvent::Resolved(resolution)) => resolution,
                Some(CallEvent::Failed(failure)) => return Err(failure),
                Some(CallEvent::Reserved(_)) | None => Resolution::Lost(WorkerLost::StreamEnded),
            };
            match resolution {
                Resolution::Result { outcome, ack } => {
                    return Ok(Completion {
                        outcome,
                        worker,
                        attempts,
                        queued_for,
                        executed_for: dispatched_at.elapsed(),
                        ack,
                    });
                }
                Resolution::Nack(error) => {
                    tracing::info!(
                        call_id = %invocation.call_id,
                        worker_id = %worker.worker_id,
                        code = %error.code,
                        "tool call nacked"
                    );
                    let retries = u32::try_from(excluded.len()).unwrap_or(u32::MAX);
                    if retries >= self.inner.config.nack_retries {
                        return Ok(nack_answer((error, worker), attempts, queued_for));
                    }
                    excluded.push(worker.worker_id.clone());
                    last_nack = Some((error, worker));
                }
                Resolution::Lost(reason) => {
                    return Err(DispatchFailure::Indeterminate {
                        key,
                        worker: Box::new(worker),
                        reason,
                    });
                }
            }
        }
    }

    /// Phase 1 of a queued attempt: waits until `queue.deadline` for a handler slot.
    ///
    /// `Err(SlotWait::Withdrawn)` when the wait ran out and the call left the queue;
    /// `Err(SlotWait::Failed)` when it was cancelled, the router failed it or is shutting down.
    async fn await_slot(
        &self,
        guard: &mut AttemptGuard<'_>,
        queue: &Queue<'_>,
    ) -> Result<WorkerProvenance, SlotWait> {
        if let Some(journal) = queue.journal {
            // On an error the still-armed guard takes the call out of the queue.
            journal_queued(
                journal,
                queue.invocation,
                queue.attempt,
                queue.cancel,
                queue.key,
            )
            .await
            .map_err(SlotWait::Failed)?;
        }
        let event = tokio::select! {
            biased;
            event = guard.rx.recv() => event,
            () = queue.cancel.cancelled() => {
                return Err(SlotWait::Failed(DispatchFailure::Cancelled {
                    key: queue.key.to_owned(),
                    worker: None,
                }));
            }
            () = tokio::time::sleep_until(queue.deadline) => {
                match self.inner.withdraw(&guard.req, guard.token) {
                    Some(failure) => {
                        guard.armed = false;
                        return Err(SlotWait::Withdrawn(failure));
                    }
                    // A slot was reserved (or the router failed the call) just now.
                    None => guard.rx.try_recv().ok(),
                }
            }
        };
        match event {
            Some(CallEvent::Reserved(worker)) => Ok(worker),
            Some(CallEvent::Failed(failure)) => {
                guard.armed = false;
                Err(SlotWait::Failed(failure))
            }
            Some(CallEvent::Resolved(_)) | None => {
                guard.armed = false;
                Err(SlotWait::Failed(DispatchFailure::ShuttingDown))
            }
        }
    }

    /// Phase 3 of an attempt: waits for the worker's answer; a cancellation or the end of the
    /// execution deadline abandons the call (unless its answer arrived just then).
    async fn await_answer(
        &self,
        guard: &mut AttemptGuard<'_>,
        attempt: &Attempt<'_>,
    ) -> Result<Option<CallEvent>, DispatchFailure> {
        let call_id = &attempt.invocation.call_id;
        let timer = async {
            match attempt.exec_deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        Ok(tokio::select! {
            biased;
            event = guard.rx.recv() => event,
            () = attempt.cancel.cancelled() => {
                if self.inner.abandon(call_id, guard.token, AbandonReason::Cancelled) {
                    guard.armed = false;
                    return Err(DispatchFailure::Cancelled {
                        key: attempt.key.to_owned(),
                        worker: Some(Box::new(attempt.worker.clone())),
                    });
                }
                guard.rx.try_recv().ok()
            }
            () = timer => {
                if self.inner.abandon(call_id, guard.token, AbandonReason::ExecutionTimeout) {
                    guard.armed = false;
                    return Err(DispatchFailure::ExecutionTimeout {
                        key: attempt.key.to_owned(),
                        worker: Box::new(attempt.worker.clone()),
                        timeout: attempt.exec_timeout.unwrap_or_default(),
                    });
                }
                guard.rx.try_recv().ok()
            }
        })
    }

    /// Whether a connected worker advertises the handler `key` ([`handler_key`]): a call for it
    /// may be served here (its load, descriptor pin and allowlist are judged at dispatch).
    #[must_use]
    pub fn advertises(&self, key: &str) -> bool {
        self.inner.advertises(key)
    }

    /// The handler keys ([`handler_key`]) connected workers advertise, sorted, without repeats
    /// (what this replica publishes for the others, issue #20).
    #[must_use]
    pub fn advertised_keys(&self) -> Vec<String> {
        self.inner.advertised_keys()
    }

    /// A point-in-time view of workers, handlers, busy slots and queues.
    #[must_use]
    pub fn snapshot(&self) -> RouterSnapshot {
        self.inner.snapshot()
    }

    /// Starts a graceful shutdown: new registrations and dispatches are refused with
    /// "tool worker registry is shutting down", queued calls fail with
    /// [`DispatchFailure::ShuttingDown`], and dispatched calls run to their end.
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }
}

/// Phase 1's wait for a handler slot.
struct Queue<'a> {
    deadline: Instant,
    cancel: &'a CancellationToken,
    key: &'a str,
    /// Told that the call waits, before the wait.
    journal: Option<&'a dyn DispatchJournal>,
    invocation: &'a Invocation,
    attempt: u32,
}

/// Why phase 1 ended without a slot.
enum SlotWait {
    /// The queue wait ran out and the call was withdrawn: answered with the last nack when
    /// there is one (see [`nack_or`]).
    Withdrawn(DispatchFailure),
    /// Cancelled, failed by the router or shutting down: the dispatch fails.
    Failed(DispatchFailure),
}

/// Phase 3's wait for the answer of a dispatched call.
struct Attempt<'a> {
    invocation: &'a Invocation,
    worker: &'a WorkerProvenance,
    exec_deadline: Option<Instant>,
    exec_timeout: Option<Duration>,
    cancel: &'a CancellationToken,
    key: &'a str,
}

/// Phase 1 of an attempt that must wait for a slot: journals that the call is queued before
/// the wait. On an error the attempt's guard withdraws the call from the queue.
async fn journal_queued(
    journal: &dyn DispatchJournal,
    invocation: &Invocation,
    attempt: u32,
    cancel: &CancellationToken,
    key: &str,
) -> Result<(), DispatchFailure> {
    journaled(journal.queued(invocation, attempt), cancel, key).await
}

/// Phase 2 of an attempt: journals the dispatch before the invoke is sent.
async fn journal_dispatch(
    journal: &dyn DispatchJournal,
    invocation: &Invocation,
    worker: &WorkerProvenance,
    attempt: u32,
    cancel: &CancellationToken,
    key: &str,
) -> Result<(), DispatchFailure> {
    journaled(
        journal.dispatching(invocation, worker, attempt),
        cancel,
        key,
    )
    .await
}

/// Awaits a journal write unless the caller cancels first; a refused write is
/// [`DispatchFailure::JournalFailed`].
async fn journaled(
    write: impl Future<Output = Result<(), HookError>>,
    cancel: &CancellationToken,
    key: &str,
) -> Result<(), DispatchFailure> {
    let recorded = tokio::select! {
        biased;
        () = cancel.cancelled() => {
            return Err(DispatchFailure::Cancelled { key: key.to_owned(), worker: None });
        }
        recorded = write => recorded,
    };
    recorded.map_err(|err| DispatchFailure::JournalFailed {
        key: key.to_owned(),
        message: err.to_string(),
    })
}

/// The answer of a call whose last attempt was nacked and that no other worker will try: the
/// nack's error, as the call's outcome.
fn nack_answer(
    nack: (ToolError, WorkerProvenance),
    attempts: u32,
    queued_for: Duration,
) -> Completion {
    Completion {
        outcome: ToolOutcome::Error(nack.0),
        worker: nack.1,
        attempts,
        queued_for,
        executed_for: Duration::ZERO,
        ack: AckHandle::none(),
    }
}

/// The end of a dispatch that found no worker to try: after a nack, "no handler", "no
/// capacity" and "integrity violation" mean no *other* worker, so the nack is the answer;
/// every other failure stands.
fn nack_or(
    failure: DispatchFailure,
    last_nack: Option<(ToolError, WorkerProvenance)>,
    attempts: u32,
    queued_for: Duration,
) -> Result<Completion, DispatchFailure> {
    match (last_nack, &failure) {
        (
            Some(nack),
            DispatchFailure::NoHandler { .. }
            | DispatchFailure::CapacityExhausted { .. }
            | DispatchFailure::IntegrityViolation { .. }
            | DispatchFailure::DescriptorMismatch { .. },
        ) => Ok(nack_answer(nack, attempts, queued_for)),
        _ => Err(failure),
    }
}

/// Releases an attempt's queue entry or slot when its future ends early (dropped, cancelled
/// or failed), and reports results that arrived too late to be read.
struct AttemptGuard<'a> {
    inner: &'a Inner,
    req: Request<'a>,
    token: u64,
    rx: mpsc::UnboundedReceiver<CallEvent>,
    armed: bool,
}

impl Drop for AttemptGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.inner.release_attempt(&self.req, self.token);
        }
        let mut orphans = Vec::new();
        while let Ok(event) = self.rx.try_recv() {
            if let CallEvent::Resolved(resolution @ Resolution::Result { .. }) = event {
                orphans.push(resolution);
            }
        }
        if !orphans.is_empty() {
            self.inner.report_orphans(self.req.call_id, orphans);
        }
    }
}

/// The longest worker id, advertised tool name or version (bytes).
pub const MAX_REGISTRATION_NAME_BYTES: usize = 256;
/// The most handlers one registration may advertise.
pub const MAX_HANDLERS: usize = 1024;
/// The most in-flight call ids one registration may report.
pub const MAX_IN_FLIGHT_REPORTED: usize = 65_536;

/// A worker id, tool or version: at most [`MAX_REGISTRATION_NAME_BYTES`], no control characters
/// (they are written to audit events and log lines, where a newline could forge a line).
fn check_name(field: impl FnOnce() -> String, value: &str) -> Result<(), DispatchError> {
    let problem = if value.len() > MAX_REGISTRATION_NAME_BYTES {
        format!(
            "is {} bytes long; the limit is {MAX_REGISTRATION_NAME_BYTES}",
            value.len()
        )
    } else if let Some(c) = value.chars().find(|c| c.is_control()) {
        format!("contains the control character {c:?}")
    } else {
        return Ok(());
    };
    Err(DispatchError::RegistrationFieldInvalid {
        field: field(),
        problem,
    })
}

fn check_count(field: &str, count: usize, limit: usize) -> Result<(), DispatchError> {
    if count > limit {
        return Err(DispatchError::RegistrationFieldInvalid {
            field: field.to_owned(),
            problem: format!("has {count} entries; the limit is {limit}"),
        });
    }
    Ok(())
}

fn validate_hello(hello: &WorkerHello) -> Result<(), DispatchError> {
    if hello.worker_id.trim().is_empty() {
        return Err(DispatchError::WorkerIdRequired);
    }
    check_name(|| "worker_id".to_owned(), &hello.worker_id)?;
    check_count("handlers", hello.handlers.len(), MAX_HANDLERS)?;
    check_count("in_flight", hello.in_flight.len(), MAX_IN_FLIGHT_REPORTED)?;
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (index, ad) in hello.handlers.iter().enumerate() {
        if ad.tool.trim().is_empty() {
            return Err(DispatchError::HandlerToolRequired { index });
        }
        check_name(|| format!("handlers[{index}].tool"), &ad.tool)?;
        check_name(|| format!("handlers[{index}].version"), &ad.version)?;
        if ad.version.trim().is_empty() {
            return Err(DispatchError::HandlerVersionRequired {
                index,
                tool: ad.tool.clone(),
            });
        }
        if let Some(&first) = seen.get(&ad.key()) {
            return Err(DispatchError::DuplicateHandler {
                key: ad.key(),
                first,
                second: index,
            });
        }
        seen.insert(ad.key(), index);
    }
    if let Some(index) = hello.in_flight.iter().position(String::is_empty) {
        return Err(DispatchError::InFlightCallIdRequired { index });
    }
    Ok(())
}
