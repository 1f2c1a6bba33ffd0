//! User messages another replica queued for a conversation this replica drives (issue #20:
//! any replica serves any client).
//!
//! A replica that receives a user message for a session it does not drive queues it in the
//! ledger ([`crate::store::LedgerStore::queue_user_message`], announced on PostgreSQL) instead
//! of refusing it. The driver takes the queue into the session's stream ([`accept_queued`]),
//! numbering each message's turn like a local one, when it starts, when the announcement wakes
//! it, and at its safety-net re-read while it waits for input: one transaction per message
//! records it and takes it off the queue, so it is recorded exactly once even if two of these
//! race, and a driver that lost its lease cannot take it (fenced: it stays for the next one).

use crate::error::StoreError;
use crate::state::{Inner, Live};

/// Records the messages queued for `live`'s session as `message.user` events, in the order
/// they were queued, each starting the next turn; wakes the driver when any was recorded.
/// Returns how many were.
///
/// # Errors
/// Store errors (`Fenced` when this replica lost the session's lease): the messages not yet
/// recorded stay queued.
pub(crate) async fn accept_queued(inner: &Inner, live: &Live) -> Result<usize, StoreError> {
    let queued = inner.store.queued_user_messages(&live.session_id).await?;
    if queued.is_empty() {
        return Ok(0);
    }
    let mut accepted = 0;
    {
        // Held throughout, so local messages and these get distinct, increasing turns.
        let mut input = live.input.lock().await;
        for message in queued {
            let turn = input.next_turn;
            if inner
                .store
                .accept_user_message(&live.session_id, message.id, turn)
                .await?
                .is_some()
            {
                input.next_turn += 1;
                accepted += 1;
            }
        }
    }
    if accepted > 0 {
        tracing::info!(
            session_id = %live.session_id, accepted,
            "user messages queued on another replica recorded"
        );
        live.inbox.notify_one();
        live.notify_changed();
    }
    Ok(accepted)
}
