-- phrony ledger schema: bundles in the event log (stream `bundle:<namespace>/<name>`).
--
-- A vendored agent version (a private bundle member) has no `agents` row, so its version row
-- names the member's own `metadata.namespace` / `metadata.name` (NULL for published versions,
-- which read them from their agent). A member row keeps the content hash its lock recorded.
-- Kept column-for-column identical to migrations/sqlite/0011_bundle_members.sql.
ALTER TABLE agent_versions ADD COLUMN member_namespace text COLLATE "C";
ALTER TABLE agent_versions ADD COLUMN member_name text COLLATE "C";
ALTER TABLE bundle_members ADD COLUMN lock_content_hash text NOT NULL DEFAULT '';
