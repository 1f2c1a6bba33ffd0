//! Group commit for the gate's event log: one writer task owns the appends.
//!
//! The engine decides under its state lock, applies the event to its in-memory state and
//! queues it here ([`LogWriter::enqueue`]) before it releases the lock, so the queue holds the
//! events in the order the state saw them. It then waits, outside the lock, for the event's
//! [`Ticket`]: the HTTP answer goes out only once the event is durable.
//!
//! The writer drains everything queued into one [`GateStore::append_batch`] (one transaction,
//! one fsync) and answers every ticket of the batch with its outcome. When a batch fails, every
//! ticket of it gets the error, and the writer refuses every later event staged on the same
//! state (the same *epoch*): those events were decided on a state that counted the failed
//! ones. The engine sees [`LogWriter::failed_epoch`], rebuilds its state from the durable log
//! and moves to the next epoch before it decides anything else (see
//! `Gate::lock_fresh`). So no answer is sent for an event that is not durable, and no event
//! becomes durable after an earlier queued one was refused: the log stays ordered and its seq
//! gap-free.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{mpsc, oneshot};

use crate::error::ApiError;
use crate::store::{AuditEvent, GateStore, NewAuditEvent, StoreError};

/// A batch holds at most this many events; more stay queued for the next one.
pub(crate) const MAX_BATCH_EVENTS: usize = 1024;

/// What the writer has committed since the gate opened.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogStats {
    /// Batches written (each one store write: one transaction, one fsync on SQLite).
    pub commits: u64,
    /// Events those batches carried.
    pub events: u64,
    /// Batches the store failed.
    pub failed_batches: u64,
}

/// What the engine queues.
enum Item {
    Event(Pending),
    /// Answered once everything queued before it is durable or refused.
    Barrier(oneshot::Sender<()>),
}

/// One queued event.
struct Pending {
    /// The epoch of the state it was decided on.
    epoch: u64,
    /// The seq the state applied it at; the store must give it the same one.
    seq: u64,
    event: NewAuditEvent,
    answer: oneshot::Sender<Result<AuditEvent, StoreError>>,
}

#[derive(Debug, Default)]
struct Shared {
    commits: AtomicU64,
    events: AtomicU64,
    failed_batches: AtomicU64,
    /// The latest epoch whose events the writer refuses (a batch of it failed); 0: none.
    failed_epoch: AtomicU64,
}

/// The handle of the writer task. Dropping it ends the task once the queue is empty.
#[derive(Debug)]
pub(crate) struct LogWriter {
    queue: mpsc::UnboundedSender<Item>,
    shared: Arc<Shared>,
}

/// The answer to one queued event: resolves when it is durable or refused.
#[derive(Debug)]
pub(crate) struct Ticket(oneshot::Receiver<Result<AuditEvent, StoreError>>);

impl Ticket {
    /// Waits until the event is durable.
    ///
    /// # Errors
    /// HTTP 500 when its batch failed or it was refused after an earlier failure.
    pub(crate) async fn durable(self) -> Result<AuditEvent, ApiError> {
        match self.0.await {
            Ok(Ok(event)) => Ok(event),
            Ok(Err(e)) => Err(ApiError::internal(e.to_string())),
            Err(_) => Err(ApiError::internal("the gate's log writer stopped")),
        }
    }
}

impl LogWriter {
    /// Starts the writer task on the current tokio runtime.
    pub(crate) fn spawn(store: Arc<dyn GateStore>) -> Self {
        let (queue, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared::default());
        tokio::spawn(run(store, rx, shared.clone()));
        Self { queue, shared }
    }

    /// Queues `event`, decided on the state of `epoch` and applied to it at `seq`. Called
    /// under the state lock, so the queue order is the state's order.
    pub(crate) fn enqueue(&self, epoch: u64, seq: u64, event: NewAuditEvent) -> Ticket {
        let (answer, rx) = oneshot::channel();
        // A closed queue drops `answer`: the ticket then reports the stopped writer.
        let _ = self.queue.send(Item::Event(Pending {
            epoch,
            seq,
            event,
            answer,
        }));
        Ticket(rx)
    }

    /// Refuses every event queued (or still to be queued) for `epoch` and older that is not
    /// being written yet, and waits until the events before this call are durable or refused:
    /// after it, the durable log no longer changes for that epoch and a rebuilt state
    /// matches it.
    pub(crate) async fn close_epoch(&self, epoch: u64) {
        self.shared.failed_epoch.fetch_max(epoch, Ordering::AcqRel);
        let (done, rx) = oneshot::channel();
        if self.queue.send(Item::Barrier(done)).is_ok() {
            let _ = rx.await;
        }
    }

    /// The latest epoch a failed batch belongs to (0: none). A state of this epoch or older
    /// counts events that never became durable and must be rebuilt from the log.
    pub(crate) fn failed_epoch(&self) -> u64 {
        self.shared.failed_epoch.load(Ordering::Acquire)
    }

    /// What has been committed so far.
    pub(crate) fn stats(&self) -> LogStats {
        LogStats {
            commits: self.shared.commits.load(Ordering::Relaxed),
            events: self.shared.events.load(Ordering::Relaxed),
            failed_batches: self.shared.failed_batches.load(Ordering::Relaxed),
        }
    }
}

async fn run(
    store: Arc<dyn GateStore>,
    mut rx: mpsc::UnboundedReceiver<Item>,
    shared: Arc<Shared>,
) {
    let mut items: Vec<Item> = Vec::new();
    while rx.recv_many(&mut items, MAX_BATCH_EVENTS).await > 0 {
        let mut group = Vec::new();
        for item in items.drain(..) {
            match item {
                Item::Event(p) => group.push(p),
                Item::Barrier(done) => {
                    write(&*store, &shared, std::mem::take(&mut group)).await;
                    let _ = done.send(());
                }
            }
        }
        write(&*store, &shared, group).await;
    }
}

/// Writes one group of queued events as one batch and answers their tickets.
async fn write(store: &dyn GateStore, shared: &Shared, group: Vec<Pending>) {
    let failed_epoch = shared.failed_epoch.load(Ordering::Acquire);
    // Events decided on a state that counted a failed batch are refused, in queue order: they
    // come before any event of a rebuilt state.
    let (refused, live): (Vec<Pending>, Vec<Pending>) =
        group.into_iter().partition(|p| p.epoch <= failed_epoch);
    for p in refused {
        let _ = p.answer.send(Err(StoreError(format!(
            "not recorded: an earlier write of the gate's log failed (epoch {failed_epoch}); \
             the gate rebuilds its state from the log"
        ))));
    }
    if live.is_empty() {
        return;
    }
    let events = live.iter().map(|p| p.event.clone()).collect();
    let outcome = store.append_batch(events).await.and_then(|stored| {
        let matches =
            stored.len() == live.len() && stored.iter().zip(&live).all(|(s, p)| s.seq == p.seq);
        if matches {
            Ok(stored)
        } else {
            Err(StoreError(format!(
                "the log gave seqs {:?} to events the gate applied at {:?}",
                stored.iter().map(|e| e.seq).collect::<Vec<_>>(),
                live.iter().map(|p| p.seq).collect::<Vec<_>>()
            )))
        }
    });
    match outcome {
        Ok(stored) => {
            shared.commits.fetch_add(1, Ordering::Relaxed);
            shared
                .events
                .fetch_add(stored.len() as u64, Ordering::Relaxed);
            for (p, event) in live.into_iter().zip(stored) {
                let _ = p.answer.send(Ok(event));
            }
        }
        Err(error) => {
            tracing::error!(%error, events = live.len(), "a batch of the gate's log failed");
            shared.failed_batches.fetch_add(1, Ordering::Relaxed);
            // Marked before anyone is answered: the next decision finds the state stale.
            let epoch = live.iter().map(|p| p.epoch).max().unwrap_or(failed_epoch);
            shared.failed_epoch.fetch_max(epoch, Ordering::AcqRel);
            for p in live {
                let _ = p.answer.send(Err(error.clone()));
            }
        }
    }
}
