//! User messages for a conversation another replica drives (issue #20: any replica serves any
//! client; migration 0019).
//!
//! Only the replica holding a session's lease appends to its stream (the fence). A user message
//! that reaches another replica is queued in `session_inbox` ([`Ledger::queue_user_message`]:
//! durable before the client is answered, bounded per session, announced on commit by NOTIFY
//! `phrony_session` on PostgreSQL), and the driving replica moves each queued message into the
//! stream as `message.user`, numbering its turn, and deletes the row in the same transaction
//! ([`Ledger::accept_user_message`]): a message is either queued or recorded — never both,
//! never neither. The rows of a session that ends are deleted with its secrets.

use chrono::{DateTime, Utc};
use phrony_auth::{Attribution, Verification};

use crate::Ledger;
use crate::db::{Backend, args};
use crate::error::{LedgerError, Result};
use crate::events::append;
use crate::handoffs::SESSION_CHANNEL;
use crate::model::Event;
use crate::rows;
use crate::session_log::{SessionEvent, lock_open_session};

/// The most messages one read of a session's inbox returns ([`Ledger::queued_user_messages`]).
pub const MAX_INBOX_READ: u32 = 1_000;

/// A user message queued for the replica driving its session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedUserMessage {
    /// The queue's id (increasing in the order the messages were queued).
    pub id: i64,
    /// Who sent it.
    pub actor: Attribution,
    /// The text.
    pub content: String,
    /// When it was queued.
    pub queued_at: DateTime<Utc>,
    /// The replica that queued it.
    pub queued_by: String,
}

fn attribution(row: &crate::db::Row) -> Result<Attribution> {
    let verification = row.text("verification")?;
    Ok(Attribution {
        actor: row.text("actor")?,
        verification: Verification::parse(&verification).ok_or_else(|| {
            LedgerError::corrupt(format!(
                "queued user message: unknown verification {verification:?}"
            ))
        })?,
        via: row.opt_text("via")?,
    })
}

impl Ledger {
    /// Queues a user message for `session_id`, driven by another replica (or by none right now:
    /// the next driver takes it), unless `max_waiting` messages already wait in its queue.
    /// Durable on return; announced to the other replicas on commit (PostgreSQL). Returns the
    /// message's queue id.
    ///
    /// # Errors
    /// `InvalidArgument` for an empty text or actor; `NotFound` for an unknown session;
    /// `FailedPrecondition` for an ended one; `ResourceExhausted` (nothing queued) when
    /// `max_waiting` messages wait; database errors.
    pub async fn queue_user_message(
        &self,
        session_id: &str,
        actor: &Attribution,
        content: &str,
        max_waiting: usize,
    ) -> Result<i64> {
        if content.trim().is_empty() {
            return Err(LedgerError::invalid("user message text is required"));
        }
        if actor.actor.trim().is_empty() {
            return Err(LedgerError::invalid("user message actor is required"));
        }
        let max = i64::try_from(max_waiting).unwrap_or(i64::MAX);
        let replica = self.replica.id().to_owned();
        write_tx!(self, unfenced, |tx| async {
            let now = tx.now();
            let backend = tx.backend();
            let mut conn = tx.conn();
            let session = rows::require_session(&mut conn, session_id).await?;
            if session.status.is_terminal() {
                return Err(LedgerError::precondition(format!(
                    "session {session_id} is {} and accepts no user messages",
                    session.status
                )));
            }
            let waiting = conn
                .fetch_optional(
                    "count queued user messages",
                    "SELECT COUNT(*) AS n FROM session_inbox WHERE session_id = $1",
                    args![session_id],
                )
                .await?
                .map(|row| row.int("n"))
                .transpose()?
                .unwrap_or(0);
            if waiting >= max {
                return Err(LedgerError::ResourceExhausted {
                    message: format!(
                        "session {session_id} has {waiting} user messages queued for the replica \
                         driving it; at most {max_waiting} may wait \
                         (RUNTIME_MAX_QUEUED_USER_MESSAGES), so this one was not recorded: send \
                         it after the session answered"
                    ),
                });
            }
            let row = conn
                .fetch_optional(
                    "queue a user message",
                    "INSERT INTO session_inbox \
                     (session_id, actor, verification, via, content, queued_at, queued_by) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7) RETURNING id",
                    args![
                        session_id,
                        actor.actor.as_str(),
                        actor.verification.as_str(),
                        actor.via.as_deref(),
                        content,
                        now,
                        &replica
                    ],
                )
                .await?
                .ok_or_else(|| LedgerError::corrupt("queue a user message: no id returned"))?;
            let id = row.int("id")?;
            if backend == Backend::Postgres {
                conn.execute(
                    "announce a queued user message",
                    "SELECT pg_notify($1, $2)",
                    args![SESSION_CHANNEL, session_id],
                )
                .await?;
            }
            Ok(id)
        })
    }

    /// The user messages queued for `session_id`, oldest first, at most [`MAX_INBOX_READ`].
    ///
    /// # Errors
    /// Database errors; a row this version cannot read (`Corrupt`).
    pub async fn queued_user_messages(&self, session_id: &str) -> Result<Vec<QueuedUserMessage>> {
        let mut conn = self.pool.acquire().await?;
        let rows = conn
            .conn()
            .fetch_all(
                "list queued user messages",
                "SELECT id, actor, verification, via, content, queued_at, queued_by \
                 FROM session_inbox WHERE session_id = $1 ORDER BY id LIMIT $2",
                args![session_id, i64::from(MAX_INBOX_READ)],
            )
            .await?;
        rows.iter()
            .map(|row| {
                Ok(QueuedUserMessage {
                    id: row.int("id")?,
                    actor: attribution(row)?,
                    content: row.text("content")?,
                    queued_at: row.ts("queued_at")?,
                    queued_by: row.text("queued_by")?,
                })
            })
            .collect()
    }

    /// Moves the queued message `id` of `session_id` into the session's stream as
    /// `message.user` starting `turn`, deleting it from the queue in the same transaction (a
    /// driver write: fenced by this replica's lease). `None` when it is no longer queued
    /// (another call took it): nothing is written then.
    ///
    /// # Errors
    /// `NotFound` for an unknown session; `FailedPrecondition` for an ended one (its queue is
    /// deleted when it ends); `Fenced`; database errors.
    pub async fn accept_user_message(
        &self,
        session_id: &str,
        id: i64,
        turn: u32,
    ) -> Result<Option<Event>> {
        write_tx!(self, |tx| async {
            let mut head = lock_open_session(&mut tx, session_id).await?;
            let Some(row) = tx
                .conn()
                .fetch_optional(
                    "read a queued user message",
                    "SELECT id, actor, verification, via, content FROM session_inbox \
                     WHERE id = $1 AND session_id = $2",
                    args![id, session_id],
                )
                .await?
            else {
                return Ok(None);
            };
            let event = SessionEvent::UserMessage {
                actor: attribution(&row)?,
                turn,
                content: row.text("content")?,
            }
            .to_new_event()?;
            tx.conn()
                .execute(
                    "take a queued user message",
                    "DELETE FROM session_inbox WHERE id = $1",
                    args![id],
                )
                .await?;
            append(&mut tx, &mut head, event).await.map(Some)
        })
    }
}
