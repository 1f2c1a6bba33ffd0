//! One registered Work stream: the inbound side ([`WorkerConnection`]) and the outbound side
//! ([`Outbox`]).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::mpsc;

use crate::error::DispatchError;
use crate::state::{Answer, CloseSlot, Inner};
use crate::types::{FromWorker, ToWorker, ToolOutcome};

/// The inbound side of a registered Work stream. Feed every later worker message to
/// [`WorkerConnection::handle`]; drop the connection (or call
/// [`WorkerConnection::disconnect`]) when the stream ends. An error from `handle` ends the
/// stream with [`DispatchError::status`].
///
/// Each connection carries a generation: once the same worker id registers again, this one
/// is stale, its messages are refused with [`DispatchError::Superseded`] and dropping it
/// leaves the new registration alone.
#[derive(Debug)]
pub struct WorkerConnection {
    inner: Arc<Inner>,
    worker_id: String,
    conn: u64,
    close: Arc<CloseSlot>,
}

impl WorkerConnection {
    pub(crate) fn new(
        inner: Arc<Inner>,
        worker_id: String,
        conn: u64,
        close: Arc<CloseSlot>,
    ) -> Self {
        Self {
            inner,
            worker_id,
            conn,
            close,
        }
    }

    /// The registered worker id.
    #[must_use]
    pub fn worker_id(&self) -> &str {
        &self.worker_id
    }

    /// The connection's generation (unique per registration).
    #[must_use]
    pub fn generation(&self) -> u64 {
        self.conn
    }

    /// Applies one worker message. Heartbeats (and any other message) renew the lease.
    /// Results and nacks for unknown, abandoned or foreign calls never fail the stream:
    /// they are acknowledged and reported, or ignored, through the observer.
    pub fn handle(&self, msg: FromWorker) -> Result<(), DispatchError> {
        match msg {
            FromWorker::Heartbeat => self
                .inner
                .heartbeat(&self.worker_id, self.conn, &self.close),
            FromWorker::Result {
                call_id,
                payload,
                error,
            } => {
                if call_id.is_empty() {
                    return Err(DispatchError::CallIdRequired { message: "result" });
                }
                let outcome = ToolOutcome::from_worker(&self.worker_id, &payload, error);
                self.inner.answer(
                    &self.worker_id,
                    self.conn,
                    &self.close,
                    call_id,
                    Answer::Result(outcome),
                )
            }
            FromWorker::Nack {
                call_id,
                code,
                message,
            } => {
                if call_id.is_empty() {
                    return Err(DispatchError::CallIdRequired { message: "nack" });
                }
                let error = crate::types::ToolError { code, message };
                self.inner.answer(
                    &self.worker_id,
                    self.conn,
                    &self.close,
                    call_id,
                    Answer::Nack(error),
                )
            }
        }
    }

    /// Ends the connection (the same as dropping it): if it is still the worker's current
    /// registration the worker is removed and its dispatched calls become indeterminate.
    pub fn disconnect(self) {}
}

impl Drop for WorkerConnection {
    fn drop(&mut self) {
        self.inner.disconnect(&self.worker_id, self.conn);
    }
}

/// The outbound side of a registered Work stream: the messages to write to the worker, in
/// order, starting with `Registered`. When the router drops the worker (lease expired,
/// replaced, unresponsive) the outbox yields one `Err` with the status to end the stream
/// with, then ends; when the stream ended normally it just ends.
#[derive(Debug)]
pub struct Outbox {
    rx: mpsc::Receiver<ToWorker>,
    close: Arc<CloseSlot>,
    done: bool,
}

impl Outbox {
    pub(crate) fn new(rx: mpsc::Receiver<ToWorker>, close: Arc<CloseSlot>) -> Self {
        Self {
            rx,
            close,
            done: false,
        }
    }

    /// The next message, the final error, or `None` at the end.
    pub async fn recv(&mut self) -> Option<Result<ToWorker, DispatchError>> {
        std::future::poll_fn(|cx| self.poll_item(cx)).await
    }

    /// The next message if one is ready (for tests and draining).
    pub fn try_recv(&mut self) -> Option<ToWorker> {
        self.rx.try_recv().ok()
    }

    fn poll_item(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<ToWorker, DispatchError>>> {
        if self.done {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(msg)) => Poll::Ready(Some(Ok(msg))),
            Poll::Ready(None) => {
                self.done = true;
                Poll::Ready(self.close.get().cloned().map(Err))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl futures::Stream for Outbox {
    type Item = Result<ToWorker, DispatchError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_item(cx)
    }
}
