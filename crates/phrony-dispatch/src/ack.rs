//! Result acknowledgement, sent only after the caller recorded the result.

use std::fmt;
use std::sync::{Arc, Weak};

use crate::state::Inner;

/// Sends `WorkResultAck` for one call once the caller has durably recorded its result.
///
/// The router never acknowledges a result on its own: a worker keeps an unacknowledged call
/// in its `in_flight` list and offers it again when it reconnects, where the
/// [`crate::CompletedCalls`] lookup acknowledges it. Dropping the handle without calling
/// [`AckHandle::ack`] therefore loses nothing.
#[must_use = "call ack() after recording the result, or the worker keeps the call in flight"]
pub struct AckHandle {
    target: Option<Target>,
}

struct Target {
    inner: Weak<Inner>,
    call_id: String,
    worker_id: String,
    /// Keeps the router's "result handed out, ack pending" marker alive; duplicates of the
    /// result arriving meanwhile are ignored instead of reported as late.
    live: Option<Arc<()>>,
}

impl AckHandle {
    /// A handle with nothing to acknowledge (a nack produced the outcome).
    pub(crate) fn none() -> Self {
        Self { target: None }
    }

    pub(crate) fn new(
        inner: Weak<Inner>,
        call_id: String,
        worker_id: String,
        live: Option<Arc<()>>,
    ) -> Self {
        Self {
            target: Some(Target {
                inner,
                call_id,
                worker_id,
                live,
            }),
        }
    }

    /// Whether a `WorkResultAck` is owed (false for outcomes that came from a nack).
    #[must_use]
    pub fn is_required(&self) -> bool {
        self.target.is_some()
    }

    /// The acknowledged call, when an ack is owed.
    #[must_use]
    pub fn call_id(&self) -> Option<&str> {
        self.target.as_ref().map(|t| t.call_id.as_str())
    }

    pub(crate) fn worker_id(&self) -> Option<&str> {
        self.target.as_ref().map(|t| t.worker_id.as_str())
    }

    /// Sends the ack to the worker's current connection (a reconnected worker gets it on its
    /// new stream). Returns whether a message was queued for a connected worker.
    pub fn ack(self) -> bool {
        let Some(target) = self.target else {
            return false;
        };
        let Some(inner) = target.inner.upgrade() else {
            return false;
        };
        inner.send_result_ack(&target.call_id, &target.worker_id, target.live.as_ref())
    }
}

impl fmt::Debug for AckHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.target {
            Some(t) => f
                .debug_struct("AckHandle")
                .field("call_id", &t.call_id)
                .field("worker_id", &t.worker_id)
                .finish(),
            None => f.write_str("AckHandle(none)"),
        }
    }
}
