-- phrony ledger schema, version 1 (SQLite).
--
-- Conventions (kept identical to migrations/postgres/0001_initial.sql):
--   * ids are UUID text in canonical hyphenated form; session ids are `run_<uuid>` text;
--   * timestamps are UTC RFC 3339 text with exactly six fractional digits and a `Z`
--     suffix (`2025-01-02T03:04:05.123456Z`), so they sort lexically and round-trip exactly;
--   * JSON columns hold JSON text;
--   * `events` is the append-only, hash-chained source of truth; every other table except
--     `runtime_meta`, `streams` and `session_secrets` is a projection of it.

CREATE TABLE runtime_meta (
    key   TEXT PRIMARY KEY NOT NULL,
    value TEXT NOT NULL
);

-- One row per event stream: the head of its hash chain. Appends lock this row (SQLite:
-- the database write lock taken by BEGIN IMMEDIATE) so seq stays gap-free and unique.
CREATE TABLE streams (
    stream     TEXT PRIMARY KEY NOT NULL,
    last_seq   INTEGER NOT NULL CHECK (last_seq >= 0),
    last_hash  TEXT NOT NULL CHECK (length(last_hash) = 64),
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);

CREATE TABLE events (
    stream    TEXT NOT NULL REFERENCES streams (stream),
    seq       INTEGER NOT NULL CHECK (seq >= 1),
    type      TEXT NOT NULL,
    ts        TEXT NOT NULL,
    actor     TEXT NOT NULL,
    call_id   TEXT,
    turn      INTEGER,
    -- canonical JSON text (sorted keys, no whitespace): exactly the bytes that were hashed
    payload   TEXT NOT NULL,
    prev_hash TEXT NOT NULL CHECK (length(prev_hash) = 64),
    hash      TEXT NOT NULL CHECK (length(hash) = 64),
    PRIMARY KEY (stream, seq)
);
CREATE INDEX events_call_id ON events (call_id) WHERE call_id IS NOT NULL;
CREATE INDEX events_type ON events (type, stream);

-- Defence in depth: the log refuses in-place changes. The hash chain still detects them
-- when someone drops these triggers first.
CREATE TRIGGER events_no_update BEFORE UPDATE ON events
BEGIN
    SELECT RAISE(ABORT, 'events are append-only: UPDATE refused');
END;
CREATE TRIGGER events_no_delete BEFORE DELETE ON events
BEGIN
    SELECT RAISE(ABORT, 'events are append-only: DELETE refused');
END;

-- Lifecycle projections (stream `agent:<namespace>/<name>`).
CREATE TABLE agents (
    id          TEXT PRIMARY KEY NOT NULL,
    namespace   TEXT NOT NULL,
    name        TEXT NOT NULL,
    owner       TEXT NOT NULL DEFAULT '',
    labels      TEXT NOT NULL DEFAULT '{}',
    archived_at TEXT,
    archived_by TEXT,
    created_at  TEXT NOT NULL,
    updated_at  TEXT NOT NULL,
    UNIQUE (namespace, name)
);

CREATE TABLE bundles (
    id         TEXT PRIMARY KEY NOT NULL,
    namespace  TEXT NOT NULL,
    name       TEXT NOT NULL,
    owner      TEXT NOT NULL DEFAULT '',
    labels     TEXT NOT NULL DEFAULT '{}',
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL,
    UNIQUE (namespace, name)
);

CREATE TABLE bundle_versions (
    id                     TEXT PRIMARY KEY NOT NULL,
    bundle_id              TEXT NOT NULL REFERENCES bundles (id),
    version                TEXT NOT NULL,
    lock_hash              TEXT NOT NULL,
    lock                   TEXT NOT NULL,
    manifest               TEXT NOT NULL,
    root_member_version_id TEXT REFERENCES agent_versions (id) DEFERRABLE INITIALLY DEFERRED,
    published_by           TEXT NOT NULL,
    created_at             TEXT NOT NULL,
    event_seq              INTEGER NOT NULL,
    UNIQUE (bundle_id, version),
    UNIQUE (bundle_id, lock_hash)
);

-- Immutable compiled snapshots. `snapshot` holds the submitted JSON text byte for byte
-- (the content hash is computed over it). Vendored (bundle member) versions have no agent.
CREATE TABLE agent_versions (
    id                TEXT PRIMARY KEY NOT NULL,
    agent_id          TEXT REFERENCES agents (id),
    version           TEXT NOT NULL,
    content_hash      TEXT NOT NULL,
    snapshot          TEXT NOT NULL,
    origin            TEXT NOT NULL CHECK (origin IN ('published', 'vendored')),
    bundle_version_id TEXT REFERENCES bundle_versions (id) DEFERRABLE INITIALLY DEFERRED,
    published_by      TEXT NOT NULL,
    published_at      TEXT NOT NULL,
    deprecated_at     TEXT,
    deprecated_by     TEXT,
    retired_at        TEXT,
    retired_by        TEXT,
    event_seq         INTEGER NOT NULL,
    CHECK ((origin = 'published') = (agent_id IS NOT NULL))
);
CREATE UNIQUE INDEX agent_versions_agent_version ON agent_versions (agent_id, version)
    WHERE agent_id IS NOT NULL;
CREATE INDEX agent_versions_bundle_version ON agent_versions (bundle_version_id);

-- Append-only deploy/rollback history; the row with the highest event_seq is active.
CREATE TABLE deployments (
    id                  TEXT PRIMARY KEY NOT NULL,
    agent_id            TEXT NOT NULL REFERENCES agents (id),
    agent_version_id    TEXT NOT NULL REFERENCES agent_versions (id),
    previous_version_id TEXT REFERENCES agent_versions (id),
    action              TEXT NOT NULL CHECK (action IN ('deploy', 'rollback')),
    actor               TEXT NOT NULL,
    created_at          TEXT NOT NULL,
    event_seq           INTEGER NOT NULL,
    UNIQUE (agent_id, event_seq)
);

CREATE TABLE bundle_members (
    bundle_version_id TEXT NOT NULL REFERENCES bundle_versions (id),
    child_name        TEXT NOT NULL,
    member_version_id TEXT NOT NULL REFERENCES agent_versions (id),
    ref               TEXT NOT NULL,
    origin            TEXT NOT NULL CHECK (origin IN ('vendored', 'external')),
    is_root           INTEGER NOT NULL DEFAULT 0 CHECK (is_root IN (0, 1)),
    PRIMARY KEY (bundle_version_id, child_name)
);

CREATE TABLE bundle_deployments (
    id                  TEXT PRIMARY KEY NOT NULL,
    bundle_id           TEXT NOT NULL REFERENCES bundles (id),
    bundle_version_id   TEXT NOT NULL REFERENCES bundle_versions (id),
    previous_version_id TEXT REFERENCES bundle_versions (id),
    action              TEXT NOT NULL CHECK (action IN ('deploy', 'rollback')),
    actor               TEXT NOT NULL,
    created_at          TEXT NOT NULL,
    event_seq           INTEGER NOT NULL,
    UNIQUE (bundle_id, event_seq)
);

-- Session projections (stream = the session id).
CREATE TABLE sessions (
    id                TEXT PRIMARY KEY NOT NULL,
    agent_version_id  TEXT NOT NULL REFERENCES agent_versions (id),
    bundle_version_id TEXT REFERENCES bundle_versions (id),
    parent_session_id TEXT REFERENCES sessions (id),
    root_session_id   TEXT NOT NULL,
    depth             INTEGER NOT NULL DEFAULT 0 CHECK (depth >= 0),
    mode              TEXT NOT NULL DEFAULT 'task' CHECK (mode IN ('task', 'conversation')),
    input             TEXT NOT NULL DEFAULT '{}',
    metadata          TEXT NOT NULL DEFAULT '{}',
    status            TEXT NOT NULL CHECK (status IN ('pending', 'running', 'awaiting_input',
                          'awaiting_tool', 'awaiting_approval', 'completed', 'failed', 'cancelled')),
    error             TEXT,
    output            TEXT,
    created_by        TEXT NOT NULL DEFAULT '',
    created_at        TEXT NOT NULL,
    updated_at        TEXT NOT NULL,
    ended_at          TEXT
);
CREATE INDEX sessions_agent_version ON sessions (agent_version_id);
CREATE INDEX sessions_parent ON sessions (parent_session_id);
CREATE INDEX sessions_root ON sessions (root_session_id);
CREATE INDEX sessions_bundle_version ON sessions (bundle_version_id);
CREATE INDEX sessions_status_updated ON sessions (status, updated_at);

-- Tool-call ledger. `proposed_args` are the model's arguments, `args` the arguments
-- actually dispatched (they differ when an approver edits them).
CREATE TABLE tool_invocations (
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
                              'succeeded', 'failed', 'indeterminate', 'awaiting_approval')),
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
    completed_at          TEXT
);
CREATE INDEX tool_invocations_session ON tool_invocations (session_id, status);

-- Approvals: `policy_ref` is the deciding policy as `namespace/name@version`;
-- `call_hash` is the hash of the exact call being approved.
CREATE TABLE approvals (
    id                     TEXT PRIMARY KEY NOT NULL,
    session_id             TEXT NOT NULL REFERENCES sessions (id),
    call_id                TEXT NOT NULL REFERENCES tool_invocations (call_id),
    parent_approval_id     TEXT REFERENCES approvals (id),
    status                 TEXT NOT NULL CHECK (status IN ('pending', 'approved', 'denied',
                               'escalated', 'cancelled')),
    route                  TEXT NOT NULL DEFAULT '',
    reason                 TEXT NOT NULL DEFAULT '',
    tool                   TEXT NOT NULL,
    tool_version           TEXT NOT NULL,
    args                   TEXT NOT NULL,
    effective_args         TEXT,
    call_hash              TEXT NOT NULL,
    agent_version_id       TEXT NOT NULL REFERENCES agent_versions (id),
    agent_ref              TEXT NOT NULL,
    policy_ref             TEXT,
    policy_runtime         TEXT NOT NULL DEFAULT '{}',
    authority_ref          TEXT NOT NULL DEFAULT '',
    approvals_required     INTEGER NOT NULL DEFAULT 1 CHECK (approvals_required >= 1),
    approvals_received     INTEGER NOT NULL DEFAULT 0 CHECK (approvals_received >= 0),
    comprehension_required INTEGER NOT NULL DEFAULT 0 CHECK (comprehension_required IN (0, 1)),
    on_reject              TEXT NOT NULL DEFAULT 'return_to_agent',
    on_modify              TEXT NOT NULL DEFAULT '',
    timeout_default        TEXT,
    escalation_depth       INTEGER NOT NULL DEFAULT 0 CHECK (escalation_depth >= 0),
    expires_at             TEXT,
    decided_by             TEXT,
    comment                TEXT,
    created_at             TEXT NOT NULL,
    decided_at             TEXT
);
CREATE INDEX approvals_session ON approvals (session_id, status);
CREATE INDEX approvals_status_created ON approvals (status, created_at);
CREATE INDEX approvals_pending_expiry ON approvals (expires_at) WHERE status = 'pending';

CREATE TABLE approval_votes (
    approval_id                TEXT NOT NULL REFERENCES approvals (id),
    decided_by                 TEXT NOT NULL,
    decision                   TEXT NOT NULL CHECK (decision IN ('approved', 'denied')),
    comment                    TEXT NOT NULL DEFAULT '',
    comprehension_acknowledged INTEGER NOT NULL DEFAULT 0
                                   CHECK (comprehension_acknowledged IN (0, 1)),
    edited_args                TEXT,
    created_at                 TEXT NOT NULL,
    PRIMARY KEY (approval_id, decided_by)
);

-- Encrypted per-session secrets (AES-256-GCM); deleted when the session ends.
CREATE TABLE session_secrets (
    session_id  TEXT NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    name        TEXT NOT NULL,
    key_version INTEGER NOT NULL CHECK (key_version >= 1),
    nonce       BLOB NOT NULL,
    ciphertext  BLOB NOT NULL,
    created_at  TEXT NOT NULL,
    PRIMARY KEY (session_id, name)
);

INSERT INTO runtime_meta (key, value) VALUES ('schema_version', '1')
    ON CONFLICT (key) DO UPDATE SET value = excluded.value;
