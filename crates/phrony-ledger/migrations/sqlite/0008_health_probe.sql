-- phrony ledger schema: the health probe's row.
--
-- The health monitor and the session engine's resume task prove that the database takes
-- writes (not only that it answers a read) by upserting this one row in a committed write
-- transaction (`Ledger::probe_write`). On SQLite that needs the write lock and a WAL append,
-- so it fails while another process holds the lock past the probe's busy timeout or the disk
-- is full. Not part of the audit log: no events, no hash chain.
CREATE TABLE health_probe (
    id        INTEGER PRIMARY KEY CHECK (id = 1),
    probed_at TEXT NOT NULL,
    probes    BIGINT NOT NULL
);
