//! The refund tutorial's tool worker in Rust: serves `payments.issue-refund@1.0.0` and
//! `orders.lookup-order@1.0.0` until Ctrl-C, then drains.
//!
//! ```console
//! $ cargo run -p phrony-sdk --example worker -- 127.0.0.1:7777
//! ```
//!
//! `PHRONY_TOKEN` is sent as the bearer token when set (the runtime's `required` mode).

#![allow(
    clippy::disallowed_methods,
    reason = "an example binary: reads its token from the environment like the CLI"
)]

use phrony_sdk::{Call, ToolError, Worker};
use serde::Deserialize;
use serde_json::{Value, json};

/// `payments.issue-refund`'s arguments (the tutorial's input schema).
#[derive(Debug, Deserialize)]
struct Refund {
    order_id: String,
    amount: f64,
    currency: String,
    #[serde(default)]
    reason: Option<String>,
}

/// `orders.lookup-order`'s arguments.
#[derive(Debug, Deserialize)]
struct Lookup {
    order_id: String,
}

async fn issue_refund(args: Refund, call: Call) -> Result<Value, ToolError> {
    if args.amount <= 0.0 {
        return Err(ToolError::new(
            "invalid_amount",
            "a refund must be positive",
        ));
    }
    // A real worker calls the payment provider here, with `call.call_id` as the idempotency key.
    println!(
        "refund {} {} for {} ({}) [call {}]",
        args.amount,
        args.currency,
        args.order_id,
        args.reason.as_deref().unwrap_or("no reason given"),
        call.call_id
    );
    Ok(json!({
        "refund_id": format!("rf_{}", args.order_id),
        "amount": args.amount,
        "currency": args.currency,
        "status": "issued",
    }))
}

async fn lookup_order(args: Lookup, _call: Call) -> Result<Value, ToolError> {
    // A real worker queries the order system here.
    let total = match args.order_id.as_str() {
        "ORD-1" => 400.0,
        "ORD-2" => 14000.0,
        _ => return Ok(json!({"order_id": args.order_id, "found": false})),
    };
    Ok(json!({
        "order_id": args.order_id, "found": true, "total": total, "currency": "EUR",
        "status": "delivered", "refund_eligible": true,
    }))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:7777".to_owned());
    let mut builder = Worker::builder()
        .runtime_addr(addr)
        .worker_id("rust-refund-worker")
        .concurrency(8)
        .tool("payments.issue-refund", "1.0.0", issue_refund)
        .tool("orders.lookup-order", "1.0.0", lookup_order);
    if let Ok(token) = std::env::var("PHRONY_TOKEN") {
        builder = builder.token(token);
    }
    builder
        .build()?
        .run_until(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
