-- phrony ledger schema: the sealed stream set in 16 shards (issue #14).
--
-- The single `stream_set` row (migration 0007) was updated, and on PostgreSQL locked `FOR
-- UPDATE` until commit, by the transaction of every append that creates a stream: every new
-- session's first write waited for the one before to commit, fsync included (sampled under
-- 16 concurrent sessions: 30 % of the server's active time was that wait). Each row here holds
-- the streams whose SHA-256(name)[0] mod 16 is its `shard`: their number and the XOR of the
-- SHA-256 of their names, with mac = HMAC-SHA256 under the audit key of
-- ("phrony.stream-set-shard.v1", 16, shard, streams, digest), so a row cannot be moved to
-- another shard. Creations in different shards lock different rows.
--
-- A log sealed before this migration keeps its `stream_set` row (MACed, which SQL cannot redo
-- without the key) until the daemon's start-up check verifies it against the log and writes
-- the shards, recorded as `audit.key_introduced` with `stream_set_shards: 16`; from then on
-- `stream_set` is empty. Kept identical on SQLite and PostgreSQL.
CREATE TABLE stream_set_shards (
    shard   INTEGER PRIMARY KEY CHECK (shard >= 0 AND shard < 16),
    streams BIGINT NOT NULL,
    digest  TEXT NOT NULL,
    mac     TEXT NOT NULL
);
