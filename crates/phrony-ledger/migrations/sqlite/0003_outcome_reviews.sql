-- phrony ledger schema, version 3: outcome reviews.
--
-- An approval's kind ('policy', or 'outcome_review' for a call whose outcome is unknown) and,
-- for a decided review, its resolution ('happened', 'resend', 'fail'). Both come from the
-- approval events (`approval.required` `kind`, `approval.decided` `resolution`); rows written
-- before this migration are policy approvals. Kept identical on SQLite and PostgreSQL.
ALTER TABLE approvals ADD COLUMN kind TEXT NOT NULL DEFAULT 'policy';
ALTER TABLE approvals ADD COLUMN resolution TEXT;
