//! `phrony webhooks …`: the runtime's webhook deliveries (`RUNTIME_WEBHOOKS_FILE` on the
//! daemon): list them (the failed ones first of all) and re-queue a failed one.

use std::io::{self, Write as _};

use phrony_client::WebhookDelivery;
use serde_json::{Value, json};

use crate::cmd::table::Table;
use crate::cmd::{Global, remote};

/// Subcommands of `phrony webhooks`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// List deliveries, newest event first: id (the receiver's idempotency id), webhook,
    /// kind, status, attempts, when (the next attempt of a pending one, the delivery time of a
    /// delivered one), last error.
    Deliveries(DeliveriesArgs),
    /// Re-queue a failed delivery: attempts start again under the same id. Needs the
    /// `operate` permission (the admin role); recorded with who asked.
    Retry(RetryArgs),
}

/// Arguments of `phrony webhooks deliveries`.
#[derive(Debug, clap::Args)]
pub(crate) struct DeliveriesArgs {
    /// Only failed deliveries.
    #[arg(long)]
    failed: bool,
    /// Only this webhook's.
    #[arg(long, value_name = "NAME")]
    webhook: Option<String>,
    /// At most this many (1 to 1000).
    #[arg(long, value_name = "N", default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1000))]
    limit: u32,
    /// Print one JSON document instead of a table.
    #[arg(long)]
    json: bool,
}

/// Arguments of `phrony webhooks retry`.
#[derive(Debug, clap::Args)]
pub(crate) struct RetryArgs {
    /// The delivery id (from `phrony webhooks deliveries --failed`).
    delivery_id: String,
}

impl Command {
    /// Runs the subcommand.
    pub(crate) fn run(self, global: &Global) -> anyhow::Result<()> {
        match self {
            Self::Deliveries(args) => deliveries(&args, global),
            Self::Retry(args) => retry(&args, global),
        }
    }
}

fn deliveries(args: &DeliveriesArgs, global: &Global) -> anyhow::Result<()> {
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let list = client
            .list_webhook_deliveries(
                args.failed.then_some("failed"),
                args.webhook
                    .as_deref()
                    .map(str::trim)
                    .filter(|w| !w.is_empty()),
                args.limit,
            )
            .await
            .map_err(remote::fails("webhooks deliveries"))?;
        let mut out = io::stdout().lock();
        if args.json {
            let all: Vec<Value> = list.iter().map(delivery_json).collect();
            writeln!(out, "{}", json!({ "deliveries": all }))?;
            return Ok(());
        }
        if list.is_empty() {
            writeln!(out, "no deliveries")?;
            return Ok(());
        }
        let mut table = Table::new(&[
            "ID",
            "WEBHOOK",
            "KIND",
            "STATUS",
            "ATTEMPTS",
            "WHEN",
            "LAST ERROR",
        ]);
        for d in &list {
            let when = match d.status.as_str() {
                "delivered" => d.delivered_at.clone().unwrap_or_default(),
                "pending" => format!("next {}", d.next_attempt_at),
                _ => "-".to_owned(),
            };
            let error: String = d
                .last_error
                .as_deref()
                .unwrap_or("")
                .chars()
                .filter(|c| !c.is_control())
                .take(80)
                .collect();
            table.row(vec![
                d.id.clone(),
                d.webhook.clone(),
                d.kind.clone(),
                d.status.clone(),
                d.attempts.to_string(),
                when,
                error,
            ]);
        }
        table.write(&mut out)?;
        Ok(())
    })
}

fn retry(args: &RetryArgs, global: &Global) -> anyhow::Result<()> {
    remote::block_on(async {
        let (client, _) = remote::connect(global).await?;
        let actor = remote::actor(client.sends_credential())?;
        let d = client
            .retry_webhook_delivery(args.delivery_id.trim(), &actor)
            .await
            .map_err(remote::fails("webhooks retry"))?;
        writeln!(
            io::stdout().lock(),
            "delivery {} to {} re-queued ({})",
            d.id,
            d.webhook,
            d.kind
        )?;
        Ok(())
    })
}

fn delivery_json(d: &WebhookDelivery) -> Value {
    json!({
        "id": d.id,
        "webhook": d.webhook,
        "kind": d.kind,
        "stream": d.stream,
        "seq": d.seq,
        "status": d.status,
        "attempts": d.attempts,
        "next_attempt_at": d.next_attempt_at,
        "last_error": d.last_error,
        "delivered_at": d.delivered_at,
        "created_at": d.created_at,
    })
}
