//! The result of evaluating one call.

use std::borrow::Cow;
use std::fmt;

use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};

use crate::policy::{OnModify, Policy};

/// The decision on one tool call. Borrows from the [`PolicySet`](crate::PolicySet).
#[derive(Debug, Clone)]
pub enum Decision<'s> {
    /// Dispatch the call.
    Allow,
    /// Do not dispatch; the model receives `message` as an error result.
    Deny {
        /// The deciding policy (the first denying one in order).
        policy: &'s Policy,
        /// The policy's reason, `tool call blocked by policy <name>`, or an allow-list message.
        message: Cow<'s, str>,
    },
    /// Pause until a human decides. Quorum, timeout, route etc. are the policy's own.
    RequireApproval {
        /// The chosen approval policy.
        policy: &'s Policy,
    },
}

/// The kind of a [`Decision`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DecisionKind {
    /// `allow`
    Allow,
    /// `deny`
    Deny,
    /// `require_approval` (also for `escalate` policies)
    RequireApproval,
}

impl DecisionKind {
    /// The wire name: `allow`, `deny` or `require_approval`.
    pub fn as_str(self) -> &'static str {
        match self {
            DecisionKind::Allow => "allow",
            DecisionKind::Deny => "deny",
            DecisionKind::RequireApproval => "require_approval",
        }
    }
}

impl fmt::Display for DecisionKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for DecisionKind {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'s> Decision<'s> {
    /// The kind of decision.
    pub fn kind(&self) -> DecisionKind {
        match self {
            Decision::Allow => DecisionKind::Allow,
            Decision::Deny { .. } => DecisionKind::Deny,
            Decision::RequireApproval { .. } => DecisionKind::RequireApproval,
        }
    }

    /// Whether the call may be dispatched without a human.
    pub fn is_allow(&self) -> bool {
        matches!(self, Decision::Allow)
    }

    /// The deciding policy; `None` for the default allow.
    pub fn policy(&self) -> Option<&'s Policy> {
        match self {
            Decision::Allow => None,
            Decision::Deny { policy, .. } | Decision::RequireApproval { policy } => Some(policy),
        }
    }

    /// The deny message, or the approval policy's reason.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Decision::Allow => None,
            Decision::Deny { message, .. } => Some(message),
            Decision::RequireApproval { policy } => policy.reason(),
        }
    }

    /// Writes this decision's fields into a JSON map (shared with explanations).
    pub(crate) fn serialize_fields<M: SerializeMap>(&self, map: &mut M) -> Result<(), M::Error> {
        map.serialize_entry("decision", &self.kind())?;
        if let Some(policy) = self.policy() {
            map.serialize_entry("policy", policy.id())?;
        }
        if let Some(reason) = self.reason() {
            map.serialize_entry("reason", reason)?;
        }
        if let Decision::RequireApproval { policy } = self {
            map.serialize_entry("action", &policy.action())?;
            map.serialize_entry("approvals_required", &policy.approvals_required())?;
            map.serialize_entry("on_reject", &policy.on_reject())?;
            if policy.on_modify() == OnModify::Revalidate {
                map.serialize_entry("on_modify", "revalidate")?;
            }
            map.serialize_entry("comprehension_required", &policy.comprehension_required())?;
            if policy.allow_self_approval() {
                map.serialize_entry("allow_self_approval", &true)?;
            }
            if let Some(timeout) = policy.timeout() {
                map.serialize_entry("timeout", &timeout)?;
            }
            if let Some(authority_ref) = policy.authority_ref() {
                map.serialize_entry("authority_ref", authority_ref)?;
            }
            if let Some(route) = policy.route() {
                map.serialize_entry("route", route)?;
            }
            if let Some(runtime) = policy.runtime() {
                map.serialize_entry("runtime", runtime)?;
            }
        }
        Ok(())
    }
}

/// `{"decision": "allow" | "deny" | "require_approval", "policy": "ns/name@version", "reason": …}`;
/// approvals add `action`, `approvals_required`, `on_reject`, `comprehension_required` and, when
/// set, `on_modify`, `timeout`, `authority_ref`, `route` and `runtime`. `policy` is absent on the
/// default allow.
impl Serialize for Decision<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        self.serialize_fields(&mut map)?;
        map.end()
    }
}
