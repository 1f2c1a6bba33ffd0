//! A ledger handle's replica identity and the session leases it holds (issue #20): the
//! in-memory side of `leases.rs`, read by every append to fence the sessions this replica
//! drives (`db::Tx::fence`). A leaf: no crate-internal imports.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

/// A ledger handle's replica: its id and the leases it holds. Shared by the handle's clones.
#[derive(Debug)]
pub(crate) struct Replica {
    id: String,
    held: Mutex<HashMap<String, Held>>,
}

/// A lease this replica acquired and has not released.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Held {
    pub(crate) epoch: i64,
    /// A renewal found it taken over (reported once); appends stay fenced by `epoch` until the
    /// driver releases it.
    pub(crate) lost: bool,
}

impl Replica {
    pub(crate) fn new(id: String) -> Self {
        Self {
            id,
            held: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    pub(crate) fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Held>> {
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The epoch of this replica's lease on the session `stream`, if it holds one (lost or
    /// not: a lost lease keeps fencing until its driver releases it).
    pub(crate) fn fence(&self, stream: &str) -> Option<i64> {
        self.lock().get(stream).map(|h| h.epoch)
    }

    pub(crate) fn hold(&self, session_id: &str, epoch: i64) {
        self.lock()
            .insert(session_id.to_owned(), Held { epoch, lost: false });
    }

    /// Stops fencing `session_id`, unless a newer acquisition replaced `epoch` meanwhile.
    pub(crate) fn forget(&self, session_id: &str, epoch: i64) {
        let mut held = self.lock();
        if held.get(session_id).is_some_and(|h| h.epoch == epoch) {
            held.remove(session_id);
        }
    }

    /// The leases not known lost, by session.
    pub(crate) fn live(&self) -> HashMap<String, i64> {
        self.lock()
            .iter()
            .filter(|(_, h)| !h.lost)
            .map(|(s, h)| (s.clone(), h.epoch))
            .collect()
    }

    /// Marks the lease of `session_id` at `epoch` lost.
    pub(crate) fn mark_lost(&self, session_id: &str, epoch: i64) {
        if let Some(h) = self.lock().get_mut(session_id)
            && h.epoch == epoch
        {
            h.lost = true;
        }
    }
}

/// A replica id for a ledger handle nobody named: `replica-` and 12 random hex digits.
pub(crate) fn default_replica_id() -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    format!("replica-{}", &id[..12])
}
