-- phrony ledger schema: session leases (issue #20, several runtime replicas on one database).
--
-- One row per session a replica has driven: the replica that drives it (`owner`, NULL once
-- released: parked or ended), the fencing token (`epoch`, +1 on every acquisition and never
-- reset, so a row is kept when its lease is released) and when the lease ends unless renewed
-- (`expires_at`). The append path checks `(owner, epoch)` inside the statement that advances
-- the session stream's head for the sessions the writing replica drives, so a replica that
-- lost its lease can never append to that session again. An acquisition locks the stream head
-- first, so it is ordered with every append. Renewal is one statement per replica and tick
-- (`owner`); the takeover scan reads expired leases (`expires_at`).
-- Kept column-for-column identical to migrations/sqlite/0015_session_leases.sql.
CREATE TABLE session_leases (
    session_id text COLLATE "C" NOT NULL PRIMARY KEY,
    owner      text COLLATE "C",
    epoch      BIGINT NOT NULL CHECK (epoch > 0),
    expires_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);
CREATE INDEX session_leases_by_owner ON session_leases (owner) WHERE owner IS NOT NULL;
CREATE INDEX session_leases_expiring ON session_leases (expires_at) WHERE owner IS NOT NULL;
