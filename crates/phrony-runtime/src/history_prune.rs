//! The daemon's pruner of history-aware policy state (issue #18): committed entries and time
//! buckets of windowed history queries that no window can see any more are deleted in bounded
//! batches ([`phrony_ledger::Ledger::prune_history`]), every [`PRUNE_INTERVAL`]. Reserved
//! (in-flight) entries are never pruned; unwindowed ones (all time) never are.

use std::time::Duration;

use phrony_ledger::Ledger;

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

/// One run: batches until one comes back short (or [`MAX_BATCHES_PER_RUN`]); the totals.
pub async fn prune_once(ledger: &Ledger) -> Result<(u64, u64), phrony_ledger::LedgerError> {
    let (mut entries, mut buckets) = (0, 0);
    for _ in 0..MAX_BATCHES_PER_RUN {
        let batch = ledger.prune_history(PRUNE_BATCH).await?;
        entries += batch.entries;
        buckets += batch.buckets;
        if batch.entries < u64::from(PRUNE_BATCH) && batch.buckets < u64::from(PRUNE_BATCH) {
            break;
        }
        // Other writers go between two batches.
        tokio::task::yield_now().await;
    }
    Ok((entries, buckets))
}

async fn run(ledger: Ledger) {
    let mut tick = tokio::time::interval(PRUNE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        match prune_once(&ledger).await {
            Ok((0, 0)) => {}
            Ok((entries, buckets)) => {
                tracing::info!(entries, buckets, "pruned history state no window can see");
            }
            Err(e) => tracing::warn!(error = %e, "could not prune history state"),
        }
    }
}
