//! An approvals surface in Rust: prints each pending approval as it appears and approves or
//! rejects it by the rule of the tutorial's reviewer (refunds up to €1,000 with a reason are
//! approved, the rest rejected).
//!
//! ```console
//! $ PHRONY_ACTOR=emad cargo run -p phrony-sdk --example approvals -- 127.0.0.1:7777
//! ```

#![allow(
    clippy::disallowed_methods,
    reason = "an example binary: reads its actor and token from the environment like the CLI"
)]

use futures::StreamExt as _;
use phrony_sdk::{Approval, Client, ClientOptions};

/// The reviewer's rule: approve a refund up to 1,000 that states a reason.
fn review(approval: &Approval) -> (bool, &'static str) {
    let amount = approval.args["amount"].as_f64().unwrap_or(f64::INFINITY);
    let reason = approval.args["reason"].as_str().unwrap_or_default();
    if amount <= 1000.0 && !reason.is_empty() {
        (true, "within the reviewer's limit")
    } else {
        (false, "above the reviewer's limit or without a reason")
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:7777".to_owned());
    let client = Client::connect_with(
        &addr,
        ClientOptions {
            token: std::env::var("PHRONY_TOKEN").ok(),
            actor: std::env::var("PHRONY_ACTOR").ok(),
            ..ClientOptions::default()
        },
    )
    .await?;
    let approvals = client.approvals();
    let mut pending = std::pin::pin!(approvals.watch());
    while let Some(approval) = pending.next().await {
        let approval = approval?;
        println!(
            "{} {} {}@{} {} ({})",
            approval.id,
            approval.agent_ref.as_deref().unwrap_or("-"),
            approval.tool,
            approval.version,
            approval.args,
            approval.policy_ref.as_deref().unwrap_or("-"),
        );
        let (approve, why) = review(&approval);
        let outcome = if approve {
            approvals.approve(&approval.id, Some(why)).await?
        } else {
            approvals.reject(&approval.id, Some(why)).await?
        };
        println!(
            "  -> {} (session {})",
            outcome.status, outcome.session_status
        );
    }
    Ok(())
}
