-- phrony ledger schema, version 2 (PostgreSQL): durable sessions, tool calls, approvals, secrets.
--
-- Kept column-for-column identical to migrations/sqlite/0002_sessions.sql. Migrations are
-- append-only: 0001 is never edited.

-- Sessions: the agent reference the session runs (ns/name@version, also for vendored bundle
-- members, which have no `agents` row) and the limits in force when it started.
ALTER TABLE sessions ADD COLUMN agent_namespace text COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE sessions ADD COLUMN agent_name text COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE sessions ADD COLUMN agent_version text COLLATE "C" NOT NULL DEFAULT '';
ALTER TABLE sessions ADD COLUMN limits jsonb;
CREATE INDEX sessions_created ON sessions (created_at, id);
CREATE INDEX sessions_agent_created ON sessions (agent_namespace, agent_name, created_at, id);

-- Session metadata as rows, so ListSessions can filter on any number of pairs portably.
CREATE TABLE session_metadata (
    session_id text COLLATE "C" NOT NULL REFERENCES sessions (id) DEFERRABLE INITIALLY IMMEDIATE,
    key        text COLLATE "C" NOT NULL,
    value      text COLLATE "C" NOT NULL,
    PRIMARY KEY (session_id, key)
);
CREATE INDEX session_metadata_pair ON session_metadata (key, value, session_id);

-- Tool calls: a `cancelled` status, the position of the call inside its turn (`step` holds the
-- completion iteration) and the binding's side-effect class, which crash recovery needs.
ALTER TABLE tool_invocations DROP CONSTRAINT tool_invocations_status_check;
ALTER TABLE tool_invocations ADD CONSTRAINT tool_invocations_status_check
    CHECK (status IN ('pending', 'queued', 'dispatched', 'succeeded', 'failed',
                      'indeterminate', 'awaiting_approval', 'cancelled'));
ALTER TABLE tool_invocations ADD COLUMN call_index bigint NOT NULL DEFAULT 0
    CHECK (call_index >= 0);
ALTER TABLE tool_invocations ADD COLUMN side_effect_class text;

-- Approvals: the typed timeout (minutes, escalation route and minutes) so expiry and
-- escalation need nothing but the row.
ALTER TABLE approvals ADD COLUMN timeout_minutes integer CHECK (timeout_minutes >= 1);
ALTER TABLE approvals ADD COLUMN escalate_route text;
ALTER TABLE approvals ADD COLUMN escalate_after_minutes integer
    CHECK (escalate_after_minutes >= 1);
CREATE INDEX approvals_created ON approvals (created_at, id);
CREATE INDEX approvals_call ON approvals (call_id, status);

-- Secrets are purged explicitly by terminal transitions; the cascade is dropped (and the key
-- made deferrable) so that rebuilding the session projections, which wipes and replays
-- `sessions`, keeps the secrets of live sessions.
ALTER TABLE session_secrets DROP CONSTRAINT session_secrets_session_id_fkey;
ALTER TABLE session_secrets ADD CONSTRAINT session_secrets_session_id_fkey
    FOREIGN KEY (session_id) REFERENCES sessions (id) DEFERRABLE INITIALLY IMMEDIATE;

INSERT INTO runtime_meta (key, value) VALUES ('schema_version', '2')
    ON CONFLICT (key) DO UPDATE SET value = excluded.value;
