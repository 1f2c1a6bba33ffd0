-- phrony ledger schema: user messages for a conversation another replica drives (issue #20:
-- any replica serves any client).
--
-- Only the replica holding a session's lease appends to its stream (the fence). A user
-- message sent to another replica is queued here (durably, before the client is answered),
-- announced (NOTIFY `phrony_session` on PostgreSQL), and the driving replica moves it into
-- the stream as `message.user` — numbering its turn — and deletes the row in the SAME
-- transaction: a message is queued or recorded, never both, never lost. Rows of a session
-- that ends are deleted with its secrets.
-- Kept column-for-column identical to migrations/postgres/0019_session_inbox.sql.
CREATE TABLE session_inbox (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    session_id   TEXT NOT NULL,
    actor        TEXT NOT NULL,
    verification TEXT NOT NULL,
    via          TEXT,
    content      TEXT NOT NULL,
    queued_at    TEXT NOT NULL,
    queued_by    TEXT NOT NULL
);
CREATE INDEX session_inbox_by_session ON session_inbox (session_id, id);
