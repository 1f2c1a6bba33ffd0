//! The policy set: compile once, evaluate many.
//!
//! # Scope index
//!
//! A policy's scope is either the whole agent or one tool (`tool:<ref>`), so a call can only be
//! affected by the agent-wide policies and those of its own tool. At compile time the set records
//! the positions of the agent-wide policies and, per tool ref, the positions of that tool's
//! policies (both ascending). [`PolicySet::evaluate`] and [`PolicySet::evaluate_failure`] walk
//! the merge of the two lists, which is exactly the in-scope subsequence of the set in the order
//! given, so every order-dependent rule (first deny, approval candidate tie-breaks, first
//! failure route) is unchanged while out-of-scope policies cost nothing: a call to one tool of a
//! set of 1,000 policies spread over 50 tools visits only the agent-wide ones and its tool's.
//! [`PolicySet::explain`] still reports every policy.
//!
//! # Within the scope: slots, equality keys, gates, regex filters
//!
//! A call still in scope of a few hundred policies pays for each policy's conditions, so the set
//! also prepares, at compile time, what lets a decision share work between policies:
//!
//! - **Path slots** (`slots.rs`). Every distinct plain path prefix the conditions read
//!   (`amount`, `customer.tier`, the `items` of `items[any].sku`, `phrony.principal.role`…) gets
//!   a slot number; a decision looks each prefix up once, on first use, into a slot array on the
//!   stack (for up to 128 distinct prefixes; a set with more puts it on the heap, the one case
//!   where an allowing decision allocates), and every later condition on it walks only the steps
//!   after the prefix.
//! - **Equality keys** (`gate.rs`). The values of every `eq`, `neq`, `in` and `not_in` on a whole
//!   slot are reduced to canonical keys of the language's equality (one number key for `250`,
//!   `"250.0"`; one folded text for `" EUR "`, `"eur"`) in a per-slot table; a decision keys the
//!   slot's value once, and each such leaf is then an integer comparison.
//! - **Gates** (`gate.rs`). A policy whose conditions cannot hold without an `eq`/`in` on a whole
//!   slot (the root leaf, or one under `all` nodes only) is skipped, before its conditions are
//!   touched, when the slot's key is none of that leaf's values.
//! - **Regex filters** (`slots.rs`). All `matches` patterns on one whole slot form one `RegexSet`;
//!   a decision searches the slot's value with it once, and when no pattern matches (the usual
//!   case) every `matches` leaf on the slot is false without running its own regex.
//!
//! None of them changes which policies are visited in which order, only how fast each answers,
//! so every order-dependent rule is unchanged. The property test
//! `indexed_evaluation_equals_the_linear_scan` (src/tests.rs) checks the index, slots, keys,
//! gates and filters together against the linear scan over every policy without any of them, on
//! generated sets whose conditions mix all of these (numbers as text, null, case and whitespace
//! variants, nested and `[any]` paths, `neq`/`not_in`, regexes on and past a slot).
//!
//! # Shadow policies
//!
//! A policy with `mode: shadow` never decides a call. At compile time the set keeps its enforced
//! policies as itself, so [`PolicySet::evaluate`], [`PolicySet::evaluate_failure`] and
//! [`PolicySet::explain`] see exactly the set without the shadow policies, and, only when there
//! is a shadow policy, a second *what-if* set of every policy, enforced and shadow, in the order
//! given. [`PolicySet::shadow`] decides the call on the what-if set and reports the outcome when a
//! shadow policy would have changed the enforced decision. A set without shadow policies has no
//! what-if set: `shadow` returns at once.
//!
//! On the benchmark's 1,000 generated policies (270 in scope of the call) these bring a decision
//! from 14.1 µs to about 4.2 µs (`benches/decisions.rs`).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use crate::condition::Ctx;
use crate::decision::{Decision, DecisionKind};
use crate::def::PolicyDef;
use crate::error::{CompileErrorKind, CompileErrors, Diags};
use crate::explain::{Explanation, PolicyTrace};
use crate::gate::Gates;
use crate::policy::{Policy, Verdict};
use crate::request::{Request, Trigger};
use crate::slots::{PathTable, RegexFilters, with_slots};

/// A compiled, immutable set of policies. Cheap to share across threads (`Send + Sync`).
#[derive(Debug, Clone, Default)]
pub struct PolicySet {
    policies: Vec<Policy>,
    index: ScopeIndex,
    /// The distinct path prefixes the conditions read, by slot number.
    paths: PathTable,
    /// The equality gates of the policies, by position.
    gates: Gates,
    /// The `matches` filters, by slot.
    filters: RegexFilters,
    /// Every policy, enforced and shadow, as one enforcing set; only when there is a shadow
    /// policy (see the module docs).
    what_if: Option<Box<PolicySet>>,
    /// The distinct history queries of the conditions (of every policy, shadow ones included,
    /// so the enforced and what-if sets index facts alike).
    history: Vec<crate::HistoryQuery>,
}

/// What a set's shadow policies would have changed about one call (see [`PolicySet::shadow`]).
#[derive(Debug, Clone)]
pub struct ShadowOutcome<'s> {
    /// The decision kind actually taken (by the enforced policies).
    pub enforced: DecisionKind,
    /// The decision the set would have taken with its shadow policies enforced.
    pub shadow: Decision<'s>,
    /// The shadow policy that would have decided the call (the policy of `shadow`).
    pub policy: &'s Policy,
}

/// Positions (into `PolicySet::policies`, ascending) of the policies each tool can see.
#[derive(Debug, Clone, Default)]
struct ScopeIndex {
    /// Agent-wide policies (scope empty or `agent`).
    agent: Vec<usize>,
    /// `tool:<ref>` policies, by ref.
    tools: HashMap<Box<str>, Vec<usize>, BuildHasherDefault<RefHasher>>,
}

/// A word-at-a-time multiplicative hash for the tool-ref lookup on every decision, cheaper than
/// the default SipHash on short refs such as `payments.issue-refund` (the lookup is what the index
/// adds to a small set). Flooding resistance is not needed: the keys are the set's own tool refs,
/// fixed at compile time; a request's ref only probes, and a collision costs a key comparison.
#[derive(Debug, Clone, Copy, Default)]
struct RefHasher(u64);

impl RefHasher {
    const K: u64 = 0x517c_c1b7_2722_0a95;

    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(Self::K);
    }
}

impl Hasher for RefHasher {
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0; 8];
            word.copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut word = [0; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, byte: u8) {
        self.add(u64::from(byte));
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl ScopeIndex {
    fn new(policies: &[Policy]) -> Self {
        let mut index = Self::default();
        for (position, policy) in policies.iter().enumerate() {
            match policy.scope_tool() {
                None => index.agent.push(position),
                Some(tool) => index.tools.entry(tool.into()).or_default().push(position),
            }
        }
        index
    }

    /// The positions of the policies whose scope covers `tool_ref`, ascending.
    fn in_scope(&self, tool_ref: &str) -> InScope<'_> {
        InScope {
            agent: &self.agent,
            tool: self.tools.get(tool_ref).map_or(&[], Vec::as_slice),
        }
    }
}

/// The merge of two ascending position lists.
struct InScope<'i> {
    agent: &'i [usize],
    tool: &'i [usize],
}

impl Iterator for InScope<'_> {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        match (self.agent.split_first(), self.tool.split_first()) {
            (Some((&a, rest)), Some((&t, _))) if a < t => {
                self.agent = rest;
                Some(a)
            }
            (_, Some((&t, rest))) => {
                self.tool = rest;
                Some(t)
            }
            (Some((&a, rest)), None) => {
                self.agent = rest;
                Some(a)
            }
            (None, None) => None,
        }
    }
}

impl PolicySet {
    /// Validates and compiles policy definitions, reporting **every** problem of every policy.
    ///
    /// Policies are evaluated in the order given. (The manifest compiler gives them sorted by
    /// scope, then name, as the reference runtime does.)
    ///
    /// Shadow policies (`mode: shadow`) are validated like the others and then kept apart: the
    /// set decides as if they were absent (see the module docs).
    pub fn compile(defs: impl IntoIterator<Item = PolicyDef>) -> Result<Self, CompileErrors> {
        let defs: Vec<PolicyDef> = defs.into_iter().collect();
        let enforced: Option<Vec<PolicyDef>> = defs.iter().any(|d| d.mode == "shadow").then(|| {
            defs.iter()
                .filter(|d| d.mode != "shadow")
                .cloned()
                .collect()
        });
        let all = Self::compile_enforcing(defs, Vec::new())?;
        match enforced {
            None => Ok(all),
            Some(enforced) => {
                // Seeded with every query, so both sets give a query the same index.
                let table = all.history.clone();
                Ok(Self {
                    what_if: Some(Box::new(all)),
                    ..Self::compile_enforcing(enforced, table)?
                })
            }
        }
    }

    /// Compiles every definition as one enforcing set (shadow policies included).
    fn compile_enforcing(
        defs: Vec<PolicyDef>,
        mut history: Vec<crate::HistoryQuery>,
    ) -> Result<Self, CompileErrors> {
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
            let mut compiled = Policy::compile(def, &mut diags);
            if let Some(policy) = &mut compiled
                && !policy.intern_history(&mut history)
            {
                diags.push(
                    "conditions",
                    CompileErrorKind::BadHistory {
                        reason: format!(
                            "the policy set asks more than {} distinct history queries",
                            crate::MAX_HISTORY_QUERIES
                        ),
                    },
                );
            }
            if diags.list.is_empty()
                && let Some(policy) = compiled
            {
                policies.push(policy);
            }
            errors.append(&mut diags.list);
        }
        if errors.is_empty() {
            let mut paths = PathTable::default();
            for policy in &mut policies {
                policy.intern_paths(&mut paths);
            }
            let index = ScopeIndex::new(&policies);
            let gates = Gates::new(&policies, &paths);
            for policy in &mut policies {
                policy.assign_keys(&gates);
            }
            let mut patterns = Vec::new();
            for policy in &policies {
                policy.slotted_patterns(&mut |slot, pattern| patterns.push((slot, pattern)));
            }
            let filters = RegexFilters::new(paths.len(), patterns);
            Ok(Self {
                policies,
                index,
                paths,
                gates,
                filters,
                what_if: None,
                history,
            })
        } else {
            Err(CompileErrors::new(errors))
        }
    }

    /// The enforced policies, in evaluation order (shadow policies are in
    /// [`shadow_policies`](Self::shadow_policies)).
    pub fn policies(&self) -> &[Policy] {
        &self.policies
    }

    /// The shadow policies (`mode: shadow`), in evaluation order.
    pub fn shadow_policies(&self) -> impl Iterator<Item = &Policy> {
        self.what_if
            .iter()
            .flat_map(|all| all.policies.iter().filter(|p| p.is_shadow()))
    }

    /// The distinct history queries the set's conditions ask, by index: the facts of a
    /// [`Request`] are given in this order ([`crate::HistoryFacts`]). Empty when no policy has
    /// a `history` leaf.
    pub fn history_queries(&self) -> &[crate::HistoryQuery] {
        &self.history
    }

    /// Whether a policy in scope of `tool_ref` (shadow ones included) has a `history` leaf: a
    /// decision of a call of that tool needs facts.
    pub fn reads_history_for(&self, tool_ref: &str) -> bool {
        let set = self.what_if.as_deref().unwrap_or(self);
        set.index
            .in_scope(tool_ref)
            .filter_map(|position| set.policies.get(position))
            .any(Policy::reads_history)
    }

    /// Whether any policy (shadow ones included) has a `history` leaf.
    pub fn has_history(&self) -> bool {
        !self.history.is_empty()
    }

    /// Whether the set has at least one shadow policy.
    pub fn has_shadow(&self) -> bool {
        self.what_if.is_some()
    }

    /// What the set's shadow policies would have changed about a call whose enforced decision
    /// was `enforced` (the kind [`evaluate`](Self::evaluate) returned for `req`): the decision
    /// of the set with its shadow policies enforced, when a shadow policy decides it and it
    /// differs — a deny or an approval instead of an allow, a deny instead of an approval, or
    /// an approval under the shadow policy's terms (quorum, route, timeout) instead of an
    /// enforced policy's. A shadow deny where the enforced policies deny anyway changes nothing
    /// and is not reported. `None` at once for a set without shadow policies.
    pub fn shadow<'s>(
        &'s self,
        req: &Request<'_>,
        enforced: DecisionKind,
    ) -> Option<ShadowOutcome<'s>> {
        let all = self.what_if.as_deref()?;
        let shadow = all.evaluate(req);
        let decider = shadow.policy()?;
        let changes = shadow.kind() != enforced || shadow.kind() == DecisionKind::RequireApproval;
        (decider.is_shadow() && changes).then_some(ShadowOutcome {
            enforced,
            shadow,
            policy: decider,
        })
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

    /// Decides a call before dispatch. Does not allocate unless it denies on an allow list (or
    /// the set's conditions read more than 128 distinct path prefixes, see the module docs).
    ///
    /// Precedence: deny (including allow-list violations) > require_approval/escalate > allow.
    /// The first denying policy in order decides. Among matching approval policies the first
    /// wins, unless a later one has a reason where the current has none, or a route where the
    /// current has none.
    ///
    /// Only the policies whose scope covers the call's tool are visited (see the module docs).
    pub fn evaluate<'s>(&'s self, req: &Request<'_>) -> Decision<'s> {
        with_slots(self.paths.len(), |slots| {
            let ctx = Ctx {
                req,
                trigger: None,
                slots,
                filters: self.filters.as_slice(),
                gates: Some(&self.gates),
            };
            let mut candidate: Option<&'s Policy> = None;
            for policy in self.candidates(&ctx) {
                match policy.verdict_in_scope(&ctx) {
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
        })
    }

    /// Decides what a dispatch failure escalates to: the first policy in scope whose conditions
    /// **read the trigger** ([`Policy::reads_trigger`]) and hold given `trigger`, whose decision
    /// is `require_approval` or `escalate`. `None` means no policy routes this failure to a human
    /// (the runtime applies its default route).
    ///
    /// Unlike the reference runtime, a policy whose conditions never mention the trigger (say
    /// `amount > 250 → require_approval`) is not a trigger policy: it already decided the call
    /// before dispatch, and re-applying it to a failure asked the approvers the same question
    /// again, with the policy's reason instead of the failure's, after they had approved.
    pub fn evaluate_failure<'s>(
        &'s self,
        req: &Request<'_>,
        trigger: Trigger,
    ) -> Option<&'s Policy> {
        with_slots(self.paths.len(), |slots| {
            let ctx = Ctx {
                req,
                trigger: Some(trigger),
                slots,
                filters: self.filters.as_slice(),
                gates: Some(&self.gates),
            };
            self.candidates(&ctx)
                .find(|p| p.action().is_approval() && p.reads_trigger() && p.matches(&ctx))
        })
    }

    /// Whether policy denies **every** call of the request's tool in the request's context,
    /// whatever its arguments: the first policy in scope, in evaluation order, that does so, or
    /// `None`. A runtime can leave such a tool out of what it offers the model (tool visibility);
    /// it must still decide every call with [`evaluate`](Self::evaluate).
    ///
    /// `req.args` is not read. A policy answers only when it decides without the arguments: a
    /// `deny` whose conditions read only context fields (`phrony.agent.*`, `phrony.session.*`,
    /// `phrony.principal.*`, `phrony.time.*`, `phrony.tool.*`) and hold, or has none; or an
    /// `allow` whose allow list checks a context field (`allow_field: phrony.principal.role`)
    /// the context fails. A condition on an argument path, an allow list on the arguments, and
    /// approval policies never hide a tool. When this returns `Some`, `evaluate` denies the
    /// same request with any arguments (deny wins; it may name an earlier deny that matched
    /// those arguments): property `a_hidden_tool_is_denied_whatever_the_args`
    /// (tests/properties.rs).
    pub fn hidden_tool<'s>(&'s self, req: &Request<'_>) -> Option<&'s Policy> {
        let ctx = Ctx::unindexed(req, None);
        self.index
            .in_scope(req.tool.r#ref)
            .filter_map(|position| self.policies.get(position))
            .find(|policy| policy.denies_whatever_the_args(&ctx))
    }

    /// The policies whose scope covers the call's tool and whose gate, if any, admits the call,
    /// in evaluation order: the only ones that can match.
    fn candidates<'s, 'c, 'a>(
        &'s self,
        ctx: &'c Ctx<'c, 'a>,
    ) -> impl Iterator<Item = &'s Policy> + use<'s, 'c, 'a> {
        // Every indexed position is in bounds: the index is built from `policies`, and neither
        // changes after compilation.
        let positions = self.index.in_scope(ctx.req.tool.r#ref);
        positions
            .filter(|position| self.gates.open(*position, ctx.slots, &self.paths, ctx.req))
            .filter_map(|position| self.policies.get(position))
    }

    /// The number of path slots a decision of this set needs.
    #[cfg(test)]
    pub(crate) fn slot_count(&self) -> usize {
        self.paths.len()
    }

    /// The linear scan the scope index replaced: the oracle of the property test
    /// `indexed_evaluation_equals_the_linear_scan`.
    #[cfg(test)]
    pub(crate) fn evaluate_linear<'s>(&'s self, req: &Request<'_>) -> Decision<'s> {
        let ctx = Ctx::unindexed(req, None);
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

    /// The linear form of [`evaluate_failure`](Self::evaluate_failure), for the same test.
    #[cfg(test)]
    pub(crate) fn evaluate_failure_linear<'s>(
        &'s self,
        req: &Request<'_>,
        trigger: Trigger,
    ) -> Option<&'s Policy> {
        let ctx = Ctx::unindexed(req, Some(trigger));
        self.policies.iter().find(|p| {
            p.action().is_approval()
                && p.reads_trigger()
                && p.applies_to(req.tool.r#ref)
                && p.matches(&ctx)
        })
    }

    /// Decides a call like [`evaluate`](Self::evaluate) and reports every policy's verdict.
    /// Every policy is evaluated, even after a denial, so the explanation is complete.
    pub fn explain<'s>(&'s self, req: &Request<'_>) -> Explanation<'s> {
        let decision = self.evaluate(req);
        let decider = decision.policy();
        let policies = with_slots(self.paths.len(), |slots| {
            let ctx = Ctx {
                req,
                trigger: None,
                slots,
                filters: self.filters.as_slice(),
                gates: Some(&self.gates),
            };
            self.policies
                .iter()
                .map(|p| {
                    let mut trace = PolicyTrace::new(p, p.verdict(&ctx));
                    trace.deciding = decider.is_some_and(|d| std::ptr::eq(d, p));
                    trace.cedar = p.cedar_detail(req);
                    trace
                })
                .collect()
        });
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
