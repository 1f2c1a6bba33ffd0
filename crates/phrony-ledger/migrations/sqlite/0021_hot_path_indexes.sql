-- phrony ledger schema: indexes that serve three hot statements without reading a growing
-- table whole (issue #14), found by the conformance case
-- `no_hot_path_statement_scans_a_growing_table`, which explains every statement the ledger runs
-- on SQLite. SQLite plans without statistics (the ledger never runs ANALYZE), so its plan on an
-- almost empty database is its plan with 100,000 sessions; each index below is one that
-- planner takes for the statement, with the statement's text unchanged.
--
-- approvals_pending_due: the approval timer (`Ledger::due_approvals`, `next_approval_expiry`),
-- `status = 'pending' AND expires_at … ORDER BY expires_at`. SQLite preferred the equality on
-- `approvals_status_created (status, created_at)` to the partial index
-- `approvals_pending_expiry (expires_at) WHERE status = 'pending'` and read and sorted every
-- pending approval on each tick. Here the status is an index column too (constant within the
-- index: it holds only pending approvals with an expiry), so the equality and the expiry range
-- are both index terms: only the due approvals are read, in expiry order. It replaces
-- `approvals_pending_expiry`, which no statement needs any more.
--
-- sessions_live_created: start-up recovery's pages (`Ledger::sessions_needing_recovery_after`,
-- `status NOT IN ('completed', 'failed', 'cancelled') … ORDER BY created_at, id`) walked
-- `sessions_created` through every session ever created, ended ones included, to find the live
-- ones. This partial index holds only the live sessions, in page order (the predicate of
-- migration 0009's `sessions_agent_live`).
--
-- webhook_deliveries_claim: the webhook sender's read of the deliveries it has just claimed
-- (`claim_webhook_deliveries`, `WHERE d.claim_token = $1`, inside the claim's write
-- transaction: on SQLite inside the group-commit writer) scanned every delivery. A claim token
-- is cleared when its attempt ends, so the partial index holds only the attempts in flight.
--
-- Kept identical on SQLite and PostgreSQL.
CREATE INDEX approvals_pending_due ON approvals (status, expires_at)
    WHERE status = 'pending' AND expires_at IS NOT NULL;
DROP INDEX approvals_pending_expiry;

CREATE INDEX sessions_live_created ON sessions (created_at, id)
    WHERE status NOT IN ('completed', 'failed', 'cancelled');

CREATE INDEX webhook_deliveries_claim ON webhook_deliveries (claim_token)
    WHERE claim_token IS NOT NULL;
