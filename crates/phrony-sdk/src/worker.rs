//! [`Worker`]: serves tools on the runtime's `Work` stream.
//!
//! One task owns the connection: it registers, heartbeats at a third of the lease, starts a
//! task per invocation (bounded by the worker's concurrency), cancels a call's task when the
//! runtime cancels it or its deadline passes, keeps each result until the runtime acknowledges
//! it (re-offering it after a reconnect), reconnects with exponential backoff when the stream
//! breaks, and on [`RunningWorker::drain`] refuses new calls (a nack the runtime retries on
//! another worker), waits for the running ones and their acknowledgements, then closes.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use phrony_client::work::{HandlerAd, Invocation, Registration, WorkEvent, WorkSender, WorkStream};
use phrony_client::{Client, ClientError, ClientTls, Code};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// The first pause before reconnecting; it doubles per failed attempt up to [`MAX_BACKOFF`].
pub const MIN_BACKOFF: Duration = Duration::from_millis(200);
/// The longest pause between reconnection attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// The default number of calls a worker runs at once.
pub const DEFAULT_CONCURRENCY: u32 = 4;
/// How long [`RunningWorker::drain`] waits by default for running calls and their acks.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// A tool handler's failure, reported to the model as `code: message`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ToolError {
    /// A short machine-readable code, e.g. `order_not_found`.
    pub code: String,
    /// What went wrong, for the model and the audit trail.
    pub message: String,
}

impl ToolError {
    /// A tool error with this code and message.
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            code: code.into(),
            message: message.into(),
        }
    }
}

/// What a handler learns about the call it runs.
#[derive(Debug, Clone)]
pub struct Call {
    /// The call's id (stable across retries of the same call: use it as an idempotency key for
    /// side effects).
    pub call_id: String,
    /// The session the call belongs to.
    pub session_id: String,
    /// The model turn that proposed it.
    pub turn: i32,
    /// The tool and version called.
    pub tool: String,
    /// The version called.
    pub version: String,
    /// The binding's side-effect class (`read_only`, `non_idempotent_write`…).
    pub side_effect_class: String,
    /// When the runtime stops waiting for the result, if it set a deadline.
    pub deadline: Option<SystemTime>,
    /// The W3C trace context of the runtime's dispatch span (`traceparent`, `tracestate`):
    /// extract it with a W3C propagator to make it the parent of the handler's spans. Empty
    /// when the runtime exports no traces.
    pub trace_context: BTreeMap<String, String>,
    cancel: CancellationToken,
}

impl Call {
    /// Resolves when the runtime cancelled the call or its deadline passed. The worker drops
    /// the handler's future at that point anyway; a handler awaits this only to stop work it
    /// runs outside its own future (a spawned task, a blocking thread).
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await;
    }

    /// Whether the call was cancelled.
    #[must_use]
    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }
}

type Outcome = Result<Vec<u8>, ToolError>;
type BoxFuture = Pin<Box<dyn Future<Output = Outcome> + Send>>;
type ErasedHandler = Arc<dyn Fn(&[u8], Call) -> Result<BoxFuture, ToolError> + Send + Sync>;

struct Tool {
    ad: HandlerAd,
    handler: ErasedHandler,
}

/// Why a worker stopped or could not start.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// The worker's configuration cannot be used.
    #[error("worker configuration: {reason}")]
    Config {
        /// What is wrong.
        reason: String,
    },
    /// The runtime refused the registration for good (an invalid registration, a credential
    /// that may not serve a tool, a worker id bound to another credential).
    #[error("the runtime refused worker {worker_id:?}: {reason}")]
    Refused {
        /// The worker id.
        worker_id: String,
        /// The runtime's answer (its status code and message), or the setting that cannot
        /// work (an invalid address, token or TLS file).
        reason: String,
    },
    /// The worker task ended before it registered (it panicked or was dropped).
    #[error("worker {worker_id:?} stopped before it registered")]
    Stopped {
        /// The worker id.
        worker_id: String,
    },
}

/// Builds a [`Worker`]: `Worker::builder().tool("payments.issue-refund", "1.0.0", handler)`.
pub struct WorkerBuilder {
    addr: String,
    worker_id: Option<String>,
    workload_identity: Option<String>,
    image_digest: String,
    token: Option<String>,
    tls: Option<ClientTls>,
    concurrency: u32,
    tools: Vec<Tool>,
}

impl fmt::Debug for WorkerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerBuilder")
            .field("addr", &self.addr)
            .field("worker_id", &self.worker_id)
            .field("token", &self.token.as_ref().map(|_| "…"))
            .field("tls", &self.tls)
            .field("concurrency", &self.concurrency)
            .field(
                "tools",
                &self
                    .tools
                    .iter()
                    .map(|t| format!("{}@{}", t.ad.tool, t.ad.version))
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl WorkerBuilder {
    /// The runtime's address (`host:port`, `http://…`, or `https://…` with [`tls`](Self::tls));
    /// default `127.0.0.1:7777`.
    #[must_use]
    pub fn runtime_addr(mut self, addr: impl Into<String>) -> Self {
        self.addr = addr.into();
        self
    }

    /// The stable worker id (default `rust-worker-<pid>`). A second worker registering the same
    /// id replaces this one.
    #[must_use]
    pub fn worker_id(mut self, id: impl Into<String>) -> Self {
        self.worker_id = Some(id.into());
        self
    }

    /// The workload identity recorded with each invocation (default the worker id). With a
    /// verified credential the runtime records the credential's name instead.
    #[must_use]
    pub fn workload_identity(mut self, identity: impl Into<String>) -> Self {
        self.workload_identity = Some(identity.into());
        self
    }

    /// The image digest the runtime's integrity rules may check.
    #[must_use]
    pub fn image_digest(mut self, digest: impl Into<String>) -> Self {
        self.image_digest = digest.into();
        self
    }

    /// An API token sent as `authorization: Bearer …` (the runtime's `required` auth mode; a
    /// `worker` role token limited to the tools served).
    #[must_use]
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Connects over TLS, verifying the runtime against the CA of `tls` and presenting its
    /// client certificate, if any (mutual TLS).
    #[must_use]
    pub fn tls(mut self, tls: ClientTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// How many calls the worker runs at once, over all its tools (default
    /// [`DEFAULT_CONCURRENCY`]); also what each tool advertises, unless
    /// [`tool_with`](Self::tool_with) says less.
    #[must_use]
    pub fn concurrency(mut self, calls: u32) -> Self {
        self.concurrency = calls.max(1);
        self
    }

    /// Serves `tool@version` with `handler`, an async function of the call's arguments (any
    /// `serde` type; arguments that do not deserialize are refused with `invalid_args` before
    /// the handler runs) and the [`Call`], returning a serializable result or a [`ToolError`].
    ///
    /// ```no_run
    /// use phrony_sdk::{Call, ToolError, Worker};
    /// #[derive(serde::Deserialize)]
    /// struct Refund { order_id: String, amount: f64 }
    /// let worker = Worker::builder().tool(
    ///     "payments.issue-refund",
    ///     "1.0.0",
    ///     |args: Refund, _call: Call| async move {
    ///         Ok::<_, ToolError>(serde_json::json!({"refund_id": format!("rf_{}", args.order_id), "amount": args.amount}))
    ///     },
    /// );
    /// ```
    #[must_use]
    pub fn tool<A, R, F, Fut>(self, tool: &str, version: &str, handler: F) -> Self
    where
        A: DeserializeOwned + Send + 'static,
        R: Serialize + Send + 'static,
        F: Fn(A, Call) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, ToolError>> + Send + 'static,
    {
        self.tool_with(tool, version, 0, handler)
    }

    /// [`tool`](Self::tool), advertising at most `max_concurrency` concurrent calls of this
    /// tool (0: the worker's concurrency).
    #[must_use]
    pub fn tool_with<A, R, F, Fut>(
        mut self,
        tool: &str,
        version: &str,
        max_concurrency: u32,
        handler: F,
    ) -> Self
    where
        A: DeserializeOwned + Send + 'static,
        R: Serialize + Send + 'static,
        F: Fn(A, Call) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, ToolError>> + Send + 'static,
    {
        let handler: ErasedHandler = Arc::new(move |raw: &[u8], call: Call| {
            let args: A = serde_json::from_slice(raw).map_err(|e| {
                ToolError::new("invalid_args", format!("the arguments do not fit: {e}"))
            })?;
            let running = handler(args, call);
            Ok(Box::pin(async move {
                let value = running.await?;
                serde_json::to_vec(&value).map_err(|e| {
                    ToolError::new("internal", format!("the result cannot be encoded: {e}"))
                })
            }) as BoxFuture)
        });
        self.tools.push(Tool {
            ad: HandlerAd {
                tool: tool.to_owned(),
                version: version.to_owned(),
                contract_version: String::new(),
                max_concurrency,
                descriptor_hash: String::new(),
            },
            handler,
        });
        self
    }

    /// Sets the descriptor hash (recorded for audit) of the tool added last.
    #[must_use]
    pub fn descriptor_hash(mut self, hash: impl Into<String>) -> Self {
        if let Some(tool) = self.tools.last_mut() {
            tool.ad.descriptor_hash = hash.into();
        }
        self
    }

    /// The worker, checked: at least one tool, no `tool@version` twice, nothing empty.
    ///
    /// # Errors
    /// [`WorkerError::Config`] naming what is wrong.
    pub fn build(self) -> Result<Worker, WorkerError> {
        let config = |reason: String| WorkerError::Config { reason };
        if self.tools.is_empty() {
            return Err(config("no tool to serve: add one with .tool(…)".to_owned()));
        }
        let mut tools = BTreeMap::new();
        for mut tool in self.tools {
            if tool.ad.tool.trim().is_empty() || tool.ad.version.trim().is_empty() {
                return Err(config(format!(
                    "a tool needs a name and a version (got {:?}@{:?})",
                    tool.ad.tool, tool.ad.version
                )));
            }
            let cap = if tool.ad.max_concurrency == 0 {
                self.concurrency
            } else {
                tool.ad.max_concurrency.min(self.concurrency)
            };
            tool.ad.max_concurrency = cap;
            let key = format!("{}@{}", tool.ad.tool, tool.ad.version);
            if tools.insert(key.clone(), tool).is_some() {
                return Err(config(format!("{key} is served twice")));
            }
        }
        let worker_id = self
            .worker_id
            .unwrap_or_else(|| format!("rust-worker-{}", std::process::id()));
        if worker_id.trim().is_empty() {
            return Err(config("the worker id is empty".to_owned()));
        }
        Ok(Worker {
            addr: self.addr,
            workload_identity: self.workload_identity.unwrap_or_else(|| worker_id.clone()),
            worker_id,
            image_digest: self.image_digest,
            token: self.token,
            tls: self.tls,
            concurrency: self.concurrency,
            tools: Arc::new(tools),
        })
    }
}

/// A tool worker, built by [`Worker::builder`]; [`start`](Self::start) runs it in the
/// background, [`run_until`](Self::run_until) until a shutdown signal.
pub struct Worker {
    addr: String,
    worker_id: String,
    workload_identity: String,
    image_digest: String,
    token: Option<String>,
    tls: Option<ClientTls>,
    concurrency: u32,
    tools: Arc<BTreeMap<String, Tool>>,
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("addr", &self.addr)
            .field("worker_id", &self.worker_id)
            .field("tools", &self.tools.keys().collect::<Vec<_>>())
            .field("concurrency", &self.concurrency)
            .finish_non_exhaustive()
    }
}

/// Where a running worker stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkerState {
    /// Connecting (first time, or again after the stream broke).
    Connecting,
    /// Registered and serving.
    Serving,
    /// Refused for good, or stopped (drained, or the runtime shut down).
    Stopped(Option<String>),
}

impl Worker {
    /// A builder with the defaults: runtime `127.0.0.1:7777`, worker id `rust-worker-<pid>`,
    /// [`DEFAULT_CONCURRENCY`] calls at once, no credential.
    #[must_use]
    pub fn builder() -> WorkerBuilder {
        WorkerBuilder {
            addr: "127.0.0.1:7777".to_owned(),
            worker_id: None,
            workload_identity: None,
            image_digest: String::new(),
            token: None,
            tls: None,
            concurrency: DEFAULT_CONCURRENCY,
            tools: Vec::new(),
        }
    }

    /// The worker id.
    #[must_use]
    pub fn id(&self) -> &str {
        &self.worker_id
    }

    /// Starts the worker on the current Tokio runtime. It connects and keeps reconnecting until
    /// drained, dropped with its [`RunningWorker`], refused for good, or the runtime shuts
    /// down.
    #[must_use]
    pub fn start(self) -> RunningWorker {
        let (state_tx, state) = watch::channel(WorkerState::Connecting);
        let drain = CancellationToken::new();
        let stop = CancellationToken::new();
        let worker_id = self.worker_id.clone();
        let task = tokio::spawn(
            Runner {
                worker: self,
                state: state_tx,
                drain: drain.clone(),
                stop: stop.clone(),
                shared: Arc::new(Shared::default()),
            }
            .run(),
        );
        RunningWorker {
            worker_id,
            state,
            drain,
            stop,
            task: Some(task),
        }
    }

    /// Runs the worker until `shutdown` resolves (e.g. `tokio::signal::ctrl_c()`), then
    /// drains it (see [`RunningWorker::drain`]).
    ///
    /// # Errors
    /// [`WorkerError::Refused`] when the runtime refuses the registration for good.
    pub async fn run_until<S: Future>(self, shutdown: S) -> Result<(), WorkerError> {
        let mut running = self.start();
        tokio::select! {
            ended = running.stopped() => ended,
            _ = shutdown => {
                running.drain(DEFAULT_DRAIN_TIMEOUT).await;
                Ok(())
            }
        }
    }
}

/// A started worker. Dropping it stops the worker at once (running calls are abandoned; the
/// runtime treats them as lost); [`drain`](Self::drain) stops it gracefully.
#[derive(Debug)]
pub struct RunningWorker {
    worker_id: String,
    state: watch::Receiver<WorkerState>,
    drain: CancellationToken,
    stop: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl RunningWorker {
    /// The worker id.
    #[must_use]
    pub fn id(&self) -> &str {
        &self.worker_id
    }

    /// The worker's state now.
    #[must_use]
    pub fn state(&self) -> WorkerState {
        self.state.borrow().clone()
    }

    /// Waits until the runtime confirmed the first registration.
    ///
    /// # Errors
    /// [`WorkerError::Refused`] when it refused the worker for good; [`WorkerError::Stopped`]
    /// when the worker stopped first.
    pub async fn registered(&mut self) -> Result<(), WorkerError> {
        let state = self
            .state
            .wait_for(|s| !matches!(s, WorkerState::Connecting))
            .await
            .map(|s| s.clone());
        match state {
            Ok(WorkerState::Serving) => Ok(()),
            Ok(WorkerState::Stopped(Some(reason))) => Err(self.refused(reason)),
            _ => Err(WorkerError::Stopped {
                worker_id: self.worker_id.clone(),
            }),
        }
    }

    fn refused(&self, reason: String) -> WorkerError {
        WorkerError::Refused {
            worker_id: self.worker_id.clone(),
            reason,
        }
    }

    /// Waits until the worker stops by itself.
    ///
    /// # Errors
    /// [`WorkerError::Refused`] when it stopped because the runtime refused it.
    pub async fn stopped(&mut self) -> Result<(), WorkerError> {
        let state = self
            .state
            .wait_for(|s| matches!(s, WorkerState::Stopped(_)))
            .await
            .map(|s| s.clone());
        match state {
            Ok(WorkerState::Stopped(Some(reason))) => Err(self.refused(reason)),
            _ => Ok(()),
        }
    }

    /// Stops gracefully: new calls are refused (nack `shutting_down`, which the runtime retries
    /// on another worker), running calls finish and their results are acknowledged, then the
    /// stream closes. After `timeout` whatever still runs is abandoned.
    pub async fn drain(mut self, timeout: Duration) {
        self.drain.cancel();
        if let Some(task) = self.task.take() {
            let abort = task.abort_handle();
            if tokio::time::timeout(timeout, task).await.is_err() {
                abort.abort();
            }
        }
    }
}

impl Drop for RunningWorker {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// What the connection loop and the call tasks share.
#[derive(Default)]
struct Shared {
    /// Calls running now, with their cancellation.
    running: Mutex<HashMap<String, CancellationToken>>,
    /// Results sent (or to send) and not yet acknowledged.
    unacked: Mutex<BTreeMap<String, Outcome>>,
    /// The stream now open, if any: a call that ends sends its result there (a call started
    /// on an earlier stream too).
    current: Mutex<Option<WorkSender>>,
}

impl Shared {
    fn in_flight(&self) -> Vec<String> {
        let mut ids: Vec<String> = lock(&self.running).keys().cloned().collect();
        ids.extend(lock(&self.unacked).keys().cloned());
        ids.sort();
        ids.dedup();
        ids
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The worker's connection loop.
struct Runner {
    worker: Worker,
    state: watch::Sender<WorkerState>,
    drain: CancellationToken,
    stop: CancellationToken,
    shared: Arc<Shared>,
}

/// How one connection ended.
enum Ended {
    /// Reconnect after a pause.
    Retry(String),
    /// Stop: drained, or the runtime shut down cleanly.
    Done,
    /// Stop: refused for good.
    Refused(String),
}

impl Runner {
    async fn run(self) {
        let slots = Arc::new(Semaphore::new(
            usize::try_from(self.worker.concurrency).unwrap_or(1),
        ));
        let mut calls: JoinSet<()> = JoinSet::new();
        let mut backoff = MIN_BACKOFF;
        let outcome = loop {
            let ended = tokio::select! {
                ended = self.connection(&slots, &mut calls, &mut backoff) => ended,
                () = self.stop.cancelled() => Ended::Done,
            };
            match ended {
                Ended::Done => break None,
                Ended::Refused(reason) => break Some(reason),
                Ended::Retry(reason) => {
                    if self.drain.is_cancelled() && self.shared.in_flight().is_empty() {
                        break None;
                    }
                    tracing::warn!(worker_id = %self.worker.worker_id, %reason, ?backoff, "Work stream lost; reconnecting");
                    self.state.send_replace(WorkerState::Connecting);
                    tokio::select! {
                        () = tokio::time::sleep(backoff) => {}
                        () = self.stop.cancelled() => break None,
                    }
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
            }
        };
        calls.abort_all();
        self.state.send_replace(WorkerState::Stopped(outcome));
    }

    fn registration(&self) -> Registration {
        Registration {
            worker_id: self.worker.worker_id.clone(),
            workload_identity: self.worker.workload_identity.clone(),
            image_digest: self.worker.image_digest.clone(),
            handlers: self.worker.tools.values().map(|t| t.ad.clone()).collect(),
            in_flight: self.shared.in_flight(),
        }
    }

    async fn connect(&self) -> Result<Client, ClientError> {
        Client::connect_with(
            &self.worker.addr,
            self.worker.tls.as_ref(),
            self.worker.token.as_deref(),
        )
        .await
    }

    /// One connection: register, serve until the stream ends.
    async fn connection(
        &self,
        slots: &Arc<Semaphore>,
        calls: &mut JoinSet<()>,
        backoff: &mut Duration,
    ) -> Ended {
        let client = match self.connect().await {
            Ok(client) => client,
            Err(
                e @ (ClientError::InvalidAddress { .. }
                | ClientError::InvalidToken { .. }
                | ClientError::Tls { .. }),
            ) => {
                return Ended::Refused(e.to_string());
            }
            Err(e) => return Ended::Retry(e.to_string()),
        };
        let (sender, mut stream) = match client.work(&self.registration()).await {
            Ok(pair) => pair,
            Err(e) => return classify(&e),
        };
        *lock(&self.shared.current) = Some(sender.clone());
        let mut heartbeat: Option<tokio::task::JoinHandle<()>> = None;
        let ended = loop {
            let event = tokio::select! {
                event = stream.next() => event,
                () = self.drain.cancelled(), if self.shared.in_flight().is_empty() => break Ended::Done,
                Some(_) = calls.join_next(), if !calls.is_empty() => {
                    if self.drain.is_cancelled() && self.shared.in_flight().is_empty() {
                        break Ended::Done;
                    }
                    continue;
                }
            };
            match event {
                Ok(Some(WorkEvent::Registered { lease_ttl, .. })) => {
                    *backoff = MIN_BACKOFF;
                    let every = (lease_ttl / 3).max(Duration::from_millis(100));
                    if let Some(beat) =
                        heartbeat.replace(tokio::spawn(heartbeats(sender.clone(), every)))
                    {
                        beat.abort();
                    }
                    self.state.send_replace(WorkerState::Serving);
                    self.resend_unacked(&sender, &mut stream).await;
                }
                Ok(Some(WorkEvent::Invoke(invocation))) => {
                    self.invoke(invocation, &sender, slots, calls).await;
                }
                Ok(Some(WorkEvent::Cancel { call_id })) => {
                    if let Some(token) = lock(&self.shared.running).get(&call_id) {
                        token.cancel();
                    }
                }
                Ok(Some(WorkEvent::ResultAck { call_id })) => {
                    lock(&self.shared.unacked).remove(&call_id);
                    if self.drain.is_cancelled() && self.shared.in_flight().is_empty() {
                        break Ended::Done;
                    }
                }
                Ok(Some(WorkEvent::HeartbeatAck)) => {}
                // The runtime shut down cleanly: it may come back.
                Ok(None) if self.drain.is_cancelled() => break Ended::Done,
                Ok(None) => break Ended::Retry("the runtime closed the stream".to_owned()),
                Err(e) => break classify(&e),
            }
        };
        if let Some(beat) = heartbeat {
            beat.abort();
        }
        lock(&self.shared.current).take();
        ended
    }

    /// After a (re)registration: the acks of already-recorded calls come first; results still
    /// unacknowledged after them are offered again.
    async fn resend_unacked(&self, sender: &WorkSender, stream: &mut WorkStream) {
        // Take the acks the runtime queued with the registration before offering anything again
        // (a result offered after its ack would be recorded as a late duplicate).
        while let Some(Ok(Some(event))) = futures::FutureExt::now_or_never(stream.next()) {
            if let WorkEvent::ResultAck { call_id } = event {
                lock(&self.shared.unacked).remove(&call_id);
            }
        }
        let pending: Vec<(String, Outcome)> = lock(&self.shared.unacked)
            .iter()
            .map(|(id, outcome)| (id.clone(), outcome.clone()))
            .collect();
        for (call_id, outcome) in pending {
            if send_outcome(sender, &call_id, outcome).await.is_err() {
                return;
            }
        }
    }

    async fn invoke(
        &self,
        invocation: Invocation,
        sender: &WorkSender,
        slots: &Arc<Semaphore>,
        calls: &mut JoinSet<()>,
    ) {
        let call_id = invocation.call_id.clone();
        if self.drain.is_cancelled() {
            let _ = sender
                .nack(&call_id, "shutting_down", "the worker is draining")
                .await;
            return;
        }
        if lock(&self.shared.running).contains_key(&call_id) {
            // Re-sent to a reconnected worker that already runs it.
            return;
        }
        let key = format!("{}@{}", invocation.tool, invocation.version);
        let Some(tool) = self.worker.tools.get(&key) else {
            let _ = sender
                .nack(
                    &call_id,
                    "unknown_handler",
                    &format!("this worker does not serve {key}"),
                )
                .await;
            return;
        };
        let cancel = CancellationToken::new();
        let call = Call {
            call_id: call_id.clone(),
            session_id: invocation.session_id,
            turn: invocation.turn,
            tool: invocation.tool,
            version: invocation.version,
            side_effect_class: invocation.side_effect_class,
            deadline: invocation.deadline,
            trace_context: invocation.trace_context,
            cancel: cancel.clone(),
        };
        let running = match (tool.handler)(&invocation.args, call) {
            Ok(running) => running,
            Err(refused) => {
                let _ = sender.nack(&call_id, &refused.code, &refused.message).await;
                return;
            }
        };
        lock(&self.shared.running).insert(call_id.clone(), cancel.clone());
        let shared = Arc::clone(&self.shared);
        let slots = Arc::clone(slots);
        let deadline = invocation.deadline;
        calls.spawn(async move {
            let outcome = tokio::select! {
                outcome = async {
                    let _slot = slots.acquire_owned().await;
                    running.await
                } => outcome,
                () = cancel.cancelled() => Err(cancelled()),
                () = until(deadline) => {
                    cancel.cancel();
                    Err(cancelled())
                }
            };
            lock(&shared.unacked).insert(call_id.clone(), outcome.clone());
            lock(&shared.running).remove(&call_id);
            // Without an open stream, or when the send fails (the stream broke), the result is
            // offered again after the reconnect.
            let current = lock(&shared.current).clone();
            if let Some(sender) = current {
                let _ = send_outcome(&sender, &call_id, outcome).await;
            }
        });
    }
}

fn cancelled() -> ToolError {
    ToolError::new("cancelled", "invoke cancelled or deadline exceeded")
}

/// Resolves at `deadline` (never without one).
async fn until(deadline: Option<SystemTime>) {
    match deadline {
        Some(at) => {
            let left = at
                .duration_since(SystemTime::now())
                .unwrap_or(Duration::ZERO);
            tokio::time::sleep(left).await;
        }
        None => std::future::pending().await,
    }
}

async fn send_outcome(
    sender: &WorkSender,
    call_id: &str,
    outcome: Outcome,
) -> Result<(), phrony_client::work::StreamClosed> {
    match outcome {
        Ok(payload) => sender.result(call_id, payload).await,
        Err(error) => sender.error(call_id, &error.code, &error.message).await,
    }
}

/// Whether a failed stream is worth reconnecting.
fn classify(error: &ClientError) -> Ended {
    match error.code() {
        Some(Code::InvalidArgument) if error.to_string().contains("shutting down") => {
            Ended::Retry(error.to_string())
        }
        Some(Code::InvalidArgument | Code::PermissionDenied | Code::Unauthenticated) => {
            Ended::Refused(error.to_string())
        }
        _ => Ended::Retry(error.to_string()),
    }
}

async fn heartbeats(sender: WorkSender, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.tick().await;
    loop {
        tick.tick().await;
        if sender.heartbeat().await.is_err() {
            return;
        }
    }
}
