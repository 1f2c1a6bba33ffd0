-- phrony ledger schema: approvals by decision time, for the engine's sweep of parked sessions.
--
-- `Ledger::sessions_with_waits_decided_since` reads the approvals decided (approved, denied,
-- expired, cancelled, escalated) since the sweep's last run through this index, so a sweep costs
-- what was decided meanwhile, not what is still waiting (pending approvals are not in it).
-- Kept identical on SQLite and PostgreSQL.
CREATE INDEX approvals_decided ON approvals (decided_at) WHERE decided_at IS NOT NULL;
