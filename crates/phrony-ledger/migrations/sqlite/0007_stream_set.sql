-- phrony ledger schema: the sealed stream set (audit).
--
-- One row: how many streams the log has (streams with at least one event) and a digest of
-- their names (XOR of SHA-256(name), hex), with mac = HMAC-SHA256 of both under the audit key,
-- kept outside the database. Updated in the transaction of the append that creates a stream
-- (a stream's first event), not on every append, so appends to existing streams never touch
-- it. Deleting a whole stream together with its `chain_heads` row leaves this record naming
-- one stream more than the log has; without the key it cannot be recomputed. Written first
-- when the log is sealed (`audit.key_introduced` with `stream_set_sealed: true`).
CREATE TABLE stream_set (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    streams BIGINT NOT NULL,
    digest  TEXT NOT NULL,
    mac     TEXT NOT NULL
);
