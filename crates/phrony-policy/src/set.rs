//! The policy set: compile once, evaluate many.

use std::collections::HashMap;

use crate::condition::Ctx;
use crate::decision::Decision;
use crate::def::PolicyDef;
use crate::error::{CompileErrorKind, CompileErrors, Diags};
use crate::explain::{Explanation, PolicyTrace};
use crate::policy::{Policy, Verdict};
use crate::request::{Request, Trigger};

/// A compiled, immutable set of policies. Cheap to share across threads (`Send + Sync`).
#[derive(Debug, Clone, Default)]
pub struct PolicySet {
    policies: Vec<Policy>,
}

impl PolicySet {
    /// Validates and compiles policy definitions, reporting **every** problem of every policy.
    ///
    /// Policies are evaluated in the order given. (The manifest compiler gives them sorted by
    /// scope, then name, as the reference runtime does.)
    pub fn compile(defs: impl IntoIterator<Item = PolicyDef>) -> Result<Self, CompileErrors> {
        let mut errors = Vec::new();
        let mut policies = Vec::new();
        let mut first_by_name: HashMap<String, usize> = HashMap::new();
        for (index, def) in defs.into_iter().enumerate() {
            let name = def.name.clone();
            let mut diags = Diags::new(&name, index);
            if !name.trim().is_empty()
                && let Some(first_index) = first_by_name.get(&name)
            {
                diags.push(
                    "name",
                    CompileErrorKind::DuplicateName {
                        first_index: *first_index,
                    },
                );
            }
            first_by_name.entry(name.clone()).or_insert(index);
            let compiled = Policy::compile(def, &mut diags);
            if diags.list.is_empty()
                && let Some(policy) = compiled
            {
                policies.push(policy);
            }
            errors.append(&mut diags.list);
        }
        if errors.is_empty() {
            Ok(Self { policies })
        } else {
            Err(CompileErrors::new(errors))
        }
    }

    /// The policies, in evaluation order.
    pub fn policies(&self) -> &[Policy] {
        &self.policies
    }

    /// The policy with this name.
    pub fn get(&self, name: &str) -> Option<&Policy> {
        self.policies.iter().find(|p| p.name() == name)
    }

    /// Number of policies.
    pub fn len(&self) -> usize {
        self.policies.len()
    }

    /// Whether the set has no policies (every call is allowed).
    pub fn is_empty(&self) -> bool {
        self.policies.is_empty()
    }

    /// Decides a call before dispatch. Does not allocate unless it denies on an allow list.
    ///
    /// Precedence: deny (including allow-list violations) > require_approval/escalate > allow.
    /// The first denying policy in order decides. Among matching approval policies the first
    /// wins, unless a later one has a reason where the current has none, or a route where the
    /// current has none.
    pub fn evaluate<'s>(&'s self, req: &Request<'_>) -> Decision<'s> {
        let ctx = Ctx { req, trigger: None };
        let mut candidate: Option<&'s Policy> = None;
        for policy in &self.policies {
            match policy.verdict(&ctx) {
                Verdict::Deny(message) => return Decision::Deny { policy, message },
                Verdict::Approval => {
                    if candidate.is_none_or(|c| better_candidate(c, policy)) {
                        candidate = Some(policy);
                    }
                }
                Verdict::NotApplicable | Verdict::NoMatch | Verdict::Allow => {}
            }
        }
        match candidate {
            Some(policy) => Decision::RequireApproval { policy },
            None => Decision::Allow,
        }
    }

    /// Decides what a dispatch failure escalates to: the first policy in scope **with
    /// conditions** that hold given `trigger`, whose decision is `require_approval` or
    /// `escalate`. `None` means no policy routes this failure to a human (the runtime applies its
    /// default route).
    pub fn evaluate_failure<'s>(
        &'s self,
        req: &Request<'_>,
        trigger: Trigger,
    ) -> Option<&'s Policy> {
        let ctx = Ctx {
            req,
            trigger: Some(trigger),
        };
        self.policies.iter().find(|p| {
            p.action().is_approval()
                && p.has_conditions()
                && p.applies_to(req.tool.r#ref)
                && p.matches(&ctx)
        })
    }

    /// Decides a call like [`evaluate`](Self::evaluate) and reports every policy's verdict.
    /// Every policy is evaluated, even after a denial, so the explanation is complete.
    pub fn explain<'s>(&'s self, req: &Request<'_>) -> Explanation<'s> {
        let ctx = Ctx { req, trigger: None };
        let decision = self.evaluate(req);
        let decider = decision.policy();
        let policies = self
            .policies
            .iter()
            .map(|p| {
                let mut trace = PolicyTrace::new(p, p.verdict(&ctx));
                trace.deciding = decider.is_some_and(|d| std::ptr::eq(d, p));
                trace
            })
            .collect();
        Explanation { decision, policies }
    }
}

/// Which of two matching approval policies decides. The stricter quorum wins, so an agent-wide
/// approval with quorum 1 can never weaken a tool-scoped one with quorum 2 (the reference kept
/// the first match). On equal quorum, §2.3: a later policy replaces the current candidate when
/// it brings a reason or a route the current one lacks.
fn better_candidate(current: &Policy, later: &Policy) -> bool {
    match later
        .approvals_required()
        .cmp(&current.approvals_required())
    {
        std::cmp::Ordering::Greater => true,
        std::cmp::Ordering::Less => false,
        std::cmp::Ordering::Equal => {
            (current.reason().is_none() && later.reason().is_some())
                || (current.route().is_none() && later.route().is_some())
        }
    }
}
