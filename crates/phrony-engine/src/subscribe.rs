//! [`Subscription`]: a session's events, from the store, then live.

use std::sync::Arc;

use phrony_ledger::{Event, event_types as types};
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinHandle;

use crate::state::{Changes, Inner, TextDelta};

pub use crate::state::SessionUpdate;

/// Follows one session. Ends (returns `None`) after the session's terminal event.
#[derive(Debug)]
pub struct Subscription {
    rx: mpsc::Receiver<SessionUpdate>,
    task: JoinHandle<()>,
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn is_terminal_event(event: &Event) -> bool {
    matches!(
        event.event_type.as_str(),
        types::SESSION_COMPLETED | types::SESSION_FAILED | types::SESSION_CANCELLED
    )
}

impl Subscription {
    /// Follows `session_id` from `after_seq`. When the session is live, its streamed text is
    /// followed from this call on (not from when the task first runs).
    pub(crate) fn start(inner: Arc<Inner>, session_id: String, after_seq: u64) -> Self {
        let (tx, rx) = mpsc::channel(inner.config.subscription_buffer.max(1));
        let live = inner
            .live(&session_id)
            .map(|live| (live.changed.subscribe(), live.subscribe_deltas()));
        let task = tokio::spawn(feed(inner, session_id, after_seq, tx, live));
        Self { rx, task }
    }

    /// The next update; `None` once the session has ended and everything was delivered (or the
    /// store failed).
    pub async fn recv(&mut self) -> Option<SessionUpdate> {
        self.rx.recv().await
    }
}

/// Events read per page.
const PAGE: u32 = 500;

/// Reads the store from `after_seq` whenever the session changes (or every poll interval), and
/// forwards text deltas in between. The bounded channel makes a slow subscriber slow down this
/// task, which then simply reads further from the store: nothing is lost. A change this process
/// committed is taken from the live session's held events ([`Live::recent_after`]) when they
/// continue the subscription's position (the store held exactly those at their commit); the
/// store is read otherwise, on every poll, and whenever the session signals news only the store
/// has.
///
/// [`Live::recent_after`]: crate::state::Live::recent_after
async fn feed(
    inner: Arc<Inner>,
    session_id: String,
    mut last: u64,
    tx: mpsc::Sender<SessionUpdate>,
    live: Option<(watch::Receiver<Changes>, broadcast::Receiver<TextDelta>)>,
) {
    let (mut changed, mut deltas) = live.unzip();
    // The first read is the store's.
    let mut from_store = true;
    let mut seen_store = None;
    loop {
        if changed.is_none()
            && let Some(live) = inner.live(&session_id)
        {
            changed = Some(live.changed.subscribe());
            deltas = Some(live.subscribe_deltas());
            from_store = true;
        }
        // What the store may hold that the held events lack, as of now.
        let store_news = changed.as_mut().map(|rx| rx.borrow_and_update().store);
        if store_news != seen_store {
            from_store = true;
            seen_store = store_news;
        }
        let held = if from_store {
            None
        } else {
            inner
                .live(&session_id)
                .map(|live| live.recent_after(last, PAGE as usize))
        };
        let page = match held {
            // Nothing new this process committed: nothing to read.
            Some(held) if held.events.is_empty() && held.head <= last => Vec::new(),
            Some(held) if !held.events.is_empty() => {
                // More committed than held: the store has the rest.
                from_store = held.events.last().is_some_and(|e| e.seq < held.head);
                held.events
            }
            _ => {
                from_store = false;
                match inner.store.events_after(&session_id, last, PAGE).await {
                    Ok(page) => page,
                    Err(e) => {
                        tracing::warn!(%session_id, error = %e, "subscription could not read the session's events");
                        return;
                    }
                }
            }
        };
        let full = page.len() == PAGE as usize || from_store;
        for event in page {
            last = event.seq;
            let terminal = is_terminal_event(&event);
            if tx.send(SessionUpdate::Event(event)).await.is_err() {
                return;
            }
            if terminal {
                return;
            }
        }
        if full {
            continue;
        }
        // Nothing more in the store: wait for a change, forwarding deltas meanwhile.
        let poll = tokio::time::sleep(inner.config.poll_interval);
        tokio::pin!(poll);
        // Not live (parked, or not resumed yet): a session becoming live wakes the read.
        let mut registered = inner.registered.subscribe();
        loop {
            // In this order when several are ready: a commit is signalled before the next
            // completion streams, so taking the change first delivers the committed events
            // (a tool result) before the text streamed after them.
            let wake = tokio::select! {
                biased;
                ok = async {
                    match changed.as_mut() {
                        Some(rx) => rx.changed().await.is_ok(),
                        None => std::future::pending().await,
                    }
                } => if ok { Wake::Changed } else { Wake::DriverGone },
                _ = registered.changed(), if changed.is_none() => Wake::Changed,
                () = &mut poll => Wake::Poll,
                delta = async {
                    match deltas.as_mut() {
                        Some(rx) => rx.recv().await,
                        None => std::future::pending().await,
                    }
                } => Wake::Delta(Box::new(delta)),
            };
            match wake {
                Wake::Changed => break,
                Wake::Poll => {
                    from_store = true;
                    break;
                }
                Wake::DriverGone => {
                    changed = None;
                    deltas = None;
                    from_store = true;
                    break;
                }
                Wake::Delta(delta) => match *delta {
                    Ok(delta) => {
                        if tx.send(delta.into()).await.is_err() {
                            return;
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                    Err(broadcast::error::RecvError::Closed) => deltas = None,
                },
            }
        }
    }
}

enum Wake {
    Poll,
    Changed,
    DriverGone,
    Delta(Box<Result<TextDelta, broadcast::error::RecvError>>),
}
