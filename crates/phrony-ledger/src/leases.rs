//! Session leases with fencing (issue #20: several runtime replicas on one database;
//! migration 0015).
//!
//! A replica drives a session only while it holds the session's lease: a `session_leases` row
//! naming it as `owner`, with a fencing token `epoch` that grows by one on every acquisition
//! (and is never reset: a released lease keeps its row, `owner` NULL) and an `expires_at` it
//! moves forward by renewing. Safety never depends on clocks: every append this replica makes
//! to the stream of a session it holds a lease on carries `(owner, epoch)` into the statement
//! that advances the stream head (`events::append_batch`), so once another replica took the
//! lease over (epoch + 1) the old holder's writes are refused with [`LedgerError::Fenced`]
//! and roll back whole. An acquisition locks the session's stream head first, so it is ordered
//! with every append: an append either committed before the takeover (and the new holder reads
//! it) or runs after it (and is refused). Clocks only decide *when* a lease may be taken over.
//!
//! Writes of facts from people and workers (votes, tool results) received by a replica that
//! holds no lease on the session are not fenced: they append under the stream-head lock like
//! any write and the driver, wherever it runs, reads them from the log.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::Ledger;
use crate::db::{Arg, Backend, Conn, Tx, args};
use crate::error::{LedgerError, Result};
use crate::replica::{Replica, State};

/// Session ids one SQLite statement of [`Ledger::sessions_leased_elsewhere`] asks about: with
/// its two other parameters, under the 999 bound parameters of SQLite builds older than 3.32.
const SQLITE_IDS_PER_STATEMENT: usize = 500;

/// [`Ledger::sessions_leased_elsewhere`]'s query, up to the list of session ids.
const HELD_ELSEWHERE: &str = "SELECT session_id FROM session_leases \
     WHERE owner IS NOT NULL AND owner <> $1 AND expires_at > $2 AND session_id";

/// The longest replica id accepted ([`Ledger::with_replica_id`]).
pub const MAX_REPLICA_ID_LEN: usize = 200;

/// One session's lease as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionLease {
    /// The session.
    pub session_id: String,
    /// The replica holding it; `None` once released (the session parked or ended).
    pub owner: Option<String>,
    /// The fencing token: +1 on every acquisition, never reset.
    pub epoch: u64,
    /// When the lease ends unless renewed.
    pub expires_at: DateTime<Utc>,
}

/// The answer of [`Ledger::acquire_session_lease`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseClaim {
    /// This replica holds the lease now, at a new epoch: its appends to the session are fenced
    /// by it.
    Granted(SessionLease),
    /// Another replica holds a lease that has not expired: this one must not drive the session.
    Held(SessionLease),
}

/// What one [`Ledger::renew_session_leases`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseRenewal {
    /// Sessions whose lease this replica still holds, renewed (sorted).
    pub renewed: Vec<String>,
    /// Sessions whose lease this replica lost (taken over at a higher epoch), each with the
    /// epoch it held: the driver holding that epoch must stop; this replica's appends to
    /// those sessions are refused (sorted).
    pub lost: Vec<(String, u64)>,
}

pub(crate) fn ttl_of(ttl: Duration) -> Result<chrono::Duration> {
    if ttl.is_zero() {
        return Err(LedgerError::invalid("a session lease needs a positive TTL"));
    }
    chrono::Duration::from_std(ttl)
        .map_err(|_| LedgerError::invalid(format!("session lease TTL {ttl:?} is too long")))
}

fn epoch_of(raw: i64, session_id: &str) -> Result<u64> {
    u64::try_from(raw).map_err(|_| {
        LedgerError::corrupt(format!(
            "session_leases: session {session_id} has a negative epoch {raw}"
        ))
    })
}

async fn read(conn: &mut Conn<'_>, session_id: &str) -> Result<Option<SessionLease>> {
    let row = conn
        .fetch_optional(
            "read session lease",
            "SELECT owner, epoch, expires_at FROM session_leases WHERE session_id = $1",
            args![session_id],
        )
        .await?;
    row.map(|row| {
        Ok(SessionLease {
            session_id: session_id.to_owned(),
            owner: row.opt_text("owner")?,
            epoch: epoch_of(row.int("epoch")?, session_id)?,
            expires_at: row.ts("expires_at")?,
        })
    })
    .transpose()
}

/// Takes the lease of `session_id` for `owner` when it is free (never taken, released,
/// expired) or already `owner`'s, at epoch + 1. Locks the session's stream head first. With
/// `takeover`, a lease taken from another replica whose lease had expired withdraws that
/// replica's published tool handlers too ([`withdraw_dead_handlers`]).
pub(crate) async fn acquire(
    tx: &mut Tx,
    owner: &str,
    session_id: &str,
    ttl: chrono::Duration,
    takeover: bool,
) -> Result<LeaseClaim> {
    let backend = tx.backend();
    let lock = match backend {
        Backend::Postgres => "SELECT last_seq FROM streams WHERE stream = $1 FOR UPDATE",
        Backend::Sqlite => "SELECT last_seq FROM streams WHERE stream = $1",
    };
    let now = tx.now();
    let expires_at = now + ttl;
    let mut conn = tx.conn();
    if conn
        .fetch_optional("lock session stream for its lease", lock, args![session_id])
        .await?
        .is_none()
    {
        return Err(LedgerError::not_found(format!(
            "session {session_id} not found"
        )));
    }
    // A takeover reads whose lease it takes, locked (PostgreSQL), so a renewal or release by
    // its owner waits for this transaction and then finds the lease gone.
    let dead = if takeover {
        let sql = match backend {
            Backend::Postgres => {
                "SELECT owner, epoch, expires_at FROM session_leases WHERE session_id = $1 \
                 FOR UPDATE"
            }
            Backend::Sqlite => {
                "SELECT owner, epoch, expires_at FROM session_leases WHERE session_id = $1"
            }
        };
        match conn
            .fetch_optional("read the lease taken over", sql, args![session_id])
            .await?
        {
            Some(row) if row.ts("expires_at")? <= now => row
                .opt_text("owner")?
                .filter(|previous| previous.as_str() != owner),
            _ => None,
        }
    } else {
        None
    };
    let granted = conn
        .fetch_all(
            "acquire session lease",
            "INSERT INTO session_leases (session_id, owner, epoch, expires_at, updated_at) \
             VALUES ($1, $2, 1, $3, $4) \
             ON CONFLICT (session_id) DO UPDATE SET owner = excluded.owner, \
             epoch = session_leases.epoch + 1, expires_at = excluded.expires_at, \
             updated_at = excluded.updated_at, handoff_to = NULL \
             WHERE session_leases.owner IS NULL OR session_leases.owner = excluded.owner \
             OR session_leases.expires_at <= excluded.updated_at \
             RETURNING epoch",
            args![session_id, owner, expires_at, now],
        )
        .await?;
    if let Some(row) = granted.first() {
        if let Some(dead) = &dead {
            withdraw_dead_handlers(&mut conn, dead, now).await?;
        }
        return Ok(LeaseClaim::Granted(SessionLease {
            session_id: session_id.to_owned(),
            owner: Some(owner.to_owned()),
            epoch: epoch_of(row.int("epoch")?, session_id)?,
            expires_at,
        }));
    }
    let held = read(&mut conn, session_id).await?.ok_or_else(|| {
        LedgerError::corrupt(format!(
            "the lease of session {session_id} vanished while it was acquired"
        ))
    })?;
    Ok(LeaseClaim::Held(held))
}

/// Deletes the published tool handlers of `replica`, whose expired lease was just taken over:
/// an expired lease means its owner stopped renewing (it renews every lease it holds and
/// publishes its handlers on the same tick), so it is dead or cut off and a call handed to it
/// would wait a TTL for nothing. Not while it still holds an unexpired lease (it renewed
/// something lately: alive). A replica cut off and back publishes its list again at its next
/// renewal.
async fn withdraw_dead_handlers(
    conn: &mut Conn<'_>,
    replica: &str,
    now: DateTime<Utc>,
) -> Result<()> {
    let withdrawn = conn
        .execute(
            "withdraw a dead replica's tool handlers",
            "DELETE FROM replica_handlers WHERE replica_id = $1 AND NOT EXISTS \
             (SELECT 1 FROM session_leases WHERE owner = $1 AND expires_at > $2)",
            args![replica, now],
        )
        .await?;
    if withdrawn > 0 {
        tracing::info!(
            %replica,
            withdrawn,
            "withdrew the tool handlers of a replica whose lease was taken over"
        );
    }
    Ok(())
}

/// Frees a lease at its epoch (`$1` session, `$2` owner, `$3` epoch, `$4` now), keeping the
/// epoch: [`Ledger::release_session_lease`] and [`release_with_end`].
const RELEASE: &str = "UPDATE session_leases SET owner = NULL, expires_at = $4, updated_at = $4 \
     WHERE session_id = $1 AND owner = $2 AND epoch = $3";

/// Releases this replica's lease of `session_id`, if it holds one, in the transaction that
/// ends the session (its driver stops next; nothing is left to drive): one statement there
/// instead of a transaction of its own after it. Once it commits the replica no longer fences
/// the session, and the driver's [`Ledger::release_session_lease`] writes nothing.
pub(crate) async fn release_with_end(tx: &mut Tx, session_id: &str) -> Result<()> {
    let Some((owner, epoch)) = tx.fence(session_id) else {
        return Ok(());
    };
    tx.releases_lease(session_id, epoch);
    let now = tx.now();
    tx.conn()
        .execute(
            "release the lease of an ended session",
            RELEASE,
            args![session_id, &owner, epoch, now],
        )
        .await?;
    Ok(())
}

/// Renews every lease `owner` holds in one statement and judges the rows against what this
/// replica holds: `before` (taken before the transaction) and its state right after the
/// statement ran (acquisitions and releases in flight included, see `replica.rs`). A lease
/// is *lost* only when it was held at the same epoch, not being released, both before and
/// after the statement — then its acquisition committed before the statement started, which
/// would have renewed it had nobody taken it over. A row this replica neither holds at that
/// epoch nor is acquiring (a handle recreated under the same id, a release that failed) is
/// released. Returns the renewed sessions and the lost ones with their epochs.
async fn renew(
    tx: &mut Tx,
    replica: &Replica,
    before: &State,
    ttl: chrono::Duration,
) -> Result<(Vec<String>, Vec<(String, i64)>)> {
    let now = tx.now();
    let owner = replica.id().to_owned();
    let mut conn = tx.conn();
    let rows = conn
        .fetch_all(
            "renew session leases",
            "UPDATE session_leases SET expires_at = $2, updated_at = $3 WHERE owner = $1 \
             RETURNING session_id, epoch",
            args![&owner, now + ttl, now],
        )
        .await?;
    let after = replica.snapshot();
    let mut returned = HashMap::with_capacity(rows.len());
    for row in rows {
        returned.insert(row.text("session_id")?, row.int("epoch")?);
    }
    let mut renewed = Vec::with_capacity(returned.len());
    for (session_id, &epoch) in &returned {
        if after.held.get(session_id).is_some_and(|h| h.epoch == epoch) {
            renewed.push(session_id.clone());
        } else if !after.acquiring.contains_key(session_id) {
            conn.execute(
                "release a session lease nobody here drives",
                RELEASE,
                args![session_id, &owner, epoch, now],
            )
            .await?;
        }
    }
    let lost = before
        .held
        .iter()
        .filter(|(session_id, h)| {
            !h.lost
                && !h.releasing
                && after.held.get(*session_id) == Some(*h)
                && returned.get(*session_id) != Some(&h.epoch)
        })
        .map(|(session_id, h)| (session_id.clone(), h.epoch))
        .collect();
    Ok((renewed, lost))
}

impl Ledger {
    /// Names this handle's replica (the default is `replica-` and 12 random hex digits): the
    /// owner recorded on the session leases it acquires. Every process on one database needs
    /// its own id; a restarted process may reuse its id (its earlier leases are then taken
    /// over by its own next acquisitions, at a higher epoch).
    ///
    /// # Errors
    /// `InvalidArgument` for an empty id, one longer than [`MAX_REPLICA_ID_LEN`] or one with
    /// whitespace or control characters.
    pub fn with_replica_id(mut self, id: &str) -> Result<Self> {
        if id.is_empty()
            || id.len() > MAX_REPLICA_ID_LEN
            || id.chars().any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(LedgerError::invalid(format!(
                "replica id {id:?} must be 1 to {MAX_REPLICA_ID_LEN} characters without \
                 whitespace or control characters"
            )));
        }
        self.replica = std::sync::Arc::new(Replica::new(id.to_owned()));
        Ok(self)
    }

    /// This handle's replica id (see [`Ledger::with_replica_id`]).
    #[must_use]
    pub fn replica_id(&self) -> &str {
        self.replica.id()
    }

    /// Acquires the lease of `session_id` for this replica until now + `ttl`: granted when it
    /// was never taken, released, expired, or already this replica's — always at a new epoch,
    /// from which on this replica's appends to the session's stream are fenced by it (an
    /// older driver of this replica included). [`LeaseClaim::Held`] when another replica holds
    /// it unexpired. Locks the session's stream head, so it is ordered with every append.
    ///
    /// # Errors
    /// `NotFound` for a session without events; `InvalidArgument` for a zero TTL; database
    /// errors.
    pub async fn acquire_session_lease(
        &self,
        session_id: &str,
        ttl: Duration,
    ) -> Result<LeaseClaim> {
        self.claim_session_lease(session_id, ttl, false).await
    }

    /// [`Ledger::acquire_session_lease`] for the takeover scan: when the lease it takes was
    /// another replica's and had expired, that replica stopped renewing (killed, paused, cut
    /// off), and its published tool handlers ([`Ledger::publish_handlers`]) are deleted in the
    /// same transaction — unless it still holds an unexpired lease — so no call is handed to
    /// it for the rest of their TTL.
    ///
    /// # Errors
    /// As [`Ledger::acquire_session_lease`].
    pub async fn take_over_session_lease(
        &self,
        session_id: &str,
        ttl: Duration,
    ) -> Result<LeaseClaim> {
        self.claim_session_lease(session_id, ttl, true).await
    }

    async fn claim_session_lease(
        &self,
        session_id: &str,
        ttl: Duration,
        takeover: bool,
    ) -> Result<LeaseClaim> {
        let ttl = ttl_of(ttl)?;
        let owner = self.replica.id().to_owned();
        // In flight until held: a renewal beside it must not free the row it writes.
        let _acquiring = self.replica.acquiring(session_id);
        let claim = write_tx!(self, |tx| acquire(
            &mut tx, &owner, session_id, ttl, takeover
        ))?;
        if let LeaseClaim::Granted(lease) = &claim {
            self.replica
                .hold(session_id, i64::try_from(lease.epoch).unwrap_or(i64::MAX));
        }
        Ok(claim)
    }

    /// Whether this replica holds the lease of `session_id` at `epoch` (acquired, not released,
    /// not known lost to another replica). In memory, no database read: a takeover hands the
    /// lease it acquired to the driver it starts with it, which checks it is still held.
    #[must_use]
    pub fn holds_session_lease(&self, session_id: &str, epoch: u64) -> bool {
        i64::try_from(epoch).is_ok_and(|epoch| self.replica.holds(session_id, epoch))
    }

    /// Renews every lease this replica holds until now + `ttl`, in one statement, and says
    /// which it still holds and which it lost since the last renewal (taken over by another
    /// replica at a higher epoch: the driver must stop; this replica's appends to that session
    /// stay refused until the driver releases the lease, [`Ledger::release_session_lease`]).
    ///
    /// # Errors
    /// `InvalidArgument` for a zero TTL; database errors (nothing is known lost then: a lease
    /// that cannot be renewed simply expires, and the fence refuses what comes after).
    pub async fn renew_session_leases(&self, ttl: Duration) -> Result<LeaseRenewal> {
        let ttl = ttl_of(ttl)?;
        let before = self.replica.snapshot();
        let (renewed, lost) = write_tx!(self, |tx| renew(&mut tx, &self.replica, &before, ttl))?;
        self.replica.prune_ended();
        let mut report = LeaseRenewal {
            renewed,
            lost: Vec::with_capacity(lost.len()),
        };
        for (session_id, epoch) in lost {
            // Still that lease, not released meanwhile: reported once.
            if self.replica.mark_lost(&session_id, epoch) {
                report
                    .lost
                    .push((session_id, u64::try_from(epoch).unwrap_or_default()));
            }
        }
        report.renewed.sort();
        report.lost.sort();
        Ok(report)
    }

    /// Releases this replica's lease of `session_id` at `epoch` (its driver stopped: the
    /// session parked or ended), keeping the epoch, and stops fencing the session here unless a
    /// newer acquisition replaced it. Whoever drives it next acquires it. Returns whether this
    /// replica still held that lease. A lease the session's end released (the transaction that
    /// ended it, when this replica held the lease) was held until then: `true`, and nothing is
    /// written.
    ///
    /// # Errors
    /// Database errors; the session is no longer fenced here at `epoch` either way.
    pub async fn release_session_lease(&self, session_id: &str, epoch: u64) -> Result<bool> {
        let epoch = i64::try_from(epoch).unwrap_or(i64::MAX);
        // Released already, by the transaction that ended the session (`release_with_end`).
        if self.replica.take_ended(session_id, epoch) {
            return Ok(true);
        }
        let owner = self.replica.id().to_owned();
        // In flight: a renewal that no longer finds it must not report it lost.
        self.replica.releasing(session_id, epoch);
        let released = write_tx!(self, |tx| async {
            let now = tx.now();
            tx.conn()
                .execute(
                    "release session lease",
                    RELEASE,
                    args![session_id, &owner, epoch, now],
                )
                .await
        });
        self.replica.forget(session_id, epoch);
        Ok(released? == 1)
    }

    /// The lease of `session_id` as stored, if it was ever acquired.
    ///
    /// # Errors
    /// Database errors.
    pub async fn session_lease(&self, session_id: &str) -> Result<Option<SessionLease>> {
        let mut conn = self.pool.acquire().await?;
        read(&mut conn.conn(), session_id).await
    }

    /// Which of `session_ids` another replica drives now: their lease is held by another owner
    /// and not expired at the ledger's clock (start-up recovery skips them: their driver is
    /// alive elsewhere, and the takeover scan finds them if it dies). At most 1,000 ids, read
    /// in one statement (`= ANY($3)` on PostgreSQL; on SQLite `IN (…)`, one bound parameter per
    /// id, in chunks of [`SQLITE_IDS_PER_STATEMENT`]).
    ///
    /// # Errors
    /// `InvalidArgument` for more than 1,000 ids; database errors.
    pub async fn sessions_leased_elsewhere(
        &self,
        session_ids: &[String],
    ) -> Result<std::collections::HashSet<String>> {
        if session_ids.len() > 1000 {
            return Err(LedgerError::invalid(format!(
                "{} sessions asked for, at most 1000",
                session_ids.len()
            )));
        }
        let mut elsewhere = std::collections::HashSet::new();
        if session_ids.is_empty() {
            return Ok(elsewhere);
        }
        let now = self.clock.now();
        let me = self.replica.id().to_owned();
        let mut conn = self.pool.acquire().await?;
        let mut conn = conn.conn();
        let rows = match self.pool.backend() {
            Backend::Postgres => {
                conn.fetch_all(
                    "sessions leased elsewhere",
                    &format!("{HELD_ELSEWHERE} = ANY($3)"),
                    args![&me, now, Arg::TextList(session_ids.to_vec())],
                )
                .await?
            }
            Backend::Sqlite => {
                let mut rows = Vec::new();
                for chunk in session_ids.chunks(SQLITE_IDS_PER_STATEMENT) {
                    let placeholders = (3..3 + chunk.len())
                        .map(|n| format!("${n}"))
                        .collect::<Vec<_>>()
                        .join(", ");
                    let mut bound = args![&me, now];
                    bound.extend(chunk.iter().map(Arg::from));
                    rows.extend(
                        conn.fetch_all(
                            "sessions leased elsewhere",
                            &format!("{HELD_ELSEWHERE} IN ({placeholders})"),
                            bound,
                        )
                        .await?,
                    );
                }
                rows
            }
        };
        for row in rows {
            elsewhere.insert(row.text("session_id")?);
        }
        Ok(elsewhere)
    }

    /// Sessions not ended whose lease is held (by any replica) but expired at the ledger's
    /// clock: the takeover scan's work list, soonest expired first, at most `limit`
    /// (1..=1000). The scan acquires each with [`Ledger::acquire_session_lease`], whose
    /// conditional update lets exactly one replica win each.
    ///
    /// # Errors
    /// Database errors.
    pub async fn expired_session_leases(&self, limit: u32) -> Result<Vec<SessionLease>> {
        let now = self.clock.now();
        let mut conn = self.pool.acquire().await?;
        let rows = conn
            .conn()
            .fetch_all(
                "list expired session leases",
                "SELECT l.session_id, l.owner, l.epoch, l.expires_at FROM session_leases l \
                 JOIN sessions s ON s.id = l.session_id \
                 WHERE l.owner IS NOT NULL AND l.expires_at <= $1 \
                 AND s.status NOT IN ('completed', 'failed', 'cancelled') \
                 ORDER BY l.expires_at, l.session_id LIMIT $2",
                args![now, i64::from(limit.clamp(1, 1000))],
            )
            .await?;
        rows.iter()
            .map(|row| {
                let session_id = row.text("session_id")?;
                Ok(SessionLease {
                    owner: row.opt_text("owner")?,
                    epoch: epoch_of(row.int("epoch")?, &session_id)?,
                    expires_at: row.ts("expires_at")?,
                    session_id,
                })
            })
            .collect()
    }
}
