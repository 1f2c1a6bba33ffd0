-- phrony ledger schema, version 2 (SQLite): durable sessions, tool calls, approvals, secrets.
--
-- Kept column-for-column identical to migrations/postgres/0002_sessions.sql. Migrations are
-- append-only: 0001 is never edited.
--
-- SQLite cannot alter a CHECK or FOREIGN KEY constraint, so `tool_invocations` and
-- `session_secrets` are rebuilt with the documented 12-step procedure (create new, copy, drop
-- old, rename). Foreign keys pointing at `tool_invocations` (from `approvals`) follow the name,
-- and `defer_foreign_keys` keeps the drop from failing while the copy is in place.
PRAGMA defer_foreign_keys = ON;

-- Sessions: the agent reference the session runs (ns/name@version, also for vendored bundle
-- members, which have no `agents` row) and the limits in force when it started.
ALTER TABLE sessions ADD COLUMN agent_namespace TEXT NOT NULL DEFAULT '';
ALTER TABLE sessions ADD COLUMN agent_name TEXT NOT NULL DEFAULT '';
ALTER TABLE sessions ADD COLUMN agent_version TEXT NOT NULL DEFAULT '';
ALTER TABLE sessions ADD COLUMN limits TEXT;
CREATE INDEX sessions_created ON sessions (created_at, id);
CREATE INDEX sessions_agent_created ON sessions (agent_namespace, agent_name, created_at, id);

-- Session metadata as rows, so ListSessions can filter on any number of pairs portably.
CREATE TABLE session_metadata (
    session_id TEXT NOT NULL REFERENCES sessions (id),
    key        TEXT NOT NULL,
    value      TEXT NOT NULL,
    PRIMARY KEY (session_id, key)
);
CREATE INDEX session_metadata_pair ON session_metadata (key, value, session_id);

-- Tool calls: a `cancelled` status, the position of the call inside its turn (`step` holds the
-- completion iteration) and the binding's side-effect class, which crash recovery needs.
CREATE TABLE tool_invocations_v2 (
    call_id               TEXT PRIMARY KEY NOT NULL,
    session_id            TEXT NOT NULL REFERENCES sessions (id),
    agent_version_id      TEXT NOT NULL REFERENCES agent_versions (id),
    turn                  INTEGER NOT NULL CHECK (turn >= 0),
    step                  INTEGER NOT NULL DEFAULT 0 CHECK (step >= 0),
    tool                  TEXT NOT NULL,
    version               TEXT NOT NULL,
    wire_name             TEXT,
    proposed_args         TEXT NOT NULL,
    args                  TEXT NOT NULL,
    result                TEXT,
    status                TEXT NOT NULL CHECK (status IN ('pending', 'queued', 'dispatched',
                              'succeeded', 'failed', 'indeterminate', 'awaiting_approval',
                              'cancelled')),
    worker_id             TEXT,
    worker_identity       TEXT,
    image_digest          TEXT,
    descriptor_hash       TEXT,
    manifest_content_hash TEXT,
    attempt               INTEGER NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    error_code            TEXT,
    error_message         TEXT,
    usage_input_tokens    INTEGER,
    usage_output_tokens   INTEGER,
    usage_estimated       INTEGER CHECK (usage_estimated IN (0, 1)),
    deadline_at           TEXT,
    created_at            TEXT NOT NULL,
    updated_at            TEXT NOT NULL,
    queued_at             TEXT,
    dispatched_at         TEXT,
    completed_at          TEXT,
    call_index            INTEGER NOT NULL DEFAULT 0 CHECK (call_index >= 0),
    side_effect_class     TEXT
);
INSERT INTO tool_invocations_v2 (call_id, session_id, agent_version_id, turn, step, tool, version,
    wire_name, proposed_args, args, result, status, worker_id, worker_identity, image_digest,
    descriptor_hash, manifest_content_hash, attempt, error_code, error_message,
    usage_input_tokens, usage_output_tokens, usage_estimated, deadline_at, created_at,
    updated_at, queued_at, dispatched_at, completed_at)
SELECT call_id, session_id, agent_version_id, turn, step, tool, version, wire_name,
    proposed_args, args, result, status, worker_id, worker_identity, image_digest,
    descriptor_hash, manifest_content_hash, attempt, error_code, error_message,
    usage_input_tokens, usage_output_tokens, usage_estimated, deadline_at, created_at,
    updated_at, queued_at, dispatched_at, completed_at
FROM tool_invocations;
DROP TABLE tool_invocations;
ALTER TABLE tool_invocations_v2 RENAME TO tool_invocations;
CREATE INDEX tool_invocations_session ON tool_invocations (session_id, status);

-- Approvals: the typed timeout (minutes, escalation route and minutes) so expiry and
-- escalation need nothing but the row.
ALTER TABLE approvals ADD COLUMN timeout_minutes INTEGER CHECK (timeout_minutes >= 1);
ALTER TABLE approvals ADD COLUMN escalate_route TEXT;
ALTER TABLE approvals ADD COLUMN escalate_after_minutes INTEGER
    CHECK (escalate_after_minutes >= 1);
CREATE INDEX approvals_created ON approvals (created_at, id);
CREATE INDEX approvals_call ON approvals (call_id, status);

-- Secrets are purged explicitly by terminal transitions; the cascade is dropped so that
-- rebuilding the session projections (which wipes and replays `sessions`) keeps the secrets of
-- live sessions.
CREATE TABLE session_secrets_v2 (
    session_id  TEXT NOT NULL REFERENCES sessions (id),
    name        TEXT NOT NULL,
    key_version INTEGER NOT NULL CHECK (key_version >= 1),
    nonce       BLOB NOT NULL,
    ciphertext  BLOB NOT NULL,
    created_at  TEXT NOT NULL,
    PRIMARY KEY (session_id, name)
);
INSERT INTO session_secrets_v2 (session_id, name, key_version, nonce, ciphertext, created_at)
SELECT session_id, name, key_version, nonce, ciphertext, created_at FROM session_secrets;
DROP TABLE session_secrets;
ALTER TABLE session_secrets_v2 RENAME TO session_secrets;

INSERT INTO runtime_meta (key, value) VALUES ('schema_version', '2')
    ON CONFLICT (key) DO UPDATE SET value = excluded.value;
