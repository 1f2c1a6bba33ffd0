-- phrony ledger schema: session handoffs between replicas (issue #20: any worker serves any
-- session).
--
-- `replica_handlers`: the tool handlers (`tool@version`) the workers connected to each replica
-- advertise, renewed with the replica's session leases and expiring with them, so a replica
-- whose session needs a tool none of its own workers serves finds a replica that has one.
-- `session_leases.handoff_to`: a lease released to hand the session to that replica (its call
-- is queued, nothing in flight); the named replica acquires it (woken by NOTIFY
-- `phrony_handoff` on PostgreSQL, or by its scan), and any replica does once `expires_at`
-- passed (the named one died first).
-- Kept column-for-column identical to migrations/sqlite/0017_session_handoffs.sql.
ALTER TABLE session_leases ADD COLUMN handoff_to text COLLATE "C";
CREATE INDEX session_leases_handed_off ON session_leases (handoff_to) WHERE owner IS NULL AND handoff_to IS NOT NULL;
CREATE TABLE replica_handlers (
    replica_id  text COLLATE "C" NOT NULL,
    handler_key text COLLATE "C" NOT NULL,
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (replica_id, handler_key)
);
CREATE INDEX replica_handlers_by_key ON replica_handlers (handler_key, expires_at);
