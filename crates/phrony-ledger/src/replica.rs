//! A ledger handle's replica identity and the session leases it holds (issue #20): the
//! in-memory side of `leases.rs`, read by every append to fence the sessions this replica
//! drives (`db::Tx::fence`). A leaf: no crate-internal imports.
//!
//! Besides the leases held, it knows the acquisitions and releases in flight, so a renewal
//! running beside them never mistakes a lease acquired a moment ago for a leftover (and frees
//! it) nor one being released for a lost one (and stops the driver that holds the session
//! next): the race that stalled sessions under load before.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

/// A ledger handle's replica: its id and the leases it holds. Shared by the handle's clones.
#[derive(Debug)]
pub(crate) struct Replica {
    id: String,
    state: Mutex<State>,
}

#[derive(Debug, Default, Clone)]
pub(crate) struct State {
    /// The leases acquired and not forgotten, by session.
    pub(crate) held: HashMap<String, Held>,
    /// Acquisitions in flight (registered before their transaction, cleared after the
    /// outcome is in `held`), by session, counted.
    pub(crate) acquiring: HashMap<String, u32>,
    /// Leases released by the transaction that ended their session (`leases::release_with_end`),
    /// by session, with their epoch: the driver's own release then needs no transaction
    /// ([`Replica::take_ended`]); `true` once a renewal saw it: dropped at the next one if
    /// nobody asked meanwhile ([`Replica::prune_ended`]).
    pub(crate) ended: HashMap<String, (i64, bool)>,
}

/// A lease this replica acquired and has not released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Held {
    pub(crate) epoch: i64,
    /// A renewal found it taken over (reported once); appends stay fenced by `epoch` until the
    /// driver releases it.
    pub(crate) lost: bool,
    /// Its release is in flight: a renewal that no longer finds it is not a loss.
    pub(crate) releasing: bool,
}

/// An acquisition in flight ([`Replica::acquiring`]); ends when dropped.
pub(crate) struct Acquiring {
    replica: Arc<Replica>,
    session_id: String,
}

impl Drop for Acquiring {
    fn drop(&mut self) {
        let mut state = self.replica.lock();
        if let Some(n) = state.acquiring.get_mut(&self.session_id) {
            *n -= 1;
            if *n == 0 {
                state.acquiring.remove(&self.session_id);
            }
        }
    }
}

impl Replica {
    pub(crate) fn new(id: String) -> Self {
        Self {
            id,
            state: Mutex::new(State::default()),
        }
    }

    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The epoch of this replica's lease on the session `stream`, if it holds one (lost or
    /// not: a lost lease keeps fencing until its driver releases it).
    pub(crate) fn fence(&self, stream: &str) -> Option<i64> {
        self.lock().held.get(stream).map(|h| h.epoch)
    }

    /// Whether this replica holds the lease of `session_id` at `epoch`, neither known lost nor
    /// being released.
    pub(crate) fn holds(&self, session_id: &str, epoch: i64) -> bool {
        self.lock()
            .held
            .get(session_id)
            .is_some_and(|h| h.epoch == epoch && !h.lost && !h.releasing)
    }

    /// Registers an acquisition of `session_id` about to run; keep the guard until its
    /// outcome is recorded with [`Replica::hold`] (or it failed).
    pub(crate) fn acquiring(self: &Arc<Self>, session_id: &str) -> Acquiring {
        *self
            .lock()
            .acquiring
            .entry(session_id.to_owned())
            .or_default() += 1;
        Acquiring {
            replica: Arc::clone(self),
            session_id: session_id.to_owned(),
        }
    }

    pub(crate) fn hold(&self, session_id: &str, epoch: i64) {
        self.lock().held.insert(
            session_id.to_owned(),
            Held {
                epoch,
                lost: false,
                releasing: false,
            },
        );
    }

    /// Notes that the lease of `session_id` at `epoch` is being released.
    pub(crate) fn releasing(&self, session_id: &str, epoch: i64) {
        if let Some(h) = self.lock().held.get_mut(session_id)
            && h.epoch == epoch
        {
            h.releasing = true;
        }
    }

    /// Stops fencing `session_id`, unless a newer acquisition replaced `epoch` meanwhile.
    pub(crate) fn forget(&self, session_id: &str, epoch: i64) {
        let mut state = self.lock();
        if state.held.get(session_id).is_some_and(|h| h.epoch == epoch) {
            state.held.remove(session_id);
        }
    }

    /// The transaction that ended `session_id` released its lease at `epoch` and committed:
    /// no longer held; remembered for the driver's release ([`Replica::take_ended`]).
    pub(crate) fn ended(&self, session_id: &str, epoch: i64) {
        let mut state = self.lock();
        if state.held.get(session_id).is_some_and(|h| h.epoch == epoch) {
            state.held.remove(session_id);
            state.ended.insert(session_id.to_owned(), (epoch, false));
        }
    }

    /// The transaction that was to release the lease of `session_id` at `epoch` with the
    /// session's end did not commit: the lease is held as before.
    pub(crate) fn not_released(&self, session_id: &str, epoch: i64) {
        if let Some(h) = self.lock().held.get_mut(session_id)
            && h.epoch == epoch
        {
            h.releasing = false;
        }
    }

    /// Whether the lease of `session_id` at `epoch` was released with its session's end
    /// ([`Replica::ended`]); forgets it.
    pub(crate) fn take_ended(&self, session_id: &str, epoch: i64) -> bool {
        let mut state = self.lock();
        if state
            .ended
            .get(session_id)
            .is_some_and(|(e, _)| *e == epoch)
        {
            state.ended.remove(session_id);
            return true;
        }
        false
    }

    /// After a renewal: forgets the leases released with their session's end that the
    /// previous renewal saw already (their drivers stopped without asking: the engine
    /// stopping), and marks the others seen.
    pub(crate) fn prune_ended(&self) {
        self.lock()
            .ended
            .retain(|_, (_, seen)| !std::mem::replace(seen, true));
    }

    /// A copy of what this replica holds and is acquiring.
    pub(crate) fn snapshot(&self) -> State {
        self.lock().clone()
    }

    /// Marks the lease of `session_id` at `epoch` lost; whether it was held (and not already
    /// known lost or being released) at that epoch.
    pub(crate) fn mark_lost(&self, session_id: &str, epoch: i64) -> bool {
        match self.lock().held.get_mut(session_id) {
            Some(h) if h.epoch == epoch && !h.lost && !h.releasing => {
                h.lost = true;
                true
            }
            _ => false,
        }
    }
}

/// A replica id for a ledger handle nobody named: `replica-` and 12 random hex digits.
pub(crate) fn default_replica_id() -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("replica-{}", &id[..12])
}
