-- phrony ledger schema: keyed chain heads (audit).
--
-- One row per stream: the stream's last seq and hash, and mac = HMAC-SHA256 of (stream, seq,
-- hash) under the audit key, which is kept OUTSIDE the database (a key file). Written in the
-- transaction of every append made with the key. An attacker who can write the database but
-- not read the key file can recompute an edited chain and its `streams` head, but cannot
-- produce the MAC of the new head: `Ledger::verify_audit` and the daemon's start-up check
-- detect it. Kept identical on SQLite and PostgreSQL (the version leaves 0004/0005 free for
-- other schema changes of the same release).
CREATE TABLE chain_heads (
    stream TEXT PRIMARY KEY,
    seq    BIGINT NOT NULL,
    hash   TEXT NOT NULL,
    mac    TEXT NOT NULL
);
