//! Session leases in the engine (issue #20: several runtime replicas on one database; the
//! ledger side is `phrony-ledger`'s `leases.rs`). With [`crate::EngineConfig::session_lease_ttl`]:
//! - a driver acquires its session's lease before it drives ([`acquire`]); another replica
//!   holding it unexpired means the session is driven there, and the driver returns at once;
//! - [`run`] renews every lease this replica holds in one statement every TTL/3 and stops the
//!   drivers of the leases it lost, and every TTL/2 (jittered) takes over the sessions whose
//!   lease expired (a replica killed, paused or cut off): it acquires each (exactly one
//!   replica wins, at a new epoch) and resumes it through the recovery path, whose
//!   side-effect-class rules apply to calls that were in flight (a non-idempotent call goes to
//!   operator review, never a silent re-run);
//! - a driver that stops (parked, ended) releases its lease ([`release`]); a write refused by
//!   the fence ([`is_fenced`]) stops the driver without failing the session: it is driven
//!   elsewhere.

use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::Duration;

use phrony_ledger::{LeaseClaim, ReplicaListener, Wake};
use tokio_util::sync::CancellationToken;

use crate::error::{ErrorKind, StoreError};
use crate::state::Inner;

/// Expired leases one takeover scan acquires at most (the rest at the next scan).
const TAKEOVER_BATCH: u32 = 100;

/// Whether a store error is the ledger's fence: this replica lost the session's lease.
pub(crate) fn is_fenced(error: &StoreError) -> bool {
    error.kind == ErrorKind::Fenced
}

/// Acquires `session_id`'s lease for a driver about to drive it: `Ok(Some(epoch))` when granted
/// (`Some(0)` with leases off), `Ok(None)` when another replica holds it. A lease a takeover
/// acquired for this driver ([`adopt`]) is taken as it is, still held: no second acquisition,
/// whose new epoch would fence the writes this replica recorded under the first meanwhile.
pub(crate) async fn acquire(inner: &Inner, session_id: &str) -> Result<Option<u64>, StoreError> {
    if inner.config.session_lease_ttl.is_none() {
        return Ok(Some(0));
    }
    if let Some(epoch) = inner.take_adopted(session_id, None)
        && inner.store.ledger().holds_session_lease(session_id, epoch)
    {
        return Ok(Some(epoch));
    }
    claim(inner, session_id, false).await
}

/// Acquires `session_id`'s lease in the ledger (see [`acquire`]); a `takeover` of an expired
/// lease also withdraws the dead replica's published handlers
/// (`Ledger::take_over_session_lease`).
async fn claim(inner: &Inner, session_id: &str, takeover: bool) -> Result<Option<u64>, StoreError> {
    let Some(ttl) = inner.config.session_lease_ttl else {
        return Ok(Some(0));
    };
    let ledger = inner.store.ledger();
    let claim = if takeover {
        ledger.take_over_session_lease(session_id, ttl).await
    } else {
        ledger.acquire_session_lease(session_id, ttl).await
    };
    match claim.map_err(StoreError::from)? {
        LeaseClaim::Granted(lease) => Ok(Some(lease.epoch)),
        LeaseClaim::Held(lease) => {
            tracing::debug!(
                %session_id,
                owner = lease.owner.as_deref().unwrap_or_default(),
                epoch = lease.epoch,
                "session driven by another replica"
            );
            Ok(None)
        }
    }
}

/// Releases the lease a stopped driver held at `epoch` (nothing with leases off). A failure
/// only leaves the lease to expire: whoever drives the session next takes it over then.
pub(crate) async fn release(inner: &Inner, session_id: &str, epoch: u64) {
    if inner.config.session_lease_ttl.is_none() || epoch == 0 {
        return;
    }
    if let Err(error) = inner
        .store
        .ledger()
        .release_session_lease(session_id, epoch)
        .await
    {
        tracing::warn!(%session_id, %error, "could not release a session lease; it will expire");
    }
}

/// Hands the lease a stopped driver held at `epoch` to the replica `to`, whose workers serve
/// the session's queued call (issue #20). A failure leaves the lease to expire: the session is
/// then taken over (by `to` or any other replica) as after a crash.
pub(crate) async fn hand_off(inner: &Inner, session_id: &str, epoch: u64, to: &str) {
    let Some(ttl) = inner.config.session_lease_ttl else {
        return;
    };
    match inner
        .store
        .ledger()
        .hand_off_session_lease(session_id, epoch, to, ttl)
        .await
    {
        Ok(true) => {
            phrony_metrics::SESSION_HANDOFFS.inc();
            tracing::info!(%session_id, %to, "session handed off");
        }
        Ok(false) => tracing::debug!(%session_id, "session lease lost before its handoff"),
        Err(error) => {
            tracing::warn!(%session_id, %to, %error, "could not hand the session off; its lease will expire");
        }
    }
}

/// A jittered period around `base` (±20 %), so replicas started together do not scan in step.
fn jittered(base: Duration) -> Duration {
    let spread = base / 5;
    let nanos = u64::try_from(spread.as_nanos()).unwrap_or(u64::MAX).max(1);
    let offset =
        u64::try_from(uuid::Uuid::new_v4().as_u128() % u128::from(2 * nanos)).unwrap_or_default();
    (base - spread) + Duration::from_nanos(offset)
}

/// Renews this replica's leases (and publishes the tool handlers its workers serve) and takes
/// over expired ones until `stop`, resuming each session taken over with `resume` (the
/// engine's unpark: the recovery path); takes the sessions handed to this replica when told
/// (PostgreSQL's NOTIFY) and at every scan. Holds only a weak reference, so the engine can drop.
pub(crate) async fn run<F, Fut>(inner: Weak<Inner>, stop: CancellationToken, resume: F)
where
    F: Fn(Arc<Inner>, String) -> Fut + Send,
    Fut: Future<Output = ()> + Send,
{
    let Some(ttl) = inner.upgrade().and_then(|i| i.config.session_lease_ttl) else {
        return;
    };
    let mut renew = tokio::time::interval(ttl / 3);
    renew.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut next_scan = tokio::time::Instant::now() + jittered(ttl / 2);
    let mut listener = Listener::Retry;
    loop {
        if matches!(listener, Listener::Retry) {
            let Some(strong) = inner.upgrade() else {
                return;
            };
            // Bounded: the renewals below must not wait for a stalled database.
            listener = tokio::time::timeout(ttl / 3, listen(&strong))
                .await
                .unwrap_or(Listener::Retry);
        }
        tokio::select! {
            () = stop.cancelled() => {
                // A graceful stop: this replica's workers serve nobody any more.
                if let Some(inner) = inner.upgrade()
                    && let Err(error) = inner.store.ledger().publish_handlers(&[], ttl).await
                {
                    tracing::debug!(%error, "could not withdraw the published tool handlers");
                }
                return;
            }
            _ = renew.tick() => {
                let Some(inner) = inner.upgrade() else { return };
                renew_leases(&inner, ttl).await;
                publish_handlers(&inner, ttl).await;
            }
            woken = wait_replicas(&mut listener) => {
                let Some(inner) = inner.upgrade() else { return };
                match woken {
                    Ok(Wake::HandedOff) => take(inner, &resume, Listed::HandedOff(ttl)).await,
                    Ok(Wake::Session(session_id)) => wake_session(&inner, &session_id).await,
                    Err(error) => {
                        tracing::warn!(%error, "lost the replica listener; listening again");
                        listener = Listener::Retry;
                    }
                }
            }
            () = tokio::time::sleep_until(next_scan) => {
                next_scan = tokio::time::Instant::now() + jittered(ttl / 2);
                let Some(inner) = inner.upgrade() else { return };
                take(Arc::clone(&inner), &resume, Listed::Expired).await;
                take(inner, &resume, Listed::HandedOff(ttl)).await;
            }
        }
    }
}

/// This replica's ear for the other replicas (PostgreSQL's NOTIFY).
enum Listener {
    /// Listening.
    Listening(ReplicaListener),
    /// Nothing to listen to (SQLite: one process per file).
    Nothing,
    /// Not listening: listening failed or was lost, tried again at the next turn (the periodic
    /// scans and re-reads find what it would have announced).
    Retry,
}

/// Listens to the other replicas.
async fn listen(inner: &Inner) -> Listener {
    match inner.store.ledger().listen_replicas().await {
        Ok(Some(listener)) => Listener::Listening(listener),
        Ok(None) => Listener::Nothing,
        Err(error) => {
            tracing::warn!(%error, "could not listen to the other replicas; polling meanwhile");
            Listener::Retry
        }
    }
}

/// Waits for a notification from another replica: forever without a listener.
async fn wait_replicas(listener: &mut Listener) -> Result<Wake, phrony_ledger::LedgerError> {
    match listener {
        Listener::Listening(listener) => listener.recv().await,
        Listener::Nothing | Listener::Retry => std::future::pending().await,
    }
}

/// Another replica recorded a change to `session_id` (a vote, a cancellation): its driver, if
/// here, re-reads now (an ended session's driver stops).
async fn wake_session(inner: &Arc<Inner>, session_id: &str) {
    let Some(live) = inner.live(session_id) else {
        return;
    };
    tracing::info!(%session_id, "a change recorded on another replica wakes the session's driver");
    match inner.store.get_session(session_id).await {
        Ok(session) if session.status.is_terminal() => {
            if let Err(error) = inner.stop_ended(&[session_id.to_owned()]).await {
                tracing::warn!(%session_id, %error, "could not stop the driver of an ended session");
            }
        }
        Ok(session) => {
            live.bump_approvals();
            live.notify_changed();
            // A user message queued there for this conversation: recorded here, now (in a
            // task of its own: never cut between a message's commit and its turn count).
            if session.mode == phrony_ledger::SessionMode::Conversation {
                let inner = Arc::clone(inner);
                tokio::spawn(async move {
                    if let Err(error) = crate::inbox::accept_queued(&inner, &live).await {
                        tracing::warn!(
                            session_id = %live.session_id, %error,
                            "could not record the user messages queued on another replica"
                        );
                    }
                });
            }
        }
        Err(_) => {
            live.bump_approvals();
            live.notify_changed();
        }
    }
}

/// Announces a change this replica recorded to a session it does not drive, so the replica
/// driving it re-reads now (with leases on; in the background: the caller's answer never
/// waits for it).
pub(crate) fn announce(inner: &Inner, session_id: &str) {
    if inner.config.session_lease_ttl.is_none() || inner.live(session_id).is_some() {
        return;
    }
    let ledger = inner.store.ledger().clone();
    let session_id = session_id.to_owned();
    tokio::spawn(async move {
        let announced = tokio::time::timeout(
            Duration::from_secs(5),
            ledger.announce_session_change(&session_id),
        )
        .await;
        if !matches!(announced, Ok(Ok(()))) {
            tracing::debug!(%session_id, "could not announce a session change to the other replicas");
        }
    });
}

/// Publishes the tool handlers this replica's workers serve, for the others' handoffs.
async fn publish_handlers(inner: &Inner, ttl: Duration) {
    let Some(router) = &inner.router else {
        return;
    };
    let keys = router.advertised_keys();
    if let Err(error) = inner.store.ledger().publish_handlers(&keys, ttl).await {
        tracing::warn!(%error, "could not publish the tool handlers served here");
    }
}

async fn renew_leases(inner: &Inner, ttl: Duration) {
    match inner.store.ledger().renew_session_leases(ttl).await {
        Ok(renewal) => {
            for (session_id, epoch) in renewal.lost {
                tracing::warn!(
                    %session_id,
                    epoch,
                    "session lease lost to another replica; stopping its driver here"
                );
                // Only the driver that held that lease (a driver started since holds a newer
                // one, or none yet).
                if let Some(live) = inner.live(&session_id).filter(|live| {
                    live.lease_epoch.load(std::sync::atomic::Ordering::Acquire) == epoch
                }) {
                    live.cancel.cancel();
                    live.bump_approvals();
                    live.notify_changed();
                }
            }
        }
        // Not renewed: the leases run out and the fence refuses what this replica writes after
        // another replica took them over.
        Err(error) => tracing::warn!(%error, "could not renew the session leases"),
    }
}

/// The sessions a scan takes ([`take`]).
#[derive(Debug, Clone, Copy)]
enum Listed {
    /// Sessions whose lease expired (a takeover; their last owner is named).
    Expired,
    /// Sessions handed to this replica, and handoffs their target left too long; each is not
    /// handed on again within the TTL.
    HandedOff(Duration),
}

impl Listed {
    /// At most [`TAKEOVER_BATCH`] sessions of this kind, each with the replica whose expired
    /// lease it takes over (`None` for a handoff).
    async fn list(
        self,
        inner: &Inner,
    ) -> Result<Vec<(String, Option<String>)>, phrony_ledger::LedgerError> {
        let ledger = inner.store.ledger();
        Ok(match self {
            Self::Expired => ledger
                .expired_session_leases(TAKEOVER_BATCH)
                .await?
                .into_iter()
                .map(|lease| (lease.session_id, lease.owner))
                .collect(),
            Self::HandedOff(_) => ledger
                .handed_off_sessions(TAKEOVER_BATCH)
                .await?
                .into_iter()
                .map(|session_id| (session_id, None))
                .collect(),
        })
    }
}

/// Takes the sessions `which` lists that no driver here holds: acquires each lease and
/// resumes the session ([`adopt`]).
async fn take<F, Fut>(inner: Arc<Inner>, resume: &F, which: Listed)
where
    F: Fn(Arc<Inner>, String) -> Fut,
    Fut: Future<Output = ()>,
{
    let listed = match which.list(&inner).await {
        Ok(listed) => listed,
        Err(error) => {
            tracing::debug!(%error, ?which, "could not list the sessions to take");
            return;
        }
    };
    for (session_id, from) in listed {
        if let Listed::HandedOff(ttl) = which {
            inner.note_handed_in(&session_id, ttl);
        }
        adopt(&inner, session_id, from, resume).await;
    }
}

/// Acquires the lease of a session no driver here holds and resumes it (a takeover, or a
/// handoff to this replica when `from` is `None`). The driver it starts takes that lease
/// (`Inner::leave_adopted`): one acquisition per takeover, epoch + 1.
async fn adopt<F, Fut>(inner: &Arc<Inner>, session_id: String, from: Option<String>, resume: &F)
where
    F: Fn(Arc<Inner>, String) -> Fut,
    Fut: Future<Output = ()>,
{
    if inner.live(&session_id).is_some() || inner.is_suspended(&session_id) {
        // Driven here: its lease is renewed at the next tick.
        return;
    }
    match claim(inner, &session_id, from.is_some()).await {
        Ok(Some(epoch)) => {
            if let Some(from) = &from {
                phrony_metrics::SESSION_TAKEOVERS.inc();
                tracing::info!(
                    %session_id,
                    %from,
                    epoch,
                    "taking over a session whose lease expired"
                );
            } else {
                tracing::info!(%session_id, epoch, "taking a session handed to this replica");
            }
            // The driver takes this lease instead of acquiring one.
            inner.leave_adopted(&session_id, epoch);
            resume(Arc::clone(inner), session_id.clone()).await;
            match inner.live(&session_id) {
                None => {
                    // Nothing to drive here (a child its parent supervises, ended meanwhile):
                    // free the lease for whoever drives it — unless a driver took it (and
                    // released it when it stopped).
                    if inner.take_adopted(&session_id, Some(epoch)).is_some() {
                        release(inner, &session_id, epoch).await;
                    }
                }
                Some(live) => {
                    // A driver started meanwhile by something else (a decision) that had
                    // acquired its own lease already: this one is left for nobody.
                    let driving = live.lease_epoch.load(std::sync::atomic::Ordering::Acquire);
                    if driving != 0 && driving != epoch {
                        inner.take_adopted(&session_id, Some(epoch));
                    }
                }
            }
        }
        Ok(None) => {}
        Err(error) => tracing::debug!(%session_id, %error, "could not take a lease over"),
    }
}
