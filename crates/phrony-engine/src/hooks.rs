//! [`RouterHooks`]: what the dispatch router needs from the store — late results recorded
//! before they are acknowledged, the lookup of calls already recorded for reconnecting
//! workers, and the descriptor pins of published agent versions a registration is checked
//! against (its refusals recorded in the `workers` stream, within the bound of
//! [`refusals`](crate::refusals)). Install them when building the router:
//!
//! ```no_run
//! # fn demo(store: std::sync::Arc<phrony_engine::LedgerStore>) -> Result<(), phrony_dispatch::ConfigError> {
//! let hooks = std::sync::Arc::new(phrony_engine::RouterHooks::new(store));
//! let router = phrony_dispatch::Router::builder(phrony_dispatch::RouterConfig::default())
//!     .observer(hooks.clone())
//!     .completed_calls(hooks.clone())
//!     .descriptor_pins(hooks)
//!     .build()?;
//! # let _ = router; Ok(()) }
//! ```

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use async_trait::async_trait;
use phrony_dispatch::{
    CompletedCalls, DescriptorPins, DescriptorRefusal, HookError, LateOutcome, LateResult,
    RouterEvent, RouterObserver,
};
use phrony_ledger::{ToolOutcome, ToolResult, WorkerDescriptorRefused};

use crate::refusals::{Admission, RefusalKey, RefusalLimiter};
use crate::store::LedgerStore;

/// Router hooks backed by a [`LedgerStore`].
#[derive(Debug, Clone)]
pub struct RouterHooks {
    store: Arc<LedgerStore>,
    refusals: Arc<Mutex<RefusalLimiter>>,
}

impl RouterHooks {
    /// Hooks recording into `store`.
    #[must_use]
    pub fn new(store: Arc<LedgerStore>) -> Self {
        Self {
            store,
            refusals: Arc::default(),
        }
    }

    /// Runs `f` on the refusal limiter (never held across an await; a panic while it was held
    /// cannot leave it inconsistent in a way that matters more than a count).
    fn limiter<T>(&self, f: impl FnOnce(&mut RefusalLimiter) -> T) -> T {
        f(&mut self.refusals.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

pub(crate) fn ledger_outcome(outcome: &phrony_dispatch::ToolOutcome) -> ToolOutcome {
    match outcome {
        phrony_dispatch::ToolOutcome::Success(v) => ToolOutcome::Success(v.clone()),
        phrony_dispatch::ToolOutcome::Error(e) => ToolOutcome::Error {
            code: if e.code.is_empty() {
                "internal".to_owned()
            } else {
                e.code.clone()
            },
            message: e.message.clone(),
        },
    }
}

async fn record_late(store: Arc<LedgerStore>, late: LateResult) {
    let outcome = match &late.outcome {
        LateOutcome::Result(o) => ledger_outcome(o),
        LateOutcome::Nack(e) => ToolOutcome::Error {
            code: if e.code.is_empty() {
                "nack".to_owned()
            } else {
                e.code.clone()
            },
            message: e.message.clone(),
        },
    };
    let result = ToolResult {
        worker_id: Some(late.worker_id.clone()),
        outcome,
        usage: None,
    };
    match store.record_tool_result(&late.call_id, result).await {
        Ok(_) => {
            late.ack.ack();
        }
        Err(e) if e.kind == crate::ErrorKind::NotFound => {
            // Not a call of ours (e.g. recorded by a database that was reset): nothing to
            // keep, so let the worker forget it.
            tracing::warn!(call_id = %late.call_id, "late result for an unknown call; acknowledged");
            late.ack.ack();
        }
        Err(e) => {
            // Not acknowledged: the worker offers it again when it reconnects.
            tracing::warn!(call_id = %late.call_id, error = %e, "could not record a late result");
        }
    }
}

impl RouterObserver for RouterHooks {
    fn on_event(&self, event: RouterEvent) {
        match event {
            RouterEvent::LateResult(late) => {
                let store = Arc::clone(&self.store);
                if let Ok(handle) = tokio::runtime::Handle::try_current() {
                    handle.spawn(record_late(store, late));
                }
            }
            RouterEvent::WorkerRemoved {
                worker_id,
                reason,
                indeterminate,
            } if !indeterminate.is_empty() => {
                tracing::info!(%worker_id, reason = reason.as_str(), calls = indeterminate.len(), "worker lost with calls in flight");
            }
            _ => {}
        }
    }
}

#[async_trait]
impl CompletedCalls for RouterHooks {
    async fn completed(&self, call_ids: &[String]) -> Result<HashSet<String>, HookError> {
        Ok(self.store.completed_calls(call_ids).await?)
    }
}

#[async_trait]
impl DescriptorPins for RouterHooks {
    async fn expected(&self, tool: &str, version: &str) -> Result<Vec<String>, HookError> {
        Ok(self.store.ledger().descriptor_pins(tool, version).await?)
    }

    async fn refused(&self, refusal: &DescriptorRefusal) -> Result<(), HookError> {
        let key = RefusalKey {
            credential: refusal.credential.clone(),
            tool: refusal.tool.clone(),
            version: refusal.version.clone(),
            received: refusal.received.clone(),
        };
        let admitted = self.limiter(|l| l.admit(&key, Instant::now()));
        let Admission::Record {
            repeated,
            unrecorded,
        } = admitted
        else {
            tracing::warn!(
                worker_id = %refusal.worker_id,
                tool = %refusal.tool,
                version = %refusal.version,
                received = %refusal.received,
                "worker registration refused (descriptor pin); event folded into a later one"
            );
            return Ok(());
        };
        let written = self
            .store
            .ledger()
            .record_descriptor_refusal(WorkerDescriptorRefused {
                worker_id: refusal.worker_id.clone(),
                workload_identity: refusal.workload_identity.clone(),
                image_digest: refusal.image_digest.clone(),
                verified_credential: refusal.credential.clone(),
                tool: refusal.tool.clone(),
                version: refusal.version.clone(),
                received_hash: refusal.received.clone(),
                expected_pins: refusal.expected.clone(),
                repeated,
                unrecorded_refusals: unrecorded,
            })
            .await;
        if written.is_err() {
            self.limiter(|l| l.not_written(&key, admitted));
        }
        written?;
        Ok(())
    }
}
