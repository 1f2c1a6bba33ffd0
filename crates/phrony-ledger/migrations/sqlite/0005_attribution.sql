-- phrony ledger schema, version 4: attribution.
--
-- Who an event is attributed to, beyond the actor's name: how the runtime established it
-- (`actor_verification`: 'unverified', 'token', 'oidc', 'mtls') and the principal that relayed
-- it for the actor (`actor_via`). NULL verification: an event written before this migration, or
-- one of the runtime's own actors (`system`, `system:timeout`, `agent`, `policy`, `worker`);
-- both keep the version-1 hash input (see the ledger's crate docs). The projections copy the
-- attribution of the event that wrote them: the votes (`approval_votes`), the session's starter
-- (`sessions.created_by_*`); an approval's deciding voter reads it from the votes.
-- `approvals.allow_self_approval` is the policy's explicit separation-of-duties opt-out, from
-- the `approval.required` event. Kept identical on SQLite and PostgreSQL.
ALTER TABLE events ADD COLUMN actor_verification TEXT;
ALTER TABLE events ADD COLUMN actor_via TEXT;
ALTER TABLE approval_votes ADD COLUMN verification TEXT;
ALTER TABLE approval_votes ADD COLUMN via TEXT;
ALTER TABLE sessions ADD COLUMN created_by_verification TEXT;
ALTER TABLE sessions ADD COLUMN created_by_via TEXT;
ALTER TABLE approvals ADD COLUMN allow_self_approval INTEGER NOT NULL DEFAULT 0 CHECK (allow_self_approval IN (0, 1));
