//! Approval watchers: the pending approvals matching a filter, then each change to that set as
//! it happens, for an approvals surface that does not poll (`WatchApprovals`).
//!
//! A watcher never misses a change and is coupled to no commit path: the store bumps one cheap
//! counter ([`LedgerStore::approvals_changed`]) after every step that can open, vote on or
//! decide an approval; a watcher marks the counter seen, re-reads the pending set (the ledger's
//! list query) and diffs it against what it last reported. A bump during the read moves the
//! counter again, so the next wait returns at once. [`crate::EngineConfig::approval_watch_interval`]
//! is the fallback re-read, for changes another runtime process made on the same database.
//!
//! Pull-based: a watcher reads and diffs only when its consumer asks for the next change, so a
//! consumer that does not read holds one pending set, never a growing queue.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use phrony_ledger::{Approval, ApprovalFilter, ApprovalStatus, PageRequest};
use tokio::sync::{OwnedSemaphorePermit, watch};
use uuid::Uuid;

use crate::engine::Engine;
use crate::error::EngineError;
use crate::store::LedgerStore;

/// The most pending approvals one watcher follows (the ledger's unpaged list limit). A filter
/// matching more ends the watch with `ResourceExhausted`, naming the bound: narrow the filter.
pub const MAX_WATCHED_APPROVALS: usize = phrony_ledger::UNSIZED_PAGE_LIMIT as usize;

/// One change of a watched pending set.
#[derive(Debug, Clone, PartialEq)]
pub enum ApprovalChange {
    /// The approval is pending and matches the filter: it was pending when the watch started
    /// (before [`ApprovalChange::CurrentEnd`]) or was opened since.
    Opened(Approval),
    /// A pending approval changed without being decided (a vote of a quorum, edited args).
    Updated(Approval),
    /// The approval left the pending set: approved, denied, escalated, expired or cancelled
    /// (its `status`, `decided_by` and `comment` say which).
    Decided(Approval),
    /// Every approval pending when the watch started has been sent.
    CurrentEnd,
}

/// A watch of the pending approvals matching a filter; see the module docs. Holds one of the
/// engine's watcher permits until dropped.
pub struct ApprovalWatch {
    store: Arc<LedgerStore>,
    filter: ApprovalFilter,
    changes: watch::Receiver<u64>,
    fallback: Duration,
    /// What the consumer was told is pending, by id.
    sent: HashMap<Uuid, Approval>,
    queued: VecDeque<ApprovalChange>,
    seeded: bool,
    _permit: OwnedSemaphorePermit,
}

impl std::fmt::Debug for ApprovalWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApprovalWatch")
            .field("filter", &self.filter)
            .field("pending", &self.sent.len())
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// Watches the pending approvals matching `filter` (its `status` must be unset or
    /// `pending`): first each pending one as [`ApprovalChange::Opened`], then
    /// [`ApprovalChange::CurrentEnd`], then the changes as they happen.
    ///
    /// # Errors
    /// `InvalidArgument` for another status; `ResourceExhausted` when
    /// [`crate::EngineConfig::max_approval_watchers`] watchers are open.
    pub fn watch_approvals(&self, filter: ApprovalFilter) -> Result<ApprovalWatch, EngineError> {
        if filter
            .status
            .is_some_and(|status| status != ApprovalStatus::Pending)
        {
            return Err(EngineError::invalid(
                "a watch follows pending approvals: status must be empty or \"pending\"",
            ));
        }
        let permit = Arc::clone(&self.inner.approval_watchers)
            .try_acquire_owned()
            .map_err(|_| {
                EngineError::exhausted(format!(
                    "too many approval watchers: at most {} may be open at once",
                    self.inner.config.max_approval_watchers
                ))
            })?;
        let store = Arc::clone(&self.inner.store);
        let changes = store.watch_approval_changes();
        Ok(ApprovalWatch {
            store,
            filter: ApprovalFilter {
                status: Some(ApprovalStatus::Pending),
                ..filter
            },
            changes,
            fallback: self.inner.config.approval_watch_interval,
            sent: HashMap::new(),
            queued: VecDeque::new(),
            seeded: false,
            _permit: permit,
        })
    }
}

impl ApprovalWatch {
    /// The next change; waits for one.
    ///
    /// # Errors
    /// Store errors; `ResourceExhausted` when more than [`MAX_WATCHED_APPROVALS`] approvals
    /// match. The watch may be polled again after an error (it re-reads).
    pub async fn next(&mut self) -> Result<ApprovalChange, EngineError> {
        loop {
            if let Some(change) = self.queued.pop_front() {
                return Ok(change);
            }
            if self.seeded {
                tokio::select! {
                    changed = self.changes.changed() => {
                        if changed.is_err() {
                            // The store is gone (engine shut down): only the fallback re-reads.
                            tokio::time::sleep(self.fallback).await;
                        }
                    }
                    () = tokio::time::sleep(self.fallback) => {}
                }
            }
            // Seen before reading: a bump during the read makes the next wait return at once.
            self.changes.borrow_and_update();
            let pending = self.read().await?;
            self.diff(pending).await?;
            if !self.seeded {
                self.seeded = true;
                self.queued.push_back(ApprovalChange::CurrentEnd);
            }
        }
    }

    /// The pending approvals matching the filter, oldest first.
    async fn read(&self) -> Result<Vec<Approval>, EngineError> {
        let size = phrony_ledger::MAX_PAGE_SIZE;
        let mut page = PageRequest::first(size);
        let mut all = Vec::new();
        loop {
            let got = self
                .store
                .ledger()
                .list_approvals(&self.filter, &page)
                .await
                .map_err(crate::error::StoreError::from)?;
            all.extend(got.items);
            if all.len() > MAX_WATCHED_APPROVALS {
                return Err(EngineError::exhausted(format!(
                    "more than {MAX_WATCHED_APPROVALS} pending approvals match the watch: \
                     narrow it by agent, session or route"
                )));
            }
            match got.next_token {
                Some(token) => page = PageRequest::after(size, token),
                None => break,
            }
        }
        all.sort_by_key(|a| (a.created_at, a.id));
        Ok(all)
    }

    /// Queues the changes from what was sent to `pending`, and records `pending` as sent.
    async fn diff(&mut self, pending: Vec<Approval>) -> Result<(), EngineError> {
        // Queued only once the whole diff is known, so that an error repeats nothing.
        let mut changes = Vec::new();
        let mut now: HashMap<Uuid, Approval> = HashMap::with_capacity(pending.len());
        for approval in pending {
            match self.sent.get(&approval.id) {
                None => changes.push(ApprovalChange::Opened(approval.clone())),
                Some(before) if *before != approval => {
                    changes.push(ApprovalChange::Updated(approval.clone()));
                }
                Some(_) => {}
            }
            now.insert(approval.id, approval);
        }
        let mut gone: Vec<&Approval> = self
            .sent
            .values()
            .filter(|a| !now.contains_key(&a.id))
            .collect();
        gone.sort_by_key(|a| (a.created_at, a.id));
        let gone: Vec<Uuid> = gone.into_iter().map(|a| a.id).collect();
        for id in gone {
            let decided = self.store.get_approval(id).await?;
            if decided.status == ApprovalStatus::Pending {
                // Not decided after all: keep what was sent and look again at the next read.
                if let Some(before) = self.sent.remove(&id) {
                    now.insert(id, before);
                }
                continue;
            }
            changes.push(ApprovalChange::Decided(decided));
        }
        self.queued.extend(changes);
        self.sent = now;
        Ok(())
    }
}
