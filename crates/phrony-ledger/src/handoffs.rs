//! Session handoffs between replicas (issue #20: any worker serves any session; migration
//! 0017).
//!
//! A worker serves the replica it is connected to. When the replica driving a session needs a
//! tool none of its own workers advertises, it finds a replica whose workers do
//! ([`Ledger::replica_serving`], from the handlers every replica publishes with its lease
//! renewals, [`Ledger::publish_handlers`]), queues the call and releases the session's lease
//! *to* that replica ([`Ledger::hand_off_session_lease`]) with nothing in flight. The named
//! replica is woken (NOTIFY `phrony_handoff` on PostgreSQL, delivered on commit; its periodic
//! scan otherwise), acquires the lease at the next epoch and drives the session from its log:
//! the queued call goes to its worker. A handoff its target never picked up (the target died)
//! is taken by any replica once its deadline passed ([`Ledger::handed_off_sessions`]). Moving
//! the session to the worker keeps one writer per session (the lease and its fence) and needs
//! no second path for results: see ARCHITECTURE.md "Several replicas on one database".
//!
//! The same listener carries session changes a replica recorded for a session another may
//! drive (a vote, a cancellation: [`Ledger::announce_session_change`], channel
//! `phrony_session`), so the driving replica re-reads at once.

use std::time::Duration;

use crate::Ledger;
use crate::db::{Backend, Pool, args};
use crate::error::{LedgerError, Result};

/// The PostgreSQL channel handoffs are announced on; the payload is the target replica's id.
pub const HANDOFF_CHANNEL: &str = "phrony_handoff";

/// The PostgreSQL channel on which a replica announces a change it recorded to a session
/// another replica may drive (a vote, a cancellation); the payload is the session id.
pub const SESSION_CHANNEL: &str = "phrony_session";

/// What woke a [`ReplicaListener`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wake {
    /// A session was handed to this replica ([`Ledger::handed_off_sessions`] lists it).
    HandedOff,
    /// Another replica recorded a change to this session (its driver, if here, re-reads).
    Session(String),
}

/// The most handler keys one replica publishes (a bound on a worker-controlled list).
pub const MAX_PUBLISHED_HANDLERS: usize = 10_000;

fn ttl_of(ttl: Duration) -> Result<chrono::Duration> {
    if ttl.is_zero() {
        return Err(LedgerError::invalid("a handoff needs a positive TTL"));
    }
    chrono::Duration::from_std(ttl)
        .map_err(|_| LedgerError::invalid(format!("handoff TTL {ttl:?} is too long")))
}

/// Wakes this replica when a session is handed to it or another replica changed a session
/// ([`Ledger::listen_replicas`]).
pub struct ReplicaListener {
    listener: sqlx::postgres::PgListener,
    replica_id: String,
}

impl std::fmt::Debug for ReplicaListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaListener")
            .field("replica_id", &self.replica_id)
            .finish_non_exhaustive()
    }
}

impl ReplicaListener {
    /// Waits for a handoff addressed to this replica or a session change another replica
    /// announced. A lost connection is re-established by the listener (notifications sent
    /// meanwhile are lost: the periodic scans and re-reads find those).
    ///
    /// # Errors
    /// Database errors.
    pub async fn recv(&mut self) -> Result<Wake> {
        loop {
            let notification = self
                .listener
                .recv()
                .await
                .map_err(|e| LedgerError::from_sqlx("wait for a replica notification", e))?;
            match notification.channel() {
                HANDOFF_CHANNEL if notification.payload() == self.replica_id => {
                    return Ok(Wake::HandedOff);
                }
                SESSION_CHANNEL if !notification.payload().is_empty() => {
                    return Ok(Wake::Session(notification.payload().to_owned()));
                }
                _ => {}
            }
        }
    }
}

impl Ledger {
    /// Publishes the tool handlers (`tool@version`) this replica's workers advertise, replacing
    /// what it published before, valid until now + `ttl` (renewed with the session leases, so
    /// the list of a replica that died expires with its leases; expired lists are deleted).
    ///
    /// # Errors
    /// `InvalidArgument` for a zero TTL or more than [`MAX_PUBLISHED_HANDLERS`] keys; database
    /// errors.
    pub async fn publish_handlers(&self, keys: &[String], ttl: Duration) -> Result<()> {
        let ttl = ttl_of(ttl)?;
        if keys.len() > MAX_PUBLISHED_HANDLERS {
            return Err(LedgerError::invalid(format!(
                "{} handlers to publish, at most {MAX_PUBLISHED_HANDLERS}",
                keys.len()
            )));
        }
        let owner = self.replica.id().to_owned();
        write_tx!(self, |tx| async {
            let now = tx.now();
            let expires_at = now + ttl;
            let mut conn = tx.conn();
            // Its own list, and the expired lists of replicas gone for good (ids differ per
            // process unless set, so nobody else would ever remove them).
            conn.execute(
                "unpublish handlers",
                "DELETE FROM replica_handlers WHERE replica_id = $1 OR expires_at <= $2",
                args![&owner, now],
            )
            .await?;
            for key in keys {
                conn.execute(
                    "publish a handler",
                    "INSERT INTO replica_handlers (replica_id, handler_key, expires_at) \
                     VALUES ($1, $2, $3) ON CONFLICT (replica_id, handler_key) \
                     DO UPDATE SET expires_at = excluded.expires_at",
                    args![&owner, key, expires_at],
                )
                .await?;
            }
            Ok(())
        })
    }

    /// Another replica whose workers serve `handler_key` (`tool@version`) by their unexpired
    /// publication, if any (one at random among several, to spread the load).
    ///
    /// # Errors
    /// Database errors.
    pub async fn replica_serving(&self, handler_key: &str) -> Result<Option<String>> {
        let now = self.clock.now();
        let mut conn = self.pool.acquire().await?;
        let row = conn
            .conn()
            .fetch_optional(
                "find a replica serving a handler",
                "SELECT replica_id FROM replica_handlers WHERE handler_key = $1 \
                 AND expires_at > $2 AND replica_id <> $3 ORDER BY random() LIMIT 1",
                args![handler_key, now, self.replica.id()],
            )
            .await?;
        row.map(|row| row.text("replica_id")).transpose()
    }

    /// Releases this replica's lease of `session_id` at `epoch` to the replica `target` (the
    /// session's next call waits for a tool only `target`'s workers serve; nothing is in
    /// flight): `target` may acquire it at once, any replica once `ttl` passed. Announced to
    /// `target` on commit (PostgreSQL). Returns whether this replica still held that lease (if
    /// not, nothing changed: the session is driven elsewhere).
    ///
    /// # Errors
    /// `InvalidArgument` for a zero TTL or an invalid target; database errors (the lease then
    /// expires and is taken over).
    pub async fn hand_off_session_lease(
        &self,
        session_id: &str,
        epoch: u64,
        target: &str,
        ttl: Duration,
    ) -> Result<bool> {
        let ttl = ttl_of(ttl)?;
        if target.is_empty() || target == self.replica.id() {
            return Err(LedgerError::invalid(format!(
                "cannot hand session {session_id} off to {target:?}"
            )));
        }
        let epoch = i64::try_from(epoch).unwrap_or(i64::MAX);
        let owner = self.replica.id().to_owned();
        self.replica.releasing(session_id, epoch);
        let handed = write_tx!(self, |tx| async {
            let now = tx.now();
            let backend = tx.backend();
            let mut conn = tx.conn();
            let n = conn
                .execute(
                    "hand a session lease off",
                    "UPDATE session_leases SET owner = NULL, handoff_to = $4, expires_at = $5, \
                     updated_at = $6 WHERE session_id = $1 AND owner = $2 AND epoch = $3",
                    args![session_id, &owner, epoch, target, now + ttl, now],
                )
                .await?;
            if n == 1 && backend == Backend::Postgres {
                conn.execute(
                    "announce a handoff",
                    "SELECT pg_notify($1, $2)",
                    args![HANDOFF_CHANNEL, target],
                )
                .await?;
            }
            Ok(n == 1)
        });
        self.replica.forget(session_id, epoch);
        handed
    }

    /// Sessions not ended whose lease was handed off to this replica, or to any replica that
    /// did not take it before its deadline: the handoff scan's work list, at most `limit`
    /// (1..=1000). Each is then acquired with [`Ledger::acquire_session_lease`] (a released
    /// lease: exactly one replica wins it).
    ///
    /// # Errors
    /// Database errors.
    pub async fn handed_off_sessions(&self, limit: u32) -> Result<Vec<String>> {
        let now = self.clock.now();
        let mut conn = self.pool.acquire().await?;
        let rows = conn
            .conn()
            .fetch_all(
                "list handed-off sessions",
                "SELECT l.session_id FROM session_leases l JOIN sessions s ON s.id = l.session_id \
                 WHERE l.owner IS NULL AND l.handoff_to IS NOT NULL \
                 AND (l.handoff_to = $1 OR l.expires_at <= $2) \
                 AND s.status NOT IN ('completed', 'failed', 'cancelled') \
                 ORDER BY l.expires_at, l.session_id LIMIT $3",
                args![self.replica.id(), now, i64::from(limit.clamp(1, 1000))],
            )
            .await?;
        rows.iter().map(|row| row.text("session_id")).collect()
    }

    /// Announces to the other replicas that this one recorded a change to `session_id` (a
    /// vote, a cancellation) while another may drive it: its driver re-reads at once instead of
    /// at its safety-net interval. Nothing on SQLite (one process per file). Best effort: a
    /// lost announcement only delays the driver to its next re-read.
    ///
    /// # Errors
    /// Database errors.
    pub async fn announce_session_change(&self, session_id: &str) -> Result<()> {
        let Pool::Postgres(pool) = &self.pool else {
            return Ok(());
        };
        sqlx::query("SELECT pg_notify($1, $2)")
            .bind(SESSION_CHANNEL)
            .bind(session_id)
            .execute(pool)
            .await
            .map_err(|e| LedgerError::from_sqlx("announce a session change", e))?;
        Ok(())
    }

    /// Listens for handoffs to this replica and session changes other replicas announce:
    /// `None` on SQLite (one process per file: nobody to hear from).
    ///
    /// # Errors
    /// Database errors.
    pub async fn listen_replicas(&self) -> Result<Option<ReplicaListener>> {
        let Pool::Postgres(pool) = &self.pool else {
            return Ok(None);
        };
        let mut listener = sqlx::postgres::PgListener::connect_with(pool)
            .await
            .map_err(|e| LedgerError::from_sqlx("listen to the other replicas", e))?;
        listener
            .listen_all([HANDOFF_CHANNEL, SESSION_CHANNEL])
            .await
            .map_err(|e| LedgerError::from_sqlx("listen to the other replicas", e))?;
        Ok(Some(ReplicaListener {
            listener,
            replica_id: self.replica.id().to_owned(),
        }))
    }
}
