//! The daemon's pruner of history-aware policy state (issue #18): committed entries and time
//! buckets of windowed history queries that no window can see any more are deleted in bounded
//! batches ([`phrony_ledger::Ledger::prune_history_run`]), every [`PRUNE_INTERVAL`]: one run
//! drains what is prunable, at most [`MAX_BATCHES_PER_RUN`] batches. Reserved
//! (in-flight) entries are never pruned; unwindowed ones (all time) never are.

use std::time::Duration;

use phrony_ledger::{HistoryPruned, Ledger};

/// How often the pruner runs.
pub const PRUNE_INTERVAL: Duration = Duration::from_secs(300);
/// The most entries (and buckets) one batch deletes: one short write transaction.
pub const PRUNE_BATCH: u32 = 500;
/// The most batches one run takes, so a large backlog is spread over several runs.
const MAX_BATCHES_PER_RUN: u32 = 200;

/// The running pruner; dropping it ends it (a batch cut off rolls back).
#[derive(Debug)]
pub struct HistoryPruner {
    task: tokio::task::JoinHandle<()>,
}

impl HistoryPruner {
    /// Starts pruning `ledger` every [`PRUNE_INTERVAL`] (the first run at once).
    pub fn start(ledger: Ledger) -> Self {
        Self {
            task: tokio::spawn(run(ledger)),
        }
    }
}

impl Drop for HistoryPruner {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One run: batches until one finds nothing to do (or [`MAX_BATCHES_PER_RUN`]), with the
/// entries of pre-0016 groups (`Ledger::prune_history_run`); the totals.
pub async fn prune_once(ledger: &Ledger) -> Result<HistoryPruned, phrony_ledger::LedgerError> {
    ledger
        .prune_history_run(PRUNE_BATCH, MAX_BATCHES_PER_RUN)
        .await
}

async fn run(ledger: Ledger) {
    let mut tick = tokio::time::interval(PRUNE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match prune_once(&ledger).await {
            Ok(pruned) if pruned.is_empty() => {}
            Ok(pruned) => {
                tracing::info!(
                    entries = pruned.entries,
                    buckets = pruned.buckets,
                    legacy_groups = pruned.legacy_groups,
                    legacy_windows = pruned.legacy_windows,
                    "pruned history state no window can see"
                );
            }
            Err(e) => tracing::warn!(error = %e, "could not prune history state"),
        }
    }
}
