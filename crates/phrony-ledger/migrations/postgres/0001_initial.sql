-- phrony ledger schema, version 1 (PostgreSQL).
--
-- Kept column-for-column identical to migrations/sqlite/0001_initial.sql, with native types:
-- uuid, timestamptz (microsecond precision), jsonb for projection JSON, bytea, boolean.
-- Names and versions use the "C" collation so ordering matches SQLite's byte order.
-- Foreign keys that point at rebuildable projections are DEFERRABLE so that
-- rebuild_projections() can wipe and replay them inside one transaction.
-- `events.payload` is text, not jsonb: it holds exactly the canonical bytes that were hashed.

CREATE TABLE runtime_meta (
    key   text PRIMARY KEY,
    value text NOT NULL
);

CREATE TABLE streams (
    stream     text COLLATE "C" PRIMARY KEY,
    last_seq   bigint NOT NULL CHECK (last_seq >= 0),
    last_hash  text NOT NULL CHECK (length(last_hash) = 64),
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);

CREATE TABLE events (
    stream    text COLLATE "C" NOT NULL REFERENCES streams (stream),
    seq       bigint NOT NULL CHECK (seq >= 1),
    type      text NOT NULL,
    ts        timestamptz NOT NULL,
    actor     text NOT NULL,
    call_id   text,
    turn      bigint,
    payload   text NOT NULL,
    prev_hash text NOT NULL CHECK (length(prev_hash) = 64),
    hash      text NOT NULL CHECK (length(hash) = 64),
    PRIMARY KEY (stream, seq)
);
CREATE INDEX events_call_id ON events (call_id) WHERE call_id IS NOT NULL;
CREATE INDEX events_type ON events (type, stream);

CREATE FUNCTION phrony_events_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'events are append-only: % refused', TG_OP;
END
$$;
CREATE TRIGGER events_no_update_delete BEFORE UPDATE OR DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION phrony_events_append_only();
CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION phrony_events_append_only();

CREATE TABLE agents (
    id          uuid PRIMARY KEY,
    namespace   text COLLATE "C" NOT NULL,
    name        text COLLATE "C" NOT NULL,
    owner       text NOT NULL DEFAULT '',
    labels      jsonb NOT NULL DEFAULT '{}'::jsonb,
    archived_at timestamptz,
    archived_by text,
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL,
    UNIQUE (namespace, name)
);

CREATE TABLE bundles (
    id         uuid PRIMARY KEY,
    namespace  text COLLATE "C" NOT NULL,
    name       text COLLATE "C" NOT NULL,
    owner      text NOT NULL DEFAULT '',
    labels     jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    UNIQUE (namespace, name)
);

CREATE TABLE agent_versions (
    id                uuid PRIMARY KEY,
    agent_id          uuid REFERENCES agents (id) DEFERRABLE INITIALLY IMMEDIATE,
    version           text COLLATE "C" NOT NULL,
    content_hash      text NOT NULL,
    snapshot          text NOT NULL,
    origin            text NOT NULL CHECK (origin IN ('published', 'vendored')),
    bundle_version_id uuid,
    published_by      text NOT NULL,
    published_at      timestamptz NOT NULL,
    deprecated_at     timestamptz,
    deprecated_by     text,
    retired_at        timestamptz,
    retired_by        text,
    event_seq         bigint NOT NULL,
    CHECK ((origin = 'published') = (agent_id IS NOT NULL))
);
CREATE UNIQUE INDEX agent_versions_agent_version ON agent_versions (agent_id, version)
    WHERE agent_id IS NOT NULL;
CREATE INDEX agent_versions_bundle_version ON agent_versions (bundle_version_id);

CREATE TABLE bundle_versions (
    id                     uuid PRIMARY KEY,
    bundle_id              uuid NOT NULL REFERENCES bundles (id) DEFERRABLE INITIALLY IMMEDIATE,
    version                text COLLATE "C" NOT NULL,
    lock_hash              text NOT NULL,
    lock                   text NOT NULL,
    manifest               text NOT NULL,
    root_member_version_id uuid REFERENCES agent_versions (id) DEFERRABLE INITIALLY DEFERRED,
    published_by           text NOT NULL,
    created_at             timestamptz NOT NULL,
    event_seq              bigint NOT NULL,
    UNIQUE (bundle_id, version),
    UNIQUE (bundle_id, lock_hash)
);
ALTER TABLE agent_versions ADD CONSTRAINT agent_versions_bundle_version_fk
    FOREIGN KEY (bundle_version_id) REFERENCES bundle_versions (id) DEFERRABLE INITIALLY DEFERRED;

CREATE TABLE deployments (
    id                  uuid PRIMARY KEY,
    agent_id            uuid NOT NULL REFERENCES agents (id) DEFERRABLE INITIALLY IMMEDIATE,
    agent_version_id    uuid NOT NULL REFERENCES agent_versions (id) DEFERRABLE INITIALLY IMMEDIATE,
    previous_version_id uuid REFERENCES agent_versions (id) DEFERRABLE INITIALLY IMMEDIATE,
    action              text NOT NULL CHECK (action IN ('deploy', 'rollback')),
    actor               text NOT NULL,
    created_at          timestamptz NOT NULL,
    event_seq           bigint NOT NULL,
    UNIQUE (agent_id, event_seq)
);

CREATE TABLE bundle_members (
    bundle_version_id uuid NOT NULL REFERENCES bundle_versions (id) DEFERRABLE INITIALLY IMMEDIATE,
    child_name        text COLLATE "C" NOT NULL,
    member_version_id uuid NOT NULL REFERENCES agent_versions (id) DEFERRABLE INITIALLY IMMEDIATE,
    ref               text NOT NULL,
    origin            text NOT NULL CHECK (origin IN ('vendored', 'external')),
    is_root           boolean NOT NULL DEFAULT false,
    PRIMARY KEY (bundle_version_id, child_name)
);

CREATE TABLE bundle_deployments (
    id                  uuid PRIMARY KEY,
    bundle_id           uuid NOT NULL REFERENCES bundles (id) DEFERRABLE INITIALLY IMMEDIATE,
    bundle_version_id   uuid NOT NULL REFERENCES bundle_versions (id) DEFERRABLE INITIALLY IMMEDIATE,
    previous_version_id uuid REFERENCES bundle_versions (id) DEFERRABLE INITIALLY IMMEDIATE,
    action              text NOT NULL CHECK (action IN ('deploy', 'rollback')),
    actor               text NOT NULL,
    created_at          timestamptz NOT NULL,
    event_seq           bigint NOT NULL,
    UNIQUE (bundle_id, event_seq)
);

CREATE TABLE sessions (
    id                text COLLATE "C" PRIMARY KEY,
    agent_version_id  uuid NOT NULL REFERENCES agent_versions (id) DEFERRABLE INITIALLY IMMEDIATE,
    bundle_version_id uuid REFERENCES bundle_versions (id) DEFERRABLE INITIALLY IMMEDIATE,
    parent_session_id text REFERENCES sessions (id) DEFERRABLE INITIALLY IMMEDIATE,
    root_session_id   text NOT NULL,
    depth             integer NOT NULL DEFAULT 0 CHECK (depth >= 0),
    mode              text NOT NULL DEFAULT 'task' CHECK (mode IN ('task', 'conversation')),
    input             jsonb NOT NULL DEFAULT '{}'::jsonb,
    metadata          jsonb NOT NULL DEFAULT '{}'::jsonb,
    status            text NOT NULL CHECK (status IN ('pending', 'running', 'awaiting_input',
                          'awaiting_tool', 'awaiting_approval', 'completed', 'failed', 'cancelled')),
    error             text,
    output            jsonb,
    created_by        text NOT NULL DEFAULT '',
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL,
    ended_at          timestamptz
);
CREATE INDEX sessions_agent_version ON sessions (agent_version_id);
CREATE INDEX sessions_parent ON sessions (parent_session_id);
CREATE INDEX sessions_root ON sessions (root_session_id);
CREATE INDEX sessions_bundle_version ON sessions (bundle_version_id);
CREATE INDEX sessions_status_updated ON sessions (status, updated_at);

CREATE TABLE tool_invocations (
    call_id               text COLLATE "C" PRIMARY KEY,
    session_id            text NOT NULL REFERENCES sessions (id) DEFERRABLE INITIALLY IMMEDIATE,
    agent_version_id      uuid NOT NULL REFERENCES agent_versions (id) DEFERRABLE INITIALLY IMMEDIATE,
    turn                  bigint NOT NULL CHECK (turn >= 0),
    step                  bigint NOT NULL DEFAULT 0 CHECK (step >= 0),
    tool                  text NOT NULL,
    version               text NOT NULL,
    wire_name             text,
    proposed_args         jsonb NOT NULL,
    args                  jsonb NOT NULL,
    result                jsonb,
    status                text NOT NULL CHECK (status IN ('pending', 'queued', 'dispatched',
                              'succeeded', 'failed', 'indeterminate', 'awaiting_approval')),
    worker_id             text,
    worker_identity       text,
    image_digest          text,
    descriptor_hash       text,
    manifest_content_hash text,
    attempt               integer NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    error_code            text,
    error_message         text,
    usage_input_tokens    bigint,
    usage_output_tokens   bigint,
    usage_estimated       boolean,
    deadline_at           timestamptz,
    created_at            timestamptz NOT NULL,
    updated_at            timestamptz NOT NULL,
    queued_at             timestamptz,
    dispatched_at         timestamptz,
    completed_at          timestamptz
);
CREATE INDEX tool_invocations_session ON tool_invocations (session_id, status);

CREATE TABLE approvals (
    id                     uuid PRIMARY KEY,
    session_id             text NOT NULL REFERENCES sessions (id) DEFERRABLE INITIALLY IMMEDIATE,
    call_id                text NOT NULL REFERENCES tool_invocations (call_id)
                               DEFERRABLE INITIALLY IMMEDIATE,
    parent_approval_id     uuid REFERENCES approvals (id) DEFERRABLE INITIALLY IMMEDIATE,
    status                 text NOT NULL CHECK (status IN ('pending', 'approved', 'denied',
                               'escalated', 'cancelled')),
    route                  text NOT NULL DEFAULT '',
    reason                 text NOT NULL DEFAULT '',
    tool                   text NOT NULL,
    tool_version           text NOT NULL,
    args                   jsonb NOT NULL,
    effective_args         jsonb,
    call_hash              text NOT NULL,
    agent_version_id       uuid NOT NULL REFERENCES agent_versions (id) DEFERRABLE INITIALLY IMMEDIATE,
    agent_ref              text NOT NULL,
    policy_ref             text,
    policy_runtime         jsonb NOT NULL DEFAULT '{}'::jsonb,
    authority_ref          text NOT NULL DEFAULT '',
    approvals_required     integer NOT NULL DEFAULT 1 CHECK (approvals_required >= 1),
    approvals_received     integer NOT NULL DEFAULT 0 CHECK (approvals_received >= 0),
    comprehension_required boolean NOT NULL DEFAULT false,
    on_reject              text NOT NULL DEFAULT 'return_to_agent',
    on_modify              text NOT NULL DEFAULT '',
    timeout_default        text,
    escalation_depth       integer NOT NULL DEFAULT 0 CHECK (escalation_depth >= 0),
    expires_at             timestamptz,
    decided_by             text,
    comment                text,
    created_at             timestamptz NOT NULL,
    decided_at             timestamptz
);
CREATE INDEX approvals_session ON approvals (session_id, status);
CREATE INDEX approvals_status_created ON approvals (status, created_at);
CREATE INDEX approvals_pending_expiry ON approvals (expires_at) WHERE status = 'pending';

CREATE TABLE approval_votes (
    approval_id                uuid NOT NULL REFERENCES approvals (id) DEFERRABLE INITIALLY IMMEDIATE,
    decided_by                 text NOT NULL,
    decision                   text NOT NULL CHECK (decision IN ('approved', 'denied')),
    comment                    text NOT NULL DEFAULT '',
    comprehension_acknowledged boolean NOT NULL DEFAULT false,
    edited_args                jsonb,
    created_at                 timestamptz NOT NULL,
    PRIMARY KEY (approval_id, decided_by)
);

CREATE TABLE session_secrets (
    session_id  text NOT NULL REFERENCES sessions (id) ON DELETE CASCADE,
    name        text NOT NULL,
    key_version integer NOT NULL CHECK (key_version >= 1),
    nonce       bytea NOT NULL,
    ciphertext  bytea NOT NULL,
    created_at  timestamptz NOT NULL,
    PRIMARY KEY (session_id, name)
);

INSERT INTO runtime_meta (key, value) VALUES ('schema_version', '1')
    ON CONFLICT (key) DO UPDATE SET value = excluded.value;
