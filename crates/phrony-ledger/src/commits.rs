//! Committed appends handed to in-process listeners ([`Ledger::listen_to_commits`]).
//!
//! A process that writes a stream and then reads it back (a session's driver folding the events
//! it just recorded, a subscription following the session) can take the events from here instead
//! of from the database: a listener receives, after a write transaction **committed** (on SQLite
//! once its batch is durable), the events it appended to the streams the listener wants, in
//! sequence order, exactly as a read returns them. Nothing is handed over for a write that rolled
//! back. Only this process's writes are heard: a reader that must also see other processes'
//! writes still reads the database. What a listener holds is a part of the log, not all of it: a
//! reader may use a run of it only when the run continues the reader's position without a gap
//! (the log held exactly that run at its commit).
//!
//! [`Ledger::listen_to_commits`]: crate::Ledger::listen_to_commits

use std::sync::{Arc, RwLock, Weak};

use crate::Event;

/// Payloads larger than this (their canonical JSON, in bytes) are not handed over: the
/// listener hears only that the stream's head moved past them ([`CommittedAppend::last_seq`]),
/// and a reader reads them from the database.
pub const HANDED_OVER_PAYLOAD_MAX: usize = 16 * 1024;

/// Receives the events this process's committed writes appended.
pub trait CommitListener: Send + Sync {
    /// Whether the appends to `stream` are wanted (asked once per append, inside the writing
    /// transaction: keep it cheap and never block).
    fn wants(&self, stream: &str) -> bool;

    /// One append to a wanted stream, after its transaction committed. Appends of one stream
    /// arrive in commit order from one writer, but two writers' commits may be heard in either
    /// order: order by [`Event::seq`].
    fn committed(&self, append: CommittedAppend);
}

/// What one append wrote to one stream.
#[derive(Debug, Clone, PartialEq)]
pub struct CommittedAppend {
    /// The stream.
    pub stream: String,
    /// The stream's head after the append: its last event's `seq`.
    pub last_seq: u64,
    /// The appended events, ascending, without those whose payload is over
    /// [`HANDED_OVER_PAYLOAD_MAX`] (so `seq`s may be missing; the last one may be below
    /// `last_seq`).
    pub events: Vec<CommittedEvent>,
}

/// One appended event, as a read returns it.
#[derive(Debug, Clone, PartialEq)]
pub struct CommittedEvent {
    /// The event.
    pub event: Event,
    /// The size of its payload's canonical JSON (what the database stores), in bytes.
    pub payload_bytes: usize,
}

/// The listeners of a ledger and its clones.
#[derive(Default)]
pub(crate) struct Listeners(RwLock<Vec<Weak<dyn CommitListener>>>);

impl std::fmt::Debug for Listeners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listeners")
            .field("count", &self.read().len())
            .finish()
    }
}

impl Listeners {
    fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<Weak<dyn CommitListener>>> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn add(&self, listener: &Arc<dyn CommitListener>) {
        let mut all = self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        all.retain(|l| l.strong_count() > 0);
        all.push(Arc::downgrade(listener));
    }

    /// The live listeners that want `stream`'s appends; empty (no allocation) when none does.
    pub(crate) fn wanting(&self, stream: &str) -> Vec<Arc<dyn CommitListener>> {
        let all = self.read();
        if all.is_empty() {
            return Vec::new();
        }
        all.iter()
            .filter_map(Weak::upgrade)
            .filter(|l| l.wants(stream))
            .collect()
    }
}

/// An append a transaction holds until it commits.
pub(crate) struct Pending {
    pub(crate) listeners: Vec<Arc<dyn CommitListener>>,
    pub(crate) append: CommittedAppend,
}

impl Pending {
    /// Hands the append to its listeners (the transaction committed), its events as a read
    /// returns them: payloads parsed from the canonical JSON, so with their object keys in
    /// order (the writer's values keep them as it built them). Sorted here, after the commit,
    /// not while the write held the database (on SQLite, the group-commit batch).
    pub(crate) fn deliver(mut self) {
        for committed in &mut self.append.events {
            committed.event.payload.sort_all_objects();
        }
        let Some((last, others)) = self.listeners.split_last() else {
            return;
        };
        for listener in others {
            listener.committed(self.append.clone());
        }
        last.committed(self.append);
    }
}
