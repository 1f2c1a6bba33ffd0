//! Storage outages: a session whose driver stopped on an `Unavailable` store error is
//! *suspended* (never failed) and re-adopted by [`crate::Engine::recover`] — the start-up
//! recovery path — once the database takes writes again.
//!
//! The task sleeps until a session is suspended, then proves the store writable with
//! [`crate::store::LedgerStore::until_writable`] (a real durable write, retried with a capped
//! backoff of 250 ms doubling to 5 s, or sooner when the ledger's writable signal flips back),
//! and calls `recover` (handed in by the engine, so that this module does not import it), which
//! resumes every non-terminal session that is not live.
//! A session that is live again, or ended, leaves the suspended set; the others wait for the
//! next round.

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Weak};

use tokio_util::sync::CancellationToken;

use crate::error::{EngineError, ErrorKind};
use crate::state::Inner;
use crate::store::{FIRST_BACKOFF, MAX_BACKOFF};

/// The resume task. `recover` runs `Engine::recover`'s code on the engine of `inner`, for the
/// given (suspended) sessions only, and returns the sessions it resumed.
pub(crate) async fn run<F, Fut>(inner: Weak<Inner>, stop: CancellationToken, recover: F)
where
    F: Fn(Arc<Inner>, HashSet<String>) -> Fut + Send,
    Fut: Future<Output = Result<Vec<String>, EngineError>> + Send,
{
    let mut backoff = FIRST_BACKOFF;
    loop {
        let Some(engine) = inner.upgrade() else {
            return;
        };
        if engine.suspended_count() == 0 {
            let kick = Arc::clone(&engine.resume_kick);
            let kicked = kick.notified();
            tokio::pin!(kicked);
            kicked.as_mut().enable();
            if engine.suspended_count() > 0 {
                continue;
            }
            let poll = engine.config.poll_interval;
            // Do not keep the engine alive while waiting.
            drop(engine);
            tokio::select! {
                () = stop.cancelled() => return,
                () = &mut kicked => {}
                () = tokio::time::sleep(poll) => {}
            }
            backoff = FIRST_BACKOFF;
            continue;
        }
        let store = Arc::clone(&engine.store);
        drop(engine);
        if !store.until_writable(&stop).await {
            return;
        }
        let Some(engine) = inner.upgrade() else {
            return;
        };
        let only = engine.suspended_ids();
        match recover(Arc::clone(&engine), only).await {
            Ok(resumed) => {
                if !resumed.is_empty() {
                    tracing::info!(
                        sessions = ?resumed,
                        "database takes writes again; suspended sessions resumed"
                    );
                }
                engine.settle_suspended().await;
                backoff = FIRST_BACKOFF;
            }
            Err(e) if e.kind == ErrorKind::Unavailable => {
                tracing::debug!(error = %e, "recovery waits for the database");
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not resume the suspended sessions; retrying");
            }
        }
        let still = engine.suspended_count() > 0;
        drop(engine);
        if still {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
}
