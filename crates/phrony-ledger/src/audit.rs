//! Audit: keyed chain heads, the start-up check and the full verifier (chains, sealed heads,
//! append-only triggers, projections re-folded from the events).
//!
//! # Keyed heads
//!
//! The event hash has no key: anyone who can write the database can edit an event and
//! recompute the rest of its chain and the `streams` head. So every append made by a ledger
//! with an [`AuditKey`] (kept outside the database) also writes, in the same transaction, the
//! stream's row in `chain_heads`: `(stream, seq, hash, mac)` with
//! `mac = lowercase_hex(HMAC-SHA256(key, "phrony.head.v1" ‖ len(stream) ‖ stream ‖ seq ‖ hash))`
//! (lengths and `seq` as 8-byte big-endian integers). The MAC covers the stored hash only, so
//! it is independent of the event hash formula. Without the key a recomputed chain cannot get
//! a head whose MAC verifies.
//!
//! # The sealed stream set
//!
//! Heads cannot show a stream that is gone with its head. The one-row `stream_set` table
//! holds the number of streams with events and the XOR of SHA-256 of their names, with
//! `mac = HMAC-SHA256(key, "phrony.stream-set.v1" ‖ count ‖ digest)`; the append that creates
//! a stream updates it in its transaction (`events::append`), sealing writes it whole, and
//! `check_stream_set` compares it with the log.
//!
//! A log is *sealed* when the `audit` stream holds an `audit.key_introduced` event (its
//! `key_id` names the key). [`crate::Ledger::start_audit`] seals an existing log the first
//! time a new key is used (after verifying every chain), and otherwise checks the triggers and
//! every stream's head against `chain_heads` (no re-fold: that is [`crate::Ledger::verify_audit`]).

use std::fmt;

use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::audit_key::{AuditKey, STREAM_SET_SHARDS};
use crate::chain::ViolationKind;
use crate::db::seal_head;
use crate::db::{Arg, Backend, Conn, Row, Tx, args};
use crate::error::{LedgerError, Result};
use crate::event_body::{AuditKeyIntroduced, AuditUnverifiedLogAllowed, EventBody, SealedHead};
use crate::events::{self, append, lock_stream};
use crate::model::{AgentRef, Event};

/// The stream that records the audit key's introduction and start-up overrides.
pub const AUDIT_STREAM: &str = "audit";

/// Event types of the [`AUDIT_STREAM`].
/// (The same strings as [`crate::event_types::AUDIT_KEY_INTRODUCED`] and
/// [`crate::event_types::AUDIT_UNVERIFIED_LOG_ALLOWED`]; the payloads are
/// [`crate::AuditKeyIntroduced`] and [`crate::AuditUnverifiedLogAllowed`].)
pub mod audit_event_types {
    use crate::event_body::event_types as body;

    /// The log was sealed with a key (`key_id, reason, streams, events, heads_digest, heads`).
    pub const KEY_INTRODUCED: &str = body::AUDIT_KEY_INTRODUCED;
    /// The daemon served a log that failed its start-up check, by explicit override
    /// (`problem, kind, stream?, seq?, triggers_restored`).
    pub const UNVERIFIED_LOG_ALLOWED: &str = body::AUDIT_UNVERIFIED_LOG_ALLOWED;
}
use audit_event_types as types;

/// How many streams are read per page by the verifiers.
const STREAM_PAGE: i64 = 500;
/// At most this many heads are listed in an `audit.key_introduced` payload (the digest covers all).
const MAX_LISTED_HEADS: usize = 1000;

/// What [`crate::Ledger::verify_audit`] covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditScope {
    /// Every stream, every projection.
    All,
    /// One session's stream and its rows in the session projections.
    Session(String),
    /// One agent's lifecycle stream and its rows in the agent projections.
    Agent(AgentRef),
}

/// What is wrong, for an [`AuditProblem`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AuditProblemKind {
    /// The hash chain does not recompute (edited, deleted, inserted or reordered event).
    Chain(ViolationKind),
    /// The stream has no sealed head: written without the audit key, or its head deleted.
    HeadMissing,
    /// The sealed head (or the `streams` head) is not the end of the log.
    HeadMismatch,
    /// The sealed head's MAC does not verify with the key: forged or recomputed, or another key.
    HeadMac,
    /// A sealed head names a stream that no longer exists (a deleted stream).
    StreamDeleted,
    /// The log has another number of streams, or other streams, than the sealed stream set:
    /// a whole stream was deleted together with its sealed head (or added without the key).
    StreamSetMismatch {
        /// Streams the sealed set counts.
        sealed: u64,
        /// Streams the log has.
        found: u64,
    },
    /// The sealed stream set's MAC does not verify with the key (forged or recomputed).
    StreamSetMac,
    /// The log was sealed with a stream set, and its record is gone.
    StreamSetMissing,
    /// The log has streams but was never sealed with the audit key.
    Unsealed,
    /// The log was sealed with a different key.
    KeyMismatch {
        /// The key id the log was sealed with.
        sealed_with: String,
    },
    /// An append-only trigger of `events` is missing, disabled or altered.
    TriggerMissing {
        /// The trigger.
        trigger: String,
    },
    /// A projection table differs from the events re-folded.
    Projection {
        /// The table.
        table: String,
        /// The row's key, `col=value, …`.
        key: String,
        /// The first differing column; `None` when the whole row is extra or missing.
        column: Option<String>,
    },
}

/// The first problem verification found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditProblem {
    /// What is wrong.
    pub kind: AuditProblemKind,
    /// The stream, when the problem is in one.
    pub stream: Option<String>,
    /// The first bad seq (for a head problem: the head's seq), when known.
    pub seq: Option<u64>,
    /// One line for a human, naming the stream, seq, table, key or column.
    pub message: String,
}

impl fmt::Display for AuditProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// The result of [`crate::Ledger::verify_audit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditReport {
    /// Events whose chain recomputed (before the first problem).
    pub events: u64,
    /// Streams checked completely.
    pub streams: u64,
    /// The first problem, `None` when everything verified.
    pub problem: Option<AuditProblem>,
}

impl AuditReport {
    /// `true` when nothing is wrong.
    #[must_use]
    pub fn is_verified(&self) -> bool {
        self.problem.is_none()
    }
}

/// The outcome of [`crate::Ledger::start_audit`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditStart {
    /// Triggers and every stream head verified.
    Verified {
        /// Streams whose head verified.
        streams: u64,
    },
    /// The log was sealed with the key now (first start with it).
    Sealed {
        /// Streams sealed.
        streams: u64,
        /// Events in them.
        events: u64,
    },
    /// The log failed: the daemon must refuse to serve it unless overridden.
    Failed(AuditProblem),
}

fn problem(
    kind: AuditProblemKind,
    stream: Option<&str>,
    seq: Option<i64>,
    message: String,
) -> AuditProblem {
    AuditProblem {
        kind,
        stream: stream.map(str::to_owned),
        seq: seq.and_then(|s| u64::try_from(s).ok()),
        message,
    }
}

// ---------------------------------------------------------------------------------------------
// Triggers.

/// The first append-only trigger that is missing, disabled or no longer refuses.
pub(crate) async fn check_triggers(
    conn: &mut Conn<'_>,
    backend: Backend,
) -> Result<Option<AuditProblem>> {
    let missing = |trigger: &str, why: &str| {
        Some(problem(
            AuditProblemKind::TriggerMissing {
                trigger: trigger.to_owned(),
            },
            None,
            None,
            format!("the append-only trigger {trigger} on events {why}: the log can be rewritten"),
        ))
    };
    match backend {
        Backend::Sqlite => {
            for (name, op) in [
                ("events_no_update", "UPDATE"),
                ("events_no_delete", "DELETE"),
            ] {
                let row = conn
                    .fetch_optional(
                        "read trigger",
                        "SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name = $1 \
                         AND tbl_name = 'events'",
                        args![name],
                    )
                    .await?;
                let Some(row) = row else {
                    return Ok(missing(name, "is missing"));
                };
                let sql: String = row.opt_text("sql")?.unwrap_or_default();
                let flat = sql.split_whitespace().collect::<Vec<_>>().join(" ");
                if !flat.contains(&format!("BEFORE {op} ON events"))
                    || !flat.contains("RAISE(ABORT")
                {
                    return Ok(missing(name, "was altered"));
                }
            }
        }
        Backend::Postgres => {
            let proc_ok = conn
                .fetch_optional(
                    "read trigger function",
                    "SELECT prosrc FROM pg_catalog.pg_proc p \
                     JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace \
                     WHERE p.proname = 'phrony_events_append_only' AND n.nspname = current_schema()",
                    vec![],
                )
                .await?
                .map(|r| r.text("prosrc"))
                .transpose()?
                .is_some_and(|src| src.contains("RAISE EXCEPTION"));
            for name in ["events_no_update_delete", "events_no_truncate"] {
                let row = conn
                    .fetch_optional(
                        "read trigger",
                        "SELECT CAST(t.tgenabled AS TEXT) AS enabled, p.proname::text AS function \
                         FROM pg_catalog.pg_trigger t \
                         JOIN pg_catalog.pg_class c ON c.oid = t.tgrelid \
                         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
                         JOIN pg_catalog.pg_proc p ON p.oid = t.tgfoid \
                         WHERE c.relname = 'events' AND n.nspname = current_schema() \
                         AND t.tgname = $1",
                        args![name],
                    )
                    .await?;
                let Some(row) = row else {
                    return Ok(missing(name, "is missing"));
                };
                if row.text("enabled")? == "D" {
                    return Ok(missing(name, "is disabled"));
                }
                if row.text("function")? != "phrony_events_append_only" || !proc_ok {
                    return Ok(missing(name, "was altered"));
                }
            }
        }
    }
    Ok(None)
}

/// Re-creates the append-only triggers (recovery after an override).
async fn restore_triggers(conn: &mut Conn<'_>, backend: Backend) -> Result<()> {
    let statements: &[&str] = match backend {
        Backend::Sqlite => &[
            "DROP TRIGGER IF EXISTS events_no_update",
            "DROP TRIGGER IF EXISTS events_no_delete",
            "CREATE TRIGGER events_no_update BEFORE UPDATE ON events BEGIN \
             SELECT RAISE(ABORT, 'events are append-only: UPDATE refused'); END",
            "CREATE TRIGGER events_no_delete BEFORE DELETE ON events BEGIN \
             SELECT RAISE(ABORT, 'events are append-only: DELETE refused'); END",
        ],
        Backend::Postgres => &[
            "CREATE OR REPLACE FUNCTION phrony_events_append_only() RETURNS trigger \
             LANGUAGE plpgsql AS $$ BEGIN \
             RAISE EXCEPTION 'events are append-only: % refused', TG_OP; END $$",
            "DROP TRIGGER IF EXISTS events_no_update_delete ON events",
            "DROP TRIGGER IF EXISTS events_no_truncate ON events",
            "CREATE TRIGGER events_no_update_delete BEFORE UPDATE OR DELETE ON events \
             FOR EACH ROW EXECUTE FUNCTION phrony_events_append_only()",
            "CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events \
             FOR EACH STATEMENT EXECUTE FUNCTION phrony_events_append_only()",
        ],
    };
    for sql in statements {
        conn.execute("restore append-only triggers", sql, vec![])
            .await?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Heads.

const HEADS_SELECT: &str = "SELECT s.stream, s.last_seq, s.last_hash, h.seq AS h_seq, \
     h.hash AS h_hash, h.mac AS h_mac, \
     (SELECT MAX(e.seq) FROM events e WHERE e.stream = s.stream) AS e_max, \
     (SELECT e.hash FROM events e WHERE e.stream = s.stream AND e.seq = s.last_seq) AS e_hash \
     FROM streams s LEFT JOIN chain_heads h ON h.stream = s.stream";

/// Checks one row of [`HEADS_SELECT`]: the log ends at the `streams` head, which is the sealed
/// head, whose MAC verifies.
fn head_problem(row: &Row, key: &AuditKey) -> Result<Option<AuditProblem>> {
    let stream = row.text("stream")?;
    let last_seq = row.int("last_seq")?;
    let last_hash = row.text("last_hash")?;
    let e_max = row.opt_int("e_max")?.unwrap_or(0);
    let s = Some(stream.as_str());
    if e_max != last_seq {
        return Ok(Some(problem(
            AuditProblemKind::HeadMismatch,
            s,
            Some(e_max.min(last_seq) + 1),
            format!(
                "stream {stream}: the log ends at seq {e_max} but its head records seq {last_seq}"
            ),
        )));
    }
    if last_seq > 0 && row.opt_text("e_hash")?.as_deref() != Some(last_hash.as_str()) {
        return Ok(Some(problem(
            AuditProblemKind::HeadMismatch,
            s,
            Some(last_seq),
            format!(
                "stream {stream} seq {last_seq}: the event's hash differs from the stream head"
            ),
        )));
    }
    let (Some(h_seq), Some(h_hash), Some(h_mac)) = (
        row.opt_int("h_seq")?,
        row.opt_text("h_hash")?,
        row.opt_text("h_mac")?,
    ) else {
        return Ok(Some(problem(
            AuditProblemKind::HeadMissing,
            s,
            Some(last_seq),
            format!(
                "stream {stream}: no sealed head (written without the audit key, or its sealed \
                 head was deleted)"
            ),
        )));
    };
    if h_seq != last_seq || h_hash != last_hash {
        return Ok(Some(problem(
            AuditProblemKind::HeadMismatch,
            s,
            Some(h_seq.min(last_seq).max(1)),
            format!(
                "stream {stream}: the sealed head is seq {h_seq} hash {h_hash} but the log ends \
                 at seq {last_seq} hash {last_hash} (the log was rewritten or appended to \
                 without the audit key)"
            ),
        )));
    }
    if !key.verifies(&stream, h_seq, &h_hash, &h_mac) {
        return Ok(Some(problem(
            AuditProblemKind::HeadMac,
            s,
            Some(h_seq),
            format!(
                "stream {stream} seq {h_seq}: the head's MAC does not verify with the audit key \
                 (the chain was recomputed and its head forged, or this is not the key the log \
                 was sealed with)"
            ),
        )));
    }
    Ok(None)
}

/// The first stream whose head fails, over every stream (paged), then sealed heads of streams
/// that no longer exist. Returns the number of streams checked.
async fn check_all_heads(
    conn: &mut Conn<'_>,
    key: &AuditKey,
) -> Result<(u64, Option<AuditProblem>)> {
    let mut after = String::new();
    let mut checked = 0;
    loop {
        let sql = format!("{HEADS_SELECT} WHERE s.stream > $1 ORDER BY s.stream LIMIT $2");
        let rows = conn
            .fetch_all("read stream heads", &sql, args![&after, STREAM_PAGE])
            .await?;
        for row in &rows {
            if let Some(p) = head_problem(row, key)? {
                return Ok((checked, Some(p)));
            }
            checked += 1;
        }
        match rows.last() {
            Some(last) if i64::try_from(rows.len()).unwrap_or(i64::MAX) == STREAM_PAGE => {
                after = last.text("stream")?;
            }
            _ => break,
        }
    }
    Ok((checked, deleted_stream(conn).await?))
}

/// What [`check_stream_set`] found.
enum StreamSet {
    /// The sealed set is the log's set of streams.
    Verified,
    /// The sealed set is the log's set of streams, in the single row of a build before
    /// migration 0024 (the start-up check shards it).
    VerifiedSingleRow,
    /// No stream set was sealed yet (a log sealed before migration 0007).
    NotSealed,
    /// The set is missing, forged, or not the log's.
    Problem(AuditProblem),
}

/// The log's streams (those with at least one event), by shard of the stream set.
async fn log_stream_set(
    conn: &mut Conn<'_>,
) -> Result<[events::StreamSetShard; STREAM_SET_SHARDS]> {
    let mut shards: [events::StreamSetShard; STREAM_SET_SHARDS] = Default::default();
    let mut after = String::new();
    loop {
        let names: Vec<String> = conn
            .fetch_all(
                "list streams for the stream set",
                "SELECT stream FROM streams WHERE stream > $1 AND last_seq > 0 \
                 ORDER BY stream LIMIT $2",
                args![&after, STREAM_PAGE],
            )
            .await?
            .iter()
            .map(|r| r.text("stream"))
            .collect::<Result<_>>()?;
        for name in &names {
            let shard = &mut shards[events::stream_set_shard(name)];
            *shard = shard.with(name)?;
        }
        match names.last() {
            Some(last) if i64::try_from(names.len()).unwrap_or(0) == STREAM_PAGE => {
                after.clone_from(last);
            }
            _ => break,
        }
    }
    Ok(shards)
}

/// The shards combined into one set (the digest is an XOR, so the shards' digests combine).
fn whole_set(shards: &[events::StreamSetShard]) -> Result<events::StreamSetShard> {
    let mut bytes = [0_u8; 32];
    let mut streams = 0;
    for shard in shards {
        streams = shard.streams.saturating_add(streams);
        let digest = hex::decode(&shard.digest)
            .ok()
            .filter(|d| d.len() == 32)
            .ok_or_else(|| {
                LedgerError::corrupt(format!(
                    "stream set digest {:?} is not 32 hex bytes",
                    shard.digest
                ))
            })?;
        for (b, d) in bytes.iter_mut().zip(digest) {
            *b ^= d;
        }
    }
    Ok(events::StreamSetShard {
        streams,
        digest: hex::encode(bytes),
    })
}

/// Compares the streams of the log (those with at least one event) with the sealed stream set,
/// shard by shard: each shard's MAC, count and digest of the names, and that no shard is
/// missing. Names a stream listed in the latest `audit.key_introduced` that the log no longer
/// has, when there is one. A set still in the single row of a build before migration 0024 is
/// compared whole, unless the log was sealed with shards since (a replayed old row).
async fn check_stream_set(conn: &mut Conn<'_>, key: &AuditKey) -> Result<StreamSet> {
    let rows = conn
        .fetch_all(
            "read the stream set",
            "SELECT shard, streams, digest, mac FROM stream_set_shards ORDER BY shard",
            vec![],
        )
        .await?;
    let introduced = latest_key_introduced(conn).await?;
    if rows.is_empty() {
        return check_single_row_set(conn, key, introduced).await;
    }
    let mut sealed: [Option<events::StreamSetShard>; STREAM_SET_SHARDS] = Default::default();
    for row in &rows {
        let number = row.int("shard")?;
        let (streams, digest, mac) = (row.int("streams")?, row.text("digest")?, row.text("mac")?);
        let shard = usize::try_from(number).ok().filter(|&n| {
            n < STREAM_SET_SHARDS && key.stream_set_shard_verifies(n, streams, &digest, &mac)
        });
        let Some(shard) = shard else {
            return Ok(StreamSet::Problem(problem(
                AuditProblemKind::StreamSetMac,
                None,
                None,
                format!(
                    "shard {number} of the sealed stream set ({streams} streams) does not verify \
                     with the audit key (forged, recomputed or moved, or another key)"
                ),
            )));
        };
        sealed[shard] = Some(events::StreamSetShard { streams, digest });
    }
    if let Some(gone) = sealed.iter().position(Option::is_none) {
        return Ok(StreamSet::Problem(problem(
            AuditProblemKind::StreamSetMissing,
            None,
            None,
            format!(
                "shard {gone} of the sealed stream set (table stream_set_shards) is gone: \
                 streams may have been deleted with their sealed heads"
            ),
        )));
    }
    let sealed: Vec<events::StreamSetShard> = sealed.into_iter().flatten().collect();
    let found = log_stream_set(conn).await?;
    match sealed.iter().zip(&found).position(|(s, f)| s != f) {
        None => Ok(StreamSet::Verified),
        Some(shard) => {
            let (sealed, found) = (whole_set(&sealed)?, whole_set(&found)?);
            let p = mismatch(
                conn,
                introduced,
                &sealed,
                &found,
                &format!(" in shard {shard}"),
            )
            .await?;
            Ok(StreamSet::Problem(p))
        }
    }
}

/// [`check_stream_set`] of a log without shards: not sealed with a set (before migration
/// 0007), sealed with the single row of a build before migration 0024, or its set deleted.
async fn check_single_row_set(
    conn: &mut Conn<'_>,
    key: &AuditKey,
    introduced: Option<AuditKeyIntroduced>,
) -> Result<StreamSet> {
    let sealed_in_shards = introduced.as_ref().is_some_and(|i| i.stream_set_shards > 0);
    let row = if sealed_in_shards {
        // A single row cannot stand in for shards the log was sealed with (an old row replayed).
        None
    } else {
        conn.fetch_optional(
            "read the single-row stream set",
            "SELECT streams, digest, mac FROM stream_set WHERE id = 1",
            vec![],
        )
        .await?
    };
    let Some(row) = row else {
        return Ok(
            if introduced.is_some_and(|i| i.stream_set_sealed || i.stream_set_shards > 0) {
                StreamSet::Problem(problem(
                    AuditProblemKind::StreamSetMissing,
                    None,
                    None,
                    "the sealed stream set (table stream_set_shards) is gone: streams may have \
                     been deleted with their sealed heads"
                        .to_owned(),
                ))
            } else {
                StreamSet::NotSealed
            },
        );
    };
    let sealed = events::StreamSetShard {
        streams: row.int("streams")?,
        digest: row.text("digest")?,
    };
    if !key.stream_set_verifies(sealed.streams, &sealed.digest, &row.text("mac")?) {
        return Ok(StreamSet::Problem(problem(
            AuditProblemKind::StreamSetMac,
            None,
            None,
            format!(
                "the sealed stream set ({} streams) does not verify with the audit key \
                 (forged or recomputed, or another key)",
                sealed.streams
            ),
        )));
    }
    let found = whole_set(&log_stream_set(conn).await?)?;
    if found == sealed {
        return Ok(StreamSet::VerifiedSingleRow);
    }
    Ok(StreamSet::Problem(
        mismatch(conn, introduced, &sealed, &found, "").await?,
    ))
}

/// The problem of a log whose streams are not the sealed set's: names a stream the latest key
/// introduction listed that the log no longer has, when there is one.
async fn mismatch(
    conn: &mut Conn<'_>,
    introduced: Option<AuditKeyIntroduced>,
    sealed: &events::StreamSetShard,
    found: &events::StreamSetShard,
    where_: &str,
) -> Result<AuditProblem> {
    let mut named = None;
    for head in introduced.map(|i| i.heads).unwrap_or_default() {
        let exists = conn
            .fetch_optional(
                "check a sealed stream",
                "SELECT 1 AS one FROM streams WHERE stream = $1 AND last_seq > 0",
                args![&head.stream],
            )
            .await?
            .is_some();
        if !exists {
            named = Some(head.stream);
            break;
        }
    }
    let which = named.as_ref().map_or_else(String::new, |s| {
        format!(" (stream {s}, sealed when the key was introduced, is gone)")
    });
    let (count, found) = (sealed.streams, found.streams);
    Ok(problem(
        AuditProblemKind::StreamSetMismatch {
            sealed: u64::try_from(count).unwrap_or(0),
            found: u64::try_from(found).unwrap_or(0),
        },
        named.as_deref(),
        None,
        format!(
            "the log has {found} streams but the sealed stream set has {count}, or other \
             names{where_}{which}: a whole stream was deleted together with its sealed head, or \
             one was added without the audit key"
        ),
    ))
}

async fn deleted_stream(conn: &mut Conn<'_>) -> Result<Option<AuditProblem>> {
    let row = conn
        .fetch_optional(
            "find deleted streams",
            "SELECT h.stream, h.seq FROM chain_heads h \
             WHERE NOT EXISTS (SELECT 1 FROM streams s WHERE s.stream = h.stream) \
             ORDER BY h.stream LIMIT 1",
            vec![],
        )
        .await?;
    row.map(|r| {
        let stream = r.text("stream")?;
        let seq = r.int("seq")?;
        Ok(problem(
            AuditProblemKind::StreamDeleted,
            Some(&stream),
            Some(1),
            format!("stream {stream}: sealed at seq {seq} but no longer in the log (deleted)"),
        ))
    })
    .transpose()
}

async fn check_one_head(
    conn: &mut Conn<'_>,
    key: &AuditKey,
    stream: &str,
) -> Result<Option<AuditProblem>> {
    let sql = format!("{HEADS_SELECT} WHERE s.stream = $1");
    match conn
        .fetch_optional("read stream head", &sql, args![stream])
        .await?
    {
        Some(row) => head_problem(&row, key),
        None => Err(LedgerError::not_found(format!(
            "event stream {stream} not found"
        ))),
    }
}

/// The key id recorded by the latest `audit.key_introduced`, if the log is sealed.
async fn sealed_key_id(conn: &mut Conn<'_>) -> Result<Option<String>> {
    Ok(latest_key_introduced(conn).await?.map(|p| p.key_id))
}

/// The latest `audit.key_introduced`, if the log is sealed.
async fn latest_key_introduced(conn: &mut Conn<'_>) -> Result<Option<AuditKeyIntroduced>> {
    let row = conn
        .fetch_optional(
            "read audit key introduction",
            "SELECT seq, payload FROM events WHERE stream = $1 AND type = $2 \
             ORDER BY seq DESC LIMIT 1",
            args![AUDIT_STREAM, types::KEY_INTRODUCED],
        )
        .await?;
    let Some(row) = row else { return Ok(None) };
    let payload: Value = serde_json::from_str(&row.text("payload")?)
        .map_err(|e| LedgerError::corrupt(format!("audit.key_introduced payload: {e}")))?;
    let seq = u64::try_from(row.int("seq")?).unwrap_or(0);
    match EventBody::decode(AUDIT_STREAM, seq, types::KEY_INTRODUCED, &payload)? {
        EventBody::AuditKeyIntroduced(p) => Ok(Some(p)),
        other => Err(LedgerError::corrupt(format!(
            "audit stream seq {seq}: {} where audit.key_introduced was read",
            other.event_type()
        ))),
    }
}

async fn count(conn: &mut Conn<'_>, context: &'static str, sql: &str) -> Result<i64> {
    conn.fetch_optional(context, sql, vec![])
        .await?
        .map_or(Ok(0), |r| r.int("n"))
}

/// Seals every stream's current head with `key` (and drops sealed heads of streams that no
/// longer exist), then records `audit.key_introduced`. With `verify_chains`, every chain must
/// recompute first (the problem is returned and nothing is written otherwise).
async fn seal_all(
    tx: &mut Tx,
    key: &AuditKey,
    reason: &str,
    verify_chains: bool,
) -> Result<std::result::Result<(u64, u64), AuditProblem>> {
    // The events and heads this write appended (an override's event) are read below.
    tx.write_appends().await?;
    let mut digest = Sha256::new();
    let mut listed = Vec::new();
    let (mut streams, mut total_events) = (0_u64, 0_u64);
    let mut set: [events::StreamSetShard; STREAM_SET_SHARDS] = Default::default();
    let mut after = String::new();
    loop {
        let rows = tx
            .conn()
            .fetch_all(
                "list streams",
                "SELECT stream, last_seq, last_hash FROM streams WHERE stream > $1 \
                 ORDER BY stream LIMIT $2",
                args![&after, STREAM_PAGE],
            )
            .await?;
        for row in &rows {
            let stream = row.text("stream")?;
            let seq = row.int("last_seq")?;
            let hash = row.text("last_hash")?;
            if verify_chains {
                let report = events::verify(&mut tx.conn(), &stream).await?;
                if let Some(v) = report.violation {
                    return Ok(Err(chain_problem(&stream, v)));
                }
            }
            seal_head(&mut tx.conn(), key, &stream, seq, &hash).await?;
            if seq > 0 {
                let shard = &mut set[events::stream_set_shard(&stream)];
                *shard = shard.with(&stream)?;
            }
            digest.update(format!("{stream}\n{seq}\n{hash}\n").as_bytes());
            if listed.len() < MAX_LISTED_HEADS {
                listed.push(SealedHead { stream, seq, hash });
            }
            streams += 1;
            total_events += u64::try_from(seq).unwrap_or(0);
        }
        match rows.last() {
            Some(last) if i64::try_from(rows.len()).unwrap_or(i64::MAX) == STREAM_PAGE => {
                after = last.text("stream")?;
            }
            _ => break,
        }
    }
    let dropped = tx
        .conn()
        .execute(
            "drop heads of deleted streams",
            "DELETE FROM chain_heads WHERE NOT EXISTS \
             (SELECT 1 FROM streams s WHERE s.stream = chain_heads.stream)",
            vec![],
        )
        .await?;
    let body = EventBody::AuditKeyIntroduced(AuditKeyIntroduced {
        key_id: key.key_id(),
        reason: reason.to_owned(),
        streams,
        events: total_events,
        heads_digest: hex::encode(digest.finalize()),
        heads: listed,
        heads_listed_all: usize::try_from(streams).is_ok_and(|n| n <= MAX_LISTED_HEADS),
        dropped_heads: dropped,
        stream_set_sealed: true,
        stream_set_shards: u64::try_from(STREAM_SET_SHARDS).unwrap_or(u64::MAX),
    });
    // Sealed before the audit event: a first seal creates the audit stream, which its own
    // first append then adds to the set.
    events::write_stream_set(&mut tx.conn(), key, &set).await?;
    append_audit_event(tx, body).await?;
    Ok(Ok((streams, total_events)))
}

async fn append_audit_event(tx: &mut Tx, body: EventBody) -> Result<Event> {
    let mut head = lock_stream(tx, AUDIT_STREAM).await?;
    append(tx, &mut head, body.into_new_event("system")?).await
}

fn chain_problem(stream: &str, v: crate::chain::ChainViolation) -> AuditProblem {
    AuditProblem {
        kind: AuditProblemKind::Chain(v.kind),
        stream: Some(stream.to_owned()),
        seq: Some(v.seq),
        message: v.message,
    }
}

/// What [`start_check`] decided: the check's outcome, or a seal the log needs written.
pub(crate) enum StartCheck {
    Done(AuditStart),
    Seal {
        reason: &'static str,
        /// Every chain must recompute first (a log never sealed).
        verify_chains: bool,
        /// The streams whose heads verified (`None`: a first seal, [`AuditStart::Sealed`]).
        verified: Option<u64>,
    },
}

/// The start-up check, read-only (see [`crate::Ledger::start_audit`]); run on one consistent
/// state of the log.
pub(crate) async fn start_check(
    conn: &mut Conn<'_>,
    backend: Backend,
    key: &AuditKey,
    key_is_new: bool,
) -> Result<StartCheck> {
    if let Some(p) = check_triggers(conn, backend).await? {
        return Ok(StartCheck::Done(AuditStart::Failed(p)));
    }
    let Some(sealed_with) = sealed_key_id(conn).await? else {
        let heads = count(
            conn,
            "count sealed heads",
            "SELECT COUNT(*) AS n FROM chain_heads",
        )
        .await?;
        let streams = count(conn, "count streams", "SELECT COUNT(*) AS n FROM streams").await?;
        if heads == 0 && (streams == 0 || key_is_new) {
            return Ok(StartCheck::Seal {
                reason: "first start with an audit key",
                verify_chains: true,
                verified: None,
            });
        }
        return Ok(StartCheck::Done(AuditStart::Failed(problem(
            AuditProblemKind::Unsealed,
            Some(AUDIT_STREAM),
            None,
            format!(
                "the log has {streams} streams but no record of being sealed with an audit key \
                 (the audit stream was removed, or an existing key file was given to a log it \
                 never sealed)"
            ),
        ))));
    };
    if sealed_with != key.key_id() {
        return Ok(StartCheck::Done(AuditStart::Failed(problem(
            AuditProblemKind::KeyMismatch {
                sealed_with: sealed_with.clone(),
            },
            Some(AUDIT_STREAM),
            None,
            format!(
                "the audit key (id {}) is not the key this log was sealed with (id {sealed_with})",
                key.key_id()
            ),
        ))));
    }
    let (streams, p) = check_all_heads(conn, key).await?;
    if let Some(p) = p {
        return Ok(StartCheck::Done(AuditStart::Failed(p)));
    }
    let reason = match check_stream_set(conn, key).await? {
        StreamSet::Verified => return Ok(StartCheck::Done(AuditStart::Verified { streams })),
        StreamSet::Problem(p) => return Ok(StartCheck::Done(AuditStart::Failed(p))),
        // The single row of a build before migration 0024 is the log's set: written in shards
        // (recorded as `audit.key_introduced` with `stream_set_shards`), once.
        StreamSet::VerifiedSingleRow => "sharded the stream set (migration 0024)",
        // Sealed by a build before the stream set: every head just verified, so the set is
        // sealed now, once (recorded as `audit.key_introduced` with `stream_set_sealed`).
        StreamSet::NotSealed => "sealed the stream set (migration 0007)",
    };
    Ok(StartCheck::Seal {
        reason,
        verify_chains: false,
        verified: Some(streams),
    })
}

/// The start-up check with the seal it may write, in `tx`. On PostgreSQL, where other replicas
/// may be writing, appends are held off first (`streams` locked in `SHARE ROW EXCLUSIVE`,
/// which every append's `UPDATE` or `INSERT` waits for, and which two replicas sealing at once
/// take in turn), so the check and the seal see one state and the second replica finds the
/// log sealed: callers run [`start_check`] on a snapshot first and come here only when a seal
/// is due (once per log: its first start, or an upgrade).
pub(crate) async fn start(tx: &mut Tx, key: &AuditKey, key_is_new: bool) -> Result<AuditStart> {
    let backend = tx.backend();
    hold_off_appends(tx).await?;
    let (reason, verify_chains, verified) =
        match start_check(&mut tx.conn(), backend, key, key_is_new).await? {
            StartCheck::Done(done) => return Ok(done),
            StartCheck::Seal {
                reason,
                verify_chains,
                verified,
            } => (reason, verify_chains, verified),
        };
    Ok(match seal_all(tx, key, reason, verify_chains).await? {
        Ok((streams, events)) => match verified {
            Some(streams) => AuditStart::Verified { streams },
            None => AuditStart::Sealed { streams, events },
        },
        Err(p) => AuditStart::Failed(p),
    })
}

/// On PostgreSQL, holds off every append (on every replica) until `tx` ends, before `tx` reads
/// anything: `streams` in `SHARE ROW EXCLUSIVE`, which each append's `UPDATE` or `INSERT` of its
/// stream head waits for and which conflicts with itself (two sealing replicas take turns). A
/// seal written beside appends could otherwise record a head older than the stream's, or a
/// stream set without a stream created meanwhile. On SQLite `tx` holds the write lock already.
async fn hold_off_appends(tx: &mut Tx) -> Result<()> {
    if tx.backend() == Backend::Postgres {
        tx.conn()
            .execute(
                "hold off appends while the log is sealed",
                "LOCK TABLE streams IN SHARE ROW EXCLUSIVE MODE",
                vec![],
            )
            .await?;
    }
    Ok(())
}

/// Records an override of a failed start-up check, restores the triggers and re-seals every
/// head with `key` (see [`crate::Ledger::allow_unverified_log`]).
pub(crate) async fn allow_unverified(
    tx: &mut Tx,
    key: &AuditKey,
    failed: &AuditProblem,
    actor: &str,
) -> Result<Event> {
    let backend = tx.backend();
    hold_off_appends(tx).await?;
    let triggers_restored = check_triggers(&mut tx.conn(), backend).await?.is_some();
    if triggers_restored {
        restore_triggers(&mut tx.conn(), backend).await?;
    }
    let event = append_audit_event(
        tx,
        EventBody::AuditUnverifiedLogAllowed(AuditUnverifiedLogAllowed {
            problem: failed.message.clone(),
            kind: format!("{:?}", failed.kind),
            stream: failed.stream.clone(),
            seq: failed.seq,
            allowed_by: actor.to_owned(),
            triggers_restored,
        }),
    )
    .await?;
    seal_all(tx, key, "re-sealed after --allow-unverified-log", false)
        .await?
        .map_err(|p| LedgerError::corrupt(p.message))?;
    Ok(event)
}

// ---------------------------------------------------------------------------------------------
// Full verification.

/// Chains and sealed heads of the streams in `scope`, then the triggers. Returns the report
/// so far (the projections are compared after, in the same snapshot: [`verify`]).
pub(crate) async fn verify_streams(
    conn: &mut Conn<'_>,
    backend: Backend,
    key: &AuditKey,
    scope: &AuditScope,
) -> Result<AuditReport> {
    let mut report = AuditReport {
        events: 0,
        streams: 0,
        problem: None,
    };
    let single = match scope {
        AuditScope::All => None,
        AuditScope::Session(id) => Some(id.clone()),
        AuditScope::Agent(agent) => Some(agent.stream()),
    };
    if let Some(stream) = single {
        report.problem = verify_one(conn, key, &stream, &mut report).await?;
        if report.problem.is_none() {
            report.problem = check_triggers(conn, backend).await?;
        }
        return Ok(report);
    }
    let mut after = String::new();
    loop {
        let names: Vec<String> = conn
            .fetch_all(
                "list streams",
                "SELECT stream FROM streams WHERE stream > $1 ORDER BY stream LIMIT $2",
                args![&after, STREAM_PAGE],
            )
            .await?
            .iter()
            .map(|r| r.text("stream"))
            .collect::<Result<_>>()?;
        for stream in &names {
            if let Some(p) = verify_one(conn, key, stream, &mut report).await? {
                report.problem = Some(p);
                return Ok(report);
            }
        }
        match names.last() {
            Some(last) if i64::try_from(names.len()).unwrap_or(0) == STREAM_PAGE => {
                after.clone_from(last);
            }
            _ => break,
        }
    }
    if let Some(p) = deleted_stream(conn).await? {
        report.problem = Some(p);
        return Ok(report);
    }
    if let StreamSet::Problem(p) = check_stream_set(conn, key).await? {
        report.problem = Some(p);
        return Ok(report);
    }
    report.problem = check_triggers(conn, backend).await?;
    Ok(report)
}

/// One stream's chain (counted into `report`) and sealed head.
async fn verify_one(
    conn: &mut Conn<'_>,
    key: &AuditKey,
    stream: &str,
    report: &mut AuditReport,
) -> Result<Option<AuditProblem>> {
    let chain = events::verify(conn, stream).await?;
    report.events += chain.events_checked;
    if let Some(v) = chain.violation {
        return Ok(Some(chain_problem(stream, v)));
    }
    if let Some(p) = check_one_head(conn, key, stream).await? {
        return Ok(Some(p));
    }
    report.streams += 1;
    Ok(None)
}

/// The projection tables the events fold into, with their keys.
const PROJECTIONS: &[(&str, &[&str])] = &[
    ("agents", &["id"]),
    ("agent_versions", &["id"]),
    ("deployments", &["id"]),
    ("bundles", &["id"]),
    ("bundle_versions", &["id"]),
    ("bundle_members", &["bundle_version_id", "child_name"]),
    ("bundle_deployments", &["id"]),
    ("sessions", &["id"]),
    ("session_metadata", &["session_id", "key"]),
    ("tool_invocations", &["call_id"]),
    ("approvals", &["id"]),
    ("approval_votes", &["approval_id", "decided_by"]),
];

/// The rows of `table` in `scope` (`None`: the table is outside the scope), with its binds.
fn scope_filter(table: &str, scope: &AuditScope) -> Option<(String, Vec<Arg>)> {
    let agent_tables = [
        "agents",
        "agent_versions",
        "deployments",
        "bundles",
        "bundle_versions",
        "bundle_members",
        "bundle_deployments",
    ];
    match scope {
        AuditScope::All => Some(("1 = 1".to_owned(), Vec::new())),
        AuditScope::Session(id) => {
            let sql = match table {
                t if agent_tables.contains(&t) => return None,
                "sessions" => "\"id\" = $1",
                "approval_votes" => {
                    "\"approval_id\" IN (SELECT a.id FROM approvals a WHERE a.session_id = $1)"
                }
                _ => "\"session_id\" = $1",
            };
            Some((sql.to_owned(), args![id.as_str()]))
        }
        AuditScope::Agent(agent) => {
            let sql = match table {
                "agents" => "\"namespace\" = $1 AND \"name\" = $2",
                "agent_versions" | "deployments" => {
                    "\"agent_id\" IN (SELECT g.id FROM agents g WHERE g.namespace = $1 AND g.name = $2)"
                }
                _ => return None,
            };
            Some((
                sql.to_owned(),
                args![agent.namespace.as_str(), agent.name.as_str()],
            ))
        }
    }
}

async fn columns(conn: &mut Conn<'_>, backend: Backend, table: &str) -> Result<Vec<String>> {
    let rows = match backend {
        Backend::Sqlite => {
            conn.fetch_all(
                "read projection columns",
                "SELECT name FROM pragma_table_info($1) ORDER BY cid",
                args![table],
            )
            .await?
        }
        Backend::Postgres => {
            conn.fetch_all(
                "read projection columns",
                "SELECT column_name::text AS name FROM information_schema.columns \
                 WHERE table_schema = current_schema() AND table_name = $1 \
                 ORDER BY ordinal_position",
                args![table],
            )
            .await?
        }
    };
    rows.iter().map(|r| r.text("name")).collect()
}

/// Every table the rebuild's folds write: the projections, and what a session's end or a tool
/// call's result clears or settles (its secrets, its queued user messages, its history
/// reservations). Shadowed empty, those purges and settlements find nothing to change.
fn rebuilt_tables() -> impl Iterator<Item = &'static str> {
    PROJECTIONS.iter().map(|(t, _)| *t).chain([
        "session_secrets",
        "session_inbox",
        "history_groups",
        "history_entries",
        "history_buckets",
    ])
}

/// Shadows every table the rebuild writes with an empty temporary table of the same name and
/// definition (columns, constraints, indexes; no triggers, no foreign keys on PostgreSQL),
/// which both databases resolve before the real one, so the rebuild code folds into them
/// unchanged; then makes sure nothing else can be written: a PostgreSQL snapshot is made
/// `READ ONLY` (temporary tables may still be written), a SQLite snapshot is on a read-only
/// connection already (its `temp` schema is writable). Nothing is locked: every replica's
/// writes go on beside the comparison.
async fn shadow_rebuilt_tables(conn: &mut Conn<'_>, backend: Backend) -> Result<()> {
    for table in rebuilt_tables() {
        match backend {
            Backend::Postgres => {
                conn.execute(
                    "shadow projection",
                    &format!("CREATE TEMP TABLE {table} (LIKE {table} INCLUDING ALL)"),
                    vec![],
                )
                .await?;
            }
            Backend::Sqlite => {
                // SQLite has no `LIKE`: its stored definitions, moved to `temp` (the text is
                // normalised: `CREATE TABLE name`, `CREATE [UNIQUE] INDEX name ON table`).
                let rows = conn
                    .fetch_all(
                        "read projection definition",
                        "SELECT type, sql FROM sqlite_master WHERE tbl_name = $1 \
                         AND type IN ('table', 'index') AND sql IS NOT NULL \
                         ORDER BY type DESC",
                        args![table],
                    )
                    .await?;
                for row in &rows {
                    let ddl = row.text("sql")?;
                    let shadow = ["CREATE TABLE ", "CREATE INDEX ", "CREATE UNIQUE INDEX "]
                        .iter()
                        .find_map(|prefix| {
                            let rest = ddl.strip_prefix(prefix)?;
                            Some(if prefix.ends_with("TABLE ") {
                                format!("CREATE TEMP TABLE {rest}")
                            } else {
                                format!("{prefix}temp.{rest}")
                            })
                        })
                        .ok_or_else(|| {
                            LedgerError::corrupt(format!(
                                "table {table}: unexpected definition {ddl:?}"
                            ))
                        })?;
                    conn.execute("shadow projection", &shadow, vec![]).await?;
                }
            }
        }
    }
    if backend == Backend::Postgres {
        conn.execute(
            "make the comparison read-only",
            "SET TRANSACTION READ ONLY",
            vec![],
        )
        .await?;
    }
    Ok(())
}

/// [`crate::Ledger::verify_audit`] on one snapshot (see [`crate::db::Pool::snapshot`] with
/// temporary tables): the chains, heads, stream set and triggers, then the projections.
pub(crate) async fn verify(
    conn: &mut Conn<'_>,
    backend: Backend,
    key: &AuditKey,
    scope: &AuditScope,
) -> Result<AuditReport> {
    let mut report = verify_streams(conn, backend, key, scope).await?;
    if report.problem.is_none() {
        report.problem = compare_projections(conn, backend, scope).await?;
    }
    Ok(report)
}

/// Snapshots the stored projections into temporary tables, re-folds every projection from the
/// events with the rebuild code into temporary shadows, and names the first difference in
/// `scope`. Runs in the caller's snapshot, which it ends rolled back.
async fn compare_projections(
    c: &mut Conn<'_>,
    backend: Backend,
    scope: &AuditScope,
) -> Result<Option<AuditProblem>> {
    for (table, _) in PROJECTIONS {
        c.execute(
            "drop projection snapshot",
            &format!("DROP TABLE IF EXISTS audit_stored_{table}"),
            vec![],
        )
        .await?;
        c.execute(
            "snapshot projection",
            &format!("CREATE TEMP TABLE audit_stored_{table} AS SELECT * FROM {table}"),
            vec![],
        )
        .await?;
    }
    shadow_rebuilt_tables(c, backend).await?;
    crate::rebuild(c, backend, crate::RebuildInto::TempShadows).await?;
    for (table, keys) in PROJECTIONS {
        let Some((filter, binds)) = scope_filter(table, scope) else {
            continue;
        };
        let cols = columns(c, backend, table).await?;
        let select = cols
            .iter()
            .map(|col| format!("CAST(\"{col}\" AS TEXT) AS \"{col}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let key_list = keys
            .iter()
            .map(|k| format!("\"{k}\""))
            .collect::<Vec<_>>()
            .join(", ");
        let stored = format!("audit_stored_{table}");
        for (from, minus) in [(stored.as_str(), *table), (*table, stored.as_str())] {
            let sql = format!(
                "SELECT {key_list} FROM (SELECT {select} FROM {from} WHERE {filter} \
                 EXCEPT SELECT {select} FROM {minus} WHERE {filter}) d \
                 ORDER BY {key_list} LIMIT 1"
            );
            let Some(row) = c
                .fetch_optional("compare projection", &sql, binds.clone())
                .await?
            else {
                continue;
            };
            let key_values: Vec<Option<String>> = keys
                .iter()
                .map(|k| row.opt_text(k))
                .collect::<Result<_>>()?;
            let key_text = keys
                .iter()
                .zip(&key_values)
                .map(|(k, v)| format!("{k}={}", v.as_deref().unwrap_or("NULL")))
                .collect::<Vec<_>>()
                .join(", ");
            let by_key = keys
                .iter()
                .enumerate()
                .map(|(i, k)| format!("CAST(\"{k}\" AS TEXT) = ${}", i + 1))
                .collect::<Vec<_>>()
                .join(" AND ");
            let key_args: Vec<Arg> = key_values.iter().cloned().map(Arg::from).collect();
            let stored_row = c
                .fetch_optional(
                    "read stored projection row",
                    &format!("SELECT {select} FROM {stored} WHERE {by_key}"),
                    key_args.clone(),
                )
                .await?;
            let folded_row = c
                .fetch_optional(
                    "read re-folded projection row",
                    &format!("SELECT {select} FROM {table} WHERE {by_key}"),
                    key_args,
                )
                .await?;
            let (column, message) = match (stored_row, folded_row) {
                (Some(s), Some(f)) => {
                    let mut found = None;
                    for col in &cols {
                        let (sv, fv) = (s.opt_text(col)?, f.opt_text(col)?);
                        if sv != fv {
                            found = Some((col.clone(), sv, fv));
                            break;
                        }
                    }
                    match found {
                        Some((col, sv, fv)) => (
                            Some(col.clone()),
                            format!(
                                "projection {table} ({key_text}) column {col}: stored {}, the \
                                 events say {}",
                                shown(sv.as_deref()),
                                shown(fv.as_deref())
                            ),
                        ),
                        None => (None, format!("projection {table} ({key_text}) differs")),
                    }
                }
                (Some(_), None) => (
                    None,
                    format!("projection {table} ({key_text}): stored row that no event produces"),
                ),
                (None, _) => (
                    None,
                    format!(
                        "projection {table} ({key_text}): the events produce a row that is not stored"
                    ),
                ),
            };
            return Ok(Some(AuditProblem {
                kind: AuditProblemKind::Projection {
                    table: (*table).to_owned(),
                    key: key_text,
                    column,
                },
                stream: None,
                seq: None,
                message,
            }));
        }
    }
    Ok(None)
}

fn shown(value: Option<&str>) -> String {
    match value {
        None => "NULL".to_owned(),
        Some(v) if v.chars().count() > 80 => {
            format!("{:?}…", v.chars().take(80).collect::<String>())
        }
        Some(v) => format!("{v:?}"),
    }
}

/// One page of events for export: `(stream, seq) > after`, optionally one stream and events at
/// or after `since`, in (stream, seq) order.
pub(crate) async fn export_page(
    conn: &mut Conn<'_>,
    after: Option<(&str, i64)>,
    since: Option<chrono::DateTime<chrono::Utc>>,
    stream: Option<&str>,
    limit: i64,
) -> Result<Vec<Event>> {
    let (after_stream, after_seq) = after.unwrap_or(("", 0));
    let mut sql = format!(
        "SELECT {} FROM events WHERE (stream > $1 OR (stream = $1 AND seq > $2))",
        events::EVENT_COLUMNS
    );
    let mut binds = args![after_stream, after_seq];
    if let Some(since) = since {
        binds.push(Arg::from(since));
        sql.push_str(&format!(" AND ts >= ${}", binds.len()));
    }
    if let Some(stream) = stream {
        binds.push(Arg::from(stream));
        sql.push_str(&format!(" AND stream = ${}", binds.len()));
    }
    binds.push(Arg::from(limit));
    sql.push_str(&format!(" ORDER BY stream, seq LIMIT ${}", binds.len()));
    conn.fetch_all("export events", &sql, binds)
        .await?
        .iter()
        .map(|row| events::stored_from_row(row)?.into_event())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mac_binds_stream_seq_and_hash_and_the_key() {
        let key = AuditKey::from_bytes([7; 32]);
        let mac = key.mac("run_a", 3, &"a".repeat(64));
        assert!(key.verifies("run_a", 3, &"a".repeat(64), &mac));
        assert!(!key.verifies("run_b", 3, &"a".repeat(64), &mac));
        assert!(!key.verifies("run_a", 4, &"a".repeat(64), &mac));
        assert!(!key.verifies("run_a", 3, &"b".repeat(64), &mac));
        assert!(!key.verifies("run_a", 3, &"a".repeat(64), "not hex"));
        let other = AuditKey::from_bytes([8; 32]);
        assert!(!other.verifies("run_a", 3, &"a".repeat(64), &mac));
        assert_ne!(key.key_id(), other.key_id());
        assert!(!format!("{key:?}").contains("0707"));
    }

    /// The typed audit bodies store exactly the bytes the raw `json!` payloads of the build
    /// before them stored (canonical JSON, so every hash of an existing audit stream stays), and
    /// those stored payloads decode into the typed bodies.
    #[test]
    fn typed_audit_payloads_are_the_bytes_earlier_builds_wrote() {
        use crate::chain::canonical_json;
        let (stream, seq, hash) = ("run_a".to_owned(), 3_i64, "a".repeat(64));
        // The literal earlier builds wrote (audit.rs before the typed bodies).
        let written = serde_json::json!({
            "key_id": "0011223344556677",
            "reason": "first start with an audit key",
            "streams": 2_u64,
            "events": 5_u64,
            "heads_digest": "f".repeat(64),
            "heads": [serde_json::json!({"stream": stream, "seq": seq, "hash": hash})],
            "heads_listed_all": true,
            "dropped_heads": 0_u64,
        });
        let typed = EventBody::AuditKeyIntroduced(AuditKeyIntroduced {
            key_id: "0011223344556677".into(),
            reason: "first start with an audit key".into(),
            streams: 2,
            events: 5,
            heads_digest: "f".repeat(64),
            heads: vec![SealedHead { stream, seq, hash }],
            heads_listed_all: true,
            dropped_heads: 0,
            // Events of builds before the stream set omit it; it stays omitted when false.
            stream_set_sealed: false,
            stream_set_shards: 0,
        });
        assert_eq!(
            canonical_json(&typed.payload().unwrap()),
            canonical_json(&written)
        );
        assert_eq!(
            EventBody::decode(AUDIT_STREAM, 1, types::KEY_INTRODUCED, &written).unwrap(),
            typed
        );

        for (stream, seq) in [(Some("run_b".to_owned()), Some(4_u64)), (None, None)] {
            let written = serde_json::json!({
                "problem": "stream run_b: the sealed head is missing",
                "kind": "HeadMissing",
                "stream": stream,
                "seq": seq,
                "allowed_by": "operator",
                "triggers_restored": false,
            });
            let typed = EventBody::AuditUnverifiedLogAllowed(AuditUnverifiedLogAllowed {
                problem: "stream run_b: the sealed head is missing".into(),
                kind: "HeadMissing".into(),
                stream,
                seq,
                allowed_by: "operator".into(),
                triggers_restored: false,
            });
            assert_eq!(
                canonical_json(&typed.payload().unwrap()),
                canonical_json(&written),
                "absent stream/seq stay null, as first written"
            );
            assert_eq!(
                EventBody::decode(AUDIT_STREAM, 2, types::UNVERIFIED_LOG_ALLOWED, &written)
                    .unwrap(),
                typed
            );
        }
    }
}
