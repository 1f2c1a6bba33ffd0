//! The durable approval timer: expiries live in the store, so a restart loses none. The task
//! sleeps until the earliest expiry (or the poll interval), applies every due approval's
//! timeout default, and wakes the sessions concerned. A storage outage only postpones a timeout:
//! a failed read or expiry is logged and retried at the next round (the poll interval at most),
//! never in a busy loop.

use std::sync::Weak;

use tokio_util::sync::CancellationToken;

use crate::state::Inner;

pub(crate) async fn run(inner: Weak<Inner>, stop: CancellationToken) {
    loop {
        let Some(engine) = inner.upgrade() else {
            return;
        };
        let now = engine.clock.now();
        // A due approval the database could not expire: wait the poll interval, not for its
        // (past) expiry, before the next try.
        let mut postponed = false;
        match engine.store.due_approvals(now, 100).await {
            Ok(due) => {
                for approval in due {
                    match engine.store.expire_approval(approval.id, now).await {
                        Ok(outcome) => {
                            tracing::info!(
                                approval_id = %approval.id,
                                session_id = %approval.session_id,
                                status = %outcome.approval.status,
                                "approval timed out"
                            );
                        }
                        Err(e) if e.kind == crate::error::ErrorKind::Unavailable => {
                            // Still due: the next round applies it once the database takes
                            // writes again.
                            postponed = true;
                            tracing::warn!(
                                approval_id = %approval.id,
                                error = %e,
                                "approval timeout postponed: database unavailable"
                            );
                        }
                        Err(e) => {
                            // Decided meanwhile (a vote won the race): nothing to do.
                            tracing::debug!(approval_id = %approval.id, error = %e, "approval not expired");
                        }
                    }
                    engine.wake_approvals(&approval.session_id);
                }
            }
            Err(e) => tracing::warn!(error = %e, "could not read due approvals"),
        }
        let next = match engine.store.next_approval_expiry().await {
            Ok(next) => next,
            Err(e) => {
                tracing::warn!(error = %e, "could not read the next approval expiry");
                None
            }
        };
        let clock = std::sync::Arc::clone(&engine.clock);
        let poll = engine.config.poll_interval;
        let kick = std::sync::Arc::clone(&engine.timer_kick);
        let kicked = kick.notified();
        tokio::pin!(kicked);
        // Do not keep the engine alive while sleeping.
        drop(engine);
        let until_expiry = async {
            match next {
                Some(at) if !postponed => clock.sleep_until(at).await,
                _ => std::future::pending().await,
            }
        };
        tokio::select! {
            () = stop.cancelled() => return,
            () = &mut kicked => {}
            () = until_expiry => {}
            () = tokio::time::sleep(poll) => {}
        }
    }
}
