//! Re-deciding a stored call under the candidate manifest, the way the runtime decides a call
//! (`phrony-engine` `calls.rs`): the arguments against the binding's `input_schema` first, then
//! the policies on the request [`phrony_manifest::CallScope`] builds, and comparing the two
//! decisions.

use std::collections::{BTreeMap, HashMap};

use anyhow::anyhow;
use chrono::{DateTime, Utc};
use phrony_manifest::{CallScope, CompiledAgent, ToolArgsValidator, ToolBinding};
use phrony_policy::{Decision, PolicySet};
use serde::Serialize;
use serde_json::Value;

use super::stored::{Decided, Kind, StoredCall};

/// The pseudo tools the runtime records for its own escalations (a limit hit, an output
/// contract): no model called them, so no candidate binding decides them.
const RUNTIME_TOOLS: [&str; 2] = ["phrony.limit", "phrony.output"];

/// The candidate manifest, compiled for deciding.
pub(crate) struct Candidate {
    agent: CompiledAgent,
    policies: PolicySet,
    validators: HashMap<String, ToolArgsValidator>,
}

impl Candidate {
    /// Compiles the agent's policies and argument schemas.
    ///
    /// # Errors
    /// A policy set or an input schema that does not compile (the manifest loader rejects both
    /// first, so this names an internal error).
    pub(crate) fn new(agent: CompiledAgent) -> anyhow::Result<Self> {
        let policies = agent.policy_set().map_err(|errors| {
            anyhow!("internal error: the candidate's compiled policies do not load: {errors}")
        })?;
        let mut validators = HashMap::new();
        for binding in &agent.spec.tools {
            let validator = ToolArgsValidator::for_binding(binding).map_err(|err| {
                anyhow!(
                    "the candidate's tool {} has an input_schema that cannot be used: {err}",
                    binding.wire_name()
                )
            })?;
            validators.insert(binding.wire_name(), validator);
        }
        Ok(Self {
            agent,
            policies,
            validators,
        })
    }

    /// The candidate agent.
    pub(crate) fn agent(&self) -> &CompiledAgent {
        &self.agent
    }

    /// The binding the model's name `wire` reaches, as the runtime looks it up.
    fn binding(&self, wire: &str) -> Option<&ToolBinding> {
        self.agent.spec.tools.iter().find(|b| b.wire_name() == wire)
    }

    /// What the candidate decides on `call`, in the session `facts` describe.
    fn decide(&self, facts: &SessionFacts<'_>, call: &StoredCall) -> Result<Decided, Skip> {
        let binding = self.binding(&call.wire).ok_or(Skip::NotInCandidate)?;
        if let Some(validator) = self.validators.get(&call.wire)
            && validator.validate(&call.args).is_err()
        {
            return Ok(Decided {
                decision: Kind::InvalidArgs,
                policy: None,
                approval: None,
            });
        }
        let now = call.decided_at.map_or(0, |t| t.timestamp());
        let scope = CallScope {
            agent: &self.agent,
            session_id: facts.session_id,
            metadata: facts.metadata,
            principal: facts.principal,
            now,
        };
        let (decision, policy) = match self
            .policies
            .evaluate(&scope.request(binding, &call.wire, &call.args))
        {
            Decision::Allow => (Kind::Allow, None),
            Decision::Deny { policy, .. } => (Kind::Deny, Some(policy.id().to_string())),
            Decision::RequireApproval { policy } => {
                (Kind::RequireApproval, Some(policy.id().to_string()))
            }
        };
        Ok(Decided {
            decision,
            policy,
            approval: None,
        })
    }
}

/// What policies see of the session a call belongs to.
pub(crate) struct SessionFacts<'a> {
    /// The session id.
    pub(crate) session_id: &'a str,
    /// Its metadata ([`phrony_manifest::session_metadata`]).
    pub(crate) metadata: &'a Value,
    /// The principal's claims, when the session recorded them.
    pub(crate) principal: Option<&'a Value>,
}

/// Why a stored call is not replayed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Skip {
    /// The runtime never decided it (cancelled or ended before, or still undecided).
    NotDecided,
    /// A runtime escalation (limit, output contract), not a tool call.
    RuntimeEscalation,
    /// The candidate has no tool of that name.
    NotInCandidate,
}

impl Skip {
    /// The reason as the summary prints it and JSON names it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::NotDecided => "not_decided",
            Self::RuntimeEscalation => "runtime_escalation",
            Self::NotInCandidate => "tool_not_in_candidate",
        }
    }

    /// What the reason means, for people.
    pub(crate) fn explain(self) -> &'static str {
        match self {
            Self::NotDecided => "never decided (cancelled, or ended before a decision)",
            Self::RuntimeEscalation => "runtime escalations (limits, output contract)",
            Self::NotInCandidate => "tool not in the candidate manifest",
        }
    }
}

/// A stored decision the candidate would take differently.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Flip {
    /// When the runtime decided it.
    pub(crate) time: Option<DateTime<Utc>>,
    /// The session.
    pub(crate) session_id: String,
    /// The call.
    pub(crate) call_id: String,
    /// `ref@version` of the tool.
    pub(crate) tool: String,
    /// What the runtime decided.
    pub(crate) stored: Decided,
    /// What the candidate decides.
    pub(crate) candidate: Decided,
}

/// The counts of a replay.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Summary {
    /// Sessions read.
    pub(crate) sessions: u64,
    /// Calls re-decided.
    pub(crate) replayed: u64,
    /// Calls the candidate decides as the runtime did.
    pub(crate) unchanged: u64,
    /// Calls whose decision would flip.
    pub(crate) flipped: u64,
    /// Flips by `stored -> candidate` kind.
    pub(crate) flips: BTreeMap<String, u64>,
    /// Unchanged decisions that another policy would take (same kind, other deciding policy).
    pub(crate) other_policy: u64,
    /// Calls not replayed, by reason.
    pub(crate) skipped: BTreeMap<&'static str, u64>,
}

/// A replay in progress: the flips found and the counts.
#[derive(Debug, Default)]
pub(crate) struct Replay {
    /// The flips, in the order found.
    pub(crate) flips: Vec<Flip>,
    /// The counts.
    pub(crate) summary: Summary,
}

impl Replay {
    /// Re-decides `call` under `candidate` and records the outcome.
    pub(crate) fn add(
        &mut self,
        candidate: &Candidate,
        facts: &SessionFacts<'_>,
        call: &StoredCall,
    ) {
        let outcome = match &call.decision {
            _ if RUNTIME_TOOLS.contains(&call.tool.as_str()) => Err(Skip::RuntimeEscalation),
            None => Err(Skip::NotDecided),
            Some(stored) => candidate.decide(facts, call).map(|c| (stored, c)),
        };
        let (stored, new) = match outcome {
            Ok(pair) => pair,
            Err(skip) => {
                *self.summary.skipped.entry(skip.as_str()).or_default() += 1;
                return;
            }
        };
        self.summary.replayed += 1;
        if stored.decision == new.decision {
            self.summary.unchanged += 1;
            if stored.policy != new.policy {
                self.summary.other_policy += 1;
            }
            return;
        }
        self.summary.flipped += 1;
        let kind = format!("{} -> {}", stored.decision.as_str(), new.decision.as_str());
        *self.summary.flips.entry(kind).or_default() += 1;
        self.flips.push(Flip {
            time: call.decided_at,
            session_id: facts.session_id.to_owned(),
            call_id: call.call_id.clone(),
            tool: format!("{}@{}", call.tool, call.version),
            stored: stored.clone(),
            candidate: new,
        });
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests: a panic is a failed assertion")]

    use std::path::Path;

    use serde_json::json;

    use super::*;

    /// The tutorial's refund agent, its approval boundary at `boundary` euros.
    fn candidate(boundary: u32) -> Candidate {
        let dir = tempfile::tempdir().unwrap();
        let example =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../policies-examples/refund-agent");
        for rel in [
            "agent.yaml",
            "tools/orders.lookup-order.yaml",
            "tools/payments.issue-refund.yaml",
            "policies/refund-hard-limit.yaml",
        ] {
            let to = dir.path().join(rel);
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(example.join(rel), to).unwrap();
        }
        let boundary_policy =
            std::fs::read_to_string(example.join("policies/refund-approval-boundary.yaml"))
                .unwrap()
                .replace("value: 250", &format!("value: {boundary}"));
        std::fs::write(
            dir.path().join("policies/refund-approval-boundary.yaml"),
            boundary_policy,
        )
        .unwrap();
        let compiled = phrony_manifest::load_agent(dir.path().join("agent.yaml")).unwrap();
        Candidate::new(compiled.agent).unwrap()
    }

    fn call(id: &str, wire: &str, args: Value, stored: Option<Decided>) -> StoredCall {
        StoredCall {
            call_id: id.into(),
            tool: "payments.issue-refund".into(),
            version: "1.0.0".into(),
            wire: wire.into(),
            args,
            decided_at: DateTime::from_timestamp(1_700_000_000, 0),
            decision: stored,
        }
    }

    fn refund_call(id: &str, amount: u32, stored: Option<Decided>) -> StoredCall {
        call(id, "issue_refund", refund(amount), stored)
    }

    fn refund(amount: u32) -> Value {
        json!({"order_id": "ORD-1", "amount": amount, "currency": "EUR", "reason": "damaged"})
    }

    const BOUNDARY: &str = "payments/refund-approval-boundary@1.0.0";

    fn approval(status: &str) -> Decided {
        Decided {
            decision: Kind::RequireApproval,
            policy: Some(BOUNDARY.into()),
            approval: Some(status.into()),
        }
    }

    fn allow() -> Decided {
        Decided {
            decision: Kind::Allow,
            policy: None,
            approval: None,
        }
    }

    fn replay(candidate: &Candidate, calls: &[StoredCall]) -> Replay {
        let metadata = json!({});
        let facts = SessionFacts {
            session_id: "run_1",
            metadata: &metadata,
            principal: None,
        };
        let mut replay = Replay::default();
        for c in calls {
            replay.add(candidate, &facts, c);
        }
        replay
    }

    #[test]
    fn raising_the_boundary_flips_only_the_call_between_the_old_and_the_new() {
        let calls = [
            refund_call("c100", 100, Some(allow())),
            refund_call("c300", 300, Some(approval("approved"))),
            refund_call("c600", 600, Some(approval("denied"))),
        ];
        let replay = replay(&candidate(500), &calls);
        assert_eq!(
            replay.flips,
            vec![Flip {
                time: DateTime::from_timestamp(1_700_000_000, 0),
                session_id: "run_1".into(),
                call_id: "c300".into(),
                tool: "payments.issue-refund@1.0.0".into(),
                stored: approval("approved"),
                candidate: allow(),
            }]
        );
        assert_eq!(replay.summary.replayed, 3);
        assert_eq!(replay.summary.unchanged, 2);
        assert_eq!(replay.summary.flipped, 1);
        assert_eq!(
            replay.summary.flips,
            BTreeMap::from([("require_approval -> allow".to_owned(), 1)])
        );
        assert!(replay.summary.skipped.is_empty());
    }

    #[test]
    fn the_same_manifest_flips_nothing() {
        let calls = [
            refund_call("c100", 100, Some(allow())),
            refund_call("c300", 300, Some(approval("pending"))),
        ];
        let replay = replay(&candidate(250), &calls);
        assert!(replay.flips.is_empty(), "{:?}", replay.flips);
        assert_eq!(replay.summary.unchanged, 2);
        assert_eq!(replay.summary.other_policy, 0);
    }

    #[test]
    fn lowering_the_boundary_flips_allow_to_approval_and_names_the_policy() {
        let calls = [refund_call("c100", 100, Some(allow()))];
        let replay = replay(&candidate(50), &calls);
        assert_eq!(replay.flips.len(), 1);
        assert_eq!(
            replay.flips[0].candidate,
            Decided {
                decision: Kind::RequireApproval,
                policy: Some(BOUNDARY.into()),
                approval: None
            }
        );
    }

    #[test]
    fn arguments_the_candidates_schema_refuses_are_an_invalid_args_decision() {
        let calls = [call(
            "c1",
            "issue_refund",
            json!({"amount": 100}),
            Some(allow()),
        )];
        let replay = replay(&candidate(250), &calls);
        assert_eq!(replay.flips[0].candidate.decision, Kind::InvalidArgs);
        assert_eq!(
            replay.summary.flips,
            BTreeMap::from([("allow -> invalid_args".to_owned(), 1)])
        );
    }

    #[test]
    fn calls_that_cannot_be_replayed_are_counted_by_reason() {
        let mut limit = call("l1", "phrony.limit", json!({}), Some(approval("approved")));
        limit.tool = "phrony.limit".into();
        let calls = [
            call("u1", "issue_refund", refund(100), None),
            call("g1", "send_gift", refund(100), Some(allow())),
            limit,
        ];
        let replay = replay(&candidate(250), &calls);
        assert_eq!(replay.summary.replayed, 0);
        assert_eq!(
            replay.summary.skipped,
            BTreeMap::from([
                ("not_decided", 1),
                ("runtime_escalation", 1),
                ("tool_not_in_candidate", 1)
            ])
        );
    }
}
