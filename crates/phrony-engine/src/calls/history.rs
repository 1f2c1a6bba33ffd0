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
//! - Arguments an approver edits are checked with the facts of the edited call (at the vote and
//!   again before dispatch), and the call's reservation moves to them
//!   ([`LedgerStore::replace_history`]) before it goes on.

use phrony_ledger::{HistoryCounts, HistoryKey, HistoryRead, HistoryReservation, ToolInvocation};
use phrony_manifest::ToolBinding;
use phrony_policy::{Aggregate, HistoryFact, HistoryFacts, HistoryScope, PolicySet, ToolCtx};
use serde_json::Value;

use crate::driver::{CallStop, Ctx};
use crate::error::StoreError;
use crate::store::LedgerStore;

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

/// Who asks: the session and agent whose earlier calls the queries' scopes name, and when.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Asker<'a> {
    pub(crate) session_id: &'a str,
    pub(crate) agent: phrony_policy::AgentCtx<'a>,
    pub(crate) now: chrono::DateTime<chrono::Utc>,
}

/// Reads the facts a decision of `call_id` (tool `tool`, arguments `args`) needs, and what it
/// would reserve; `None` when no history query concerns its tool.
pub(crate) async fn read_history(
    store: &LedgerStore,
    set: &PolicySet,
    asker: Asker<'_>,
    call_id: &str,
    tool: ToolCtx<'_>,
    args: &Value,
) -> Result<Option<Prepared>, StoreError> {
    if !set.has_history() {
        return Ok(None);
    }
    let needs = set.reads_history_for(tool.r#ref);
    let agent_key = format!("{}/{}", asker.agent.namespace, asker.agent.name);
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
            HistoryScope::Session => asker.session_id.to_owned(),
            HistoryScope::Agent => agent_key.clone(),
            HistoryScope::Everyone => "*".to_owned(),
        };
        let since = q.within_secs().map(|secs| {
            asker.now - chrono::Duration::seconds(i64::try_from(secs).unwrap_or(i64::MAX / 1000))
        });
        reads.push(HistoryRead {
            key: HistoryKey {
                query_key: q.key().to_owned(),
                scope_key,
                group_key,
            },
            since,
            max: q.aggregate() == Aggregate::Max,
            last: q.aggregate() == Aggregate::Last,
        });
        indices.push(index);
    }
    if reads.is_empty() {
        return Ok(None);
    }
    let counts = store.history_facts(call_id, &reads).await?;
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
                window_secs: q.within_secs(),
                key: read.key,
            });
        }
    }
    Ok(Some(prepared))
}

impl Ctx {
    /// Reads the facts a decision of `call` with `args` needs; `None` when no history query
    /// concerns its tool.
    pub(super) async fn history_for(
        &self,
        call: &ToolInvocation,
        binding: &ToolBinding,
        wire: &str,
        args: &Value,
    ) -> Result<Option<Prepared>, CallStop> {
        let asker = Asker {
            session_id: &self.session.id,
            agent: self.agent.agent_ctx(),
            now: self.now(),
        };
        Ok(read_history(
            self.store(),
            &self.setup.policies,
            asker,
            &call.call_id,
            binding.tool_ctx(wire),
            args,
        )
        .await?)
    }
}
