//! Explanations: the decision plus what every policy said about the call.

use std::borrow::Cow;
use std::fmt;

use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};

use crate::decision::Decision;
use crate::policy::{Policy, Verdict};

/// A decision together with every policy's verdict, for audit trails and `policies check`.
///
/// Serializes as the [`Decision`] object plus `"policies": [PolicyTrace…]`.
#[derive(Debug, Clone)]
pub struct Explanation<'s> {
    /// The decision, identical to what [`PolicySet::evaluate`](crate::PolicySet::evaluate) returns.
    pub decision: Decision<'s>,
    /// One entry per policy, in evaluation order.
    pub policies: Vec<PolicyTrace<'s>>,
}

/// What one policy said about the call.
#[derive(Debug, Clone)]
pub struct PolicyTrace<'s> {
    /// The policy.
    pub policy: &'s Policy,
    /// Its scope covers the tool.
    pub applies: bool,
    /// It applies and its conditions hold (always true for a policy without conditions).
    pub matched: bool,
    /// What it asks for.
    pub effect: Effect,
    /// Its deny message (including allow-list violations) or approval reason.
    pub message: Option<Cow<'s, str>>,
    /// It is the deciding policy.
    pub deciding: bool,
    /// For a Cedar policy in scope: what Cedar said, naming the Cedar policies (`@id`) that
    /// decided (`permit (…)`, `forbid (…)`, `escalate (…) to <role>`, `no permit matched
    /// (default deny)`, `cannot decide: <problem>`).
    pub cedar: Option<String>,
}

/// What a policy asks for on a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Effect {
    /// Nothing: out of scope or not matched.
    None,
    /// No objection (an allow policy; its allow list, if any, passed).
    Allow,
    /// A denial (a deny policy or an allow-list violation).
    Deny,
    /// An approval.
    RequireApproval,
}

impl Effect {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Effect::None => "none",
            Effect::Allow => "allow",
            Effect::Deny => "deny",
            Effect::RequireApproval => "require_approval",
        }
    }
}

impl<'s> PolicyTrace<'s> {
    pub(crate) fn new(policy: &'s Policy, verdict: Verdict<'s>) -> Self {
        let (applies, matched, effect, message) = match verdict {
            Verdict::NotApplicable => (false, false, Effect::None, None),
            Verdict::NoMatch => (true, false, Effect::None, None),
            Verdict::Allow => (true, true, Effect::Allow, None),
            Verdict::Deny(m) => (true, true, Effect::Deny, Some(m)),
            Verdict::Approval => (
                true,
                true,
                Effect::RequireApproval,
                policy.reason().map(Cow::Borrowed),
            ),
        };
        Self {
            policy,
            applies,
            matched,
            effect,
            message,
            deciding: false,
            cedar: None,
        }
    }
}

impl Serialize for Effect {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// `{"policy", "scope", "action", "applies", "matched", "effect", "message"?, "deciding"}`.
impl Serialize for PolicyTrace<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("policy", self.policy.id())?;
        map.serialize_entry("scope", self.policy.scope())?;
        map.serialize_entry("action", &self.policy.action())?;
        map.serialize_entry("applies", &self.applies)?;
        map.serialize_entry("matched", &self.matched)?;
        map.serialize_entry("effect", &self.effect)?;
        if let Some(m) = &self.message {
            map.serialize_entry("message", m)?;
        }
        map.serialize_entry("deciding", &self.deciding)?;
        if let Some(cedar) = &self.cedar {
            map.serialize_entry("cedar", cedar)?;
        }
        map.end()
    }
}

impl Serialize for Explanation<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        self.decision.serialize_fields(&mut map)?;
        map.serialize_entry("policies", &self.policies)?;
        map.end()
    }
}

/// Human-readable form, e.g.
///
/// ```text
/// decision: require_approval
/// policy:   payments/refund-approval-boundary@1.0.0
/// reason:   Refund amount above delegated limit.
/// approval: 1 approval(s) required, on_reject return_to_agent
/// policies:
///   payments/refund-approval-boundary@1.0.0 (require_approval): matched -> require_approval [deciding]
///   payments/refund-hard-limit@1.0.0 (deny): not matched
/// ```
impl fmt::Display for Explanation<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "decision: {}", self.decision.kind())?;
        if let Some(p) = self.decision.policy() {
            writeln!(f, "policy:   {}", p.id())?;
        }
        if let Some(r) = self.decision.reason() {
            writeln!(f, "reason:   {r}")?;
        }
        if let Decision::RequireApproval { policy } = &self.decision {
            write!(
                f,
                "approval: {} approval(s) required, on_reject {}",
                policy.approvals_required(),
                policy.on_reject()
            )?;
            if let Some(route) = policy.route() {
                write!(f, ", route {route}")?;
            }
            if let Some(t) = policy.timeout() {
                write!(f, ", timeout {} min then {}", t.after_minutes, t.default)?;
            }
            writeln!(f)?;
        }
        write!(f, "policies:")?;
        if self.policies.is_empty() {
            write!(f, " none")?;
        }
        for t in &self.policies {
            if t.policy.is_cedar() {
                write!(f, "\n  {} (cedar): ", t.policy.id())?;
            } else {
                write!(f, "\n  {} ({}): ", t.policy.id(), t.policy.action())?;
            }
            match (t.applies, t.matched) {
                (false, _) => write!(f, "not applicable (scope {})", t.policy.scope())?,
                (true, false) => write!(f, "not matched")?,
                (true, true) => write!(f, "matched -> {}", t.effect.as_str())?,
            }
            if t.effect == Effect::Deny
                && let Some(m) = &t.message
            {
                write!(f, ": {m}")?;
            }
            if let Some(cedar) = &t.cedar {
                write!(f, " [cedar: {cedar}]")?;
            }
            if t.deciding {
                write!(f, " [deciding]")?;
            }
        }
        Ok(())
    }
}
