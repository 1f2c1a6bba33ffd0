//! The decision engine: one request in, one recorded decision out.
//!
//! # Order of checks (documented assumption, Appendix A.4)
//!
//! 1. identity: the agent is registered, the key is not bound to another agent
//!    (`IDENTITY_NOT_RESOLVED`), the agent is active (`AGENT_NOT_ACTIVE`);
//! 2. velocity (`VELOCITY_EXCEEDED`, HTTP 200);
//! 3. tool catalog (`TOOL_NOT_ALLOWED`);
//! 4. the user's `id_token` (`IDENTITY_NOT_RESOLVED` when it does not verify);
//! 5. policy: hard forbids, no permit, missing or mistyped facts (`POLICY_DENIED`);
//! 6. mandate: found, active, in the purchase currency (`MANDATE_NOT_FOUND`), per-tx, daily,
//!    monthly and per-entity caps (`MANDATE_LIMIT_EXCEEDED`), the relational cap
//!    (`EXCEEDS_REFERENCE`);
//! 7. duplicates (`DUPLICATE_REQUEST`);
//! 8. risk (`RISK_THRESHOLD_EXCEEDED`);
//! 9. escalation (`ESCALATION_REQUIRED`): a Cedar `@escalate` forbid or an amount above the
//!    escalation threshold;
//! 10. allow: the amount is held against the mandate's counters and a token is minted.
//!
//! Every hard check runs before escalation, so a request a human could not lawfully approve
//! is never sent to one.
//!
//! # Idempotency and escalation (§1.14)
//!
//! A key is bound to the fingerprint of the first request that used it. The same key with
//! another fingerprint is refused with HTTP 409. With the same fingerprint: an allow is
//! replayed (same `decision_id`, fresh token, nothing counted again) unless its action was
//! completed as failed or aborted, in which case the request is decided afresh; a pending
//! escalation answers again with the same `ref`; an approved one re-runs every hard check and
//! allows once (the approval is consumed); a rejected or expired one is denied
//! `POLICY_DENIED` naming the rejection or expiry; a deny is re-evaluated.
//!
//! # Holds
//!
//! An allow holds its amount against the day, month, entity and reference counters.
//! `complete(success)` commits it; `failed`/`aborted` releases it. A hold that is never
//! completed keeps counting (conservative, documented assumption A.5).

use std::collections::BTreeMap;
use std::sync::Arc;

use chrono::{DateTime, SecondsFormat, Utc};
use rust_decimal::Decimal;
use serde_json::{Map, Value, json};
use tokio::sync::{Mutex, MutexGuard};

use crate::admin::ApproverName;
use crate::cedar::CedarVerdict;
use crate::config::{
    AgentSettings, AgentStatus, Auth, DERIVED_FACTS, FlagRules, Mandate, RiskCondition, Settings,
    ToolSettings,
};
use crate::error::{ApiError, GateError};
use crate::keys::SigningKey;
use crate::log_writer::{LogStats, LogWriter, Ticket};
use crate::money::display;
use crate::oidc::{VerifiedUser, Verifier};
use crate::request::{DecisionRequest, Money, Prepared, excerpt, json_kind, prepare};
use crate::signing::{self, Assertion, SignedRequest};
use crate::state::{
    ApprovalEvent, ApprovalOutcome, ApprovalRecord, ApprovalStatus, Approver, CompleteStatus,
    CompletionEvent, ConsoleLoginEvent, Counter, DecisionEvent, DecisionRecord, EV_APPROVAL,
    EV_COMPLETED, EV_CONSOLE_LOGIN, EV_DECISION, EV_REPLAY, Escalation, Hold, HoldOutcome,
    HoldState, ReplayEvent, State, Verdict, windows,
};
use crate::store::{AuditEvent, GateStore, NewAuditEvent};
use crate::tokens::{
    Commitment, ISSUER, mandate_commitment, mint_allow, policy_commitment, receipt_claims,
    set_amount,
};

/// The decision codes of §1.5.
pub mod codes {
    /// The agent id does not resolve, the key is bound to another agent, or the user token
    /// does not verify.
    pub const IDENTITY_NOT_RESOLVED: &str = "IDENTITY_NOT_RESOLVED";
    /// The agent is suspended or revoked.
    pub const AGENT_NOT_ACTIVE: &str = "AGENT_NOT_ACTIVE";
    /// A policy forbade it, no permit matched, or a fact was missing or mistyped.
    pub const POLICY_DENIED: &str = "POLICY_DENIED";
    /// The tool or action is not in the agent's catalog.
    pub const TOOL_NOT_ALLOWED: &str = "TOOL_NOT_ALLOWED";
    /// No active mandate in the purchase currency.
    pub const MANDATE_NOT_FOUND: &str = "MANDATE_NOT_FOUND";
    /// Over a per-tx, daily, monthly or per-entity cap.
    pub const MANDATE_LIMIT_EXCEEDED: &str = "MANDATE_LIMIT_EXCEEDED";
    /// The risk score is above the threshold.
    pub const RISK_THRESHOLD_EXCEEDED: &str = "RISK_THRESHOLD_EXCEEDED";
    /// Too many decisions for the agent in the window.
    pub const VELOCITY_EXCEEDED: &str = "VELOCITY_EXCEEDED";
    /// An identical money request was allowed moments ago.
    pub const DUPLICATE_REQUEST: &str = "DUPLICATE_REQUEST";
    /// A human must approve.
    pub const ESCALATION_REQUIRED: &str = "ESCALATION_REQUIRED";
    /// The relational cap: refunds above the original charge, cumulatively.
    pub const EXCEEDS_REFERENCE: &str = "EXCEEDS_REFERENCE";
}

/// The gate's clock (injectable for tests).
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Now, in UTC.
    fn now(&self) -> DateTime<Utc>;
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// Who is calling: the result of checking the bearer key and the request signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    /// The bearer key.
    pub api_key: String,
    /// The agent the key is bound to, if any.
    pub bound_agent: Option<String>,
    /// The key's label.
    pub key_label: Option<String>,
    /// How the request was signed.
    pub assertion: Assertion,
}

/// Whether the routing routes may forward a recorded decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardState {
    /// No such decision.
    Unknown,
    /// Not completed and decided by this run: it may be claimed and forwarded once.
    Open,
    /// Completed: never forwarded again.
    Completed(CompleteStatus),
    /// A routed allow an earlier run of the gate decided and never completed: it may have been
    /// forwarded before the gate stopped. Never forwarded again until someone with the org key
    /// completes it (`failed` lets a retry be decided and forwarded afresh; `success` keeps it
    /// answered).
    OutcomeUnknown,
}

/// Approve or reject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// Approve.
    Approve,
    /// Reject.
    Reject,
}

/// How the person deciding an escalation was authenticated.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Vouch<'a> {
    /// Their `id_token` (verified against the IdP).
    IdToken(&'a str),
    /// The admin key vouches for the name given.
    AdminKey,
    /// A console login: the gate checked the manager's password; `role` is the login's role.
    Manager {
        /// The role configured for the login.
        role: &'a str,
    },
}

/// The outcome of the pipeline before it is recorded.
#[derive(Debug)]
enum Outcome {
    Allow {
        policies: Vec<String>,
        mandate: Option<Mandate>,
        hold: Option<Hold>,
        risk: Option<f64>,
    },
    Deny {
        code: &'static str,
        reason: String,
        currency: Option<String>,
        policies: Vec<String>,
    },
    Escalate {
        approver: String,
        reason: String,
        policies: Vec<String>,
        mandate: Option<Mandate>,
    },
}

/// A refusal from the mandate checks (kept small; it becomes an [`Outcome::Deny`]).
#[derive(Debug)]
struct Refusal {
    code: &'static str,
    reason: String,
    /// The purchase currency, when the refusal is about an amount.
    currency: Option<String>,
    /// The policies that decided it (a forbid names its policies).
    policies: Vec<String>,
}

fn refuse(code: &'static str, reason: impl Into<String>) -> Refusal {
    Refusal {
        code,
        reason: reason.into(),
        currency: None,
        policies: Vec::new(),
    }
}

/// A refusal about an amount: it names the purchase currency.
fn refuse_in(code: &'static str, reason: impl Into<String>, money: &Money) -> Refusal {
    Refusal {
        currency: Some(money.currency.clone()),
        ..refuse(code, reason)
    }
}

impl From<Refusal> for Outcome {
    fn from(r: Refusal) -> Self {
        Self::Deny {
            code: r.code,
            reason: r.reason,
            currency: r.currency,
            policies: r.policies,
        }
    }
}

/// What the policy step passes on: the policies that permitted (or escalated) the request,
/// and the escalation an `@escalate` forbid asks for.
#[derive(Debug, Default)]
struct PolicyPass {
    policies: Vec<String>,
    escalation: Option<PendingEscalation>,
}

/// An escalation a step asked for; it is answered only after every hard check passed.
#[derive(Debug)]
struct PendingEscalation {
    approver: String,
    reason: String,
    policies: Vec<String>,
}

/// One mandate checked against one amount: the caps counted with the amount.
#[derive(Debug, Clone, Copy)]
struct MandateTerms<'a> {
    id: &'a str,
    mandate: &'a Mandate,
    money: &'a Money,
}

impl MandateTerms<'_> {
    /// The per-transaction cap (`MANDATE_LIMIT_EXCEEDED`).
    fn check_per_tx(&self) -> Result<(), Refusal> {
        let Self { id, mandate, money } = *self;
        if let Some(cap) = mandate.per_tx_limit
            && money.amount > cap
        {
            return Err(refuse_in(
                codes::MANDATE_LIMIT_EXCEEDED,
                format!(
                    "{} {} is over the per-transaction limit {} of mandate `{id}`",
                    display(money.amount),
                    money.currency,
                    display(cap)
                ),
                money,
            ));
        }
        Ok(())
    }

    /// The daily and monthly caps, counted with what is already held in the UTC day and
    /// month (`MANDATE_LIMIT_EXCEEDED`). Passes on the hold for those windows.
    fn check_periods(&self, state: &State, now: DateTime<Utc>) -> Result<Hold, Refusal> {
        let Self { id, mandate, money } = *self;
        let (day, month) = windows(now);
        if let Some(cap) = mandate.daily_limit {
            let total = state.usage(&Counter::Day(id.into(), day.clone())) + money.amount;
            if total > cap {
                return Err(self.over("daily", cap, total));
            }
        }
        if let Some(cap) = mandate.monthly_limit {
            let total = state.usage(&Counter::Month(id.into(), month.clone())) + money.amount;
            if total > cap {
                return Err(self.over("monthly", cap, total));
            }
        }
        Ok(Hold {
            mandate_id: id.to_owned(),
            amount: money.amount,
            day,
            month,
            entity: None,
            reference: None,
            reference_amount: None,
        })
    }

    /// The per-entity sub-budget, keyed by a fact: it applies whenever the fact is sent; a
    /// request without the fact is skipped only when the mandate says the sub-budget is
    /// optional, and fails closed otherwise. A fact sent with another type or empty is refused
    /// either way (it cannot be counted, and must not dodge the budget). Passes on the entity
    /// the hold counts against.
    fn check_entity(
        &self,
        state: &State,
        req: &DecisionRequest,
        month: &str,
    ) -> Result<Option<String>, Refusal> {
        let Self { id, mandate, money } = *self;
        let (Some(cap), Some(key)) = (mandate.per_entity_limit, &mandate.entity_key) else {
            return Ok(None);
        };
        let entity = match req.context.get(key) {
            Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
            Some(other) => {
                return Err(refuse(
                    codes::POLICY_DENIED,
                    format!(
                        "fail closed: fact `{key}` must be a non-empty string, got `{}`",
                        excerpt(other)
                    ),
                ));
            }
            None if mandate.entity_optional => return Ok(None),
            None => {
                return Err(refuse(
                    codes::POLICY_DENIED,
                    format!(
                        "fail closed: missing fact `{key}` (mandate `{id}` caps spend per {key})"
                    ),
                ));
            }
        };
        let total = state.usage(&Counter::Entity(
            id.into(),
            entity.clone(),
            month.to_owned(),
        )) + money.amount;
        if total > cap {
            return Err(self.over(&format!("per-{key} monthly"), cap, total));
        }
        Ok(Some(entity))
    }

    /// A counted cap exceeded (`MANDATE_LIMIT_EXCEEDED`).
    fn over(&self, what: &str, limit: Decimal, total: Decimal) -> Refusal {
        let Self { id, money, .. } = *self;
        refuse_in(
            codes::MANDATE_LIMIT_EXCEEDED,
            format!(
                "{} {} would exceed the {what} limit {} of mandate `{id}` (counted with this \
                 request: {})",
                display(money.amount),
                money.currency,
                display(limit),
                display(total)
            ),
            money,
        )
    }
}

fn deny(code: &'static str, reason: impl Into<String>) -> Outcome {
    Outcome::Deny {
        code,
        reason: reason.into(),
        currency: None,
        policies: Vec::new(),
    }
}

/// The gate.
#[derive(Debug)]
pub struct Gate {
    settings: Settings,
    /// Shared with the blocking threads that sign allow tokens.
    key: Arc<SigningKey>,
    oidc: Option<Verifier>,
    store: Arc<dyn GateStore>,
    clock: Arc<dyn Clock>,
    state: Mutex<Live>,
    /// Owns the appends: events are queued under the state lock and committed in batches.
    writer: LogWriter,
    policy: Option<Commitment>,
    mandates: BTreeMap<String, Commitment>,
    /// The last seq replayed on open: decisions at or below it were made by an earlier run.
    boot_seq: u64,
}

impl Gate {
    /// Opens a gate: verifies the store's hash chain and replays it into the projections.
    ///
    /// # Errors
    /// [`GateError`] when the IdP cannot be set up or the log is tampered with or unreadable.
    pub async fn open(
        settings: Settings,
        key: SigningKey,
        store: Arc<dyn GateStore>,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, GateError> {
        let oidc = settings.oidc.as_ref().map(Verifier::new).transpose()?;
        if let Some(problem) = store.verify().await? {
            return Err(GateError::Tampered(problem));
        }
        let state = replay_log(&*store).await?;
        let boot_seq = state.applied;
        let policy = policy_commitment(&settings, &key);
        let mandates = settings
            .mandates
            .values()
            .map(|m| (m.id.clone(), mandate_commitment(m, &key)))
            .collect();
        Ok(Self {
            settings,
            key: Arc::new(key),
            oidc,
            writer: LogWriter::spawn(store.clone()),
            store,
            clock,
            state: Mutex::new(Live {
                state,
                epoch: 1,
                stale: false,
            }),
            policy,
            mandates,
            boot_seq,
        })
    }

    /// What the log writer has committed since the gate opened (batches and events).
    #[must_use]
    pub fn log_stats(&self) -> LogStats {
        self.writer.stats()
    }

    /// Locks the state to decide or act on it. A state that counts events the log refused (a
    /// failed batch) is first rebuilt from the durable log: the barrier of
    /// [`crate::log_writer`]. Nothing is decided on a state the log does not hold.
    ///
    /// # Errors
    /// HTTP 500 when the log cannot be read back (the state stays stale and the next call
    /// tries again).
    async fn lock_fresh(&self) -> Result<MutexGuard<'_, Live>, ApiError> {
        let mut live = self.state.lock().await;
        if live.stale || self.writer.failed_epoch() >= live.epoch {
            live.stale = true;
            // No event of this epoch is written after this: the log is final for it.
            self.writer.close_epoch(live.epoch).await;
            let state = replay_log(&*self.store).await.map_err(|e| {
                ApiError::internal(format!(
                    "rebuilding the gate's state from its log after a failed write: {e}"
                ))
            })?;
            tracing::warn!(
                seq = state.applied,
                "rebuilt the gate's state from its log after a failed write"
            );
            live.state = state;
            live.epoch += 1;
            live.stale = false;
        }
        Ok(live)
    }

    /// Locks the state for a view: as [`Self::lock_fresh`], except that when the log cannot be
    /// read back the view shows the state as it is (and the error is logged).
    async fn lock_view(&self) -> MutexGuard<'_, Live> {
        match self.lock_fresh().await {
            Ok(live) => live,
            Err(error) => {
                tracing::error!(%error, "serving a view of a stale state");
                self.state.lock().await
            }
        }
    }

    /// Applies one event to the state and queues it for the log, under the state lock (the
    /// queue keeps the state's order). The caller releases the lock and answers only once the
    /// returned [`Ticket`] says the event is durable.
    ///
    /// # Errors
    /// HTTP 500 when the event cannot be encoded or applied (nothing is queued; a state that
    /// may be half-changed is rebuilt from the log before the next decision).
    fn stage(
        &self,
        live: &mut Live,
        event_type: &'static str,
        actor: String,
        event: &impl serde::Serialize,
    ) -> Result<Ticket, ApiError> {
        let payload = serde_json::to_value(event)
            .map_err(|e| ApiError::internal(format!("encoding a {event_type} event: {e}")))?;
        let seq = live.state.applied + 1;
        if let Err(e) = live.state.apply(seq, event_type, &payload) {
            live.stale = true;
            return Err(ApiError::internal(e.to_string()));
        }
        Ok(self.writer.enqueue(
            live.epoch,
            seq,
            NewAuditEvent {
                event_type: event_type.to_owned(),
                actor,
                payload,
            },
        ))
    }

    /// The settings.
    #[must_use]
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The JWKS publishing the token key.
    #[must_use]
    pub fn jwks(&self) -> Value {
        self.key.jwks()
    }

    /// The reveal of the policy commitment (for `regent-verify --policy`).
    #[must_use]
    pub fn policy_reveal(&self) -> Option<&Value> {
        self.policy.as_ref().map(|c| &c.reveal)
    }

    /// The reveal of a mandate commitment (for `regent-verify --mandate`).
    #[must_use]
    pub fn mandate_reveal(&self, id: &str) -> Option<&Value> {
        self.mandates.get(id).map(|c| &c.reveal)
    }

    /// The OIDC verifier (and test IdP), if configured.
    #[must_use]
    pub fn oidc(&self) -> Option<&Verifier> {
        self.oidc.as_ref()
    }

    // -----------------------------------------------------------------------------------------
    // Authentication

    /// Checks a bearer key.
    ///
    /// # Errors
    /// HTTP 401 when the key is missing or unknown.
    pub fn authenticate_key(&self, bearer: Option<&str>) -> Result<Caller, ApiError> {
        let key = bearer
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .ok_or_else(|| ApiError::unauthorized("missing `Authorization: Bearer <api key>`"))?;
        let (bound_agent, key_label) = match &self.settings.auth {
            Auth::AnyKey => (None, None),
            Auth::Keys(keys) => {
                let entry = keys
                    .get(key)
                    .ok_or_else(|| ApiError::unauthorized("unknown API key"))?;
                (entry.agent.clone(), entry.label.clone())
            }
        };
        Ok(Caller {
            api_key: key.to_owned(),
            bound_agent,
            key_label,
            assertion: Assertion::Bearer,
        })
    }

    /// Verifies the request signature (RFC 9421 takes precedence over HMAC) for `agent_id`
    /// and enforces "signed requests only" for agents that require it.
    ///
    /// # Errors
    /// HTTP 401 naming the problem.
    pub fn verify_signature(
        &self,
        caller: &mut Caller,
        agent_id: &str,
        request: &SignedRequest<'_>,
    ) -> Result<(), ApiError> {
        let now = self.clock.now().timestamp();
        let skew = self.settings.limits.signature_skew_seconds;
        let agent = self.settings.agents.as_ref().and_then(|a| a.get(agent_id));
        let inputs = (request.header)("signature-input");
        if !inputs.is_empty() {
            let input = inputs.join(", ");
            let kid = signing::rfc9421_keyid(&input).map_err(ApiError::unauthorized)?;
            let key = agent
                .and_then(|a| a.ed25519_keys.get(&kid))
                .ok_or_else(|| {
                    ApiError::unauthorized(format!(
                        "key `{kid}` is not registered for agent `{agent_id}`"
                    ))
                })?;
            let verified =
                signing::verify_rfc9421(request, key, now, skew).map_err(ApiError::unauthorized)?;
            caller.assertion = Assertion::Rfc9421 { kid: verified.kid };
            return Ok(());
        }
        let hmac = (request.header)("x-agent-signature");
        if let Some(sig) = hmac.first() {
            let ts = (request.header)("x-agent-signature-timestamp");
            signing::verify_hmac(
                &caller.api_key,
                agent_id,
                request.body,
                sig,
                ts.first().map(String::as_str),
                now,
                skew,
            )
            .map_err(ApiError::unauthorized)?;
            caller.assertion = Assertion::Hmac;
            return Ok(());
        }
        let required = agent.is_some_and(|a| a.require_signed)
            || self
                .settings
                .policy
                .as_ref()
                .is_some_and(|p| p.profile.signed_agents_only);
        if required {
            return Err(ApiError::unauthorized(format!(
                "agent `{agent_id}` requires signed requests (HMAC or RFC 9421)"
            )));
        }
        Ok(())
    }

    /// The agent a recorded decision belongs to (to verify a `complete` signature).
    pub async fn decision_agent(&self, decision_id: &str) -> Option<String> {
        let state = self.lock_view().await;
        state
            .decisions
            .get(decision_id)
            .map(|d| d.event.agent_id.clone())
    }

    /// Whether the routing routes may forward a recorded decision (see [`ForwardState`]).
    pub async fn forward_state(&self, decision_id: &str) -> ForwardState {
        let state = self.lock_view().await;
        match state.decisions.get(decision_id) {
            None => ForwardState::Unknown,
            Some(d) => match &d.completion {
                Some(c) => ForwardState::Completed(c.status),
                None if d.event.routed
                    && d.event.verdict == Verdict::Allow
                    && d.seq <= self.boot_seq =>
                {
                    ForwardState::OutcomeUnknown
                }
                None => ForwardState::Open,
            },
        }
    }

    /// How a recorded decision was completed, if it was (the routing routes never forward a
    /// completed decision again).
    pub async fn completion_status(&self, decision_id: &str) -> Option<CompleteStatus> {
        let state = self.lock_view().await;
        state
            .decisions
            .get(decision_id)
            .and_then(|d| d.completion.as_ref())
            .map(|c| c.status)
    }

    // -----------------------------------------------------------------------------------------
    // Decisions

    /// Decides one request and records it. Deny and escalate are decisions (`Ok`), answered
    /// with HTTP 200; `Err` means no decision was made.
    ///
    /// # Errors
    /// HTTP 422 for malformed bodies, 409 for an idempotency key reused with another request,
    /// 500 when the store fails (nothing is recorded then).
    pub async fn decide(
        &self,
        caller: &Caller,
        request: DecisionRequest,
        idempotency_header: Option<&str>,
    ) -> Result<Value, ApiError> {
        self.decide_minting(caller, request, idempotency_header, true)
            .await
    }

    /// [`Self::decide`] for the routing routes, which forward an allow themselves: the decision
    /// is recorded as routed (see [`Self::forward_state`]) and no allow token is minted (the
    /// routes never hand it out, so they skip its RS256 signature). The decision (its claims,
    /// holds and audit record) is otherwise the same.
    ///
    /// # Errors
    /// As [`Self::decide`].
    pub async fn decide_without_token(
        &self,
        caller: &Caller,
        request: DecisionRequest,
    ) -> Result<Value, ApiError> {
        self.decide_minting(caller, request, None, false).await
    }

    async fn decide_minting(
        &self,
        caller: &Caller,
        request: DecisionRequest,
        idempotency_header: Option<&str>,
        mint: bool,
    ) -> Result<Value, ApiError> {
        let mut prepared = prepare(request, idempotency_header, self.settings.flags.is_some())?;
        prepared.routed = !mint;
        // Pure work happens outside the lock: verifying the user's token before, signing the
        // allow token after. Only the decision itself and its durable append are serialised.
        let user = self.verify_user(prepared.user_token.as_deref());
        let (event, ticket) = {
            let mut state = self.lock_fresh().await?;
            let now = self.clock.now();
            self.decide_locked(&mut state, caller, &prepared, user, now)?
        };
        // The allow token's RS256 signature (the costliest step of a decision, ≈ 0.3 ms of CPU)
        // is made on a blocking thread while the decision's batch is being committed, not
        // after it, and not on this worker thread (which would hold back the log writer it just
        // woke). The token is handed out only once the decision is durable; after a failed
        // commit it is dropped unseen.
        let signing = match &event.claims {
            Some(claims) if mint => {
                let (key, claims) = (Arc::clone(&self.key), claims.clone());
                let now = self.clock.now().timestamp();
                Some(tokio::task::spawn_blocking(move || {
                    mint_allow(&key, &claims, now)
                }))
            }
            _ => None,
        };
        ticket.durable().await?;
        let token = match signing {
            Some(signing) => Some(
                signing
                    .await
                    .map_err(|e| ApiError::internal(format!("signing the allow token: {e}")))?
                    .map_err(ApiError::internal)?,
            ),
            None => None,
        };
        Ok(response(&event, token))
    }

    fn decide_locked(
        &self,
        state: &mut Live,
        caller: &Caller,
        prepared: &Prepared,
        user: Result<Option<VerifiedUser>, String>,
        now: DateTime<Utc>,
    ) -> Result<(DecisionEvent, Ticket), ApiError> {
        let agent = prepared.req.agent_id.clone();

        // Idempotency and approvals.
        let mut approval: Option<(String, ApprovalEvent)> = None;
        if let Some(key) = &prepared.idempotency_key {
            if let Some((fingerprint, decision_id)) = state
                .idempotency
                .get(&(agent.clone(), key.clone()))
                .cloned()
            {
                if fingerprint != prepared.fingerprint {
                    return Err(ApiError::conflict(format!(
                        "idempotency key `{key}` was already used for a different request \
                         (decision {decision_id}); use a new key for a new request"
                    )));
                }
                let previous = state.decisions.get(&decision_id).cloned();
                if let Some(previous) = previous {
                    match previous.event.verdict {
                        Verdict::Allow => {
                            let failed = previous
                                .completion
                                .as_ref()
                                .is_some_and(|c| c.status != CompleteStatus::Success);
                            if !failed {
                                return self.replay(state, &previous.event, now);
                            }
                        }
                        Verdict::Escalate => {
                            let reference = previous
                                .event
                                .escalation
                                .as_ref()
                                .map(|e| e.reference.clone())
                                .unwrap_or_default();
                            match self.approval_gate(state, &reference, now) {
                                ApprovalGate::Pending => {
                                    return self.replay(state, &previous.event, now);
                                }
                                ApprovalGate::Approved(decided) => {
                                    approval = Some((reference, decided));
                                }
                                ApprovalGate::Refused(reason) => {
                                    let outcome = deny(codes::POLICY_DENIED, reason);
                                    return self.record(
                                        state, caller, prepared, outcome, None, None, None, now,
                                    );
                                }
                            }
                        }
                        Verdict::Deny => {}
                    }
                }
            }
        } else {
            // Without a key, an identical request finds the approval it asked for.
            if let Some(reference) = state
                .approvals_by_fingerprint
                .get(&(agent.clone(), prepared.fingerprint.clone()))
                .cloned()
            {
                match self.approval_gate(state, &reference, now) {
                    ApprovalGate::Pending => {
                        let decision_id = state
                            .approvals
                            .get(&reference)
                            .map(|a| a.decision_id.clone())
                            .unwrap_or_default();
                        if let Some(previous) = state.decisions.get(&decision_id).cloned() {
                            return self.replay(state, &previous.event, now);
                        }
                    }
                    ApprovalGate::Approved(decided) => approval = Some((reference, decided)),
                    ApprovalGate::Refused(_) => {}
                }
            }
        }

        let mut outcome = self.evaluate(state, caller, prepared, &user, now, approval.is_some());
        let user = user.ok().flatten();
        let mut observed = None;
        let observe = self
            .settings
            .policy
            .as_ref()
            .is_some_and(|p| p.profile.observe_mode);
        if observe {
            // Observe mode: decide and record, never block. The would-be refusal is recorded
            // (and shown) next to the allow; nothing is held against the mandate.
            match outcome {
                Outcome::Deny {
                    code,
                    reason,
                    policies,
                    ..
                } => {
                    observed = Some((code.to_owned(), reason));
                    outcome = Outcome::Allow {
                        policies,
                        mandate: None,
                        hold: None,
                        risk: None,
                    };
                }
                Outcome::Escalate {
                    reason,
                    policies,
                    mandate,
                    ..
                } => {
                    observed = Some((codes::ESCALATION_REQUIRED.to_owned(), reason));
                    outcome = Outcome::Allow {
                        policies,
                        mandate,
                        hold: None,
                        risk: None,
                    };
                }
                Outcome::Allow { .. } => {}
            }
        }
        let approval_ref = match &outcome {
            Outcome::Allow { .. } => approval.map(|(r, _)| r),
            _ => None,
        };
        self.record(
            state,
            caller,
            prepared,
            outcome,
            user,
            approval_ref,
            observed,
            now,
        )
    }

    fn verify_user(&self, token: Option<&str>) -> Result<Option<VerifiedUser>, String> {
        let Some(token) = token else {
            return Ok(None);
        };
        let verifier = self
            .oidc
            .as_ref()
            .ok_or("user_token was sent but no IdP is configured to verify it")?;
        verifier
            .verify(token, self.clock.now().timestamp())
            .map(Some)
            .map_err(|e| format!("user_token {e}"))
    }

    fn approval_gate(&self, state: &State, reference: &str, now: DateTime<Utc>) -> ApprovalGate {
        let Some(record) = state.approvals.get(reference) else {
            return ApprovalGate::Refused(format!("escalation {reference} is unknown"));
        };
        match &record.status {
            ApprovalStatus::Pending if now > record.escalation.expires_at => {
                ApprovalGate::Refused(format!(
                    "escalation {reference} expired at {} without a decision",
                    rfc3339(record.escalation.expires_at)
                ))
            }
            ApprovalStatus::Pending => ApprovalGate::Pending,
            ApprovalStatus::Decided(d) if d.outcome == ApprovalOutcome::Approved => {
                ApprovalGate::Approved(d.clone())
            }
            ApprovalStatus::Decided(d) => ApprovalGate::Refused(format!(
                "escalation {reference} was rejected by {}{}",
                describe_approver(&d.approver),
                d.comment
                    .as_deref()
                    .map(|c| format!(": {c}"))
                    .unwrap_or_default()
            )),
            ApprovalStatus::Consumed { decision_id, .. } => ApprovalGate::Refused(format!(
                "escalation {reference} was already used by decision {decision_id}"
            )),
        }
    }

    /// The decision pipeline in the documented order (module docs): every hard check, then
    /// escalation, then allow. A refused step ends the pipeline with a deny.
    fn evaluate(
        &self,
        state: &State,
        caller: &Caller,
        p: &Prepared,
        user: &Result<Option<VerifiedUser>, String>,
        now: DateTime<Utc>,
        approved: bool,
    ) -> Outcome {
        self.run_checks(state, caller, p, user, now, approved)
            .unwrap_or_else(Outcome::from)
    }

    fn run_checks(
        &self,
        state: &State,
        caller: &Caller,
        p: &Prepared,
        user: &Result<Option<VerifiedUser>, String>,
        now: DateTime<Utc>,
        approved: bool,
    ) -> Result<Outcome, Refusal> {
        let req = &p.req;
        let flags = self.settings.flags.as_ref();
        if flags.is_some_and(|f| f.deny_all) {
            return Err(refuse(
                codes::POLICY_DENIED,
                "mock-gate --deny-all: every request is denied",
            ));
        }
        // 1. Identity.
        let agent = self.resolve_agent(caller, req)?;
        // 2. Velocity.
        let velocity_ratio = self.check_velocity(state, agent, req, now)?;
        // 3. Tool catalog.
        let tool = self.check_catalog(agent, req)?;
        // 4. The user.
        let user = user
            .as_ref()
            .map_err(|problem| refuse(codes::IDENTITY_NOT_RESOLVED, problem.clone()))?
            .as_ref();
        // 5. Policy.
        let PolicyPass {
            policies,
            escalation,
        } = self.check_policy(req, p, user)?;
        // 6. Mandate (flags mode: the amount rules).
        let (mandate, hold, amount_escalation) = match flags {
            Some(rules) => (None, None, self.check_flag_amounts(rules, p)?),
            None => {
                let (mandate, hold) = self.check_spend(state, p, tool, &policies, now)?;
                (mandate, hold, self.escalation_amount(p))
            }
        };
        let escalation = escalation.or(amount_escalation);
        // 7. Duplicates (an approved retry is the deliberate repeat of its escalation).
        if !approved {
            self.check_duplicate(state, p, now)?;
        }
        // 8. Risk.
        let risk = self.risk_score(p, velocity_ratio)?;
        // 9. Escalation.
        if let Some(escalation) = escalation
            && !approved
        {
            return Ok(Outcome::Escalate {
                approver: escalation.approver,
                reason: escalation.reason,
                policies: escalation.policies,
                mandate,
            });
        }
        // 10. Allow.
        Ok(Outcome::Allow {
            policies,
            mandate,
            hold,
            risk,
        })
    }

    /// Step 1, identity: the agent is registered (when agents are configured), the key is not
    /// bound to another agent (`IDENTITY_NOT_RESOLVED`), the agent is active
    /// (`AGENT_NOT_ACTIVE`).
    fn resolve_agent(
        &self,
        caller: &Caller,
        req: &DecisionRequest,
    ) -> Result<Option<&AgentSettings>, Refusal> {
        let agent = match &self.settings.agents {
            None => None,
            Some(agents) => Some(agents.get(&req.agent_id).ok_or_else(|| {
                refuse(
                    codes::IDENTITY_NOT_RESOLVED,
                    format!("agent `{}` is not registered", req.agent_id),
                )
            })?),
        };
        if let Some(bound) = &caller.bound_agent
            && *bound != req.agent_id
        {
            return Err(refuse(
                codes::IDENTITY_NOT_RESOLVED,
                format!(
                    "this API key is bound to agent `{bound}`, not `{}`",
                    req.agent_id
                ),
            ));
        }
        if let Some(a) = agent
            && a.status != AgentStatus::Active
        {
            let status = if a.status == AgentStatus::Suspended {
                "suspended"
            } else {
                "revoked"
            };
            return Err(refuse(
                codes::AGENT_NOT_ACTIVE,
                format!("agent `{}` is {status}", req.agent_id),
            ));
        }
        Ok(agent)
    }

    /// Step 2, velocity: the agent's decisions in its window stay below the limit
    /// (`VELOCITY_EXCEEDED`). Passes on the fraction of the limit used (a risk signal).
    fn check_velocity(
        &self,
        state: &State,
        agent: Option<&AgentSettings>,
        req: &DecisionRequest,
        now: DateTime<Utc>,
    ) -> Result<f64, Refusal> {
        let Some(v) = agent
            .and_then(|a| a.velocity)
            .or(self.settings.limits.velocity)
        else {
            return Ok(0.0);
        };
        let since = now - chrono::Duration::seconds(i64::from(v.window_seconds));
        let used = state.decisions_since(&req.agent_id, since);
        if used >= v.max as usize {
            return Err(refuse(
                codes::VELOCITY_EXCEEDED,
                format!(
                    "agent `{}` made {used} decisions in the last {}s (limit {}); back off",
                    req.agent_id, v.window_seconds, v.max
                ),
            ));
        }
        Ok(used as f64 / f64::from(v.max))
    }

    /// Step 3, the tool catalog: the tool is not denied (`--deny-tool`), is in the agent's
    /// catalog and exposes the action (`TOOL_NOT_ALLOWED`).
    fn check_catalog(
        &self,
        agent: Option<&AgentSettings>,
        req: &DecisionRequest,
    ) -> Result<Option<&ToolSettings>, Refusal> {
        if self
            .settings
            .flags
            .as_ref()
            .is_some_and(|f| f.deny_tools.contains(&req.tool))
        {
            return Err(refuse(
                codes::TOOL_NOT_ALLOWED,
                format!("tool `{}` is denied (--deny-tool)", req.tool),
            ));
        }
        let Some(tools) = &self.settings.tools else {
            return Ok(None);
        };
        let in_catalog = agent.is_some_and(|a| a.tools.contains(&req.tool));
        let Some(tool) = tools.get(&req.tool).filter(|_| in_catalog) else {
            return Err(refuse(
                codes::TOOL_NOT_ALLOWED,
                format!(
                    "tool `{}` is not in the catalog of agent `{}`",
                    req.tool, req.agent_id
                ),
            ));
        };
        if !tool.actions.contains(&req.action) {
            return Err(refuse(
                codes::TOOL_NOT_ALLOWED,
                format!(
                    "tool `{}` does not expose action `{}`",
                    req.tool, req.action
                ),
            ));
        }
        Ok(Some(tool))
    }

    /// Step 5, policy: a hard forbid, no permit, or missing or mistyped facts deny
    /// (`POLICY_DENIED`); an `@escalate` forbid passes on an escalation.
    fn check_policy(
        &self,
        req: &DecisionRequest,
        p: &Prepared,
        user: Option<&VerifiedUser>,
    ) -> Result<PolicyPass, Refusal> {
        let Some(policy) = &self.settings.policy else {
            return Ok(PolicyPass::default());
        };
        let context = self.policy_context(req, p, user);
        match policy
            .cedar
            .evaluate(&req.agent_id, &req.action, &req.tool, &context)
        {
            CedarVerdict::Allow { permits } => Ok(PolicyPass {
                policies: permits,
                escalation: None,
            }),
            CedarVerdict::Deny { forbids } => Err(Refusal {
                code: codes::POLICY_DENIED,
                reason: format!("forbidden by policy {}", forbids.join(", ")),
                currency: None,
                policies: forbids,
            }),
            CedarVerdict::NoPermit => Err(refuse(
                codes::POLICY_DENIED,
                "no permit policy matched (default deny)",
            )),
            CedarVerdict::Escalate {
                policies: ids,
                approver,
            } => Ok(PolicyPass {
                escalation: Some(PendingEscalation {
                    approver,
                    reason: format!("policy {} requires an approval", ids.join(", ")),
                    policies: ids.clone(),
                }),
                policies: ids,
            }),
            CedarVerdict::Invalid { problem } => Err(refuse(
                codes::POLICY_DENIED,
                format!("fail closed: {problem}"),
            )),
        }
    }

    /// Step 6 in flags mode: an amount rule needs a readable amount (fail closed), an amount
    /// above `--deny-over` is denied (`MANDATE_LIMIT_EXCEEDED`), one above `--escalate-over`
    /// passes on an escalation.
    fn check_flag_amounts(
        &self,
        rules: &FlagRules,
        p: &Prepared,
    ) -> Result<Option<PendingEscalation>, Refusal> {
        let Some(money) = &p.money else {
            if rules.deny_over.is_some() || rules.escalate_over.is_some() {
                // An amount rule cannot be applied to an amount the gate cannot read: fail
                // closed instead of reading it as zero (the dev mock's behaviour).
                return Err(refuse(
                    codes::POLICY_DENIED,
                    unreadable_amount(rules, &p.req.args),
                ));
            }
            return Ok(None);
        };
        if let Some(cap) = rules.deny_over
            && money.amount > cap
        {
            return Err(refuse(
                codes::MANDATE_LIMIT_EXCEEDED,
                format!(
                    "{} {} is over the limit {} (--deny-over)",
                    display(money.amount),
                    money.currency,
                    display(cap)
                ),
            ));
        }
        Ok(rules
            .escalate_over
            .filter(|threshold| money.amount > *threshold)
            .map(|threshold| PendingEscalation {
                approver: self.settings.approvals.default_approver.clone(),
                reason: format!(
                    "{} {} is over the escalation threshold {} (--escalate-over)",
                    display(money.amount),
                    money.currency,
                    display(threshold)
                ),
                policies: Vec::new(),
            }))
    }

    /// Step 6 with mandates: an amount on a tool bound to a mandate is required (fail
    /// closed), an amount needs a mandate (`MANDATE_NOT_FOUND`), and the mandate's terms are
    /// checked ([`Self::check_mandate`]). Passes on the mandate and the hold to take.
    fn check_spend(
        &self,
        state: &State,
        p: &Prepared,
        tool: Option<&ToolSettings>,
        policies: &[String],
        now: DateTime<Utc>,
    ) -> Result<(Option<Mandate>, Option<Hold>), Refusal> {
        let req = &p.req;
        let bound = tool.and_then(|t| t.mandate.as_deref());
        let mandate_id = p.mandate_id.as_deref().or(bound);
        match (&p.money, mandate_id) {
            (None, Some(id)) if bound.is_some() => Err(refuse(
                codes::POLICY_DENIED,
                format!(
                    "fail closed: tool `{}` spends under mandate `{id}`, so the request needs \
                     amount_usd (or amount + currency)",
                    req.tool
                ),
            )),
            (None, _) => Ok((None, None)),
            (Some(money), None) => Err(Refusal {
                code: codes::MANDATE_NOT_FOUND,
                reason: format!(
                    "no mandate covers {} {} on tool `{}`",
                    display(money.amount),
                    money.currency,
                    req.tool
                ),
                currency: Some(money.currency.clone()),
                policies: policies.to_vec(),
            }),
            (Some(_), Some(id)) => {
                let (mandate, hold) = self.check_mandate(state, p, id, bound, now)?;
                Ok((Some(mandate), Some(hold)))
            }
        }
    }

    /// Step 6, the profile's escalation amount: an amount above it passes on an escalation.
    fn escalation_amount(&self, p: &Prepared) -> Option<PendingEscalation> {
        let threshold = self
            .settings
            .policy
            .as_ref()
            .and_then(|policy| policy.profile.escalation_amount)?;
        let money = p.money.as_ref().filter(|m| m.amount > threshold)?;
        Some(PendingEscalation {
            approver: self.settings.approvals.default_approver.clone(),
            reason: format!(
                "{} {} is above the escalation amount {}",
                display(money.amount),
                money.currency,
                display(threshold)
            ),
            policies: Vec::new(),
        })
    }

    /// Step 7, duplicates: a money request without an idempotency key identical to one
    /// allowed within the window is denied (`DUPLICATE_REQUEST`).
    fn check_duplicate(
        &self,
        state: &State,
        p: &Prepared,
        now: DateTime<Utc>,
    ) -> Result<(), Refusal> {
        let window = self.settings.limits.duplicate_window_seconds;
        if p.money.is_none() || p.idempotency_key.is_some() || window == 0 {
            return Ok(());
        }
        if let Some((at, previous)) = state
            .recent_allows
            .get(&(p.req.agent_id.clone(), p.fingerprint.clone()))
            && now - *at < chrono::Duration::seconds(i64::from(window))
        {
            return Err(refuse(
                codes::DUPLICATE_REQUEST,
                format!(
                    "an identical request was allowed at {} as {previous}; pass an \
                     idempotency_key to repeat it deliberately",
                    rfc3339(*at)
                ),
            ));
        }
        Ok(())
    }

    /// Step 8, risk: the sum of the matched signals (capped at 1) above the threshold is
    /// denied (`RISK_THRESHOLD_EXCEEDED`). Passes on the score when a model is configured.
    fn risk_score(&self, p: &Prepared, velocity_ratio: f64) -> Result<Option<f64>, Refusal> {
        let Some(model) = &self.settings.risk else {
            return Ok(None);
        };
        let mut score = 0.0;
        let mut matched = Vec::new();
        for signal in &model.signals {
            let hit = match &signal.when {
                RiskCondition::AmountOver(a) => p.money.as_ref().is_some_and(|m| m.amount > *a),
                RiskCondition::VelocityRatioOver(r) => velocity_ratio > *r,
                RiskCondition::FactEquals(name, value) => p.req.context.get(name) == Some(value),
            };
            if hit {
                score += signal.score;
                matched.push(signal.id.clone());
            }
        }
        let score: f64 = score.clamp(0.0, 1.0);
        if score > model.deny_above {
            return Err(refuse(
                codes::RISK_THRESHOLD_EXCEEDED,
                format!(
                    "risk score {score:.2} is above {:.2} ({})",
                    model.deny_above,
                    matched.join(", ")
                ),
            ));
        }
        Ok(Some(score))
    }

    /// The context Cedar sees: the client's facts without the derived keys, then the derived
    /// facts the gate knows.
    fn policy_context(
        &self,
        req: &DecisionRequest,
        p: &Prepared,
        user: Option<&VerifiedUser>,
    ) -> Map<String, Value> {
        let mut context = req.context.clone();
        for key in DERIVED_FACTS {
            context.remove(*key);
        }
        context.insert("agent_active".into(), Value::Bool(true));
        context.insert("tool".into(), json!(req.tool));
        if let Some(user) = user {
            context.insert("user_role".into(), json!(user.role));
            context.insert("user_sub".into(), json!(user.sub));
            if let Some(email) = &user.email {
                context.insert("user_email".into(), json!(email));
            }
        }
        if let Some(money) = &p.money {
            context.insert("amount".into(), json!(money.amount.normalize().to_string()));
            context.insert("currency".into(), json!(money.currency));
        }
        context
    }

    /// The mandate's terms, in order: it applies to this request ([`Self::applicable_mandate`]),
    /// then the per-transaction, daily and monthly caps, the per-entity sub-budget and the
    /// relational cap. Passes on the hold the allow takes.
    fn check_mandate(
        &self,
        state: &State,
        p: &Prepared,
        id: &str,
        bound: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<(Mandate, Hold), Refusal> {
        let Some(money) = &p.money else {
            return Err(refuse(codes::POLICY_DENIED, "no amount"));
        };
        let mandate = self.applicable_mandate(p, money, id, bound, now)?;
        let terms = MandateTerms { id, mandate, money };
        terms.check_per_tx()?;
        let mut hold = terms.check_periods(state, now)?;
        hold.entity = terms.check_entity(state, &p.req, &hold.month)?;
        if mandate.relational_cap {
            let (reference, base) = self.check_reference(state, p, &terms)?;
            hold.reference = Some(reference);
            hold.reference_amount = Some(base);
        }
        Ok((mandate.clone(), hold))
    }

    /// The mandate exists, is the one the tool is bound to, belongs to the agent, is active,
    /// unexpired, in the request's currency and covers the tool (`MANDATE_NOT_FOUND`).
    fn applicable_mandate(
        &self,
        p: &Prepared,
        money: &Money,
        id: &str,
        bound: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<&Mandate, Refusal> {
        let req = &p.req;
        let not_found = |why: String| refuse_in(codes::MANDATE_NOT_FOUND, why, money);
        let Some(m) = self.settings.mandates.get(id) else {
            return Err(not_found(format!("mandate `{id}` does not exist")));
        };
        if let Some(bound) = bound
            && bound != id
        {
            return Err(not_found(format!(
                "tool `{}` spends under mandate `{bound}`, not `{id}`",
                req.tool
            )));
        }
        if m.agent.as_ref().is_some_and(|a| *a != req.agent_id) {
            return Err(not_found(format!(
                "mandate `{id}` does not belong to agent `{}`",
                req.agent_id
            )));
        }
        if m.status != "active" {
            return Err(not_found(format!("mandate `{id}` is {}", m.status)));
        }
        if m.expires_at.is_some_and(|t| t <= now) {
            return Err(not_found(format!("mandate `{id}` has expired")));
        }
        if m.currency != money.currency {
            return Err(not_found(format!(
                "mandate `{id}` is in {}, the request is in {}: no active mandate in {}",
                m.currency, money.currency, money.currency
            )));
        }
        if !m.allowed_resources.is_empty() {
            let resource = req.resource.as_deref().map(|r| format!("{}/{r}", req.tool));
            let covered = m.allowed_resources.iter().any(|allowed| {
                *allowed == req.tool
                    || resource
                        .as_deref()
                        .is_some_and(|r| r.starts_with(allowed.as_str()))
            });
            if !covered {
                return Err(not_found(format!(
                    "mandate `{id}` does not cover tool `{}`",
                    req.tool
                )));
            }
        }
        Ok(m)
    }

    /// The relational cap: refunds against a reference, with this one, stay within the
    /// original charge (`EXCEEDS_REFERENCE`); the reference and its amount are required (fail
    /// closed). Passes on the reference and the amount it is capped by.
    fn check_reference(
        &self,
        state: &State,
        p: &Prepared,
        terms: &MandateTerms<'_>,
    ) -> Result<(String, Decimal), Refusal> {
        let MandateTerms { id, money, .. } = *terms;
        let Some(reference) = p.reference.clone() else {
            return Err(refuse(
                codes::POLICY_DENIED,
                format!(
                    "fail closed: missing fact `reference` (mandate `{id}` caps refunds by the \
                     original charge)"
                ),
            ));
        };
        let pinned = self
            .settings
            .references
            .get(&reference)
            .copied()
            .or_else(|| {
                state
                    .reference_pins
                    .get(&(id.to_owned(), reference.clone()))
                    .copied()
            });
        let base = match (pinned, p.reference_amount) {
            (Some(pinned), Some(given)) if pinned != given => {
                return Err(refuse_in(
                    codes::EXCEEDS_REFERENCE,
                    format!(
                        "reference {reference} is recorded with amount {}, the request says {}",
                        display(pinned),
                        display(given)
                    ),
                    money,
                ));
            }
            (Some(pinned), _) => pinned,
            (None, Some(given)) => given,
            (None, None) => {
                return Err(refuse(
                    codes::POLICY_DENIED,
                    format!(
                        "fail closed: missing fact `reference_amount` for reference {reference}"
                    ),
                ));
            }
        };
        let already = state.usage(&Counter::Reference(id.into(), reference.clone()));
        if already + money.amount > base {
            return Err(refuse_in(
                codes::EXCEEDS_REFERENCE,
                format!(
                    "refunds against {reference} would total {} {}, above the original {} \
                     (already {} refunded or held)",
                    display(already + money.amount),
                    money.currency,
                    display(base),
                    display(already)
                ),
                money,
            ));
        }
        Ok((reference, base))
    }

    /// Records an outcome as a decision event and answers it.
    #[allow(
        clippy::too_many_arguments,
        reason = "the pieces of one decision record"
    )]
    fn record(
        &self,
        state: &mut Live,
        caller: &Caller,
        p: &Prepared,
        outcome: Outcome,
        user: Option<VerifiedUser>,
        approval_ref: Option<String>,
        observed: Option<(String, String)>,
        now: DateTime<Utc>,
    ) -> Result<(DecisionEvent, Ticket), ApiError> {
        let req = &p.req;
        let (observed_code, observed_reason) = observed.unzip();
        let decision_id = format!("dec_{}", &uuid::Uuid::new_v4().simple().to_string()[..24]);
        let mut event = DecisionEvent {
            decision_id: decision_id.clone(),
            at: now,
            agent_id: req.agent_id.clone(),
            tool: req.tool.clone(),
            action: req.action.clone(),
            resource: req.resource.clone(),
            args_hash: p.args_hash.clone(),
            fingerprint: p.fingerprint.clone(),
            idempotency_key: p.idempotency_key.clone(),
            verdict: Verdict::Deny,
            code: None,
            reason: None,
            refusal_currency: None,
            policies: Vec::new(),
            amount: p.money.as_ref().map(|m| m.amount),
            currency: p.money.as_ref().map(|m| m.currency.clone()),
            payee: p.payee.clone(),
            mandate_id: None,
            hold: None,
            duplicate_guard: false,
            user: user.clone(),
            intent: p.intent.clone(),
            facts: {
                let mut facts = req.context.clone();
                facts.remove("user_token");
                facts
            },
            escalation: None,
            approval_ref,
            risk_score: None,
            assertion_scheme: caller.assertion.scheme().to_owned(),
            assertion_kid: caller.assertion.kid().map(str::to_owned),
            key_label: caller.key_label.clone(),
            claims: None,
            observed_code,
            observed_reason,
            routed: p.routed,
        };
        match outcome {
            Outcome::Allow {
                policies,
                mandate,
                hold,
                risk,
            } => {
                event.verdict = Verdict::Allow;
                event.policies = policies;
                event.mandate_id = mandate.as_ref().map(|m| m.id.clone());
                event.hold = hold;
                event.risk_score = risk;
                event.duplicate_guard = p.money.is_some() && p.idempotency_key.is_none();
                event.claims =
                    Some(self.allow_claims(&event, caller, mandate.as_ref(), user.as_ref()));
            }
            Outcome::Deny {
                code,
                reason,
                currency,
                policies,
            } => {
                event.code = Some(code.to_owned());
                event.reason = Some(reason);
                event.refusal_currency = currency;
                event.policies = policies;
                event.approval_ref = None;
            }
            Outcome::Escalate {
                approver,
                reason,
                policies,
                mandate,
            } => {
                event.verdict = Verdict::Escalate;
                event.code = Some(codes::ESCALATION_REQUIRED.to_owned());
                event.reason = Some(reason);
                event.policies = policies;
                event.mandate_id = mandate.map(|m| m.id);
                event.approval_ref = None;
                event.escalation = Some(Escalation {
                    kind: self.settings.approvals.escalation_type.clone(),
                    reference: format!("esc_{}", &uuid::Uuid::new_v4().simple().to_string()[..20]),
                    approver,
                    expires_at: now
                        + chrono::Duration::seconds(i64::from(self.settings.approvals.ttl_seconds)),
                });
            }
        }
        let ticket = self.stage(state, EV_DECISION, event.agent_id.clone(), &event)?;
        Ok((event, ticket))
    }

    fn allow_claims(
        &self,
        event: &DecisionEvent,
        caller: &Caller,
        mandate: Option<&Mandate>,
        user: Option<&VerifiedUser>,
    ) -> Value {
        let mut claims = json!({
            "iss": ISSUER,
            "sub": event.agent_id,
            "aud": event.tool,
            "scope": format!("{}:{}", event.tool, event.action),
            "decision_id": event.decision_id,
            "args_hash": event.args_hash,
            "environment": self.settings.environment,
            "assertion_scheme": caller.assertion.scheme(),
            "key_custody": caller.assertion.custody(),
        });
        if let Some(kid) = caller.assertion.kid() {
            claims["assertion_kid"] = json!(kid);
        }
        if let Some(amount) = event.amount {
            set_amount(&mut claims, amount);
            claims["currency"] = json!(event.currency);
        }
        if let Some(payee) = &event.payee {
            claims["payee"] = json!(payee);
        }
        if let Some(m) = mandate
            && let Some(c) = self.mandates.get(&m.id)
        {
            claims["mandate_id"] = json!(m.id);
            claims["mandate_version"] = json!(c.version);
            claims["mandate_hash"] = json!(c.hash);
        }
        if let Some(p) = &self.policy {
            claims["policy_version"] = json!(p.version);
            claims["policy_hash"] = json!(p.hash);
            claims["policy_source"] = json!(p.source);
        }
        if let Some(risk) = &self.settings.risk {
            claims["risk_model"] = json!(risk.model);
        }
        if let Some(user) = user {
            claims["user_sub"] = json!(user.sub);
            claims["user_role"] = json!(user.role);
        }
        claims
    }

    fn replay(
        &self,
        state: &mut Live,
        previous: &DecisionEvent,
        now: DateTime<Utc>,
    ) -> Result<(DecisionEvent, Ticket), ApiError> {
        let replay = ReplayEvent {
            decision_id: previous.decision_id.clone(),
            at: now,
            agent_id: previous.agent_id.clone(),
            idempotency_key: previous.idempotency_key.clone(),
            verdict: previous.verdict,
        };
        let ticket = self.stage(state, EV_REPLAY, previous.agent_id.clone(), &replay)?;
        Ok((previous.clone(), ticket))
    }

    // -----------------------------------------------------------------------------------------
    // Completion

    /// Records the outcome of an allowed action: commits (success) or releases (failed,
    /// aborted) its hold and returns a `receipt+jwt`. Completing again with the same status
    /// returns the same answer.
    ///
    /// # Errors
    /// 404 unknown decision, 403 another agent's decision, 409 not an allow or completed with
    /// another status, 422 bad status, 500 store failure.
    pub async fn complete(
        &self,
        caller: &Caller,
        decision_id: &str,
        body: &[u8],
    ) -> Result<Value, ApiError> {
        let parsed: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::unprocessable(format!("the body is not JSON: {e}")))?;
        let status = match parsed.get("status").and_then(Value::as_str) {
            Some("success") => CompleteStatus::Success,
            Some("failed") => CompleteStatus::Failed,
            Some("aborted") => CompleteStatus::Aborted,
            Some(other) => {
                return Err(ApiError::unprocessable(format!(
                    "`status` must be success, failed or aborted, got `{other}`"
                )));
            }
            None => return Err(ApiError::unprocessable("`status` is required")),
        };
        let text = |name: &str| -> Result<Option<String>, ApiError> {
            match parsed.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(other) => Err(ApiError::unprocessable(format!(
                    "`{name}` must be a string or null, got `{other}`"
                ))),
            }
        };
        let downstream_ref = text("downstream_ref")?;
        let error = text("error")?;

        // The receipt's RS256 signature is the costly part: it is made outside the state lock,
        // between a first look at the decision and the locked re-check that appends.
        let (record, receipt_claims, now) = {
            let state = self.lock_fresh().await?;
            let Some(record) = completable(&state, caller, decision_id, status)? else {
                return already_completed(&state, decision_id);
            };
            let now = self.clock.now();
            let claims = record.event.claims.clone().unwrap_or_else(|| json!({}));
            let receipt_claims = receipt_claims(
                &claims,
                &record.event.tool,
                &record.event.action,
                status.as_str(),
                downstream_ref.as_deref(),
                now.timestamp(),
            );
            (record, receipt_claims, now)
        };
        let receipt = self
            .key
            .sign("receipt+jwt", &receipt_claims)
            .map_err(|e| ApiError::internal(e.to_string()))?;
        let mut state = self.lock_fresh().await?;
        // A concurrent completion may have landed while the receipt was signed.
        if completable(&state, caller, decision_id, status)?.is_none() {
            return already_completed(&state, decision_id);
        }
        let hold = match (record.hold_state, status) {
            (Some(HoldState::Held), CompleteStatus::Success) => HoldOutcome::Committed,
            (Some(HoldState::Held), _) => HoldOutcome::Released,
            _ => HoldOutcome::None,
        };
        let event = CompletionEvent {
            decision_id: decision_id.to_owned(),
            at: now,
            status,
            downstream_ref,
            error,
            hold,
            receipt,
        };
        let ticket = self.stage(
            &mut state,
            EV_COMPLETED,
            record.event.agent_id.clone(),
            &event,
        )?;
        drop(state);
        ticket.durable().await?;
        Ok(complete_response(
            decision_id,
            &event,
            record.hold_state.is_some(),
        ))
    }

    /// Appends a console sign-in (or a refused one) to the audit log.
    ///
    /// # Errors
    /// HTTP 500 when the store fails.
    pub(crate) async fn record_console_login(
        &self,
        user: &str,
        via: &str,
        role: Option<&str>,
        signed_in: bool,
    ) -> Result<(), ApiError> {
        let mut state = self.lock_fresh().await?;
        let event = ConsoleLoginEvent {
            at: self.clock.now(),
            user: user.to_owned(),
            via: via.to_owned(),
            role: role.map(str::to_owned),
            outcome: if signed_in { "signed_in" } else { "refused" }.to_owned(),
        };
        let ticket = self.stage(&mut state, EV_CONSOLE_LOGIN, user.to_owned(), &event)?;
        drop(state);
        ticket.durable().await.map(|_| ())
    }

    // -----------------------------------------------------------------------------------------
    // Approvals

    /// Approvals, newest first; `status` filters on `pending`, `approved`, `rejected`,
    /// `consumed` or `expired`.
    pub async fn approvals(&self, status: Option<&str>) -> Vec<Value> {
        let state = self.lock_view().await;
        let now = self.clock.now();
        let mut list: Vec<(&ApprovalRecord, Value)> = state
            .approvals
            .values()
            .map(|a| (a, approval_view(&state, a, now)))
            .filter(|(_, v)| status.is_none_or(|s| v["status"] == s))
            .collect();
        list.sort_by_key(|entry| std::cmp::Reverse(entry.0.created_at));
        list.into_iter().map(|(_, v)| v).collect()
    }

    /// Approves or rejects a pending escalation on behalf of the person `name`d, who is
    /// recorded in the audit event.
    ///
    /// With an approver `id_token` the approver is verified: the token must carry the
    /// escalation's approver role, another subject than the requesting user, and `name` must
    /// be its subject or e-mail. Without one, the admin key vouches for `name`, unless the
    /// configuration requires a token; `name` must not be the requesting user either.
    ///
    /// # Errors
    /// 404 unknown ref, 409 not pending (or expired), 403 approver not allowed, 500 store.
    pub async fn resolve(
        &self,
        reference: &str,
        resolution: Resolution,
        name: &ApproverName,
        approver_token: Option<&str>,
        comment: Option<String>,
    ) -> Result<Value, ApiError> {
        let vouch = match approver_token {
            Some(token) => Vouch::IdToken(token),
            None => Vouch::AdminKey,
        };
        self.resolve_vouched(reference, resolution, name, vouch, comment)
            .await
    }

    /// [`Gate::resolve`] with the way the approver was authenticated: an `id_token`, the admin
    /// key vouching for `name`, or a console login whose password the gate checked (recorded
    /// `via: console_login` with the login's role, which must be the escalation's approver
    /// role).
    ///
    /// # Errors
    /// As [`Gate::resolve`].
    pub(crate) async fn resolve_vouched(
        &self,
        reference: &str,
        resolution: Resolution,
        name: &ApproverName,
        vouch: Vouch<'_>,
        comment: Option<String>,
    ) -> Result<Value, ApiError> {
        let mut state = self.lock_fresh().await?;
        let now = self.clock.now();
        let record = state
            .approvals
            .get(reference)
            .cloned()
            .ok_or_else(|| ApiError::not_found(format!("approval `{reference}` not found")))?;
        let view = approval_view(&state, &record, now);
        if view["status"] != "pending" {
            return Err(ApiError::conflict(format!(
                "approval `{reference}` is {}, not pending",
                view["status"].as_str().unwrap_or("?")
            )));
        }
        let requester = state
            .decisions
            .get(&record.decision_id)
            .and_then(|d| d.event.user.clone());
        let approver = match vouch {
            Vouch::Manager { role } => {
                if role != record.escalation.approver {
                    return Err(ApiError::forbidden(format!(
                        "`{name}` has role `{role}`; this escalation needs `{}`",
                        record.escalation.approver
                    )));
                }
                if requester.as_ref().is_some_and(|r| {
                    r.sub == name.as_str() || r.email.as_deref() == Some(name.as_str())
                }) {
                    return Err(ApiError::forbidden(format!(
                        "`{name}` asked for this action and cannot approve it"
                    )));
                }
                Approver {
                    sub: name.as_str().to_owned(),
                    role: Some(role.to_owned()),
                    email: None,
                    via: "console_login".into(),
                    name: Some(name.as_str().to_owned()),
                }
            }
            Vouch::IdToken(token) => {
                let verifier = self.oidc.as_ref().ok_or_else(|| {
                    ApiError::forbidden("no IdP is configured to verify approver tokens")
                })?;
                let who = verifier
                    .verify(token, now.timestamp())
                    .map_err(|e| ApiError::forbidden(format!("approver token {e}")))?;
                if who.role != record.escalation.approver {
                    return Err(ApiError::forbidden(format!(
                        "approver `{}` has role `{}`; this escalation needs `{}`",
                        who.sub, who.role, record.escalation.approver
                    )));
                }
                if requester.as_ref().is_some_and(|r| r.sub == who.sub) {
                    return Err(ApiError::forbidden(format!(
                        "`{}` asked for this action and cannot approve it",
                        who.sub
                    )));
                }
                if name.as_str() != who.sub && who.email.as_deref() != Some(name.as_str()) {
                    return Err(ApiError::forbidden(format!(
                        "approver `{name}` is not the approver token's subject `{}`",
                        who.sub
                    )));
                }
                Approver {
                    sub: who.sub,
                    role: Some(who.role),
                    email: who.email,
                    via: "id_token".into(),
                    name: Some(name.as_str().to_owned()),
                }
            }
            Vouch::AdminKey if self.settings.approvals.require_approver_token => {
                return Err(ApiError::forbidden(format!(
                    "deciding needs an approver id_token with role `{}`",
                    record.escalation.approver
                )));
            }
            Vouch::AdminKey => {
                if requester.as_ref().is_some_and(|r| {
                    r.sub == name.as_str() || r.email.as_deref() == Some(name.as_str())
                }) {
                    return Err(ApiError::forbidden(format!(
                        "`{name}` asked for this action and cannot approve it"
                    )));
                }
                Approver {
                    sub: name.as_str().to_owned(),
                    role: None,
                    email: None,
                    via: "admin_key".into(),
                    name: Some(name.as_str().to_owned()),
                }
            }
        };
        let event = ApprovalEvent {
            reference: reference.to_owned(),
            at: now,
            outcome: match resolution {
                Resolution::Approve => ApprovalOutcome::Approved,
                Resolution::Reject => ApprovalOutcome::Rejected,
            },
            approver,
            comment,
        };
        let ticket = self.stage(&mut state, EV_APPROVAL, event.approver.sub.clone(), &event)?;
        let record = state
            .approvals
            .get(reference)
            .ok_or_else(|| ApiError::internal("approval vanished"))?;
        let view = approval_view(&state, record, now);
        drop(state);
        ticket.durable().await?;
        Ok(view)
    }

    // -----------------------------------------------------------------------------------------
    // Audit

    /// Every audit event, in order.
    ///
    /// # Errors
    /// 500 when the store fails.
    pub async fn audit(&self) -> Result<Vec<AuditEvent>, ApiError> {
        self.store
            .load()
            .await
            .map_err(|e| ApiError::internal(e.to_string()))
    }

    /// Recent decisions, newest first (the "Control → Decisions" view).
    pub async fn decisions(&self, limit: usize) -> Vec<Value> {
        let state = self.lock_view().await;
        let mut list: Vec<&DecisionEvent> = state.decisions.values().map(|d| &d.event).collect();
        list.sort_by_key(|e| std::cmp::Reverse(e.at));
        list.into_iter()
            .take(limit)
            .map(|e| {
                let on_behalf = e.user.as_ref().map(|u| {
                    format!(
                        "{} ({})",
                        u.email.clone().unwrap_or_else(|| u.sub.clone()),
                        u.role
                    )
                });
                json!({
                    "decision_id": e.decision_id, "at": rfc3339(e.at), "agent_id": e.agent_id,
                    "tool": e.tool, "action": e.action, "resource": e.resource,
                    "decision": e.verdict.as_str(), "code": e.code, "reason": e.reason,
                    "amount": e.amount.map(display), "currency": e.currency,
                    "on_behalf_of": on_behalf, "intent": e.intent, "policies": e.policies,
                    "observed_code": e.observed_code, "observed_reason": e.observed_reason,
                })
            })
            .collect()
    }
}

impl Gate {
    /// The mandates with what they have used (committed by `complete(success)`) and what is
    /// held (allowed, not yet completed) in the current UTC day and month, by id. Released
    /// holds count in neither.
    pub async fn mandates(&self) -> Vec<Value> {
        let state = self.lock_view().await;
        let (day, month) = windows(self.clock.now());
        self.settings
            .mandates
            .values()
            .map(|m| {
                let mut totals = [Decimal::ZERO; 4]; // day used, day held, month used, month held
                for record in state.decisions.values() {
                    let Some(hold) = record.event.hold.as_ref().filter(|h| h.mandate_id == m.id)
                    else {
                        continue;
                    };
                    let offset = match record.hold_state {
                        Some(HoldState::Committed) => 0,
                        Some(HoldState::Held) => 1,
                        Some(HoldState::Released) | None => continue,
                    };
                    if hold.day == day {
                        totals[offset] += hold.amount;
                    }
                    if hold.month == month {
                        totals[2 + offset] += hold.amount;
                    }
                }
                json!({
                    "mandate_id": m.id, "version": m.version, "status": m.status,
                    "agent": m.agent, "currency": m.currency,
                    "per_tx_limit": m.per_tx_limit.map(display),
                    "daily_limit": m.daily_limit.map(display),
                    "monthly_limit": m.monthly_limit.map(display),
                    "day": day, "month": month,
                    "used_today": display(totals[0]), "held_today": display(totals[1]),
                    "used_this_month": display(totals[2]), "held_this_month": display(totals[3]),
                })
            })
            .collect()
    }
}

/// The projections behind the state lock, with the log writer's epoch they belong to.
#[derive(Debug)]
struct Live {
    state: State,
    /// The writer's epoch: bumped each time the state is rebuilt from the log.
    epoch: u64,
    /// The state may count events the log does not hold (an event failed to apply, or a
    /// rebuild failed): it is rebuilt before the next decision.
    stale: bool,
}

impl std::ops::Deref for Live {
    type Target = State;

    fn deref(&self) -> &State {
        &self.state
    }
}

impl std::ops::DerefMut for Live {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.state
    }
}

/// The projections of the whole durable log: on open, and after a failed batch.
async fn replay_log(store: &dyn GateStore) -> Result<State, GateError> {
    let mut state = State::default();
    for event in store.load().await? {
        state.apply(event.seq, &event.event_type, &event.payload)?;
    }
    Ok(state)
}

/// Why flags mode cannot apply its amount rules to a request without a readable amount,
/// naming the rules and what `args.amount` held.
fn unreadable_amount(rules: &FlagRules, args: &Value) -> String {
    let limits = [
        ("--deny-over", rules.deny_over),
        ("--escalate-over", rules.escalate_over),
    ]
    .into_iter()
    .filter_map(|(flag, limit)| limit.map(|l| format!("{flag} {}", display(l))))
    .collect::<Vec<_>>()
    .join(" and ");
    match args.get("amount") {
        Some(received) => format!(
            "fail closed: {limits} compare a numeric amount, and `args.amount` is {} ({}), not \
             a JSON number; send the amount as a number (context.amount_usd, or args.amount)",
            excerpt(received),
            json_kind(received)
        ),
        None => format!(
            "fail closed: {limits} need an amount, and the request has no amount \
             (context.amount_usd, context.amount + currency, or a numeric args.amount)"
        ),
    }
}

enum ApprovalGate {
    Pending,
    Approved(ApprovalEvent),
    Refused(String),
}

fn describe_approver(a: &Approver) -> String {
    match &a.role {
        Some(role) => format!("{} ({role})", a.sub),
        None => a.sub.clone(),
    }
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

fn response(event: &DecisionEvent, token: Option<(String, i64)>) -> Value {
    let mut out = json!({
        "decision": event.verdict.as_str(),
        "decision_id": event.decision_id,
    });
    match event.verdict {
        Verdict::Allow => {
            if let Some((token, exp)) = token {
                out["token"] = json!(token);
                out["expires_at"] = json!(
                    DateTime::from_timestamp(exp, 0)
                        .map(rfc3339)
                        .unwrap_or_default()
                );
            }
            out["obligations"] = json!([]);
            if let Some(risk) = event.risk_score {
                out["risk_score"] = json!(risk);
            }
        }
        Verdict::Deny | Verdict::Escalate => {
            out["code"] = json!(event.code);
            out["reason"] = json!(event.reason);
            if let Some(c) = &event.refusal_currency {
                out["currency"] = json!(c);
            }
            if let Some(e) = &event.escalation {
                out["escalation"] = json!({
                    "type": e.kind, "ref": e.reference, "approver": e.approver,
                    "expires_at": rfc3339(e.expires_at),
                });
            }
        }
    }
    out
}

/// The decision `decision_id` if `caller` may complete it as `status` now; `Ok(None)` when it
/// is already completed with that same status (an idempotent repeat).
fn completable(
    state: &State,
    caller: &Caller,
    decision_id: &str,
    status: CompleteStatus,
) -> Result<Option<DecisionRecord>, ApiError> {
    let record = state
        .decisions
        .get(decision_id)
        .ok_or_else(|| ApiError::not_found(format!("decision `{decision_id}` not found")))?;
    if let Some(bound) = &caller.bound_agent
        && *bound != record.event.agent_id
    {
        return Err(ApiError::forbidden(format!(
            "decision `{decision_id}` belongs to another agent"
        )));
    }
    if record.event.verdict != Verdict::Allow {
        return Err(ApiError::conflict(format!(
            "decision `{decision_id}` was {}; only allowed decisions are completed",
            record.event.verdict.as_str()
        )));
    }
    match &record.completion {
        Some(done) if done.status == status => Ok(None),
        Some(done) => Err(ApiError::conflict(format!(
            "decision `{decision_id}` was already completed as {}",
            done.status.as_str()
        ))),
        None => Ok(Some(record.clone())),
    }
}

/// The answer to a repeated completion with the recorded status: the recorded one.
fn already_completed(state: &State, decision_id: &str) -> Result<Value, ApiError> {
    let record = state
        .decisions
        .get(decision_id)
        .ok_or_else(|| ApiError::not_found(format!("decision `{decision_id}` not found")))?;
    let done = record
        .completion
        .as_ref()
        .ok_or_else(|| ApiError::internal(format!("decision `{decision_id}` has no completion")))?;
    Ok(complete_response(
        decision_id,
        done,
        record.hold_state.is_some(),
    ))
}

fn complete_response(decision_id: &str, event: &CompletionEvent, had_hold: bool) -> Value {
    json!({
        "decision_id": decision_id,
        "recorded": true,
        "mandate_reconciled": had_hold,
        "status": event.status.as_str(),
        "receipt": event.receipt,
    })
}

fn approval_view(state: &State, a: &ApprovalRecord, now: DateTime<Utc>) -> Value {
    let decision = state.decisions.get(&a.decision_id).map(|d| &d.event);
    let (status, decided, consumed_by) = match &a.status {
        ApprovalStatus::Pending if now > a.escalation.expires_at => ("expired", None, None),
        ApprovalStatus::Pending => ("pending", None, None),
        ApprovalStatus::Decided(d) => (
            if d.outcome == ApprovalOutcome::Approved {
                "approved"
            } else {
                "rejected"
            },
            Some(d),
            None,
        ),
        ApprovalStatus::Consumed {
            decision_id,
            decided,
        } => ("consumed", Some(decided), Some(decision_id.clone())),
    };
    json!({
        "ref": a.escalation.reference,
        "status": status,
        "approver_role": a.escalation.approver,
        "type": a.escalation.kind,
        "created_at": rfc3339(a.created_at),
        "expires_at": rfc3339(a.escalation.expires_at),
        "decision_id": a.decision_id,
        "agent_id": decision.map(|d| d.agent_id.clone()),
        "tool": decision.map(|d| d.tool.clone()),
        "action": decision.map(|d| d.action.clone()),
        "resource": decision.and_then(|d| d.resource.clone()),
        "amount": decision.and_then(|d| d.amount).map(display),
        "currency": decision.and_then(|d| d.currency.clone()),
        "reason": decision.and_then(|d| d.reason.clone()),
        "policies": decision.map(|d| d.policies.clone()),
        "intent": decision.and_then(|d| d.intent.clone()),
        "on_behalf_of": decision.and_then(|d| d.user.clone()),
        "idempotency_key": decision.and_then(|d| d.idempotency_key.clone()),
        "decided_by": decided.map(|d| json!(d.approver)),
        "decided_at": decided.map(|d| rfc3339(d.at)),
        "comment": decided.and_then(|d| d.comment.clone()),
        "consumed_by": consumed_by,
    })
}
