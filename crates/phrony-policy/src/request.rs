//! What a caller hands the engine for one tool call. Everything is borrowed.

use std::fmt;
use std::str::FromStr;

use serde::{Serialize, Serializer};
use serde_json::Value;

/// One tool call to decide: the tool, its arguments and the context it runs in.
///
/// Only `tool` and `args` are required; context that is not given reads as a missing field
/// (so every operator but `exists: false` is false on it). Empty strings count as not given.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// The tool being called.
    pub tool: ToolCtx<'a>,
    /// The call's arguments (normally a JSON object).
    pub args: &'a Value,
    /// The agent whose session makes the call.
    pub agent: Option<AgentCtx<'a>>,
    /// The session making the call.
    pub session: Option<SessionCtx<'a>>,
    /// Claims of the principal on whose behalf the session runs (a JSON object, e.g. `{"role": "ops"}`).
    pub principal: Option<&'a Value>,
    /// The current time in Unix seconds. The engine never reads a clock.
    pub now_unix: Option<i64>,
    /// Facts about earlier calls, by the set's query index (see [`crate::HistoryFacts`]); a
    /// history leaf with none holds (fail-closed).
    pub history: Option<&'a crate::HistoryFacts>,
}

impl<'a> Request<'a> {
    /// A request with a tool and arguments and no other context.
    pub fn new(tool: ToolCtx<'a>, args: &'a Value) -> Self {
        Self {
            tool,
            args,
            agent: None,
            session: None,
            principal: None,
            now_unix: None,
            history: None,
        }
    }

    /// Sets the history facts.
    #[must_use]
    pub fn with_history(mut self, facts: &'a crate::HistoryFacts) -> Self {
        self.history = Some(facts);
        self
    }

    /// Sets the agent.
    #[must_use]
    pub fn with_agent(mut self, agent: AgentCtx<'a>) -> Self {
        self.agent = Some(agent);
        self
    }

    /// Sets the session.
    #[must_use]
    pub fn with_session(mut self, session: SessionCtx<'a>) -> Self {
        self.session = Some(session);
        self
    }

    /// Sets the principal's claims.
    #[must_use]
    pub fn with_principal(mut self, claims: &'a Value) -> Self {
        self.principal = Some(claims);
        self
    }

    /// Sets the current time (Unix seconds).
    #[must_use]
    pub fn at(mut self, now_unix: i64) -> Self {
        self.now_unix = Some(now_unix);
        self
    }
}

/// The tool of a call.
#[derive(Debug, Clone, Copy, Default)]
pub struct ToolCtx<'a> {
    /// Dispatch ref `namespace.name` (what `scope: tool:<ref>` matches).
    pub r#ref: &'a str,
    /// Tool version.
    pub version: &'a str,
    /// Side-effect class (`read_only`, `idempotent_write`, `non_idempotent_write`, `irreversible_action`).
    pub side_effect_class: &'a str,
    /// Wire name the model calls the tool by (the binding's `as`).
    pub name: &'a str,
}

impl<'a> ToolCtx<'a> {
    /// A tool known only by its dispatch ref.
    pub fn new(r#ref: &'a str) -> Self {
        Self {
            r#ref,
            ..Self::default()
        }
    }
}

/// The agent of a call.
#[derive(Debug, Clone, Copy, Default)]
pub struct AgentCtx<'a> {
    /// Agent namespace.
    pub namespace: &'a str,
    /// Agent name.
    pub name: &'a str,
    /// Agent version.
    pub version: &'a str,
}

/// The session of a call.
#[derive(Debug, Clone, Copy, Default)]
pub struct SessionCtx<'a> {
    /// Session id.
    pub id: &'a str,
    /// Session metadata (a JSON object).
    pub metadata: Option<&'a Value>,
}

/// A dispatch-failure trigger (§2.7 of the reference), seen by `phrony.dispatch.trigger`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Trigger {
    /// `dispatch:no_handler`: no worker advertises the tool version.
    NoHandler,
    /// `dispatch:capacity_exhausted`: workers busy until the wait ended, or the queue is full.
    CapacityExhausted,
    /// `dispatch:lease_expired`.
    LeaseExpired,
    /// `dispatch:indeterminate`: the call may or may not have run.
    Indeterminate,
    /// `limit:escalate`: a session limit was hit with `on_limit: escalate`.
    LimitEscalate,
}

impl Trigger {
    /// Every trigger, in documentation order.
    pub const ALL: [Trigger; 5] = [
        Trigger::NoHandler,
        Trigger::CapacityExhausted,
        Trigger::LeaseExpired,
        Trigger::Indeterminate,
        Trigger::LimitEscalate,
    ];

    /// The wire form, e.g. `dispatch:no_handler`.
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::NoHandler => "dispatch:no_handler",
            Trigger::CapacityExhausted => "dispatch:capacity_exhausted",
            Trigger::LeaseExpired => "dispatch:lease_expired",
            Trigger::Indeterminate => "dispatch:indeterminate",
            Trigger::LimitEscalate => "limit:escalate",
        }
    }
}

impl fmt::Display for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Trigger {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// Error of [`Trigger::from_str`]: the text names no known trigger.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown dispatch trigger `{0}`; expected dispatch:no_handler, dispatch:capacity_exhausted, \
     dispatch:lease_expired, dispatch:indeterminate or limit:escalate"
)]
pub struct UnknownTrigger(pub String);

impl FromStr for Trigger {
    type Err = UnknownTrigger;

    /// Parses the wire form, ignoring case and surrounding whitespace.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        Trigger::ALL
            .into_iter()
            .find(|k| k.as_str().eq_ignore_ascii_case(t))
            .ok_or_else(|| UnknownTrigger(s.to_owned()))
    }
}
