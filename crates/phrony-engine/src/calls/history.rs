//! History-aware decisions (issue #18): the facts a call's policies ask about earlier calls are
//! read from the ledger's indexed state before the policies run, and what the call contributes
//! is reserved once they let it go on (see `phrony_ledger::Ledger::reserve_history`).
//!
//! - Read: one [`LedgerStore::history_facts`] round trip per decision, for the queries of the
//!   policies in scope of the tool (shadow ones included) and those counting this tool's calls.
//! - Reserve: after an `allow` (before dispatch) or a `require_approval` (before the approval
//!   opens), in one transaction, only if every group is still at the version read; otherwise the
//!   call is decided again with fresh facts, at most [`MAX_DECIDE_ATTEMPTS`] times, then denied
//!   (fail-closed). A deny reserves nothing.
//! - Commit and release happen in the ledger with the call's outcome event.

use phrony_ledger::{HistoryCounts, HistoryKey, HistoryRead, HistoryReservation, ToolInvocation};
use phrony_manifest::ToolBinding;
use phrony_policy::{HistoryFact, HistoryFacts, HistoryScope};
use serde_json::Value;

use crate::driver::{CallStop, Ctx};

/// How often a call is decided again when a concurrent decision changed its history groups.
pub(crate) const MAX_DECIDE_ATTEMPTS: u32 = 8;

/// The facts of one decision and what the call would reserve.
#[derive(Debug, Default)]
pub(crate) struct Prepared {
    pub(crate) facts: HistoryFacts,
    pub(crate) reservations: Vec<HistoryReservation>,
}

fn fact(c: &HistoryCounts) -> HistoryFact {
    HistoryFact {
        count: c.count,
        sum: c.sum,
        max: c.max,
        committed: c.committed,
        last: c.last,
    }
}

impl Ctx {
    /// Reads the facts a decision of `call` needs; `None` when no history query concerns its
    /// tool.
    pub(super) async fn history_for(
        &self,
        call: &ToolInvocation,
        binding: &ToolBinding,
        wire: &str,
        args: &Value,
    ) -> Result<Option<Prepared>, CallStop> {
        let set = &self.setup.policies;
        if !set.has_history() {
            return Ok(None);
        }
        let tool = binding.tool_ctx(wire);
        let needs = set.reads_history_for(tool.r#ref);
        let agent = self.agent.agent_ctx();
        let agent_key = format!("{}/{}", agent.namespace, agent.name);
        let now = self.now();
        let mut reads = Vec::new();
        let mut indices = Vec::new();
        for (index, q) in set.history_queries().iter().enumerate() {
            let counts_this = q.matches_tool(&tool);
            if !needs && !counts_this {
                continue;
            }
            // A call without the `same` arguments has no group: its leaves fail closed.
            let Some(group_key) = q.group_key(args) else {
                continue;
            };
            let scope_key = match q.scope() {
                HistoryScope::Session => self.session.id.clone(),
                HistoryScope::Agent => agent_key.clone(),
                HistoryScope::Everyone => "*".to_owned(),
            };
            let since = q.within_secs().map(|secs| {
                now - chrono::Duration::seconds(i64::try_from(secs).unwrap_or(i64::MAX / 1000))
            });
            reads.push(HistoryRead {
                key: HistoryKey {
                    query_key: q.key().to_owned(),
                    scope_key,
                    group_key,
                },
                since,
            });
            indices.push(index);
        }
        if reads.is_empty() {
            return Ok(None);
        }
        let counts = self.store().history_facts(&call.call_id, &reads).await?;
        let queries = set.history_queries();
        let mut prepared = Prepared {
            facts: HistoryFacts::new(queries.len()),
            reservations: Vec::new(),
        };
        for ((read, index), c) in reads.into_iter().zip(indices).zip(&counts) {
            prepared.facts.set(index, fact(c));
            let Some(q) = queries.get(index) else {
                continue;
            };
            if q.matches_tool(&tool) {
                prepared.reservations.push(HistoryReservation {
                    amount: q.amount(args),
                    result_path: q.result_path(),
                    expected_version: c.version,
                    key: read.key,
                });
            }
        }
        Ok(Some(prepared))
    }
}
