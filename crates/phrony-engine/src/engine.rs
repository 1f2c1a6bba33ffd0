//! [`Engine`]: the public face of the session engine.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex};

use phrony_dispatch::Router;
use phrony_ledger::{
    AgentVersionRef, Attribution, EventBody, LeaseClaim, NewSession, OnLimit, Opening, Session,
    SessionEvent, SessionLimits, SessionMode, SessionPrincipal, SessionStatus, StatusChange,
    new_session_id,
};
use phrony_manifest::{ANNOTATION_POLICIES_COMPILED, ANNOTATION_STUB_SCRIPT, CompiledAgent};
use phrony_providers::{ApiKey, ModelProvider};
use secrecy::ExposeSecret as _;
use serde_json::{Value, json};
use tokio::sync::{Notify, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;
use uuid::Uuid;

use crate::clock::Clock;
use crate::config::EngineConfig;
use crate::driver;
use crate::error::{EngineError, ErrorKind, StoreError};
use crate::provider::{ProviderFactory, api_key_secret_name};
use crate::setup::{DriverSetup, PreparedAgent};
use crate::state::{Inner, first_user_message};
use crate::store::{LedgerStore, PlainSecret};
use crate::subscribe::Subscription;
use crate::timer;

/// What an [`Engine`] is built from.
pub struct EngineDeps {
    /// Durable state.
    pub store: Arc<LedgerStore>,
    /// Dispatches allowed tool calls to workers; `None` means no worker can ever be reached
    /// (every dispatch fails as `no_handler`).
    pub router: Option<Router>,
    /// Builds each session's model provider.
    pub providers: Arc<dyn ProviderFactory>,
    /// Wall-clock time.
    pub clock: Arc<dyn Clock>,
    /// Tunables.
    pub config: EngineConfig,
}

impl fmt::Debug for EngineDeps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EngineDeps")
            .field("store", &self.store)
            .field("router", &self.router.is_some())
            .field("providers", &self.providers)
            .field("clock", &self.clock)
            .field("config", &self.config)
            .finish()
    }
}

/// A request to start a session.
pub struct StartSession {
    /// The session id to use (`run_<uuid>`); `None` picks a new one.
    pub session_id: Option<String>,
    /// The agent version to run (its `agent_versions` id).
    pub agent_version_id: Uuid,
    /// That version prepared for driving: [`Engine::prepare_version`] (compiled once per
    /// version) or [`PreparedAgent::new`].
    pub agent: PreparedAgent,
    /// The input: a JSON object (its `message`, else `text`, else its JSON text is the first
    /// user message; `{}` means none) or a string (the first user message).
    pub input: Value,
    /// Caller metadata (e.g. a ticket id); policies see it as `session.metadata`.
    pub metadata: BTreeMap<String, String>,
    /// Task (completes when its turn ends) or conversation (parks at `awaiting_input`).
    pub mode: SessionMode,
    /// Claims of the principal the session acts for (a JSON object); policies see them.
    pub principal: Option<Value>,
    /// The resolved secrets: exactly the names the manifest declares.
    pub secrets: Vec<PlainSecret>,
    /// Who starts the session (recorded with its verification and relay).
    pub actor: Attribution,
    /// Set when the session runs a bundle's root member.
    pub bundle: Option<BundleStart>,
}

/// A session started from a bundle version: its root member runs, and its secret pool holds
/// the union of every member's secrets (delegated child sessions draw from it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BundleStart {
    /// The `bundle_versions` id.
    pub bundle_version_id: Uuid,
    /// The union of the members' secret names: the resolved secrets must be exactly these.
    pub secret_names: std::collections::BTreeSet<String>,
}

impl fmt::Debug for StartSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StartSession")
            .field("session_id", &self.session_id)
            .field("agent_version_id", &self.agent_version_id)
            .field("agent", &self.agent)
            .field("input", &self.input)
            .field("metadata", &self.metadata)
            .field("mode", &self.mode)
            .field("principal", &self.principal)
            .field("secrets", &self.secrets)
            .field("actor", &self.actor)
            .field("bundle", &self.bundle)
            .finish()
    }
}

/// A started session.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionHandle {
    /// `run_<uuid>`.
    pub id: String,
    /// The agent version it runs.
    pub agent_version_id: Uuid,
    /// Its status when the start returned (`running`).
    pub status: SessionStatus,
}

/// What [`Engine::recover`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Sessions whose driver was restarted.
    pub resumed: Vec<String>,
    /// Sessions that could not be resumed and were failed (e.g. their agent version no longer
    /// loads), with the reason.
    pub failed: Vec<(String, String)>,
    /// Sessions not resumed because the database was unavailable: they are not failed, and the
    /// engine resumes them when the database takes writes again.
    pub suspended: Vec<String>,
    /// Sessions left parked: every open call waits for a human (see
    /// [`EngineConfig::park_approval_waits`]), so a driver would only park again. A vote, the
    /// approval timer or the sweep resumes each when its wait is decided.
    pub parked: Vec<String>,
    /// Sessions another replica drives (its lease on them is held and unexpired; with session
    /// leases): left to it, and taken over by the lease scan if it dies.
    pub driven_elsewhere: Vec<String>,
}

/// The session engine. Cheap to clone; clones share everything.
///
/// Must be created inside a Tokio runtime: it spawns the durable approval timer, and one driver
/// task per live session.
#[derive(Clone)]
pub struct Engine {
    pub(crate) inner: Arc<Inner>,
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine")
            .field("store", &self.inner.store)
            .field("live_sessions", &self.inner.live_count())
            .finish_non_exhaustive()
    }
}

/// Parses the stored snapshot of agent version `id`; one that does not load is an internal
/// error (the ledger stores only snapshots that loaded when they were published).
fn load_snapshot(id: Uuid, snapshot_json: &str) -> Result<CompiledAgent, EngineError> {
    CompiledAgent::from_snapshot_json(snapshot_json.as_bytes()).map_err(|e| {
        EngineError::new(
            ErrorKind::Internal,
            format!("the stored snapshot of agent version {id} does not load: {e}"),
        )
    })
}

/// `spec.limits` as stored with the session (zero means unset).
pub(crate) fn session_limits(agent: &CompiledAgent) -> Option<SessionLimits> {
    let l = agent.spec.limits.as_ref()?;
    let pos = |v: i64| u64::try_from(v).ok().filter(|v| *v > 0);
    Some(SessionLimits {
        max_tokens_per_run: pos(l.max_tokens_per_run),
        max_loop_iterations: pos(l.max_loop_iterations),
        max_wall_clock_seconds: pos(l.max_wall_clock_seconds),
        max_hitl_wait_minutes: pos(l.max_hitl_wait_minutes),
        max_subagent_depth: pos(l.max_subagent_depth),
        on_limit: if l.on_limit == "escalate" {
            OnLimit::Escalate
        } else {
            OnLimit::Halt
        },
    })
}

/// The evidence snapshot (§5.11) without the compiler's annotations (the reference leaked the
/// stub script into it).
fn evidence(agent: &CompiledAgent) -> Option<Value> {
    let md = &agent.metadata;
    let annotations: BTreeMap<&String, &String> = md
        .annotations
        .iter()
        .filter(|(k, _)| {
            k.as_str() != ANNOTATION_POLICIES_COMPILED && k.as_str() != ANNOTATION_STUB_SCRIPT
        })
        .collect();
    let mut snapshot = serde_json::Map::new();
    if !md.owner.is_empty() {
        snapshot.insert("owner".into(), json!(md.owner));
    }
    if !md.labels.is_empty() {
        snapshot.insert("labels".into(), json!(md.labels));
    }
    if !annotations.is_empty() {
        snapshot.insert("annotations".into(), json!(annotations));
    }
    if let Some(g) = &md.governance {
        snapshot.insert(
            "governance".into(),
            serde_json::to_value(g).unwrap_or(Value::Null),
        );
    }
    (!snapshot.is_empty()).then_some(Value::Object(snapshot))
}

/// Checks that the resolved secrets are exactly the declared ones.
fn check_secrets(agent: &CompiledAgent, secrets: &[PlainSecret]) -> Result<(), EngineError> {
    if agent.secrets.is_empty() {
        if secrets.is_empty() {
            return Ok(());
        }
        return Err(EngineError::invalid(
            "resolved_secrets provided but manifest has no secrets section",
        ));
    }
    for s in secrets {
        if !agent.secrets.contains_key(&s.name) {
            return Err(EngineError::invalid(format!(
                "unknown resolved secret {:?}",
                s.name
            )));
        }
    }
    for name in agent.secrets.keys() {
        if !secrets.iter().any(|s| &s.name == name) {
            return Err(EngineError::invalid(format!(
                "missing resolved secret {name:?}"
            )));
        }
    }
    Ok(())
}

/// Checks a bundle session's resolved secrets against the union of its members' names.
fn check_secret_names(
    names: &std::collections::BTreeSet<String>,
    secrets: &[PlainSecret],
) -> Result<(), EngineError> {
    if names.is_empty() && !secrets.is_empty() {
        return Err(EngineError::invalid(
            "resolved_secrets provided but no bundle member declares secrets",
        ));
    }
    if let Some(s) = secrets.iter().find(|s| !names.contains(&s.name)) {
        return Err(EngineError::invalid(format!(
            "unknown resolved secret {:?}",
            s.name
        )));
    }
    if let Some(name) = names
        .iter()
        .find(|n| !secrets.iter().any(|s| &s.name == *n))
    {
        return Err(EngineError::invalid(format!(
            "missing resolved secret {name:?}"
        )));
    }
    Ok(())
}

/// The model API key among a session's secrets.
pub(crate) fn api_key(
    agent: &CompiledAgent,
    secrets: &[PlainSecret],
) -> Result<Option<ApiKey>, EngineError> {
    let name = api_key_secret_name(agent);
    let Some(secret) = secrets.iter().find(|s| s.name == name) else {
        return Ok(None);
    };
    let text = std::str::from_utf8(secret.value.expose_secret()).map_err(|_| {
        EngineError::invalid(format!(
            "secret {name:?} (the model API key) is not valid UTF-8"
        ))
    })?;
    Ok(Some(ApiKey::new(text.trim())))
}

impl Engine {
    /// Builds the engine and starts its durable approval timer.
    ///
    /// # Panics
    /// When called outside a Tokio runtime.
    #[must_use]
    pub fn new(deps: EngineDeps) -> Self {
        let approval_watchers = Arc::new(tokio::sync::Semaphore::new(
            deps.config.max_approval_watchers,
        ));
        let (unpark_tx, unpark_rx) = tokio::sync::mpsc::unbounded_channel();
        let inner = Arc::new(Inner {
            store: deps.store,
            router: deps.router,
            providers: deps.providers,
            clock: deps.clock,
            config: deps.config,
            live: Mutex::new(HashMap::new()),
            timer_kick: Arc::new(Notify::new()),
            stop: CancellationToken::new(),
            drivers: tokio_util::task::TaskTracker::new(),
            suspended: Mutex::new(HashSet::new()),
            resume_kick: Arc::new(Notify::new()),
            approval_watchers,
            unpark: unpark_tx,
            registered: tokio::sync::watch::channel(0).0,
            handover: Mutex::new(HashMap::new()),
            unparking: Mutex::new(HashSet::new()),
            prepared: Mutex::new(HashMap::new()),
            parked_traces: Mutex::new(HashMap::new()),
            handed_in: Mutex::new(HashMap::new()),
            adopted: Mutex::new(HashMap::new()),
            commit_feed: std::sync::OnceLock::new(),
        });
        let feed: Arc<dyn phrony_ledger::CommitListener> =
            Arc::new(crate::state::CommitFeed(Arc::downgrade(&inner)));
        inner.store.ledger().listen_to_commits(&feed);
        let _ = inner.commit_feed.set(feed);
        tokio::spawn(timer::run(Arc::downgrade(&inner), inner.stop.clone()));
        tokio::spawn(crate::lease::run(
            Arc::downgrade(&inner),
            inner.stop.clone(),
            |inner, session_id| async move {
                // Failures are the recovery path's (a session that cannot be resumed is failed
                // and logged there); resumed meanwhile by a decision is no failure.
                if let Err(e) = (Engine { inner }).unpark(&session_id).await
                    && e.kind != ErrorKind::FailedPrecondition
                {
                    tracing::warn!(%session_id, error = %e, "could not resume a session taken over");
                }
            },
        ));
        tokio::spawn(unpark_task(
            Arc::downgrade(&inner),
            inner.stop.clone(),
            unpark_rx,
        ));
        tokio::spawn(crate::resume::run(
            Arc::downgrade(&inner),
            inner.stop.clone(),
            |inner, only| async move {
                Engine { inner }
                    .recover_sessions(Some(&only))
                    .await
                    .map(|report| report.resumed)
            },
        ));
        Self { inner }
    }

    /// The factory of the sessions' model providers (and of where they send secrets).
    #[must_use]
    pub fn providers(&self) -> &dyn ProviderFactory {
        self.inner.providers.as_ref()
    }

    /// The router the engine dispatches through.
    #[must_use]
    pub fn router(&self) -> Option<&Router> {
        self.inner.router.as_ref()
    }

    /// Stored agent version `id` (content hash `content_hash`, stored snapshot
    /// `snapshot_json`) prepared for driving: compiled once per version and shared by its
    /// sessions, so a start of a version this engine prepared before parses and compiles
    /// nothing.
    ///
    /// # Errors
    /// `Internal` when the stored snapshot does not load; `InvalidArgument` when its policies
    /// or argument schemas do not compile, or its model configuration is unusable.
    pub fn prepare_version(
        &self,
        id: Uuid,
        content_hash: &str,
        snapshot_json: &str,
    ) -> Result<PreparedAgent, EngineError> {
        self.inner
            .prepare(id, content_hash, || load_snapshot(id, snapshot_json))
    }

    /// Starts a session: checks the request, persists the session (status `running`, its
    /// secrets sealed), and spawns its driver, which runs the first turn.
    ///
    /// # Errors
    /// `InvalidArgument` for a malformed input, principal or secret set, policies or schemas
    /// that do not compile, or an unusable model configuration (`FailedPrecondition` when the
    /// stub provider is disabled, the API key is missing, or secrets cannot be stored); the
    /// store's errors (metadata limits, unknown agent version, …).
    pub async fn start_session(&self, req: StartSession) -> Result<SessionHandle, EngineError> {
        self.open(req, None).await
    }

    /// [`Engine::start_session`], as the child of `parent` when given (a delegation: the ledger
    /// derives its root and depth from the parent).
    pub(crate) async fn open(
        &self,
        req: StartSession,
        parent: Option<String>,
    ) -> Result<SessionHandle, EngineError> {
        let StartSession {
            session_id,
            agent_version_id,
            agent,
            input,
            metadata,
            mode,
            principal,
            secrets,
            actor,
            bundle,
        } = req;
        if actor.actor.trim().is_empty() {
            return Err(EngineError::invalid("actor is required"));
        }
        let (agent, setup) = agent.parts();
        let input = match input {
            Value::String(s) => json!({ "message": s }),
            Value::Null => json!({}),
            other => other,
        };
        let first = first_user_message(&input)?;
        if first.is_none() && mode == SessionMode::Task && agent.spec.instructions.text.is_empty() {
            return Err(EngineError::invalid(
                "session input must include a user message or fields to send to the model",
            ));
        }
        if let Some(p) = &principal
            && !p.is_object()
        {
            return Err(EngineError::invalid(
                "principal claims must be a JSON object",
            ));
        }
        match &bundle {
            None => check_secrets(&agent, &secrets)?,
            Some(b) => check_secret_names(&b.secret_names, &secrets)?,
        }
        let key = api_key(&agent, &secrets)?;
        let provider = self
            .inner
            .providers
            .build(&agent, key, 0)
            .map_err(|e| provider_error(&e))?;
        let id = session_id.unwrap_or_else(new_session_id);
        let new = NewSession {
            id: id.clone(),
            agent_version_id,
            agent: AgentVersionRef::new(
                &agent.metadata.namespace,
                &agent.metadata.name,
                &agent.metadata.version,
            ),
            input,
            metadata,
            mode,
            parent_session_id: parent,
            limits: session_limits(&agent),
            bundle_version_id: bundle.as_ref().map(|b| b.bundle_version_id),
            secrets: Vec::new(),
            actor,
        };
        // The principal, the first user message and the evidence snapshot are written with
        // `session.started`, in one transaction: a crash cannot leave a session started
        // without them.
        let mut opening = Vec::new();
        if let Some(claims) = principal {
            opening.push(Opening::Engine(
                EventBody::SessionPrincipal(SessionPrincipal { claims })
                    .into_new_event("system")
                    .map_err(StoreError::from)?,
            ));
        }
        if let Some(text) = &first {
            opening.push(Opening::Session(SessionEvent::UserMessage {
                actor: new.actor.clone(),
                turn: 1,
                content: text.clone(),
            }));
        }
        if let Some(snapshot) = evidence(&agent) {
            opening.push(Opening::Session(SessionEvent::Evidence { snapshot }));
        }
        // With session leases, the driver's lease is acquired with the session (one
        // transaction) and left to it.
        let (session, claim) = self
            .inner
            .store
            .open_session(
                new,
                secrets,
                self.inner.config.max_sessions_per_agent,
                opening,
                self.inner.config.session_lease_ttl,
            )
            .await
            .map_err(|e| {
                if e.kind == ErrorKind::ResourceExhausted {
                    EngineError::exhausted(format!(
                        "{} (RUNTIME_MAX_SESSIONS_PER_AGENT); retry when some have ended",
                        e.message
                    ))
                } else {
                    e.into()
                }
            })?;
        let next_turn = if first.is_some() { 2 } else { 1 };
        let leased = match claim {
            Some(LeaseClaim::Granted(lease)) => {
                self.inner.leave_adopted(&session.id, lease.epoch);
                Some(lease.epoch)
            }
            // (A new session's lease is never held elsewhere; its driver would find out.)
            Some(LeaseClaim::Held(_)) | None => None,
        };
        if let Err(error) = self.spawn(session.clone(), agent, setup, provider, next_turn, 0, None)
        {
            if let Some(epoch) = leased.and_then(|e| self.inner.take_adopted(&session.id, Some(e)))
            {
                crate::lease::release(&self.inner, &session.id, epoch).await;
            }
            return Err(error);
        }
        Ok(SessionHandle {
            id,
            agent_version_id,
            status: session.status,
        })
    }

    #[allow(
        clippy::too_many_arguments,
        reason = "the pieces of one driver, handed over whole"
    )]
    fn spawn(
        &self,
        session: Session,
        agent: Arc<CompiledAgent>,
        setup: Arc<DriverSetup>,
        provider: Box<dyn ModelProvider>,
        next_turn: u32,
        started_turn: u32,
        expect: Option<Uuid>,
    ) -> Result<Option<oneshot::Receiver<SessionStatus>>, EngineError> {
        let Some(live) = self.inner.register(&session.id, next_turn, started_turn) else {
            return Err(EngineError::precondition(format!(
                "session {} is already active",
                session.id
            )));
        };
        // Before the driver runs, so it cannot take the decision unseen.
        let taken = expect.map(|id| live.expect_decision(id));
        let inner = Arc::clone(&self.inner);
        // A child of the current span: the RPC that started (or resumed) the session.
        let span = crate::trace::session(
            &session.id,
            &agent.qualified_name(),
            &agent.metadata.version,
            &session.agent_version_id,
        );
        if let Some(parked) = self.inner.take_parked_trace(&session.id) {
            // A parked session resumed: its trace goes on under its previous session span.
            crate::trace::continue_from(&span, &parked);
        }
        self.inner
            .drivers
            .spawn(driver::run(inner, live, session, agent, setup, provider).instrument(span));
        Ok(taken)
    }

    /// Drives a parked session again (see [`EngineConfig::park_approval_waits`]): when it is
    /// not live, not suspended and not ended, it is resumed from its event log (its driver
    /// takes the votes waiting for its decisions: [`crate::state::Inner::expect_decision`]).
    /// Answers whether a driver takes the session's decisions now: resumed here, live
    /// already, or being resumed by a concurrent caller (whose driver takes them); `false`
    /// when nothing was resumed (suspended, ended, a child) — no error either.
    ///
    /// # Errors
    /// Store errors; a session that cannot be resumed is failed and its error returned.
    pub(crate) async fn unpark(&self, session_id: &str) -> Result<bool, EngineError> {
        if self.inner.live(session_id).is_some() {
            return Ok(true);
        }
        if self.inner.is_suspended(session_id) {
            return Ok(false);
        }
        // One resume at a time: a decision, the sweep and a parking driver's re-check may all
        // ask at once, and each resume loads the agent, the secrets and the fold.
        let Some(_claim) = self.inner.begin_unpark(session_id) else {
            return Ok(true);
        };
        if self.inner.live(session_id).is_some() {
            return Ok(true);
        }
        let session = self.inner.store.get_session(session_id).await?;
        if session.status.is_terminal() || session.parent_session_id.is_some() {
            return Ok(false);
        }
        match self.resume(session, None).await {
            Ok(_) => {
                tracing::debug!(%session_id, "parked session resumed");
                Ok(true)
            }
            // Resumed meanwhile (by the recovery path): that driver takes it.
            Err(e)
                if e.kind == ErrorKind::FailedPrecondition
                    && self.inner.live(session_id).is_some() =>
            {
                Ok(true)
            }
            Err(e) if e.kind == ErrorKind::Unavailable => {
                tracing::warn!(%session_id, error = %e, "session suspended: database unavailable");
                self.inner.suspend(session_id);
                Ok(false)
            }
            Err(e) => {
                let message = format!("session could not be resumed: {}", e.message);
                tracing::error!(%session_id, error = %e, "resuming a parked session failed");
                self.inner
                    .store
                    .set_status(session_id, StatusChange::failed(message))
                    .await?;
                Err(e)
            }
        }
    }

    /// Queues a user message for a conversation session: it starts the next turn now if the
    /// session is parked, or after the running turn. Messages are recorded (durably) in the
    /// order they arrive and are never dropped; at most
    /// [`EngineConfig::max_queued_user_messages`] may wait for their turn to start. Returns the
    /// turn the message starts, or `None` when another replica drives the session (session
    /// leases on: [`EngineConfig::session_lease_ttl`]): the message is then queued for that
    /// replica in the ledger — durably before this returns, at most
    /// `max_queued_user_messages` in that queue — and its driver records it, numbering the
    /// turn, as soon as it hears of it (PostgreSQL's NOTIFY, else its next re-read).
    ///
    /// # Errors
    /// `InvalidArgument` for an empty text; `NotFound`; `FailedPrecondition` for a task-mode or
    /// ended session, one whose input is blocked by a limit, or (leases off) one not live in
    /// this engine; `ResourceExhausted` (nothing recorded) when the bound of waiting messages is
    /// reached.
    pub async fn send_user_message(
        &self,
        session_id: &str,
        actor: &Attribution,
        text: &str,
    ) -> Result<Option<u32>, EngineError> {
        if text.trim().is_empty() {
            return Err(EngineError::invalid("user_message.text must be non-empty"));
        }
        let actor = if actor.actor.trim().is_empty() {
            Attribution {
                actor: "user".to_owned(),
                ..actor.clone()
            }
        } else {
            actor.clone()
        };
        let session = self.inner.store.get_session(session_id).await?;
        if session.status.is_terminal() {
            return Err(EngineError::precondition(format!(
                "session {session_id} is {} and accepts no user messages",
                session.status
            )));
        }
        if session.mode == SessionMode::Task {
            return Err(EngineError::precondition(format!(
                "session {session_id} runs in task mode and takes no further user messages; \
                 start it in conversation mode to talk to it"
            )));
        }
        let Some(live) = self.inner.live(session_id) else {
            if self.inner.is_suspended(session_id) {
                return Err(EngineError::new(
                    ErrorKind::Unavailable,
                    format!(
                        "session {session_id} is suspended: the runtime's database is \
                         unavailable; retry later"
                    ),
                ));
            }
            if self.inner.config.session_lease_ttl.is_none() {
                return Err(EngineError::precondition(format!(
                    "session {session_id} is not active in this runtime"
                )));
            }
            // Driven by another replica (or by none this instant: the next driver takes it):
            // queued for it, durably, and announced (PostgreSQL) so it records it at once.
            self.inner
                .store
                .queue_user_message(
                    session_id,
                    &actor,
                    text,
                    self.inner.config.max_queued_user_messages,
                )
                .await?;
            return Ok(None);
        };
        let turn = {
            let mut input = live.input.lock().await;
            if let Some(reason) = &input.blocked {
                return Err(EngineError::precondition(format!(
                    "session {session_id} accepts no further input: {reason}"
                )));
            }
            let queued = input.queued();
            let max = self.inner.config.max_queued_user_messages;
            if usize::try_from(queued).unwrap_or(usize::MAX) >= max {
                return Err(EngineError::exhausted(format!(
                    "session {session_id} has {queued} user messages waiting for their turn; at \
                     most {max} may wait (RUNTIME_MAX_QUEUED_USER_MESSAGES), so this one was not \
                     recorded: send it after the session answered"
                )));
            }
            let turn = input.next_turn;
            self.inner
                .store
                .record_session_event(
                    session_id,
                    SessionEvent::UserMessage {
                        actor,
                        turn,
                        content: text.to_owned(),
                    },
                )
                .await?;
            input.next_turn += 1;
            turn
        };
        live.inbox.notify_one();
        // Recorded here: its readers find it among the live session's held events.
        live.notify_local();
        Ok(Some(turn))
    }

    /// Cancels a session: `cancelled`, its pending approvals closed, its open calls cancelled
    /// (workers get `WorkToolCancel`), its secrets purged.
    ///
    /// # Errors
    /// `NotFound`: `session X not found or already terminal` (also for an ended session).
    pub async fn cancel_session(
        &self,
        session_id: &str,
        actor: &Attribution,
    ) -> Result<Session, EngineError> {
        self.end(
            session_id,
            StatusChange::cancelled().by(actor_or_system(actor)),
        )
        .await
    }

    /// Completes a session: `completed` with the last assistant message as output; the same
    /// effects as a cancel otherwise.
    ///
    /// # Errors
    /// `NotFound`: `session X not found or already terminal`.
    pub async fn complete_session(
        &self,
        session_id: &str,
        actor: &Attribution,
    ) -> Result<Session, EngineError> {
        let fold = self.inner.fold(session_id).await.map_err(|e| {
            if e.kind == ErrorKind::NotFound {
                EngineError::not_found(format!(
                    "session {session_id} not found or already terminal"
                ))
            } else {
                e
            }
        })?;
        self.end(
            session_id,
            StatusChange::completed(Some(fold.output()))
                .by(actor_or_system(actor))
                .because("completed on request"),
        )
        .await
    }

    /// Stops the drivers of sessions the store has already ended by another path (an agent
    /// version retired, an agent archived): their in-flight dispatches are cancelled (workers
    /// get `WorkToolCancel`) and nothing more is recorded for them. Sessions not live here, or
    /// still running in the store, are left alone.
    ///
    /// # Errors
    /// Store errors.
    pub async fn stop_ended_sessions(&self, session_ids: &[String]) -> Result<(), EngineError> {
        // The ledger closed the ended sessions' pending approvals with the lifecycle change.
        if !session_ids.is_empty() {
            self.inner.store.approvals_changed();
        }
        Ok(self.inner.stop_ended(session_ids).await?)
    }

    async fn end(&self, session_id: &str, change: StatusChange) -> Result<Session, EngineError> {
        let gone = || {
            EngineError::not_found(format!(
                "session {session_id} not found or already terminal"
            ))
        };
        let current = self
            .inner
            .store
            .get_session(session_id)
            .await
            .map_err(|e| {
                if e.kind == ErrorKind::NotFound {
                    gone()
                } else {
                    e.into()
                }
            })?;
        if current.status.is_terminal() {
            return Err(gone());
        }
        let changed = match self.inner.store.set_status(session_id, change).await {
            Ok(c) => c,
            Err(e) if e.kind == ErrorKind::FailedPrecondition => {
                let now = self.inner.store.get_session(session_id).await?;
                if now.status.is_terminal() {
                    return Err(gone());
                }
                return Err(e.into());
            }
            Err(e) => return Err(e.into()),
        };
        if let Some(live) = self.inner.live(session_id) {
            live.cancel.cancel();
            live.bump_approvals();
            live.notify_changed();
        } else {
            // Driven by another replica: its driver stops now, not at its next step.
            crate::lease::announce(&self.inner, session_id);
        }
        Ok(changed.session)
    }

    /// Resumes every session the store has not seen end and that is not live (at daemon start,
    /// and by the engine itself after a storage outage suspended sessions): sessions
    /// waiting for a decision stay paused until it comes; calls that were in flight are handled
    /// by side-effect class (§5.8); interrupted model turns are run again from the event log;
    /// parked conversations wait for their next message.
    ///
    /// # Errors
    /// Store errors listing the sessions; per-session failures are reported in the result.
    pub async fn recover(&self) -> Result<RecoveryReport, EngineError> {
        self.recover_sessions(None).await
    }

    /// [`Engine::recover`], limited to the sessions in `only` when given (the resume task passes
    /// the suspended ones, so that a session being started right now, which is not live yet, is
    /// left to its starter).
    pub(crate) async fn recover_sessions(
        &self,
        only: Option<&HashSet<String>>,
    ) -> Result<RecoveryReport, EngineError> {
        let mut report = RecoveryReport::default();
        let resting = if self.inner.config.park_approval_waits {
            self.inner.store.sessions_resting_on_approvals().await?
        } else {
            HashSet::new()
        };
        // Page by page: a restart with many sessions left holds one page in memory.
        let mut after = None;
        loop {
            let page = self
                .inner
                .store
                .sessions_needing_recovery_after(after.take(), RECOVERY_PAGE)
                .await?;
            let full = page.len() == RECOVERY_PAGE as usize;
            after = page.last().map(|s| (s.created_at, s.id.clone()));
            let elsewhere = self.leased_elsewhere(&page).await?;
            for session in page {
                if session.parent_session_id.is_some()
                    || self.inner.live(&session.id).is_some()
                    || only.is_some_and(|ids| !ids.contains(&session.id))
                {
                    continue;
                }
                if elsewhere.contains(&session.id) {
                    // Its driver is alive on another replica: loading it here would only
                    // find the lease held.
                    report.driven_elsewhere.push(session.id);
                    continue;
                }
                if self.rests_parked(&session, &resting) {
                    report.parked.push(session.id);
                    continue;
                }
                match self.resume(session.clone(), None).await {
                    Ok(_) => report.resumed.push(session.id),
                    // A decision resumed it meanwhile (a parked session): it is driven.
                    Err(e)
                        if e.kind == ErrorKind::FailedPrecondition
                            && self.inner.live(&session.id).is_some() => {}
                    Err(e) if e.kind == ErrorKind::Unavailable => {
                        // A storage outage is no reason to fail the session: it waits for the
                        // database, and the resume task tries again.
                        tracing::warn!(
                            session_id = %session.id,
                            error = %e,
                            "session suspended: database unavailable"
                        );
                        self.inner.suspend(&session.id);
                        report.suspended.push(session.id);
                    }
                    Err(e) => {
                        let message = format!("session could not be resumed: {}", e.message);
                        tracing::error!(session_id = %session.id, error = %e, "recovery failed");
                        if let Err(err) = self
                            .inner
                            .store
                            .set_status(&session.id, StatusChange::failed(message.clone()))
                            .await
                        {
                            tracing::error!(
                                session_id = %session.id,
                                error = %err,
                                "could not fail an unrecoverable session"
                            );
                        }
                        report.failed.push((session.id, message));
                    }
                }
            }
            if !full {
                break;
            }
        }
        self.inner.timer_kick.notify_one();
        Ok(report)
    }

    /// The sessions of `page` another replica drives now (with session leases; none without).
    async fn leased_elsewhere(&self, page: &[Session]) -> Result<HashSet<String>, EngineError> {
        if self.inner.config.session_lease_ttl.is_none() {
            return Ok(HashSet::new());
        }
        let ids: Vec<String> = page.iter().map(|s| s.id.clone()).collect();
        self.inner
            .store
            .ledger()
            .sessions_leased_elsewhere(&ids)
            .await
            .map_err(|e| EngineError::from(crate::error::StoreError::from(e)))
    }

    /// Whether a session found at start can stay unloaded: a root task session (parking on)
    /// without an approval-wait budget, in `awaiting_approval`, whose every open call waits on
    /// a pending approval (`resting`: one ledger query for all sessions,
    /// [`LedgerStore::sessions_resting_on_approvals`]). Such a session's driver would load,
    /// find nothing to do and park again; leaving it unloaded keeps a restart with many
    /// sessions waiting for people as cheap as the waiting itself. A completion's calls are
    /// recorded together (with the completion, or in one batch), so a resting session has no
    /// call that only its event log knows.
    fn rests_parked(&self, session: &Session, resting: &HashSet<String>) -> bool {
        self.inner.config.park_approval_waits
            && session.mode == SessionMode::Task
            && session.status == SessionStatus::AwaitingApproval
            && session
                .limits
                .as_ref()
                .is_none_or(|l| l.max_hitl_wait_minutes.is_none())
            && resting.contains(&session.id)
    }

    /// Stored agent version `id` prepared for driving: kept from an earlier preparation, or
    /// read and prepared now.
    pub(crate) async fn prepared_version(&self, id: Uuid) -> Result<PreparedAgent, EngineError> {
        if let Some(hit) = self.inner.prepared(id) {
            return Ok(hit);
        }
        let stored = self.inner.store.agent_version(id).await?;
        self.prepare_version(id, &stored.content_hash, &stored.snapshot_json)
    }

    pub(crate) async fn resume(
        &self,
        session: Session,
        expect: Option<Uuid>,
    ) -> Result<Option<oneshot::Receiver<SessionStatus>>, EngineError> {
        let (agent, setup) = self
            .prepared_version(session.agent_version_id)
            .await?
            .parts();
        let secrets = self.inner.store.load_secrets(&session.id).await?;
        let key = api_key(&agent, &secrets)?;
        let fold = self.inner.fold(&session.id).await?;
        let completions = usize::try_from(fold.completions).unwrap_or(usize::MAX);
        let provider = self
            .inner
            .providers
            .build(&agent, key, completions)
            .map_err(|e| provider_error(&e))?;
        let has_first = first_user_message(&session.input).ok().flatten().is_some();
        let next_turn = fold
            .max_user_turn
            .max(fold.max_started_turn)
            .max(u32::from(has_first))
            + 1;
        let started_turn = fold.max_started_turn;
        self.spawn(
            session,
            agent,
            setup,
            provider,
            next_turn,
            started_turn,
            expect,
        )
    }

    /// Follows a session's events after `after_seq` (0 for all), then live, until it ends. A
    /// subscriber that reads slowly is fed from the store again and never loses an event;
    /// streamed model text ([`SessionUpdate::TextDelta`]) is best-effort.
    ///
    /// # Errors
    /// `NotFound` for an unknown session.
    pub async fn subscribe(
        &self,
        session_id: &str,
        after_seq: u64,
    ) -> Result<Subscription, EngineError> {
        self.inner.store.get_session(session_id).await?;
        Ok(Subscription::start(
            Arc::clone(&self.inner),
            session_id.to_owned(),
            after_seq,
        ))
    }

    /// Waits until the session is in one of `statuses` or has ended, and returns it.
    ///
    /// # Errors
    /// Store errors (`NotFound`).
    pub async fn wait_for(
        &self,
        session_id: &str,
        statuses: &[SessionStatus],
    ) -> Result<Session, EngineError> {
        loop {
            let mut registered = self.inner.registered.subscribe();
            let changed = self.inner.live(session_id).map(|l| l.changed.subscribe());
            let session = self.inner.store.get_session(session_id).await?;
            if session.status.is_terminal() || statuses.contains(&session.status) {
                return Ok(session);
            }
            let poll = self.inner.config.poll_interval;
            match changed {
                Some(mut rx) => {
                    let _ = tokio::time::timeout(poll, rx.changed()).await;
                }
                // Not live here (parked, or driven elsewhere): look again when a session
                // becomes live or at the next poll.
                None => {
                    let _ = tokio::time::timeout(poll, registered.changed()).await;
                }
            }
        }
    }

    /// The sessions suspended by a storage outage: their driver stopped on a write the
    /// database could not take; they are not failed, and the engine resumes them (through
    /// [`Engine::recover`]) as soon as a write probe succeeds. Sorted.
    #[must_use]
    pub fn suspended_sessions(&self) -> Vec<String> {
        let mut ids: Vec<String> = self
            .inner
            .suspended
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .cloned()
            .collect();
        ids.sort();
        ids
    }

    /// Whether `session_id` has a driver in memory here. A session waiting only for humans is
    /// *parked* (no driver, see [`EngineConfig::park_approval_waits`]); so is one driven by
    /// another process, or ended.
    #[must_use]
    pub fn is_driven(&self, session_id: &str) -> bool {
        self.inner.live(session_id).is_some()
    }

    /// How many sessions have a driver in memory here.
    #[must_use]
    pub fn driven_sessions(&self) -> usize {
        self.inner.live_count()
    }

    /// Stops the engine's tasks: drivers stop where they are (sessions keep their status and
    /// are resumed by the next [`Engine::recover`]), the approval timer stops.
    pub fn shutdown(&self) {
        self.inner.stop.cancel();
    }

    /// After [`Engine::shutdown`]: waits up to `limit` for the session drivers to return (each
    /// stops at its next await point), so their last writes and trace spans are complete.
    /// Returns whether they all did.
    pub async fn drained(&self, limit: std::time::Duration) -> bool {
        self.inner.drivers.close();
        tokio::time::timeout(limit, self.inner.drivers.wait())
            .await
            .is_ok()
    }
}

fn actor_or_system(actor: &Attribution) -> Attribution {
    if actor.actor.trim().is_empty() {
        Attribution::from("system")
    } else {
        actor.clone()
    }
}

pub(crate) fn provider_error(e: &phrony_providers::ProviderError) -> EngineError {
    use phrony_providers::ProviderError as P;
    let kind = match e {
        P::StubDisabled | P::MissingApiKey { .. } => ErrorKind::FailedPrecondition,
        _ => ErrorKind::InvalidArgument,
    };
    EngineError::new(kind, e.to_string())
}

/// How far before the last sweep the next one looks: decisions recorded with another process's
/// clock, or committed while the last sweep read, are not missed.
const SWEEP_OVERLAP: chrono::Duration = chrono::Duration::seconds(60);

/// Sessions one sweep resumes at most (the rest at the next one).
const SWEEP_LIMIT: u32 = 10_000;

/// Sessions read per page by recovery ([`Engine::recover`]).
const RECOVERY_PAGE: u32 = 1000;

/// Resumes the parked sessions [`Inner::request_unpark`] names (a decision, an expiry or a
/// cancellation reached a session whose driver is unloaded). Holds only a weak reference, so
/// the engine can drop.
async fn unpark_task(
    inner: std::sync::Weak<Inner>,
    stop: CancellationToken,
    mut requests: tokio::sync::mpsc::UnboundedReceiver<String>,
) {
    // The safety net, like the live wait's re-read: a decision recorded by another process (or
    // straight into the store) wakes nobody here, so the decisions since the last sweep are
    // looked at periodically. The cost follows those decisions, not the sessions waiting.
    let (period, mut swept) = match inner.upgrade() {
        Some(inner) => (inner.config.poll_interval * 10, inner.clock.now()),
        None => return,
    };
    let mut sweep = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let (ids, sweep_started) = tokio::select! {
            () = stop.cancelled() => return,
            id = requests.recv() => match id {
                Some(id) => (vec![id], None),
                None => return,
            },
            _ = sweep.tick() => {
                let Some(inner) = inner.upgrade() else {
                    return;
                };
                let started = inner.clock.now();
                match inner
                    .store
                    .sessions_with_waits_decided_since(swept - SWEEP_OVERLAP, SWEEP_LIMIT)
                    .await
                {
                    Ok(ids) => (
                        ids.into_iter().filter(|id| inner.live(id).is_none()).collect(),
                        Some(started),
                    ),
                    Err(e) => {
                        tracing::debug!(error = %e, "could not sweep the parked sessions");
                        (Vec::new(), None)
                    }
                }
            }
        };
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let engine = Engine { inner };
        let mut all_resumed = true;
        for id in ids {
            if let Err(e) = engine.unpark(&id).await {
                all_resumed = false;
                tracing::warn!(session_id = %id, error = %e, "could not resume a parked session");
            }
        }
        // The window moves on only when every session it found was resumed: a failed resume is
        // tried again at the next sweep.
        if let Some(started) = sweep_started
            && all_resumed
        {
            swept = started;
        }
    }
}
