//! The webhook outbox (issue #19, notifications): which events notify, the outbox and delivery
//! rows the append path writes in the event's own transaction, and the delivery state machine
//! the runtime's sender drives (claim → delivered | retry later | failed; an operator re-queues a
//! failed one, audited in the `webhooks` stream).
//!
//! The rule "which event notifies, as what" is `outbox.rs` ([`crate::notification`]); the append
//! path (`events::append_batch`) writes the outbox and delivery rows in the event's transaction.
//!
//! State of one delivery (`webhook_deliveries`):
//!
//! ```text
//! pending ──claim──> pending (attempts+1, leased until next_attempt_at, claim_token set)
//!    ▲                  │ Delivered ─> delivered (delivered_at)     pruned after WEBHOOK_RETENTION
//!    │                  │ Retry     ─> pending (next_attempt_at = now + backoff, last_error)
//!    │                  │ GiveUp    ─> failed (last_error)
//!    └──── retry (operator, `webhook.retry_requested`) ──── failed
//!
//! pending ── its webhook is no longer configured (start-up, `webhook.unconfigured`) ─> failed
//! ```
//!
//! A delivery whose webhook is not configured is never re-queued by an operator: nothing would
//! send it.
//!
//! A sender that dies mid-attempt leaves its claim: the row is due again when the lease ends,
//! and is sent again under the same delivery id (at-least-once; receivers dedupe on the id). A
//! finish whose claim token no longer matches (the lease ran out and another sender took it)
//! changes nothing.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::db::{Backend, Conn, Row, Tx, args};
use crate::error::{LedgerError, Result};
use crate::event_body::{EventBody, WebhookRetryRequested, WebhookUnconfigured};
use crate::events::{append, lock_stream};
use crate::model::Event;
use crate::outbox::NotificationKind;

/// The stream operator actions on deliveries are recorded in.
pub const WEBHOOKS_STREAM: &str = "webhooks";

/// How long delivered rows are kept before [`crate::Ledger::prune_webhook_deliveries`] may
/// remove them (the daemon prunes what is older than this): 7 days. Failed and pending rows are
/// never pruned.
pub const WEBHOOK_RETENTION: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// The actor of what the runtime itself records in the `webhooks` stream
/// (`webhook.unconfigured`).
pub const WEBHOOKS_ACTOR: &str = "system:webhooks";

/// The last error of a delivery failed because its webhook is no longer configured.
#[must_use]
pub fn unconfigured_reason(webhook: &str) -> String {
    format!("webhook `{webhook}` is no longer configured")
}

/// The pending deliveries of one webhook no longer configured, failed at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnconfiguredWebhook {
    /// The webhook's name.
    pub webhook: String,
    /// How many pending deliveries were failed.
    pub deliveries: u64,
}

/// The longest `last_error` kept, in characters (longer errors are cut with `…`).
pub const MAX_LAST_ERROR_CHARS: usize = 1024;

/// The most deliveries one listing returns.
pub const MAX_DELIVERY_LIST: u32 = 1000;

/// The most deliveries one claim takes.
pub const MAX_CLAIM: u32 = 256;

/// A delivery's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryStatus {
    /// Waiting for its (next) attempt.
    Pending,
    /// The receiver answered 2xx.
    Delivered,
    /// Every attempt failed (or the receiver refused it for good).
    Failed,
}

impl DeliveryStatus {
    /// The stored name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Delivered => "delivered",
            Self::Failed => "failed",
        }
    }

    fn parse(text: &str) -> Result<Self> {
        match text {
            "pending" => Ok(Self::Pending),
            "delivered" => Ok(Self::Delivered),
            "failed" => Ok(Self::Failed),
            other => Err(LedgerError::corrupt(format!(
                "unknown webhook delivery status {other:?}"
            ))),
        }
    }
}

/// One delivery as listed.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookDelivery {
    /// The delivery id: the receiver's idempotency id, stable across retries.
    pub id: Uuid,
    /// The webhook.
    pub webhook: String,
    /// What it notifies.
    pub kind: NotificationKind,
    /// The event's stream.
    pub stream: String,
    /// The event's sequence number.
    pub seq: u64,
    /// Where it is.
    pub status: DeliveryStatus,
    /// Attempts made (claims).
    pub attempts: u32,
    /// When the next attempt is due (pending), or when the last one was claimed.
    pub next_attempt_at: DateTime<Utc>,
    /// The last attempt's error, at most [`MAX_LAST_ERROR_CHARS`].
    pub last_error: Option<String>,
    /// When a receiver accepted it.
    pub delivered_at: Option<DateTime<Utc>>,
    /// When the event (and its outbox row) was committed.
    pub created_at: DateTime<Utc>,
    /// The last change.
    pub updated_at: DateTime<Utc>,
}

/// A delivery claimed for one attempt.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedDelivery {
    /// The delivery id.
    pub id: Uuid,
    /// The webhook.
    pub webhook: String,
    /// What it notifies.
    pub kind: NotificationKind,
    /// The event's stream.
    pub stream: String,
    /// The event's sequence number.
    pub seq: u64,
    /// This attempt's number, from 1.
    pub attempt: u32,
    /// When the event was committed.
    pub created_at: DateTime<Utc>,
    /// Proves the claim when it is finished.
    pub claim_token: Uuid,
}

/// How an attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// The receiver accepted it.
    Delivered,
    /// Try again after `after`.
    Retry {
        /// What went wrong.
        error: String,
        /// The backoff.
        after: std::time::Duration,
    },
    /// No more attempts: the delivery is `failed`.
    GiveUp {
        /// What went wrong.
        error: String,
    },
}

/// Which deliveries a listing returns (newest first).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeliveryFilter {
    /// Only this status.
    pub status: Option<DeliveryStatus>,
    /// Only this webhook.
    pub webhook: Option<String>,
    /// At most this many (1..=[`MAX_DELIVERY_LIST`]; 0 means 100).
    pub limit: u32,
}

const DELIVERY_SELECT: &str = "SELECT d.id, d.webhook, d.status, d.attempts, d.next_attempt_at, \
     d.last_error, d.delivered_at, d.updated_at, o.kind, o.stream, o.seq, o.created_at \
     FROM webhook_deliveries d JOIN webhook_outbox o ON o.id = d.outbox_id";

fn kind_from_row(row: &Row) -> Result<NotificationKind> {
    let kind = row.text("kind")?;
    NotificationKind::parse(&kind)
        .ok_or_else(|| LedgerError::corrupt(format!("unknown webhook notification kind {kind:?}")))
}

fn seq_from_row(row: &Row) -> Result<u64> {
    u64::try_from(row.int("seq")?)
        .map_err(|_| LedgerError::corrupt("negative seq in webhook_outbox"))
}

fn attempts_from_row(row: &Row) -> Result<u32> {
    Ok(u32::try_from(row.int("attempts")?).unwrap_or(u32::MAX))
}

fn delivery_from_row(row: &Row) -> Result<WebhookDelivery> {
    Ok(WebhookDelivery {
        id: row.uuid("id")?,
        webhook: row.text("webhook")?,
        kind: kind_from_row(row)?,
        stream: row.text("stream")?,
        seq: seq_from_row(row)?,
        status: DeliveryStatus::parse(&row.text("status")?)?,
        attempts: attempts_from_row(row)?,
        next_attempt_at: row.ts("next_attempt_at")?,
        last_error: row.opt_text("last_error")?,
        delivered_at: row.opt_ts("delivered_at")?,
        created_at: row.ts("created_at")?,
        updated_at: row.ts("updated_at")?,
    })
}

/// `error` cut to [`MAX_LAST_ERROR_CHARS`] characters.
fn bounded_error(error: &str) -> String {
    if error.chars().count() <= MAX_LAST_ERROR_CHARS {
        return error.to_owned();
    }
    let mut cut: String = error.chars().take(MAX_LAST_ERROR_CHARS - 1).collect();
    cut.push('…');
    cut
}

fn delay(from: DateTime<Utc>, by: std::time::Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(by)
        .ok()
        .and_then(|d| from.checked_add_signed(d))
        .unwrap_or(from)
}

/// Claims up to `limit` due pending deliveries of `webhook`, leasing each until `now + lease`.
pub(crate) async fn claim(
    tx: &mut Tx,
    webhook: &str,
    lease: std::time::Duration,
    limit: u32,
) -> Result<Vec<ClaimedDelivery>> {
    let now = tx.now();
    let token = Uuid::new_v4();
    let lock = match tx.backend() {
        // Replicas never claim the same attempt: a row another claimer holds is skipped, and
        // one it committed is no longer due.
        Backend::Postgres => " FOR UPDATE SKIP LOCKED",
        // The transaction holds the database write lock.
        Backend::Sqlite => "",
    };
    let sql = format!(
        "UPDATE webhook_deliveries SET attempts = attempts + 1, next_attempt_at = $3, \
         claim_token = $4, updated_at = $1 WHERE id IN (SELECT id FROM webhook_deliveries \
         WHERE webhook = $2 AND status = 'pending' AND next_attempt_at <= $1 \
         ORDER BY next_attempt_at, id LIMIT $5{lock})"
    );
    let mut conn = tx.conn();
    let claimed = conn
        .execute(
            "claim webhook deliveries",
            &sql,
            args![
                now,
                webhook,
                delay(now, lease),
                token,
                i64::from(limit.clamp(1, MAX_CLAIM))
            ],
        )
        .await?;
    if claimed == 0 {
        return Ok(Vec::new());
    }
    let sql =
        format!("{DELIVERY_SELECT} WHERE d.claim_token = $1 ORDER BY d.next_attempt_at, d.id");
    conn.fetch_all("read claimed deliveries", &sql, args![token])
        .await?
        .iter()
        .map(|row| {
            Ok(ClaimedDelivery {
                id: row.uuid("id")?,
                webhook: row.text("webhook")?,
                kind: kind_from_row(row)?,
                stream: row.text("stream")?,
                seq: seq_from_row(row)?,
                attempt: attempts_from_row(row)?,
                created_at: row.ts("created_at")?,
                claim_token: token,
            })
        })
        .collect()
}

/// Records how a claimed attempt ended. `false` when the claim is no longer held (its lease
/// ran out and another sender claimed it): nothing changed.
pub(crate) async fn finish(
    tx: &mut Tx,
    claim: &ClaimedDelivery,
    outcome: &AttemptOutcome,
) -> Result<bool> {
    let now = tx.now();
    let (sql, binds) = match outcome {
        AttemptOutcome::Delivered => (
            "UPDATE webhook_deliveries SET status = 'delivered', delivered_at = $3, \
             claim_token = NULL, updated_at = $3 \
             WHERE id = $1 AND claim_token = $2 AND status = 'pending'",
            args![claim.id, claim.claim_token, now],
        ),
        AttemptOutcome::Retry { error, after } => (
            "UPDATE webhook_deliveries SET next_attempt_at = $4, last_error = $5, \
             claim_token = NULL, updated_at = $3 \
             WHERE id = $1 AND claim_token = $2 AND status = 'pending'",
            args![
                claim.id,
                claim.claim_token,
                now,
                delay(now, *after),
                bounded_error(error)
            ],
        ),
        AttemptOutcome::GiveUp { error } => (
            "UPDATE webhook_deliveries SET status = 'failed', last_error = $4, \
             claim_token = NULL, updated_at = $3 \
             WHERE id = $1 AND claim_token = $2 AND status = 'pending'",
            args![claim.id, claim.claim_token, now, bounded_error(error)],
        ),
    };
    let rows = tx
        .conn()
        .execute("finish webhook delivery", sql, binds)
        .await?;
    Ok(rows == 1)
}

pub(crate) async fn get(conn: &mut Conn<'_>, id: Uuid) -> Result<WebhookDelivery> {
    let sql = format!("{DELIVERY_SELECT} WHERE d.id = $1");
    let row = conn
        .fetch_optional("read webhook delivery", &sql, args![id])
        .await?
        .ok_or_else(|| LedgerError::not_found(format!("webhook delivery {id} not found")))?;
    delivery_from_row(&row)
}

/// Re-queues a failed delivery (attempts from 0, due now) and records who did it; refused when
/// its webhook is not among `configured` (nothing would ever send it).
pub(crate) async fn retry(
    tx: &mut Tx,
    id: Uuid,
    actor: &phrony_auth::Attribution,
    configured: &[String],
) -> Result<(WebhookDelivery, Event)> {
    let mut head = lock_stream(tx, WEBHOOKS_STREAM).await?;
    let delivery = get(&mut tx.conn(), id).await?;
    if delivery.status != DeliveryStatus::Failed {
        return Err(LedgerError::precondition(format!(
            "webhook delivery {id} is {}, not failed: only a failed delivery can be retried",
            delivery.status.as_str()
        )));
    }
    if !configured.contains(&delivery.webhook) {
        return Err(LedgerError::precondition(format!(
            "webhook delivery {id} cannot be retried: {}; add it back to the webhooks file \
             and restart the runtime to send it",
            unconfigured_reason(&delivery.webhook)
        )));
    }
    let event = append(
        tx,
        &mut head,
        EventBody::WebhookRetryRequested(WebhookRetryRequested {
            delivery_id: id,
            webhook: delivery.webhook.clone(),
            kind: delivery.kind.as_str().to_owned(),
            stream: delivery.stream.clone(),
            seq: delivery.seq,
            attempts: u64::from(delivery.attempts),
        })
        .into_new_event(actor.clone())?,
    )
    .await?;
    let rows = tx
        .conn()
        .execute(
            "re-queue webhook delivery",
            "UPDATE webhook_deliveries SET status = 'pending', attempts = 0, \
             next_attempt_at = $2, claim_token = NULL, updated_at = $2 \
             WHERE id = $1 AND status = 'failed'",
            args![id, event.ts],
        )
        .await?;
    if rows != 1 {
        return Err(LedgerError::Conflict {
            message: format!("webhook delivery {id} changed concurrently"),
        });
    }
    tx.mark_outbox_written();
    let delivery = get(&mut tx.conn(), id).await?;
    Ok((delivery, event))
}

/// Fails the pending deliveries of every webhook not in `configured`, with one
/// `webhook.unconfigured` event per webhook (see `Ledger::fail_unconfigured_webhook_deliveries`).
pub(crate) async fn fail_unconfigured(
    tx: &mut Tx,
    configured: &[String],
) -> Result<Vec<UnconfiguredWebhook>> {
    let rows = tx
        .conn()
        .fetch_all(
            "count pending webhook deliveries by webhook",
            "SELECT webhook, COUNT(*) AS n FROM webhook_deliveries WHERE status = 'pending' \
             GROUP BY webhook ORDER BY webhook",
            vec![],
        )
        .await?;
    let mut gone = Vec::new();
    for row in &rows {
        let webhook = row.text("webhook")?;
        if !configured.contains(&webhook) {
            gone.push(webhook);
        }
    }
    let mut failed = Vec::new();
    if gone.is_empty() {
        return Ok(failed);
    }
    let mut head = lock_stream(tx, WEBHOOKS_STREAM).await?;
    for webhook in gone {
        let reason = unconfigured_reason(&webhook);
        let now = tx.now();
        let deliveries = tx
            .conn()
            .execute(
                "fail the deliveries of an unconfigured webhook",
                "UPDATE webhook_deliveries SET status = 'failed', last_error = $2, \
                 claim_token = NULL, updated_at = $3 WHERE webhook = $1 AND status = 'pending'",
                args![webhook.as_str(), reason.as_str(), now],
            )
            .await?;
        if deliveries == 0 {
            // Another replica failed them first.
            continue;
        }
        append(
            tx,
            &mut head,
            EventBody::WebhookUnconfigured(WebhookUnconfigured {
                webhook: webhook.clone(),
                deliveries,
                reason,
            })
            .into_new_event(phrony_auth::Attribution::unverified(WEBHOOKS_ACTOR))?,
        )
        .await?;
        failed.push(UnconfiguredWebhook {
            webhook,
            deliveries,
        });
    }
    Ok(failed)
}

pub(crate) async fn list(
    conn: &mut Conn<'_>,
    filter: &DeliveryFilter,
) -> Result<Vec<WebhookDelivery>> {
    let limit = if filter.limit == 0 {
        100
    } else {
        filter.limit.min(MAX_DELIVERY_LIST)
    };
    let mut sql = format!("{DELIVERY_SELECT} WHERE 1 = 1");
    let mut binds = Vec::new();
    if let Some(status) = filter.status {
        binds.extend(args![status.as_str()]);
        sql.push_str(&format!(" AND d.status = ${}", binds.len()));
    }
    if let Some(webhook) = &filter.webhook {
        binds.extend(args![webhook]);
        sql.push_str(&format!(" AND d.webhook = ${}", binds.len()));
    }
    binds.extend(args![i64::from(limit)]);
    sql.push_str(&format!(
        " ORDER BY o.created_at DESC, d.id LIMIT ${}",
        binds.len()
    ));
    conn.fetch_all("list webhook deliveries", &sql, binds)
        .await?
        .iter()
        .map(delivery_from_row)
        .collect()
}

/// Deletes delivered rows delivered before `before`, then outbox rows left without a delivery.
pub(crate) async fn prune(tx: &mut Tx, before: DateTime<Utc>) -> Result<u64> {
    let mut conn = tx.conn();
    let removed = conn
        .execute(
            "prune delivered webhook deliveries",
            "DELETE FROM webhook_deliveries WHERE status = 'delivered' AND delivered_at < $1",
            args![before],
        )
        .await?;
    conn.execute(
        "prune webhook outbox",
        "DELETE FROM webhook_outbox WHERE created_at < $1 AND NOT EXISTS \
         (SELECT 1 FROM webhook_deliveries d WHERE d.outbox_id = webhook_outbox.id)",
        args![before],
    )
    .await?;
    Ok(removed)
}

pub(crate) async fn pending_count(conn: &mut Conn<'_>) -> Result<u64> {
    let row = conn
        .fetch_optional(
            "count pending webhook deliveries",
            "SELECT COUNT(*) AS n FROM webhook_deliveries WHERE status = 'pending'",
            vec![],
        )
        .await?;
    Ok(row
        .map(|r| r.int("n"))
        .transpose()?
        .and_then(|n| u64::try_from(n).ok())
        .unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_bounded() {
        let long = "x".repeat(5000);
        let cut = bounded_error(&long);
        assert_eq!(cut.chars().count(), MAX_LAST_ERROR_CHARS);
        assert!(cut.ends_with('…'));
        assert_eq!(bounded_error("short"), "short");
    }

    #[test]
    fn the_timeout_actor_is_the_approvals_one() {
        assert_eq!(
            crate::vocabulary::TIMEOUT_ACTOR,
            crate::approvals::TIMEOUT_ACTOR
        );
    }
}
