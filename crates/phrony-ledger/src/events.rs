//! Appending to and reading the hash-chained event log.

use crate::audit_key::{AuditKey, STREAM_SET_SHARDS};
use crate::chain::{
    ChainVerifier, GENESIS_HASH, HashInput, StoredEvent, canonical_json, event_hash,
};
use crate::db::{Arg, Backend, Conn, EVENT_ROW_COLUMNS, Row, Tx, args};
use crate::error::{LedgerError, Result};
use crate::event_body::EventBody;
use crate::model::{Event, NewEvent, VerifyReport, recorded_verification};
use crate::rows::{self, SessionHead};
use crate::vocabulary::SessionStatus;
use phrony_auth::Verification;
use serde_json::Value;
use uuid::Uuid;

/// Writes the outbox and delivery rows of the notifying events among `events` (the rows just
/// appended to `stream`), in the caller's transaction. Returns whether it wrote any.
async fn enqueue_notifications<'a>(
    tx: &mut Tx,
    stream: &str,
    events: impl Iterator<Item = (i64, &'a str, &'a Value)>,
) -> Result<bool> {
    let Some(outbox) = tx.outbox() else {
        return Ok(false);
    };
    let now = tx.now();
    let mut wrote = false;
    for (seq, event_type, payload) in events {
        if !crate::outbox::NOTIFYING_TYPES.contains(&event_type) {
            continue;
        }
        let body = EventBody::decode(
            stream,
            u64::try_from(seq).unwrap_or_default(),
            event_type,
            payload,
        )?;
        let Some(kind) = crate::outbox::notification(&body) else {
            continue;
        };
        let targets: Vec<&str> = outbox
            .routes
            .iter()
            .filter(|r| r.kinds.contains(&kind))
            .map(|r| r.name.as_str())
            .collect();
        if targets.is_empty() {
            continue;
        }
        let outbox_id = Uuid::new_v4();
        let mut conn = tx.conn();
        conn.execute(
            "insert webhook outbox row",
            "INSERT INTO webhook_outbox (id, stream, seq, kind, created_at) \
             VALUES ($1, $2, $3, $4, $5)",
            args![outbox_id, stream, seq, kind.as_str(), now],
        )
        .await?;
        for webhook in targets {
            conn.execute(
                "insert webhook delivery",
                "INSERT INTO webhook_deliveries (id, outbox_id, webhook, status, attempts, \
                 next_attempt_at, updated_at) VALUES ($1, $2, $3, 'pending', 0, $4, $4)",
                args![Uuid::new_v4(), outbox_id, webhook, now],
            )
            .await?;
        }
        wrote = true;
    }
    Ok(wrote)
}

/// Page size used when streaming a log for verification or replay.
pub(crate) const PAGE: i64 = 500;

/// The locked head of one stream inside a write transaction.
#[derive(Debug)]
pub(crate) struct StreamHead {
    pub(crate) stream: String,
    pub(crate) last_seq: i64,
    pub(crate) last_hash: String,
}

/// Creates the stream if needed and locks its head row until the transaction ends, so that
/// appends to one stream are serialised across connections, pools and processes.
///
/// PostgreSQL: `SELECT … FOR UPDATE` on the `streams` row (after an
/// `INSERT … ON CONFLICT DO NOTHING`, which itself waits for a concurrent creator).
/// SQLite: the transaction already holds the database write lock (`BEGIN IMMEDIATE`). The head
/// returned is the one this transaction advanced the stream to, when it appended to it before.
pub(crate) async fn lock_stream(tx: &mut Tx, stream: &str) -> Result<StreamHead> {
    let sql = match tx.backend() {
        Backend::Postgres => "SELECT last_seq, last_hash FROM streams WHERE stream = $1 FOR UPDATE",
        Backend::Sqlite => "SELECT last_seq, last_hash FROM streams WHERE stream = $1",
    };
    let now = tx.now();
    let mut conn = tx.conn();
    // The common case (the stream exists) costs one round trip.
    let mut row = conn
        .fetch_optional("lock stream", sql, args![stream])
        .await?;
    if row.is_none() {
        let ts = now;
        conn.execute(
            "create stream",
            "INSERT INTO streams (stream, last_seq, last_hash, created_at, updated_at) \
             VALUES ($1, 0, $2, $3, $3) ON CONFLICT (stream) DO NOTHING",
            args![stream, GENESIS_HASH, ts],
        )
        .await?;
        row = conn
            .fetch_optional("lock stream", sql, args![stream])
            .await?;
    }
    let row =
        row.ok_or_else(|| LedgerError::corrupt(format!("stream {stream} vanished while locking")))?;
    Ok(head_in_write(
        tx,
        StreamHead {
            stream: stream.to_owned(),
            last_seq: row.int("last_seq")?,
            last_hash: row.text("last_hash")?,
        },
    ))
}

/// `stored`, the head a write read from `streams`, or the head the write itself advanced it to
/// and has not written yet ([`Tx::append_on_commit`]).
fn head_in_write(tx: &Tx, stored: StreamHead) -> StreamHead {
    match tx.pending_head(&stored.stream) {
        Some((seq, hash)) => StreamHead {
            last_seq: seq,
            last_hash: hash.to_owned(),
            stream: stored.stream,
        },
        None => stored,
    }
}

/// [`lock_stream`] of a session's stream and [`rows::require_session_head`] in one statement:
/// the stream's head row, locked (PostgreSQL: `FOR UPDATE OF` it alone), and the session's
/// status and agent version read under that lock. A session's stream exists from the session's
/// create on, so a missing stream is a missing session (`NotFound`), as is a stream without a
/// session row (a raw append's).
pub(crate) async fn lock_session(
    tx: &mut Tx,
    session_id: &str,
) -> Result<(StreamHead, SessionHead)> {
    let sql = match tx.backend() {
        Backend::Postgres => {
            "SELECT s.last_seq, s.last_hash, x.status, x.agent_version_id \
             FROM streams s LEFT JOIN sessions x ON x.id = $1 WHERE s.stream = $1 \
             FOR UPDATE OF s"
        }
        Backend::Sqlite => {
            "SELECT s.last_seq, s.last_hash, x.status, x.agent_version_id \
             FROM streams s LEFT JOIN sessions x ON x.id = $1 WHERE s.stream = $1"
        }
    };
    let row = tx
        .conn()
        .fetch_optional("lock session stream", sql, args![session_id])
        .await?
        .ok_or_else(|| rows::session_not_found(session_id))?;
    let Some(status) = row.opt_text("status")? else {
        return Err(rows::session_not_found(session_id));
    };
    let session = SessionHead {
        status: SessionStatus::parse_stored(&status)?,
        agent_version_id: row.uuid("agent_version_id")?,
    };
    let head = head_in_write(
        tx,
        StreamHead {
            stream: session_id.to_owned(),
            last_seq: row.int("last_seq")?,
            last_hash: row.text("last_hash")?,
        },
    );
    Ok((head, session))
}

/// [`lock_stream`] for a stream that is expected to be new (a session being created): one
/// `INSERT … ON CONFLICT DO NOTHING RETURNING` creates it and holds it (PostgreSQL: the new
/// row stays locked until the transaction ends; SQLite: the write lock) — one statement where
/// [`lock_stream`] needs three for a new stream. A stream that already exists is locked and
/// read by [`lock_stream`] (its head then tells the caller it is not new).
pub(crate) async fn create_or_lock_stream(tx: &mut Tx, stream: &str) -> Result<StreamHead> {
    let now = tx.now();
    let created = tx
        .conn()
        .fetch_optional(
            "create stream",
            "INSERT INTO streams (stream, last_seq, last_hash, created_at, updated_at) \
             VALUES ($1, 0, $2, $3, $3) ON CONFLICT (stream) DO NOTHING \
             RETURNING last_seq, last_hash",
            args![stream, GENESIS_HASH, now],
        )
        .await?;
    match created {
        Some(row) => Ok(StreamHead {
            stream: stream.to_owned(),
            last_seq: row.int("last_seq")?,
            last_hash: row.text("last_hash")?,
        }),
        None => lock_stream(tx, stream).await,
    }
}

/// Appends one event to a locked stream and advances the head.
pub(crate) async fn append(tx: &mut Tx, head: &mut StreamHead, event: NewEvent) -> Result<Event> {
    let mut appended = append_batch(tx, head, vec![event]).await?;
    appended
        .pop()
        .ok_or_else(|| LedgerError::corrupt("an append of one event returned none"))
}

/// One chained row of a batch, ready to insert.
struct ChainedRow {
    seq: i64,
    ts: chrono::DateTime<chrono::Utc>,
    payload_text: String,
    turn: Option<i64>,
    verification: Option<Verification>,
    via: Option<String>,
    prev_hash: String,
    hash: String,
    event: NewEvent,
}

/// The binds of `chunk`'s rows for an `INSERT INTO events ({EVENT_COLUMNS})`, in order,
/// [`EVENT_ROW_COLUMNS`] per row.
fn event_binds(stream: &str, chunk: &[ChainedRow]) -> Vec<Arg> {
    let mut binds = Vec::with_capacity(chunk.len() * EVENT_ROW_COLUMNS);
    for row in chunk {
        binds.extend(args![
            stream,
            row.seq,
            &row.event.event_type,
            row.ts,
            &row.event.actor.actor,
            row.event.call_id.clone(),
            row.turn,
            row.payload_text.clone(),
            &row.prev_hash,
            &row.hash,
            row.verification.map(Verification::as_str),
            row.via.clone()
        ]);
    }
    binds
}

/// Appends `events` to a locked stream, in order, chained one after the other: the rows and
/// the new head are written when the transaction commits, with its other appends to the
/// stream (`Tx::append_on_commit`); when the batch starts the stream, one join of the stream
/// set now. Every event is validated before anything is kept; the caller's transaction makes
/// the batch all-or-nothing.
pub(crate) async fn append_batch(
    tx: &mut Tx,
    head: &mut StreamHead,
    events: Vec<NewEvent>,
) -> Result<Vec<Event>> {
    for event in &events {
        event.validate()?;
    }
    if events.is_empty() {
        return Ok(Vec::new());
    }
    let ts = tx.now();
    let first_seq = head.last_seq + 1;
    let mut rows = Vec::with_capacity(events.len());
    let mut prev_hash = head.last_hash.clone();
    let mut seq = head.last_seq;
    for event in events {
        seq += 1;
        let payload_text = canonical_json(&event.payload);
        let turn = event.turn.map(i64::from);
        let verification = recorded_verification(&event.actor);
        let via = verification.and(event.actor.via.clone());
        let hash = event_hash(&HashInput {
            stream: &head.stream,
            seq,
            event_type: &event.event_type,
            ts: &ts,
            actor: &event.actor.actor,
            call_id: event.call_id.as_deref(),
            turn,
            payload: &payload_text,
            prev_hash: &prev_hash,
            actor_verification: verification.map(Verification::as_str),
            actor_via: via.as_deref(),
        });
        rows.push(ChainedRow {
            seq,
            ts,
            payload_text,
            turn,
            verification,
            via,
            prev_hash: std::mem::replace(&mut prev_hash, hash.clone()),
            hash,
            event,
        });
    }
    if enqueue_notifications(
        tx,
        &head.stream,
        rows.iter()
            .map(|row| (row.seq, row.event.event_type.as_str(), &row.event.payload)),
    )
    .await?
    {
        tx.mark_outbox_written();
    }
    let last_hash = prev_hash;
    let key = tx.audit_key();
    // The events and the head are written when the write commits (`Tx::append_on_commit`):
    // per stream and write one head update and seal however many appends it made — on
    // PostgreSQL one statement with the events, on SQLite the events of every stream in one
    // multi-row `INSERT` — and a model step's three appends to its session's stream cost one.
    let binds = event_binds(&head.stream, &rows);
    tx.append_on_commit(&head.stream, head.last_seq, seq, &last_hash, ts, binds)?;
    if let Some(key) = key
        && first_seq == 1
    {
        let backend = tx.backend();
        add_to_stream_set(&mut tx.conn(), backend, &key, &head.stream).await?;
    }
    head.last_hash = last_hash;
    head.last_seq = seq;
    let payloads: Vec<usize> = rows.iter().map(|row| row.payload_text.len()).collect();
    let appended: Vec<Event> = rows
        .into_iter()
        .map(|row| Event {
            stream: head.stream.clone(),
            seq: u64::try_from(row.seq).unwrap_or_default(),
            event_type: row.event.event_type,
            ts: row.ts,
            actor: row.event.actor.actor,
            actor_verification: row.verification,
            actor_via: row.via,
            call_id: row.event.call_id,
            turn: row.event.turn,
            payload: row.event.payload,
            prev_hash: row.prev_hash,
            hash: row.hash,
        })
        .collect();
    tx.appended(
        &head.stream,
        u64::try_from(seq).unwrap_or_default(),
        &appended,
        payloads.into_iter(),
    );
    Ok(appended)
}

pub(crate) use crate::db::EVENT_COLUMNS;

pub(crate) fn stored_from_row(row: &Row) -> Result<StoredEvent> {
    Ok(StoredEvent {
        stream: row.text("stream")?,
        seq: row.int("seq")?,
        event_type: row.text("type")?,
        ts: row.ts("ts")?,
        actor: row.text("actor")?,
        call_id: row.opt_text("call_id")?,
        turn: row.opt_int("turn")?,
        payload: row.text("payload")?,
        prev_hash: row.text("prev_hash")?,
        hash: row.text("hash")?,
        // Empty counts as not recorded (the column's value for events of earlier builds is
        // NULL; an empty string is treated the same way).
        actor_verification: row
            .opt_text("actor_verification")?
            .filter(|v| !v.is_empty()),
        actor_via: row.opt_text("actor_via")?,
    })
}

impl StoredEvent {
    pub(crate) fn into_event(self) -> Result<Event> {
        let where_ = || format!("stream {} seq {}", self.stream, self.seq);
        let payload = serde_json::from_str(&self.payload)
            .map_err(|e| LedgerError::corrupt(format!("{}: payload is not JSON: {e}", where_())))?;
        let seq = u64::try_from(self.seq)
            .map_err(|_| LedgerError::corrupt(format!("{}: negative seq", where_())))?;
        let actor_verification = self
            .actor_verification
            .as_deref()
            .map(|v| {
                Verification::parse(v).ok_or_else(|| {
                    LedgerError::corrupt(format!("{}: unknown actor verification {v:?}", where_()))
                })
            })
            .transpose()?;
        let turn = self
            .turn
            .map(u32::try_from)
            .transpose()
            .map_err(|_| LedgerError::corrupt(format!("{}: turn out of range", where_())))?;
        Ok(Event {
            stream: self.stream,
            seq,
            event_type: self.event_type,
            ts: self.ts,
            actor: self.actor,
            actor_verification,
            actor_via: self.actor_via,
            call_id: self.call_id,
            turn,
            payload,
            prev_hash: self.prev_hash,
            hash: self.hash,
        })
    }
}

/// Reads up to `limit` events with `seq > after` in ascending order.
pub(crate) async fn read_page(
    conn: &mut Conn<'_>,
    stream: &str,
    after: i64,
    limit: i64,
) -> Result<Vec<StoredEvent>> {
    static SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "SELECT {EVENT_COLUMNS} FROM events WHERE stream = $1 AND seq > $2 \
             ORDER BY seq LIMIT $3"
        )
    });
    conn.fetch_all("read events", &SQL, args![stream, after, limit])
        .await?
        .iter()
        .map(stored_from_row)
        .collect()
}

/// The recorded head of a stream, or `None` if it does not exist.
pub(crate) async fn read_head(conn: &mut Conn<'_>, stream: &str) -> Result<Option<(i64, String)>> {
    let row = conn
        .fetch_optional(
            "read stream head",
            "SELECT last_seq, last_hash FROM streams WHERE stream = $1",
            args![stream],
        )
        .await?;
    row.map(|r| Ok((r.int("last_seq")?, r.text("last_hash")?)))
        .transpose()
}

/// Verifies one stream page by page.
pub(crate) async fn verify(conn: &mut Conn<'_>, stream: &str) -> Result<VerifyReport> {
    let Some((head_seq, head_hash)) = read_head(conn, stream).await? else {
        return Err(LedgerError::not_found(format!(
            "event stream {stream} not found"
        )));
    };
    let mut verifier = ChainVerifier::new(stream);
    let mut after = 0;
    let mut violation = None;
    'pages: loop {
        let page = read_page(conn, stream, after, PAGE).await?;
        let Some(last) = page.last() else { break };
        after = last.seq;
        let full = i64::try_from(page.len()).unwrap_or(i64::MAX) == PAGE;
        for event in &page {
            if let Err(v) = verifier.check(event) {
                violation = Some(v);
                break 'pages;
            }
        }
        if !full {
            break;
        }
    }
    if violation.is_none() {
        violation = verifier.finish(head_seq, &head_hash).err();
    }
    Ok(VerifyReport {
        stream: stream.to_owned(),
        events_checked: verifier.checked(),
        head_seq: u64::try_from(head_seq).unwrap_or_default(),
        head_hash: (head_seq > 0).then_some(head_hash),
        violation,
    })
}

/// [`verify`] of every stream, in stream-name order.
pub(crate) async fn verify_every_stream(conn: &mut Conn<'_>) -> Result<Vec<VerifyReport>> {
    let streams = conn
        .fetch_all(
            "list streams",
            "SELECT stream FROM streams ORDER BY stream",
            vec![],
        )
        .await?;
    let mut reports = Vec::with_capacity(streams.len());
    for row in streams {
        reports.push(verify(conn, &row.text("stream")?).await?);
    }
    Ok(reports)
}

/// The digest of an empty stream set.
pub(crate) const EMPTY_STREAM_SET: &str =
    "0000000000000000000000000000000000000000000000000000000000000000";

/// One shard of a stream set: the number of its streams and the digest of their names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StreamSetShard {
    pub(crate) streams: i64,
    pub(crate) digest: String,
}

impl Default for StreamSetShard {
    fn default() -> Self {
        Self {
            streams: 0,
            digest: EMPTY_STREAM_SET.to_owned(),
        }
    }
}

impl StreamSetShard {
    /// The shard with `stream` added.
    pub(crate) fn with(&self, stream: &str) -> Result<Self> {
        Ok(Self {
            streams: self.streams.saturating_add(1),
            digest: stream_set_with(&self.digest, stream)?,
        })
    }
}

/// The shard of the stream set `stream` belongs to.
pub(crate) fn stream_set_shard(stream: &str) -> usize {
    use sha2::{Digest as _, Sha256};
    usize::from(Sha256::digest(stream.as_bytes())[0]) % STREAM_SET_SHARDS
}

/// `digest` with `stream` added (or removed: XOR is its own inverse): the XOR of SHA-256 of
/// every stream name, so a new stream updates it without reading the others.
pub(crate) fn stream_set_with(digest: &str, stream: &str) -> Result<String> {
    use sha2::{Digest as _, Sha256};
    let mut bytes = hex::decode(digest)
        .ok()
        .filter(|b| b.len() == 32)
        .ok_or_else(|| {
            LedgerError::corrupt(format!("stream set digest {digest:?} is not 32 hex bytes"))
        })?;
    for (b, h) in bytes.iter_mut().zip(Sha256::digest(stream.as_bytes())) {
        *b ^= h;
    }
    Ok(hex::encode(bytes))
}

/// Writes the whole sealed stream set, one row per shard (in the sealing transaction), and
/// drops the single-row set of builds before migration 0024 if there is one.
pub(crate) async fn write_stream_set(
    conn: &mut Conn<'_>,
    key: &AuditKey,
    shards: &[StreamSetShard; STREAM_SET_SHARDS],
) -> Result<()> {
    for (shard, set) in shards.iter().enumerate() {
        write_shard(conn, key, shard, set).await?;
    }
    conn.execute(
        "drop the single-row stream set",
        "DELETE FROM stream_set",
        vec![],
    )
    .await?;
    Ok(())
}

async fn write_shard(
    conn: &mut Conn<'_>,
    key: &AuditKey,
    shard: usize,
    set: &StreamSetShard,
) -> Result<()> {
    conn.execute(
        "seal a stream set shard",
        "INSERT INTO stream_set_shards (shard, streams, digest, mac) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (shard) DO UPDATE SET streams = excluded.streams, \
         digest = excluded.digest, mac = excluded.mac",
        args![
            i64::try_from(shard).unwrap_or(i64::MAX),
            set.streams,
            &set.digest,
            key.stream_set_shard_mac(shard, set.streams, &set.digest)
        ],
    )
    .await?;
    Ok(())
}

/// Adds a new stream to the sealed stream set, in the transaction of the stream's first
/// append: its shard's row is locked (PostgreSQL: `FOR UPDATE`) until that transaction ends,
/// so creations of streams in one shard are serialised, in different shards not; appends to
/// existing streams never come here. Before the log is sealed there is no row, and nothing to
/// extend (sealing counts every stream). A log whose set is still the single row of a build
/// before migration 0024 (sharded by the start-up check, which runs before the daemon serves)
/// extends that row.
async fn add_to_stream_set(
    conn: &mut Conn<'_>,
    backend: Backend,
    key: &AuditKey,
    stream: &str,
) -> Result<()> {
    let shard = stream_set_shard(stream);
    let sql = match backend {
        Backend::Postgres => {
            "SELECT streams, digest FROM stream_set_shards WHERE shard = $1 FOR UPDATE"
        }
        Backend::Sqlite => "SELECT streams, digest FROM stream_set_shards WHERE shard = $1",
    };
    let row = conn
        .fetch_optional(
            "lock the stream set shard",
            sql,
            args![i64::try_from(shard).unwrap_or(i64::MAX)],
        )
        .await?;
    if let Some(row) = row {
        let set = StreamSetShard {
            streams: row.int("streams")?,
            digest: row.text("digest")?,
        }
        .with(stream)?;
        return write_shard(conn, key, shard, &set).await;
    }
    let sql = match backend {
        Backend::Postgres => "SELECT streams, digest FROM stream_set WHERE id = 1 FOR UPDATE",
        Backend::Sqlite => "SELECT streams, digest FROM stream_set WHERE id = 1",
    };
    let Some(row) = conn
        .fetch_optional("lock the single-row stream set", sql, vec![])
        .await?
    else {
        return Ok(());
    };
    let streams = row.int("streams")?.saturating_add(1);
    let digest = stream_set_with(&row.text("digest")?, stream)?;
    conn.execute(
        "extend the single-row stream set",
        "UPDATE stream_set SET streams = $1, digest = $2, mac = $3 WHERE id = 1",
        args![streams, &digest, key.stream_set_mac(streams, &digest)],
    )
    .await?;
    Ok(())
}
